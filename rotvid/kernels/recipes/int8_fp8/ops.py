"""The int8-fp8 recipe's CUDA kernels: custom ops ``rotvid::int8fp8_preprocess`` and ``rotvid::int8fp8_attention``
with their fake (shape-only) implementations, and the public functions on them.

The ``int8-fp8`` recipe: INT8 Q per token and K per group of 32 keys per 128-key block (the keys one thread
holds: one scale per thread and row), P and V in FP8 e4m3 (V one scale per channel, applied with 1/l in the
epilogue), key blocks of 128; operands from :func:`preprocess_int8fp8_cuda` (``vt`` holds e4m3 bytes in the
s8 V^T layout, ``vparams`` is ``v_scale`` fp32 [B, H, D]). Two kernels of the same numerics (:func:`int8fp8_kernels`
says where each runs; the sources are in ``csrc/`` beside this module):

* ``"wgmma"`` (sm90, the default there; the shared Hopper skeleton ``rotvid/kernels/csrc/hopper/hopper_attention.cuh``
  with the numerics of ``csrc/hopper_int8fp8_numerics.cuh``): s8 and e4m3 wgmma, TMA.
* ``"mma"`` (sm89 and sm90; ``csrc/mma_numerics_int8fp8.cuh``): ``mma.sync.m16n8k32`` s8 for QKᵀ and e4m3 for
  P·V (e4m3 mma.sync needs sm89) -- the Ada kernel, testable on an H100 with ``path="mma"``. Its speed on Ada is
  unmeasured (no Ada GPU was available).

A block map (``block_map=``, :class:`~rotvid.kernels.sparsity.BlockMap`) runs on both kernels: each query tile
visits only its row's key blocks (the skipped ones are never loaded), with the numerics of
:func:`rotvid.kernels.recipes.int8_fp8.reference.attention_int8fp8_from_quantized` under the same map.

The log-sum-exp (``return_lse=True``; the ``"wgmma"`` kernel only, op ``rotvid::int8fp8_attention_lse``): the kernel
writes ``ln 2 · (m + log2(l) - log2 448)`` per row from its online softmax (``l`` sums ``448 p``; a row that attends
no key: ``-inf``; ``csrc/hopper_int8fp8_numerics.cuh``) into an fp32 [B, H, N_q] tensor that is passed only when
asked (the default call passes none and its kernel path is unchanged). That is the LSE of the smoothed K̂'s scores;
:func:`int8fp8_attention_cuda` adds K smoothing's shift ``sm_scale · q·mean(k)`` (:func:`k_smoothing_shift`: one
fp32 pass over q and k in torch), giving the LSE of the unsmoothed scores that ring attention merges
(:mod:`rotvid.kernels.reference`).

The online V/O Hadamard inside the call (``v_hadamard=True``; :func:`v_hadamard_fusion_unsupported` says when it
applies: the block is the head_dim): the pre-processing transforms every V row right after loading it, in both the
statistics and the quantize launch, with the bits of :func:`rotvid.rope.hadamard.rotate_v_online` (so its operands are
those of ``preprocess_int8fp8_cuda(q, k, rotate_v_online(v, D))``), and at head_dim 128 (:data:`O_EPILOGUE_HEAD_DIMS`)
the attention kernel turns each output row back in its epilogue (or its split combine; ``o_hadamard``): the butterflies
of :func:`rotvid.rope.hadamard.unrotate_o_online` on the row in float32, then one rounding -- where the PyTorch path
rounds the rotated output first, so the two differ by that rounding; at head_dim 64 one pass over the output does
(:func:`rotvid.kernels.hadamard_op.vo_hadamard_cuda`: the PyTorch path's bits). Off (the default) the pre-processing
kernels are those of before, instruction for instruction (their ``V_HADAMARD = false`` instantiations), and the
attention kernels' output bits are unchanged (``AttnParams.o_hadamard`` 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rotvid.kernels import cuda_build
from rotvid.kernels.cuda_layout import (
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
from rotvid.kernels.hadamard_op import vo_hadamard_cuda
from rotvid.kernels.quantize import key_valid_mask, quantize_per_channel_fp8, quantize_per_token_int8
from rotvid.kernels.recipes.int8_fp8.reference import INT8FP8_BLOCK_N, quantize_k_groups_int8
from rotvid.kernels.reference import LOG2E, check_sm_scale, smooth_qkv, to_bhnd
from rotvid.kernels.rope_op import ROPE_HEAD_DIMS
from rotvid.kernels.sparsity.block_map import BlockMap

if TYPE_CHECKING:
    from rotvid.rope.fused_table import GeneralizedRopeTable

INT8FP8_PATHS = ("wgmma", "mma")
# Head dims where a call with the online V/O Hadamard turns its output back in the attention kernel's epilogue; at
# the others (64) one pass over the output does (vo_hadamard_cuda): there the epilogue's transform cost the Hopper
# kernel 4.4% at CogVideoX-5B's shape, the pass 0.7% (RESULTS.md, the online V/O Hadamard). The head_dim-64 epilogue
# kernels stay built, reachable through attention_int8fp8_quantized(o_hadamard=True) (the tests and sanitizers run
# them).
O_EPILOGUE_HEAD_DIMS = (128,)


def int8fp8_kernels(entry: cuda_build.ArchEntry | None) -> tuple[str, ...]:
    """The int8-fp8 kernels that run on a GPU of arch-table row ``entry``, the default first: the wgmma kernel where
    the Hopper kernel is built (sm90a), the mma.sync one where the GPU has e4m3 mma.sync (sm89 and later); none
    elsewhere (``entry`` None: a GPU outside the arch table)."""
    if entry is None:
        return ()
    return (("wgmma",) if entry.wgmma else ()) + (("mma",) if entry.fp8_mma else ())


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
    v_hadamard: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    ext = cuda_build.load_extension(q.device)
    return tuple(
        ext.preprocess_int8fp8(q, k, v, kv_lens, bnhd, smooth_k, smooth_v, rope_coef, rope_index, rope_hadamard,
                               v_hadamard)
    )


@_int8fp8_preprocess_op.register_fake
def _(q, k, v, kv_lens, bnhd, smooth_k, smooth_v, rope_coef=None, rope_index=None, rope_hadamard=False,
      v_hadamard=False):
    b, h, n_q, d, n_kv = sizes_of(q, k, bnhd)
    nq_pad, nkv_pad = pads(n_q, n_kv, INT8FP8_BLOCK_N)
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
    map_index: torch.Tensor | None = None,
    map_count: torch.Tensor | None = None,
    o_hadamard: bool = False,
) -> torch.Tensor:
    ext = cuda_build.load_extension(q_hat.device)
    return ext.attention_int8fp8(
        q_hat, q_scale, k_hat, k_scale, vt, v_scale, v_mean, kv_lens, n_q, n_kv, head_dim, qk_scale, out_bf16, bnhd, None,
        path == "mma", split_tail, map_index, map_count, None, o_hadamard,
    )


@_int8fp8_attention_op.register_fake
def _(q_hat, q_scale, k_hat, k_scale, vt, v_scale, v_mean, kv_lens, n_q, n_kv, head_dim, qk_scale, out_bf16, bnhd,
      path, split_tail, map_index=None, map_count=None, o_hadamard=False):
    return empty_attention_output(q_hat, n_q, head_dim, out_bf16, bnhd)


@torch.library.custom_op("rotvid::int8fp8_attention_lse", mutates_args=())
def _int8fp8_attention_lse_op(
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
    split_tail: bool,
    map_index: torch.Tensor | None = None,
    map_count: torch.Tensor | None = None,
    o_hadamard: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rotvid::int8fp8_attention`` on the wgmma kernel with each row's log-sum-exp: ``(out, lse)``, ``lse`` fp32
    [B, H, n_q] of the operands' scores (module docstring)."""
    ext = cuda_build.load_extension(q_hat.device)
    lse = torch.empty((q_hat.shape[0], q_hat.shape[1], n_q), dtype=torch.float32, device=q_hat.device)
    out = ext.attention_int8fp8(
        q_hat, q_scale, k_hat, k_scale, vt, v_scale, v_mean, kv_lens, n_q, n_kv, head_dim, qk_scale, out_bf16, bnhd,
        None, False, split_tail, map_index, map_count, lse, o_hadamard,
    )
    return out, lse


