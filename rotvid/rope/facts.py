"""The 3D RoPE facts of one model: :class:`RopeFacts` (what diffusers does, read from its sources).

Each model family's values live in its own module, :mod:`rotvid.pipelines.families` (``FAMILY.rope``), checked
against diffusers' modules in ``tests/rope/test_tables.py``; :mod:`rotvid.rope.model_facts` looks them up by family
name. This module holds only the dataclass, so a family module can build its facts without importing the registry.

Every family diffusers ships uses the *interleaved* pair layout: RoPE rotates channel pairs (2i, 2i+1), and the
tables come in "expanded" form (the angle of pair i repeated at columns 2i and 2i+1). Every table is cast to
float32 by diffusers at the end (``.float()``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["RopeFacts"]


@dataclass(frozen=True)
class RopeFacts:
    """The 3D RoPE facts of one model family.

    Attributes:
        family: the family's name (a key of :data:`rotvid.rope.model_facts.ROPE_FACTS`).
        diffusers_source: where diffusers builds the table (for readers and error messages).
        theta: RoPE base.
        pair_layout: ``"interleaved"`` (pairs (2i, 2i+1)) for every family diffusers ships.
        angle_dtype: dtype diffusers computes frequencies, angles and cos/sin in before its
            final ``.float()`` (float64 or float32, per model).
        position_grid: default position generator: ``"arange"`` (0, 1, ..., n-1) or
            ``"linspace"`` (a cropped linspace grid, :func:`rotvid.rope.tables.rope_table_3d`).
        segment_rule: head_dim -> (t, h, w) segment sizes.
    """

    family: str
    diffusers_source: str
    theta: float
    pair_layout: str
    angle_dtype: torch.dtype
    position_grid: str
    segment_rule: Callable[[int], tuple[int, int, int]]

    def segments(self, head_dim: int) -> tuple[int, int, int]:
        """(t, h, w) channel counts of the three RoPE segments for ``head_dim``.

        Raises ValueError if head_dim is not a positive even int or a segment comes out odd or
        empty (RoPE needs whole pairs).
        """
        if not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
            raise ValueError(f"head_dim must be a positive even int, got {head_dim!r}")
        seg = tuple(int(s) for s in self.segment_rule(head_dim))
        if sum(seg) != head_dim or any(s <= 0 or s % 2 for s in seg):
            raise ValueError(
                f"head_dim={head_dim} gives {self.family} RoPE segments {seg}; expected three "
                f"positive even sizes summing to head_dim"
            )
        return seg  # type: ignore[return-value]
