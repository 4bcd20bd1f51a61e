"""The online V/O Hadamard's CUDA pass: custom op ``rotvid::hadamard_rows`` (``csrc/common/hadamard_rows.cu``) with its
fake (shape-only) implementation, and the function on it.

:func:`vo_hadamard_cuda` is one side of :func:`rotvid.rope.hadamard.rotate_v_online` /
:func:`~rotvid.rope.hadamard.unrotate_o_online` with the block equal to the head_dim (64 or 128) on a fp16 / bf16 CUDA
tensor, in one read and one write of it, with the same bits as those PyTorch functions (the butterflies of
:func:`rotvid.rope.hadamard.fwht` in float32, an exact power of two, one rounding). Its user is the dispatcher
(:func:`rotvid.kernels.dispatch._vo_side`): both sides around a CUDA kernel that does not rotate V itself (the INT4
recipes) -- V before the call, the output O' after it (after a ring attention's merge as well: attention is linear in
V, so the merged O' is un-rotated once). The int8-fp8 call rotates V in its pre-processing and turns the output back
in its attention kernel's epilogue at head_dim 128; at 64 it calls this pass itself (``int8fp8_attention_unchecked``).
"""

from __future__ import annotations

import torch

from rotvid.kernels import cuda_build
from rotvid.kernels.cuda_layout import SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS
from rotvid.rope.hadamard import vo_hadamard_exponent

__all__ = ["vo_hadamard_cuda", "vo_hadamard_cuda_unsupported"]


@torch.library.custom_op("rotvid::hadamard_rows", mutates_args=())
def _hadamard_rows_op(x: torch.Tensor, exponent: int) -> torch.Tensor:
    if x.data_ptr() % 16:  # (rows off 16-byte boundaries: an aligned copy of the same strides)
        x = x.clone()
    return cuda_build.load_extension(x.device).hadamard_rows(x, exponent)


@_hadamard_rows_op.register_fake
def _(x, exponent):
    return torch.empty_like(x)  # (x's strides, as the extension's empty_like)


def _rows_back_to_back(x: torch.Tensor) -> bool:
    """x's rows of D values lie back to back in memory: contiguous, or a BHND view of BNHD memory (the attention
    output the runtime gets). Shapes and strides only (a constant of a compiled graph)."""
    return x.is_contiguous() or (x.dim() == 4 and x.transpose(1, 2).is_contiguous())


def vo_hadamard_cuda_unsupported(x: torch.Tensor, block: int) -> str:
    """Why :func:`vo_hadamard_cuda` cannot take ``x`` with this block ("" when it can): a CUDA fp16 / bf16 tensor whose
    last dim (64 or 128) is the block. Shapes, dtypes and devices only (a constant of a compiled graph)."""
    if not x.is_cuda or x.dtype not in SUPPORTED_DTYPES or x.dim() < 1:
        return f"x: expected a CUDA float16 / bfloat16 tensor, got {x.dtype} {tuple(x.shape)} on {x.device}"
    d = x.shape[-1]
    if d not in SUPPORTED_HEAD_DIMS:
        return f"x: head_dim {d} (the CUDA pass takes {SUPPORTED_HEAD_DIMS})"
    if block != d:
        return (f"block {block}: the CUDA pass transforms whole rows (block = head_dim {d}); smaller blocks run in "
                "PyTorch")
    return ""


def vo_hadamard_cuda(x: torch.Tensor, block: int, *, side: str) -> torch.Tensor:
    """One side of the online V/O Hadamard on the GPU: ``rotate_v_online(x, block)`` (``side="v"``) or
    ``unrotate_o_online(x, block)`` (``side="o"``), bit for bit, in one pass.

    Args:
        x: CUDA fp16 / bf16 [..., D], D 64 or 128; any strides with a unit stride on D (a tensor whose rows do not
            lie back to back, or are off 16-byte boundaries, is copied first).
        block: the Hadamard block, equal to D here (:func:`vo_hadamard_cuda_unsupported`).
        side: ``"v"`` (the power of two 2^-ceil(k/2), block = 2^k) or ``"o"`` (2^-floor(k/2)).

    Returns:
        A new tensor of x's shape and dtype, with x's strides (a BHND view of BNHD memory stays one).
    """
    reason = vo_hadamard_cuda_unsupported(x, block)
    if reason:
        raise ValueError(reason)
    exponent = vo_hadamard_exponent(block, side)
    if not _rows_back_to_back(x):
        x = x.contiguous()
    return _hadamard_rows_op(x, exponent)
