"""The CUDA kernels' operand layout, the input checks they share, and packing the reference's operands into it.

Instruction paths, chosen by compute capability from :data:`ARCH_TABLE`:

* ``"s4"`` (sm80/86/89): native INT4 ``mma.sync.m16n8k64.s4`` for QKᵀ and P̃V̂; Q/K/V̂ packed
  two values per byte.
* ``"s8"`` (any supported GPU): the same INT4-valued numbers on INT8 ``mma.sync.m16n8k32.s8``
  (identical integer products, so identical outputs).
* ``"wgmma"`` (sm90, block_n 64 or 128): the same numbers on Hopper's warpgroup tensor cores
  (``wgmma.mma_async ... s8`` for QKᵀ, ``e4m3 x e4m3`` for P̂V̂ -- INT4 values are exact in e4m3 and the block's
  sum is exact in the FP32 accumulator --, operands brought in by TMA; ``csrc/hopper_attention.cuh`` with the
  numerics of ``csrc/hopper_int4_numerics.cuh``). The s8 kernel layout, except ``vt``: uint8 sign-magnitude
  bytes. P̂ is rounded by the e4m3 conversion of a shifted exponent, so a few outputs in 10⁴ differ from the s8
  path's (rare ±1 flips of P̂ where ex2.approx rounds the other way); the bound against the reference is the s8
  path's.

On sm90 the default is ``"wgmma"`` (block size :func:`default_block_n`); elsewhere the arch path.

Kernel layout (what :func:`preprocess_int4_cuda` returns and :func:`attention_int4_quantized`
takes), with BH = batch·heads, ``Nq_pad`` = Nq rounded up to 128, ``Nkv_pad`` to block_n:

* ``q_hat`` int8 [B, H, Nq_pad, DB], ``k_hat`` int8 [B, H, Nkv_pad, DB]; DB = D (s8) or D/2
  (s4, element 2c in the low nibble of byte c); padded rows are zero.
* ``q_scale`` fp32 [B, H, Nq_pad], ``k_scale`` fp32 [B, H, Nkv_pad] (zero on padded rows).
* ``vt`` int8 [B, H, D, Nkv_pad] (s8) or [B, H, D, Nkv_pad/2] (s4), or uint8 [B, H, D, Nkv_pad] (wgmma: the
  sign-magnitude byte ``|v| | sign << 7``, which the kernel reads as the e4m3 value v·2⁻⁹): V̂ transposed, key
  positions permuted inside chunks of 32 (s8, wgmma) / 64 (s4) keys (:func:`vt_key_permutation`). Operands are
  pre-processed for one path: the kernels refuse a ``vt`` of another path's format.
* ``vparams`` fp32 [B, H, Nkv_pad/block_n, D, 2]: ``v_scale`` (the P levels' factor 1/15 or 1/7
  cancels in O / l, both being in units of P̂), and the bits of int32 ``0x4B400000 + 8*colsum``
  (range) or ``0x4B400000`` (sym), the accumulator initialiser of P̃V̂ in the mma.sync kernels.
* ``v_mean`` fp32 [B, H, D] when V is smoothed, else an empty tensor.
* ``k_bias`` fp32 [B, H, Nkv_pad] when Q is smoothed, else an empty tensor: ``sm_scale·log2(e)·(mean(q)·k_s)``
  per key (mean over all query rows of the head, ``k_s`` the smoothed key), Q smoothing's ΔS in the log2
  domain; the kernels add it to each score. It depends on ``sm_scale``: pre-process and attend with the same.

The int8-fp8 operands (:func:`rotvid.kernels.recipes.int8_fp8_ops.preprocess_int8fp8_cuda`) use the s8 layout with
e4m3 bytes in ``vt`` (:func:`pack_reference_int8fp8`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from rotvid.kernels.reference import INT8FP8_BLOCK_N, LOG2E, QuantizedQKV, to_bhnd
from rotvid.kernels.sparsity.block_map import BlockMap

BLOCK_M = 128
SUPPORTED_BLOCK_N = (64, 128)
DEFAULT_BLOCK_N = 64
SUPPORTED_HEAD_DIMS = (64, 128)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
PATHS = ("s4", "s8", "wgmma")
P_MODES = {"range": 0, "sym": 1}
MAGIC_I = 0x4B400000


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


def vt_dtype(path: str) -> torch.dtype:
    """The dtype of the INT4 ``vt`` operand of a (resolved) path: uint8 sign-magnitude bytes for the wgmma kernel's
    e4m3 P·V, int8 two's complement (s8) or nibbles (s4) for the mma.sync kernels."""
    return torch.uint8 if path == "wgmma" else torch.int8


