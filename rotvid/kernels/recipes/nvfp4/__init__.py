"""``nvfp4`` (emulation): Q, K, P and V in e2m1 with 16-element e4m3 block scales (SageAttention3 / Attn-QAT).

Reference only (no rotvid CUDA kernel): Q and K in blocks of 16 along the head dim, V along the keys, P along
the keys of a row.
"""

from __future__ import annotations

from functools import partial

from rotvid.kernels.recipes.base import Recipe, RecipeLabels
from rotvid.kernels.recipes.nvfp4.reference import block_pv, nvfp4_operands
from rotvid.kernels.reference import DEFAULT_BLOCK_N, attention_blockwise

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
