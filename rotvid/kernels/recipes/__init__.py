"""The attention recipes rotvid runs, one folder each, and their registry.

=================  ==========================================================================  ==================
recipe             numerics                                                                    CUDA kernel
=================  ==========================================================================  ==================
``fp16``           none (in a pipeline: the model's own attention)                            —
``int4``           RotateAttention: INT4 Q/K/V, range-optimized INT4 P                         sm80–sm90
``int4-sym-p``     INT4 Q/K/V, symmetric INT4 P                                                sm80–sm90
``int8-fp8``       SageAttention2-8b: INT8 Q/K, FP8 P/V                                        sm89, sm90
``int4-fp8``       SageAttention2-4b: INT4 Q/K, FP8 P/V                                        —
``nvfp4``          e2m1 Q/K/P/V with e4m3 block scales (emulation)                             —
=================  ==========================================================================  ==================

A recipe is one folder, ``recipes/<name>/``: its ``__init__`` defines a frozen
:class:`~rotvid.kernels.recipes.base.Recipe`, beside it its reference twin (``reference.py``), and for a CUDA kernel
its custom ops (``ops.py``) and its sources (``csrc/``, found by the build: :mod:`rotvid.kernels.cuda_sources`); the
lines at the end of this file register them. Add a recipe: write its folder (name, labels, default smoothing,
reference function, optionally kernels per backend and ``auto`` rows) and register it — here for a built-in one, or
with :func:`register_recipe` from anywhere. Config validation, the CLI, ``rotvid eval --variants``, the reports, the
dispatcher and calibration all ask the registry.
"""

from __future__ import annotations

import torch

from rotvid.kernels.recipes import fp16, int4, int4_fp8, int8_fp8, nvfp4
from rotvid.kernels.recipes.base import KernelEntry, Recipe, RecipeLabels, first_refusal
from rotvid.kernels.recipes.registry import (
    AUTO,
    get_recipe,
    quantized_recipe_names,
    recipe_names,
    recipes,
    register_recipe,
    unregister_recipe,
)
from rotvid.kernels.reference import DEFAULT_BLOCK_M, DEFAULT_BLOCK_N, resolve_sm_scale
from rotvid.kernels.sparsity import BlockMap

__all__ = [
    "AUTO", "KernelEntry", "Recipe", "RecipeLabels", "attention_reference", "first_refusal", "get_recipe",
    "quantized_recipe_names", "recipe_names", "recipes", "register_recipe", "unregister_recipe",
]


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    recipe: str = int4.RECIPE.name,
    layout: str = "BHND",
    kv_lens: torch.Tensor | None = None,
    sm_scale: float | None = None,
    block_m: int = DEFAULT_BLOCK_M,
    block_n: int = DEFAULT_BLOCK_N,
    smooth_k: bool = True,
    smooth_q: bool = False,
    smooth_v: bool = False,
    q_block: int | None = None,
    block_map: BlockMap | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``q`` [B, H, Nq, D] (or BNHD) over ``k``, ``v`` [.., N_kv, ..] under ``recipe``, on the PyTorch
    reference (:attr:`Recipe.reference`).

    Inputs are assumed validated (use :func:`rotvid.kernels.attention` for checked entry).
    Output has q's shape, layout and dtype. Computation is float32 (float64 for float64 inputs).
    ``block_m`` is the kernels' query tile (no effect on these numerics); ``q_block``: query rows per Q
    smoothing mean (None: one per head, as the CUDA kernels). ``block_map``: the key blocks each query tile visits
    (:class:`rotvid.kernels.sparsity.BlockMap`; skipped blocks are blocks of ``-inf`` scores, see
    :mod:`rotvid.kernels.reference`); None: all of them. ``return_lse``: ``(out, lse)`` with each row's log-sum-exp
    (:mod:`rotvid.kernels.reference`; a recipe whose reference takes no ``return_lse`` raises ValueError).
    """
    sparse = {} if block_map is None else {"block_map": block_map}
    if return_lse:
        if not get_recipe(recipe).reference_lse:
            raise ValueError(f"return_lse: recipe {recipe!r}'s reference returns no log-sum-exp")
        sparse["return_lse"] = True
    return get_recipe(recipe).reference(
        q, k, v, layout=layout, kv_lens=kv_lens, sm_scale=resolve_sm_scale(sm_scale, q.shape[-1]), block_m=block_m,
        block_n=block_n, smooth_k=smooth_k, smooth_q=smooth_q, smooth_v=smooth_v, q_block=q_block, **sparse,
    )


# The built-in recipes (one line each; the order is the order of every listing).
register_recipe(fp16.RECIPE)
register_recipe(int4.RECIPE)
register_recipe(int4.SYM_P_RECIPE)
register_recipe(int8_fp8.RECIPE)
register_recipe(int4_fp8.RECIPE)
register_recipe(nvfp4.RECIPE)
