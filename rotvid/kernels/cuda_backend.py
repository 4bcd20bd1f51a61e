"""CUDA backend of the INT4 and int8-fp8 recipes: build, custom ops, the arch table, the dispatcher backend.

The CUDA sources live in ``rotvid/kernels/csrc`` and are compiled at first use with
``torch.utils.cpp_extension.load`` (ninja) into a cache directory (``$ROTVID_EXT_CACHE`` or
``~/.cache/rotvid/ext``), keyed by the sources, torch/CUDA versions and compute capability, and
reused afterwards. ``$ROTVID_EXT_CUDA_FLAGS`` adds nvcc flags (part of the cache key), a tuning aid:
``-DROTVID_ATTN_VARIANTS`` builds the kernel variants that ``$ROTVID_ATTN_VARIANT`` picks at run time
(see ``csrc/int4_attention.cuh``).

Instruction paths, chosen by compute capability from :data:`ARCH_TABLE`:

* ``"s4"`` (sm80/86/89): native INT4 ``mma.sync.m16n8k64.s4`` for QKᵀ and P̃V̂; Q/K/V̂ packed
  two values per byte.
* ``"s8"`` (any supported GPU): the same INT4-valued numbers on INT8 ``mma.sync.m16n8k32.s8``
  (identical integer products, so identical outputs).
* ``"wgmma"`` (sm90, block_n 64 or 128): the same numbers on Hopper's warpgroup tensor cores
  (``wgmma.mma_async ... s8`` for QKᵀ, ``e4m3 x e4m3`` for P̂V̂ -- INT4 values are exact in e4m3 and the block's
  sum is exact in the FP32 accumulator --, operands brought in by TMA; ``csrc/int4_attention_wgmma.cuh``). The s8
  kernel layout, except ``vt``: uint8 sign-magnitude bytes. P̂ is rounded by the e4m3 conversion of a shifted
  exponent, so a few outputs in 10⁴ differ from the s8 path's (rare ±1 flips of P̂ where ex2.approx rounds the
  other way); the bound against the reference is the s8 path's.

On sm90 the default is ``"wgmma"`` (block size :func:`default_block_n`); elsewhere the arch path.

The ``int8-fp8`` recipe: INT8 Q per token and K per group of 32 keys per 128-key block (the keys one thread
holds: one scale per thread and row), P and V in FP8 e4m3 (V one scale per channel, applied with 1/l in the
epilogue), key blocks of 128; operands from :func:`preprocess_int8fp8_cuda` (``vt`` holds e4m3 bytes in the
s8 V^T layout, ``vparams`` is ``v_scale`` fp32 [B, H, D]). Two kernels of the same numerics (ArchEntry.int8fp8):

* ``"wgmma"`` (sm90, the default there; ``csrc/int8fp8_attention_wgmma.cuh``): s8 and e4m3 wgmma, TMA.
* ``"mma"`` (sm89 and sm90; ``csrc/int8fp8_attention_mma.cuh``): ``mma.sync.m16n8k32`` s8 for QKᵀ and e4m3 for
  P·V (e4m3 mma.sync needs sm89) -- the Ada kernel, testable on an H100 with ``path="mma"``. Its speed on Ada is
  unmeasured (no Ada GPU was available).

Both paths are compiled for every supported architecture, so the s4 path can be tested on an
H100 (where it runs emulated, slowly) by passing ``path="s4"``.

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
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch

from rotvid.kernels.reference import INT8FP8_BLOCK_N, LOG2E, QuantizedQKV, check_sm_scale, to_bhnd

if TYPE_CHECKING:
    from rotvid.rope.fused_table import GeneralizedRopeTable

logger = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
SOURCES = (
    "binding.cpp",
    "preprocess_int4.cu",
    "preprocess_int8fp8.cu",
    "attn_dispatch.cu",
    "attn_s8_d64.cu",
    "attn_s8_d128.cu",
    "attn_s4_d64.cu",
    "attn_s4_d128.cu",
    "attn_wgmma.cu",
    "attn_int8fp8_wgmma.cu",
    "attn_int8fp8_mma.cu",
    "rope_table.cu",
)
HEADERS = (
    "int4_common.cuh",
    "int4_rowmath.cuh",
    "rope_rows.cuh",
    "int4_attention.cuh",
    "int4_attention_wgmma.cuh",
    "int8fp8_attention_wgmma.cuh",
    "int8fp8_attention_mma.cuh",
    "tma_map.cuh",
)

BLOCK_M = 128
SUPPORTED_BLOCK_N = (64, 128)
DEFAULT_BLOCK_N = 64
SUPPORTED_HEAD_DIMS = (64, 128)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
RECIPE_P_MODE = {"int4": "range", "int4-sym-p": "sym"}
INT8FP8_RECIPE = "int8-fp8"
INT8FP8_PATHS = ("wgmma", "mma")
P_MODES = {"range": 0, "sym": 1}
MAGIC_I = 0x4B400000


@dataclass(frozen=True)
class ArchEntry:
    """One row of the arch table: the instruction path and the nvcc target of a compute capability."""

    path: str  # "s4" (native INT4 mma) or "s8" (INT4-valued numbers on INT8 mma)
    gencode: str
    wgmma: bool = False  # the Hopper kernel (wgmma + TMA) is built and is the default kernel
    int8fp8: tuple[str, ...] = ()  # the int8-fp8 kernels that run here, the default first (empty: none)


# One cached table: compute capability -> instruction path and nvcc target.
ARCH_TABLE: dict[tuple[int, int], ArchEntry] = {
    (8, 0): ArchEntry("s4", "-gencode=arch=compute_80,code=sm_80"),
    (8, 6): ArchEntry("s4", "-gencode=arch=compute_86,code=sm_86"),
    (8, 7): ArchEntry("s4", "-gencode=arch=compute_87,code=sm_87"),
    (8, 9): ArchEntry("s4", "-gencode=arch=compute_89,code=sm_89", int8fp8=("mma",)),
    (9, 0): ArchEntry("s8", "-gencode=arch=compute_90a,code=sm_90a", wgmma=True, int8fp8=("wgmma", "mma")),
}


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


# --------------------------------------------------------------------------------------------
# Build and load


def _capability(device: torch.device) -> tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


def arch_entry(device: torch.device | None = None) -> ArchEntry:
    """The arch-table row of ``device`` (default: the current CUDA device); RuntimeError naming what is missing."""
    if not torch.cuda.is_available():
        raise RuntimeError("rotvid CUDA kernels: no CUDA GPU (torch.cuda.is_available() is False)")
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    cap = _capability(device)
    if cap not in ARCH_TABLE:
        known = ", ".join(f"sm{a}{b}" for a, b in ARCH_TABLE)
        raise RuntimeError(f"rotvid CUDA kernels: unsupported compute capability sm{cap[0]}{cap[1]} (supported: {known})")
    return ARCH_TABLE[cap]


def _nvcc() -> str:
    from torch.utils import cpp_extension

    home = cpp_extension.CUDA_HOME
    nvcc = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
    if not nvcc or not os.path.exists(nvcc):
        raise RuntimeError("rotvid CUDA kernels: nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    return nvcc


def _extra_cuda_flags() -> list[str]:
    """Extra nvcc flags from ``$ROTVID_EXT_CUDA_FLAGS`` (a tuning aid, e.g. ``-DROTVID_ATTN_VARIANTS``)."""
    return os.environ.get("ROTVID_EXT_CUDA_FLAGS", "").split()


def _source_hash() -> str:
    h = hashlib.sha256()
    for name in (*SOURCES, *HEADERS):
        h.update(name.encode())
        h.update((CSRC / name).read_bytes())
    h.update(torch.__version__.encode())
    h.update(str(torch.version.cuda).encode())
    h.update(" ".join(_extra_cuda_flags()).encode())
    return h.hexdigest()[:12]


def cache_dir() -> Path:
    root = os.environ.get("ROTVID_EXT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "rotvid", "ext")
    return Path(root)


@functools.cache
def _load_for(cap: tuple[int, int]):
    from torch.utils import cpp_extension

    entry = ARCH_TABLE[cap]
    _nvcc()
    name = f"rotvid_int4_sm{cap[0]}{cap[1]}_{_source_hash()}"
    build = cache_dir() / name
    build.mkdir(parents=True, exist_ok=True)
    logger.info("loading/building rotvid CUDA extension %s in %s", name, build)
    return cpp_extension.load(
        name=name,
        sources=[str(CSRC / s) for s in SOURCES],
        extra_cflags=["-O3", "-std=c++17"],
        extra_cuda_cflags=["-O3", "-std=c++17", "-lineinfo", entry.gencode, *_extra_cuda_flags()],
        build_directory=str(build),
        verbose=os.environ.get("ROTVID_EXT_VERBOSE") == "1",
    )


def load_extension(device: torch.device | None = None):
    """Build (first use) or load the extension for ``device``'s compute capability."""
    arch_entry(device)
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    return _load_for(_capability(device))


