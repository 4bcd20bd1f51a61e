"""Quantized attention: the recipes, the PyTorch reference (any device), CUDA kernels, and the dispatcher.

``rotvid.kernels.attention`` is the one public entry point at the kernel level; see its docstring. The recipes and
their registry: :mod:`rotvid.kernels.recipes`; block-sparse maps and where they come from:
:mod:`rotvid.kernels.sparsity`.
"""

from rotvid.kernels.dispatch import (
    AttentionCall,
    attention,
    describe_backends,
    prepare_attention,
    register_backend,
    run_attention,
    select_backend,
)
from rotvid.kernels.recipes import attention_reference, get_recipe, recipe_names, register_recipe, unregister_recipe

__all__ = [
    "RECIPES", "AttentionCall", "attention", "attention_reference", "describe_backends", "get_recipe",
    "prepare_attention", "recipe_names", "register_backend", "register_recipe", "run_attention", "select_backend",
    "unregister_recipe",
]


def __getattr__(name: str):
    """``RECIPES``: the registered recipes' names as of now (:func:`rotvid.kernels.recipes.recipe_names`)."""
    if name == "RECIPES":
        return recipe_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
