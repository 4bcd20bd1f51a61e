"""The block-sparse kernels (``block_map=``) against their reference twins on the same quantized inputs.

What must hold (issue 34):

* the Hopper kernels -- int8-fp8 and INT4 wgmma (block_n 128 and 64: a map block walked as two kernel blocks) -- and
  the mma.sync kernels -- int8-fp8 ``"mma"`` (sm89, sm90) and INT4 ``"s8"`` / ``"s4"`` (the s4 path emulated on Hopper:
  correctness only), whose CTAs of 64 query rows read the map row of their 128-row tile -- equal
  :func:`rotvid.kernels.recipes.int8_fp8.reference.attention_int8fp8_from_quantized` /
  :func:`rotvid.kernels.recipes.int4.reference.attention_from_quantized` under the same map within the dense kernels'
  bounds (test_cuda_int8fp8.py, test_cuda_int4.py), on random maps with every edge case: a row that keeps nothing (its
  output exactly 0, no V mean), a full row, a single block, the last, partial key block, ``kv_lens`` cutting a kept
  block, a row whose kept blocks all lie past ``kv_lens``; per-(batch, head) maps and broadcast ones; both head dims and
  layouts; with the wgmma kernels' tail split (most of these small grids split their tiles over the keys, so empty
  splits and all-empty split rows go through the combine kernel) and without (the mma.sync kernel has no split);
* a map of density 1 gives the dense kernel's bits;
* the fused RoPE·R pre-processing, the dispatcher (eager and compiled) and ``kv_lens`` combine with a map;
* every output is NaN-poisoned before the run and NaN fails.
"""

import functools

import pytest
import torch

from rotvid.kernels import attention, metrics, select_backend
from rotvid.kernels.recipes import attention_reference
from rotvid.kernels.recipes.int4.ops import (
    attention_int4_quantized, int4_attention_cuda, pack_reference_quantized, preprocess_int4_cuda,
)
from rotvid.kernels.recipes.int4.reference import attention_from_quantized, preprocess_int4
from rotvid.kernels.recipes.int8_fp8.ops import (
    attention_int8fp8_quantized, int8fp8_attention_cuda, preprocess_int8fp8_cuda,
)
from rotvid.kernels.recipes.int8_fp8.reference import attention_int8fp8_from_quantized
from rotvid.kernels.rope_op import apply_generalized_rope
from rotvid.kernels.sparsity import MAP_BLOCK, BlockMap
from tests.kernels.helpers import cuda_qkv
from tests.kernels.test_cuda_int8fp8 import COS_MIN, REL_L2_MAX, key_scales, needs_sm90, unpermute_v8
from tests.kernels.test_cuda_int8fp8_mma import needs_e4m3_mma
from tests.kernels.test_rope_table_cuda import make_table

pytestmark = pytest.mark.gpu


def to_bhnd(x, layout):
    return x if layout == "BHND" else x.transpose(1, 2)


