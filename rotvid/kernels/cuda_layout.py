"""The operand layout the recipes' CUDA kernels share, the input checks they share, and the helpers that pack
reference operands into it.

Kernel layout (what a recipe's pre-processing returns as a :class:`KernelQKV` and its attention kernel takes), with
BH = batch·heads, ``Nq_pad`` = Nq rounded up to :data:`BLOCK_M` (128), ``Nkv_pad`` to the key block:

* ``q_hat`` int8 [B, H, Nq_pad, DB], ``k_hat`` int8 [B, H, Nkv_pad, DB] (DB = D, or D/2 for two values per byte);
  padded rows are zero. ``q_scale`` fp32 [B, H, Nq_pad] (zero on padded rows); ``k_scale`` the recipe's key scales.
* ``vt``: V̂ transposed (K-major for the tensor cores), [B, H, D, Nkv_pad] (or Nkv_pad/2 for nibbles), its key
  positions permuted inside chunks of 32 keys (64 for nibbles) so that the P fragment the QKᵀ accumulator produces
  feeds the P·V product without shuffles (:func:`vt_key_permutation`; ``vt_key_of_position`` in
  ``csrc/common/attention_params.cuh``).
* ``vparams``: V's scales (the recipe's); ``v_mean`` fp32 [B, H, D] when V is smoothed, else an empty tensor;
  ``k_bias`` the recipe's per-key score bias (Q smoothing) or empty / None.

Each recipe's own operands (their dtypes, the scales' shapes, the instruction paths) are described by its ops module:
:mod:`rotvid.kernels.recipes.int4.ops` (the INT4 paths ``"s4"``, ``"s8"``, ``"wgmma"``) and
:mod:`rotvid.kernels.recipes.int8_fp8.ops`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rotvid.kernels.reference import check_sm_scale, to_bhnd
from rotvid.kernels.sparsity.block_map import BlockMap

BLOCK_M = 128
SUPPORTED_BLOCK_N = (64, 128)
DEFAULT_BLOCK_N = 64
SUPPORTED_HEAD_DIMS = (64, 128)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


class KernelQKV(NamedTuple):
    """Pre-processed operands in the kernel layout (see the module docstring)."""

    q_hat: torch.Tensor
    q_scale: torch.Tensor
    k_hat: torch.Tensor
    k_scale: torch.Tensor
    vt: torch.Tensor
    vparams: torch.Tensor
    v_mean: torch.Tensor
    k_bias: torch.Tensor | None = None  # Q smoothing's per-key ΔS (empty or None: Q not smoothed)

def pads(n_q: int, n_kv: int, block_n: int) -> tuple[int, int]:
    return -(-n_q // BLOCK_M) * BLOCK_M, -(-n_kv // block_n) * block_n


def sizes_of(q: torch.Tensor, k: torch.Tensor, bnhd: bool) -> tuple[int, int, int, int, int]:
    """``(B, H, Nq, D, Nkv)`` of ``q`` and ``k`` in their layout (``bnhd``: [B, N, H, D], else [B, H, N, D]); what a
    pre-processing op's fake implementation shapes its operands by."""
    if bnhd:
        b, n_q, h, d = q.shape
        n_kv = k.shape[1]
    else:
        b, h, n_q, d = q.shape
        n_kv = k.shape[2]
    return b, h, n_q, d, n_kv


def empty_attention_output(q_hat: torch.Tensor, n_q: int, head_dim: int, out_bf16: bool, bnhd: bool) -> torch.Tensor:
    """An unwritten attention output for operands ``q_hat`` [B, H, Nq_pad, DB]: [B, n_q, H, head_dim] (``bnhd``) or
    [B, H, n_q, head_dim], bf16 or fp16 (what an attention op's fake implementation returns)."""
    b, h = q_hat.shape[0], q_hat.shape[1]
    shape = (b, n_q, h, head_dim) if bnhd else (b, h, n_q, head_dim)
    return q_hat.new_empty(shape, dtype=torch.bfloat16 if out_bf16 else torch.float16)


def scale_and_map_operands(qkv: KernelQKV, *, n_q: int, n_kv: int, head_dim: int, sm_scale: float | None,
                           block_map) -> tuple[float, torch.Tensor | None, torch.Tensor | None]:
    """``(sm_scale, map_index, map_count)`` of an attention call on pre-processed operands: the score scale checked
    (:func:`rotvid.kernels.reference.check_sm_scale`; None: ``head_dim ** -0.5``) and the block map as the kernels
    read it (:func:`block_map_operands`)."""
    check_sm_scale(sm_scale)
    sm_scale = head_dim**-0.5 if sm_scale is None else sm_scale
    b, h = qkv.q_hat.shape[:2]
    map_index, map_count = block_map_operands(block_map, batch=b, heads=h, n_q=n_q, n_kv=n_kv,
                                              device=qkv.q_hat.device)
    return sm_scale, map_index, map_count