# --------------------------------------------------------------------------------------------
# Custom ops (with fake implementations for torch.compile)


def _pads(n_q: int, n_kv: int, block_n: int) -> tuple[int, int]:
    return -(-n_q // BLOCK_M) * BLOCK_M, -(-n_kv // block_n) * block_n


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
    ext = load_extension(q.device)
    kernel = _resolve_path(path, q.device)
    return tuple(ext.preprocess_int4(q, k, v, kv_lens, bnhd, block_n, smooth_k, smooth_v, kernel == "s4", p_mode,
                                     smooth_q, qk_scale, kernel == "wgmma"))


@_int4_preprocess_op.register_fake
def _(q, k, v, kv_lens, bnhd, block_n, smooth_k, smooth_v, path, p_mode, smooth_q, qk_scale):
    kernel = _resolve_path(path, q.device)
    s4 = kernel == "s4"
    if bnhd:
        b, n_q, h, d = q.shape
        n_kv = k.shape[1]
    else:
        b, h, n_q, d = q.shape
        n_kv = k.shape[2]
    nq_pad, nkv_pad = _pads(n_q, n_kv, block_n)
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
) -> torch.Tensor:
    ext = load_extension(q_hat.device)
    kernel = _resolve_path(path, q_hat.device)
    return ext.attention_int4(
        q_hat, q_scale, k_hat, k_scale, vt, vparams, v_mean, kv_lens, n_q, n_kv, head_dim, block_n, kernel == "s4",
        kernel == "wgmma", p_mode, qk_scale, out_bf16, bnhd, None, split_tail, k_bias,
    )


