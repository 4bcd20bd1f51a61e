"""Quantized attention: the PyTorch reference (any device), CUDA kernels, and the dispatcher.

``rotvid.kernels.attention`` is the one public entry point; see its docstring.
"""

from rotvid.kernels.dispatch import attention, describe_backends, register_backend, select_backend
from rotvid.kernels.reference import RECIPES, attention_reference

__all__ = ["RECIPES", "attention", "attention_reference", "describe_backends", "register_backend", "select_backend"]
