"""The INT4 recipes' CUDA kernels (``int4``, ``int4-sym-p``): custom ops ``rotvid::int4_preprocess`` and
``rotvid::int4_attention`` with their fake (shape-only) implementations, the public functions on them, and the INT4
operands' layout (:func:`pack_reference_quantized` packs the reference's into it).

Instruction paths, chosen by compute capability from :data:`rotvid.kernels.cuda_build.ARCH_TABLE`:

* ``"s4"`` (sm80/86/89): native INT4 ``mma.sync.m16n8k64.s4`` for QKᵀ and P̃V̂; Q/K/V̂ packed
  two values per byte.
* ``"s8"`` (any supported GPU): the same INT4-valued numbers on INT8 ``mma.sync.m16n8k32.s8``
  (identical integer products, so identical outputs).
* ``"wgmma"`` (sm90, block_n 64 or 128): the same numbers on Hopper's warpgroup tensor cores
  (``wgmma.mma_async ... s8`` for QKᵀ, ``e4m3 x e4m3`` for P̂V̂ -- INT4 values are exact in e4m3 and the block's
  sum is exact in the FP32 accumulator --, operands brought in by TMA; ``csrc/hopper/hopper_attention.cuh`` with the
  numerics of ``recipes/int4/csrc/hopper_int4_numerics.cuh``). The s8 kernel layout, except ``vt``: uint8
  sign-magnitude bytes. P̂ is rounded by the e4m3 conversion of a shifted exponent, so a few outputs in 10⁴ differ
  from the s8 path's (rare ±1 flips of P̂ where ex2.approx rounds the other way); the bound against the reference is
  the s8 path's.

On sm90 the default kernel is ``"wgmma"`` (block size :func:`default_block_n`); elsewhere the arch table's path. A
block map (``block_map=``) runs on every path, the ``"wgmma"`` kernel and the mma.sync ``"s8"`` / ``"s4"`` ones (at
block_n 64 each map block of 128 keys is walked as two kernel blocks).

Kernel layout (what :func:`preprocess_int4_cuda` returns and :func:`attention_int4_quantized` takes; the shared
layout: :mod:`rotvid.kernels.cuda_layout`), with BH = batch·heads, ``Nq_pad`` = Nq rounded up to 128, ``Nkv_pad``
to block_n:

* ``q_hat`` int8 [B, H, Nq_pad, DB], ``k_hat`` int8 [B, H, Nkv_pad, DB]; DB = D (s8) or D/2
  (s4, element 2c in the low nibble of byte c); padded rows are zero.
* ``q_scale`` fp32 [B, H, Nq_pad], ``k_scale`` fp32 [B, H, Nkv_pad] (zero on padded rows).
* ``vt`` int8 [B, H, D, Nkv_pad] (s8) or [B, H, D, Nkv_pad/2] (s4), or uint8 [B, H, D, Nkv_pad] (wgmma: the
  sign-magnitude byte ``|v| | sign << 7``, which the kernel reads as the e4m3 value v·2⁻⁹): V̂ transposed, key
  positions permuted inside chunks of 32 (s8, wgmma) / 64 (s4) keys
  (:func:`~rotvid.kernels.cuda_layout.vt_key_permutation`). Operands are pre-processed for one path: the kernels
  refuse a ``vt`` of another path's format.
* ``vparams`` fp32 [B, H, Nkv_pad/block_n, D, 2]: ``v_scale`` (the P levels' factor 1/15 or 1/7
  cancels in O / l, both being in units of P̂), and the bits of int32 ``0x4B400000 + 8*colsum``
  (range) or ``0x4B400000`` (sym), the accumulator initialiser of P̃V̂ in the mma.sync kernels.
* ``v_mean`` fp32 [B, H, D] when V is smoothed, else an empty tensor.
* ``k_bias`` fp32 [B, H, Nkv_pad] when Q is smoothed, else an empty tensor: ``sm_scale·log2(e)·(mean(q)·k_s)``
  per key (mean over all query rows of the head, ``k_s`` the smoothed key), Q smoothing's ΔS in the log2
  domain; the kernels add it to each score. It depends on ``sm_scale``: pre-process and attend with the same.
"""