@_int4_attention_op.register_fake
def _(q_hat, q_scale, k_hat, k_scale, vt, vparams, v_mean, kv_lens, n_q, n_kv, head_dim, block_n, path, p_mode,
      qk_scale, out_bf16, bnhd, split_tail, k_bias):
    b, h = q_hat.shape[0], q_hat.shape[1]
    shape = (b, n_q, h, head_dim) if bnhd else (b, h, n_q, head_dim)
    return q_hat.new_empty(shape, dtype=torch.bfloat16 if out_bf16 else torch.float16)


@torch.library.custom_op("rotvid::int8fp8_preprocess", mutates_args=())
def _int8fp8_preprocess_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_lens: torch.Tensor | None,
    bnhd: bool,
    smooth_k: bool,
    smooth_v: bool,
    rope_coef: torch.Tensor | None = None,
    rope_index: torch.Tensor | None = None,
    rope_hadamard: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    ext = load_extension(q.device)
    return tuple(
        ext.preprocess_int8fp8(q, k, v, kv_lens, bnhd, smooth_k, smooth_v, rope_coef, rope_index, rope_hadamard)
    )


@_int8fp8_preprocess_op.register_fake
def _(q, k, v, kv_lens, bnhd, smooth_k, smooth_v, rope_coef=None, rope_index=None, rope_hadamard=False):
    if bnhd:
        b, n_q, h, d = q.shape
        n_kv = k.shape[1]
    else:
        b, h, n_q, d = q.shape
        n_kv = k.shape[2]
    nq_pad, nkv_pad = _pads(n_q, n_kv, INT8FP8_BLOCK_N)
    i8, f32 = dict(dtype=torch.int8, device=q.device), dict(dtype=torch.float32, device=q.device)
    return (
        q.new_empty((b, h, nq_pad, d), **i8),
        q.new_empty((b, h, nq_pad), **f32),
        q.new_empty((b, h, nkv_pad, d), **i8),
        q.new_empty((b, h, nkv_pad // INT8FP8_BLOCK_N, 4), **f32),
        q.new_empty((b, h, d, nkv_pad), **i8),
        q.new_empty((b, h, d), **f32),
        q.new_empty((b, h, d) if smooth_v else (0,), **f32),
    )


@torch.library.custom_op("rotvid::int8fp8_attention", mutates_args=())
def _int8fp8_attention_op(
    q_hat: torch.Tensor,
    q_scale: torch.Tensor,
    k_hat: torch.Tensor,
    k_scale: torch.Tensor,
    vt: torch.Tensor,
    v_scale: torch.Tensor,
    v_mean: torch.Tensor,
    kv_lens: torch.Tensor | None,
    n_q: int,
    n_kv: int,
    head_dim: int,
    qk_scale: float,
    out_bf16: bool,
    bnhd: bool,
    path: str,
    split_tail: bool,
) -> torch.Tensor:
    ext = load_extension(q_hat.device)
    return ext.attention_int8fp8(
        q_hat, q_scale, k_hat, k_scale, vt, v_scale, v_mean, kv_lens, n_q, n_kv, head_dim, qk_scale, out_bf16, bnhd, None,
        path == "mma", split_tail,
    )


@_int8fp8_attention_op.register_fake
def _(q_hat, q_scale, k_hat, k_scale, vt, v_scale, v_mean, kv_lens, n_q, n_kv, head_dim, qk_scale, out_bf16, bnhd,
      path, split_tail):
    b, h = q_hat.shape[0], q_hat.shape[1]
    shape = (b, n_q, h, head_dim) if bnhd else (b, h, n_q, head_dim)
    return q_hat.new_empty(shape, dtype=torch.bfloat16 if out_bf16 else torch.float16)


# --------------------------------------------------------------------------------------------
# Public functions


PATHS = ("s4", "s8", "wgmma")


def default_block_n(device: torch.device | None = None) -> int:
    """The key-block size the CUDA backend uses when none is given: 128 where the Hopper kernel
    runs (its tile), else 64. The block size is part of the numerics (block-local softmax max and
    V̂ column sums), so the reference must be run with the same value to reproduce a kernel."""
    try:
        return 128 if arch_entry(device).wgmma else DEFAULT_BLOCK_N
    except RuntimeError:
        return DEFAULT_BLOCK_N


def _resolve_path(path: str, device: torch.device) -> str:
    """'auto' -> the arch table's kernel for ``device``; 's4' / 's8' / 'wgmma' as given."""
    if path != "auto":
        return path
    entry = arch_entry(device)
    return "wgmma" if entry.wgmma else entry.path


def _check_path(path: str | None, device: torch.device) -> str:
    if path is None:
        return "auto"
    if path not in PATHS:
        raise ValueError(f"path: expected one of {PATHS} or None (arch default), got {path!r}")
    if path == "wgmma":
        if device.type == "cuda" and not arch_entry(device).wgmma:
            cap = _capability(device)
            raise ValueError(f"path: 'wgmma' needs an sm90 GPU (Hopper), this is sm{cap[0]}{cap[1]}")
    return path


def _check_inputs(q, k, v, layout, kv_lens, block_n):
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


def _check_output_args(out_dtype: torch.dtype, head_dim: int, layout: str) -> None:
    if out_dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"out_dtype: expected float16 or bfloat16, got {out_dtype}")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"head_dim: expected one of {SUPPORTED_HEAD_DIMS}, got {head_dim}")
    if layout not in ("BHND", "BNHD"):
        raise ValueError(f"layout: expected 'BHND' or 'BNHD', got {layout!r}")


