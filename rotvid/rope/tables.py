"""3D RoPE tables (cos, sin) per model family, identical to diffusers' own modules.

The facts (segment sizes, theta, dtypes, position grids) come from
:mod:`rotvid.rope.model_facts`; this module only does the arithmetic, in the same order of
operations as diffusers so that the numbers are bit-identical (tests compare with
``torch.equal``).

Conventions shared by all of :mod:`rotvid.rope`:

* Tokens are ordered frame-major, then height, then width: token n = (f * H + h) * W + w.
* Tables are in diffusers' *expanded interleaved* form: ``cos[n, 2i] == cos[n, 2i + 1]`` is
  the cosine of the angle of channel pair i at token n (likewise ``sin``).
* RoPE acts on rows (row-vector convention, ``rope(x) = x @ M(n)``)::

      rope(x)[2i]     = x[2i] * cos[2i]     - x[2i+1] * sin[2i]
      rope(x)[2i + 1] = x[2i + 1] * cos[2i+1] + x[2i] * sin[2i+1]

  which is diffusers' ``apply_rotary_emb(..., use_real_unbind_dim=-1)`` and Wan's own
  ``apply_rotary_emb``.
"""

from __future__ import annotations

import logging
from typing import Sequence

import torch

from rotvid.rope.model_facts import get_rope_facts

__all__ = ["rope_table_3d", "rope_axis_table", "apply_rope_interleaved", "as_token_table"]

logger = logging.getLogger(__name__)

_PRECISIONS = ("diffusers", "float64")
_GRID_TYPES = ("arange", "linspace", "slice")


def _check_grid(grid: Sequence[int]) -> tuple[int, int, int]:
    if (
        not isinstance(grid, (tuple, list))
        or len(grid) != 3
        or not all(isinstance(g, int) and not isinstance(g, bool) and g > 0 for g in grid)
    ):
        raise ValueError(f"grid must be three positive ints (frames, height, width) in tokens, got {grid!r}")
    return int(grid[0]), int(grid[1]), int(grid[2])


def rope_axis_table(
    dim: int,
    positions: torch.Tensor,
    theta: float,
    *,
    angle_dtype: torch.dtype,
    round_to_float32: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """1D RoPE table of one axis, in diffusers' expanded interleaved form.

    Same operations as ``diffusers.models.embeddings.get_1d_rotary_pos_embed(dim, positions,
    theta, use_real=True, repeat_interleave_real=True, freqs_dtype=angle_dtype)``.

    Args:
        dim: channels of this axis' segment (even).
        positions: [S] positions (any real dtype; used as given, like diffusers does).
        theta: RoPE base.
        angle_dtype: dtype of frequencies, angles and cos/sin.
        round_to_float32: apply diffusers' final ``.float()`` (True) or keep angle_dtype.

    Returns:
        (cos, sin), each float64 [S, dim].
    """
    if dim <= 0 or dim % 2:
        raise ValueError(f"dim must be a positive even int, got {dim!r}")
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=angle_dtype) / dim))
    angles = torch.outer(positions, freqs)
    cos = angles.cos().repeat_interleave(2, dim=1)
    sin = angles.sin().repeat_interleave(2, dim=1)
    if round_to_float32:
        cos, sin = cos.float(), sin.float()
    return cos.double(), sin.double()


def _axis_positions(
    grid: tuple[int, int, int],
    grid_type: str,
    dtype: torch.dtype,
    crops_coords: tuple[tuple[float, float], tuple[float, float]] | None,
) -> list[torch.Tensor]:
    f, h, w = grid
    if grid_type in ("arange", "slice"):
        # "slice" (CogVideoX 1.5) computes arange(max_size) and keeps the first n rows: the same
        # values as arange(n), since every row depends on its own position only.
        return [torch.arange(n, dtype=dtype) for n in (f, h, w)]
    # "linspace": CogVideoX 1.0, get_3d_rotary_pos_embed(grid_type="linspace").
    if crops_coords is None:
        crops_coords = ((0, 0), (h, w))
    try:
        (start_h, start_w), (stop_h, stop_w) = crops_coords
    except (TypeError, ValueError):
        raise ValueError(
            f"crops_coords must be ((top, left), (bottom, right)), got {crops_coords!r}"
        ) from None
    grid_h = torch.linspace(start_h, stop_h * (h - 1) / h, h, dtype=dtype)
    grid_w = torch.linspace(start_w, stop_w * (w - 1) / w, w, dtype=dtype)
    grid_t = torch.linspace(0, f * (f - 1) / f, f, dtype=dtype)
    return [grid_t, grid_h, grid_w]


