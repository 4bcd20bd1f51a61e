"""The support checks rotvid's CUDA kernels share, one small named function each.

A recipe's CUDA :class:`~rotvid.kernels.recipes.base.KernelEntry` lists the ones its kernel needs, in order, with its
own; the first that returns a reason refuses the call (:func:`~rotvid.kernels.recipes.base.first_refusal`).
Each takes ``(q, k, v, **opts)`` — the call's options: recipe, layout, kv_lens, smooth_q, q_block, block_m,
block_n, block_map (when the call has one) — and reads shapes, strides, dtypes and host facts only (a constant of a compiled graph).
"""

from __future__ import annotations

import torch

from rotvid.kernels import cuda_build
from rotvid.kernels.cuda_layout import BLOCK_M, SUPPORTED_BLOCK_N, SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS

__all__ = [
    "FIRST_CHECKS", "LAST_CHECKS", "alignment", "block_m", "block_n", "cuda_gpu", "device_index",
    "dtype", "gpu", "head_dim", "inputs_on_cuda", "q_block", "strides",
]


def device_index(q) -> int:
    """The CUDA device index of ``q`` (the current device when it has none)."""
    return q.device.index if q.device.index is not None else torch.cuda.current_device()


def cuda_gpu(q, k, v, **opts) -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    return None


def inputs_on_cuda(q, k, v, **opts) -> str | None:
    if not q.is_cuda:
        return f"inputs are on {q.device}, not a CUDA device"
    return None


def gpu(q, k, v, **opts) -> str | None:
    """The GPU is in the arch table and nvcc is found (:func:`rotvid.kernels.cuda_build.device_problem`)."""
    return cuda_build.device_problem(device_index(q)) or None


def dtype(q, k, v, **opts) -> str | None:
    if q.dtype not in SUPPORTED_DTYPES:
        return f"dtype {q.dtype} (the kernel takes float16 or bfloat16)"
    return None


def head_dim(q, k, v, **opts) -> str | None:
    d = q.shape[-1]
    if d not in SUPPORTED_HEAD_DIMS:
        return f"head_dim {d} (the kernel takes {SUPPORTED_HEAD_DIMS})"
    return None


def q_block(q, k, v, **opts) -> str | None:
    if opts.get("smooth_q") and opts.get("q_block") is not None:
        return f"q_block={opts['q_block']} (the kernels smooth Q with one mean per head: q_block=None)"
    return None


def block_m(q, k, v, **opts) -> str | None:
    bm = opts.get("block_m")
    if bm is not None and bm != BLOCK_M:
        return f"block_m={bm} (the kernel uses {BLOCK_M})"
    return None


def block_n(q, k, v, **opts) -> str | None:
    bn = opts.get("block_n")
    if bn is not None and bn not in SUPPORTED_BLOCK_N:
        return f"block_n={bn} (the kernel takes {SUPPORTED_BLOCK_N})"
    return None


def strides(q, k, v, **opts) -> str | None:
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        return "a non-contiguous head_dim (stride(-1) != 1)"
    if any(st % 8 for t in (q, k, v) for st in t.stride()[:3]):
        return "strides that are not multiples of 8 elements (rows not 16-byte aligned)"
    return None


def alignment(q, k, v, **opts) -> str | None:
    # (no data pointers while tracing; the extension checks the alignment again)
    if not torch.compiler.is_compiling() and any(t.data_ptr() % 16 for t in (q, k, v)):
        return "a data pointer that is not 16-byte aligned"
    return None


# Every CUDA kernel starts with these (a GPU, the inputs on it, ...) and ends with those (tiles, memory layout);
# a recipe puts its own checks between them.
FIRST_CHECKS = (cuda_gpu, inputs_on_cuda, gpu)
LAST_CHECKS = (dtype, head_dim, q_block, block_m, block_n, strides, alignment)