def blocks(n):
    return -(-n // MAP_BLOCK)


def edge_case_mask(mb, mh, n_q, n_kv, *, density, seed, kv_lens=None):
    """bool [mb, mh, Tq, Tk]: random blocks at ``density``, then, per (batch, head) of the map, rows forced to the
    edge cases (as many as there are query tiles, the first at a row that moves with the head): nothing; every
    block; one random block; the last key block only (partial when n_kv % 128); with ``kv_lens`` (mb = B), the
    block kv_lens cuts only, and blocks wholly past kv_lens only (that row attends to nothing)."""
    tq, tk = blocks(n_q), blocks(n_kv)
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(mb, mh, tq, tk, generator=gen) < density
    for bi in range(mb):
        for hi in range(mh):
            rows = []
            empty = torch.zeros(tk, dtype=torch.bool)
            rows.append(empty)
            rows.append(~empty)
            one = empty.clone()
            one[int(torch.randint(tk, (1,), generator=gen))] = True
            rows.append(one)
            last = empty.clone()
            last[-1] = True
            rows.append(last)
            if kv_lens is not None:
                cut = (int(kv_lens[bi]) - 1) // MAP_BLOCK
                cut_row = empty.clone()
                cut_row[cut] = True
                rows.append(cut_row)
                if cut + 1 < tk:
                    past = empty.clone()
                    past[cut + 1:] = True
                    rows.append(past)
            for r, row in enumerate(rows):
                mask[bi, hi, (r + 2 * hi + bi) % tq] = row
    return mask


def live_tiles(mask, kv_lens, b, h):
    """bool [B, H, Tq]: the query tiles that keep a block holding a key before kv_lens (the rest give 0)."""
    tk = mask.shape[-1]
    m = mask.expand(b, h, *mask.shape[2:])
    if kv_lens is None:
        return m.any(dim=-1)
    reach = torch.arange(tk)[None, :] * MAP_BLOCK < kv_lens.cpu()[:, None]  # [B, Tk]
    return (m & reach[:, None, None, :]).any(dim=-1)


def make_map(mask, n_q, n_kv):
    return BlockMap.from_mask(mask.cuda(), n_q=n_q, n_kv=n_kv)


def check_empty_rows_zero(out_bhnd, mask, kv_lens, n_q):
    """The rows of tiles that attend to nothing are exactly 0."""
    b, h = out_bhnd.shape[:2]
    live = live_tiles(mask, kv_lens, b, h)
    rows_live = live.repeat_interleave(MAP_BLOCK, dim=-1)[..., :n_q]  # [B, H, n_q]
    dead = out_bhnd[~rows_live.to(out_bhnd.device)]
    assert (~live).any(), "the map must hold an empty row (the case under test)"
    assert torch.equal(dead, torch.zeros_like(dead)), "an empty row's output is not exactly 0"


def poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def assert_written(out):
    torch.cuda.synchronize()
    assert not torch.isnan(out).any(), "kernel left output elements unwritten (NaN poison survived) or wrote NaN"


def assert_close_per_head(ref_bhnd, got_bhnd, dtype):
    """Per (batch, head): the dense kernels' bound against their twin, plus the output's fp16 / bf16 rounding."""
    rounding = 2.0 ** (-8 if dtype == torch.bfloat16 else -11)
    for bi in range(ref_bhnd.shape[0]):
        for hi in range(ref_bhnd.shape[1]):
            r, o = ref_bhnd[bi, hi], got_bhnd[bi, hi]
            assert metrics.relative_l2(r, o) <= REL_L2_MAX + rounding, (bi, hi, metrics.relative_l2(r, o))
            assert metrics.cosine_similarity(r, o) >= COS_MIN - 10 * rounding**2, (bi, hi)


# ---- int8-fp8 -----------------------------------------------------------------------------------------------------


def int8fp8_twin(kq, n_q, n_kv, kv_lens, block_map):
    """The int8-fp8 reference twin on the kernel's own operands, under ``block_map``."""
    return attention_int8fp8_from_quantized(
        kq.q_hat[:, :, :n_q], kq.q_scale[:, :, :n_q, None], kq.k_hat[:, :, :n_kv], key_scales(kq.k_scale, n_kv),
        unpermute_v8(kq.vt, n_kv), kq.vparams[:, :, None, :],
        v_mean=kq.v_mean[:, :, None, :] if kq.v_mean.numel() else None, kv_lens=kv_lens, block_map=block_map,
    )


def run_int8fp8(kq, *, n_q, n_kv, d, kv_lens, dtype, layout, b, h, block_map=None, split_tail=True, path=None):
    shape = (b, n_q, h, d) if layout == "BNHD" else (b, h, n_q, d)
    out = poisoned(shape, dtype)
    attention_int8fp8_quantized(kq, n_q=n_q, n_kv=n_kv, head_dim=d, kv_lens=kv_lens, out_dtype=dtype,
                                layout=layout, out=out, split_tail=split_tail, block_map=block_map, path=path)
    assert_written(out)
    return out


# (b, h, n_q, n_kv, d, kv_lens, dtype, layout, smooth_v, map batch/head dims): odd lengths (a partial last query
# tile and key block), both head dims and layouts, kv_lens cutting blocks, maps per (batch, head) and broadcast
SPARSE_CASES = [
    (1, 2, 1025, 1025, 128, None, torch.bfloat16, "BHND", False, "bh"),
    (1, 3, 1025, 1100, 64, None, torch.float16, "BNHD", True, "h"),
    (2, 2, 1500, 1500, 128, [1500, 700], torch.float16, "BNHD", True, "bh"),
    (2, 2, 700, 2100, 64, [1999, 1030], torch.bfloat16, "BHND", False, "bh"),
    (1, 2, 4099, 4099, 128, None, torch.bfloat16, "BNHD", True, "1"),
    (1, 1, 300, 4099, 64, [4000], torch.float16, "BHND", True, "bh"),
]


def map_dims(kind, b, h):
    return {"bh": (b, h), "h": (1, h), "1": (1, 1)}[kind]


def case_id(c):
    return f"b{c[0]}h{c[1]}q{c[2]}k{c[3]}d{c[4]}{c[7]}{'-lens' if c[5] else ''}-map{c[9]}"


@pytest.mark.parametrize("split_tail", [True, False], ids=["split", "whole"])
@pytest.mark.parametrize("density", [0.2, 0.6])
@pytest.mark.parametrize("case", SPARSE_CASES, ids=case_id)
def test_int8fp8_sparse_kernel_matches_twin(case, density, split_tail):
    needs_sm90()
    b, h, n_q, n_kv, d, lens, dtype, layout, smooth_v, dims = case
    q, k, v, kv_lens = cuda_qkv(b, h, n_q, n_kv, d, dtype, layout, seed=n_q + n_kv + d, kv_lens=lens)
    mask = edge_case_mask(*map_dims(dims, b, h), n_q, n_kv, density=density, seed=n_kv + int(100 * density),
                          kv_lens=kv_lens if dims == "bh" else None)
    bm = make_map(mask, n_q, n_kv)
    kq = preprocess_int8fp8_cuda(q, k, v, layout=layout, kv_lens=kv_lens, smooth_v=smooth_v)
    out = run_int8fp8(kq, n_q=n_q, n_kv=n_kv, d=d, kv_lens=kv_lens, dtype=dtype, layout=layout, b=b, h=h,
                      block_map=bm, split_tail=split_tail)
    got = to_bhnd(out, layout).float()
    assert_close_per_head(int8fp8_twin(kq, n_q, n_kv, kv_lens, bm), got, dtype)
    check_empty_rows_zero(got, mask, kv_lens, n_q)
    # the map is doing work: the dense kernel on the same operands is far from the sparse twin
    dense = to_bhnd(run_int8fp8(kq, n_q=n_q, n_kv=n_kv, d=d, kv_lens=kv_lens, dtype=dtype, layout=layout, b=b, h=h,
                                split_tail=split_tail), layout).float()
    assert metrics.relative_l2(got, dense) > 10 * REL_L2_MAX


@pytest.mark.parametrize("split_tail", [True, False], ids=["split", "whole"])
@pytest.mark.parametrize("case", SPARSE_CASES, ids=case_id)
def test_int8fp8_density_one_map_gives_the_dense_bits(case, split_tail):
    needs_sm90()
    b, h, n_q, n_kv, d, lens, dtype, layout, smooth_v, dims = case
    q, k, v, kv_lens = cuda_qkv(b, h, n_q, n_kv, d, dtype, layout, seed=3 * n_q + d, kv_lens=lens)
    kq = preprocess_int8fp8_cuda(q, k, v, layout=layout, kv_lens=kv_lens, smooth_v=smooth_v)
    run = functools.partial(run_int8fp8, kq, n_q=n_q, n_kv=n_kv, d=d, kv_lens=kv_lens, dtype=dtype, layout=layout,
                            b=b, h=h, split_tail=split_tail)
    dense = run()
    full = torch.ones(*map_dims(dims, b, h), blocks(n_q), blocks(n_kv), dtype=torch.bool)
    assert torch.equal(run(block_map=make_map(full, n_q, n_kv)), dense)
    assert torch.equal(run(block_map=BlockMap.dense(n_q, n_kv, device="cuda")), dense)


NEEDS = {"wgmma": needs_sm90, "mma": needs_e4m3_mma}


@pytest.mark.parametrize("path", ["wgmma", "mma"])
def test_int8fp8_kv_lens_past_every_kept_block_and_empty_maps(path):
    """A whole map of empty rows gives 0 everywhere (no V mean), through the split and whole paths alike (the mma.sync
    kernel has no split: both runs take its one walk); a batch whose kv_lens ends before every block its map keeps
    gives 0 for that batch."""
    NEEDS[path]()
    b, h, n, d = 2, 2, 1100, 128
    q, k, v, kv_lens = cuda_qkv(b, h, n, n, d, torch.bfloat16, "BHND", seed=41, kv_lens=[1100, 100])
    kq = preprocess_int8fp8_cuda(q, k, v, kv_lens=kv_lens, smooth_v=True)
    assert kq.v_mean.abs().sum() > 0
    empty = torch.zeros(b, h, blocks(n), blocks(n), dtype=torch.bool)
    past = empty.clone()
    past[1, :, :, 1:] = True  # batch 1 keeps only blocks past its 100 keys
    past[0] = True
    for split_tail in (True, False):
        out = run_int8fp8(kq, n_q=n, n_kv=n, d=d, kv_lens=kv_lens, dtype=torch.bfloat16, layout="BHND", b=b, h=h,
                          block_map=make_map(empty, n, n), split_tail=split_tail, path=path)
        assert torch.equal(out, torch.zeros_like(out))
        out = run_int8fp8(kq, n_q=n, n_kv=n, d=d, kv_lens=kv_lens, dtype=torch.bfloat16, layout="BHND", b=b, h=h,
                          block_map=make_map(past, n, n), split_tail=split_tail, path=path)
        assert torch.equal(out[1], torch.zeros_like(out[1])) and (out[0] != 0).any()


@pytest.mark.parametrize("density", [0.2, 0.6])
@pytest.mark.parametrize("case", SPARSE_CASES, ids=case_id)
def test_int8fp8_mma_sparse_kernel_matches_twin(case, density):
    """The int8-fp8 mma.sync kernel (path "mma"; CTAs of 128 query rows at head_dim 128, of 64 at 64: two CTAs read
    each map row) under a map against the twin; density 1 (a full map, BlockMap.dense) gives its dense bits."""
    needs_e4m3_mma()
    b, h, n_q, n_kv, d, lens, dtype, layout, smooth_v, dims = case
    q, k, v, kv_lens = cuda_qkv(b, h, n_q, n_kv, d, dtype, layout, seed=n_q + n_kv + d + 1, kv_lens=lens)
    mask = edge_case_mask(*map_dims(dims, b, h), n_q, n_kv, density=density, seed=n_kv + int(100 * density) + 1,
                          kv_lens=kv_lens if dims == "bh" else None)
    bm = make_map(mask, n_q, n_kv)
    kq = preprocess_int8fp8_cuda(q, k, v, layout=layout, kv_lens=kv_lens, smooth_v=smooth_v)
    run = functools.partial(run_int8fp8, kq, n_q=n_q, n_kv=n_kv, d=d, kv_lens=kv_lens, dtype=dtype, layout=layout,
                            b=b, h=h, path="mma")
    got = to_bhnd(run(block_map=bm), layout).float()
    assert_close_per_head(int8fp8_twin(kq, n_q, n_kv, kv_lens, bm), got, dtype)
    check_empty_rows_zero(got, mask, kv_lens, n_q)
    dense = run()
    assert metrics.relative_l2(got, to_bhnd(dense, layout).float()) > 10 * REL_L2_MAX
    full = torch.ones(*map_dims(dims, b, h), blocks(n_q), blocks(n_kv), dtype=torch.bool)
    assert torch.equal(run(block_map=make_map(full, n_q, n_kv)), dense)
    assert torch.equal(run(block_map=BlockMap.dense(n_q, n_kv, device="cuda")), dense)


# ---- INT4 on the Hopper kernel (wgmma) and the mma.sync kernel (s8, s4) -------------------------------------------


def run_int4(kq, *, n_q, n_kv, d, block_n, kv_lens, p_mode, dtype, layout, b, h, block_map=None, split_tail=True,
             path="wgmma"):
    shape = (b, n_q, h, d) if layout == "BNHD" else (b, h, n_q, d)
    out = poisoned(shape, dtype)
    attention_int4_quantized(kq, n_q=n_q, n_kv=n_kv, head_dim=d, block_n=block_n, kv_lens=kv_lens, p_mode=p_mode,
                             path=path, out_dtype=dtype, layout=layout, out=out, split_tail=split_tail,
                             block_map=block_map)
    assert_written(out)
    return out


@pytest.mark.parametrize("split_tail", [True, False], ids=["split", "whole"])
@pytest.mark.parametrize("block_n", [64, 128])
@pytest.mark.parametrize("p_mode, smooth_q", [("range", True), ("sym", False)])
@pytest.mark.parametrize("case", SPARSE_CASES[:4], ids=case_id)
def test_int4_wgmma_sparse_kernel_matches_twin(case, p_mode, smooth_q, block_n, split_tail):
    """INT4 on the Hopper kernel under a map (block_n 64: each map block walked as two kernel blocks, kv_lens
    possibly ending in either half) against :func:`attention_from_quantized` under the same map, and density 1 =
    the dense bits."""
    needs_sm90()
    b, h, n_q, n_kv, d, lens, dtype, layout, smooth_v, dims = case
    q, k, v, kv_lens = cuda_qkv(b, h, n_q, n_kv, d, dtype, layout, seed=n_q + 5 * n_kv + block_n, kv_lens=lens)
    ref_q = preprocess_int4(q, k, v, layout=layout, kv_lens=kv_lens, block_n=block_n, smooth_v=smooth_v,
                            smooth_q=smooth_q)
    kq = pack_reference_quantized(ref_q, p_mode=p_mode, path="wgmma")
    mask = edge_case_mask(*map_dims(dims, b, h), n_q, n_kv, density=0.3, seed=n_q + block_n,
                          kv_lens=kv_lens if dims == "bh" else None)
    bm = make_map(mask, n_q, n_kv)
    run = functools.partial(run_int4, kq, n_q=n_q, n_kv=n_kv, d=d, block_n=block_n, kv_lens=kv_lens, p_mode=p_mode,
                            dtype=dtype, layout=layout, b=b, h=h, split_tail=split_tail)
    got = to_bhnd(run(block_map=bm), layout).float()
    ref = to_bhnd(attention_from_quantized(ref_q, p_mode=p_mode, out_dtype=torch.float32, layout=layout, block_map=bm),
                  layout)
    assert_close_per_head(ref, got, dtype)
    check_empty_rows_zero(got, mask, kv_lens, n_q)
    dense = run()
    assert torch.equal(run(block_map=BlockMap.dense(n_q, n_kv, device="cuda")), dense)


@pytest.mark.parametrize("block_n", [64, 128])
@pytest.mark.parametrize("p_mode, smooth_q", [("range", True), ("sym", False)])
@pytest.mark.parametrize("case", SPARSE_CASES[:4], ids=case_id)
def test_int4_mma_sparse_kernel_matches_twin(case, p_mode, smooth_q, block_n):
    """INT4 on the mma.sync kernel under a map (CTAs of 64 query rows: two per map row; block_n 64: each map block
    walked as two kernel blocks) against :func:`attention_from_quantized` under the same map, and density 1 = the
    dense bits; the s4 path (emulated on Hopper: slow, so the smaller cases) gives the s8 path's bits."""
    b, h, n_q, n_kv, d, lens, dtype, layout, smooth_v, dims = case
    q, k, v, kv_lens = cuda_qkv(b, h, n_q, n_kv, d, dtype, layout, seed=n_q + 7 * n_kv + block_n, kv_lens=lens)
    ref_q = preprocess_int4(q, k, v, layout=layout, kv_lens=kv_lens, block_n=block_n, smooth_v=smooth_v,
                            smooth_q=smooth_q)
    mask = edge_case_mask(*map_dims(dims, b, h), n_q, n_kv, density=0.3, seed=n_q + block_n + 1,
                          kv_lens=kv_lens if dims == "bh" else None)
    bm = make_map(mask, n_q, n_kv)
    ref = to_bhnd(attention_from_quantized(ref_q, p_mode=p_mode, out_dtype=torch.float32, layout=layout, block_map=bm),
                  layout)
    paths = ("s8", "s4") if n_q <= 1025 else ("s8",)
    outs = {}
    for path in paths:
        kq = pack_reference_quantized(ref_q, p_mode=p_mode, path=path)
        run = functools.partial(run_int4, kq, n_q=n_q, n_kv=n_kv, d=d, block_n=block_n, kv_lens=kv_lens,
                                p_mode=p_mode, dtype=dtype, layout=layout, b=b, h=h, path=path)
        outs[path] = run(block_map=bm)
        got = to_bhnd(outs[path], layout).float()
        assert_close_per_head(ref, got, dtype)
        check_empty_rows_zero(got, mask, kv_lens, n_q)
        dense = run()
        assert metrics.relative_l2(got, to_bhnd(dense, layout).float()) > 10 * REL_L2_MAX
        assert torch.equal(run(block_map=BlockMap.dense(n_q, n_kv, device="cuda")), dense)
    if "s4" in outs:
        assert torch.equal(outs["s4"], outs["s8"])


@pytest.mark.parametrize("recipe_path", [("int8-fp8", "mma"), ("int4", "s8")], ids=lambda rp: f"{rp[0]}-{rp[1]}")
def test_mma_paths_take_a_map_through_the_custom_ops(recipe_path):
    """The public functions on the mma.sync paths (the custom ops, not the raw extension the tests above write
    through) run a map: the same bits as the quantized call into a poisoned output."""
    recipe, path = recipe_path
    n, d, layout = 1100, 64, "BNHD"
    q, k, v, kv_lens = cuda_qkv(2, 2, n, n, d, torch.bfloat16, layout, seed=17, kv_lens=[n, 650])
    mask = edge_case_mask(2, 2, n, n, density=0.4, seed=17, kv_lens=kv_lens)
    bm = make_map(mask, n, n)
    common = dict(n_q=n, n_kv=n, d=d, kv_lens=kv_lens, dtype=torch.bfloat16, layout=layout, b=2, h=2, block_map=bm)
    if recipe == "int8-fp8":
        needs_e4m3_mma()
        full = int8fp8_attention_cuda(q, k, v, layout=layout, kv_lens=kv_lens, path=path, block_map=bm)
        kq = preprocess_int8fp8_cuda(q, k, v, layout=layout, kv_lens=kv_lens)
        want = run_int8fp8(kq, path=path, **common)
    else:
        full = int4_attention_cuda(q, k, v, layout=layout, kv_lens=kv_lens, block_n=64, path=path, block_map=bm)
        kq = preprocess_int4_cuda(q, k, v, layout=layout, kv_lens=kv_lens, block_n=64, path=path)
        want = run_int4(kq, block_n=64, p_mode="range", path=path, **common)
    assert_written(full)
    assert torch.equal(full, want)
    check_empty_rows_zero(to_bhnd(full, layout).float(), mask, kv_lens, n)


# ---- through the pre-processing, the fused RoPE·R and the dispatcher ----------------------------------------------


def poison_allocator(mb=256):
    """Fill and free a large block, so that the next outputs' uninitialized memory (at::empty) reads NaN bytes."""
    t = torch.full((mb * 2**18,), float("nan"), device="cuda")
    del t


def rotated(x, table, layout):
    if layout == "BHND":
        return apply_generalized_rope(x, table)
    return apply_generalized_rope(x.transpose(1, 2), table).transpose(1, 2)


@pytest.mark.parametrize("layout", ["BHND", "BNHD"])
@pytest.mark.parametrize("d, dtype", [(128, torch.bfloat16), (64, torch.float16)], ids=str)
def test_fused_rope_and_kv_lens_with_a_map(layout, d, dtype):
    """RoPE·R inside the int8-fp8 pre-processing with a map: the attention of the rotated tensors under the same map,
    bit for bit, and the reference recipe under the map within fp32 rounding; kv_lens cuts a kept block."""
    needs_sm90()
    table, n = make_table(d, "half", (4, 15, 20), "cuda", seed=d)
    q, k, v, kv_lens = cuda_qkv(2, 3, n, n, d, dtype, layout, seed=d + 1, kv_lens=[n, 700])
    mask = edge_case_mask(2, 3, n, n, density=0.35, seed=d, kv_lens=kv_lens)
    bm = make_map(mask, n, n)
    opts = dict(recipe="int8-fp8", layout=layout, kv_lens=kv_lens, smooth_v=True, block_map=bm)
    poison_allocator()
    out = attention(q, k, v, backend="cuda", rope=table, **opts)
    assert_written(out)
    want = attention(rotated(q, table, layout), rotated(k, table, layout), v, backend="cuda", **opts)
    assert torch.equal(out, want)
    ref = attention_reference(rotated(q, table, layout).float(), rotated(k, table, layout).float(), v.float(),
                              block_n=128, smooth_k=True, **opts)
    assert metrics.cosine_similarity(to_bhnd(ref, layout).float(), to_bhnd(out, layout).float()) >= 0.9999
    check_empty_rows_zero(to_bhnd(out, layout).float(), mask, kv_lens, n)


@pytest.mark.parametrize("recipe", ["int8-fp8", "int4"])
def test_dispatcher_runs_maps_on_the_hopper_kernel_eager_and_compiled(recipe):
    """backend="auto" picks the CUDA kernel for a call with a map on sm90 (no fallback to the reference), equal to
    backend="cuda"; a map built from tensors inside a compiled graph runs fullgraph with the same bits."""
    needs_sm90()
    n = 1100
    q, k, v, _ = cuda_qkv(1, 2, n, n, 128, torch.bfloat16, "BNHD", seed=31)
    mask = edge_case_mask(1, 2, n, n, density=0.4, seed=7)
    bm = make_map(mask, n, n)
    chosen, reason = select_backend(q, k, v, backend="auto", recipe=recipe, layout="BNHD", kv_lens=None, block_map=bm)
    assert chosen.name == "cuda", reason
    poison_allocator()
    eager = attention(q, k, v, recipe=recipe, layout="BNHD", block_map=bm)
    assert_written(eager)
    assert torch.equal(eager, attention(q, k, v, recipe=recipe, layout="BNHD", backend="cuda", block_map=bm))
    ref = attention_reference(q.float(), k.float(), v.float(), recipe=recipe, layout="BNHD", block_n=128,
                              block_map=bm)
    assert metrics.cosine_similarity(ref.float(), eager.float()) >= 0.999

    def f(q, k, v, indices, counts):
        return attention(q, k, v, recipe=recipe, layout="BNHD", backend="auto",
                         block_map=BlockMap(indices, counts, n, n))

    explain = torch._dynamo.explain(f)(q, k, v, bm.indices, bm.counts)
    assert explain.graph_break_count == 0, explain.break_reasons
    assert torch.equal(torch.compile(f, fullgraph=True)(q, k, v, bm.indices, bm.counts), eager)


def test_map_errors_name_the_argument():
    needs_sm90()
    n = 300
    q, k, v, _ = cuda_qkv(1, 2, n, n, 128, torch.float16, "BHND", seed=2)
    bm = BlockMap.dense(n, n, device="cuda")
    kq8 = preprocess_int8fp8_cuda(q, k, v)
    with pytest.raises(ValueError, match="block_map: a map for 300 queries and 300 keys, the call has 300 queries and 299"):
        attention_int8fp8_quantized(kq8, n_q=n, n_kv=n - 1, head_dim=128, block_map=bm)
    with pytest.raises(ValueError, match="block_map: on cpu, expected the operands' device"):
        attention_int8fp8_quantized(kq8, n_q=n, n_kv=n, head_dim=128, block_map=BlockMap.dense(n, n))
    with pytest.raises(ValueError, match=r"block_map: batch and head dimensions \(1, 3\)"):
        int8fp8_attention_cuda(q, k, v, block_map=BlockMap.from_mask(torch.ones(1, 3, 3, 3, dtype=torch.bool,
                                                                                device="cuda"), n_q=n, n_kv=n))
    with pytest.raises(ValueError, match="block_map: expected a rotvid.kernels.sparsity.BlockMap or None"):
        int8fp8_attention_cuda(q, k, v, block_map=bm.indices)
    kq4 = preprocess_int4_cuda(q, k, v, block_n=64, path="s8")
    with pytest.raises(ValueError, match="block_map: a map for 300 queries and 300 keys, the call has 300 queries and 299"):
        attention_int4_quantized(kq4, n_q=n, n_kv=n - 1, head_dim=128, block_n=64, path="s8", block_map=bm)
