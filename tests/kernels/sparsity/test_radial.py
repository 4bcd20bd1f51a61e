"""The radial map: equal to a brute-force per-token rule on small grids, conditioning tokens, speed, the cache."""

import math
import time

import pytest
import torch

from rotvid.kernels.sparsity import TokenGrid, build_block_map
from rotvid.kernels.sparsity.radial import radial_block_map, radial_block_mask


def window(dt, window0, decay):
    w = window0 * decay ** math.floor(math.log2(max(dt, 1))) + 1e-9
    return math.floor(w) if w >= 1 else -1


def brute_force_blocks(grid, band, window0, decay):
    """The rule on every token pair ([N, N], window per temporal distance from ``window`` above), then any() per
    128 x 128 block, the diagonal added."""
    n, p, v = grid.num_tokens, grid.prefix, grid.video_tokens
    window0 = max(grid.height, grid.width) if window0 is None else window0
    t = torch.arange(v)
    f, y, x = t // grid.frame_tokens, (t // grid.width) % grid.height, t % grid.width
    dt = (f[:, None] - f[None, :]).abs()
    reach = torch.tensor([window(d, window0, decay) for d in range(grid.frames)])[dt]
    cheb = torch.maximum((y[:, None] - y[None, :]).abs(), (x[:, None] - x[None, :]).abs())
    tokens = torch.ones(n, n, dtype=torch.bool)  # conditioning tokens: every pair
    tokens[p : p + v, p : p + v] = (dt <= band) | (cheb <= reach)
    blocks = -(-n // 128)
    padded = torch.zeros(blocks * 128, blocks * 128, dtype=torch.bool)
    padded[:n, :n] = tokens
    keep = padded.view(blocks, 128, blocks, 128).any(dim=3).any(dim=1)
    return keep | torch.eye(blocks, dtype=torch.bool)


@pytest.mark.parametrize(
    "grid, params",
    [
        (TokenGrid(24, 5, 7), dict(band=0, window=3, decay=0.5)),
        (TokenGrid(48, 4, 9), dict(band=1, window=None, decay=0.5)),
        (TokenGrid(16, 5, 16, prefix=37), dict(band=1, window=4, decay=0.5)),
        (TokenGrid(24, 6, 5, prefix=130, suffix=20), dict(band=0, window=2, decay=0.7)),
        (TokenGrid(40, 2, 11, suffix=9), dict(band=2, window=1, decay=0.5)),
        (TokenGrid(10, 12, 20), dict(band=0, window=3, decay=0.5)),  # frames of 240 tokens: blocks cut rows
        (TokenGrid(8, 1, 300), dict(band=0, window=2, decay=0.5)),  # rows longer than a block: x-intervals decide
        (TokenGrid(10, 2, 150, prefix=50), dict(band=0, window=3, decay=0.5)),
    ],
)
def test_blocks_equal_the_per_token_rule(grid, params):
    mask = radial_block_mask(grid, **params)
    expected = brute_force_blocks(grid, params["band"], params["window"], params["decay"])
    assert torch.equal(mask, expected)
    assert 0.05 < mask.float().mean() < 0.95  # a case that can tell rules apart


def test_window_and_band_edges_by_hand():
    # 2 frames of one 256-token row: blocks 0, 1 are frame 0's x < 128 and x >= 128; blocks 2, 3 frame 1's
    row = TokenGrid(2, 1, 256)
    assert radial_block_mask(row, band=0, window=1)[0, 3]  # x 127 -> 128: Chebyshev 1 at dt = 1
    assert not radial_block_mask(row, band=0, window=0)[0, 3]  # window 0: the band alone
    assert radial_block_mask(row, band=1, window=0)[0, 3]  # dt = 1 <= band
    # 2 frames of 4 rows of 64: blocks of 2 rows; block 0 = frame 0 rows 0-1, block 3 = frame 1 rows 2-3
    rows = TokenGrid(2, 4, 64)
    assert radial_block_mask(rows, band=0, window=1)[0, 3] and not radial_block_mask(rows, band=0, window=0)[0, 3]
    # window 4 halves per band: dt = 2, 3 -> 2, dt = 4..7 -> 1, dt = 8 -> 0.5 < 1: dropped
    frames = TokenGrid(9, 16, 8)  # one frame = one block
    reach = radial_block_mask(frames, band=0, window=4, decay=0.5)[0]
    assert reach.tolist() == [True] * 8 + [False]
    assert radial_block_mask(frames, band=0, window=4, decay=0.25)[0].tolist() == [True] * 4 + [False] * 5


def test_conditioning_tokens_are_kept_both_ways_and_the_window_shrinks():
    grid = TokenGrid(16, 8, 16, prefix=128)  # prefix fills block 0 exactly
    mask = radial_block_mask(grid, band=0, window=2, decay=0.5)
    assert mask[0].all() and mask[:, 0].all()
    rows = mask[1:, 1:].sum(dim=1)
    assert rows.max() < mask.shape[0] - 1  # sparse away from the conditioning block


def test_wan_size_builds_fast_and_is_cached():
    grid = TokenGrid(21, 30, 52)  # Wan2.1 480p: 32760 tokens, 256 blocks
    start = time.perf_counter()
    mask = radial_block_mask(grid, band=1, window=8, decay=0.5)
    assert time.perf_counter() - start < 0.5
    assert mask.shape == (256, 256)
    first = radial_block_map(grid, window=8)
    assert radial_block_map(grid, window=8) is first  # cached per (grid, params, device)
    assert torch.equal(first.to_dense_mask()[0, 0], mask)


def test_builder_through_the_spec_needs_the_grid():
    grid = TokenGrid(4, 8, 16)
    q = torch.randn(2, 3, grid.num_tokens, 8)
    out = build_block_map("radial:window=2", q, q, grid=grid)
    assert out.dropped_mass is None and out.block_map.counts.shape == (1, 1, 4)
    out.block_map.check(q.shape, q.shape)
    with pytest.raises(ValueError, match="grid: the radial map needs the token grid"):
        build_block_map("radial", q, q)
    with pytest.raises(ValueError, match="grid: .* has 512 tokens, the call has 500 queries"):
        build_block_map("radial", q[:, :, :500], q[:, :, :500], grid=grid)
