"""The generalized RoPE table: RoPE followed by a pair rotation, as ONE element-wise op.

RoPE at token n is a block-diagonal M(n) of 2×2 blocks on pairs (2i, 2i+1); a pair rotation
R (none / interleaved / half / learned, see :mod:`rotvid.rope.rotations`) has, in column c,
nonzeros only at rows c and its partner p(c). So every output channel of ``x @ M(n) @ R`` is

    y[n, c] = R[c,c] * (x M)[c] + R[p,c] * (x M)[p]

and (x M)[c] only reads RoPE pair(c) = {2⌊c/2⌋, 2⌊c/2⌋+1}: y[n, c] is a combination of at
most four inputs, those of pair(c) and of pair(p(c)). The table stores, per output channel,
four source indices ``index[c] = (e_c, e_c + 1, e_p, e_p + 1)`` (e = even member of the pair)
and per position four coefficients ``coef[n, c, :]``::

    out[..., n, c] = sum_t coef[n, c, t] * x[..., n, index[c, t]]

When pair(p) == pair(c) (none, interleaved) the last two slots repeat the first two with zero
coefficients. This is the design card's "fuses Interleaved/Half 2×2 rotations into 3D-RoPE
tables": one element-wise pass applies RoPE and any of none / interleaved / half / learned.

The full Hadamard is not sparse: its table is RoPE's alone with ``hadamard=True``, which means "then the
normalized fast Walsh–Hadamard transform over D" (:func:`rotvid.rope.hadamard.fwht`, on the table's output rounded
to x's dtype, the bits of RoPE followed by ``rotation.apply``). The CUDA kernels run that transform in registers
after the table, in the same order of additions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rotvid.rope.hadamard import fwht
from rotvid.rope.rotations import FullHadamardRotation, NoRotation, PairRotation, Rotation
from rotvid.rope.tables import as_token_table

__all__ = ["GeneralizedRopeTable", "fuse_rope_and_rotation", "apply_generalized_rope", "check_table_input", "table_op"]


@dataclass
class GeneralizedRopeTable:
    """RoPE·R as 4 coefficients and 4 source indices per output channel.

    Attributes:
        coef: float [N, D, 4] (float64 from :func:`fuse_rope_and_rotation`), or
            [*lead, N, D, 4] for per-head learned rotations (e.g. [H, N, D, 4], broadcast
            against x [B, H, N, D]).
        index: long [D, 4], source channels of each output channel (same for every position).
        hadamard: after the table, the normalized Walsh–Hadamard transform over D (the ``full`` rotation):
            ``fwht(table_op(x))`` with the table's output rounded to x's dtype first.
    """

    coef: torch.Tensor
    index: torch.Tensor
    hadamard: bool = False

    def __post_init__(self) -> None:
        if self.index.dtype != torch.long or self.index.dim() != 2 or self.index.shape[1] != 4:
            raise ValueError(f"index must be long [D, 4], got {self.index.dtype} {tuple(self.index.shape)}")
        d = self.index.shape[0]
        if self.coef.dim() < 3 or self.coef.shape[-2:] != (d, 4):
            raise ValueError(f"coef must be [..., N, {d}, 4], got {tuple(self.coef.shape)}")
        if self.hadamard and d & (d - 1):
            raise ValueError(f"hadamard: the Walsh–Hadamard transform needs a power-of-two head_dim, got {d}")

    @property
    def num_tokens(self) -> int:
        return self.coef.shape[-3]

    @property
    def head_dim(self) -> int:
        return self.index.shape[0]

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> "GeneralizedRopeTable":
        """Copy with coef moved/cast (index stays long)."""
        return GeneralizedRopeTable(self.coef.to(device=device, dtype=dtype), self.index.to(device=device), self.hadamard)


def _pair_structure(rotation: Rotation) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if isinstance(rotation, PairRotation):
        return rotation.column_structure()
    raise ValueError(
        f"rotation.kind must be 'none', 'interleaved', 'half', 'full' or 'learned' to fuse into the RoPE table, "
        f"got {rotation.kind!r}"
    )


def fuse_rope_and_rotation(cos: torch.Tensor, sin: torch.Tensor, rotation: Rotation) -> GeneralizedRopeTable:
    """Build the generalized table of ``x -> rotation.apply(rope(x))``.

    Args:
        cos, sin: diffusers' expanded interleaved RoPE tables, [N, D] or any shape
            :func:`rotvid.rope.tables.as_token_table` accepts (Wan's [1, N, 1, D]), any float
            dtype — as the model's own rotary module returns them at run time.
        rotation: none, interleaved, half, learned, or full (RoPE's table with ``hadamard=True``).

    Returns:
        GeneralizedRopeTable with float64 coef [*lead, N, D, 4] and index [D, 4] on cos's
        device, such that
        ``apply_generalized_rope(x, table) == rotation.apply(apply_rope_interleaved(x, cos, sin))``
        (to float64 rounding for float64 x).
    """
    cos = as_token_table(cos, "cos").to(torch.float64)
    sin = as_token_table(sin, "sin").to(torch.float64)
    if cos.shape != sin.shape or cos.shape[-1] % 2:
        raise ValueError(f"cos and sin must both be [N, D] with D even, got {tuple(cos.shape)} and {tuple(sin.shape)}")
    d = cos.shape[-1]
    dev = cos.device
    if rotation.head_dim != d:
        raise ValueError(f"rotation is for head_dim={rotation.head_dim}, cos/sin have D={d}")
    hadamard = isinstance(rotation, FullHadamardRotation)
    if isinstance(rotation, (NoRotation, FullHadamardRotation)):
        return _rope_only_table(cos, sin, hadamard)
    partner, diag, off = (t.to(dev) for t in _pair_structure(rotation))
    c = torch.arange(d, device=dev)
    e_c = c - c % 2
    e_p = partner - partner % 2
    shift = torch.where(e_p == e_c, 0, 2)  # partner pair in slots 2, 3 unless it is the own pair
    index = torch.stack([e_c, e_c + 1, torch.where(shift == 2, e_p, e_c), torch.where(shift == 2, e_p + 1, e_c + 1)], 1)
    # RoPE (row-vector form): (x M)[c] = x[c] cos[c] + x[c^1] sgn(c) sin[c], sgn = -1 (even c), +1 (odd c).
    sgn = (2 * (c % 2) - 1).to(torch.float64)
    diag = diag.unsqueeze(-2)  # [*lead, 1, D]
    off = off.unsqueeze(-2)
    lead = diag.shape[:-2]
    n = cos.shape[0]
    coef = torch.zeros(*lead, n, d, 4, dtype=torch.float64, device=dev)
    # (source channel, coefficient [*lead, N, D], slot of the source in index[c]).
    terms = (
        (c, diag * cos, c - e_c),  # x[c] via (xM)[c]
        (c ^ 1, diag * (sgn * sin), (c ^ 1) - e_c),  # x[c^1] via (xM)[c]
        (partner, off * cos[:, partner], partner - e_p + shift),  # x[p] via (xM)[p]
        (partner ^ 1, off * (sgn[partner] * sin[:, partner]), (partner ^ 1) - e_p + shift),  # x[p^1]
    )
    for _, value, slot in terms:
        value = value.expand(*lead, n, d)
        coef.scatter_add_(-1, slot.expand(*lead, n, d).unsqueeze(-1), value.unsqueeze(-1))
    return GeneralizedRopeTable(coef=coef, index=index, hadamard=hadamard)


def _rope_only_table(cos: torch.Tensor, sin: torch.Tensor, hadamard: bool) -> GeneralizedRopeTable:
    """RoPE's own table (rotation none, and full before its transform) in closed form: channel c reads its pair
    (e, e + 1), e = c - c % 2, with cos[c] on itself and sgn(c) sin[c] on its neighbour, zeros in slots 2 and 3 --
    the values the general construction gives for R = I, built by selects alone. (Under torch.compile the table is
    built inside the graph: no gather with a computed index here, so none for the compiler to bound.)"""
    c = torch.arange(cos.shape[-1], device=cos.device)
    even = c % 2 == 0
    signed_sin = torch.where(even, -sin, sin)  # (x M)[c] = x[c] cos[c] + x[c^1] sgn(c) sin[c], sgn = -1 for even c
    zeros = torch.zeros_like(cos)
    coef = torch.stack([torch.where(even, cos, signed_sin), torch.where(even, signed_sin, cos), zeros, zeros], -1)
    coef = torch.where(coef == 0, 0.0, coef)  # +0 where the general construction's sums give +0 (sin 0 at token 0)
    e_c = c - c % 2
    index = torch.stack([e_c, e_c + 1, e_c, e_c + 1], 1)
    return GeneralizedRopeTable(coef=coef, index=index, hadamard=hadamard)


def check_table_input(x: torch.Tensor, table: GeneralizedRopeTable) -> tuple:
    """ValueError unless ``x`` is a float tensor [..., N, D] the table applies to; returns the table's leading dims
    (``()`` for one table for all heads)."""
    n, d = table.num_tokens, table.head_dim
    if not x.is_floating_point():
        raise ValueError(f"x: expected a floating-point tensor, got {x.dtype} (the rotation would be truncated)")
    if x.dim() < 2 or x.shape[-2:] != (n, d):
        raise ValueError(f"x must be [..., {n}, {d}] (BHND-style, tokens second to last), got {tuple(x.shape)}")
    lead = table.coef.shape[:-3]
    if lead and (x.dim() < len(lead) + 2 or tuple(x.shape[-2 - len(lead) : -2]) != tuple(lead)):
        raise ValueError(f"table has leading dims {tuple(lead)}: x must be [..., {', '.join(map(str, lead))}, {n}, {d}]")
    return lead


def table_op(x: torch.Tensor, table: GeneralizedRopeTable) -> torch.Tensor:
    """The table alone, as PyTorch ops: ``out[..., n, c] = sum_t coef[n, c, t] * x[..., n, index[c, t]]`` computed in
    float64 for float64 x, else float32, returned in x.dtype (no Walsh–Hadamard transform)."""
    cd = torch.float64 if x.dtype == torch.float64 else torch.float32
    xc = x.to(cd)
    gathered = xc[..., table.index.to(x.device)]  # [..., N, D, 4]
    return (gathered * table.coef.to(device=x.device, dtype=cd)).sum(-1).to(x.dtype)


def apply_generalized_rope(x: torch.Tensor, table: GeneralizedRopeTable) -> torch.Tensor:
    """out[..., n, c] = sum_t coef[n, c, t] * x[..., n, index[c, t]] for x [..., N, D], as PyTorch ops.

    Token axis second to last (BHND-style); coef broadcasts over x's leading dims (a per-head
    table [H, N, D, 4] needs x [..., H, N, D]). Computes in float64 for float64 x, else float32;
    returns x.dtype. A ``hadamard`` table (the ``full`` rotation) adds :func:`rotvid.rope.hadamard.fwht` over D
    after the table's output is rounded to x.dtype.

    This is the maths, on any device. The GPU paths with the same bits (rotvid's CUDA kernel, the Triton kernel)
    and the choice between them are :func:`rotvid.kernels.rope_op.apply_rope_table`, what the pipelines call.
    """
    check_table_input(x, table)
    out = table_op(x, table)
    return fwht(out) if table.hadamard else out