def check_inputs(q, k, v, layout, kv_lens, block_n):
    if layout not in ("BHND", "BNHD"):
        raise ValueError(f"layout: expected 'BHND' or 'BNHD', got {layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name}: expected a 4-D torch.Tensor in layout {layout}")
        if not t.is_cuda:
            raise ValueError(f"{name}: expected a CUDA tensor, got device {t.device}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"{name}: expected dtype float16 or bfloat16, got {t.dtype}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: expected a contiguous last (head_dim) dimension")
        if any(st % 8 for st in t.stride()[:3]):
            raise ValueError(f"{name}: expected strides that are multiples of 8 elements (16-byte aligned rows), got {t.stride()}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"k, v: expected the same dtype as q ({q.dtype}), got {k.dtype}, {v.dtype}")
    qb, qh, qn, qd = to_bhnd(q, layout).shape
    kb, kh, kn, kd = to_bhnd(k, layout).shape
    if qd not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"q: expected head_dim in {SUPPORTED_HEAD_DIMS}, got {qd}")
    if (kb, kh, kd) != (qb, qh, qd) or k.shape != v.shape:
        raise ValueError(f"k, v: expected batch/heads/head_dim of q {(qb, qh, qd)} and equal shapes, got {tuple(k.shape)}, {tuple(v.shape)}")
    if block_n not in SUPPORTED_BLOCK_N:
        raise ValueError(f"block_n: expected one of {SUPPORTED_BLOCK_N}, got {block_n!r}")
    if kv_lens is not None:
        if not isinstance(kv_lens, torch.Tensor) or kv_lens.shape != (qb,) or kv_lens.dtype.is_floating_point:
            raise ValueError(f"kv_lens: expected an integer tensor of shape [{qb}]")
    if not torch.compiler.is_compiling():  # (the C++ side checks alignment again)
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.data_ptr() % 16 != 0:
                raise ValueError(f"{name}: expected a 16-byte aligned data pointer")
    return qb, qh, qn, qd, kn


def check_output_args(out_dtype: torch.dtype, head_dim: int, layout: str) -> None:
    if out_dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"out_dtype: expected float16 or bfloat16, got {out_dtype}")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim: expected one of {SUPPORTED_HEAD_DIMS}, got {head_dim}")
    if layout not in ("BHND", "BNHD"):
        raise ValueError(f"layout: expected 'BHND' or 'BNHD', got {layout!r}")


def block_map_operands(block_map, *, batch: int, heads: int, n_q: int, n_kv: int, device: torch.device):
    """``(map_index, map_count)``: a :class:`~rotvid.kernels.sparsity.BlockMap` as the kernels read it
    (contiguous int32 [B', H', Tq, Kmax] and [B', H', Tq]), or ``(None, None)`` without a map. ValueError naming
    ``block_map`` unless it is a map for ``n_q`` queries and ``n_kv`` keys, its batch / head dimensions 1 or
    ``batch`` / ``heads``, on ``device``, and (eager mode) its values are a valid map -- what the dispatcher checks
    (:func:`rotvid.kernels.dispatch.check_block_map`), so a kernel-level entry point takes no map it would refuse.
    Under ``torch.compile`` the values are not checked: the kernels clamp counts to [0, Kmax] and skip entries
    outside [0, Tk) (:meth:`BlockMap.visit_counts`)."""
    if block_map is None:
        return None, None
    if not isinstance(block_map, BlockMap):
        raise ValueError(f"block_map: expected a rotvid.kernels.sparsity.BlockMap or None, got {type(block_map).__name__}")
    block_map.check_fits(batch=batch, heads=heads, n_q=n_q, n_kv=n_kv)
    if block_map.device != torch.device(device):
        raise ValueError(f"block_map: on {block_map.device}, expected the operands' device {device}")
    block_map.check_values()
    return block_map.indices.contiguous(), block_map.counts.contiguous()


def kv_lens_int32(kv_lens, device):
    if kv_lens is None:
        return None
    return kv_lens.to(device=device, dtype=torch.int32).contiguous()




def vt_key_permutation(n_pad: int, path: str, device=None) -> torch.Tensor:
    """Long [n_pad]: the key index stored at each position of the V^T layout (csrc/common/attention_params.cuh)."""
    chk = 64 if path == "s4" else 32
    p = torch.arange(n_pad, device=device)
    q = p % chk
    r = p % (chk // 2)
    t, i = r // (chk // 8), r % (chk // 8)
    return (p - q) + (q // (chk // 2)) * (chk // 2) + 8 * (i >> 1) + 2 * t + (i & 1)



def pad_rows(x: torch.Tensor, n_pad: int) -> torch.Tensor:
    n = x.shape[2]
    if n == n_pad:
        return x.contiguous()
    shape = list(x.shape)
    shape[2] = n_pad - n
    return torch.cat([x, x.new_zeros(shape)], dim=2).contiguous()
