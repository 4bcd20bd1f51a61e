"""``int4-fp8`` (SageAttention2-4b): INT4 Q and K per token, P and V in FP8 e4m3 as ``int8-fp8``.

Reference only (no rotvid CUDA kernel).
"""

from __future__ import annotations

from functools import partial

from rotvid.kernels.quantize import quantize_per_token_int4
from rotvid.kernels.recipes.base import Recipe, RecipeLabels
from rotvid.kernels.recipes.int4 import HOPPER_FOUR_BIT_NOTE
from rotvid.kernels.recipes.int8_fp8.reference import fp8_block_pv, fp8_v_operand
from rotvid.kernels.reference import DEFAULT_BLOCK_N, attention_blockwise


def int4fp8_operands(q_s, k_s, v_s, valid, kv_lens):
    """INT4 Q and K per token (dequantized), FP8 V per channel."""
    dt = q_s.dtype
    q_hat, q_sc = quantize_per_token_int4(q_s)
    k_hat, k_sc = quantize_per_token_int4(k_s)
    vd, v_sc = fp8_v_operand(v_s, valid)
    return q_hat.to(dt) * q_sc, k_hat.to(dt) * k_sc, vd, v_sc


RECIPE = Recipe(
    name="int4-fp8",
    summary="SageAttention2-4b: INT4 Q/K, FP8 P/V (reference only)",
    labels=RecipeLabels(datatype="INT4/FP8"),
    quantized=True,
    smooth_q=True,  # INT4 Q, as the int4 recipes
    smooth_v=False,  # FP8 V per channel, as int8-fp8
    reference=partial(attention_blockwise, operands=int4fp8_operands, block_pv=fp8_block_pv),
    reference_block_n=DEFAULT_BLOCK_N,
    requested_notes={(9, 0): HOPPER_FOUR_BIT_NOTE},
)