def _kv_lens_int32(kv_lens, device):
    if kv_lens is None:
        return None
    return kv_lens.to(device=device, dtype=torch.int32).contiguous()


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
    Bit-identical to :func:`rotvid.kernels.reference.preprocess_int4` packed by
    :func:`pack_reference_quantized`.
    """
    block_n = default_block_n(q.device) if block_n is None else block_n
    _check_inputs(q, k, v, layout, kv_lens, block_n)
    if p_mode not in P_MODES:
        raise ValueError(f"p_mode: expected 'range' or 'sym', got {p_mode!r}")
    path = _check_path(path, q.device)
    check_sm_scale(sm_scale)
    sm_scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    out = _int4_preprocess_op(
        q, k, v, _kv_lens_int32(kv_lens, q.device), layout == "BNHD", block_n, smooth_k, smooth_v, path,
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
) -> torch.Tensor:
    """Steps 3-6 of the INT4 recipe (the attention kernel) on operands in the kernel layout.

    Returns [B, H, n_q, head_dim] (``"BHND"``) or [B, n_q, H, head_dim] (``"BNHD"``) in
    ``out_dtype`` (fp16 or bf16); fp32 accumulation of O across key blocks. ``out``: an
    optional preallocated output of that shape and dtype, written in place (not traceable by
    torch.compile; for tests). ``split_tail`` (wgmma kernel): when the query tiles do not fill the
    last wave of SMs, the tiles of that wave run split over the keys (2-4 CTAs each, merged by a
    second kernel) -- same maths, fp32 summation order of O and l changed for those rows only;
    False keeps every row's order (the mma.sync path's summation order; the wgmma kernel's P̂ may still differ
    from that path's at rare scores, see the module docstring).
    """
    if p_mode not in P_MODES:
        raise ValueError(f"p_mode: expected 'range' or 'sym', got {p_mode!r}")
    _check_output_args(out_dtype, head_dim, layout)
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
    check_sm_scale(sm_scale)
    sm_scale = head_dim**-0.5 if sm_scale is None else sm_scale
    k_bias = qkv.k_bias if qkv.k_bias is not None else qkv.q_scale.new_empty((0,))
    args = (
        qkv.q_hat, qkv.q_scale, qkv.k_hat, qkv.k_scale, qkv.vt, qkv.vparams, qkv.v_mean,
        _kv_lens_int32(kv_lens, qkv.q_hat.device), n_q, n_kv, head_dim, block_n, path, P_MODES[p_mode],
        float(sm_scale * LOG2E), out_dtype == torch.bfloat16, layout == "BNHD",
    )
    if out is None:
        return _int4_attention_op(*args, bool(split_tail), k_bias)
    # Writing into a caller's tensor (tests poison it first): the raw extension, outside the custom op.
    if out.dtype != out_dtype:
        raise ValueError(f"out: expected dtype {out_dtype}, got {out.dtype}")
    load_extension(qkv.q_hat.device).attention_int4(
        *args[:12], kernel == "s4", kernel == "wgmma", *args[13:], out, bool(split_tail), k_bias
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
) -> torch.Tensor:
    """Pre-processing + INT4 attention on the GPU; output has q's shape, layout and dtype."""
    block_n = default_block_n(q.device) if block_n is None else block_n
    qb, qh, qn, qd, kn = _check_inputs(q, k, v, layout, kv_lens, block_n)
    qkv = preprocess_int4_cuda(
        q, k, v, layout=layout, kv_lens=kv_lens, block_n=block_n, smooth_k=smooth_k, smooth_v=smooth_v,
        p_mode=p_mode, path=path, smooth_q=smooth_q, sm_scale=sm_scale,
    )
    return attention_int4_quantized(
        qkv, n_q=qn, n_kv=kn, head_dim=qd, block_n=block_n, kv_lens=kv_lens, sm_scale=sm_scale, p_mode=p_mode,
        path=path, out_dtype=q.dtype, layout=layout,
    )


