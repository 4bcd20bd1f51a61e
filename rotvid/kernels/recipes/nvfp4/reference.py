"""The ``nvfp4`` recipe's reference (emulation): e2m1 values with 16-element e4m3 block scales and one fp32 tensor
scale (SageAttention3 / Attn-QAT) for Q and K along the head dim, V along the keys and P along the keys of a row.
"""

from __future__ import annotations

import torch

from rotvid.kernels.quantize import FP8_E4M3_MAX, pad_to_blocks, round_to_fp8_e4m3

E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
NVFP4_BLOCK = 16


def round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest FP4 e2m1 value {0, ±0.5, ±1, ±1.5, ±2, ±3, ±4, ±6}, ties to even mantissa."""
    a = x.abs().clamp(max=6.0)
    # Below 2 the grid step is 0.5, in [2, 4) it is 1, above it is 2; rint on the scaled value
    # gives ties-to-even on the mantissa bit in each binade.
    r = torch.where(a < 2.0, torch.round(a * 2) / 2, torch.where(a < 4.0, torch.round(a), torch.round(a / 2) * 2))
    return torch.copysign(r, x)


def quantize_nvfp4(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """NVFP4 emulation: blocks of 16 along ``dim``, e4m3 block scales, one fp32 tensor scale.

    Returns the dequantized tensor (same shape and float dtype as ``x``, padding removed).
    The tensor scale maps the largest block scale to the top of e4m3; block scale = amax/6
    rounded to e4m3; values rounded to e2m1 (ties to even).
    """
    x = x.float() if x.dtype != torch.float64 else x
    xt = x.movedim(dim, -1)
    n = xt.shape[-1]
    xt = pad_to_blocks(xt, NVFP4_BLOCK, dim=-1)
    blocks = xt.unflatten(-1, (-1, NVFP4_BLOCK))
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    tensor_amax = amax.amax()
    tensor_scale = tensor_amax / (6.0 * FP8_E4M3_MAX) if tensor_amax > 0 else torch.ones_like(tensor_amax)
    block_scale = round_to_fp8_e4m3(amax / 6.0 / tensor_scale) * tensor_scale
    safe = torch.where(block_scale == 0, torch.ones_like(block_scale), block_scale)
    q = round_to_e2m1(blocks / safe) * block_scale
    return q.flatten(-2)[..., :n].movedim(-1, dim)


def nvfp4_operands(q_s, k_s, v_s, valid, kv_lens):
    """Q, K per 16 channels, V per 16 keys (masked keys zeroed first), all dequantized."""
    return quantize_nvfp4(q_s, dim=-1), quantize_nvfp4(k_s, dim=-1), quantize_nvfp4(v_s * valid.to(v_s.dtype), dim=-2), None


def block_pv(p: torch.Tensor, vb: torch.Tensor, v_div) -> torch.Tensor:
    return torch.matmul(quantize_nvfp4(p, dim=-1), vb)
