"""The reference twin under a block map: density 1 is the dense call bit for bit, skipped blocks are -inf scores
(exact in float64), empty rows give 0, kv_lens inside kept blocks; the dispatcher's map argument and the CUDA
backend's map check (the Hopper kernels take maps: tests/kernels/test_cuda_sparse.py)."""

import pytest
import torch

from rotvid.kernels import attention, cuda_checks, dispatch, metrics, prepare_attention, run_attention
from rotvid.kernels.quantize import quantize_per_channel_fp8, quantize_per_token_int8
from rotvid.kernels.recipes import get_recipe, recipe_names
from rotvid.kernels.recipes.int8_fp8.reference import attention_int8fp8_from_quantized, quantize_k_groups_int8
from rotvid.kernels.reference import to_bhnd
from rotvid.kernels.sparsity import BlockMap
from tests.kernels.helpers import attention_fp64, random_qkv
from tests.kernels.test_reference import FLOORS_DB

KV_LENS = torch.tensor([300, 171])  # batch 1: the keys end inside block 1


def random_map(b, h, tq, tk, density, seed, *, diagonal=True):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, h, tq, tk, generator=gen) < density
    if diagonal:
        mask |= torch.eye(tq, tk, dtype=torch.bool)
    return mask


@pytest.mark.parametrize("recipe", recipe_names())
@pytest.mark.parametrize("layout, d", [("BHND", 64), ("BNHD", 128)])
def test_density_one_map_gives_the_dense_bits(recipe, layout, d):
    q, k, v = random_qkv(2, 2, 200, d, n_kv=300, layout=layout, seed=7, bias=1.0)
    opts = dict(recipe=recipe, layout=layout, backend="reference", kv_lens=KV_LENS, smooth_v=True)
    dense = attention(q, k, v, **opts)
    full = BlockMap.dense(200, 300)
    assert torch.equal(attention(q, k, v, block_map=full, **opts), dense)
    per_head = BlockMap.from_mask(torch.ones(2, 2, 2, 3, dtype=torch.bool), n_q=200, n_kv=300)
    assert torch.equal(attention(q, k, v, block_map=per_head, **opts), dense)


def test_int8fp8_twin_density_one_gives_the_dense_bits():
    q, k, v = random_qkv(1, 2, 260, 64, seed=8)
    q_hat, q_sc = quantize_per_token_int8(q)
    k_hat, k_sc, _ = quantize_k_groups_int8(k - k.mean(2, keepdim=True), None)
    v8, v_sc = quantize_per_channel_fp8(v, torch.ones(1, 1, 260, 1, dtype=torch.bool))
    args = (q_hat, q_sc, k_hat, k_sc, v8, v_sc)
    dense = attention_int8fp8_from_quantized(*args)
    assert torch.equal(attention_int8fp8_from_quantized(*args, block_map=BlockMap.dense(260, 260)), dense)
    sparse = BlockMap.from_mask(torch.tensor([[True, False, False], [False, True, False], [True, False, True]]),
                                n_q=260, n_kv=260)
    out = attention_int8fp8_from_quantized(*args, block_map=sparse)
    assert not torch.equal(out, dense) and torch.isfinite(out).all()


@pytest.mark.parametrize("layout", ["BHND", "BNHD"])
def test_skipped_blocks_are_minus_inf_scores_exactly_in_float64(layout):
    q, k, v = random_qkv(2, 3, 300, 64, n_kv=400, dtype=torch.float64, layout=layout, seed=9, bias=1.0)
    mask = random_map(2, 3, 3, 4, 0.4, seed=10, diagonal=False)
    mask[0, 1, 2] = False  # an empty row
    mask[1, 0, 0] = torch.tensor([False, False, True, True])  # batch 1 keeps only blocks past kv_lens (171)
    bm = BlockMap.from_mask(mask, n_q=300, n_kv=400)
    kv_lens = torch.tensor([400, 171])
    out = attention(q, k, v, recipe="fp16", layout=layout, backend="reference", kv_lens=kv_lens, block_map=bm,
                    smooth_v=True)
    ref = attention_fp64(q, k, v, layout=layout, kv_lens=kv_lens, block_map=bm)
    assert metrics.max_abs_error(ref, out) < 1e-12
    bhnd = to_bhnd(out, layout)
    assert (bhnd[0, 1, 256:] == 0).all() and (bhnd[1, 0, :128] == 0).all()  # rows with no kept key: 0
    assert bhnd[0, 0].abs().sum() > 0


