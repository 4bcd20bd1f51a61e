"""The reference's log-sum-exp (``return_lse=True``): the convention ring attention merges by.

* fp16 recipe in float64: ``lse`` equals ``logsumexp(sm_scale · q kᵀ)`` over the valid keys to fp64 rounding, with
  every smoothing switch -- K smoothing shifts every score of a row by ``-sm_scale · q·mean(k)``; the LSE must add
  it back (inputs carry a large K bias, so forgetting it is off by units, not ulps);
* the output is the same bits with and without the LSE, for every recipe; layouts: ``[B, H, N]`` / ``[B, N, H]``;
* merging two key chunks by their LSE is the single call: to fp64 rounding for fp16 with smoothing, and to float
  rounding for the recipes whose numerics are chunk-local when K is not smoothed (int4, int4-sym-p: ``l`` counts
  ``P̂`` in units of 1/15 or 1/7) -- the unit of ``l`` is part of the convention (nvfp4 is not chunk-local: one
  tensor scale per operand);
* a row that keeps no key block has ``lse = -inf`` (and output 0);
* a backend or recipe that cannot return it refuses the call, naming ``return_lse``.
"""

import math
from dataclasses import replace

import pytest
import torch

from rotvid.kernels import attention
from rotvid.kernels.dispatch import refusing_check
from rotvid.kernels.recipes import get_recipe, recipe_names, register_recipe, unregister_recipe
from rotvid.kernels.sparsity import BlockMap

B, H, D = 2, 2, 64
NQ, NKV = 97, 256  # two key chunks of 128 (a multiple of every recipe's key block)
KV_LENS = torch.tensor([256, 150])


