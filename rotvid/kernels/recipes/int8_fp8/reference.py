"""The int8-fp8 recipe's reference twin (SageAttention2-8b): INT8 Q per token and K per group of 32 keys per
128-key block (the keys one kernel thread holds), P and V in FP8 e4m3 with V per channel and P scaled by 448, one FP32
buffer per key block -- the recipe's operands (:func:`int8fp8_operands`, :func:`fp8_block_pv` for
:func:`rotvid.kernels.reference.attention_blockwise`) and the attention on quantized operands
(:func:`attention_int8fp8_from_quantized`), the CUDA kernels' twin (:mod:`rotvid.kernels.recipes.int8_fp8.ops`).
"""

from __future__ import annotations

import torch

from rotvid.kernels.quantize import (
    FP8_E4M3_MAX,
    INT8_QMAX,
    key_valid_mask,
    quant_p_fp8,
    quantize_per_channel_fp8,
    quantize_per_token_int8,
    symmetric_quantize,
)
from rotvid.kernels.reference import attend_key_blocks, int_scores, log2_qk_scale, lse_in_layout, resolve_sm_scale
from rotvid.kernels.sparsity.block_map import BlockMap

INT8FP8_BLOCK_N = 128  # the int8-fp8 kernels' key block (part of the numerics): the reference's default for it
K_GROUP_BLOCK = 128  # keys per block of the int8-fp8 kernel
K_GROUPS = 4  # key groups per block: the keys one thread of the kernel's score fragment holds


def k_group_of_key(j: torch.Tensor) -> torch.Tensor:
    """The group (0-3) of key ``j`` inside its block of 128: ``(j mod 8) // 2``, the accumulator columns
    8i + 2t, 8i + 2t + 1 (i = 0..15) that thread ``t`` of a quad holds in the kernel's score fragment."""
    return (j % 8) // 2