def int8fp8_path_for(cap: tuple[int, int], path: str | None = None) -> str:
    """The int8-fp8 kernel that runs on compute capability ``cap``: ``path`` (``"wgmma"`` or ``"mma"``) if it runs
    there, ``None`` -> the arch table's default (``"wgmma"`` on sm90, ``"mma"`` on sm89); ValueError naming why not."""
    if path is not None and path not in INT8FP8_PATHS:
        raise ValueError(f"path: expected one of {INT8FP8_PATHS} or None (arch default) for int8-fp8, got {path!r}")
    entry = ARCH_TABLE.get(cap)
    kernels = entry.int8fp8 if entry is not None else ()
    where = f"sm{cap[0]}{cap[1]}"
    if not kernels:
        raise ValueError(
            f"recipe: the int8-fp8 CUDA kernels need an sm89 (mma.sync e4m3) or sm90 (Hopper) GPU, this is {where}"
        )
    if path is None:
        return kernels[0]
    if path not in kernels:
        raise ValueError(f"path: the int8-fp8 kernel {path!r} does not run on {where} (there: {kernels})")
    return path


def _check_int8fp8_device(device: torch.device, path: str | None = None) -> str:
    """The int8-fp8 kernel for ``device`` (:func:`int8fp8_path_for`); ValueError off a suitable CUDA GPU."""
    if device.type != "cuda":
        raise ValueError(f"recipe: the int8-fp8 CUDA kernels need an sm89 or sm90 GPU, this is {device}")
    arch_entry(device)
    return int8fp8_path_for(_capability(device), path)


def preprocess_int8fp8_cuda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    layout: str = "BHND",
    kv_lens: torch.Tensor | None = None,
    smooth_k: bool = True,
    smooth_v: bool = False,
    rope: GeneralizedRopeTable | None = None,
) -> KernelQKV:
    """Pre-processing of the int8-fp8 recipe on an sm89 / sm90 GPU (the same operands for both kernels): K/V
    smoothing, INT8 Q per token and K per group of 32 keys per 128-key block, per-channel FP8 V.

    ``rope``: a generalized RoPE table (:func:`rotvid.rope.fused_table.fuse_rope_and_rotation`) shared by the heads
    ([N, D, 4]); Q and K are then RoPE·R-rotated inside the pre-processing (Q rotated and quantized in one pass, K
    rotated into a scratch tensor that the statistics and quantize launches read), with the bits of
    ``preprocess_int8fp8_cuda(apply_generalized_rope(q, rope), apply_generalized_rope(k, rope), v)`` and without
    Q's separate RoPE·R pass and its re-read (:func:`rope_fusion_unsupported` says when it applies). A ``hadamard``
    table (the ``full`` rotation) is applied with its Walsh–Hadamard transform, in registers after the table.

    Inputs as :func:`preprocess_int4_cuda`. Returns a :class:`KernelQKV` whose ``k_scale`` holds the K group
    scales fp32 [B, H, Nkv_pad / 128, 4] (:func:`rotvid.kernels.quantize.quantize_k_groups_int8`), ``vt`` the e4m3 bytes of V̂
    (s8 V^T layout, ``Nkv_pad`` a multiple of 128) and whose ``vparams`` is ``v_scale`` fp32 [B, H, D]
    (= amax / 448 over the valid tokens, 1 for an all-zero channel). Equal to the reference's quantizers
    (:func:`~rotvid.kernels.quantize.quantize_per_token_int8`, :func:`~rotvid.kernels.quantize.quantize_k_groups_int8`,
    :func:`~rotvid.kernels.quantize.quantize_per_channel_fp8`).

    Runs as one memset, one statistics launch over K and V (a second one when ``smooth_v``) and one quantize launch
    over the Q, K and V tiles (``csrc/preprocess_int8fp8.cu``).
    """
    _check_inputs(q, k, v, layout, kv_lens, INT8FP8_BLOCK_N)
    _check_int8fp8_device(q.device)
    coef = index = None
    if rope is not None:
        reason = rope_fusion_unsupported(q, k, rope, layout=layout)
        if reason:
            raise ValueError(f"rope: {reason}")
        coef = rope.coef.to(device=q.device, dtype=torch.float32).contiguous()
        index = rope.index.to(device=q.device, dtype=torch.int32).contiguous()
    out = _int8fp8_preprocess_op(
        q, k, v, _kv_lens_int32(kv_lens, q.device), layout == "BNHD", smooth_k, smooth_v, coef, index,
        rope is not None and bool(rope.hadamard),
    )
    return KernelQKV(*out)


