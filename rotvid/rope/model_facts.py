"""Per-model 3D RoPE facts: ONE table, read by every other part of rotvid.

Each supported family maps to a frozen :class:`RopeFacts`. The values below are what
diffusers 0.42.1 does (read from its sources, checked against its modules in
``tests/rope/test_tables.py``):

=================  ==========================  =======  =============  ==================  =========
family             module in diffusers         theta    (t, h, w)      angles computed in  positions
=================  ==========================  =======  =============  ==================  =========
``wan``            ``WanRotaryPosEmbed``       10000    h=w=2*(D//6),  float64             arange
                                                        t=D-h-w
                                                        (44,42,42)@128
``hunyuan_video``  ``HunyuanVideo-            256      config          float32             arange
                   RotaryPosEmbed``                     ``rope_axes_dim``                   (float32)
                                                        (16,56,56)@128
``cogvideox``      ``get_3d_rotary_pos_embed`` 10000    t=D//4,        float32             linspace
                                                        h=w=D//8*3                          (1.0) or
                                                        (16,24,24)@64                       arange
                                                                                            ("slice",
                                                                                            1.5)
=================  ==========================  =======  =============  ==================  =========

All three use diffusers' *interleaved* pair layout: RoPE rotates channel pairs (2i, 2i+1), and
the tables come in "expanded" form (the angle of pair i repeated at columns 2i and 2i+1).
Every table is cast to float32 by diffusers at the end (``.float()``).

HunyuanVideo's split is a config value (``rope_axes_dim``), not a function of the head dim in
diffusers; :meth:`RopeFacts.segments` returns (D//8, (D-D//8)/2, (D-D//8)/2), which gives the
released (16, 56, 56) at D=128. Pass the model's own ``rope_axes_dim`` where it differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["RopeFacts", "ROPE_FACTS", "get_rope_facts"]


def _wan_segments(head_dim: int) -> tuple[int, int, int]:
    h = w = 2 * (head_dim // 6)
    return head_dim - h - w, h, w


def _hunyuan_segments(head_dim: int) -> tuple[int, int, int]:
    t = head_dim // 8
    rest = head_dim - t
    return t, rest // 2, rest - rest // 2


def _cogvideox_segments(head_dim: int) -> tuple[int, int, int]:
    return head_dim // 4, head_dim // 8 * 3, head_dim // 8 * 3


@dataclass(frozen=True)
class RopeFacts:
    """The 3D RoPE facts of one model family.

    Attributes:
        family: key in :data:`ROPE_FACTS`.
        diffusers_source: where diffusers builds the table (for readers and error messages).
        theta: RoPE base.
        pair_layout: ``"interleaved"`` (pairs (2i, 2i+1)) for every family diffusers ships.
        angle_dtype: dtype diffusers computes frequencies, angles and cos/sin in before its
            final ``.float()`` (float64 for Wan, float32 for HunyuanVideo and CogVideoX).
        position_grid: default position generator: ``"arange"`` (0, 1, ..., n-1) or
            ``"linspace"`` (CogVideoX 1.0's cropped linspace grid).
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


ROPE_FACTS: dict[str, RopeFacts] = {
    "wan": RopeFacts(
        family="wan",
        diffusers_source="diffusers.models.transformers.transformer_wan.WanRotaryPosEmbed",
        theta=10000.0,
        pair_layout="interleaved",
        angle_dtype=torch.float64,
        position_grid="arange",
        segment_rule=_wan_segments,
    ),
    "hunyuan_video": RopeFacts(
        family="hunyuan_video",
        diffusers_source="diffusers.models.transformers.transformer_hunyuan_video.HunyuanVideoRotaryPosEmbed",
        theta=256.0,
        pair_layout="interleaved",
        angle_dtype=torch.float32,
        position_grid="arange",
        segment_rule=_hunyuan_segments,
    ),
    "cogvideox": RopeFacts(
        family="cogvideox",
        diffusers_source="diffusers.models.embeddings.get_3d_rotary_pos_embed",
        theta=10000.0,
        pair_layout="interleaved",
        angle_dtype=torch.float32,
        position_grid="linspace",
        segment_rule=_cogvideox_segments,
    ),
}


def get_rope_facts(family: str) -> RopeFacts:
    """Return ``ROPE_FACTS[family]``; ValueError naming the known families otherwise."""
    try:
        return ROPE_FACTS[family]
    except (KeyError, TypeError):
        raise ValueError(f"family must be one of {sorted(ROPE_FACTS)}, got {family!r}") from None
