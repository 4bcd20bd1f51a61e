"""Variant specs of ``rotvid eval --variants``: ``RECIPE:ROTATION`` (e.g. ``int4:half``).

RECIPE is one of the registered attention recipes (:mod:`rotvid.kernels.recipes`: ``fp16``, ``int4``,
``int4-sym-p``, ``int8-fp8``, ``int4-fp8``, ``nvfp4``); ROTATION one of ``none``,
``interleaved``, ``half``, ``full`` or ``learned:<file.safetensors>``. ``RECIPE`` alone means
``RECIPE:none``. RECIPE ``auto`` is this GPU's recipe (:mod:`rotvid.kernels.recipes.auto`),
resolved by :func:`resolve_auto_variants` before anything runs, so every label names the recipe
that ran (``int8-fp8_half``, not ``auto_half``). The Table-1 columns (datatype, range-optimized P,
rotation) come from the recipe's labels and the rotation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rotvid.kernels.recipes import AUTO, recipe_names, recipes
from rotvid.kernels.recipes.auto import resolve_recipe

ROTATIONS = ("none", "interleaved", "half", "full")
_ROTATION_NAMES = {"none": "W/O", "interleaved": "Interleave", "half": "Half", "full": "Full"}


@dataclass(frozen=True)
class VariantSpec:
    """One attention variant: a recipe and a rotation spec."""

    recipe: str
    rotation: str

    @property
    def label(self) -> str:
        """A file-name-safe label, e.g. ``int4_half`` (used as the variant's folder name)."""
        rot = self.rotation
        if rot.startswith("learned:"):
            stem = rot.split(":", 1)[1].rsplit("/", 1)[-1].removesuffix(".safetensors")
            rot = "learned-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", stem)
        return f"{self.recipe}_{rot}"

    @property
    def spec(self) -> str:
        return f"{self.recipe}:{self.rotation}"

    def table_columns(self) -> tuple[str, str, str]:
        """(Datatype, Optim-P, Rotation) as in the paper's Table 1."""
        recipe = next((r for r in recipes() if r.name == self.recipe), None)
        dtype, optim_p = (recipe.labels.datatype, recipe.labels.optim_p) if recipe is not None else (self.recipe, "–")
        if recipe is not None and not recipe.quantized and self.rotation == "none":  # the untouched model
            return dtype, "–", "–"
        rot = "Trained" if self.rotation.startswith("learned:") else _ROTATION_NAMES.get(self.rotation, self.rotation)
        return dtype, optim_p, rot


def parse_variant(text: str) -> VariantSpec:
    """Parse one ``RECIPE[:ROTATION]``; ``ValueError`` naming what is accepted otherwise."""
    text = text.strip()
    recipe, _, rotation = text.partition(":")
    rotation = rotation or "none"
    if recipe not in recipe_names() and recipe != AUTO:
        raise ValueError(
            f"--variants: unknown recipe {recipe!r} in {text!r}; expected one of {', '.join(recipe_names())} or {AUTO}"
        )
    if rotation not in ROTATIONS and not (rotation.startswith("learned:") and len(rotation) > len("learned:")):
        raise ValueError(
            f"--variants: unknown rotation {rotation!r} in {text!r}; expected one of "
            f"{', '.join(ROTATIONS)} or learned:<file.safetensors>"
        )
    return VariantSpec(recipe=recipe, rotation=rotation)


def parse_variants(text: str) -> list[VariantSpec]:
    """Parse a comma-separated list of variants (no duplicates, at least one)."""
    # learned:<path> may itself hold no comma; split on commas
    items = [t for t in (s.strip() for s in text.split(",")) if t]
    if not items:
        raise ValueError("--variants: expected at least one RECIPE:ROTATION, e.g. int4:half,int4:none")
    specs = [parse_variant(t) for t in items]
    _check_unique(specs)
    return specs


def _check_unique(specs: list[VariantSpec]) -> None:
    labels = [s.label for s in specs]
    dup = sorted({lab for lab in labels if labels.count(lab) > 1})
    if dup:
        raise ValueError(f"--variants: listed more than once: {', '.join(dup)}")


def resolve_auto_variants(specs: list[VariantSpec], device) -> tuple[list[VariantSpec], list[str]]:
    """Replace recipe ``auto`` with ``device``'s recipe; returns the specs and one note per replacement.

    ``ValueError`` when a resolved variant repeats one listed explicitly (``auto:half,int4:half`` on
    an INT4 GPU).
    """
    out, notes = [], []
    for spec in specs:
        if spec.recipe == AUTO:
            recipe, reason = resolve_recipe(AUTO, device)
            notes.append(f"variant {spec.spec} runs as {recipe}:{spec.rotation} ({reason})")
            spec = VariantSpec(recipe=recipe, rotation=spec.rotation)
        out.append(spec)
    _check_unique(out)
    return out, notes