def rope_fusion_unsupported(q: torch.Tensor, k: torch.Tensor, rope, *, layout: str = "BHND") -> str:
    """Why the int8-fp8 pre-processing cannot apply ``rope`` itself ("" when it can): a table shared by the heads
    ([N, D, 4], N = the queries = the keys), head_dim 64 or 128, rows on 16-byte boundaries. Shapes and strides
    only (a constant of a compiled graph)."""
    nq, d = (q.shape[2] if layout == "BHND" else q.shape[1]), q.shape[3]
    nk = k.shape[2] if layout == "BHND" else k.shape[1]
    coef = getattr(rope, "coef", None)
    if coef is None or getattr(rope, "index", None) is None:
        return f"expected a GeneralizedRopeTable, got {type(rope).__name__}"
    if coef.dim() != 3:
        return f"a per-head table {tuple(coef.shape)} (the pre-processing takes one table [N, D, 4] for all heads)"
    if tuple(coef.shape) != (nq, d, 4) or nq != nk:
        return f"a table of shape {tuple(coef.shape)} for {nq} queries and {nk} keys of head_dim {d} (expected ({nq}, {d}, 4) and N_q == N_kv)"
    if d not in ROPE_HEAD_DIMS:
        return f"head_dim {d} (RoPE·R in the pre-processing takes {ROPE_HEAD_DIMS})"
    if any(st % 8 for t in (q, k) for st in t.stride()[:3]):
        return "strides that are not multiples of 8 elements (rows not 16-byte aligned)"
    return ""


def attention_int8fp8_quantized(
    qkv: KernelQKV,
    *,
    n_q: int,
    n_kv: int,
    head_dim: int,
    kv_lens: torch.Tensor | None = None,
    sm_scale: float | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    layout: str = "BHND",
    out: torch.Tensor | None = None,
    path: str | None = None,
    split_tail: bool = True,
) -> torch.Tensor:
    """The int8-fp8 attention kernel (sm89 / sm90) on operands from :func:`preprocess_int8fp8_cuda`.

    Returns [B, H, n_q, head_dim] (``"BHND"``) or [B, n_q, H, head_dim] (``"BNHD"``) in ``out_dtype``;
    ``out``: an optional preallocated output written in place (tests poison it first). ``path``: ``"wgmma"``
    (sm90) or ``"mma"`` (mma.sync, sm89 and sm90); None: the arch default (:func:`int8fp8_path_for`).
    ``split_tail`` (wgmma path): the query tiles of a last, partial wave of SMs run split over the keys (2-4 CTAs
    each, merged by a second kernel), as the INT4 kernel's -- same maths, fp32 summation order of O and l changed
    for those rows only; False keeps every row's order.
    """
    _check_output_args(out_dtype, head_dim, layout)
    path = _check_int8fp8_device(qkv.q_hat.device, path)
    check_sm_scale(sm_scale)
    sm_scale = head_dim**-0.5 if sm_scale is None else sm_scale
    args = (
        qkv.q_hat, qkv.q_scale, qkv.k_hat, qkv.k_scale, qkv.vt, qkv.vparams, qkv.v_mean,
        _kv_lens_int32(kv_lens, qkv.q_hat.device), n_q, n_kv, head_dim, float(sm_scale * LOG2E),
        out_dtype == torch.bfloat16, layout == "BNHD",
    )
    if out is None:
        return _int8fp8_attention_op(*args, path, bool(split_tail))
    if out.dtype != out_dtype:
        raise ValueError(f"out: expected dtype {out_dtype}, got {out.dtype}")
    load_extension(qkv.q_hat.device).attention_int8fp8(*args, out, path == "mma", bool(split_tail))
    return out


def int8fp8_attention_cuda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    layout: str = "BHND",
    kv_lens: torch.Tensor | None = None,
    sm_scale: float | None = None,
    smooth_k: bool = True,
    smooth_v: bool = False,
    path: str | None = None,
    rope: GeneralizedRopeTable | None = None,
) -> torch.Tensor:
    """Pre-processing + int8-fp8 attention on an sm89 / sm90 GPU (``path`` as :func:`attention_int8fp8_quantized`,
    ``rope``: RoPE·R applied to q and k inside the pre-processing, as :func:`preprocess_int8fp8_cuda`); output has
    q's shape, layout and dtype."""
    qb, qh, qn, qd, kn = _check_inputs(q, k, v, layout, kv_lens, INT8FP8_BLOCK_N)
    path = _check_int8fp8_device(q.device, path)
    qkv = preprocess_int8fp8_cuda(
        q, k, v, layout=layout, kv_lens=kv_lens, smooth_k=smooth_k, smooth_v=smooth_v, rope=rope
    )
    return attention_int8fp8_quantized(
        qkv, n_q=qn, n_kv=kn, head_dim=qd, kv_lens=kv_lens, sm_scale=sm_scale, out_dtype=q.dtype, layout=layout,
        path=path,
    )


# --------------------------------------------------------------------------------------------
# Packing the reference's quantized operands into the kernel layout (for tests)


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


def _pack_nibbles(x: torch.Tensor) -> torch.Tensor:
    """int8 values in [-8, 7] along the last dim -> bytes, element 2c in the low nibble of byte c."""
    lo = x[..., 0::2].to(torch.int32) & 0xF
    hi = x[..., 1::2].to(torch.int32) & 0xF
    return (lo | (hi << 4)).to(torch.uint8).view(torch.int8)