def quantize_k_groups_int8(
    k: torch.Tensor, kv_lens: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """INT8 of ``k`` [B, H, N, D] with one scale per group of 32 keys (:func:`k_group_of_key`) per block of
    128 keys (SageAttention2's per-thread granularity): the scale folds into one multiplier per thread and row.

    amax over the group's valid keys (``j < kv_lens[b]``) and channels; masked keys are quantized with their
    group's scale and clamped. Returns ``(k_hat int8 [B, H, N, D], scale per key [B, H, N, 1], group_scale
    [B, H, ceil(N / 128), 4])``.
    """
    x = k.float() if k.dtype != torch.float64 else k
    b, h, n, d = x.shape
    nb = -(-n // K_GROUP_BLOCK)
    valid = key_valid_mask(n, kv_lens, b, x.device).to(x.dtype)  # [B, 1, N, 1]
    a = (x.abs() * valid).amax(dim=-1)  # [B, H, N]
    a = torch.nn.functional.pad(a, (0, nb * K_GROUP_BLOCK - n))
    g_amax = a.view(b, h, nb, K_GROUP_BLOCK // 8, K_GROUPS, 2).amax(dim=(3, 5))  # [B, H, nb, 4]
    j = torch.arange(n, device=x.device)
    per_key = g_amax[:, :, j // K_GROUP_BLOCK, k_group_of_key(j)].unsqueeze(-1)  # [B, H, N, 1]
    k_hat, scale = symmetric_quantize(x, per_key, INT8_QMAX)
    q = torch.full_like(g_amax, INT8_QMAX)
    g_scale = torch.where(g_amax == 0, torch.zeros_like(g_amax), g_amax / q)
    return k_hat, scale, g_scale


def fp8_v_operand(v_s, valid):
    """V in FP8 e4m3 per channel over the valid keys: ``(values, scale)``."""
    return quantize_per_channel_fp8(v_s, valid)


def fp8_block_pv(p: torch.Tensor, vb: torch.Tensor, v_scale) -> torch.Tensor:
    """FP8 P (scaled by 448) times FP8 V, an FP32 buffer for this block."""
    return torch.matmul(quant_p_fp8(p), vb) * (v_scale / FP8_E4M3_MAX)


def int8fp8_operands(q_s, k_s, v_s, valid, kv_lens):
    """INT8 Q per token, K per group of 32 keys per 128-key block (dequantized), FP8 V per channel."""
    dt = q_s.dtype
    q_hat, q_sc = quantize_per_token_int8(q_s)
    k_hat, k_sc, _ = quantize_k_groups_int8(k_s, kv_lens)
    vd, v_sc = fp8_v_operand(v_s, valid)
    return q_hat.to(dt) * q_sc, k_hat.to(dt) * k_sc, vd, v_sc


def attention_int8fp8_from_quantized(
    q_hat: torch.Tensor,
    q_scale: torch.Tensor,
    k_hat: torch.Tensor,
    k_scale: torch.Tensor,
    v8: torch.Tensor,
    v_scale: torch.Tensor,
    *,
    v_mean: torch.Tensor | None = None,
    kv_lens: torch.Tensor | None = None,
    block_n: int = 128,
    sm_scale: float | None = None,
    block_map: BlockMap | None = None,
    return_lse: bool = False,
    lse_shift: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The int8-fp8 recipe from its quantized operands (the CUDA kernel's twin), all (B, H, N, D) order.

    ``q_hat``/``k_hat`` int8 with per-token scales [B, H, N, 1]; ``v8`` the e4m3 values of V̂ (any float dtype)
    [B, H, N_kv, D] with ``v_scale`` [B, H, 1, D]; ``v_mean`` [B, H, 1, D] or None. Per key block: exact integer
    q̂·k̂, ``s = float(q̂·k̂) * (s_q * qk_scale) * s_k``, ``p = exp2(s - m_blk)``, ``pv = e4m3(448 p) · V̂``
    (fresh FP32 sum per block), ``l_blk = rowsum(448 p)``, online combine; ``out = O / l * v_scale (+ v_mean)``;
    ``block_map``: the key blocks each query tile visits (module docstring; None: all).
    Equal to the ``int8-fp8`` branch of :func:`attention_reference` up to fp32 rounding (there Q̂/K̂ are
    dequantized before the product and V's scale is applied per block). The kernel differs from this twin by fp32
    rounding only: the order of its products, ``ex2.approx``, and at head_dim 64 one rounding per row and block
    of the exponent's constant (``MAGIC`` in ``csrc/hopper_int8fp8_numerics.cuh``). Returns float32 (B, H, Nq, D);
    with ``return_lse``, ``(out, lse)``: ``lse`` float32 [B, H, Nq], ``ln 2 · (m + log2(l / 448))`` of the scores
    computed here (the operands' smoothed keys), plus ``lse_shift`` [B, H, Nq, 1] when given
    (:func:`k_smoothing_lse_shift`; module docstring).
    """
    dt = torch.float32
    b, h, nq, d = q_hat.shape
    qk_scale = log2_qk_scale(resolve_sm_scale(sm_scale, d), dt).to(q_hat.device)
    sq = q_scale.to(dt) * qk_scale
    k_scale = k_scale.to(dt)

    def block_scores(start, stop):
        return int_scores(q_hat, sq, k_hat[:, :, start:stop], k_scale[:, :, start:stop], dt)

    def block_pv_sum(t, start, stop, p, _):
        pv = torch.matmul(quant_p_fp8(p).double(), v8[:, :, start:stop].double()).to(dt)
        return pv, (p * FP8_E4M3_MAX).sum(dim=-1, keepdim=True)

    state = attend_key_blocks(block_scores, block_pv_sum, shape_o=(b, h, nq, d), dtype=dt, device=q_hat.device,
                               n_kv=k_hat.shape[2], block_n=block_n, kv_lens=kv_lens, block_map=block_map)
    out = state.result(v_scale.to(dt), None if v_mean is None else v_mean.to(dt))
    if not return_lse:
        return out
    lse = state.lse(FP8_E4M3_MAX)  # l sums 448 p
    return out, lse_in_layout(lse if lse_shift is None else lse + lse_shift.to(dt), "BHND")
