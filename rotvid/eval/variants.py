"""Variant specs of ``rotvid eval --variants``: ``RECIPE:ROTATION[:SPARSITY]`` (e.g. ``int4:half``,
``int8-fp8:half:topp0.9``).

RECIPE is one of the registered attention recipes (:mod:`rotvid.kernels.recipes`: ``fp16``, ``int4``,
``int4-sym-p``, ``int8-fp8``, ``int4-fp8``, ``nvfp4``); ROTATION one of ``none``,
``interleaved``, ``half``, ``full`` or ``learned:<file.safetensors>``. ``RECIPE`` alone means
``RECIPE:none``. RECIPE ``auto`` is this GPU's recipe (:mod:`rotvid.kernels.recipes.auto`),
resolved by :func:`resolve_auto_variants` before anything runs, so every label names the recipe
that ran (``int8-fp8_half``, not ``auto_half``). The Table-1 columns (datatype, range-optimized P,
rotation) come from the recipe's labels and the rotation.

SPARSITY is the variant's block map (:mod:`rotvid.kernels.sparsity`), written without ``:`` and ``,`` (they
separate the fields and the variants): the kind, its first parameter's value right after the name, more parameters
after ``+`` -- ``topp0.9`` (``topp:0.9``), ``topp0.9+sim=0.3`` (``topp:0.9,sim=0.3``), ``radial``,
``radial+band=2+decay=0.25``, ``none`` (dense). A variant without it runs the eval's ``--sparsity`` (none by
default). A sparse variant is compared with the FP16 reference like any other, and with its dense twin (the same
RECIPE:ROTATION without a map) when that is one of the variants too. A ``learned:`` file name followed by a
SPARSITY field may not itself hold a ``:``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rotvid.kernels.recipes import AUTO, get_recipe, recipe_names, recipes
from rotvid.kernels.recipes.auto import resolve_recipe
from rotvid.kernels.sparsity import SparsitySpec, parse_sparsity, sparsity_kind_names

ROTATIONS = ("none", "interleaved", "half", "full")
_ROTATION_NAMES = {"none": "W/O", "interleaved": "Interleave", "half": "Half", "full": "Full"}


def variant_sparsity_text(spec: SparsitySpec) -> str:
    """``spec`` in the variant form (module docstring): ``topp:0.9,sim=0.3`` -> ``topp0.9+sim=0.3``."""
    kind, _, rest = str(spec).partition(":")
    if not rest:
        return kind
    items = rest.split(",")
    head = kind + (items.pop(0) if "=" not in items[0] else "")
    return "+".join([head, *items])


def parse_variant_sparsity(text: str, where: str) -> SparsitySpec:
    """The spec of a variant's SPARSITY field (module docstring); ValueError naming ``--variants`` and ``where``
    (the variant) otherwise."""
    head, *rest = text.split("+")
    kinds = sorted((k for k in sparsity_kind_names() if head.startswith(k)), key=len, reverse=True)
    if not kinds:
        raise ValueError(f"--variants: unknown sparsity {text!r} in {where!r}; expected one of "
                         f"{', '.join(sparsity_kind_names())}, written without ':' (e.g. topp0.9, radial+band=2)")
    kind, value = kinds[0], head[len(kinds[0]):]
    canonical = kind + (":" + ",".join(([value] if value else []) + rest) if value or rest else "")
    try:
        return parse_sparsity(canonical)
    except ValueError as err:
        raise ValueError(f"--variants: sparsity {text!r} in {where!r}: {err}") from None


@dataclass(frozen=True)
class VariantSpec:
    """One attention variant: a recipe, a rotation spec and a block map spec (``none``: dense)."""

    recipe: str
    rotation: str
    sparsity: SparsitySpec = field(default_factory=SparsitySpec)

    @property
    def label(self) -> str:
        """A file-name-safe label, e.g. ``int4_half``, ``int8-fp8_half_topp0.9`` (used as the variant's folder
        name; a dense variant's has no sparsity part)."""
        rot = self.rotation
        if rot.startswith("learned:"):
            stem = rot.split(":", 1)[1].rsplit("/", 1)[-1].removesuffix(".safetensors")
            rot = "learned-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", stem)
        label = f"{self.recipe}_{rot}"
        if self.sparsity.enabled:
            label += "_" + re.sub(r"[^A-Za-z0-9_.=+-]+", "-", variant_sparsity_text(self.sparsity))
        return label

    @property
    def spec(self) -> str:
        text = f"{self.recipe}:{self.rotation}"
        return text + (":" + variant_sparsity_text(self.sparsity) if self.sparsity.enabled else "")

    @property
    def dense_twin(self) -> "VariantSpec":
        """The same recipe and rotation without a block map."""
        return VariantSpec(self.recipe, self.rotation)

    def table_columns(self) -> tuple[str, str, str]:
        """(Datatype, Optim-P, Rotation) as in the paper's Table 1."""
        recipe = next((r for r in recipes() if r.name == self.recipe), None)
        dtype, optim_p = (recipe.labels.datatype, recipe.labels.optim_p) if recipe is not None else (self.recipe, "–")
        if recipe is not None and not recipe.quantized and self.rotation == "none":  # the untouched model
            return dtype, "–", "–"
        rot = "Trained" if self.rotation.startswith("learned:") else _ROTATION_NAMES.get(self.rotation, self.rotation)
        return dtype, optim_p, rot


