"""BlockMap: the fixed-shape index + count form, its dense mask, and the checks that name block_map."""

import pytest
import torch

from rotvid.kernels.sparsity import BlockMap
from rotvid.kernels.sparsity.block_map import indices_from_mask
from rotvid.kernels.sparsity.topp import topp_block_map


def random_mask(b, h, tq, tk, density, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(b, h, tq, tk, generator=gen) < density


@pytest.mark.parametrize("density", [0.0, 0.3, 1.0])
def test_mask_round_trip_and_ascending_rows(density):
    mask = random_mask(2, 3, 5, 7, density, seed=1)
    bm = BlockMap.from_mask(mask, n_q=5 * 128 - 3, n_kv=7 * 128 - 100)
    assert bm.indices.shape == (2, 3, 5, 7) and bm.indices.dtype == torch.int32 and bm.counts.dtype == torch.int32
    assert torch.equal(bm.to_dense_mask(), mask)
    assert torch.equal(bm.counts, mask.sum(-1).int())
    for row, n in zip(bm.indices.view(-1, 7).tolist(), bm.counts.view(-1).tolist()):
        assert row[:n] == sorted(row[:n]) and len(set(row[:n])) == n
        assert all(0 <= i < 7 for i in row)
        assert row[n:] == [row[n - 1] if n else 0] * (7 - n)  # padding repeats the last kept index
    assert bm.value_problem() == ""
    torch.testing.assert_close(bm.density(), mask.float().mean())


def test_indices_from_mask_runs_fullgraph_under_compile():
    mask = random_mask(1, 2, 3, 6, 0.5, seed=2)
    eager = indices_from_mask(mask)
    compiled = torch.compile(indices_from_mask, fullgraph=True, backend="eager")(mask)
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))


def test_token_mask_covers_partial_last_blocks():
    mask = torch.tensor([[True, False], [False, True]])
    bm = BlockMap.from_mask(mask, n_q=200, n_kv=150)
    tok = bm.token_mask()
    assert tok.shape == (1, 1, 200, 150)
    assert tok[0, 0, :128, :128].all() and not tok[0, 0, :128, 128:].any()
    assert tok[0, 0, 128:, 128:].all() and not tok[0, 0, 128:, :128].any()


def test_dense_map_has_density_one():
    bm = BlockMap.dense(300, 129)
    assert bm.indices.shape == (1, 1, 3, 2) and float(bm.density()) == 1.0


def test_check_names_block_map_and_what_was_expected():
    bm = BlockMap.from_mask(torch.ones(2, 1, 3, 2, dtype=torch.bool), n_q=300, n_kv=200)
    bm.check((2, 4, 300, 64), (2, 4, 200, 64))
    bm.check((2, 300, 4, 64), (2, 200, 4, 64), layout="BNHD")
    with pytest.raises(ValueError, match="block_map: a map for 300 queries and 200 keys, the call has 301"):
        bm.check((2, 4, 301, 64), (2, 4, 200, 64))
    with pytest.raises(ValueError, match=r"block_map: batch and head dimensions \(2, 1\), expected 1 or the call's \(3, 4\)"):
        bm.check((3, 4, 300, 64), (3, 4, 200, 64))
    bad = BlockMap(torch.tensor([[[[1, 0]]]], dtype=torch.int32), torch.tensor([[[2]]], dtype=torch.int32), 100, 200)
    with pytest.raises(ValueError, match="block_map: indices must be strictly ascending"):
        bad.check((1, 1, 100, 64), (1, 1, 200, 64))
    out_of_range = BlockMap(torch.tensor([[[[0, 2]]]], dtype=torch.int32), torch.tensor([[[2]]], dtype=torch.int32), 100, 200)
    with pytest.raises(ValueError, match=r"block_map: indices must lie in \[0, Tk = 2\)"):
        out_of_range.check((1, 1, 100, 64), (1, 1, 200, 64))


def test_values_are_checked_once_and_never_for_the_builders_maps(monkeypatch):
    """An eager pipeline passes one map to every call: its values (a host sync) are checked by the first call only,
    and not at all for maps built valid (from_mask, the top-p builder); a bad map still fails every time."""
    calls = []
    real = BlockMap.value_problem
    monkeypatch.setattr(BlockMap, "value_problem", lambda self: calls.append(1) or real(self))
    shapes = (1, 2, 300, 64), (1, 2, 200, 64)
    built = BlockMap.from_mask(torch.tensor([[True, False], [True, True], [False, True]]), n_q=300, n_kv=200)
    topp_map = topp_block_map(torch.randn(*shapes[0]), torch.randn(*shapes[1]), tau=0.5).block_map
    for _ in range(3):
        built.check(*shapes)
        topp_map.check(*shapes)
    assert calls == []
    by_hand = BlockMap(built.indices.clone(), built.counts.clone(), 300, 200)
    for _ in range(3):
        by_hand.check(*shapes)
    assert len(calls) == 1 and by_hand.values_checked
    bad = BlockMap(torch.tensor([[[[1, 0]]]], dtype=torch.int32), torch.tensor([[[2]]], dtype=torch.int32), 100, 200)
    for _ in range(2):
        with pytest.raises(ValueError, match="strictly ascending"):
            bad.check((1, 1, 100, 64), (1, 1, 200, 64))
    assert not bad.values_checked


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(indices=torch.zeros(1, 1, 2, 2, dtype=torch.int64)), "indices must be an int32 tensor"),
        (dict(counts=torch.zeros(1, 1, 3, dtype=torch.int32)), "disagree on"),
        (dict(n_q=129 * 3), r"Tq = 2, expected ceil\(387 / 128\) = 4"),
        (dict(indices=torch.zeros(1, 1, 2, 3, dtype=torch.int32)), "Kmax = 3, expected 1 <= Kmax <= Tk = 2"),
        (dict(block=64), "block must be 128"),
    ],
)
def test_construction_checks_shapes(kwargs, match):
    args = dict(indices=torch.zeros(1, 1, 2, 2, dtype=torch.int32), counts=torch.ones(1, 1, 2, dtype=torch.int32),
                n_q=256, n_kv=200)
    args.update(kwargs)
    with pytest.raises(ValueError, match="block_map: .*" + match):
        BlockMap(**args)
