"""``radial``: a static block map from the token grid -- dense within a temporal band, spatial windows that shrink
with temporal distance (Radial Attention's energy-decay rule), conditioning tokens kept both ways.

The per-token rule. Query token (f, y, x) attends key token (f', y', x') of the video iff, with ``dt = |f - f'|``,

* ``dt <= band`` (dense within the temporal band), or
* ``max(|y - y'|, |x - x'|) <= window(dt)`` (Chebyshev distance in tokens), where
  ``window(dt) = floor(w)``, ``w = window0 * decay ** floor(log2(dt))``, as long as ``w >= 1`` (a frame pair whose
  window has shrunk below one token keeps nothing), and ``window0`` defaults to ``max(height, width)`` (the whole
  frame).

With the defaults (``band=1``, ``decay=0.5``) this is Radial Attention's rule (Li et al. 2025, "Radial Attention:
O(n log n) Sparse Attention with Energy Decay for Long Video Generation"): the attention energy of video DiTs decays
with temporal and spatial distance, so compute density is made to decay too -- temporal distances are grouped in
bands ``r = floor(log2(dt))`` (1, 2-3, 4-7, ...) and the spatial window halves from one band to the next, i.e. each
time the temporal distance doubles; frames within distance 1 are dense. Radial measures its window along the
flattened frame (``|k - l| < frame_tokens / 2**r``) and, once that falls below one token, keeps the same position
only every ``2**r / frame_tokens`` frames; here the window is a 2-D Chebyshev radius (a square neighbourhood), and
once it falls below one token that frame pair is dropped (``window=0``: the temporal band alone).

Conditioning tokens (:class:`~rotvid.kernels.sparsity.grid.TokenGrid` ``prefix`` / ``suffix``: text tokens, an I2V
first frame) attend every token and every token attends them. A map block (i, j) is kept iff some query token of
tile i and key token of block j satisfy the rule; the diagonal blocks always are. The blocks are computed exactly,
without a loop over tokens: each block is cut into row segments (one frame, one row, a run of x), and a pair of
segments has a pair of tokens within the window iff their frame, row and x-interval distances allow it.
Maps are cached per (grid, parameters, device).
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from rotvid.kernels.sparsity.block_map import MAP_BLOCK, BlockMap, blocks_for
from rotvid.kernels.sparsity.grid import TokenGrid
from rotvid.kernels.sparsity.spec import MapParam, SparseMap, SparsityKind, SparsitySpec

__all__ = ["KIND", "radial_block_map", "radial_block_mask", "window_for"]

# Query segments per chunk of the pairwise test (bounds the memory at ~chunk x segments int32 values).
_CHUNK = 1024


def window_for(dt: torch.Tensor, window0: int, decay: float) -> torch.Tensor:
    """The Chebyshev radius at temporal distances ``dt`` (int64; dt = 0 counts as 1): ``floor(w)`` with
    ``w = window0 * decay ** floor(log2(dt))``, or -1 (no key of that frame) where ``w < 1``."""
    band = torch.floor(torch.log2(dt.clamp_min(1).double()))
    w = window0 * torch.pow(torch.tensor(decay, dtype=torch.float64), band) + 1e-9  # (1e-9: 0.5 ** r products)
    return torch.where(w >= 1, torch.floor(w), torch.full_like(w, -1.0)).long()


def _row_segments(grid: TokenGrid) -> dict[str, torch.Tensor]:
    """The video tokens cut at every row start and every map-block boundary: per segment its map block, frame,
    row and x-interval [x_lo, x_hi] (int64)."""
    p, v, w = grid.prefix, grid.video_tokens, grid.width
    rows = p + torch.arange(0, v, w)
    bounds = torch.arange(0, p + v, MAP_BLOCK)
    bounds = bounds[bounds > p]
    starts = torch.unique(torch.cat([rows, bounds]))  # sorted
    stops = torch.cat([starts[1:], torch.tensor([p + v])])
    local = starts - p
    return {
        "block": starts // MAP_BLOCK,
        "f": local // grid.frame_tokens,
        "y": (local // w) % grid.height,
        "x_lo": local % w,
        "x_hi": local % w + (stops - starts) - 1,
    }


def radial_block_mask(grid: TokenGrid, *, band: int = 1, window: int | None = None, decay: float = 0.5) -> torch.Tensor:
    """bool [T, T] on the CPU (T = ceil(grid.num_tokens / 128)): the kept map blocks (module docstring)."""
    window0 = max(grid.height, grid.width) if window is None else window
    n, p, v = grid.num_tokens, grid.prefix, grid.video_tokens
    t = blocks_for(n)
    mask = torch.zeros(t * t, dtype=torch.bool)
    seg = _row_segments(grid)
    windows = window_for(torch.arange(grid.frames), window0, decay)
    for lo in range(0, seg["block"].numel(), _CHUNK):
        q = {name: val[lo : lo + _CHUNK, None] for name, val in seg.items()}
        dt = (q["f"] - seg["f"][None]).abs()
        reach = windows[dt]
        dy = (q["y"] - seg["y"][None]).abs()
        dx = torch.clamp(torch.maximum(seg["x_lo"][None] - q["x_hi"], q["x_lo"] - seg["x_hi"][None]), min=0)
        near = (dt <= band) | ((dy <= reach) & (dx <= reach))
        pairs = (q["block"] * t + seg["block"][None])[near]
        mask[pairs] = True
    mask = mask.view(t, t)
    cond = torch.zeros(t, dtype=torch.bool)  # blocks holding a conditioning token
    if p:
        cond[: blocks_for(p)] = True
    if grid.suffix:
        cond[(p + v) // MAP_BLOCK :] = True
    mask[cond, :] = True
    mask[:, cond] = True
    mask.fill_diagonal_(True)
    return mask


@lru_cache(maxsize=32)
def _cached_map(grid: TokenGrid, band: int, window: int | None, decay: float, device: str) -> BlockMap:
    mask = radial_block_mask(grid, band=band, window=window, decay=decay)
    return BlockMap.from_mask(mask.to(device), n_q=grid.num_tokens, n_kv=grid.num_tokens)


def radial_block_map(
    grid: TokenGrid, *, band: int = 1, window: int | None = None, decay: float = 0.5,
    device: torch.device | str = "cpu",
) -> BlockMap:
    """The radial map of ``grid`` ([1, 1, T, T]: one map for every batch and head) on ``device``; cached per
    (grid, band, window, decay, device)."""
    if not isinstance(grid, TokenGrid):
        raise ValueError(f"grid: expected a TokenGrid (frames, height, width after patchifying), got {grid!r}")
    return _cached_map(grid, int(band), window, float(decay), str(torch.device(device)))


def _build(spec: SparsitySpec, q, k, *, layout="BHND", kv_lens=None, sm_scale=None, grid=None) -> SparseMap:
    if grid is None:
        raise ValueError("grid: the radial map needs the token grid (a TokenGrid of frames, height, width)")
    n_q = q.shape[2] if layout == "BHND" else q.shape[1]
    n_kv = k.shape[2] if layout == "BHND" else k.shape[1]
    if not n_q == n_kv == grid.num_tokens:
        raise ValueError(
            f"grid: {grid} has {grid.num_tokens} tokens, the call has {n_q} queries and {n_kv} keys (radial is a "
            "self-attention map)"
        )
    return SparseMap(radial_block_map(grid, **spec.options, device=q.device))


def _non_negative_int(value) -> str:
    return "" if value >= 0 else "an int >= 0"


def _window(value) -> str:
    return "" if value is None or value >= 0 else "an int >= 0, or none (the whole frame)"


def _decay(value) -> str:
    return "" if 0 < value <= 1 and math.isfinite(value) else "in (0, 1]"


KIND = SparsityKind(
    name="radial",
    summary="static: dense within a temporal band, spatial windows halving as the temporal distance doubles "
    "(Radial Attention), conditioning tokens kept",
    params=(
        MapParam("band", "int", 1, _non_negative_int, "frames within this distance are dense"),
        MapParam("window", "int?", None, _window, "spatial radius in tokens at temporal distance 1, halved per band "
                 "(none: the frame; 0: the band alone)"),
        MapParam("decay", "float", 0.5, _decay, "window factor each time the temporal distance doubles"),
    ),
    static=True,
    build=_build,
)