@_int8fp8_attention_lse_op.register_fake
def _(q_hat, q_scale, k_hat, k_scale, vt, v_scale, v_mean, kv_lens, n_q, n_kv, head_dim, qk_scale, out_bf16, bnhd,
      split_tail, map_index=None, map_count=None, o_hadamard=False):
    return (empty_attention_output(q_hat, n_q, head_dim, out_bf16, bnhd),
            q_hat.new_empty((q_hat.shape[0], q_hat.shape[1], n_q), dtype=torch.float32))


def k_smoothing_shift(q: torch.Tensor, k: torch.Tensor, kv_lens: torch.Tensor | None, sm_scale: float) -> torch.Tensor:
    """K smoothing's shift of each row's scores, ``sm_scale · q·mean(k)`` fp32 [B, H, N_q] (q, k in (B, H, N, D)
    order, any strides; ``mean(k)`` over the valid keys), what :func:`int8fp8_attention_cuda` adds to the kernel's
    LSE: :func:`rotvid.kernels.reference.k_smoothing_lse_shift` without its float64 copy of k (fp32 sums; they differ
    from the pre-processing's float64 mean by ~1e-7 relative, an LSE difference far below the recipe's own)."""
    n = k.shape[2]
    if kv_lens is None:
        mean = k.sum(dim=2, dtype=torch.float32) / n
    else:
        valid = torch.arange(n, device=k.device)[None, :] < kv_lens.to(k.device)[:, None]  # [B, N]
        count = valid.sum(dim=1).clamp_min(1).to(torch.float32)[:, None, None]
        mean = (k * valid[:, None, :, None].to(k.dtype)).sum(dim=2, dtype=torch.float32) / count
    return torch.matmul(q.float(), mean.unsqueeze(-1)).squeeze(-1) * sm_scale



