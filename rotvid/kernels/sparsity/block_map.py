"""``BlockMap``: which key blocks each query tile visits -- the one map every rotvid attention path takes.

A map is kept at one granularity, :data:`MAP_BLOCK` = 128 tokens for queries and keys alike: query tile
``i`` holds queries ``[128 i, 128 i + 128)``, key block ``j`` keys ``[128 j, 128 j + 128)``; ``Tq = ceil(n_q / 128)``,
``Tk = ceil(n_kv / 128)``. A kernel whose tiles are smaller subdivides (a 64-key block ``t`` belongs to map block
``t // 2``). Per (batch, head, query tile) the map lists the kept key blocks in ascending order (``indices``) and
how many there are (``counts``): a fixed-shape pair, so a map built on the GPU needs no data-dependent shape and
compiles into a graph. Batch and head dimensions broadcast (size 1 or the call's B / H).

What a map means: a key block it skips is exactly a block of ``-inf`` scores for that query tile. Keys past
``kv_lens`` stay masked inside a kept block; blocks wholly past ``kv_lens`` are never reached whether kept or not.
A query row whose tile keeps no block attends to nothing: its output is 0 (:mod:`rotvid.kernels.reference`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["MAP_BLOCK", "BlockMap", "blocks_for", "indices_from_mask"]

# The map's granularity, for queries and keys (the int8-fp8 kernels' key block and every kernel's query tile).
MAP_BLOCK = 128


def blocks_for(n: int, block: int = MAP_BLOCK) -> int:
    """``ceil(n / block)``: the map blocks that cover ``n`` tokens."""
    return -(-n // block)


def indices_from_mask(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices, counts)`` of a block mask [..., Tk] (bool): the kept columns of each row in ascending order,
    padded past ``counts`` with the row's last kept index (0 for an empty row); int32, ``indices`` [..., Tk].

    One cumulative count and a binary search per slot, no sort: slot ``s`` holds the first column whose running
    count of kept columns reaches ``min(s + 1, counts)`` (for an empty row, ``min(s + 1, 0) = 0``: column 0). No
    data-dependent shape: runs under ``torch.compile(fullgraph=True)``.
    """
    tk = mask.shape[-1]
    running = torch.cumsum(mask, dim=-1, dtype=torch.int32)
    counts = running[..., -1]
    slot = torch.arange(1, tk + 1, device=mask.device, dtype=torch.int32)
    target = torch.minimum(slot, counts.unsqueeze(-1)).contiguous()
    indices = torch.searchsorted(running.contiguous(), target, out_int32=True)
    return indices, counts.contiguous()


