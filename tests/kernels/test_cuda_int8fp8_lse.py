"""The int8-fp8 Hopper (wgmma) kernel's log-sum-exp (``return_lse=True``) against its reference twin (sm90).

The kernel writes ``ln 2 · (m + log2(l) - log2 448)`` per row from its online softmax (``l`` sums ``448 p`` of the
unquantized p, as the twin's), in the whole tile's epilogue or in the tail split's combine. On the SAME quantized
inputs it differs from :func:`rotvid.kernels.recipes.int8_fp8.reference.attention_int8fp8_from_quantized`'s LSE by
fp32 summation order, ``ex2.approx`` and, at head_dim 64 (MAGIC scores), one rounding of the exponent's constant per row and block
(~1e-5 in log2 units): ``|Δ lse| <= 2e-4 + 1e-5 |lse|``. The output is the same bits with and without the LSE.
End to end (``int8fp8_attention_cuda``: pre-processing, kernel, K smoothing's shift added in torch) the LSE is the
reference recipe's on the same inputs (the pre-processing is bit-equal to the reference quantizers; the shift's
mean is an fp32 sum there, float64 in the reference): ``|Δ lse| <= 5e-4 + 1e-5 |lse|``. Rows that attend no key
(a block map that keeps no block of their tile) are ``-inf``. Key chunks merged by it (ring attention) are within
the recipe's noise of one call.
"""

import pytest
import torch

from rotvid.kernels import attention, metrics
from rotvid.kernels.recipes import attention_reference
from rotvid.kernels.recipes.int8_fp8.ops import (
    attention_int8fp8_quantized, int8fp8_attention_cuda, preprocess_int8fp8_cuda,
)
from rotvid.kernels.sparsity import BlockMap
from tests.kernels.helpers import attention_fp64
from tests.kernels.test_cuda_int8fp8 import CASES, key_scales, make_inputs, needs_sm90, to_bhnd, unpermute_v8

pytestmark = pytest.mark.gpu


def twin_lse(kq, n_q, n_kv, kv_lens, block_map=None):
    from rotvid.kernels.recipes.int8_fp8.reference import attention_int8fp8_from_quantized

    return attention_int8fp8_from_quantized(
        kq.q_hat[:, :, :n_q], kq.q_scale[:, :, :n_q, None], kq.k_hat[:, :, :n_kv], key_scales(kq.k_scale, n_kv),
        unpermute_v8(kq.vt, n_kv), kq.vparams[:, :, None, :],
        v_mean=kq.v_mean[:, :, None, :] if kq.v_mean.numel() else None, kv_lens=kv_lens, block_map=block_map,
        return_lse=True,
    )[1]


def assert_lse_close(got, want, atol, rtol=1e-5):
    assert got.shape == want.shape and got.dtype == torch.float32
    assert torch.equal(torch.isneginf(got), torch.isneginf(want)), "-inf rows differ"
    finite = torch.isfinite(want)
    assert torch.isfinite(got[finite]).all()
    err = (got[finite] - want[finite]).abs()
    assert (err <= atol + rtol * want[finite].abs()).all(), f"max |Δ lse| {err.max().item():.3g}"


