"""RoPE·R on the RoPE'd tokens, R alone on the others: the Q/K side of a rotvid self-attention.

A joint self-attention sequence mixes video tokens, which get the model's 3D RoPE, and (for
HunyuanVideo and CogVideoX) text tokens, which get no RoPE. rotvid replaces the model's RoPE
step by ``x -> rotation.apply(rope(x))`` on the video span and ``x -> rotation.apply(x)`` on the
text tokens, for both Q and K. One orthogonal R on every token keeps every score unchanged:
(q R)(k R)ᵀ = q kᵀ, video-video, video-text and text-text alike.

* ``none`` / ``interleaved`` / ``half`` / ``learned``: RoPE and R are one element-wise op through
  the generalized table (:func:`rotvid.rope.fused_table.fuse_rope_and_rotation`), built from
  the cos/sin the model's own rotary module produced for this forward.
* ``full``: RoPE (:func:`rotvid.rope.tables.apply_rope_interleaved`), then the D×D Hadamard.

Tables are cached: within one forward every block gets the same cos/sin objects; across
forwards (cond / uncond, steps) the new cos/sin are compared with the cached ones
(``torch.equal``, one reduction) and the table is reused when they match. A table is
[N, D, 4] floats (67 MB in float32 for Wan 480p), so only a rotation shared by all blocks uses
one; per-block (learned) rotations take the equivalent two-step path, RoPE then ``rotation.apply``
(``fuse=False``), instead of keeping one table per block.

Under ``torch.compile`` the table is built inside the graph from that forward's cos/sin, once per
forward (the blocks after the first find it by the identity of cos/sin while tracing), and the
cross-forward cache is not used: comparing tables with ``torch.equal`` is a host decision on
the data. The runtime clears that per-forward memo (:meth:`QKRotator.end_forward`) at the start
and the end of every transformer forward, so no graph reads a table of an earlier forward.
"""

from __future__ import annotations

import torch

from rotvid.rope.fused_table import GeneralizedRopeTable, apply_generalized_rope, fuse_rope_and_rotation
from rotvid.rope.rotations import Rotation
from rotvid.rope.tables import apply_rope_interleaved, as_token_table

__all__ = ["QKRotator"]


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


class QKRotator:
    """Applies one rotation (shared by the blocks that use it) to Q and K of a joint sequence.

    Args:
        rotation: a :class:`rotvid.rope.rotations.Rotation` (already ``select``-ed to a block for
            per-block learned rotations; a remaining per-head lead dim applies per head).
        fuse: apply RoPE·R through one cached generalized table (``True``) or as RoPE then
            ``rotation.apply`` (``False``; same maths, no table). ``full`` is never fused.
    """

    def __init__(self, rotation: Rotation, *, fuse: bool = True):
        self.rotation = rotation
        self.kind = rotation.kind
        self.fuse = fuse and rotation.kind != "full"
        self._cache_key: tuple | None = None  # (cos, sin) objects of the cached table
        self._cache_table: GeneralizedRopeTable | None = None
        self._cache_dtype: torch.dtype | None = None
        self._forward_memo: tuple | None = None  # (cos, sin, dtype, table) of this forward, compiled only

    @property
    def is_identity(self) -> bool:
        return self.kind == "none"

    # ---- table cache -----------------------------------------------------------------------
    def end_forward(self) -> None:
        """Drop the per-forward table of a compiled forward (see the module docstring)."""
        self._forward_memo = None

    def _table_this_forward(self, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype) -> GeneralizedRopeTable:
        memo = self._forward_memo
        if memo is not None and memo[0] is cos and memo[1] is sin and memo[2] == dtype:
            return memo[3]
        table = fuse_rope_and_rotation(cos.detach(), sin.detach(), self.rotation).to(dtype=dtype)
        self._forward_memo = (cos, sin, dtype, table)
        return table

    def _table(self, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype) -> GeneralizedRopeTable:
        if torch.compiler.is_compiling():
            return self._table_this_forward(cos, sin, dtype)
        key = self._cache_key
        if key is not None and self._cache_dtype == dtype:
            if key[0] is cos and key[1] is sin:
                return self._cache_table
            if (
                key[0].shape == cos.shape
                and key[0].device == cos.device
                and torch.equal(key[0], cos)
                and torch.equal(key[1], sin)
            ):
                self._cache_key = (cos, sin)
                return self._cache_table
        # Built in float64 on cos's device, kept in the compute dtype.
        table = fuse_rope_and_rotation(cos.detach(), sin.detach(), self.rotation).to(dtype=dtype)
        self._cache_key = (cos, sin)
        self._cache_table = table
        self._cache_dtype = dtype
        return table

    # ---- the op ------------------------------------------------------------------------------
    def _rope_and_rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if not self.fuse:
            return self._rotate_only(apply_rope_interleaved(x, cos, sin))
        return apply_generalized_rope(x, self._table(cos, sin, _compute_dtype(x)))

    def _rotate_only(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2] == 0 or self.is_identity:
            return x
        return self.rotation.apply(x)

    def deferred_table(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None, span: tuple[int, int]
    ) -> GeneralizedRopeTable | None:
        """The table that :meth:`rotate` would apply to ``x`` as ``apply_generalized_rope(x, table)``, when that is
        all it does: the fused path, RoPE on every token (``span`` = all of x's), one table for all heads. The
        caller may then hand the table on (the int8-fp8 pre-processing applies it itself) and rotate only where
        it must. ``None`` otherwise (a text span, ``full``, per-block or per-head rotations): rotate first."""
        if not self.fuse or rope is None or tuple(span) != (0, x.shape[-2]):
            return None
        cos, sin = rope
        if as_token_table(cos, "cos").shape[0] != x.shape[-2]:
            return None  # (rotate raises the error)
        table = self._table(cos, sin, _compute_dtype(x))
        return table if table.coef.dim() == 3 else None

    def rotate(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor] | None,
        span: tuple[int, int],
    ) -> torch.Tensor:
        """Rotate one of Q / K.

        Args:
            x: [B, H, N, D] (BHND), any float dtype; returned in the same dtype.
            rope: ``(cos, sin)`` for the RoPE'd tokens, diffusers' expanded interleaved tables of
                ``span[1] - span[0]`` tokens ([N_r, D] or Wan's [1, N_r, 1, D]); ``None`` when
                the model applies no RoPE (CogVideoX-2B).
            span: ``(start, stop)`` token range RoPE covers; tokens outside get R alone.
        """
        start, stop = span
        n = x.shape[-2]
        if not 0 <= start <= stop <= n:
            raise ValueError(f"span: expected 0 <= start <= stop <= {n}, got {span}")
        if rope is None:
            return self._rotate_only(x)
        cos, sin = rope
        n_rope = as_token_table(cos, "cos").shape[0]
        if n_rope != stop - start:
            raise ValueError(f"rope: expected tables for {stop - start} tokens (span {span}), got {n_rope}")
        if start == 0 and stop == n:
            return self._rope_and_rotate(x, cos, sin)
        parts = [
            self._rotate_only(x[..., :start, :]),
            self._rope_and_rotate(x[..., start:stop, :], cos, sin),
            self._rotate_only(x[..., stop:, :]),
        ]
        return torch.cat([p for p in parts if p.shape[-2] > 0], dim=-2)
