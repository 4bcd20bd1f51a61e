"""``nvfp4`` (emulation): Q, K, P and V in e2m1 with 16-element e4m3 block scales (SageAttention3 / Attn-QAT).

Reference only (no rotvid CUDA kernel): Q and K in blocks of 16 along the head dim, V along the keys, P along
the keys of a row.
"""

from __future__ import annotations

from functools import partial

import torch

from rotvid.kernels.quantize import quantize_nvfp4
from rotvid.kernels.recipes.base import Recipe, RecipeLabels
from rotvid.kernels.reference import DEFAULT_BLOCK_N, attention_blockwise


def nvfp4_operands(q_s, k_s, v_s, valid, kv_lens):
    """Q, K per 16 channels, V per 16 keys (masked keys zeroed first), all dequantized."""
    return quantize_nvfp4(q_s, dim=-1), quantize_nvfp4(k_s, dim=-1), quantize_nvfp4(v_s * valid.to(v_s.dtype), dim=-2), None


def block_pv(p: torch.Tensor, vb: torch.Tensor, v_div) -> torch.Tensor:
    return torch.matmul(quantize_nvfp4(p, dim=-1), vb)


RECIPE = Recipe(
    name="nvfp4",
    summary="NVFP4 emulation: Q/K/P/V in e2m1 with 16-element e4m3 block scales (reference only)",
    labels=RecipeLabels(datatype="NVFP4"),
    quantized=True,
    smooth_q=False,
    smooth_v=False,
    reference=partial(attention_blockwise, operands=nvfp4_operands, block_pv=block_pv),
    reference_block_n=DEFAULT_BLOCK_N,
)
