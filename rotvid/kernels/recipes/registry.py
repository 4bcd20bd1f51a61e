"""The recipe registry: name -> :class:`~rotvid.kernels.recipes.base.Recipe`.

Every consumer asks here (config validation, CLI, eval variants, reports, the dispatcher, calibration), at the
time it needs the answer, so a recipe registered after import (a plug-in, a test's toy recipe) is seen everywhere.
"""

from __future__ import annotations

from rotvid.kernels.recipes.base import Recipe

__all__ = [
    "AUTO", "get_recipe", "quantized_recipe_names", "recipe_names", "recipes", "register_recipe", "unregister_recipe",
]

# The config value that means "this GPU's recipe" (rotvid.kernels.recipes.auto); not a recipe itself.
AUTO = "auto"

_RECIPES: dict[str, Recipe] = {}


def register_recipe(recipe: Recipe, *, replace: bool = False) -> Recipe:
    """Add ``recipe`` under ``recipe.name`` (``replace=True`` to overwrite one of the same name); returns it.

    ValueError for a name already registered, for an ``auto`` row on a GPU another recipe already claims, and for a
    second ``auto_elsewhere`` recipe (the CPU's choice is one recipe)."""
    if not isinstance(recipe, Recipe):
        raise ValueError(f"recipe: expected a rotvid.kernels.recipes.Recipe, got {type(recipe).__name__}")
    if recipe.name in _RECIPES and not replace:
        raise ValueError(f"recipe: {recipe.name!r} is already registered (pass replace=True to overwrite it)")
    for other in _RECIPES.values():
        if other.name == recipe.name:
            continue
        taken = sorted(set(other.auto_on) & set(recipe.auto_on))
        if taken:
            where = ", ".join(f"sm{a}{b}" for a, b in taken)
            raise ValueError(f"recipe {recipe.name!r}: auto on {where} is already {other.name!r}'s")
        if recipe.auto_elsewhere and other.auto_elsewhere:
            raise ValueError(f"recipe {recipe.name!r}: auto_elsewhere is already {other.name!r}'s")
    _RECIPES[recipe.name] = recipe
    return recipe


def unregister_recipe(name: str) -> Recipe:
    """Remove the recipe ``name``; returns it (ValueError when it is not registered)."""
    recipe = get_recipe(name)
    del _RECIPES[name]
    return recipe


def get_recipe(name: str) -> Recipe:
    """The registered recipe ``name``; ValueError naming the registered ones otherwise (``auto`` is not a recipe:
    resolve it first, :func:`rotvid.kernels.recipes.auto.resolve_recipe`)."""
    recipe = _RECIPES.get(name) if isinstance(name, str) else None
    if recipe is None:
        raise ValueError(f"recipe: expected one of {', '.join(_RECIPES)}, got {name!r}")
    return recipe


def recipes() -> tuple[Recipe, ...]:
    """The registered recipes, in registration order."""
    return tuple(_RECIPES.values())


def recipe_names() -> tuple[str, ...]:
    """The registered recipes' names, in registration order."""
    return tuple(_RECIPES)


def quantized_recipe_names() -> tuple[str, ...]:
    """The names of the registered recipes that run a rotvid kernel (every one but the model's own attention)."""
    return tuple(name for name, recipe in _RECIPES.items() if recipe.quantized)
