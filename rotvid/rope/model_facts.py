"""Per-model 3D RoPE facts, looked up by family name: the registry the RoPE side owns.

The facts themselves (:class:`~rotvid.rope.facts.RopeFacts`: theta, the (t, h, w) split of the head dim, the dtype
diffusers computes angles in, the position grid) live in each family's module of :mod:`rotvid.pipelines.families`
(``FAMILY.rope``), read from diffusers' sources and checked against its modules in ``tests/rope/test_tables.py``.
Registering a family (:func:`rotvid.pipelines.families.register_family`) registers its facts here, so the families
are known by name once :mod:`rotvid.pipelines.families` is imported (any of :mod:`rotvid.pipelines` imports it);
this layer imports nothing above it. :func:`get_rope_facts`, :func:`rope_facts` and :data:`ROPE_FACTS` read the
registry at the time they are called, so a family registered later is seen too.
"""

from __future__ import annotations

from rotvid.rope.facts import RopeFacts

__all__ = ["RopeFacts", "ROPE_FACTS", "get_rope_facts", "register_rope_facts", "rope_facts", "unregister_rope_facts"]

# family name -> its facts, in registration order. Read it through the functions below.
_REGISTRY: dict[str, RopeFacts] = {}


def register_rope_facts(facts: RopeFacts) -> RopeFacts:
    """Add ``facts`` under its ``family`` name; returns it. ValueError for a name already registered."""
    if not isinstance(facts, RopeFacts):
        raise ValueError(f"facts: expected a rotvid.rope.facts.RopeFacts, got {type(facts).__name__}")
    if facts.family in _REGISTRY:
        raise ValueError(f"facts: RoPE facts of family {facts.family!r} are already registered")
    _REGISTRY[facts.family] = facts
    return facts


def unregister_rope_facts(family: str) -> RopeFacts:
    """Remove the facts of ``family``; returns them. ValueError naming the known families otherwise."""
    facts = get_rope_facts(family)
    del _REGISTRY[family]
    return facts


def rope_facts() -> dict[str, RopeFacts]:
    """``{family name: its RoPE facts}`` of every registered family with 3D RoPE, in registration order."""
    return dict(_REGISTRY)


def get_rope_facts(family: str) -> RopeFacts:
    """The RoPE facts of the registered family ``family``; ValueError naming the known families otherwise."""
    if not isinstance(family, str) or family not in _REGISTRY:
        hint = "" if _REGISTRY else " (the model families register theirs: import rotvid.pipelines.families)"
        raise ValueError(f"family must be one of {sorted(_REGISTRY)}, got {family!r}{hint}")
    return _REGISTRY[family]


def __getattr__(name: str):
    """``ROPE_FACTS``: :func:`rope_facts` as of now (a fresh dict each time; register a family to add one)."""
    if name == "ROPE_FACTS":
        return rope_facts()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