@dataclass(frozen=True)
class BlockMap:
    """Kept key blocks per (batch, head, query tile).

    Attributes:
        indices: int32 [B', H', Tq, Kmax]: row ``(b, h, i)`` lists its kept key blocks in ascending order in its
            first ``counts[b, h, i]`` entries; the entries after them are padding (any valid block index; the
            builders repeat the last kept one, or 0 in an empty row). ``1 <= Kmax <= Tk``.
        counts: int32 [B', H', Tq], each in ``[0, Kmax]``.
        n_q, n_kv: the query and key token counts the map is for.
        block: the map granularity in tokens (:data:`MAP_BLOCK`; the only one accepted).

    ``B'`` is 1 (one map for the whole batch) or the call's B; ``H'`` is 1 or H. Construction checks shapes and
    dtypes only (no host sync, so a map can be built inside a compiled graph); :meth:`check` checks a map against a
    call, values included (eager mode only). A value check that passes is remembered with the tensors' version
    counters, and the builders whose maps are valid by construction (:meth:`from_mask`, the top-p builder, through
    the private :meth:`_valid_by_construction`) start out checked: an eager pipeline that passes the same map to
    every call syncs with the GPU at most once for it, and a map whose ``indices`` or ``counts`` were changed in
    place since (any in-place torch op bumps a tensor's version) is checked again at its next eager call. Whether a
    map is checked is the map's own state, no constructor argument.

    What a kernel does with values no check saw (under ``torch.compile``, or tensors written behind torch's back):
    every kernel and the reference read a row's count clamped to ``[0, Kmax]`` and skip the entries outside
    ``[0, Tk)`` and those wholly past ``kv_lens``, wherever they sit in the row (no order is assumed); an index
    listed twice is visited twice (its keys weigh double in that row's softmax). That is the defined result of such
    a map, the same in every backend (:meth:`visit_counts`); a crash or a read outside the operands is not. The eager
    check refuses these maps (counts or indices out of range, rows not strictly ascending, duplicates included).
    """

    indices: torch.Tensor
    counts: torch.Tensor
    n_q: int
    n_kv: int
    block: int = MAP_BLOCK
    # (private state, no constructor argument: the tensors' versions when their values last passed a check, or None)
    _checked_versions: tuple[int, int] | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.block != MAP_BLOCK:
            raise ValueError(f"block_map: block must be {MAP_BLOCK} (one granularity for every kernel), got {self.block!r}")
        for name in ("n_q", "n_kv"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"block_map: {name} must be a positive int (tokens), got {val!r}")
        for name in ("indices", "counts"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
                what = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"block_map: {name} must be an int32 tensor, got {what}")
        if self.indices.dim() != 4 or self.counts.dim() != 3:
            raise ValueError(
                f"block_map: expected indices [B', H', Tq, Kmax] and counts [B', H', Tq], got shapes "
                f"{tuple(self.indices.shape)} and {tuple(self.counts.shape)}"
            )
        if tuple(self.indices.shape[:3]) != tuple(self.counts.shape):
            raise ValueError(
                f"block_map: indices {tuple(self.indices.shape)} and counts {tuple(self.counts.shape)} disagree on "
                "[B', H', Tq]"
            )
        if self.indices.device != self.counts.device:
            raise ValueError(f"block_map: indices on {self.indices.device}, counts on {self.counts.device}")
        tq, tk = self.q_tiles, self.kv_blocks
        if self.indices.shape[2] != tq:
            raise ValueError(f"block_map: Tq = {self.indices.shape[2]}, expected ceil({self.n_q} / {self.block}) = {tq}")
        if not 1 <= self.indices.shape[3] <= tk:
            raise ValueError(f"block_map: Kmax = {self.indices.shape[3]}, expected 1 <= Kmax <= Tk = {tk}")

    # ---- shape facts ----------------------------------------------------------------------------------------
    @property
    def q_tiles(self) -> int:
        """Tq = ceil(n_q / block)."""
        return blocks_for(self.n_q, self.block)

    @property
    def kv_blocks(self) -> int:
        """Tk = ceil(n_kv / block)."""
        return blocks_for(self.n_kv, self.block)

    @property
    def device(self) -> torch.device:
        return self.indices.device

    # ---- whether the values were checked ----------------------------------------------------------------------
    @classmethod
    def _valid_by_construction(cls, indices: torch.Tensor, counts: torch.Tensor, n_q: int, n_kv: int) -> "BlockMap":
        """A map from a builder whose values are valid by construction (:func:`indices_from_mask`): marked checked,
        so its eager calls never sync to check it. Private: for rotvid's builders only."""
        bm = cls(indices, counts, n_q, n_kv)
        if not torch.compiler.is_compiling():  # (in a graph no value is checked; a version is no traced quantity)
            bm._mark_checked()
        return bm

    def _versions(self) -> tuple[int, int]:
        """The tensors' version counters ((-1, -1) for inference tensors, which keep none: a map built under
        ``torch.inference_mode`` is checked once, and an in-place edit after that meets the kernels' clamping)."""
        if self.indices.is_inference() or self.counts.is_inference():
            return (-1, -1)
        return (self.indices._version, self.counts._version)

    def _mark_checked(self) -> None:
        object.__setattr__(self, "_checked_versions", self._versions())  # (frozen: the one field a check may set)

    @property
    def values_checked(self) -> bool:
        """Whether the values passed a check (or came from a builder valid by construction) and the tensors were not
        changed in place since (read-only)."""
        return self._checked_versions is not None and self._checked_versions == self._versions()

    # ---- conversions ----------------------------------------------------------------------------------------
    @classmethod
    def from_mask(cls, mask: torch.Tensor, *, n_q: int | None = None, n_kv: int | None = None) -> "BlockMap":
        """The map of a block mask ``mask`` bool [B', H', Tq, Tk] (or [Tq, Tk]: one map for every batch and head);
        ``Kmax = Tk``. ``n_q`` / ``n_kv`` (tokens) default to ``Tq * 128`` / ``Tk * 128``."""
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() not in (2, 4):
            raise ValueError(f"mask: expected a bool tensor [B', H', Tq, Tk] or [Tq, Tk], got {_describe(mask)}")
        if mask.dim() == 2:
            mask = mask[None, None]
        tq, tk = mask.shape[-2:]
        if tq < 1 or tk < 1:
            raise ValueError(f"mask: expected at least one query tile and one key block, got {tuple(mask.shape)}")
        indices, counts = indices_from_mask(mask)
        n_q = MAP_BLOCK * tq if n_q is None else n_q
        n_kv = MAP_BLOCK * tk if n_kv is None else n_kv
        return cls._valid_by_construction(indices, counts, n_q, n_kv)

    @classmethod
    def dense(cls, n_q: int, n_kv: int, device: torch.device | str | None = None) -> "BlockMap":
        """Every key block for every query tile (density 1): the dense call as a map."""
        tq, tk = blocks_for(n_q), blocks_for(n_kv)
        return cls.from_mask(torch.ones(tq, tk, dtype=torch.bool, device=device), n_q=n_q, n_kv=n_kv)

    def visit_counts(self) -> torch.Tensor:
        """int32 [B', H', Tq, Tk]: how many times each query tile visits each key block -- the map's defined meaning
        whatever its values (the class docstring): the first ``counts`` entries of a row, the count clamped to
        ``[0, Kmax]``, entries outside ``[0, Tk)`` skipped, an entry listed twice counted twice. A valid map gives 0
        or 1 everywhere. No host sync (compiles)."""
        kmax, tk = self.indices.shape[-1], self.kv_blocks
        slot = torch.arange(kmax, device=self.device, dtype=torch.int32)
        live = (slot < self.counts.clamp(0, kmax).unsqueeze(-1)) & (self.indices >= 0) & (self.indices < tk)
        visits = torch.zeros(*self.counts.shape, tk + 1, dtype=torch.int32, device=self.device)
        # dead slots (padding, out-of-range entries) add into a spare column, dropped after
        cols = torch.where(live, self.indices, torch.full_like(self.indices, tk)).long()
        visits.scatter_add_(-1, cols, torch.ones_like(self.indices))
        return visits[..., :tk]

    def to_dense_mask(self) -> torch.Tensor:
        """bool [B', H', Tq, Tk]: True where the query tile visits the key block (:meth:`visit_counts` > 0)."""
        return self.visit_counts() > 0

    def token_mask(self) -> torch.Tensor:
        """bool [B', H', n_q, n_kv]: the map at token granularity (for masked float attention in tests and studies;
        memory n_q * n_kv per map)."""
        m = self.to_dense_mask()
        m = m.repeat_interleave(self.block, dim=-2)[..., : self.n_q, :]
        return m.repeat_interleave(self.block, dim=-1)[..., : self.n_kv]

    def density(self) -> torch.Tensor:
        """Kept blocks / all blocks (``Tq * Tk`` per batch and head of the map), a float32 0-d tensor (a device value:
        ``float(...)`` syncs)."""
        return self.counts.sum(dtype=torch.float32) / float(self.counts.numel() * self.kv_blocks)

    # ---- validation against a call ---------------------------------------------------------------------------
    def check(self, q_shape, kv_shape, *, layout: str = "BHND") -> None:
        """ValueError naming ``block_map`` unless this map fits a call with q of shape ``q_shape`` and k/v of shape
        ``kv_shape`` (4-D, in ``layout``). Shapes always; the values (indices in ``[0, Tk)``, ascending within the
        counted slots, counts in ``[0, Kmax]``) in eager mode only (they need a host sync)."""
        if layout not in ("BHND", "BNHD"):
            raise ValueError(f"layout: expected 'BHND' or 'BNHD', got {layout!r}")
        q_shape, kv_shape = tuple(q_shape), tuple(kv_shape)
        if len(q_shape) != 4 or len(kv_shape) != 4:
            raise ValueError(f"block_map: expected 4-D q and k shapes, got {q_shape} and {kv_shape}")
        b, nq, h = (q_shape[0], q_shape[2], q_shape[1]) if layout == "BHND" else q_shape[:3]
        nkv = kv_shape[2] if layout == "BHND" else kv_shape[1]
        self.check_fits(batch=b, heads=h, n_q=nq, n_kv=nkv)
        self.check_values()

    def check_values(self) -> None:
        """ValueError naming ``block_map`` unless the values are a valid map (:meth:`value_problem`), in eager mode;
        nothing under ``torch.compile`` (the kernels' clamping is the guarantee there). Once per map while its
        tensors are not changed in place (:attr:`values_checked`)."""
        if torch.compiler.is_compiling() or self.values_checked:
            return
        problem = self.value_problem()
        if problem:
            raise ValueError(f"block_map: {problem}")
        self._mark_checked()

    def check_fits(self, *, batch: int, heads: int, n_q: int, n_kv: int) -> None:
        """ValueError naming ``block_map`` unless this map is for ``n_q`` queries and ``n_kv`` keys and its batch /
        head dimensions are 1 or ``batch`` / ``heads`` (shapes only, no sync)."""
        if (n_q, n_kv) != (self.n_q, self.n_kv):
            raise ValueError(
                f"block_map: a map for {self.n_q} queries and {self.n_kv} keys, the call has {n_q} queries and {n_kv} keys"
            )
        mb, mh = self.counts.shape[:2]
        if mb not in (1, batch) or mh not in (1, heads):
            raise ValueError(
                f"block_map: batch and head dimensions ({mb}, {mh}), expected 1 or the call's ({batch}, {heads}) each"
            )

    def value_problem(self) -> str:
        """Why the values are not a valid map ("" when they are); needs a host sync."""
        kmax, tk = self.indices.shape[-1], self.kv_blocks
        if self.counts.numel() and (int(self.counts.min()) < 0 or int(self.counts.max()) > kmax):
            return f"counts must lie in [0, Kmax = {kmax}], got [{int(self.counts.min())}, {int(self.counts.max())}]"
        if self.indices.numel() and (int(self.indices.min()) < 0 or int(self.indices.max()) >= tk):
            return (f"indices must lie in [0, Tk = {tk}), got [{int(self.indices.min())}, {int(self.indices.max())}]")
        live = torch.arange(kmax, device=self.device) < self.counts.unsqueeze(-1)
        rising = self.indices[..., 1:] > self.indices[..., :-1]
        if not bool((rising | ~live[..., 1:]).all()):
            return "indices must be strictly ascending within each row's counted slots"
        return ""


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return type(x).__name__