@pytest.mark.parametrize("recipe", [r for r in FLOORS_DB if r != "fp16"])
@pytest.mark.parametrize("d", [64, 128])
def test_random_maps_within_each_recipes_floor_of_masked_float64(recipe, d):
    q, k, v = random_qkv(2, 2, 512, d, n_kv=450, dtype=torch.float32, seed=11, bias=2.0)
    q = q * 2.0
    kv_lens = torch.tensor([450, 300])  # batch 1: keys end inside block 2
    mask = random_map(2, 2, 4, 4, 0.5, seed=12)
    mask[:, :, :, 2] = True  # the block that kv_lens cuts, kept everywhere
    mask[0, 0, 1] = False  # an empty row
    bm = BlockMap.from_mask(mask, n_q=512, n_kv=450)
    out = attention(q, k, v, recipe=recipe, backend="reference", kv_lens=kv_lens, block_map=bm)
    ref = attention_fp64(q, k, v, kv_lens=kv_lens, block_map=bm)
    assert (out[0, 0, 128:256] == 0).all()
    assert metrics.sqnr_db(ref, out) > FLOORS_DB[recipe]
    dense = attention_fp64(q, k, v, kv_lens=kv_lens)
    assert metrics.sqnr_db(dense, out) < metrics.sqnr_db(ref, out)  # the map changed what is computed


@pytest.mark.parametrize("recipe", recipe_names())
def test_empty_rows_are_zero_with_v_smoothing(recipe):
    q, k, v = random_qkv(1, 1, 256, 64, seed=13, bias=3.0)
    bm = BlockMap.from_mask(torch.tensor([[False, False], [True, True]]), n_q=256, n_kv=256)
    out = attention(q, k, v, recipe=recipe, backend="reference", block_map=bm, smooth_v=True)
    assert (out[0, 0, :128] == 0).all() and (out[0, 0, 128:] != 0).any()


def test_nan_still_propagates_under_a_map():
    q, k, v = random_qkv(1, 2, 256, 64, seed=14)
    q[0, 1, 5, 3] = float("nan")
    out = attention(q, k, v, recipe="int4", backend="reference", block_map=BlockMap.dense(256, 256))
    assert torch.isnan(out[0, 1, 5]).all() and torch.isfinite(out[0, 0]).all()


def test_dispatcher_checks_the_map_and_every_cuda_kernel_takes_it(monkeypatch):
    q, k, v = random_qkv(2, 2, 200, 64, n_kv=300, seed=15)
    bm = BlockMap.dense(200, 300)
    # every CUDA kernel (wgmma and mma.sync) takes a map: no check of a CUDA kernel entry answers a call with a map
    # otherwise than the same call without one (GPU 0 stands in for the inputs' device)
    monkeypatch.setattr(cuda_checks, "device_index", lambda q: 0)
    for recipe in ("int8-fp8", "int4", "int4-sym-p"):
        opts = dict(recipe=recipe, layout="BHND", kv_lens=None, smooth_q=False, block_m=None, block_n=None,
                    q_block=None)
        for check in get_recipe(recipe).kernel("cuda").checks:
            assert check(q, k, v, **opts, block_map=bm) == check(q, k, v, **opts), (recipe, check.__name__)
    monkeypatch.undo()
    chosen, reason = dispatch.select_backend(q, k, v, recipe="int4", layout="BHND", kv_lens=None, block_map=bm)
    assert chosen.name == "reference"  # (CPU tensors: the CUDA backend refuses them before the map)
    with pytest.raises(ValueError, match="block_map: a map for 200 queries and 300 keys, the call has 200 queries and 299"):
        attention(q, k[:, :, :299], v[:, :, :299], recipe="int4", block_map=bm)
    with pytest.raises(ValueError, match="block_map: expected a rotvid.kernels.sparsity.BlockMap or None, got Tensor"):
        attention(q, k, v, recipe="int4", block_map=bm.indices)


def test_a_map_given_at_run_time_replaces_the_prepared_one():
    q, k, v = random_qkv(1, 2, 256, 64, seed=16)
    call = prepare_attention(q, k, v, recipe="int8-fp8", backend="reference")
    bm = BlockMap.from_mask(torch.tensor([[True, False], [False, True]]), n_q=256, n_kv=256)
    assert torch.equal(run_attention(call, q, k, v, block_map=bm),
                       attention(q, k, v, recipe="int8-fp8", backend="reference", block_map=bm))
    assert torch.equal(run_attention(call, q, k, v), attention(q, k, v, recipe="int8-fp8", backend="reference"))