def int8fp8_path_for(cap: tuple[int, int], path: str | None = None) -> str:
    """The int8-fp8 kernel that runs on compute capability ``cap``: ``path`` (``"wgmma"`` or ``"mma"``) if it runs
    there, ``None`` -> the arch table's default (``"wgmma"`` on sm90, ``"mma"`` on sm89); ValueError naming why not."""
    if path is not None and path not in INT8FP8_PATHS:
        raise ValueError(f"path: expected one of {INT8FP8_PATHS} or None (arch default) for int8-fp8, got {path!r}")
    kernels = int8fp8_kernels(cuda_build.ARCH_TABLE.get(cap))
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
    cuda_build.arch_entry(device)
    return int8fp8_path_for(cuda_build.capability(device), path)


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
    v_hadamard: bool = False,
) -> KernelQKV:
    """Pre-processing of the int8-fp8 recipe on an sm89 / sm90 GPU (the same operands for both kernels): K/V
    smoothing, INT8 Q per token and K per group of 32 keys per 128-key block, per-channel FP8 V.

    ``rope``: a generalized RoPE table (:func:`rotvid.rope.fused_table.fuse_rope_and_rotation`) shared by the heads
    ([N, D, 4]); Q and K are then RoPE·R-rotated inside the pre-processing (Q rotated and quantized in one pass, K
    rotated into a scratch tensor that the statistics and quantize launches read), with the bits of
    ``preprocess_int8fp8_cuda(apply_generalized_rope(q, rope), apply_generalized_rope(k, rope), v)`` and without
    Q's separate RoPE·R pass and its re-read (:func:`rope_fusion_unsupported` says when it applies). A ``hadamard``
    table (the ``full`` rotation) is applied with its Walsh–Hadamard transform, in registers after the table.

    ``v_hadamard``: V's side of the online V/O Hadamard with the block = head_dim, applied to each V row as it is
    read: the operands of ``preprocess_int8fp8_cuda(q, k, rotate_v_online(v, D))`` bit for bit
    (:func:`rotvid.rope.hadamard.rotate_v_online`; the module docstring).

    Inputs as :func:`rotvid.kernels.recipes.int4.ops.preprocess_int4_cuda`. Returns a :class:`KernelQKV` whose
    ``k_scale`` holds the K group scales fp32 [B, H, Nkv_pad / 128, 4]
    (:func:`rotvid.kernels.recipes.int8_fp8.reference.quantize_k_groups_int8`), ``vt`` the e4m3 bytes of V̂ (s8 V^T
    layout, ``Nkv_pad`` a multiple of 128) and whose ``vparams`` is ``v_scale`` fp32 [B, H, D] (= amax / 448 over the
    valid tokens, 1 for an all-zero channel). Equal to the reference's quantizers
    (:func:`~rotvid.kernels.quantize.quantize_per_token_int8`,
    :func:`~rotvid.kernels.recipes.int8_fp8.reference.quantize_k_groups_int8`,
    :func:`~rotvid.kernels.quantize.quantize_per_channel_fp8`).

    Runs as one memset, one statistics launch over K and V (a second one when ``smooth_v``) and one quantize launch
    over the Q, K and V tiles (``csrc/preprocess_int8fp8.cu``).
    """
    check_inputs(q, k, v, layout, kv_lens, INT8FP8_BLOCK_N)
    _check_int8fp8_device(q.device)
    _check_rope_fusion(q, k, rope, layout)
    return _preprocess_int8fp8(q, k, v, layout, kv_lens, smooth_k, smooth_v, rope, v_hadamard)


