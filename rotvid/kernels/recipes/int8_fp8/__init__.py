"""``int8-fp8`` (SageAttention2-8b): INT8 Q per token and K per group of 32 keys per 128-key block (the keys one
kernel thread holds), P and V in FP8 e4m3 with V per channel and P scaled by 448, one FP32 buffer per key block.

CUDA kernels on sm89 (mma.sync e4m3) and sm90 (wgmma, the default there): :mod:`rotvid.kernels.recipes.int8_fp8.ops`;
they do not smooth Q and use key blocks of 128 on every backend (the reference's default for this recipe too, so a
fallback keeps their numerics). Their pre-processing can apply a RoPE·R table itself, and the online V/O Hadamard
(``v_hadamard``, the block = head_dim): V rotated in the pre-processing (the PyTorch function's bits), the output
turned back in the attention kernel's epilogue at head_dim 128 (by one pass inside the call at 64); the sm90 kernel
takes a block
map (block-sparse attention) and returns each row's log-sum-exp on request (``return_lse``: ring attention); the
sm89 one refuses that.
"""

from __future__ import annotations

from functools import partial

from rotvid.kernels import cuda_build, cuda_checks
from rotvid.kernels.recipes.base import KernelEntry, Recipe, RecipeLabels
from rotvid.kernels.recipes.int8_fp8.ops import (
    int8fp8_attention_cuda,
    int8fp8_attention_unchecked,
    int8fp8_device_problem,
    int8fp8_kernels,
    int8fp8_returns_lse,
    rope_fusion_unsupported,
    v_hadamard_fusion_unsupported,
)
from rotvid.kernels.recipes.int8_fp8.reference import INT8FP8_BLOCK_N, fp8_block_pv, int8fp8_operands
from rotvid.kernels.reference import attention_blockwise

NAME = "int8-fp8"
# Measured side by side on an H100 (benchmarks/kernel_bench.py, commit 20a09d3, pre-processing included, ratio to
# cuDNN bf16 in the same run, over the five benchmark shapes).
HOPPER_MEASURED = "H100 kernel_bench at 20a09d3: int8-fp8 1.31-1.50x cuDNN bf16, int4 1.07-1.28x"
HOPPER_REASON = (
    "no INT4 tensor cores on Hopper: INT4 maths runs at the 8-bit rate, so the 8-bit recipe costs "
    "no speed and gains 12-16 dB SQNR over int4 (accuracy study, benchmarks/RESULTS.md); it is also the faster "
    f"one there ({HOPPER_MEASURED})"
)


# ---- the CUDA kernel ------------------------------------------------------------------------------------------


def int8fp8_gpu(q, k, v, **opts) -> str | None:
    """An int8-fp8 kernel for this GPU (sm89, sm90)."""
    return int8fp8_device_problem(cuda_checks.device_index(q)) or None


def no_q_smoothing(q, k, v, **opts) -> str | None:
    if opts.get("smooth_q"):
        return "smooth_q=True with int8-fp8 (its kernels do not smooth Q; the INT4 kernels do)"
    return None


def lse_on_wgmma(q, k, v, **opts) -> str | None:
    """``return_lse`` only where the device's int8-fp8 kernel is the sm90 wgmma one (the mma.sync one returns none)."""
    if opts.get("return_lse") and not int8fp8_returns_lse(cuda_checks.device_index(q)):
        return "return_lse=True on the int8-fp8 mma.sync kernel (only the sm90 wgmma kernel returns the log-sum-exp)"
    return None


def key_block_128(q, k, v, **opts) -> str | None:
    bn = opts.get("block_n")
    if bn is not None and bn != INT8FP8_BLOCK_N:
        return f"block_n={bn} (the int8-fp8 kernel uses {INT8FP8_BLOCK_N})"
    return None


def _cuda_runner(attention):
    """The kernel entry's ``run`` on ``attention`` (the checked public function or its unchecked body)."""

    def run(q, k, v, *, layout="BHND", kv_lens=None, sm_scale=None, smooth_k=True, smooth_v=False, rope=None,
            block_map=None, return_lse=False, v_hadamard=1, **_):
        return attention(q, k, v, layout=layout, kv_lens=kv_lens, sm_scale=sm_scale, smooth_k=smooth_k,
                         smooth_v=smooth_v, rope=rope, block_map=block_map, return_lse=return_lse,
                         v_hadamard=v_hadamard > 1)

    return run


def _describe_cuda() -> str:
    entry = cuda_build.arch_entry()
    kernels = int8fp8_kernels(entry)
    if not kernels:
        return ""
    text = f"int8-fp8 kernels {'/'.join(kernels)} ({kernels[0]} by default, block_n 128)"
    return text + ("" if entry.wgmma else ", the mma.sync kernel's speed on Ada unmeasured")


CUDA_KERNEL = KernelEntry(
    run=_cuda_runner(int8fp8_attention_cuda),
    checks=(
        *cuda_checks.FIRST_CHECKS, int8fp8_gpu, cuda_checks.dtype, cuda_checks.head_dim, no_q_smoothing,
        cuda_checks.q_block, cuda_checks.block_m, cuda_checks.block_n, key_block_128, cuda_checks.strides,
        cuda_checks.alignment, lse_on_wgmma,
    ),
    block_n=lambda device=None: INT8FP8_BLOCK_N,
    fuses_rope=rope_fusion_unsupported,
    fuses_v_hadamard=v_hadamard_fusion_unsupported,
    unrotates_output=True,
    describe=_describe_cuda,
    returns_lse=True,
    run_unchecked=_cuda_runner(int8fp8_attention_unchecked),
)

RECIPE = Recipe(
    name=NAME,
    summary="SageAttention2-8b: INT8 Q/K, FP8 P/V (CUDA on sm89 / sm90)",
    labels=RecipeLabels(datatype="INT8/FP8"),
    quantized=True,
    smooth_q=False,
    # Off: with one FP8 scale per channel over the whole sequence, subtracting the mean first cost cosine vs float64
    # at video lengths on zero-mean V (0.99937 -> 0.99664 at 119K tokens, 0.99934 -> 0.99902 at 33K; CPU reference,
    # benchmarks/accuracy_vs_length.py, RESULTS.md 2026-11-23). Q smoothing: +0.5 to +0.9 dB, and its kernels do
    # not smooth Q.
    smooth_v=False,
    reference=partial(attention_blockwise, operands=int8fp8_operands, block_pv=fp8_block_pv),
    reference_block_n=INT8FP8_BLOCK_N,
    kernels={"cuda": CUDA_KERNEL},
    auto_on={(9, 0): HOPPER_REASON},
)
