"""``recipe="auto"``: which quantized recipe a GPU runs, and why — the table the recipes' rows make.

Each recipe declares the GPUs ``auto`` picks it on (:attr:`Recipe.auto_on`, compute capability -> reason), and one
recipe the choice everywhere else (:attr:`Recipe.auto_elsewhere`: the CPU and GPUs without a rotvid CUDA kernel).
This sits beside the CUDA arch table (:data:`rotvid.kernels.cuda_build.ARCH_TABLE`, compute capability ->
instruction path): that table says *how* a GPU runs a recipe, this one says *which* recipe ``auto`` picks on it.
:func:`resolve_recipe` is called once when a :class:`~rotvid.pipelines.config.RotvidConfig` is applied; the recipe
and its reason are recorded in the run report (and the generate sidecar) and printed by ``rotvid backends``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rotvid.kernels.recipes.registry import AUTO, get_recipe, recipes

__all__ = ["AUTO", "RecipeChoice", "auto_table", "fallback_choice", "auto_recipe", "resolve_recipe"]


@dataclass(frozen=True)
class RecipeChoice:
    """One row of the auto-recipe table: the recipe ``auto`` picks and why."""

    recipe: str
    reason: str


def auto_table() -> dict[tuple[int, int], RecipeChoice]:
    """compute capability -> the recipe ``auto`` picks there, from the registered recipes' rows (sorted by GPU)."""
    rows = {cap: RecipeChoice(r.name, reason) for r in recipes() for cap, reason in r.auto_on.items()}
    return dict(sorted(rows.items()))


def fallback_choice() -> RecipeChoice:
    """What ``auto`` picks on the CPU and on GPUs not in :func:`auto_table` (the recipe with ``auto_elsewhere``)."""
    for r in recipes():
        if r.auto_elsewhere:
            return RecipeChoice(r.name, r.auto_elsewhere)
    raise RuntimeError("rotvid: no registered recipe sets auto_elsewhere (the CPU's recipe)")


def _device_capability(device: torch.device) -> tuple[int, int] | None:
    """Compute capability of a CUDA device, or None for any other device (or no usable GPU)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def _where(device: torch.device, cap: tuple[int, int] | None) -> str:
    if cap is None:
        return "cpu" if device.type == "cpu" else f"{device.type} (no CUDA GPU)"
    return f"sm{cap[0]}{cap[1]}"


def _default_device(device: torch.device | str | None) -> torch.device:
    """``device``, or when None the current CUDA device (the CPU without a GPU)."""
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    return torch.device(device)


def auto_recipe(device: torch.device | str | None = None) -> tuple[str, str]:
    """The recipe ``auto`` picks on ``device`` (default: the current CUDA device, else the CPU).

    Returns ``(recipe, reason)``; the reason starts with where it was decided (``sm90``, ``cpu``).
    """
    device = _default_device(device)
    cap = _device_capability(device)
    table = auto_table()
    choice = table.get(cap) if cap is not None else None
    where = _where(device, cap)
    if choice is None:
        fallback = fallback_choice()
        if cap is not None:
            known = ", ".join(f"sm{a}{b}" for a, b in table)
            return fallback.recipe, f"auto on {where}: not in the table ({known}); {fallback.reason}"
        return fallback.recipe, f"auto on {where}: {fallback.reason}"
    return choice.recipe, f"auto on {where}: {choice.reason}"


def resolve_recipe(config_recipe: str, device: torch.device | str | None = None) -> tuple[str, str]:
    """The recipe a config runs on ``device``, and why.

    ``"auto"`` -> :func:`auto_recipe` (the table); any other recipe is kept as requested (its reason adds the
    recipe's :attr:`~rotvid.kernels.recipes.base.Recipe.requested_notes` for that GPU: on Hopper, that a 4-bit recipe
    is slower and less accurate than the 8-bit one auto picks there). ValueError for a recipe not registered.
    """
    if config_recipe == AUTO:
        return auto_recipe(device)
    recipe = get_recipe(config_recipe)
    reason = f"{config_recipe} as requested"
    note = recipe.requested_notes.get(_device_capability(_default_device(device)), "")
    if note:
        reason += f"; {note}"
    return config_recipe, reason


def __getattr__(name: str):
    """``RECIPE_TABLE`` and ``FALLBACK_CHOICE``: :func:`auto_table` and :func:`fallback_choice` as read now (the
    registry may have changed since import)."""
    if name == "RECIPE_TABLE":
        return auto_table()
    if name == "FALLBACK_CHOICE":
        return fallback_choice()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
