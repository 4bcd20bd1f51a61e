"""The oracle map: exact block masses, the heavy blocks it keeps, its density, kv_lens, and that no map with the same
per-row counts keeps more mass (radial, top-p, random maps); the spec's text and JSON forms."""

import math

import pytest
import torch

from rotvid.kernels.sparsity import BlockMap, TokenGrid, build_block_map, parse_sparsity
from rotvid.kernels.sparsity.oracle import (
    block_attention_mass,
    kept_mass,
    oracle_block_map,
    oracle_keep,
    oracle_kept_mass,
)
from rotvid.pipelines import RotvidConfig


def dense_block_mass(q, k, kv_lens=None, sm_scale=None):
    """fp64 reference of the block mass: the whole score matrix at once."""
    q, k = q.double(), k.double()
    nq, nkv = q.shape[2], k.shape[2]
    s = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if sm_scale is None else sm_scale)
    if kv_lens is not None:
        s = s.masked_fill(torch.arange(nkv) >= kv_lens.view(-1, 1, 1, 1), -math.inf)
    p = torch.softmax(s, dim=-1)
    tq, tk = -(-nq // 128), -(-nkv // 128)
    out = torch.zeros(*q.shape[:2], tq, tk, dtype=torch.float64)
    for i in range(tq):
        for j in range(tk):
            out[:, :, i, j] = p[:, :, 128 * i:128 * (i + 1), 128 * j:128 * (j + 1)].sum(dim=(-1, -2))
        out[:, :, i] /= min(128, nq - 128 * i)
    return out


def matched(b, h, tq, tk, d, *, seed, heavy=None):
    """Queries of tile i and keys of block heavy[i] share a direction, scaled up: tile i's mass sits on that key
    block (and the diagonal is not special). ``heavy`` [Tq] (default: a random permutation)."""
    gen = torch.Generator().manual_seed(seed)
    heavy = torch.randperm(tk, generator=gen)[:tq] if heavy is None else heavy
    dirs = torch.nn.functional.normalize(torch.randn(tk, d, generator=gen), dim=-1) * 6.0
    q = 0.3 * torch.randn(b, h, tq * 128, d, generator=gen)
    k = 0.3 * torch.randn(b, h, tk * 128, d, generator=gen)
    q += dirs[heavy].repeat_interleave(128, dim=0)
    k += dirs.repeat_interleave(128, dim=0)
    return q, k, heavy


@pytest.mark.parametrize("nq, nkv", [(128, 128), (300, 700), (97, 1025)])
def test_block_mass_is_the_exact_mass_in_any_chunking(nq, nkv):
    gen = torch.Generator().manual_seed(nq)
    q, k = torch.randn(2, 3, nq, 32, generator=gen), torch.randn(2, 3, nkv, 32, generator=gen)
    lens = torch.tensor([nkv, max(1, nkv // 3)])
    ref = dense_block_mass(q, k, lens, sm_scale=0.2)
    for chunk in (1, 5000, 1 << 26):  # one tile at a time ... all at once
        mass = block_attention_mass(q, k, kv_lens=lens, sm_scale=0.2, chunk_elements=chunk)
        assert mass.dtype == torch.float32 and mass.shape == ref.shape
        torch.testing.assert_close(mass.double(), ref, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(mass.sum(-1), torch.ones(2, 3, ref.shape[2]), atol=1e-5, rtol=0)
    bnhd = block_attention_mass(q.transpose(1, 2), k.transpose(1, 2), layout="BNHD", kv_lens=lens, sm_scale=0.2)
    torch.testing.assert_close(bnhd, mass)


@pytest.mark.parametrize("seed", range(3))
def test_keeps_exactly_the_heavy_blocks(seed):
    q, k, heavy = matched(2, 2, 6, 6, 16, seed=seed)
    sm = oracle_block_map(q, k, density=1 / 6)
    expected = torch.zeros(6, 6, dtype=torch.bool)
    expected[torch.arange(6), heavy] = True
    assert torch.equal(sm.block_map.to_dense_mask(), expected.expand(2, 2, 6, 6))
    assert sm.block_map.values_checked and sm.block_map.value_problem() == ""
    assert (sm.dropped_mass < 0.05).all()  # the heavy block holds nearly all of each tile's mass
    torch.testing.assert_close(sm.dropped_mass, 1 - (sm.block_mass * expected).sum(-1).float())


@pytest.mark.parametrize("density, per_row", [(0.25, 2), (0.5, 4), (0.75, 6), (1.0, 8), (0.3, 3), (0.01, 1)])
def test_density_is_d_of_the_valid_blocks_per_row(density, per_row):
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 2, 5 * 128, 16, generator=gen), torch.randn(1, 2, 8 * 128, 16, generator=gen)
    bm = oracle_block_map(q, k, density=density).block_map
    assert (bm.counts == per_row).all()  # ceil(D * 8), at least 1
    assert float(bm.density()) == pytest.approx(per_row / 8)
    idx = bm.indices[..., :per_row]
    assert (idx[..., 1:] > idx[..., :-1]).all()  # ascending


def test_kv_lens_only_valid_blocks_and_valid_keys():
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 2, 384, 16, generator=gen), torch.randn(2, 2, 1000, 16, generator=gen)
    k[1, :, 300:] *= 50  # huge keys past kv_len: they would take all the mass if they counted
    lens = torch.tensor([1000, 300])  # batch 1: blocks 0-2 valid (block 2 partly), 3-7 wholly past kv_len
    sm = oracle_block_map(q, k, density=0.5, kv_lens=lens)
    mask = sm.block_map.to_dense_mask()
    assert not mask[1, :, :, 3:].any() and (sm.block_map.counts[1] == 2).all()  # ceil(0.5 * 3) of the valid 3
    assert (sm.block_map.counts[0] == 4).all()
    assert (sm.block_mass[1, ..., 3:] == 0).all()
    torch.testing.assert_close(sm.block_mass.sum(-1), torch.ones(2, 2, 3, dtype=sm.block_mass.dtype))
    torch.testing.assert_close(sm.block_mass.double(), dense_block_mass(q, k, lens), atol=2e-6, rtol=1e-5)


def random_map(mass, counts, gen):
    """A random mask with the given per-row counts ([Tq])."""
    *lead, tq, tk = mass.shape
    mask = torch.zeros(*lead, tq, tk, dtype=torch.bool)
    for idx in torch.cartesian_prod(*[torch.arange(n) for n in lead]).view(-1, len(lead)).tolist():
        for i in range(tq):
            mask[(*idx, i, torch.randperm(tk, generator=gen)[: int(counts[i])])] = True
    return mask


@pytest.mark.parametrize("seed", range(4))
def test_no_map_with_the_same_counts_keeps_more_mass(seed):
    """Property: the oracle at a map's per-row counts keeps at least the mass of that map -- radial, top-p, random
    -- and the oracle map itself keeps what oracle_kept_mass says."""
    gen = torch.Generator().manual_seed(seed)
    grid = TokenGrid(6, 8, 16)  # 6 frames of 128 tokens: 6 x 6 blocks
    n = grid.num_tokens
    q = torch.randn(1, 2, n, 32, generator=gen) * 1.5
    k = q.roll(128 * (seed % 3), dims=2) + torch.randn(1, 2, n, 32, generator=gen)
    mass = block_attention_mass(q, k)
    stub = torch.empty(()).expand(1, 1, n, 1)
    maps = {
        "radial": build_block_map("radial:band=0,window=0", stub, stub, grid=grid).block_map,
        "radial_band1": build_block_map("radial:band=1", stub, stub, grid=grid).block_map,
        "topp": build_block_map("topp:0.6,sim=-1", q, k).block_map,
    }
    for name, bm in maps.items():
        mask = bm.to_dense_mask()
        counts = mask.sum(-1)
        best = oracle_kept_mass(mass, counts, n)
        assert float(kept_mass(mass, mask, n)) <= float(best) + 1e-6, name
        rnd = random_map(mass, counts.expand(1, 2, 6)[0, 0], gen)
        assert float(kept_mass(mass, rnd, n)) <= float(best) + 1e-6, name
    for density in (1 / 6, 0.5, 5 / 6):
        sm = oracle_block_map(q, k, density=density)
        mask = sm.block_map.to_dense_mask()
        own = kept_mass(mass, mask, n)
        torch.testing.assert_close(own, oracle_kept_mass(mass, sm.block_map.counts, n))
        rnd = random_map(mass, sm.block_map.counts[0, 0], gen)
        assert float(kept_mass(mass, rnd, n)) <= float(own) + 1e-6


def test_kept_mass_weighs_a_partial_tile_by_its_rows():
    mass = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])  # tile 0: 128 rows on block 0; tile 1: 2 rows on block 1
    keep = torch.tensor([[True, False], [False, False]])
    assert float(kept_mass(mass, keep, 130)) == pytest.approx(128 / 130)
    assert float(oracle_kept_mass(mass, torch.tensor([1, 0]), 130)) == pytest.approx(128 / 130)
    assert float(oracle_kept_mass(mass, torch.tensor([1, 1]), 130)) == pytest.approx(1.0)


def test_oracle_keep_ties_go_to_the_lower_index():
    keep = oracle_keep(torch.full((1, 1, 1, 4), 0.25), 0.5, n_kv=512)
    assert keep.view(-1).tolist() == [True, True, False, False]


# ---- the spec ------------------------------------------------------------------------------------------------


def test_spec_text_and_json_round_trip():
    spec = parse_sparsity("oracle:0.5")
    assert spec.kind == "oracle" and spec.options == {"density": 0.5} and not spec.static
    assert str(spec) == "oracle:0.5" and parse_sparsity(str(spec)) == spec
    assert parse_sparsity("oracle:density=1") == parse_sparsity("oracle:1.0")
    cfg = RotvidConfig(sparsity="oracle:0.3", measure_kept_mass=True)
    back = RotvidConfig.from_json(cfg.to_json())
    assert back == cfg and back.sparsity == parse_sparsity("oracle:0.3") and back.measure_kept_mass


@pytest.mark.parametrize("value", ["oracle", "oracle:", "oracle:0", "oracle:1.5", "oracle:-0.2", "oracle:nan",
                                   "oracle:abc", "oracle:0.5,tau=0.9", "oracle:0.5,0.6"])
def test_bad_oracle_specs_name_sparsity(value):
    with pytest.raises(ValueError, match=r"^sparsity"):
        RotvidConfig(sparsity=value)
    with pytest.raises(ValueError, match=r"^sparsity"):
        RotvidConfig.from_dict({**RotvidConfig().to_dict(), "sparsity": value})


@pytest.mark.parametrize("value", [1, "yes", None])
def test_bad_measure_kept_mass_names_the_field(value):
    with pytest.raises(ValueError, match=r"^measure_kept_mass"):
        RotvidConfig(measure_kept_mass=value)


def test_a_built_map_is_a_valid_block_map_through_build_block_map():
    gen = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 2, 200, 16, generator=gen), torch.randn(1, 2, 333, 16, generator=gen)
    sm = build_block_map("oracle:0.5", q, k, kv_lens=torch.tensor([250]))
    assert isinstance(sm.block_map, BlockMap) and sm.block_map.value_problem() == ""
    assert (sm.block_map.counts == 1).all()  # ceil(0.5 * 2) of the 2 valid blocks (250 keys)