from __future__ import annotations

import torch

from rotvid.kernels import cuda_build
from rotvid.kernels.cuda_layout import (
    DEFAULT_BLOCK_N,
    SUPPORTED_BLOCK_N,
    KernelQKV,
    block_map_operands,
    check_inputs,
    check_output_args,
    empty_attention_output,
    kv_lens_int32,
    pad_rows,
    pads,
    scale_and_map_operands,
    sizes_of,
    vt_key_permutation,
)
from rotvid.kernels.recipes.int4.reference import QuantizedQKV
from rotvid.kernels.reference import LOG2E, check_sm_scale
from rotvid.kernels.sparsity.block_map import BlockMap

PATHS = ("s4", "s8", "wgmma")
P_MODES = {"range": 0, "sym": 1}
MAGIC_I = 0x4B400000


@torch.library.custom_op("rotvid::int4_preprocess", mutates_args=())
def _int4_preprocess_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_lens: torch.Tensor | None,
    bnhd: bool,
    block_n: int,
    smooth_k: bool,
    smooth_v: bool,
    path: str,
    p_mode: int,
    smooth_q: bool,
    qk_scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
           torch.Tensor]:
    ext = cuda_build.load_extension(q.device)
    kernel = _resolve_path(path, q.device)
    return tuple(ext.preprocess_int4(q, k, v, kv_lens, bnhd, block_n, smooth_k, smooth_v, kernel == "s4", p_mode,
                                     smooth_q, qk_scale, kernel == "wgmma"))