def biased(seed=0, dtype=torch.float64, nq=NQ, nkv=NKV):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, nq, D, generator=g, dtype=torch.float64) + 2.0 * torch.randn(1, H, 1, D, generator=g,
                                                                                         dtype=torch.float64)
    k = torch.randn(B, H, nkv, D, generator=g, dtype=torch.float64)
    k = k + 4.0 * torch.randn(1, H, 1, D, generator=g, dtype=torch.float64)
    k[:, :, nkv // 2:] += 3.0 * torch.randn(1, H, 1, D, generator=g, dtype=torch.float64)  # a second chunk's own bias
    v = torch.randn(B, H, nkv, D, generator=g, dtype=torch.float64) + torch.randn(1, H, 1, D, generator=g,
                                                                                  dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def exact_lse(q, k, kv_lens, sm_scale=None):
    sm_scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    s = (q.double() @ k.double().transpose(-1, -2)) * sm_scale
    if kv_lens is not None:
        valid = torch.arange(k.shape[2])[None, :] < kv_lens[:, None]
        s = s.masked_fill(~valid.view(B, 1, 1, -1), -math.inf)
    return torch.logsumexp(s, dim=-1)


@pytest.mark.parametrize("smooth", [(False, False, False), (True, False, False), (True, True, True)],
                         ids=["none", "k", "qkv"])
@pytest.mark.parametrize("kv_lens", [None, KV_LENS], ids=["all", "padded"])
def test_fp16_lse_is_logsumexp_of_the_unsmoothed_scores(smooth, kv_lens):
    q, k, v = biased()
    sk, sq, sv = smooth
    _, lse = attention(q, k, v, recipe="fp16", backend="reference", kv_lens=kv_lens, smooth_k=sk, smooth_q=sq,
                       smooth_v=sv, block_n=48, sm_scale=0.11, return_lse=True)
    assert lse.shape == (B, H, NQ) and lse.dtype == torch.float64
    torch.testing.assert_close(lse, exact_lse(q, k, kv_lens, 0.11), rtol=0, atol=1e-11)


@pytest.mark.parametrize("recipe", recipe_names())
@pytest.mark.parametrize("layout", ["BHND", "BNHD"])
def test_output_is_unchanged_and_lse_follows_the_layout(recipe, layout):
    q, k, v = biased(1, torch.float32)
    if layout == "BNHD":
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    smooth_q, smooth_v = get_recipe(recipe).smoothing(None, None)
    opts = dict(recipe=recipe, backend="reference", layout=layout, kv_lens=KV_LENS, smooth_q=smooth_q,
                smooth_v=smooth_v)
    plain = attention(q, k, v, **opts)
    out, lse = attention(q, k, v, return_lse=True, **opts)
    assert torch.equal(out, plain)
    assert lse.dtype == torch.float32 and lse.is_contiguous()
    assert lse.shape == ((B, H, NQ) if layout == "BHND" else (B, NQ, H))
    assert torch.isfinite(lse).all()
    if layout == "BNHD":  # the same numbers as the BHND call, transposed
        _, lse_bhnd = attention(*(t.transpose(1, 2).contiguous() for t in (q, k, v)), return_lse=True,
                                **{**opts, "layout": "BHND"})
        assert torch.equal(lse, lse_bhnd.transpose(1, 2))


def _merged(recipe, q, k, v, kv_lens, **opts):
    """Two calls, on keys [0, 128) and [128, 256), merged by their LSE (written out: weights exp(lse_c - lse))."""
    outs, lses = [], []
    for c in range(2):
        lens = (kv_lens - 128 * c).clamp(0, 128) if kv_lens is not None else None
        o, lse = attention(q, k[:, :, 128 * c:128 * (c + 1)], v[:, :, 128 * c:128 * (c + 1)], recipe=recipe,
                           backend="reference", kv_lens=lens, return_lse=True, **opts)
        outs.append(o.double())
        lses.append(lse.double())
    lse = torch.logsumexp(torch.stack(lses), dim=0)
    return sum(torch.exp(lc - lse).unsqueeze(-1) * o for o, lc in zip(outs, lses)), lse


def test_fp16_chunks_merge_to_the_single_call_with_smoothing():
    """Each chunk smooths K by its own mean (the chunks' biases differ by 3 per channel): exact only because the LSE
    adds each chunk's shift back."""
    q, k, v = biased(2)
    opts = dict(smooth_k=True, smooth_q=True, smooth_v=True)
    merged, lse = _merged("fp16", q, k, v, None, **opts)
    single, single_lse = attention(q, k, v, recipe="fp16", backend="reference", return_lse=True, **opts)
    torch.testing.assert_close(merged, single, rtol=0, atol=1e-11)
    torch.testing.assert_close(lse, single_lse, rtol=0, atol=1e-11)


@pytest.mark.parametrize("recipe", ["int4", "int4-sym-p"])
def test_chunk_local_recipes_merge_to_the_single_call(recipe):
    """Without K smoothing these recipes' numerics are chunk-local (per-token Q/K, per-block V and P), so the merge
    must be the single call to float rounding: it checks the unit of ``l`` in the LSE (1/15, 1/7)."""
    q, k, v = biased(3, torch.float32)
    kv_lens = torch.tensor([256, 200])  # (the second chunk has valid keys in both rows)
    opts = dict(smooth_k=False, smooth_q=True, smooth_v=False)
    merged, lse = _merged(recipe, q, k, v, kv_lens, **opts)
    single, single_lse = attention(q, k, v, recipe=recipe, backend="reference", kv_lens=kv_lens, return_lse=True,
                                   **opts)
    torch.testing.assert_close(merged.float(), single, rtol=0, atol=2e-5)
    torch.testing.assert_close(lse.float(), single_lse, rtol=0, atol=2e-5)


@pytest.mark.parametrize("recipe", ["int4", "int4-sym-p", "int8-fp8", "int4-fp8", "nvfp4"])
def test_quantized_lse_is_near_the_exact_one(recipe):
    """Quantization moves a quantized recipe's LSE by its own error (int8-fp8, whose ``l`` sums ``448 p`` of the
    unquantized p: the scores' INT8 Q/K error only, here up to ~0.09 with Q biased by 2 per channel and not smoothed;
    the 4-bit ones by their P rounding as well); a missing K-smoothing shift moves it by ~``sm_scale · q·mean(k)``,
    several units on these inputs."""
    q, k, v = biased(4, torch.float32)
    smooth_q, smooth_v = get_recipe(recipe).smoothing(None, None)
    _, lse = attention(q, k, v, recipe=recipe, backend="reference", kv_lens=KV_LENS, smooth_q=smooth_q,
                       smooth_v=smooth_v, return_lse=True)
    bound = 0.15 if recipe == "int8-fp8" else 1.0
    assert (lse.double() - exact_lse(q, k, KV_LENS)).abs().max() < bound


def test_a_row_that_keeps_no_block_has_lse_minus_inf():
    q, k, v = biased(5, torch.float32, nq=256)
    mask = torch.ones(1, 1, 2, 2, dtype=torch.bool)
    mask[..., 1, :] = False  # query tile 1 keeps nothing
    bm = BlockMap.from_mask(mask, n_q=256, n_kv=NKV)
    for recipe in ("fp16", "int4", "int8-fp8"):
        out, lse = attention(q, k, v, recipe=recipe, backend="reference", block_map=bm, return_lse=True)
        assert torch.isneginf(lse[:, :, 128:]).all() and torch.isfinite(lse[:, :, :128]).all(), recipe
        assert (out[:, :, 128:] == 0).all(), recipe


def test_backends_that_return_no_lse_refuse_the_call():
    q, k, v = biased(6, torch.float32)
    # the CUDA backend: this check comes before the device's (any machine answers it)
    name, why = refusing_check("cuda", q, k, v, recipe="int4", layout="BHND", return_lse=True)
    assert name == "return_lse" and "log-sum-exp" in why
    no_lse = replace(get_recipe("fp16"), name="fp16-no-lse", reference_lse=False)
    register_recipe(no_lse)
    try:
        with pytest.raises(ValueError, match=r"return_lse=True: recipe 'fp16-no-lse'"):
            attention(q, k, v, recipe="fp16-no-lse", backend="reference", return_lse=True)
        attention(q, k, v, recipe="fp16-no-lse", backend="reference")  # without the LSE it runs
    finally:
        unregister_recipe("fp16-no-lse")
    with pytest.raises(ValueError, match="return_lse: expected True or False"):
        attention(q, k, v, recipe="fp16", backend="reference", return_lse=1)


def test_the_cuda_paths_k_smoothing_shift_is_the_references():
    """int8fp8_attention_cuda adds K smoothing's shift in torch (fp32 sums, no float64 copy of k): the reference's to
    fp32 rounding, in either layout's views."""
    from rotvid.kernels.recipes.int8_fp8.ops import k_smoothing_shift
    from rotvid.kernels.reference import k_smoothing_lse_shift

    q, k, _ = biased(7, torch.float32)
    for kv_lens in (None, KV_LENS):
        want = k_smoothing_lse_shift(q, k, kv_lens, 0.125).squeeze(-1)
        got = k_smoothing_shift(q, k, kv_lens, 0.125)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
        bnhd = k_smoothing_shift(q.transpose(1, 2).contiguous().transpose(1, 2),
                                 k.transpose(1, 2).contiguous().transpose(1, 2), kv_lens, 0.125)
        torch.testing.assert_close(bnhd, got, rtol=1e-6, atol=1e-5)