def _pad_rows(x: torch.Tensor, n_pad: int) -> torch.Tensor:
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
    nq_pad, nkv_pad = _pads(n_q, n_kv, qkv.block_n)
    q_hat = _pad_rows(qkv.q_hat, nq_pad)
    k_hat = _pad_rows(qkv.k_hat, nkv_pad)
    q_scale = _pad_rows(qkv.q_scale.float(), nq_pad).reshape(b, h, nq_pad)
    k_scale = _pad_rows(qkv.k_scale.float(), nkv_pad).reshape(b, h, nkv_pad)
    v_hat = qkv.v_hat  # [B, H, Nkv_pad, D]
    if v_hat.shape[2] != nkv_pad:
        raise ValueError(f"qkv.v_hat: expected {nkv_pad} (padded) keys, got {v_hat.shape[2]}")
    perm = vt_key_permutation(nkv_pad, path, device=v_hat.device)
    vt = v_hat.transpose(2, 3)[..., perm].contiguous()
    if path == "s4":
        q_hat, k_hat, vt = _pack_nibbles(q_hat), _pack_nibbles(k_hat), _pack_nibbles(vt)
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
        k_bias = _pad_rows(ds.transpose(-1, -2), nkv_pad).reshape(b, h, nkv_pad).contiguous()
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
    nq_pad, nkv_pad = _pads(n_q, n_kv, INT8FP8_BLOCK_N)
    q_hat, q_scale = quantize_per_token_int8(q_s)
    k_hat, _, k_groups = quantize_k_groups_int8(k_s, kv_lens)
    valid = key_valid_mask(n_kv, kv_lens, b, v.device)
    v_q, v_scale = quantize_per_channel_fp8(v_s, valid)
    v8 = _pad_rows(v_q.to(torch.float8_e4m3fn).view(torch.int8), nkv_pad)
    perm = vt_key_permutation(nkv_pad, "s8", device=v.device)
    vt = v8.transpose(2, 3)[..., perm].contiguous()
    v_mean_t = (
        v_mean.float().reshape(b, h, d).contiguous()
        if v_mean is not None
        else torch.empty(0, dtype=torch.float32, device=q.device)
    )
    return KernelQKV(
        _pad_rows(q_hat, nq_pad),
        _pad_rows(q_scale.float(), nq_pad).reshape(b, h, nq_pad).contiguous(),
        _pad_rows(k_hat, nkv_pad),
        k_groups.float().contiguous(),
        vt,
        v_scale.float().reshape(b, h, d).contiguous(),
        v_mean_t,
    )


# --------------------------------------------------------------------------------------------
# RoPE·R by the generalized table (rope_table.cu)

ROPE_HEAD_DIMS = (64, 128)


@torch.library.custom_op("rotvid::generalized_rope", mutates_args=())
def _generalized_rope_op(x: torch.Tensor, coef: torch.Tensor, index: torch.Tensor, hadamard: bool) -> torch.Tensor:
    return load_extension(x.device).generalized_rope(x, coef, index, None, hadamard)


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
    return _device_problem(index, False) or _extension_problem(index)


_EXTENSION_PROBLEMS: dict[int, str] = {}


@torch.compiler.assume_constant_result
def _extension_problem(device_index: int) -> str:
    """"" when the extension builds and loads for GPU ``device_index``, else why not (once per process and GPU;
    under torch.compile a constant of the graph). The RoPE·R callers fall back to the Triton kernel on a failure
    instead of failing a run that needs no quantized kernel."""
    if device_index not in _EXTENSION_PROBLEMS:
        try:
            load_extension(torch.device("cuda", device_index))
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


# --------------------------------------------------------------------------------------------
# The dispatcher backend


@torch.compiler.assume_constant_result
def _device_problem(device_index: int, int8fp8: bool) -> str:
    """Why the CUDA kernels cannot run on GPU ``device_index`` ("" when they can): compute capability in the arch
    table, nvcc found, and for ``int8fp8`` an int8-fp8 kernel for it (sm89, sm90). Host facts that do not change
    during a run: under torch.compile this runs once while tracing and its result is a constant of the graph (no
    file-system probe, no device query in the graph)."""
    device = torch.device("cuda", device_index)
    try:
        entry = arch_entry(device)
        _nvcc()
    except RuntimeError as err:
        return str(err)
    if int8fp8 and not entry.int8fp8:
        cap = _capability(device)
        return (
            f"recipe 'int8-fp8' has CUDA kernels on sm89 (mma.sync e4m3) and sm90 (wgmma) only, this is sm{cap[0]}{cap[1]}"
        )
    return ""


