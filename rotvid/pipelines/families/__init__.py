"""The model families rotvid runs, one module each, and their registry.

===================  ====================================  =============================================
family               diffusers transformer                 tiny pipelines (:mod:`rotvid.pipelines.tiny`)
===================  ====================================  =============================================
``wan``              ``WanTransformer3DModel``             ``wan``, ``wan2.2``, ``wan-i2v``
``hunyuan_video``    ``HunyuanVideoTransformer3DModel``    ``hunyuan_video``
``cogvideox``        ``CogVideoXTransformer3DModel``       ``cogvideox``, ``cogvideox-2b``
``hunyuan_video15``  ``HunyuanVideo15Transformer3DModel``  ``hunyuan_video15``
``skyreels_v2``      ``SkyReelsV2Transformer3DModel``      ``skyreels_v2``
===================  ====================================  =============================================

Each module defines one frozen :class:`~rotvid.pipelines.families.base.Family`: its transformer and block classes,
the self-attention of each block and the rotvid processor installed there, the V/O projections, its RoPE facts, its
schedule presets, the facts ``rotvid generate`` reads from a pipeline's config files, its released checkpoints'
short names and its tiny random pipelines. The lines at the end of this file register them. Add a model: write its
module and register it -- here for a built-in one, or with :func:`register_family` from anywhere. ``apply`` /
``remove``, loading, the RoPE tables, the schedule presets, the CLI and the tiny pipelines all ask the registry at the
time they need the answer.
"""

from __future__ import annotations

from rotvid.pipelines.families import cogvideox, hunyuan_video, hunyuan_video15, skyreels_v2, wan
from rotvid.pipelines.families.base import BlockStack, Family, ModelEntry, SchedulePreset, TinyVariant
from rotvid.rope.model_facts import register_rope_facts, unregister_rope_facts

__all__ = [
    "BlockStack", "Family", "ModelEntry", "SchedulePreset", "TinyVariant",
    "FAMILIES", "MODELS", "PIPELINE_REQUIREMENTS",
    "families", "family_by_name", "family_of_pipeline_class", "family_of_transformer_class", "register_family",
    "schedule_presets", "tiny_variant", "tiny_variants", "unregister_family",
]

# The registry. Read them through the functions below; they are module-level dicts so that a test may
# ``monkeypatch.setitem`` a fact (rotvid.pipelines.model_table re-exports the same objects).
FAMILIES: dict[str, Family] = {}
MODELS: dict[str, ModelEntry] = {}
PIPELINE_REQUIREMENTS: dict[str, tuple[str, ...]] = {}


def register_family(family: Family) -> Family:
    """Add ``family`` (its checkpoints' short names, its pipelines' requirements and its RoPE facts with it: the
    RoPE side looks those up by name in :mod:`rotvid.rope.model_facts`); returns it.

    ValueError for a family that fails :meth:`Family.check`, and for a name, transformer class, checkpoint name,
    schedule preset or tiny pipeline name another registered family already has.
    """
    if not isinstance(family, Family):
        raise ValueError(f"family: expected a rotvid.pipelines.families.Family, got {type(family).__name__}")
    family.check()
    if family.name in FAMILIES:
        raise ValueError(f"family: {family.name!r} is already registered")
    for other in FAMILIES.values():
        for what, mine, theirs in (
            ("transformer class", family.transformer_classes, other.transformer_classes),
            ("checkpoint name", [m.name for m in family.models], [m.name for m in other.models]),
            ("schedule preset", [p.name for p in family.schedule_presets], [p.name for p in other.schedule_presets]),
            ("tiny pipeline", [t.name for t in family.tiny], [t.name for t in other.tiny]),
        ):
            taken = sorted(set(mine) & set(theirs))
            if taken:
                raise ValueError(f"family {family.name!r}: {what} {', '.join(taken)} belongs to family {other.name!r}")
    if family.rope is not None:  # first: it refuses facts already registered, before anything here changes
        register_rope_facts(family.rope)
    FAMILIES[family.name] = family
    MODELS.update({m.name: m for m in family.models})
    PIPELINE_REQUIREMENTS.update(family.pipeline_requirements)
    return family


def unregister_family(name: str) -> Family:
    """Remove the family ``name`` with its checkpoints, requirements and RoPE facts; returns it."""
    family = family_by_name(name)
    if family.rope is not None:
        unregister_rope_facts(family.rope.family)
    del FAMILIES[name]
    for m in family.models:
        MODELS.pop(m.name, None)
    for cls, _ in family.pipeline_requirements:
        PIPELINE_REQUIREMENTS.pop(cls, None)
    return family


def families() -> tuple[Family, ...]:
    """The registered families, in registration order."""
    return tuple(FAMILIES.values())


def family_by_name(name: str) -> Family:
    """The registered family ``name``; ValueError naming the registered ones otherwise."""
    if not isinstance(name, str) or name not in FAMILIES:
        raise ValueError(f"family: expected one of {', '.join(FAMILIES)}, got {name!r}")
    return FAMILIES[name]


def family_of_transformer_class(class_name: str | None) -> Family | None:
    """The family whose ``transformer_classes`` holds ``class_name``, or ``None``."""
    return next((f for f in FAMILIES.values() if class_name in f.transformer_classes), None)


def family_of_pipeline_class(class_name: str) -> Family | None:
    """The family whose ``pipeline_prefix`` is the longest one ``class_name`` starts with, or ``None``."""
    fits = [f for f in FAMILIES.values() if class_name.startswith(f.pipeline_prefix)]
    return max(fits, key=lambda f: len(f.pipeline_prefix), default=None)


def schedule_presets() -> tuple[SchedulePreset, ...]:
    """Every registered family's schedule presets, in registration order."""
    return tuple(p for f in FAMILIES.values() for p in f.schedule_presets)


def tiny_variants() -> tuple[tuple[Family, TinyVariant], ...]:
    """``(family, tiny pipeline)`` of every registered family, in registration order."""
    return tuple((f, t) for f in FAMILIES.values() for t in f.tiny)


def tiny_variant(name: str) -> tuple[Family, TinyVariant]:
    """The family and the tiny pipeline called ``name``; ValueError naming the known ones otherwise."""
    for fam, tiny in tiny_variants():
        if tiny.name == name:
            return fam, tiny
    names = ", ".join(t.name for _, t in tiny_variants())
    raise ValueError(f"family: expected one of {names}, got {name!r}")


# The built-in families (one line each; the order is the order of every listing).
register_family(wan.FAMILY)
register_family(hunyuan_video.FAMILY)
register_family(cogvideox.FAMILY)
register_family(hunyuan_video15.FAMILY)
register_family(skyreels_v2.FAMILY)