def sign_magnitude_bytes(x: torch.Tensor) -> torch.Tensor:
    """INT4 values (int8 in [-7, 7]) -> uint8 ``|x| | sign << 7``: the e4m3 codes of x·2⁻⁹."""
    v = x.to(torch.int16)
    return torch.where(v < 0, 128 - v, v).to(torch.uint8)


def vt_key_permutation(n_pad: int, path: str, device=None) -> torch.Tensor:
    """Long [n_pad]: the key index stored at each position of the V^T layout (int4_common.cuh)."""
    chk = 64 if path == "s4" else 32
    p = torch.arange(n_pad, device=device)
    q = p % chk
    r = p % (chk // 2)
    t, i = r // (chk // 8), r % (chk // 8)
    return (p - q) + (q // (chk // 2)) * (chk // 2) + 8 * (i >> 1) + 2 * t + (i & 1)


def pack_nibbles(x: torch.Tensor) -> torch.Tensor:
    """int8 values in [-8, 7] along the last dim -> bytes, element 2c in the low nibble of byte c."""
    lo = x[..., 0::2].to(torch.int32) & 0xF
    hi = x[..., 1::2].to(torch.int32) & 0xF
    return (lo | (hi << 4)).to(torch.uint8).view(torch.int8)


def pad_rows(x: torch.Tensor, n_pad: int) -> torch.Tensor:
    n = x.shape[2]
    if n == n_pad:
        return x.contiguous()
    shape = list(x.shape)
    shape[2] = n_pad - n
    return torch.cat([x, x.new_zeros(shape)], dim=2).contiguous()


def pack_reference_quantized(
    qkv: QuantizedQKV, *, p_mode: str = "range", path: str = "s8", sm_scale: float | None = None
) -> KernelQKV:
    """Kernel-layout operands from the reference's :class:`QuantizedQKV` (same values, no rounding).

    With Q smoothing the reference's ΔS becomes ``k_bias`` = float32(sm_scale·log2 e)·(mean(q)·k_sᵀ) for the score
    scale ``sm_scale`` (default D ** -0.5); the kernels take one Q mean per head (``q_block=None`` in the
    reference): per-block means raise ValueError.
    """
    if p_mode not in P_MODES:
        raise ValueError(f"p_mode: expected 'range' or 'sym', got {p_mode!r}")
    if path not in PATHS:
        raise ValueError(f"path: expected one of {PATHS}, got {path!r}")
    b, h, n_q, d = qkv.q_hat.shape
    n_kv = qkv.k_hat.shape[2]
    nq_pad, nkv_pad = pads(n_q, n_kv, qkv.block_n)
    q_hat = pad_rows(qkv.q_hat, nq_pad)
    k_hat = pad_rows(qkv.k_hat, nkv_pad)
    q_scale = pad_rows(qkv.q_scale.float(), nq_pad).reshape(b, h, nq_pad)
    k_scale = pad_rows(qkv.k_scale.float(), nkv_pad).reshape(b, h, nkv_pad)
    v_hat = qkv.v_hat  # [B, H, Nkv_pad, D]
    if v_hat.shape[2] != nkv_pad:
        raise ValueError(f"qkv.v_hat: expected {nkv_pad} (padded) keys, got {v_hat.shape[2]}")
    perm = vt_key_permutation(nkv_pad, path, device=v_hat.device)
    vt = v_hat.transpose(2, 3)[..., perm].contiguous()
    if path == "s4":
        q_hat, k_hat, vt = pack_nibbles(q_hat), pack_nibbles(k_hat), pack_nibbles(vt)
    elif path == "wgmma":
        vt = sign_magnitude_bytes(vt)
    vs = qkv.v_scale.float()
    cs = MAGIC_I + (8 * qkv.v_colsum.to(torch.int32) if p_mode == "range" else 0 * qkv.v_colsum.to(torch.int32))
    vparams = torch.stack([vs, cs.to(torch.int32).view(torch.float32)], dim=-1).contiguous()
    if qkv.v_mean is not None:
        v_mean = qkv.v_mean.float().reshape(b, h, d).contiguous()
    else:
        v_mean = torch.empty(0, dtype=torch.float32, device=q_hat.device)
    k_bias = torch.empty(0, dtype=torch.float32, device=q_hat.device)
    if qkv.q_block_mean is not None:
        mean = qkv.q_block_mean[:, :, :1]
        if not torch.equal(qkv.q_block_mean, mean.expand_as(qkv.q_block_mean)):
            raise ValueError("qkv: the CUDA kernels smooth Q with one mean per head (reference q_block=None), "
                             "got per-block Q means")
        qk_scale = torch.tensor((d**-0.5 if sm_scale is None else sm_scale) * LOG2E, dtype=torch.float32)
        ds = torch.matmul(mean.float(), qkv.k_smoothed.float().transpose(-1, -2)) * qk_scale.to(mean.device)
        k_bias = pad_rows(ds.transpose(-1, -2), nkv_pad).reshape(b, h, nkv_pad).contiguous()
    return KernelQKV(q_hat.contiguous(), q_scale.contiguous(), k_hat.contiguous(), k_scale.contiguous(), vt, vparams,
                     v_mean, k_bias)


def pack_reference_int8fp8(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    layout: str = "BHND",
    kv_lens: torch.Tensor | None = None,
    smooth_k: bool = True,
    smooth_v: bool = False,
) -> KernelQKV:
    """Kernel-layout int8-fp8 operands computed by the reference's quantizers (same values as the kernel's
    pre-processing): smoothing as :func:`rotvid.kernels.reference.smooth_qkv`, INT8 Q per token and K per group,
    per-channel FP8 V over the valid tokens, V^T as e4m3 bytes in the s8 permuted layout."""
    from rotvid.kernels.quantize import (
        key_valid_mask,
        quantize_k_groups_int8,
        quantize_per_channel_fp8,
        quantize_per_token_int8,
    )
    from rotvid.kernels.reference import smooth_qkv

    q, k, v = (to_bhnd(t, layout) for t in (q, k, v))
    q_s, k_s, v_s, _, v_mean = smooth_qkv(
        q, k, v, kv_lens=kv_lens, smooth_k=smooth_k, smooth_q=False, smooth_v=smooth_v
    )
    b, h, n_q, d = q.shape
    n_kv = k.shape[2]
    nq_pad, nkv_pad = pads(n_q, n_kv, INT8FP8_BLOCK_N)
    q_hat, q_scale = quantize_per_token_int8(q_s)
    k_hat, _, k_groups = quantize_k_groups_int8(k_s, kv_lens)
    valid = key_valid_mask(n_kv, kv_lens, b, v.device)
    v_q, v_scale = quantize_per_channel_fp8(v_s, valid)
    v8 = pad_rows(v_q.to(torch.float8_e4m3fn).view(torch.int8), nkv_pad)
    perm = vt_key_permutation(nkv_pad, "s8", device=v.device)
    vt = v8.transpose(2, 3)[..., perm].contiguous()
    v_mean_t = (
        v_mean.float().reshape(b, h, d).contiguous()
        if v_mean is not None
        else torch.empty(0, dtype=torch.float32, device=q.device)
    )
    return KernelQKV(
        pad_rows(q_hat, nq_pad),
        pad_rows(q_scale.float(), nq_pad).reshape(b, h, nq_pad).contiguous(),
        pad_rows(k_hat, nkv_pad),
        k_groups.float().contiguous(),
        vt,
        v_scale.float().reshape(b, h, d).contiguous(),
        v_mean_t,
    )