class CudaBackend:
    """``backend="cuda"`` of :func:`rotvid.kernels.attention`: the INT4 recipes, and int8-fp8 on sm89 / sm90, on the
    GPU (int8-fp8 with the arch default kernel: wgmma on sm90, mma.sync on sm89)."""

    name = "cuda"

    def availability(self) -> str:
        try:
            entry = arch_entry()
            _nvcc()
        except RuntimeError as err:
            return str(err)
        kernels = f"{entry.path} path" + (", wgmma kernel (default)" if entry.wgmma else "")
        kernels += f", block_n {default_block_n()} by default"
        if entry.int8fp8:
            kernels += f"; int8-fp8 kernels {'/'.join(entry.int8fp8)} ({entry.int8fp8[0]} by default, block_n 128)"
            if not entry.wgmma:
                kernels += ", the mma.sync kernel's speed on Ada unmeasured"
        return f"available ({kernels})"

    def unsupported_reason(self, q, k, v, *, recipe="int4", layout="BHND", kv_lens=None, **opts) -> str | None:
        if recipe not in RECIPE_P_MODE and recipe != INT8FP8_RECIPE:
            return f"recipe {recipe!r} has no CUDA kernel (supported: {', '.join((*RECIPE_P_MODE, INT8FP8_RECIPE))})"
        if not torch.cuda.is_available():
            return "no CUDA GPU (torch.cuda.is_available() is False)"
        if not q.is_cuda:
            return f"inputs are on {q.device}, not a CUDA device"
        index = q.device.index if q.device.index is not None else torch.cuda.current_device()
        problem = _device_problem(index, recipe == INT8FP8_RECIPE)
        if problem:
            return problem
        if q.dtype not in SUPPORTED_DTYPES:
            return f"dtype {q.dtype} (the kernel takes float16 or bfloat16)"
        d = q.shape[-1]
        if d not in SUPPORTED_HEAD_DIMS:
            return f"head_dim {d} (the kernel takes {SUPPORTED_HEAD_DIMS})"
        if opts.get("smooth_q") and recipe == INT8FP8_RECIPE:
            return "smooth_q=True with int8-fp8 (its kernels do not smooth Q; the INT4 kernels do)"
        if opts.get("smooth_q") and opts.get("q_block") is not None:
            return f"q_block={opts['q_block']} (the kernels smooth Q with one mean per head: q_block=None)"
        bm, bn = opts.get("block_m"), opts.get("block_n")
        if bm is not None and bm != BLOCK_M:
            return f"block_m={bm} (the kernel uses {BLOCK_M})"
        if bn is not None and bn not in SUPPORTED_BLOCK_N:
            return f"block_n={bn} (the kernel takes {SUPPORTED_BLOCK_N})"
        if recipe == INT8FP8_RECIPE and bn is not None and bn != INT8FP8_BLOCK_N:
            return f"block_n={bn} (the int8-fp8 kernel uses {INT8FP8_BLOCK_N})"
        if any(t.stride(-1) != 1 for t in (q, k, v)):
            return "a non-contiguous head_dim (stride(-1) != 1)"
        if any(st % 8 for t in (q, k, v) for st in t.stride()[:3]):
            return "strides that are not multiples of 8 elements (rows not 16-byte aligned)"
        if not torch.compiler.is_compiling() and any(t.data_ptr() % 16 for t in (q, k, v)):
            # (no data pointers while tracing; the extension checks the alignment again)
            return "a data pointer that is not 16-byte aligned"
        return None

    def fuses_rope(self, q, k, rope, *, recipe="int4", layout="BHND") -> bool:
        """True when :meth:`run` applies ``rope`` (RoPE·R) inside its pre-processing: the int8-fp8 recipe with a
        table :func:`rope_fusion_unsupported` accepts. (The dispatcher rotates q and k first otherwise.)"""
        return recipe == INT8FP8_RECIPE and not rope_fusion_unsupported(q, k, rope, layout=layout)

    def run(self, q, k, v, *, recipe="int4", layout="BHND", kv_lens=None, sm_scale=None, smooth_k=True,
            smooth_q=False, smooth_v=False, block_m=None, block_n=None, q_block=None, rope=None) -> torch.Tensor:
        why = self.unsupported_reason(q, k, v, recipe=recipe, layout=layout, kv_lens=kv_lens, smooth_q=smooth_q,
                                      block_m=block_m, block_n=block_n, q_block=q_block)
        if why is not None:
            raise ValueError(f"backend: 'cuda' cannot run this call: {why}")
        if rope is not None and not self.fuses_rope(q, k, rope, recipe=recipe, layout=layout):
            raise ValueError(f"rope: the CUDA backend cannot apply it in the pre-processing of recipe {recipe!r} "
                             "(rotate q and k first: rotvid.rope.fused_table.apply_generalized_rope)")
        if recipe == INT8FP8_RECIPE:
            return int8fp8_attention_cuda(
                q, k, v, layout=layout, kv_lens=kv_lens, sm_scale=sm_scale, smooth_k=smooth_k, smooth_v=smooth_v,
                rope=rope,
            )
        return int4_attention_cuda(
            q, k, v, layout=layout, kv_lens=kv_lens, sm_scale=sm_scale, p_mode=RECIPE_P_MODE[recipe],
            smooth_k=smooth_k, smooth_v=smooth_v, block_n=block_n, smooth_q=smooth_q,
        )


def _register() -> None:
    from rotvid.kernels.dispatch import register_backend

    register_backend("cuda", CudaBackend())


_register()
