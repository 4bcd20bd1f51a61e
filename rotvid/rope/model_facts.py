"""Per-model 3D RoPE facts, looked up by family name.

The facts themselves (:class:`~rotvid.rope.facts.RopeFacts`: theta, the (t, h, w) split of the head dim, the dtype
diffusers computes angles in, the position grid) live in each family's module of :mod:`rotvid.pipelines.families`
(``FAMILY.rope``), read from diffusers' sources and checked against its modules in ``tests/rope/test_tables.py``.
This module is the RoPE side's view of that registry: :func:`get_rope_facts` and :data:`ROPE_FACTS` ask it at the time
they are called, so a family registered later is seen too.
"""

from __future__ import annotations

from rotvid.rope.facts import RopeFacts

__all__ = ["RopeFacts", "ROPE_FACTS", "get_rope_facts", "rope_facts"]


def rope_facts() -> dict[str, RopeFacts]:
    """``{family name: its RoPE facts}`` of every registered family with 3D RoPE, in registration order."""
    from rotvid.pipelines.families import families

    return {fam.name: fam.rope for fam in families() if fam.rope is not None}


def get_rope_facts(family: str) -> RopeFacts:
    """The RoPE facts of the registered family ``family``; ValueError naming the known families otherwise."""
    facts = rope_facts()
    if not isinstance(family, str) or family not in facts:
        raise ValueError(f"family must be one of {sorted(facts)}, got {family!r}")
    return facts[family]


def __getattr__(name: str):
    """``ROPE_FACTS``: :func:`rope_facts` as of now (a fresh dict each time; register a family to add one)."""
    if name == "ROPE_FACTS":
        return rope_facts()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
