"""RoPE·R applied by a generalized table on the fastest path there is: the one place that chooses.

:func:`apply_generalized_rope` is what every caller uses (the pipelines' Q/K rotation, the dispatcher, the runtime): on
CUDA (B, H, N, D) fp16 / bf16 inputs with one table for all heads and D 64 or 128 it runs rotvid's CUDA kernel
(custom op ``rotvid::generalized_rope``, :func:`generalized_rope_cuda`; eager and compiled alike); otherwise (or when
the CUDA extension does not load), on CUDA, the one-pass Triton kernel
(:func:`rotvid.kernels.rope_triton.apply_generalized_rope_triton`), except under ``torch.compile``, where the PyTorch
form is traced and the compiler fuses the gather, multiply and sum into one pass itself; elsewhere the PyTorch form
(:func:`rotvid.rope.fused_table.apply_generalized_rope`, the maths). The three give the same bits.
"""

from __future__ import annotations

import functools
import logging

import torch

from rotvid.kernels import cuda_build
from rotvid.kernels.cuda_layout import SUPPORTED_DTYPES
from rotvid.rope import fused_table
from rotvid.rope.fused_table import GeneralizedRopeTable
from rotvid.rope.hadamard import fwht

__all__ = ["ROPE_HEAD_DIMS", "apply_generalized_rope", "generalized_rope_cuda", "generalized_rope_unsupported"]

logger = logging.getLogger(__name__)

ROPE_HEAD_DIMS = (64, 128)


@torch.library.custom_op("rotvid::generalized_rope", mutates_args=())
def _generalized_rope_op(x: torch.Tensor, coef: torch.Tensor, index: torch.Tensor, hadamard: bool) -> torch.Tensor:
    return cuda_build.load_extension(x.device).generalized_rope(x, coef, index, None, hadamard)


@_generalized_rope_op.register_fake
def _(x, coef, index, hadamard):
    return x.new_empty(x.shape)


def generalized_rope_unsupported(x: torch.Tensor, coef: torch.Tensor) -> str:
    """Why :func:`generalized_rope_cuda` cannot take ``x`` with a table ``coef`` ("" when it can): a CUDA
    [B, H, N, D] fp16 / bf16 tensor, D 64 or 128, unit stride on D and rows on 16-byte boundaries, one table shared
    by the heads ([N, D, 4]), and a GPU the extension builds for. Shapes, strides and host facts only, so the answer
    is a constant of a compiled graph."""
    if not x.is_cuda or x.dim() != 4 or x.dtype not in SUPPORTED_DTYPES:
        return f"x: expected a CUDA [B, H, N, D] fp16 / bf16 tensor, got {x.dtype} {tuple(x.shape)} on {x.device}"
    if x.shape[-1] not in ROPE_HEAD_DIMS:
        return f"x: head_dim {x.shape[-1]} (the CUDA kernel takes {ROPE_HEAD_DIMS})"
    if coef.dim() != 3:
        return f"coef: a per-head table {tuple(coef.shape)} (the CUDA kernel takes one table [N, D, 4] for all heads)"
    if x.stride(-1) != 1 or any(s % 8 for s in x.stride()[:3]):
        return f"x: strides {tuple(x.stride())} do not keep rows on 16-byte boundaries"
    # (the storage offset is not a graph constant under torch.compile; there the C++ side checks the alignment)
    if not torch.compiler.is_compiling() and x.storage_offset() % 8:
        return f"x: storage offset {x.storage_offset()} does not keep rows on 16-byte boundaries"
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    return cuda_build.device_problem(index) or _extension_problem(index)


_EXTENSION_PROBLEMS: dict[int, str] = {}


