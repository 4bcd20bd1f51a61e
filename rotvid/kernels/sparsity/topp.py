"""``topp``: a dynamic block map per call -- the key blocks that hold a fraction ``tau`` of each query tile's
estimated attention mass, judged on block means, with the blocks a mean cannot stand for kept.

For each (batch, head), with map blocks of 128 tokens (:mod:`rotvid.kernels.sparsity.block_map`):

1. **Pooling.** ``q̄_i`` = the mean of query tile i's rows, ``k̄_j`` = the mean of key block j's *valid* keys
   (``j < kv_lens[b]``); ``n_j`` = that count (a block wholly past ``kv_lens`` has ``n_j = 0``).
2. **Block-level softmax estimate.** ``ŝ_ij = sm_scale · q̄_i·k̄_j + log(n_j)`` (``-inf`` where ``n_j = 0``) and
   ``P̂_ij = softmax_j(ŝ_ij)``. If every key of block j scored ``sm_scale · q̄_i·k̄_j``, the block's share of the
   row's softmax mass would be exactly ``P̂_ij``: the ``log(n_j)`` term makes the estimate one of *mass* (a partial
   last block weighs less), not of a single key's probability.
3. **Top-p.** Per query tile, key blocks in descending ``P̂`` are kept until the kept estimated mass reaches
   ``tau`` (the smallest such set; blocks of estimated mass 0 never count).
4. **Blocks a mean cannot stand for.** A block's self-similarity is the mean, over its (valid) tokens, of the
   cosine between the token and the block mean. A query tile below ``sim`` keeps its whole row; a key block below
   ``sim`` is kept in every row (its column). ``sim = -1`` turns this off.
5. **The diagonal** block (i, i) is always kept.

Output: a fixed-shape map (``Kmax = Tk``: one sort for the ranking, cumulative sums, a binary search for the
ascending index list (:func:`~rotvid.kernels.sparsity.block_map.indices_from_mask`) and masks only, no
data-dependent shape), so the builder runs under ``torch.compile(fullgraph=True)``, and the estimated dropped mass
per query tile ``sum_j P̂_ij`` over the skipped blocks (for reports). Computed in float32 (float64 for float64
inputs).

Where step 1 runs: on CUDA fp16 / bf16 / fp32 tensors, the one-pass Triton kernel
(:mod:`rotvid.kernels.sparsity.block_pool_triton`, custom op ``rotvid::block_pool``, eager and inside a compiled
graph alike) reads Q and K once in their own dtype and layout; elsewhere (CPU, float64) the same maths as PyTorch ops
on float32 (float64) copies (:func:`_pool`). The two differ by float32 rounding of the block sums (their order
differs), nothing else: a map can differ only where two blocks' estimated masses, or a cumulative mass and ``tau``,
or a self-similarity and ``sim``, lie within that rounding of each other.
"""

from __future__ import annotations

import importlib.util
import logging
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from rotvid.kernels.sparsity.block_map import MAP_BLOCK, BlockMap, blocks_for, indices_from_mask
from rotvid.kernels.sparsity.spec import REQUIRED, MapParam, SparseMap, SparsityKind, SparsitySpec

if importlib.util.find_spec("triton") is not None:
    from rotvid.kernels.sparsity.block_pool_triton import POOL_DTYPES, block_pool_triton
else:
    POOL_DTYPES, block_pool_triton = (), None

__all__ = ["DEFAULT_SIM", "KIND", "PMIN_KIND", "TopPEstimate", "pmin_block_map", "pmin_keep", "topp_block_map",
           "topp_estimate", "topp_keep"]

logger = logging.getLogger(__name__)
if block_pool_triton is None and torch.cuda.is_available():
    logger.warning("triton is not installed: the top-p builder pools Q and K with eager PyTorch ops on CUDA "
                   "(slower, same maps)")

# Self-similarity threshold when a spec gives none.
DEFAULT_SIM = 0.5
_EPS = 1e-12