def rope_table_3d(
    family: str,
    grid: Sequence[int],
    head_dim: int,
    *,
    segments: Sequence[int] | None = None,
    theta: float | None = None,
    grid_type: str | None = None,
    crops_coords: tuple[tuple[float, float], tuple[float, float]] | None = None,
    precision: str = "diffusers",
) -> tuple[torch.Tensor, torch.Tensor]:
    """3D RoPE (cos, sin) tables of a model family on a (frames, height, width) token grid.

    Args:
        family: a family with 3D RoPE (``"wan"``, ``"hunyuan_video"``, ...; see
            :func:`rotvid.rope.model_facts.get_rope_facts`).
        grid: (f, h, w) in tokens, i.e. after patchification (latent frames // p_t, ...).
        head_dim: attention head dim D.
        segments: (t, h, w) channel split; default from the facts table (pass HunyuanVideo's
            ``rope_axes_dim`` here if a checkpoint differs from the default rule).
        theta: RoPE base; default from the facts table.
        grid_type: ``"arange"``, ``"linspace"`` or ``"slice"``; default from the facts table.
            ``"linspace"`` is CogVideoX 1.0 (with ``crops_coords``), ``"slice"`` CogVideoX 1.5.
        crops_coords: CogVideoX 1.0 crop region ((top, left), (bottom, right)) as the pipeline
            computes it (``get_resize_crop_region_for_grid``); default ((0, 0), (h, w)), which
            is what the pipeline passes at the model's base resolution.
        precision: ``"diffusers"`` (default): the exact values diffusers' module returns
            (its dtypes, then its final float32 rounding), held in float64.
            ``"float64"``: positions, angles and cos/sin all in float64, no float32 rounding.

    Returns:
        (cos, sin), each float64 [N, D] with N = f*h*w, tokens frame-major then height then
        width, expanded interleaved form (the angle of pair i at columns 2i and 2i+1).
    """
    facts = get_rope_facts(family)
    grid3 = _check_grid(grid)
    if segments is None:
        segs = facts.segments(head_dim)
    else:
        segs = tuple(int(s) for s in segments)
        if len(segs) != 3 or sum(segs) != head_dim or any(s <= 0 or s % 2 for s in segs):
            raise ValueError(
                f"segments must be three positive even ints summing to head_dim={head_dim}, got {segments!r}"
            )
    if precision not in _PRECISIONS:
        raise ValueError(f"precision must be one of {_PRECISIONS}, got {precision!r}")
    grid_type = facts.position_grid if grid_type is None else grid_type
    if grid_type not in _GRID_TYPES:
        raise ValueError(f"grid_type must be one of {_GRID_TYPES}, got {grid_type!r}")
    if crops_coords is not None and grid_type != "linspace":
        raise ValueError(f"crops_coords is only used with grid_type='linspace', got grid_type={grid_type!r}")
    theta = facts.theta if theta is None else float(theta)
    if not theta > 0 or theta == float("inf"):
        raise ValueError(f"theta: expected a positive, finite RoPE base, got {theta}")

    exact = precision == "diffusers"
    dtype = facts.angle_dtype if exact else torch.float64
    positions = _axis_positions(grid3, grid_type, dtype, crops_coords)
    f, h, w = grid3
    cos_parts, sin_parts = [], []
    shapes = [(f, 1, 1), (1, h, 1), (1, 1, w)]
    for dim, pos, shape in zip(segs, positions, shapes):
        c, s = rope_axis_table(dim, pos, theta, angle_dtype=dtype, round_to_float32=exact)
        cos_parts.append(c.view(*shape, dim).expand(f, h, w, dim))
        sin_parts.append(s.view(*shape, dim).expand(f, h, w, dim))
    cos = torch.cat(cos_parts, dim=-1).reshape(f * h * w, head_dim)
    sin = torch.cat(sin_parts, dim=-1).reshape(f * h * w, head_dim)
    return cos, sin


def as_token_table(table: torch.Tensor, name: str = "cos") -> torch.Tensor:
    """View a diffusers RoPE table as [N, D].

    Accepts [N, D] (HunyuanVideo, CogVideoX) and any shape whose leading dims are all 1 except
    one, e.g. Wan's [1, N, 1, D] or [1, 1, N, D]. Raises ValueError for anything else.
    """
    if not isinstance(table, torch.Tensor) or table.dim() < 2:
        raise ValueError(f"{name} must be a tensor [N, D] (or [1, N, 1, D]), got {getattr(table, 'shape', table)!r}")
    lead = [s for s in table.shape[:-1] if s != 1]
    if len(lead) > 1:
        raise ValueError(
            f"{name} must have one token axis besides the channel axis (e.g. [N, D] or [1, N, 1, D]), "
            f"got shape {tuple(table.shape)}"
        )
    return table.reshape(-1, table.shape[-1])


def apply_rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply interleaved RoPE to x [..., N, D] (token axis second to last, e.g. BHND).

    cos, sin: [N, D] (or a shape :func:`as_token_table` accepts) in expanded interleaved form.
    Computes in float64 if x is float64, else in float32 (as diffusers does), and returns
    x.dtype. Matches diffusers' ``apply_rotary_emb(x, (cos, sin))`` for float32 x bit for bit.
    """
    cos = as_token_table(cos, "cos")
    sin = as_token_table(sin, "sin")
    if x.dim() < 2 or x.shape[-2:] != cos.shape or sin.shape != cos.shape:
        raise ValueError(
            f"x must be [..., N, D] matching cos/sin [N, D]; got x {tuple(x.shape)}, "
            f"cos {tuple(cos.shape)}, sin {tuple(sin.shape)}"
        )
    if x.shape[-1] % 2:
        raise ValueError(f"x's last dim must be even (channel pairs), got {x.shape[-1]}")
    if not x.is_floating_point():
        raise ValueError(f"x: expected a floating-point tensor, got {x.dtype} (the rotation would be truncated)")
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    xc = x.to(compute)
    x_real, x_imag = xc.reshape(*xc.shape[:-1], -1, 2).unbind(-1)
    x_rot = torch.stack([-x_imag, x_real], dim=-1).flatten(-2)
    out = xc * cos.to(compute) + x_rot * sin.to(compute)
    return out.to(x.dtype)
