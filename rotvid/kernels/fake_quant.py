"""Differentiable fake-quantized INT4 attention, for calibration (not for inference).

The forward pass computes what the INT4 recipe computes (:mod:`rotvid.kernels.reference`),
with every quantizer replaced by its dequantized value ("fake quantization"); the backward pass
uses straight-through estimators for the quantizers of Q, K and V and follows Attn-QAT's two
rules (``papers/attn-qat.txt`` §2.3):

1. P is recomputed in the backward pass **in the same precision as the forward pass**: the
   gradient of V uses the quantized probabilities that produced the output.
2. The softmax-gradient term ``D_i = P_iᵀ dP_i = dO_iᵀ O'_i`` uses a **high-precision output**
   ``O' = P·V^F`` (full-precision P), computed alongside the low-precision output in the forward
   pass, because ``dO_iᵀ O_i`` with the quantized ``O`` no longer equals ``P_iᵀ dP_i``.

The score matrix is materialized (memory O(N_q·N_kv) per head): calibration runs on
token-subsampled tensors, a few thousand tokens at most.
"""

from __future__ import annotations

import torch

from rotvid.kernels.quantize import INT4_QMAX, pad_to_blocks
from rotvid.kernels.recipes.int4.reference import P_RANGE_SCALE, P_SYM_SCALE


def round_ste(x: torch.Tensor) -> torch.Tensor:
    """``round`` (half to even) in the forward pass, identity in the backward pass."""
    return x + (torch.round(x) - x).detach()


def round_clamp_ste(x: torch.Tensor, qmax: float) -> torch.Tensor:
    """``round(x).clamp(-qmax, qmax)`` in the forward pass, identity in the backward pass.

    The straight-through estimator is written out (detach form), so its gradient does not depend
    on ``clamp``'s gradient at the boundary: torch 2.13 passes the gradient of a value equal to
    ``±qmax`` and torch 2.15 zeroes it, which made every value that rounds to ±7 lose its
    gradient. Here the scale is ``amax / qmax``, so ``|x| <= qmax`` up to float rounding and the
    clamp only catches that rounding error: the gradient is 1 for every element.
    """
    return x + (torch.round(x).clamp(-qmax, qmax) - x).detach()


def fake_quant_per_token_int4(x: torch.Tensor) -> torch.Tensor:
    """Per-token symmetric INT4 of ``x`` [..., N, D], dequantized; STE through the rounding.

    The scale ``max|x| / 7`` stays differentiable (LSQ-style): the gradient sees the rounding
    residual through the scale, so training can shrink the outliers that set it.
    """
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax == 0, torch.ones_like(amax), amax / INT4_QMAX)
    return round_clamp_ste(x / scale, INT4_QMAX) * scale


def fake_quant_v_per_group_int4(v: torch.Tensor, block_n: int) -> torch.Tensor:
    """Per-group INT4 of ``v`` [..., N, D] (one scale per channel per block of keys), dequantized, STE."""
    n = v.shape[-2]
    vp = pad_to_blocks(v, block_n, dim=-2)
    vb = vp.unflatten(-2, (-1, block_n))
    amax = vb.abs().amax(dim=-2, keepdim=True)
    scale = torch.where(amax == 0, torch.ones_like(amax), amax / INT4_QMAX)
    out = round_clamp_ste(vb / scale, INT4_QMAX) * scale
    return out.flatten(-3, -2)[..., :n, :]


def _quantized_probs(s: torch.Tensor, block_n: int, p_mode: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-precision ``P = softmax(s)`` and the INT4 recipe's effective probabilities.

    Per key block: ``p_blk = exp(s - m_blk)`` is quantized (range: ``(rint(15 p) - 8 + 8) / 15``;
    sym: ``rint(7 p) / 7``) and weighted by ``exp(m_blk - m) / l`` with ``l`` the sum of the
    *quantized* probabilities (so each row sums to 1), exactly as the online softmax of the kernels
    combines blocks.
    """
    p_full = torch.softmax(s, dim=-1)
    if p_mode is None:
        return p_full, p_full
    n = s.shape[-1]
    sp = pad_to_blocks(s, block_n, dim=-1) if n % block_n else s
    if n % block_n:
        sp[..., n:] = float("-inf")
    sb = sp.unflatten(-1, (-1, block_n))
    m_blk = sb.amax(dim=-1, keepdim=True)
    p_blk = torch.exp(sb - m_blk)
    if p_mode == "range":
        q = torch.round(p_blk * P_RANGE_SCALE) / P_RANGE_SCALE  # (P~ + 8) / 15, P~ = rint(15 p) - 8
    elif p_mode == "sym":
        q = torch.round(p_blk * P_SYM_SCALE) / P_SYM_SCALE
    else:
        raise ValueError(f"p_mode: expected 'range', 'sym' or None, got {p_mode!r}")
    m = s.amax(dim=-1, keepdim=True)
    c = torch.exp(m_blk.squeeze(-1) - m)  # [..., Nq, n_blocks]
    l = (c * q.sum(dim=-1)).sum(dim=-1, keepdim=True)  # row sum of the quantized P
    p_q = (q * (c / l).unsqueeze(-1)).flatten(-2)[..., :n]
    return p_full, p_q


class _FakeQuantAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qf, kf, vf, sm_scale, block_n, p_mode):
        s = torch.matmul(qf, kf.transpose(-1, -2)) * sm_scale
        p_full, p_q = _quantized_probs(s, block_n, p_mode)
        out = torch.matmul(p_q, vf)
        out_hp = torch.matmul(p_full, vf)  # rule 2: high-precision O for the backward pass
        ctx.save_for_backward(qf, kf, vf, out_hp)
        ctx.sm_scale, ctx.block_n, ctx.p_mode = sm_scale, block_n, p_mode
        return out

    @staticmethod
    def backward(ctx, d_out):
        qf, kf, vf, out_hp = ctx.saved_tensors
        s = torch.matmul(qf, kf.transpose(-1, -2)) * ctx.sm_scale
        p_full, p_q = _quantized_probs(s, ctx.block_n, ctx.p_mode)  # rule 1: same P precision
        d_v = torch.matmul(p_q.transpose(-1, -2), d_out)
        d_p = torch.matmul(d_out, vf.transpose(-1, -2))
        delta = (d_out * out_hp).sum(dim=-1, keepdim=True)
        d_s = p_full * (d_p - delta) * ctx.sm_scale
        d_q = torch.matmul(d_s, kf)
        d_k = torch.matmul(d_s.transpose(-1, -2), qf)
        return d_q, d_k, d_v, None, None, None


def fake_quant_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    p_mode: str | None = "range",
    quantize_qkv: bool = True,
    smooth_k: bool = True,
    sm_scale: float | None = None,
    block_n: int = 64,
) -> torch.Tensor:
    """Fake-quantized INT4 attention of ``q`` [..., N_q, D] over ``k``, ``v`` [..., N_kv, D].

    ``p_mode`` ``"range"`` / ``"sym"`` quantizes P like the ``int4`` / ``int4-sym-p`` recipes;
    ``None`` and ``quantize_qkv=False`` bypass the quantizers (then this is exact attention
    with exact gradients). Gradients flow to q, k, v (STE through the roundings).
    """
    if smooth_k:
        k = k - k.mean(dim=-2, keepdim=True)
    sm_scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    if quantize_qkv:
        q, k, v = fake_quant_per_token_int4(q), fake_quant_per_token_int4(k), fake_quant_v_per_group_int4(v, block_n)
    return _FakeQuantAttention.apply(q, k, v, sm_scale, block_n, p_mode)
