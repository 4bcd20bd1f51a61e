"""``oracle``: the best block map at a density, from the exact attention mass -- an evaluation tool, never a default.

For each (batch, head), with map blocks of 128 tokens (:mod:`rotvid.kernels.sparsity.block_map`):

1. **Exact block mass.** The full-precision scores ``s = sm_scale · q·kᵀ`` (float32; float64 for float64 inputs),
   keys ``n >= kv_lens[b]`` masked, softmax over all keys: ``P[r, n]``. The mass of tile (i, j) is
   ``M_ij = (1 / rows_i) · sum_{r in tile i} sum_{n in block j} P[r, n]``, ``rows_i`` the query rows of tile i (128,
   fewer in a partial last tile): the **mean** over the tile's rows of the probability mass its keys take, so a
   tile's masses sum to 1 over j. A block wholly past ``kv_lens`` has mass exactly 0.
   (:func:`block_attention_mass`; computed a few query tiles at a time so the scores held at once stay under
   ``chunk_elements``: memory is bounded whatever the sequence length, the time is that of a dense float
   attention.)
2. **Top blocks.** Per query tile, ``n_valid`` = the key blocks holding at least one valid key
   (``ceil(min(kv_lens[b], N_kv) / 128)``); keep the ``max(1, ceil(density · n_valid))`` of them with the highest
   ``M_ij`` (ties: the lower block index first), listed in ascending order. ``density`` is therefore the fraction of
   the *valid* key blocks kept per row (the map's :meth:`~rotvid.kernels.sparsity.block_map.BlockMap.density`, over
   all ``Tk`` blocks, is lower where ``kv_lens`` cut blocks off). No diagonal rule and no self-similarity rule
   (top-p's steps 4-5): forcing a block in could only lower the kept mass at a given count, and the oracle is the
   upper bound of every block map with the same per-row counts.

Its :class:`~rotvid.kernels.sparsity.spec.SparseMap` carries the exact dropped mass per tile (``1 - kept``) and the
block masses (``block_mass``), which the pipeline runtime reuses to report the kept mass without a second pass.

:func:`kept_mass` (the true mass a map keeps) and :func:`oracle_kept_mass` (the oracle's at the same per-row
counts) measure any map against the oracle; the runtime reports both when ``RotvidConfig(measure_kept_mass=True)``
(always for ``oracle`` maps).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from rotvid.kernels.sparsity.block_map import MAP_BLOCK, BlockMap, blocks_for, indices_from_mask
from rotvid.kernels.sparsity.spec import REQUIRED, MapParam, SparseMap, SparsityKind, SparsitySpec

__all__ = [
    "CHUNK_ELEMENTS", "KIND", "block_attention_mass", "kept_mass", "oracle_block_map", "oracle_keep",
    "oracle_kept_mass",
]

# Score elements (B · H · rows · N_kv) held at once by block_attention_mass: 2**26 float32 = 256 MiB.
CHUNK_ELEMENTS = 1 << 26


def _lens(kv_lens: torch.Tensor | None, n_kv: int, device) -> torch.Tensor | None:
    return None if kv_lens is None else kv_lens.to(device=device, dtype=torch.long).clamp(0, n_kv)


def block_attention_mass(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    layout: str = "BHND",
    kv_lens: torch.Tensor | None = None,
    sm_scale: float | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> torch.Tensor:
    """The exact attention mass of every (query tile, key block), float32 (float64 for float64 inputs)
    [B, H, Tq, Tk]: the mean over the tile's query rows of the softmax probability of the block's keys (step 1 of
    the module docstring; each tile's row sums to 1). ``q`` [B, H, N_q, D], ``k`` [B, H, N_kv, D] in ``layout``;
    ``kv_lens`` int [B] or None (keys ``n >= kv_lens[b]`` masked); ``sm_scale`` None: D ** -0.5. Query tiles are
    processed in chunks holding at most about ``chunk_elements`` scores."""
    if layout == "BNHD":
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    elif layout != "BHND":
        raise ValueError(f"layout: expected 'BHND' or 'BNHD', got {layout!r}")
    b, h, nq, d = q.shape
    nkv = k.shape[2]
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    sm_scale = d**-0.5 if sm_scale is None else sm_scale
    tq, tk = blocks_for(nq), blocks_for(nkv)
    kf = k.to(dt)
    lens = _lens(kv_lens, nkv, q.device)
    key_mask = None
    if lens is not None:  # [B', 1, 1, N_kv]: True where the key is masked
        key_mask = (torch.arange(nkv, device=q.device) >= lens.view(-1, 1)).view(-1, 1, 1, nkv)
    per_tile = max(1, chunk_elements // max(1, b * h * nkv * MAP_BLOCK))
    out = torch.empty(b, h, tq, tk, dtype=dt, device=q.device)
    # (each pass over the scores costs as much as the matmul at long sequences: the scale goes on q, and the NaN
    # clean-up and the padding copy run only where they can change something)
    for t0 in range(0, tq, per_tile):
        t1 = min(tq, t0 + per_tile)
        r0, r1 = t0 * MAP_BLOCK, min(nq, t1 * MAP_BLOCK)
        scores = torch.matmul(q[:, :, r0:r1].to(dt) * sm_scale, kf.transpose(-1, -2))
        p = torch.softmax(scores if key_mask is None else scores.masked_fill(key_mask, -math.inf), dim=-1)
        if key_mask is not None:
            p = p.nan_to_num_(0.0)  # (a row with no valid key: no mass anywhere)
        pad = (0, tk * MAP_BLOCK - nkv, 0, (t1 - t0) * MAP_BLOCK - (r1 - r0))
        if any(pad):
            p = F.pad(p, pad)
        p = p.view(b, h, t1 - t0, MAP_BLOCK, tk, MAP_BLOCK).sum(dim=(3, 5))
        rows = (torch.clamp(nq - MAP_BLOCK * torch.arange(t0, t1, device=q.device), max=MAP_BLOCK)).to(dt)
        out[:, :, t0:t1] = p / rows.view(-1, 1)
    return out


def _valid_blocks(lens: torch.Tensor | None, n_kv: int, device) -> torch.Tensor:
    """[B', 1, 1, Tk] bool: key blocks with at least one valid key."""
    tk = blocks_for(n_kv)
    limit = torch.full((1,), n_kv, device=device) if lens is None else lens
    return (MAP_BLOCK * torch.arange(tk, device=device) < limit.view(-1, 1)).view(-1, 1, 1, tk)


def oracle_keep(mass: torch.Tensor, density: float, *, n_kv: int, kv_lens: torch.Tensor | None = None) -> torch.Tensor:
    """bool [B, H, Tq, Tk]: per row, the ``max(1, ceil(density · n_valid))`` valid key blocks of highest ``mass``
    (step 2 of the module docstring; ties to the lower index)."""
    live = _valid_blocks(_lens(kv_lens, n_kv, mass.device), n_kv, mass.device)
    n_valid = live.sum(dim=-1, keepdim=True)  # [B', 1, 1, 1]
    # (a small tolerance so that density · n_valid landing a rounding error above an integer does not add a block)
    want = torch.ceil(density * n_valid.to(torch.float64) - 1e-9).clamp_min(1).to(torch.long)
    ranked = torch.where(live, mass, torch.full_like(mass, -1.0))
    order = torch.sort(ranked, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(mass.shape[-1], device=mass.device).expand_as(order))
    return (rank < want) & live


def kept_mass(mass: torch.Tensor, keep: torch.Tensor, n_q: int) -> torch.Tensor:
    """The true attention mass a map keeps: the mean over query rows (and batch and heads) of the probability mass
    of the kept key blocks, a 0-d tensor. ``mass`` [B, H, Tq, Tk] from :func:`block_attention_mass`; ``keep`` bool
    broadcastable to it (``BlockMap.to_dense_mask()``); ``n_q`` the query tokens (a partial last tile weighs its
    rows)."""
    per_tile = (mass * keep.to(mass.dtype)).sum(dim=-1)
    return _row_mean(per_tile, n_q)


def oracle_kept_mass(mass: torch.Tensor, counts: torch.Tensor, n_q: int) -> torch.Tensor:
    """The oracle's kept mass at a map's per-row counts (``counts`` int broadcastable to [B, H, Tq]: the blocks
    each query tile of the map keeps): per row the sum of its ``counts`` largest masses, mean over query rows as in
    :func:`kept_mass`. No map with those counts keeps more (0-d tensor)."""
    ranked = torch.sort(mass, dim=-1, descending=True).values.cumsum(dim=-1)
    counts = counts.to(torch.long).clamp(0, mass.shape[-1]).expand(mass.shape[:-1])
    best = torch.gather(ranked, -1, (counts - 1).clamp_min(0).unsqueeze(-1)).squeeze(-1)
    return _row_mean(torch.where(counts > 0, best, torch.zeros_like(best)), n_q)


def _row_mean(per_tile: torch.Tensor, n_q: int) -> torch.Tensor:
    tq = per_tile.shape[-1]
    rows = torch.clamp(n_q - MAP_BLOCK * torch.arange(tq, device=per_tile.device), max=MAP_BLOCK).to(per_tile.dtype)
    return (per_tile * rows).sum(dim=-1).mean() / n_q


def oracle_block_map(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    density: float,
    layout: str = "BHND",
    kv_lens: torch.Tensor | None = None,
    sm_scale: float | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> SparseMap:
    """The oracle map of a call on ``q``, ``k`` (``layout``) at ``density`` (module docstring), [B, H, Tq, Tk],
    with its exact dropped mass per tile and the block masses."""
    mass = block_attention_mass(q, k, layout=layout, kv_lens=kv_lens, sm_scale=sm_scale, chunk_elements=chunk_elements)
    n_q, n_kv = (q.shape[2], k.shape[2]) if layout == "BHND" else (q.shape[1], k.shape[1])
    keep = oracle_keep(mass, density, n_kv=n_kv, kv_lens=kv_lens)
    indices, counts = indices_from_mask(keep)
    bm = BlockMap._valid_by_construction(indices, counts, n_q, n_kv)
    dropped = (mass * (~keep).to(mass.dtype)).sum(dim=-1)
    return SparseMap(bm, dropped.float(), block_mass=mass)


def _build(spec: SparsitySpec, q, k, *, layout="BHND", kv_lens=None, sm_scale=None, grid=None) -> SparseMap:
    return oracle_block_map(q, k, **spec.options, layout=layout, kv_lens=kv_lens, sm_scale=sm_scale)


def _density(value) -> str:
    return "" if 0 < value <= 1 else "in (0, 1]"


KIND = SparsityKind(
    name="oracle",
    summary="evaluation only: per query tile, the key blocks of highest exact attention mass (full-precision "
    "scores) at a density -- the best block map there is, at the cost of a dense float attention per call",
    params=(MapParam("density", "float", REQUIRED, _density, "fraction of the valid key blocks kept per query tile"),),
    positional="density",
    static=False,
    build=_build,
)
