"""``fp16``: no quantization — the exactness check of every fusion.

In a pipeline every self-attention runs the model's own attention function (diffusers' dispatcher / SDPA) on the
rotated tensors (``quantized=False``: no rotvid kernel is called, the schedule is not consulted). Through
:func:`rotvid.kernels.attention` it is the reference's block-wise online softmax in float32 (float64 for float64
inputs).
"""

from __future__ import annotations

from functools import partial

import torch

from rotvid.kernels.recipes.base import Recipe, RecipeLabels
from rotvid.kernels.reference import DEFAULT_BLOCK_N, attention_blockwise


def unquantized_operands(q_s, k_s, v_s, valid, kv_lens):
    """Q, K, V as they are (after smoothing)."""
    return q_s, k_s, v_s, None


def block_pv(p: torch.Tensor, vb: torch.Tensor, v_div) -> torch.Tensor:
    return torch.matmul(p, vb)


RECIPE = Recipe(
    name="fp16",
    summary="no quantization: the model's own attention in a pipeline (the fusions alone)",
    labels=RecipeLabels(datatype="FP16"),
    quantized=False,
    smooth_q=False,
    smooth_v=False,
    reference=partial(attention_blockwise, operands=unquantized_operands, block_pv=block_pv),
    reference_block_n=DEFAULT_BLOCK_N,
)