def _blocks(x: torch.Tensor, n_blocks: int) -> torch.Tensor:
    """[B, H, N, D] -> [B, H, n_blocks, 128, D], zero-padded at the end."""
    b, h, n, d = x.shape
    return F.pad(x, (0, 0, 0, n_blocks * MAP_BLOCK - n)).view(b, h, n_blocks, MAP_BLOCK, d)


def _pool(x: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Block means [B, H, T, D], valid counts [B', 1, T] and self-similarity [B, H, T] of x [B, H, T, 128, D] with
    ``valid`` bool [B', 1, T, 128] (the tokens that count)."""
    w = valid.to(x.dtype).unsqueeze(-1)
    count = valid.sum(dim=-1)
    mean = (x * w).sum(dim=-2) / count.clamp_min(1).unsqueeze(-1).to(x.dtype)
    dot = (x * mean.unsqueeze(-2)).sum(dim=-1)
    norms = x.norm(dim=-1) * mean.norm(dim=-1, keepdim=True)
    cos = dot / norms.clamp_min(_EPS)
    sim = (cos * w.squeeze(-1)).sum(dim=-1) / count.clamp_min(1).to(x.dtype)
    return mean, count, sim


def _use_kernel(x: torch.Tensor) -> bool:
    """The Triton pooling takes ``x``: a CUDA fp16 / bf16 / fp32 tensor, triton installed (shape facts only: a
    constant of a compiled graph)."""
    return x.is_cuda and x.dtype in POOL_DTYPES and block_pool_triton is not None


def _pooled(x: torch.Tensor, lens: torch.Tensor | None, dt: torch.dtype):
    """Step 1 on x [B, H, N, D] (BHND view, any strides): block means [B, H, T, D], valid counts [B', 1, T] and
    self-similarity [B, H, T], in ``dt``; ``lens`` [B'] (B' = 1 or B): tokens ``n >= lens[b]`` do not count, None:
    all N count. On CUDA (fp16 / bf16 / fp32) the one-pass Triton kernel
    (:mod:`rotvid.kernels.sparsity.block_pool_triton`), elsewhere :func:`_pool` on float copies."""
    b, n = x.shape[0], x.shape[2]
    t = blocks_for(n)
    if _use_kernel(x):
        kernel_lens = None if lens is None else lens.expand(b).contiguous()
        mean, sim = block_pool_triton(x, kernel_lens)
        limit = torch.full((1,), n, device=x.device) if lens is None else lens.clamp(max=n)
        start = MAP_BLOCK * torch.arange(t, device=x.device)
        count = (limit.view(-1, 1, 1) - start).clamp(0, MAP_BLOCK)  # = valid.sum(-1) of the eager form
        return mean, count, sim
    j = torch.arange(t * MAP_BLOCK, device=x.device).view(1, 1, t, MAP_BLOCK)
    valid = j < n if lens is None else (j < lens.view(-1, 1, 1, 1)) & (j < n)
    return _pool(_blocks(x.to(dt), t), valid)


class TopPEstimate(NamedTuple):
    """What :func:`topp_estimate` computes, per (batch, head): ``keep`` bool [B, H, Tq, Tk], ``mass`` (the estimated
    mass P̂) [B, H, Tq, Tk], ``dropped_mass`` [B, H, Tq], ``q_sim`` [B, H, Tq] and ``k_sim`` [B, H, Tk] (the blocks'
    self-similarity), ``k_live`` bool [B', 1, Tk] (the key blocks holding a valid key). ``mass``, the similarities
    and ``k_live`` do not depend on ``tau`` or ``sim``: :func:`topp_keep` gives the map of any other pair from them."""

    keep: torch.Tensor
    mass: torch.Tensor
    dropped_mass: torch.Tensor
    q_sim: torch.Tensor
    k_sim: torch.Tensor
    k_live: torch.Tensor


def topp_estimate(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    tau: float,
    sim: float = DEFAULT_SIM,
    kv_lens: torch.Tensor | None = None,
    sm_scale: float | None = None,
) -> TopPEstimate:
    """Steps 1-5 of the module docstring on ``q`` [B, H, N_q, D] and ``k`` [B, H, N_kv, D] (BHND views, any
    strides); ``kv_lens`` int [B] (values past ``N_kv`` count as ``N_kv``)."""
    mass, q_sim, k_sim, k_live = _mass_estimate(q, k, kv_lens, sm_scale)
    keep = topp_keep(mass, q_sim, k_sim, k_live, tau=tau, sim=sim)
    return TopPEstimate(keep, mass, _dropped(mass, keep), q_sim, k_sim, k_live)


def _dropped(mass: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The estimated mass of the blocks ``keep`` leaves out, per query tile [B, H, Tq]."""
    return (mass * (~keep).to(mass.dtype)).sum(dim=-1)


def _sparse_map(keep: torch.Tensor, dropped: torch.Tensor, n_q: int, n_kv: int) -> SparseMap:
    """A dynamic kind's map of the kept blocks ``keep``, with its estimated dropped mass (float)."""
    indices, counts = indices_from_mask(keep)
    # (indices_from_mask: valid by construction, so a call never syncs to check the values)
    return SparseMap(BlockMap._valid_by_construction(indices, counts, n_q, n_kv), dropped.float())


def _mass_estimate(q, k, kv_lens, sm_scale):
    """Steps 1-2 of the module docstring: ``(mass P̂, q_sim, k_sim, k_live)`` as :class:`TopPEstimate`'s fields."""
    d = q.shape[3]
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    sm_scale = d**-0.5 if sm_scale is None else sm_scale
    q_mean, _, q_sim = _pooled(q, None, dt)
    k_mean, k_count, k_sim = _pooled(k, None if kv_lens is None else kv_lens.to(k.device), dt)
    k_live = k_count > 0  # [B', 1, Tk]
    log_n = torch.log(k_count.clamp_min(1).to(dt)).unsqueeze(-2)
    scores = torch.matmul(q_mean, k_mean.transpose(-1, -2)) * sm_scale + log_n
    scores = scores.masked_fill(~k_live.unsqueeze(-2), -math.inf)
    return torch.softmax(scores, dim=-1), q_sim, k_sim, k_live


def topp_keep(
    mass: torch.Tensor, q_sim: torch.Tensor, k_sim: torch.Tensor, k_live: torch.Tensor, *, tau: float, sim: float
) -> torch.Tensor:
    """Steps 3-5 of the module docstring: the kept blocks, bool [B, H, Tq, Tk], from the estimated ``mass``
    [B, H, Tq, Tk], the self-similarities ``q_sim`` [B, H, Tq] and ``k_sim`` [B, H, Tk] and ``k_live`` bool
    [B', 1, Tk] (a :class:`TopPEstimate`'s fields). Apart so that the map of another ``tau`` or ``sim`` costs no
    second pooling (:func:`rotvid.kernels.sparsity.density.topp_tau_for_density` searches ``tau`` this way)."""
    ranked, order = torch.sort(mass, dim=-1, descending=True)
    before = torch.cumsum(ranked, dim=-1) - ranked
    keep = torch.zeros_like(mass, dtype=torch.bool).scatter(-1, order, (before < tau) & (ranked > 0))
    return _always_kept(keep, q_sim, k_sim, k_live, sim)


def _always_kept(keep, q_sim, k_sim, k_live, sim):
    """Steps 4-5 of the module docstring on a selection ``keep``: the blocks below ``sim`` and the diagonal added."""
    tq, tk = keep.shape[-2], keep.shape[-1]
    keep = keep | (q_sim < sim).unsqueeze(-1) | ((k_sim < sim).unsqueeze(-2) & k_live.unsqueeze(-2))
    eye = torch.arange(tq, device=keep.device).unsqueeze(-1) == torch.arange(tk, device=keep.device)
    return keep | eye


def pmin_keep(
    mass: torch.Tensor, q_sim: torch.Tensor, k_sim: torch.Tensor, k_live: torch.Tensor, *, pmin: float, sim: float
) -> torch.Tensor:
    """The ``pmin`` kind's kept blocks, bool [B, H, Tq, Tk], from the same estimate as :func:`topp_keep`'s: every
    block whose estimated share ``P̂`` of its row's mass is at least ``pmin``, and each row's largest, then steps
    4-5 of the module docstring. One threshold for every row, head and call, where top-p gives every row the same
    mass: a row whose mass is spread keeps more blocks, a peaked one fewer -- at the same mean density it keeps more
    of the true mass (RESULTS.md, the top-p estimate study)."""
    top = mass >= mass.amax(dim=-1, keepdim=True)
    keep = ((mass >= pmin) | top) & (mass > 0)
    return _always_kept(keep, q_sim, k_sim, k_live, sim)


def pmin_block_map(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    pmin: float,
    sim: float = DEFAULT_SIM,
    layout: str = "BHND",
    kv_lens: torch.Tensor | None = None,
    sm_scale: float | None = None,
) -> SparseMap:
    """The ``pmin`` map of a call on ``q``, ``k`` (``layout``), [B, H, Tq, Tk] (:func:`pmin_keep`), with its
    estimated dropped mass float [B, H, Tq]. Fullgraph under ``torch.compile``."""
    if layout == "BNHD":
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    mass, q_sim, k_sim, k_live = _mass_estimate(q, k, kv_lens, sm_scale)
    keep = pmin_keep(mass, q_sim, k_sim, k_live, pmin=pmin, sim=sim)
    return _sparse_map(keep, _dropped(mass, keep), q.shape[2], k.shape[2])


def topp_block_map(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    tau: float,
    sim: float = DEFAULT_SIM,
    layout: str = "BHND",
    kv_lens: torch.Tensor | None = None,
    sm_scale: float | None = None,
) -> SparseMap:
    """The top-p map of a call on ``q``, ``k`` (``layout``), [B, H, Tq, Tk], with its estimated dropped mass
    float [B, H, Tq] (module docstring). Fullgraph under ``torch.compile``."""
    if layout == "BNHD":
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    est = topp_estimate(q, k, tau=tau, sim=sim, kv_lens=kv_lens, sm_scale=sm_scale)
    return _sparse_map(est.keep, est.dropped_mass, q.shape[2], k.shape[2])


def _build(spec: SparsitySpec, q, k, *, layout="BHND", kv_lens=None, sm_scale=None, grid=None) -> SparseMap:
    return topp_block_map(q, k, **spec.options, layout=layout, kv_lens=kv_lens, sm_scale=sm_scale)


def _build_pmin(spec: SparsitySpec, q, k, *, layout="BHND", kv_lens=None, sm_scale=None, grid=None) -> SparseMap:
    return pmin_block_map(q, k, **spec.options, layout=layout, kv_lens=kv_lens, sm_scale=sm_scale)


def _pmin(value) -> str:
    return "" if 0 < value <= 1 else "in (0, 1]"


def _tau(value) -> str:
    return "" if 0 < value <= 1 else "in (0, 1]"


def _sim(value) -> str:
    return "" if -1 <= value <= 1 else "in [-1, 1] (-1: off)"


KIND = SparsityKind(
    name="topp",
    summary="dynamic: per query tile, the key blocks holding a fraction tau of the estimated mass (block means), "
    "non-self-similar blocks and the diagonal kept",
    params=(
        MapParam("tau", "float", REQUIRED, _tau, "estimated mass to keep per query tile"),
        MapParam("sim", "float", DEFAULT_SIM, _sim, "blocks whose mean cosine to their mean is below it are kept"),
    ),
    positional="tau",
    static=False,
    build=_build,
)

PMIN_KIND = SparsityKind(
    name="pmin",
    summary="dynamic: the key blocks whose estimated share of their query tile's mass (block means) is at least "
    "pmin, one threshold for every row; each row's largest, non-self-similar blocks and the diagonal kept",
    params=(
        MapParam("pmin", "float", REQUIRED, _pmin, "smallest estimated share of a row's mass a kept block holds"),
        MapParam("sim", "float", DEFAULT_SIM, _sim, "blocks whose mean cosine to their mean is below it are kept"),
    ),
    positional="pmin",
    static=False,
    build=_build_pmin,
)