def parse_variant(text: str, default_sparsity: SparsitySpec | None = None) -> VariantSpec:
    """Parse one ``RECIPE[:ROTATION[:SPARSITY]]`` (a missing SPARSITY: ``default_sparsity``, else none);
    ``ValueError`` naming the variant and what is accepted otherwise."""
    text = text.strip()
    recipe, _, rotation = text.partition(":")
    rotation = rotation or "none"
    sparsity_text = None
    if rotation.startswith("learned:"):
        path, sep, tail = rotation[len("learned:"):].rpartition(":")
        if sep:
            rotation, sparsity_text = "learned:" + path, tail
    elif ":" in rotation:
        rotation, _, sparsity_text = rotation.partition(":")
    if recipe not in recipe_names() and recipe != AUTO:
        raise ValueError(
            f"--variants: unknown recipe {recipe!r} in {text!r}; expected one of {', '.join(recipe_names())} or {AUTO}"
        )
    if rotation not in ROTATIONS and not (rotation.startswith("learned:") and len(rotation) > len("learned:")):
        raise ValueError(
            f"--variants: unknown rotation {rotation!r} in {text!r}; expected one of "
            f"{', '.join(ROTATIONS)} or learned:<file.safetensors>"
        )
    if sparsity_text is not None:
        sparsity = parse_variant_sparsity(sparsity_text, text)
    else:
        sparsity = default_sparsity if default_sparsity is not None else SparsitySpec()
    if sparsity.enabled and recipe != AUTO and not get_recipe(recipe).quantized:
        raise ValueError(f"--variants: {text!r} asks for a block map with recipe {recipe}, which runs the model's own "
                         "attention (a map applies to quantized calls only)")
    return VariantSpec(recipe=recipe, rotation=rotation, sparsity=sparsity)


def parse_variants(text: str, default_sparsity: SparsitySpec | None = None) -> list[VariantSpec]:
    """Parse a comma-separated list of variants (no duplicates, at least one); ``default_sparsity``: the block map
    of the variants that name none (``--sparsity``)."""
    # learned:<path> may itself hold no comma; split on commas
    items = [t for t in (s.strip() for s in text.split(",")) if t]
    if not items:
        raise ValueError("--variants: expected at least one RECIPE:ROTATION, e.g. int4:half,int4:none")
    specs = [parse_variant(t, default_sparsity) for t in items]
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
            resolved = VariantSpec(recipe=recipe, rotation=spec.rotation, sparsity=spec.sparsity)
            notes.append(f"variant {spec.spec} runs as {resolved.spec} ({reason})")
            spec = resolved
        out.append(spec)
    _check_unique(out)
    return out, notes
