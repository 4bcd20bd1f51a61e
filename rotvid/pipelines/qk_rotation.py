"""RoPE·R on the RoPE'd tokens, R alone on the others: the Q/K side of a rotvid self-attention.

A joint self-attention sequence mixes video tokens, which get the model's 3D RoPE, and (for
HunyuanVideo and CogVideoX) text tokens, which get no RoPE. rotvid replaces the model's RoPE
step by ``x -> rotation.apply(rope(x))`` on the video span and ``x -> rotation.apply(x)`` on the
text tokens, for both Q and K. One orthogonal R on every token keeps every score unchanged:
(q R)(k R)ᵀ = q kᵀ, video-video, video-text and text-text alike.

* ``none`` / ``interleaved`` / ``half`` / ``learned``: RoPE and R are one element-wise op through
  the generalized table (:func:`rotvid.rope.fused_table.fuse_rope_and_rotation`), built from
  the cos/sin the model's own rotary module produced for this forward. One table covers the whole
  joint sequence: the text tokens' rows are RoPE's identity (cos 1, sin 0), so they get R alone
  in the same pass, and the int8-fp8 CUDA pre-processing can apply the table itself
  (:meth:`QKRotator.deferred_table`) for HunyuanVideo and CogVideoX as for Wan. A model without
  RoPE (CogVideoX-2B) gets a table of identity rows: R alone on every token, the same way.
* ``full``: RoPE's table flagged ``hadamard``: the table, then the fast Walsh–Hadamard transform
  (:func:`rotvid.rope.hadamard.fwht`; in registers inside the CUDA kernels). Text tokens get the
  transform alone.

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

from rotvid.kernels.rope_op import apply_generalized_rope
from rotvid.rope.fused_table import GeneralizedRopeTable, fuse_rope_and_rotation
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
            ``rotation.apply`` (``False``; same maths, no table).
    """

    def __init__(self, rotation: Rotation, *, fuse: bool = True):
        self.rotation = rotation
        self.kind = rotation.kind
        self.fuse = fuse
        self._cache_key: tuple | None = None  # (cos, sin) objects of the cached table
        self._cache_table: GeneralizedRopeTable | None = None
        self._cache_tag: tuple | None = None  # (no RoPE, span, tokens, dtype, device) of the cached table
        self._forward_memo: tuple | None = None  # (cos, sin, tag, table) of this forward, compiled only

    @property
    def is_identity(self) -> bool:
        return self.kind == "none"

    # ---- table cache -----------------------------------------------------------------------
    def end_forward(self) -> None:
        """Drop the per-forward table of a compiled forward (see the module docstring)."""
        self._forward_memo = None

    def _build(self, cos, sin, span: tuple[int, int], x: torch.Tensor):
        """The table of x's whole sequence, in x's compute dtype: RoPE·R on ``span``, R alone (RoPE's identity:
        cos 1, sin 0) on the other tokens -- on every token when the model has no RoPE (``cos`` None)."""
        n = x.shape[-2]
        if cos is None:
            cos = torch.ones(n, x.shape[-1], dtype=torch.float64, device=x.device)
            sin = torch.zeros_like(cos)
        else:
            cos = as_token_table(cos, "cos").detach().to(torch.float64)
            sin = as_token_table(sin, "sin").detach().to(torch.float64)
            start, stop = span
            if (start, stop) != (0, n):
                d = cos.shape[-1]
                cos = torch.cat([cos.new_ones(start, d), cos, cos.new_ones(n - stop, d)])
                sin = torch.cat([sin.new_zeros(start, d), sin, sin.new_zeros(n - stop, d)])
        return fuse_rope_and_rotation(cos, sin, self.rotation).to(dtype=_compute_dtype(x))

    def _table(self, rope, span: tuple[int, int], x: torch.Tensor) -> GeneralizedRopeTable:
        """The table :meth:`rotate` applies to ``x`` (RoPE on ``span``; ``rope`` None: no RoPE, R alone)."""
        cos, sin = rope if rope is not None else (None, None)
        n = x.shape[-2]
        span = (0, n) if rope is None else (int(span[0]), int(span[1]))
        tag = (rope is None, span, n, _compute_dtype(x), x.device)
        if torch.compiler.is_compiling():
            memo = self._forward_memo
            if memo is not None and memo[0] is cos and memo[1] is sin and memo[2] == tag:
                return memo[3]
            table = self._build(cos, sin, span, x)
            self._forward_memo = (cos, sin, tag, table)
            return table
        key = self._cache_key
        if key is not None and self._cache_tag == tag:
            if key[0] is cos and key[1] is sin:
                return self._cache_table
            if (
                cos is not None
                and key[0].shape == cos.shape
                and key[0].device == cos.device
                and torch.equal(key[0], cos)
                and torch.equal(key[1], sin)
            ):
                self._cache_key = (cos, sin)
                return self._cache_table
        # Built in float64 on x's device, kept in the compute dtype.
        table = self._build(cos, sin, span, x)
        self._cache_key = (cos, sin)
        self._cache_table = table
        self._cache_tag = tag
        return table

    # ---- the op ------------------------------------------------------------------------------
    def _rotate_only(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-2] == 0 or self.is_identity:
            return x
        return self.rotation.apply(x)

    def _uses_table(self, rope) -> bool:
        """Whether :meth:`rotate` applies a table (fused, and something to apply)."""
        return self.fuse and not (rope is None and self.is_identity)

    def _check(self, x: torch.Tensor, rope, span: tuple[int, int]) -> None:
        start, stop = span
        n = x.shape[-2]
        if not 0 <= start <= stop <= n:
            raise ValueError(f"span: expected 0 <= start <= stop <= {n}, got {span}")
        if rope is not None:
            n_rope = as_token_table(rope[0], "cos").shape[0]
            if n_rope != stop - start:
                raise ValueError(f"rope: expected tables for {stop - start} tokens (span {span}), got {n_rope}")

    def deferred_table(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None, span: tuple[int, int]
    ) -> GeneralizedRopeTable | None:
        """The table that :meth:`rotate` applies to ``x`` as ``apply_generalized_rope(x, table)`` (the whole
        sequence: RoPE·R on ``span``, R alone on the text tokens, or on every token without RoPE), when it is one
        table for all heads. The caller may then hand the table on (the int8-fp8 pre-processing applies it itself)
        and rotate only where it must. ``None`` otherwise (``fuse=False``, per-block or per-head rotations, or
        nothing to apply: rotation none without RoPE): rotate first."""
        if not self._uses_table(rope):
            return None
        self._check(x, rope, span)
        table = self._table(rope, span, x)
        return table if table.coef.dim() == 3 else None

    @staticmethod
    def apply_table(x: torch.Tensor, table: GeneralizedRopeTable) -> torch.Tensor:
        """``apply_generalized_rope(x, table)``: a table of :meth:`deferred_table` applied where the caller must
        rotate itself (the model's own attention on a deferred call)."""
        return apply_generalized_rope(x, table)

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

        With ``fuse`` one table covers the whole sequence, the tokens outside the span (all of them without RoPE)
        with RoPE's identity rows (cos 1, sin 0), so the call is one pass; otherwise RoPE then ``rotation.apply``
        on the span and ``rotation.apply`` on the rest.
        """
        self._check(x, rope, span)
        if self._uses_table(rope):
            return apply_generalized_rope(x, self._table(rope, span, x))
        if rope is None:
            return self._rotate_only(x)
        cos, sin = rope
        start, stop = span
        parts = [
            self._rotate_only(x[..., :start, :]),
            self._rotate_only(apply_rope_interleaved(x[..., start:stop, :], cos, sin)),
            self._rotate_only(x[..., stop:, :]),
        ]
        return torch.cat([p for p in parts if p.shape[-2] > 0], dim=-2)
