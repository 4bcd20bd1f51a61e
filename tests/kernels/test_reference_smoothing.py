"""The reference's Q / K / V smoothing against float64 computations written out here by hand.

* fp16 recipe (no quantization): smoothing Q by block means with the ΔS correction, K by its
  mean and V by its mean (added back to O) must give the unsmoothed attention to fp64 rounding.
* int4 / int8-fp8: the scores the reference feeds the softmax (observed at
  ``_OnlineSoftmax.block_probs``) must equal ``q̂k̂ᵀ · scales + ΔS`` computed here from q and k;
  and V smoothing must equal running the recipe on ``v - mean(v)`` and adding the mean back.

Inputs carry a large token-shared bias (the structure smoothing is for), awkward lengths (query
blocks and key blocks that do not divide N) and a key-padding ``kv_lens``.
"""

import math

import pytest
import torch

from rotvid.kernels import reference
from rotvid.kernels.recipes import attention_reference
from rotvid.kernels.reference import LOG2E

B, H, NQ, NKV, D = 2, 2, 97, 75, 64
BLOCK_M, BLOCK_N = 32, 32
KV_LENS = torch.tensor([75, 41])


def biased_qkv(seed: int = 0):
    """float64 q, k, v with per-channel biases shared by every token (plus noise)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=g, dtype=torch.float64) for n in (NQ, NKV, NKV))
    q = q + 3.0 * torch.randn(1, H, 1, D, generator=g, dtype=torch.float64)
    k = k + 4.0 * torch.randn(1, H, 1, D, generator=g, dtype=torch.float64)
    v = v + 2.0 * torch.randn(1, H, 1, D, generator=g, dtype=torch.float64)
    return q, k, v


def valid_keys(kv_lens):
    return torch.arange(NKV)[None, :] < kv_lens[:, None]  # [B, N_kv]


def exact_attention(q, k, v, kv_lens):
    """softmax(q kᵀ / sqrt(D)) v in float64, masked keys excluded."""
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    s = s.masked_fill(~valid_keys(kv_lens)[:, None, None, :], -math.inf)
    return torch.softmax(s, dim=-1) @ v


def hand_key_mean(x, kv_lens):
    """Mean over the valid keys of each batch row, [B, H, 1, D]."""
    out = torch.empty(B, H, 1, D, dtype=torch.float64)
    for b in range(B):
        n = int(kv_lens[b])
        out[b] = x[b, :, :n].sum(dim=1, keepdim=True) / n
    return out


def hand_query_block_means(q, q_block=BLOCK_M):
    """Each query row's block mean (blocks of ``q_block`` rows, the last one short; None: one block of all rows,
    the per-head mean the CUDA kernels use)."""
    out = torch.empty_like(q)
    step = NQ if q_block is None else q_block
    for start in range(0, NQ, step):
        rows = slice(start, min(start + step, NQ))
        out[:, :, rows] = q[:, :, rows].sum(dim=2, keepdim=True) / (rows.stop - rows.start)
    return out


def hand_per_token(x, qmax):
    """Symmetric per-token quantization: x̂ = rint(x · qmax / amax), scale = amax / qmax; an all-zero
    row (the one-row last query block after Q smoothing) gives x̂ = 0, scale = 0."""
    amax = x.abs().amax(dim=-1, keepdim=True)
    safe = torch.where(amax == 0, torch.ones_like(amax), amax)
    return torch.round(x * (qmax / safe)).clamp(-qmax, qmax), amax / qmax


def hand_k_groups(k, qmax, kv_lens):
    """int8-fp8's K: one scale per group of keys {j : j // 128 = c, (j mod 8) // 2 = t} (the keys one kernel
    thread holds), amax over the group's valid keys; masked keys take their group's scale (clamped)."""
    n = k.shape[2]
    key_amax = k.abs().amax(dim=-1) * valid_keys(kv_lens)[:, None, :]  # [B, H, N]
    group = (torch.arange(n) // 128) * 4 + (torch.arange(n) % 8) // 2
    amax = torch.zeros_like(key_amax)
    for gid in group.unique():
        sel = group == gid
        amax[..., sel] = key_amax[..., sel].amax(dim=-1, keepdim=True)
    amax = amax.unsqueeze(-1)
    safe = torch.where(amax == 0, torch.ones_like(amax), amax)
    return torch.round(k * (qmax / safe)).clamp(-qmax, qmax), amax / qmax


# ---- fp16: smoothing is exact ------------------------------------------------------------------


@pytest.mark.parametrize(
    "smoothing",
    [dict(smooth_q=True, smooth_k=False, smooth_v=False), dict(smooth_q=False, smooth_k=True, smooth_v=False),
     dict(smooth_q=False, smooth_k=False, smooth_v=True), dict(smooth_q=True, smooth_k=True, smooth_v=True)],
    ids=["q", "k", "v", "qkv"],
)
@pytest.mark.parametrize("q_block", [BLOCK_M, None], ids=["q-block", "q-head"])
def test_fp16_recipe_smoothing_gives_the_unsmoothed_attention(smoothing, q_block):
    q, k, v = biased_qkv()
    want = exact_attention(q, k, v, KV_LENS)
    got = attention_reference(q, k, v, recipe="fp16", kv_lens=KV_LENS, block_m=BLOCK_M, block_n=BLOCK_N,
                              q_block=q_block, **smoothing)
    assert got.dtype == torch.float64
    err = (got - want).abs().max().item()
    assert err < 1e-12 * want.abs().max().item(), err


def test_fp16_recipe_q_smoothing_without_the_correction_is_not_the_attention():
    """The ΔS correction is what makes Q smoothing exact: dropping it changes the output."""
    q, k, v = biased_qkv()
    q_s = q - hand_query_block_means(q)
    without = exact_attention(q_s, k, v, KV_LENS)
    with_ds = attention_reference(q, k, v, recipe="fp16", kv_lens=KV_LENS, block_m=BLOCK_M, block_n=BLOCK_N,
                                  smooth_q=True, smooth_k=False, q_block=BLOCK_M)
    assert (without - with_ds).abs().max().item() > 1e-2


# ---- quantized recipes: scores and V ----------------------------------------------------------


def observed_scores(monkeypatch, q, k, v, **opts):
    """The scores the reference hands to the block softmax, concatenated over key blocks."""
    seen = []
    real = reference._OnlineSoftmax.block_probs

    def spy(s):
        seen.append(s.clone())
        return real(s)

    monkeypatch.setattr(reference._OnlineSoftmax, "block_probs", staticmethod(spy))
    attention_reference(q, k, v, kv_lens=KV_LENS, block_m=BLOCK_M, block_n=BLOCK_N, **opts)
    monkeypatch.undo()
    assert len(seen) == math.ceil(NKV / BLOCK_N)
    return torch.cat(seen, dim=-1)


def hand_scores(q, k, *, qmax, smooth_q, k_groups=False, q_block=BLOCK_M):
    """q̂k̂ᵀ · s_q · s_k · (sm_scale · log2 e) + ΔS · (sm_scale · log2 e), K smoothed, masked -inf."""
    qk_scale = D**-0.5 * LOG2E
    k_s = k - hand_key_mean(k, KV_LENS)
    q_mean = hand_query_block_means(q, q_block) if smooth_q else torch.zeros_like(q)
    q_hat, s_q = hand_per_token(q - q_mean, qmax)
    k_hat, s_k = hand_k_groups(k_s, qmax, KV_LENS) if k_groups else hand_per_token(k_s, qmax)
    s = (q_hat @ k_hat.transpose(-1, -2)) * s_q * s_k.transpose(-1, -2) * qk_scale
    delta_s = (q_mean @ k_s.transpose(-1, -2)) * qk_scale
    s = s + delta_s
    return s.masked_fill(~valid_keys(KV_LENS)[:, None, None, :], -math.inf), delta_s


@pytest.mark.parametrize("recipe,qmax", [("int4", 7), ("int4-sym-p", 7), ("int8-fp8", 127), ("int4-fp8", 7)])
@pytest.mark.parametrize("smooth_q,q_block", [(True, BLOCK_M), (True, None), (False, None)],
                         ids=["q-block", "q-head", "no-q"])
def test_quantized_scores_equal_hand_computation(monkeypatch, recipe, qmax, smooth_q, q_block):
    q, k, v = biased_qkv(1)
    got = observed_scores(monkeypatch, q, k, v, recipe=recipe, smooth_k=True, smooth_q=smooth_q, smooth_v=True,
                          q_block=q_block)
    want, delta_s = hand_scores(q, k, qmax=qmax, smooth_q=smooth_q, k_groups=recipe == "int8-fp8", q_block=q_block)
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got))  # the same keys masked
    scale = want[finite].abs().max().item()
    err = (got[finite] - want[finite]).abs().max().item()
    assert err < 1e-12 * scale, err
    if smooth_q:  # the correction is large on biased inputs: a reference without it would fail above
        assert delta_s.abs().max().item() > 0.1 * scale


@pytest.mark.parametrize("recipe", ["int4", "int4-sym-p", "int8-fp8", "int4-fp8"])
def test_quantized_v_smoothing_is_the_recipe_on_centred_v_plus_the_mean(recipe):
    q, k, v = biased_qkv(2)
    v_mean = hand_key_mean(v, KV_LENS)
    opts = dict(recipe=recipe, kv_lens=KV_LENS, block_m=BLOCK_M, block_n=BLOCK_N, smooth_k=True, smooth_q=True)
    got = attention_reference(q, k, v, smooth_v=True, **opts)
    want = attention_reference(q, k, v - v_mean, smooth_v=False, **opts) + v_mean
    assert (got - want).abs().max().item() < 1e-12 * want.abs().max().item()
    # and smoothing V is not a no-op for the quantized recipes: V's bias costs accuracy without it
    exact = exact_attention(q, k, v, KV_LENS)
    plain = attention_reference(q, k, v, smooth_v=False, **opts)
    assert (got - exact).norm() < (plain - exact).norm()