def _check_rope_fusion(q, k, rope, layout: str) -> None:
    if rope is not None:
        reason = rope_fusion_unsupported(q, k, rope, layout=layout)
        if reason:
            raise ValueError(f"rope: {reason}")


def _preprocess_int8fp8(q, k, v, layout, kv_lens, smooth_k, smooth_v, rope, v_hadamard) -> KernelQKV:
    """:func:`preprocess_int8fp8_cuda` without its checks (inputs checked, ``rope`` one it fuses, or None)."""
    coef = index = None
    if rope is not None:
        coef = rope.coef.to(device=q.device, dtype=torch.float32).contiguous()
        index = rope.index.to(device=q.device, dtype=torch.int32).contiguous()
    out = _int8fp8_preprocess_op(
        q, k, v, kv_lens_int32(kv_lens, q.device), layout == "BNHD", smooth_k, smooth_v, coef, index,
        rope is not None and bool(rope.hadamard), bool(v_hadamard),
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


def v_hadamard_fusion_unsupported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int, *,
                                  layout: str = "BHND") -> str:
    """Why the int8-fp8 pre-processing cannot apply V's side of the online V/O Hadamard of ``block`` itself ("" when
    it can): it transforms whole rows, so the block must be the head_dim (64 or 128; a smaller block, e.g. of a head
    dim that is not a power of two, runs in PyTorch). Shapes only (a constant of a compiled graph); the call's other
    conditions are the kernel's own checks."""
    d = v.shape[-1]
    if d not in ROPE_HEAD_DIMS:
        return f"head_dim {d} (the pre-processing's V rotation takes {ROPE_HEAD_DIMS})"
    if block != d:
        return f"block {block} (the pre-processing rotates whole rows: block = head_dim {d})"
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
    block_map: BlockMap | None = None,
    return_lse: bool = False,
    o_hadamard: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The int8-fp8 attention kernel (sm89 / sm90) on operands from :func:`preprocess_int8fp8_cuda`.

    Returns [B, H, n_q, head_dim] (``"BHND"``) or [B, n_q, H, head_dim] (``"BNHD"``) in ``out_dtype``;
    ``out``: an optional preallocated output written in place (tests poison it first). ``path``: ``"wgmma"``
    (sm90) or ``"mma"`` (mma.sync, sm89 and sm90); None: the arch default (:func:`int8fp8_path_for`).
    ``split_tail`` (wgmma path): the query tiles of a last, partial wave of SMs run split over the keys (2-4 CTAs
    each, merged by a second kernel), as the INT4 kernel's -- same maths, fp32 summation order of O and l changed
    for those rows only; False keeps every row's order (with a map too: a split takes an even share of its row's
    kept blocks).
    ``block_map``: the key blocks each query tile visits (:class:`~rotvid.kernels.sparsity.BlockMap` for ``n_q``
    queries and ``n_kv`` keys on the operands' device; both paths): a skipped block is a block of
    ``-inf`` scores, and a query tile that keeps no block before ``kv_lens`` gives 0 (no V mean). Its values are
    not checked here (:meth:`BlockMap.check`; the dispatcher checks them in eager mode).
    ``return_lse`` (the ``"wgmma"`` path): ``(out, lse)`` with ``lse`` fp32 [B, H, n_q], each row's log-sum-exp of the
    operands' scores (of the smoothed K̂: module docstring; ``-inf`` for a row that attends no key).
    ``o_hadamard``: the online V/O Hadamard's inverse on each output row, in the kernel's epilogue (for operands whose
    V the pre-processing rotated, ``v_hadamard=True``: the output is then the attention of the un-rotated V).
    """
    check_output_args(out_dtype, head_dim, layout)
    path = _check_int8fp8_device(qkv.q_hat.device, path)
    if return_lse and path != "wgmma":
        raise ValueError(f"return_lse: the int8-fp8 {path!r} kernel returns no log-sum-exp (the sm90 wgmma one does)")
    sm_scale, map_index, map_count = scale_and_map_operands(qkv, n_q=n_q, n_kv=n_kv, head_dim=head_dim,
                                                            sm_scale=sm_scale, block_map=block_map)
    args = _attention_args(qkv, n_q, n_kv, head_dim, kv_lens, sm_scale, out_dtype, layout)
    if out is None:
        return _attend_int8fp8(args, path, split_tail, map_index, map_count, return_lse, o_hadamard)
    if out.dtype != out_dtype:
        raise ValueError(f"out: expected dtype {out_dtype}, got {out.dtype}")
    b, h = qkv.q_hat.shape[:2]
    lse = torch.empty((b, h, n_q), dtype=torch.float32, device=out.device) if return_lse else None
    cuda_build.load_extension(qkv.q_hat.device).attention_int8fp8(*args, out, path == "mma", bool(split_tail),
                                                                  map_index, map_count, lse, bool(o_hadamard))
    return (out, lse) if return_lse else out


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
    block_map: BlockMap | None = None,
    return_lse: bool = False,
    v_hadamard: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Pre-processing + int8-fp8 attention on an sm89 / sm90 GPU (``path`` and ``block_map`` as
    :func:`attention_int8fp8_quantized`, ``rope``: RoPE·R applied to q and k inside the pre-processing, as
    :func:`preprocess_int8fp8_cuda`); output has q's shape, layout and dtype. ``v_hadamard``: the online V/O
    Hadamard inside the call -- V rotated by the pre-processing (:func:`preprocess_int8fp8_cuda`), the output turned
    back in the kernel's epilogue at head_dim 128 (``o_hadamard`` of :func:`attention_int8fp8_quantized`), by one
    pass at 64: the attention of ``v`` again, up to the rounding of the two transforms (the LSE does not depend on
    V).
    ``return_lse`` (the ``"wgmma"`` kernel): ``(out, lse)``, each row's log-sum-exp of the unsmoothed scores (the kernel's plus
    :func:`k_smoothing_shift`), [B, H, N_q] for ``"BHND"`` or [B, N_q, H] for ``"BNHD"``, fp32 -- the reference's
    convention (:mod:`rotvid.kernels.reference`). With ``rope`` the shift needs the rotated q and k: they are rotated
    first and the pre-processing runs without the table."""
    qb, qh, qn, qd, kn = check_inputs(q, k, v, layout, kv_lens, INT8FP8_BLOCK_N)
    path = _check_int8fp8_device(q.device, path)
    if return_lse and path != "wgmma":
        raise ValueError(f"return_lse: the int8-fp8 {path!r} kernel returns no log-sum-exp (the sm90 wgmma one does)")
    block_map_operands(block_map, batch=qb, heads=qh, n_q=qn, n_kv=kn, device=q.device)  # (before the pre-processing)
    if not return_lse:  # (with the LSE, q and k are rotated first: the pre-processing never sees the table)
        _check_rope_fusion(q, k, rope, layout)
    check_sm_scale(sm_scale)
    return int8fp8_attention_unchecked(q, k, v, layout=layout, kv_lens=kv_lens, sm_scale=sm_scale, smooth_k=smooth_k,
                                       smooth_v=smooth_v, path=path, rope=rope, block_map=block_map,
                                       return_lse=return_lse, v_hadamard=v_hadamard)


def int8fp8_attention_unchecked(q, k, v, *, layout="BHND", kv_lens=None, sm_scale=None, smooth_k=True, smooth_v=False,
                                path=None, rope=None, block_map=None, return_lse=False, v_hadamard=False):
    """:func:`int8fp8_attention_cuda` without its checks, the body a prepared call runs
    (:func:`rotvid.kernels.dispatch.prepare_attention` checked the inputs, the block map's values and the kernel
    entry's support checks once; the C++ side's TORCH_CHECKs still run): the same ops with the same arguments, so the
    same bits. ``path`` None: the arch default; ``rope`` one the pre-processing fuses, or None."""
    bhnd = layout == "BHND"
    qn, qd, kn = q.shape[2 if bhnd else 1], q.shape[3], k.shape[2 if bhnd else 1]
    if path is None:
        path = int8fp8_path_for(cuda_build.capability(q.device))
    if return_lse and rope is not None:
        from rotvid.kernels.rope_op import apply_generalized_rope

        q = apply_generalized_rope(to_bhnd(q, layout), rope)
        k = apply_generalized_rope(to_bhnd(k, layout), rope)
        if layout == "BNHD":
            q, k = q.transpose(1, 2), k.transpose(1, 2)
        rope = None
    qkv = _preprocess_int8fp8(q, k, v, layout, kv_lens, smooth_k, smooth_v, rope, v_hadamard)
    sm_scale = qd**-0.5 if sm_scale is None else sm_scale
    map_index, map_count = (None, None) if block_map is None else (block_map.indices.contiguous(),
                                                                   block_map.counts.contiguous())
    args = _attention_args(qkv, qn, kn, qd, kv_lens, sm_scale, q.dtype, layout)
    epilogue = bool(v_hadamard) and qd in O_EPILOGUE_HEAD_DIMS
    res = _attend_int8fp8(args, path, True, map_index, map_count, return_lse, epilogue)
    if v_hadamard and not epilogue:  # (head_dim 64: the output turned back by one pass)
        res = (vo_hadamard_cuda(res[0], qd, side="o"), res[1]) if return_lse else vo_hadamard_cuda(res, qd, side="o")
    if not return_lse:
        return res
    out, lse = res
    if smooth_k:  # the kernel's scores were of k - mean(k): add the shift back (rotvid.kernels.reference)
        lse = lse + k_smoothing_shift(to_bhnd(q, layout), to_bhnd(k, layout), kv_lens, sm_scale)
    return out, (lse if layout == "BHND" else lse.transpose(1, 2).contiguous())


def _attention_args(qkv: KernelQKV, n_q, n_kv, head_dim, kv_lens, sm_scale: float, out_dtype, layout) -> tuple:
    """The attention ops' leading arguments (``sm_scale`` resolved)."""
    return (
        qkv.q_hat, qkv.q_scale, qkv.k_hat, qkv.k_scale, qkv.vt, qkv.vparams, qkv.v_mean,
        kv_lens_int32(kv_lens, qkv.q_hat.device), n_q, n_kv, head_dim, float(sm_scale * LOG2E),
        out_dtype == torch.bfloat16, layout == "BNHD",
    )


def _attend_int8fp8(args: tuple, path: str, split_tail, map_index, map_count, return_lse: bool, o_hadamard):
    if return_lse:
        return _int8fp8_attention_lse_op(*args, bool(split_tail), map_index, map_count, bool(o_hadamard))
    return _int8fp8_attention_op(*args, path, bool(split_tail), map_index, map_count, bool(o_hadamard))


@torch.compiler.assume_constant_result
def int8fp8_returns_lse(device_index: int) -> bool:
    """Whether GPU ``device_index``'s int8-fp8 kernel returns the log-sum-exp (its arch default is the sm90 wgmma
    kernel); a constant of a compiled graph. Call after :func:`int8fp8_device_problem` found a kernel there."""
    return int8fp8_path_for(cuda_build.capability(torch.device("cuda", device_index))) == "wgmma"


@torch.compiler.assume_constant_result
def int8fp8_device_problem(device_index: int) -> str:
    """Why the int8-fp8 CUDA kernels cannot run on GPU ``device_index`` ("" when they can): the CUDA kernels' own
    conditions (:func:`rotvid.kernels.cuda_build.device_problem`), and an int8-fp8 kernel for its compute capability
    (sm89, sm90). A constant of a compiled graph, as that one."""
    problem = cuda_build.device_problem(device_index)
    if problem:
        return problem
    device = torch.device("cuda", device_index)
    if not int8fp8_kernels(cuda_build.arch_entry(device)):
        cap = cuda_build.capability(device)
        return (
            f"recipe 'int8-fp8' has CUDA kernels on sm89 (mma.sync e4m3) and sm90 (wgmma) only, this is sm{cap[0]}{cap[1]}"
        )
    return ""


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
