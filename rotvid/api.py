"""``rotvid.attention``: quantized attention with this device's recipe, as the pipelines run it."""

from __future__ import annotations

import torch

from rotvid.kernels.dispatch import prepare_attention, run_attention
from rotvid.kernels.recipes import get_recipe
from rotvid.kernels.recipes.auto import AUTO, resolve_recipe

__all__ = ["attention"]


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    recipe: str = AUTO,
    layout: str = "BHND",
    backend: str = "auto",
    kv_lens: torch.Tensor | None = None,
    sm_scale: float | None = None,
    smooth_k: bool = True,
    smooth_q: bool | None = None,
    smooth_v: bool | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    rope=None,
    block_map=None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``softmax(q kᵀ · sm_scale) v`` in low precision, with the recipe and smoothing a pipeline would run here.

    ``recipe="auto"`` (the default) is the recipe of q's device, from the table of
    :mod:`rotvid.kernels.recipes.auto` (``rotvid backends`` prints it): ``int8-fp8`` on Hopper (sm90: no INT4 tensor
    cores, so the 8-bit recipe is both faster and more accurate there), ``int4`` on Ampere and Ada (sm80/86/87/89:
    native INT4 tensor cores), and ``int4`` on the CPU and on GPUs without a rotvid kernel, where the PyTorch
    reference runs. Any registered recipe may be named instead (:mod:`rotvid.kernels.recipes`).
    ``smooth_q`` / ``smooth_v`` None take the recipe's defaults (on for the INT4 recipes; off for ``int8-fp8``), as
    ``RotvidConfig`` does; ``smooth_k`` is on by default.

    Other arguments, shapes and dtypes as :func:`rotvid.kernels.attention` (the kernel-level call, whose recipe
    defaults to ``int4`` and whose smoothing switches are taken as given): ``q`` [B, H, N_q, D] (``"BHND"``) or
    [B, N_q, H, D] (``"BNHD"``), k and v likewise with N_kv keys, fp16 / bf16 / fp32 / fp64 on one device;
    ``backend`` ``auto`` (the CUDA kernel where it runs the call, else the reference), ``reference`` or ``cuda``;
    ``kv_lens`` int [B] masks keys ``j >= kv_lens[b]``; ``rope`` a RoPE·R table applied to q and k first;
    ``block_map`` a :class:`rotvid.kernels.sparsity.BlockMap` (the key blocks each query tile visits) or None;
    ``return_lse`` also returns each row's log-sum-exp (natural log, of the unsmoothed scores; [B, H, N_q] or
    [B, N_q, H] by layout). Returns the output in q's shape, layout and dtype (with ``return_lse``: ``(out, lse)``).
    """
    if recipe == AUTO:
        recipe, _ = resolve_recipe(AUTO, q.device if isinstance(q, torch.Tensor) else None)
    smooth_q, smooth_v = get_recipe(recipe).smoothing(smooth_q, smooth_v)
    call = prepare_attention(q, k, v, recipe=recipe, layout=layout, backend=backend, kv_lens=kv_lens,
                             sm_scale=sm_scale, smooth_k=smooth_k, smooth_q=smooth_q, smooth_v=smooth_v,
                             block_m=block_m, block_n=block_n, block_map=block_map, return_lse=return_lse)
    return run_attention(call, q, k, v, rope=rope)
