"""The top-p map: the mass it keeps on the pooled estimate, the blocks it must keep, kv_lens, fullgraph compile."""

import pytest
import torch

from rotvid.kernels.sparsity import build_block_map
from rotvid.kernels.sparsity.topp import topp_block_map, topp_estimate


def clustered(b, h, n, d, *, seed, noise=0.1, scale=3.0):
    """Tokens near one centre per 128-token block (self-similar blocks); q and k share the centres, so a query
    tile's mass sits on a few key blocks."""
    gen = torch.Generator().manual_seed(seed)
    t = -(-n // 128)
    centres = torch.randn(b, h, t, d, generator=gen) * scale
    base = centres.repeat_interleave(128, dim=2)[:, :, :n]
    q = base + noise * torch.randn(b, h, n, d, generator=gen) * scale
    k = base.roll(128, dims=2) + noise * torch.randn(b, h, n, d, generator=gen) * scale
    return q, k


@pytest.mark.parametrize("tau", [0.5, 0.8, 0.95])
def test_keeps_the_mass_it_claims_with_the_heaviest_blocks(tau):
    q, k = clustered(2, 2, 1000, 32, seed=0)
    est = topp_estimate(q, k, tau=tau, sim=-1.0)
    kept = (est.mass * est.keep).sum(-1)
    assert (kept >= tau - 1e-5).all()
    torch.testing.assert_close(est.dropped_mass, 1 - kept, atol=1e-5, rtol=0)
    expected = torch.eye(8, dtype=torch.bool).expand(2, 2, 8, 8).clone()  # the diagonal, and per row ...
    for row, mass in zip(expected.view(-1, 8), est.mass.view(-1, 8)):
        total = 0.0
        for j in sorted(range(8), key=lambda j: -float(mass[j])):  # ... the heaviest blocks until tau is reached
            row[j] = True
            total += float(mass[j])
            if total >= tau:
                break
    assert torch.equal(est.keep, expected)
    assert est.keep.float().mean() < 0.6  # the estimate is sharp here: a real selection


def test_estimate_is_the_block_mean_softmax_with_log_counts():
    q, k = clustered(1, 1, 300, 16, seed=1)
    kv_lens = torch.tensor([200])
    est = topp_estimate(q, k, tau=0.9, kv_lens=kv_lens, sm_scale=0.3)
    q_bar = torch.stack([q[0, 0, :128].mean(0), q[0, 0, 128:256].mean(0), q[0, 0, 256:].mean(0)])
    k_bar = torch.stack([k[0, 0, :128].mean(0), k[0, 0, 128:200].mean(0)])
    s = 0.3 * q_bar @ k_bar.T + torch.log(torch.tensor([128.0, 72.0]))
    expected = torch.cat([torch.softmax(s, -1), torch.zeros(3, 1)], dim=-1)  # block 2: past kv_lens
    torch.testing.assert_close(est.mass[0, 0], expected, atol=1e-5, rtol=1e-5)
    assert not est.keep[0, 0, :2, 2].any() and est.keep[0, 0, 2, 2]  # only the diagonal reaches past kv_lens


def test_blocks_that_are_not_self_similar_are_kept_and_the_diagonal_always():
    q, k = clustered(1, 2, 1024, 32, seed=2)
    gen = torch.Generator().manual_seed(3)
    q[0, 0, 256:384] = torch.randn(128, 32, generator=gen) * 3  # query tile 2 of head 0: no common direction
    k[0, 1, 640:768] = torch.randn(128, 32, generator=gen) * 3  # key block 5 of head 1
    est = topp_estimate(q, k, tau=0.5, sim=0.5)
    assert est.q_sim[0, 0, 2] < 0.5 < est.q_sim[0, 0, 3]
    assert est.keep[0, 0, 2].all() and est.keep[0, 1, :, 5].all()
    assert not est.keep[0, 0, 3].all() and not est.keep[0, 0, :, 5].all()
    assert torch.diagonal(est.keep, dim1=-2, dim2=-1).all()
    light = est.mass[0, 0].diagonal() < 1e-3  # diagonal blocks of negligible estimated mass: kept anyway
    assert light.any()


def test_map_shapes_layouts_and_the_spec():
    q, k = clustered(2, 3, 700, 64, seed=4)
    kv_lens = torch.tensor([700, 300])
    out = build_block_map("topp:0.7,sim=0.2", q, k, kv_lens=kv_lens)
    bm = out.block_map
    assert bm.indices.shape == (2, 3, 6, 6) and out.dropped_mass.shape == (2, 3, 6)
    bm.check(q.shape, k.shape)
    bnhd = topp_block_map(q.transpose(1, 2), k.transpose(1, 2), tau=0.7, sim=0.2, layout="BNHD", kv_lens=kv_lens)
    assert torch.equal(bnhd.block_map.indices, bm.indices) and torch.equal(bnhd.block_map.counts, bm.counts)
    assert not bm.to_dense_mask()[1, :, :3, 3:].any()  # key blocks 3.. hold no key of batch 1


@pytest.mark.parametrize("kind", ["topp", "pmin"])
def test_runs_fullgraph_under_torch_compile(kind):
    from rotvid.kernels.sparsity.topp import pmin_block_map

    q, k = clustered(1, 2, 520, 32, seed=5)
    kv_lens = torch.tensor([450])

    def build(q, k, kv_lens):
        if kind == "pmin":
            out = pmin_block_map(q, k, pmin=0.02, sim=0.3, kv_lens=kv_lens)
        else:
            out = topp_block_map(q, k, tau=0.8, sim=0.3, kv_lens=kv_lens)
        return out.block_map.indices, out.block_map.counts, out.dropped_mass

    torch._dynamo.reset()
    compiled = torch.compile(build, fullgraph=True, backend="aot_eager")
    for a, b in zip(compiled(q, k, kv_lens), build(q, k, kv_lens)):
        assert torch.equal(a, b)


def test_pmin_keeps_every_block_at_its_threshold_the_row_maximum_and_the_always_kept():
    """``pmin``: on the top-p estimate, a block is kept exactly when its estimated share is >= pmin, or it is its row's
    largest, or top-p's always-kept rules keep it (not self-similar, the diagonal); a larger threshold keeps a subset;
    the built map is that selection, with its estimated dropped mass."""
    from rotvid.kernels.sparsity.topp import pmin_block_map, pmin_keep

    q, k = clustered(1, 2, 1000, 32, seed=3, noise=0.5, scale=1.0)
    est = topp_estimate(q, k, tau=1.0, sim=-1.0)
    mass = est.mass
    tq, tk = mass.shape[-2:]
    eye = torch.eye(tq, tk, dtype=torch.bool)
    prev = None
    for pmin in (1e-4, 0.01, 0.05, 0.2, 1.0):
        keep = pmin_keep(mass, est.q_sim, est.k_sim, est.k_live, pmin=pmin, sim=-1.0)
        top = mass == mass.amax(dim=-1, keepdim=True)
        assert torch.equal(keep, (mass >= pmin) | top | eye)
        if prev is not None:
            assert not (keep & ~prev).any()  # (a subset of the smaller threshold's)
        prev = keep
        sm = pmin_block_map(q, k, pmin=pmin, sim=-1.0)
        assert torch.equal(sm.block_map.to_dense_mask(), keep)
        assert torch.allclose(sm.dropped_mass, (mass * ~keep).sum(-1).float())
    assert prev.sum(-1).min() >= 1  # every row keeps its largest (and the diagonal)
    # top-p's always-kept rule: a query tile below sim keeps its row
    keep = pmin_keep(mass, est.q_sim, est.k_sim, est.k_live, pmin=1.0, sim=2.0)
    assert keep.all()
    built = build_block_map("pmin:0.05,sim=-1", q, k).block_map
    assert torch.equal(built.to_dense_mask(), pmin_keep(mass, est.q_sim, est.k_sim, est.k_live, pmin=0.05, sim=-1.0))