@pytest.mark.parametrize("split_tail", [True, False], ids=["split", "whole"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"b{c[0]}h{c[1]}q{c[2]}k{c[3]}d{c[4]}{c[7]}")
def test_kernel_lse_matches_twin_and_leaves_the_output_alone(case, split_tail):
    needs_sm90()
    b, h, n_q, n_kv, d, lens, dtype, layout, smooth_k, smooth_v = case
    q, k, v, kv_lens = make_inputs(b, h, n_q, n_kv, d, dtype, layout, seed=7 + n_kv, kv_lens=lens)
    kq = preprocess_int8fp8_cuda(q, k, v, layout=layout, kv_lens=kv_lens, smooth_k=smooth_k, smooth_v=smooth_v)
    opts = dict(n_q=n_q, n_kv=n_kv, head_dim=d, kv_lens=kv_lens, out_dtype=dtype, layout=layout, split_tail=split_tail)
    plain = attention_int8fp8_quantized(kq, **opts)
    out, lse = attention_int8fp8_quantized(kq, return_lse=True, **opts)
    # and into a preallocated output (the extension's out= path), poisoned first
    poisoned = torch.full_like(plain, float("nan"))
    out2, lse2 = attention_int8fp8_quantized(kq, return_lse=True, out=poisoned, **opts)
    torch.cuda.synchronize()
    assert torch.equal(out, plain) and torch.equal(out2, plain)
    assert torch.equal(lse, lse2)
    assert lse.shape == (b, h, n_q)
    assert_lse_close(lse, twin_lse(kq, n_q, n_kv, kv_lens), atol=2e-4)


@pytest.mark.parametrize("layout", ["BHND", "BNHD"])
@pytest.mark.parametrize("d", [64, 128])
def test_end_to_end_lse_is_the_reference_recipes(layout, d):
    """``int8fp8_attention_cuda(return_lse=True)`` and the dispatcher: the kernel's LSE plus K smoothing's shift, in
    the layout's order, as the reference recipe's (K carries a channel bias: the shift is several units)."""
    needs_sm90()
    q, k, v, kv_lens = make_inputs(2, 3, 1025, 700, d, torch.bfloat16, layout, seed=d, bias=3.0, kv_lens=[700, 257])
    out, lse = int8fp8_attention_cuda(q, k, v, layout=layout, kv_lens=kv_lens, return_lse=True)
    assert torch.equal(out, int8fp8_attention_cuda(q, k, v, layout=layout, kv_lens=kv_lens))
    _, want = attention_reference(q.float(), k.float(), v.float(), recipe="int8-fp8", layout=layout, kv_lens=kv_lens,
                                  block_n=128, return_lse=True)
    assert lse.shape == ((2, 3, 1025) if layout == "BHND" else (2, 1025, 3))
    assert_lse_close(lse, want, atol=5e-4)
    d_out, d_lse = attention(q, k, v, recipe="int8-fp8", backend="cuda", layout=layout, kv_lens=kv_lens,
                             return_lse=True)
    assert torch.equal(d_out, out) and torch.equal(d_lse, lse)


@pytest.mark.parametrize("split_tail", [True, False], ids=["split", "whole"])
def test_a_tile_that_keeps_no_block_has_lse_minus_inf(split_tail):
    needs_sm90()
    q, k, v, _ = make_inputs(1, 2, 512, 1024, 128, torch.bfloat16, "BHND", seed=4)
    mask = torch.ones(1, 2, 4, 8, dtype=torch.bool, device="cuda")
    mask[:, 1, 2] = False  # head 1, query tile 2 keeps nothing
    mask[:, 0, 1, ::2] = False
    bm = BlockMap.from_mask(mask, n_q=512, n_kv=1024)
    kq = preprocess_int8fp8_cuda(q, k, v)
    out, lse = attention_int8fp8_quantized(kq, n_q=512, n_kv=1024, head_dim=128, out_dtype=torch.bfloat16,
                                                split_tail=split_tail, block_map=bm, return_lse=True)
    torch.cuda.synchronize()
    assert torch.isneginf(lse[0, 1, 256:384]).all() and (out[0, 1, 256:384] == 0).all()
    assert_lse_close(lse, twin_lse(kq, 512, 1024, None, block_map=bm), atol=2e-4)


def test_key_chunks_merged_by_the_kernels_lse_are_one_call():
    """Ring attention's merge (rotvid.pipelines.ring) with the CUDA kernel on 2 key chunks, each smoothed by its own
    K mean: as close to float64 attention as one call over all keys (RMS within 1.25x; a wrong LSE -- the shift
    missing, a wrong 448 -- moves the output by its scale)."""
    from rotvid.pipelines.ring import attend_key_chunks

    needs_sm90()
    q, k, v, kv_lens = make_inputs(1, 4, 1024, 2048, 128, torch.bfloat16, "BHND", seed=12, bias=3.0,
                                   kv_lens=[1700])
    k[:, :, 1024:] += 2.0  # the second chunk's own bias

    def run_chunk(k_c, v_c, lens):
        return attention(q, k_c, v_c, recipe="int8-fp8", backend="cuda", kv_lens=lens, return_lse=True)

    merged = attend_key_chunks(run_chunk, k, v, kv_lens, 2)
    single = attention(q, k, v, recipe="int8-fp8", backend="cuda", kv_lens=kv_lens).float()
    valid = (torch.arange(2048, device="cuda") < 1700)
    truth = attention_fp64(q, k[:, :, valid], v[:, :, valid]).float()
    rms = lambda x: x.pow(2).mean().sqrt().item()  # noqa: E731
    assert rms(merged - truth) <= 1.25 * rms(single - truth)
    assert metrics.cosine_similarity(truth, merged) >= 0.999


def test_the_mma_kernel_refuses_the_lse():
    needs_sm90()
    q, k, v, _ = make_inputs(1, 2, 300, 300, 128, torch.bfloat16, "BHND", seed=2)
    kq = preprocess_int8fp8_cuda(q, k, v)
    with pytest.raises(ValueError, match="return_lse: the int8-fp8 'mma' kernel returns no log-sum-exp"):
        attention_int8fp8_quantized(kq, n_q=300, n_kv=300, head_dim=128, path="mma", return_lse=True)
    got = to_bhnd(attention_int8fp8_quantized(kq, n_q=300, n_kv=300, head_dim=128), "BHND")
    assert got.shape == (1, 2, 300, 128)