@_int4_preprocess_op.register_fake
def _(q, k, v, kv_lens, bnhd, block_n, smooth_k, smooth_v, path, p_mode, smooth_q, qk_scale):
    kernel = _resolve_path(path, q.device)
    s4 = kernel == "s4"
    b, h, n_q, d, n_kv = sizes_of(q, k, bnhd)
    nq_pad, nkv_pad = pads(n_q, n_kv, block_n)
    db = d // 2 if s4 else d
    i8, f32 = dict(dtype=torch.int8, device=q.device), dict(dtype=torch.float32, device=q.device)
    return (
        q.new_empty((b, h, nq_pad, db), **i8),
        q.new_empty((b, h, nq_pad), **f32),
        q.new_empty((b, h, nkv_pad, db), **i8),
        q.new_empty((b, h, nkv_pad), **f32),
        q.new_empty((b, h, d, nkv_pad // 2 if s4 else nkv_pad), dtype=vt_dtype(kernel), device=q.device),
        q.new_empty((b, h, nkv_pad // block_n, d, 2), **f32),
        q.new_empty((b, h, d) if smooth_v else (0,), **f32),
        q.new_empty((b, h, nkv_pad) if smooth_q else (0,), **f32),
    )


@torch.library.custom_op("rotvid::int4_attention", mutates_args=())
def _int4_attention_op(
    q_hat: torch.Tensor,
    q_scale: torch.Tensor,
    k_hat: torch.Tensor,
    k_scale: torch.Tensor,
    vt: torch.Tensor,
    vparams: torch.Tensor,
    v_mean: torch.Tensor,
    kv_lens: torch.Tensor | None,
    n_q: int,
    n_kv: int,
    head_dim: int,
    block_n: int,
    path: str,
    p_mode: int,
    qk_scale: float,
    out_bf16: bool,
    bnhd: bool,
    split_tail: bool,
    k_bias: torch.Tensor,
    map_index: torch.Tensor | None = None,
    map_count: torch.Tensor | None = None,
) -> torch.Tensor:
    ext = cuda_build.load_extension(q_hat.device)
    kernel = _resolve_path(path, q_hat.device)
    return ext.attention_int4(
        q_hat, q_scale, k_hat, k_scale, vt, vparams, v_mean, kv_lens, n_q, n_kv, head_dim, block_n, kernel == "s4",
        kernel == "wgmma", p_mode, qk_scale, out_bf16, bnhd, None, split_tail, k_bias, map_index, map_count,
    )


@_int4_attention_op.register_fake
def _(q_hat, q_scale, k_hat, k_scale, vt, vparams, v_mean, kv_lens, n_q, n_kv, head_dim, block_n, path, p_mode,
      qk_scale, out_bf16, bnhd, split_tail, k_bias, map_index=None, map_count=None):
    return empty_attention_output(q_hat, n_q, head_dim, out_bf16, bnhd)


def default_block_n(device: torch.device | None = None) -> int:
    """The key-block size the CUDA backend uses when none is given: 128 where the Hopper kernel
    runs (its tile), else 64. The block size is part of the numerics (block-local softmax max and
    V̂ column sums), so the reference must be run with the same value to reproduce a kernel."""
    try:
        return 128 if cuda_build.arch_entry(device).wgmma else DEFAULT_BLOCK_N
    except RuntimeError:
        return DEFAULT_BLOCK_N


def _resolve_path(path: str, device: torch.device) -> str:
    """'auto' -> the arch table's kernel for ``device``; 's4' / 's8' / 'wgmma' as given."""
    if path != "auto":
        return path
    entry = cuda_build.arch_entry(device)
    return "wgmma" if entry.wgmma else entry.path


def _check_path(path: str | None, device: torch.device) -> str:
    if path is None:
        return "auto"
    if path not in PATHS:
        raise ValueError(f"path: expected one of {PATHS} or None (arch default), got {path!r}")
    if path == "wgmma":
        if device.type == "cuda" and not cuda_build.arch_entry(device).wgmma:
            cap = cuda_build.capability(device)
            raise ValueError(f"path: 'wgmma' needs an sm90 GPU (Hopper), this is sm{cap[0]}{cap[1]}")
    return path


def preprocess_int4_cuda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    layout: str = "BHND",
    kv_lens: torch.Tensor | None = None,
    block_n: int | None = None,
    smooth_k: bool = True,
    smooth_v: bool = False,
    p_mode: str = "range",
    path: str | None = None,
    smooth_q: bool = False,
    sm_scale: float | None = None,
) -> KernelQKV:
    """Steps 1-2 of the INT4 recipe on the GPU (Q/K/V smoothing, per-token INT4 Q/K, per-group INT4 V).

    Args: q [B, H, Nq, D] (``"BHND"``) or [B, Nq, H, D] (``"BNHD"``), k, v likewise with Nkv
    keys; fp16 or bf16, last dim contiguous; D in (64, 128). ``kv_lens`` int [B] (keys
    ``j >= kv_lens[b]`` masked). ``p_mode`` decides the ``vparams`` encoding; ``path`` the
    packing (``None``: the arch default); ``block_n`` None: :func:`default_block_n`. ``smooth_q``: Q
    smoothed by its per-head mean, the ΔS per key in ``k_bias`` for the score scale ``sm_scale`` (default
    D ** -0.5; attend with the same). Returns a :class:`KernelQKV` (module docstring).
    Bit-identical to :func:`rotvid.kernels.recipes.int4.reference.preprocess_int4` packed by
    :func:`pack_reference_quantized`.
    """
    block_n = default_block_n(q.device) if block_n is None else block_n
    check_inputs(q, k, v, layout, kv_lens, block_n)
    if p_mode not in P_MODES:
        raise ValueError(f"p_mode: expected 'range' or 'sym', got {p_mode!r}")
    path = _check_path(path, q.device)
    check_sm_scale(sm_scale)
    return _preprocess_int4(q, k, v, layout, kv_lens, block_n, smooth_k, smooth_v, p_mode, path, smooth_q, sm_scale)


def _preprocess_int4(q, k, v, layout, kv_lens, block_n: int, smooth_k, smooth_v, p_mode, path: str, smooth_q,
                     sm_scale) -> KernelQKV:
    """:func:`preprocess_int4_cuda` without its checks (``block_n`` and ``path`` resolved, inputs checked)."""
    sm_scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    out = _int4_preprocess_op(
        q, k, v, kv_lens_int32(kv_lens, q.device), layout == "BNHD", block_n, smooth_k, smooth_v, path,
        P_MODES[p_mode], bool(smooth_q), float(sm_scale * LOG2E),
    )
    return KernelQKV(*out)


def attention_int4_quantized(
    qkv: KernelQKV,
    *,
    n_q: int,
    n_kv: int,
    head_dim: int,
    block_n: int | None = None,
    kv_lens: torch.Tensor | None = None,
    sm_scale: float | None = None,
    p_mode: str = "range",
    path: str | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    layout: str = "BHND",
    out: torch.Tensor | None = None,
    split_tail: bool = True,
    block_map: BlockMap | None = None,
) -> torch.Tensor:
    """Steps 3-6 of the INT4 recipe (the attention kernel) on operands in the kernel layout.

    Returns [B, H, n_q, head_dim] (``"BHND"``) or [B, n_q, H, head_dim] (``"BNHD"``) in
    ``out_dtype`` (fp16 or bf16); fp32 accumulation of O across key blocks. ``out``: an
    optional preallocated output of that shape and dtype, written in place (not traceable by
    torch.compile; for tests). ``split_tail`` (wgmma kernel): when the query tiles do not fill the
    last wave of SMs, the tiles of that wave run split over the keys (2-4 CTAs each, merged by a
    second kernel) -- same maths, fp32 summation order of O and l changed for those rows only;
    False keeps every row's order (the mma.sync path's summation order; the wgmma kernel's P̂ may still differ
    from that path's at rare scores, see the module docstring). ``block_map``: the key blocks each query tile visits
    (every path; as :func:`rotvid.kernels.recipes.int8_fp8.ops.attention_int8fp8_quantized`'s: a skipped block is
    a block of ``-inf`` scores, a tile that keeps none gives 0, the values are not checked here).
    """
    if p_mode not in P_MODES:
        raise ValueError(f"p_mode: expected 'range' or 'sym', got {p_mode!r}")
    check_output_args(out_dtype, head_dim, layout)
    block_n = default_block_n(qkv.q_hat.device) if block_n is None else block_n
    if block_n not in SUPPORTED_BLOCK_N:
        raise ValueError(f"block_n: expected one of {SUPPORTED_BLOCK_N}, got {block_n!r}")
    path = _check_path(path, qkv.q_hat.device)
    kernel = _resolve_path(path, qkv.q_hat.device)
    want = vt_dtype(kernel)
    if qkv.vt.dtype != want:
        raise ValueError(f"qkv.vt: the {kernel!r} kernel takes {want} V^T bytes, got "
                         f"{qkv.vt.dtype}: pre-process for the same path (preprocess_int4_cuda / "
                         f"pack_reference_quantized with path={path!r})")
    sm_scale, map_index, map_count = scale_and_map_operands(qkv, n_q=n_q, n_kv=n_kv, head_dim=head_dim,
                                                            sm_scale=sm_scale, block_map=block_map)
    k_bias = _k_bias(qkv)
    args = _attention_args(qkv, n_q, n_kv, head_dim, block_n, kv_lens, sm_scale, p_mode, path, out_dtype, layout)
    if out is None:
        return _int4_attention_op(*args, bool(split_tail), k_bias, map_index, map_count)
    # Writing into a caller's tensor (tests poison it first): the raw extension, outside the custom op.
    if out.dtype != out_dtype:
        raise ValueError(f"out: expected dtype {out_dtype}, got {out.dtype}")
    cuda_build.load_extension(qkv.q_hat.device).attention_int4(
        *args[:12], kernel == "s4", kernel == "wgmma", *args[13:], out, bool(split_tail), k_bias, map_index, map_count
    )
    return out


def int4_attention_cuda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    layout: str = "BHND",
    kv_lens: torch.Tensor | None = None,
    sm_scale: float | None = None,
    p_mode: str = "range",
    smooth_k: bool = True,
    smooth_v: bool = False,
    block_n: int | None = None,
    path: str | None = None,
    smooth_q: bool = False,
    block_map: BlockMap | None = None,
) -> torch.Tensor:
    """Pre-processing + INT4 attention on the GPU; output has q's shape, layout and dtype (``block_map`` as
    :func:`attention_int4_quantized`'s)."""
    block_n = default_block_n(q.device) if block_n is None else block_n
    qb, qh, qn, qd, kn = check_inputs(q, k, v, layout, kv_lens, block_n)
    block_map_operands(block_map, batch=qb, heads=qh, n_q=qn, n_kv=kn, device=q.device)  # (before the pre-processing)
    if p_mode not in P_MODES:
        raise ValueError(f"p_mode: expected 'range' or 'sym', got {p_mode!r}")
    path = _check_path(path, q.device)
    check_sm_scale(sm_scale)
    return int4_attention_unchecked(q, k, v, layout=layout, kv_lens=kv_lens, sm_scale=sm_scale, p_mode=p_mode,
                                    smooth_k=smooth_k, smooth_v=smooth_v, block_n=block_n, path=path,
                                    smooth_q=smooth_q, block_map=block_map)


def int4_attention_unchecked(q, k, v, *, layout="BHND", kv_lens=None, sm_scale=None, p_mode="range", smooth_k=True,
                             smooth_v=False, block_n=None, path="auto", smooth_q=False, block_map=None):
    """:func:`int4_attention_cuda` without its checks, the body a prepared call runs
    (:func:`rotvid.kernels.dispatch.prepare_attention` checked the inputs, the block map's values and the kernel
    entry's support checks once; the C++ side's TORCH_CHECKs still run): the same ops with the same arguments, so the
    same bits. ``path``: ``"auto"`` (the arch default) or a checked path."""
    block_n = default_block_n(q.device) if block_n is None else block_n
    bhnd = layout == "BHND"
    qn, qd, kn = q.shape[2 if bhnd else 1], q.shape[3], k.shape[2 if bhnd else 1]
    qkv = _preprocess_int4(q, k, v, layout, kv_lens, block_n, smooth_k, smooth_v, p_mode, path, smooth_q, sm_scale)
    sm_scale = qd**-0.5 if sm_scale is None else sm_scale
    map_index, map_count = (None, None) if block_map is None else (block_map.indices.contiguous(),
                                                                   block_map.counts.contiguous())
    args = _attention_args(qkv, qn, kn, qd, block_n, kv_lens, sm_scale, p_mode, path, q.dtype, layout)
    return _int4_attention_op(*args, True, _k_bias(qkv), map_index, map_count)


def _k_bias(qkv: KernelQKV) -> torch.Tensor:
    return qkv.k_bias if qkv.k_bias is not None else qkv.q_scale.new_empty((0,))


def _attention_args(qkv: KernelQKV, n_q, n_kv, head_dim, block_n, kv_lens, sm_scale: float, p_mode, path, out_dtype,
                    layout) -> tuple:
    """``rotvid::int4_attention``'s arguments up to ``bnhd`` (``sm_scale`` resolved)."""
    return (
        qkv.q_hat, qkv.q_scale, qkv.k_hat, qkv.k_scale, qkv.vt, qkv.vparams, qkv.v_mean,
        kv_lens_int32(kv_lens, qkv.q_hat.device), n_q, n_kv, head_dim, block_n, path, P_MODES[p_mode],
        float(sm_scale * LOG2E), out_dtype == torch.bfloat16, layout == "BNHD",
    )


def vt_dtype(path: str) -> torch.dtype:
    """The dtype of the INT4 ``vt`` operand of a (resolved) path: uint8 sign-magnitude bytes for the wgmma kernel's
    e4m3 P·V, int8 two's complement (s8) or nibbles (s4) for the mma.sync kernels."""
    return torch.uint8 if path == "wgmma" else torch.int8


def sign_magnitude_bytes(x: torch.Tensor) -> torch.Tensor:
    """INT4 values (int8 in [-7, 7]) -> uint8 ``|x| | sign << 7``: the e4m3 codes of x·2⁻⁹."""
    v = x.to(torch.int16)
    return torch.where(v < 0, 128 - v, v).to(torch.uint8)


def pack_nibbles(x: torch.Tensor) -> torch.Tensor:
    """int8 values in [-8, 7] along the last dim -> bytes, element 2c in the low nibble of byte c."""
    lo = x[..., 0::2].to(torch.int32) & 0xF
    hi = x[..., 1::2].to(torch.int32) & 0xF
    return (lo | (hi << 4)).to(torch.uint8).view(torch.int8)


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
