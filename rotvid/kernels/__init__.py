"""Quantized attention: the recipes, the PyTorch reference (any device), CUDA kernels, and the dispatcher.

``rotvid.kernels.attention`` is the one public entry point at the kernel level; see its docstring. The recipes and
their registry: :mod:`rotvid.kernels.recipes`; block-sparse maps and where they come from:
:mod:`rotvid.kernels.sparsity`.
"""

import importlib

__all__ = [
    "RECIPES", "AttentionCall", "attention", "attention_reference", "describe_backends", "get_recipe",
    "prepare_attention", "recipe_names", "register_backend", "register_recipe", "run_attention", "select_backend",
    "unregister_recipe",
]

# The package's names, imported on first use: the package itself imports none of its modules, so a module below it
# may import a sibling through the package (``from rotvid.kernels import cuda_build``) without closing a circle.
_EXPORTS = {
    **dict.fromkeys(("AttentionCall", "attention", "describe_backends", "prepare_attention", "register_backend",
                     "run_attention", "select_backend"), "rotvid.kernels.dispatch"),
    **dict.fromkeys(("attention_reference", "get_recipe", "recipe_names", "register_recipe", "unregister_recipe"),
                    "rotvid.kernels.recipes"),
}


def __getattr__(name: str):
    """The names of ``__all__`` from their modules; ``RECIPES``: the registered recipes' names as of now
    (:func:`rotvid.kernels.recipes.recipe_names`)."""
    if name == "RECIPES":
        return importlib.import_module("rotvid.kernels.recipes").recipe_names()
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