@torch.compiler.assume_constant_result
def _extension_problem(device_index: int) -> str:
    """"" when the extension builds and loads for GPU ``device_index``, else why not (once per process and GPU;
    under torch.compile a constant of the graph). The RoPE·R callers fall back to the Triton kernel on a failure
    instead of failing a run that needs no quantized kernel."""
    if device_index not in _EXTENSION_PROBLEMS:
        try:
            cuda_build.load_extension(torch.device("cuda", device_index))
            _EXTENSION_PROBLEMS[device_index] = ""
        except Exception as err:  # noqa: BLE001 -- any build or load failure means: use the Triton kernel
            _EXTENSION_PROBLEMS[device_index] = f"the CUDA extension did not load: {err}"[:500]
            logger.warning("rotvid: RoPE·R falls back to the Triton kernel: %s", _EXTENSION_PROBLEMS[device_index])
    return _EXTENSION_PROBLEMS[device_index]


def generalized_rope_cuda(
    x: torch.Tensor, coef: torch.Tensor, index: torch.Tensor, *, hadamard: bool = False
) -> torch.Tensor:
    """``out[b, h, n, c] = sum_t coef[n, c, t] * x[b, h, n, index[c, t]]`` in one pass on the GPU (fp32 compute, the
    Triton kernel's and the compiled PyTorch form's arithmetic: the same bits). Returns a new contiguous tensor.
    ``hadamard``: then the normalized Walsh–Hadamard transform over D in registers (the ``full`` rotation; the bits
    of :func:`rotvid.rope.hadamard.fwht` on the table's output rounded to x's dtype).

    Args:
        x: CUDA fp16 / bf16 [B, H, N, D], D 64 or 128, unit stride on D, rows on 16-byte boundaries.
        coef: [N, D, 4] (float32 on x's device, else converted), one table for all heads.
        index: [D, 4] source channels with the table's structure ``(e, e + 1, p, p + 1)``.
    """
    reason = generalized_rope_unsupported(x, coef)
    if reason:
        raise ValueError(reason)
    n, d = x.shape[-2:]
    if tuple(coef.shape) != (n, d, 4):
        raise ValueError(f"coef: expected shape {(n, d, 4)}, got {tuple(coef.shape)}")
    if tuple(index.shape) != (d, 4):
        raise ValueError(f"index: expected shape {(d, 4)}, got {tuple(index.shape)}")
    coef = coef.to(device=x.device, dtype=torch.float32).contiguous()
    index = index.to(device=x.device, dtype=torch.int32).contiguous()
    return _generalized_rope_op(x, coef, index, bool(hadamard))


@functools.lru_cache(maxsize=1)
def _triton_available() -> bool:
    """Triton present (the one-pass CUDA kernel); without it CUDA tensors take the eager path (logged once)."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        logger.warning("triton is not installed: RoPE·R runs as eager PyTorch ops on CUDA (slower, same result)")
        return False
    return True


def apply_generalized_rope(x: torch.Tensor, table: GeneralizedRopeTable) -> torch.Tensor:
    """:func:`rotvid.rope.fused_table.apply_generalized_rope` (same arguments, same bits) on the fastest path there is.

    On CUDA (B, H, N, D) fp16 / bf16 inputs with one table for all heads and D 64 or 128: rotvid's CUDA kernel
    (:func:`generalized_rope_cuda`, a custom op, so eager and compiled alike; a ``hadamard`` table's transform in
    registers). Otherwise (or when the CUDA extension does not load), on CUDA, the one-pass Triton kernel
    :func:`rotvid.kernels.rope_triton.apply_generalized_rope_triton` (float32 compute), then the transform, except
    under ``torch.compile``, where the PyTorch form is traced (no availability probe in the graph) and the compiler
    fuses the gather, multiply and sum into one pass itself. Elsewhere the PyTorch form.
    """
    lead = fused_table.check_table_input(x, table)
    if x.is_cuda and not lead and not generalized_rope_unsupported(x, table.coef):
        return generalized_rope_cuda(x, table.coef, table.index, hadamard=table.hadamard)
    if (
        x.is_cuda
        and x.dim() == 4
        and x.dtype != torch.float64
        and len(lead) <= 1
        and not torch.compiler.is_compiling()
        and _triton_available()
    ):
        from rotvid.kernels.rope_triton import apply_generalized_rope_triton

        out = apply_generalized_rope_triton(x, table.coef, table.index)
        return fwht(out) if table.hadamard else out
    return fused_table.apply_generalized_rope(x, table)
