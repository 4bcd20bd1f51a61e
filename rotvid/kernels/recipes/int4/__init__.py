"""``int4`` (RotateAttention: INT4 Q/K/V, range-optimized P) and its variant ``int4-sym-p`` (symmetric P).

Per-token INT4 Q and K, per-group INT4 V (one scale per channel per key block), P as integers in [0, 15]
(``int4``: the INT4 operand P̂ - 8) or [0, 7] (``int4-sym-p``); the exact steps are
:mod:`rotvid.kernels.recipes.int4.reference`'s. CUDA kernels on sm80-sm90 (:mod:`rotvid.kernels.recipes.int4.ops`,
sources in ``csrc/`` beside it): native INT4 ``mma`` on Ampere and Ada, the same numbers on the 8-bit tensor cores of
Hopper (wgmma, key blocks of 128 there).
"""

from __future__ import annotations

from functools import partial

from rotvid.kernels import cuda_build, cuda_checks
from rotvid.kernels.recipes.base import KernelEntry, Recipe, RecipeLabels
from rotvid.kernels.recipes.int4.ops import default_block_n, int4_attention_cuda, int4_attention_unchecked
from rotvid.kernels.recipes.int4.reference import attention_int4
from rotvid.kernels.recipes.int8_fp8 import HOPPER_MEASURED
from rotvid.kernels.reference import DEFAULT_BLOCK_N

INT4_REASON = "native INT4 tensor cores (mma.m16n8k64.s4, twice the 8-bit rate): the paper's INT4 recipe"
# What a 4-bit recipe asked for by name on Hopper is told (it still runs as asked).
HOPPER_FOUR_BIT_NOTE = (
    "on sm90 a 4-bit recipe is slower and less accurate than int8-fp8, what recipe='auto' picks there (int4: INT4 "
    f"values on the 8-bit tensor cores, {HOPPER_MEASURED}; int4-fp8: no CUDA kernel, the reference runs)"
)
# Everything but the GPUs of the table: the CPU, and GPUs without a rotvid CUDA kernel. The PyTorch reference runs
# there, equally slow for every recipe, so speed cannot decide; int4 keeps the paper's recipe and reproduces bit for
# bit what the INT4 GPUs (sm80/86/89) run.
ELSEWHERE_REASON = (
    "the PyTorch reference runs here (no rotvid CUDA kernel); int4 keeps the paper's recipe and reproduces "
    "the numerics of the INT4 GPUs (sm80/86/89)"
)
AUTO_ON = {
    (8, 0): INT4_REASON,
    (8, 6): INT4_REASON,
    (8, 7): INT4_REASON,
    (8, 9): INT4_REASON + "; Ada also has FP8 tensor cores and rotvid has an int8-fp8 kernel for them (mma.sync e4m3), "
    "so int8-fp8 could be preferred there for fidelity, but its speed against INT4 was not measured (no Ada GPU "
    "available): int4 until measured",
}
# Q smoothing on: +3.6 to +5.1 dB mean SQNR for int4 with per-block means, +3.1 to +4.6 dB with the per-head mean the
# kernels use (CPU reference, 27 synthetic RoPE-structured sets, RESULTS.md). V smoothing on (the paper; the V scales
# are per key block, and the kernels add the mean back in the epilogue).
SMOOTHING = dict(smooth_q=True, smooth_v=True)


def _cuda_kernel(p_mode: str) -> KernelEntry:
    def runner(attention):  # (the checked public function or its unchecked body)
        def run(q, k, v, *, layout="BHND", kv_lens=None, sm_scale=None, smooth_k=True, smooth_q=False,
                smooth_v=False, block_n=None, block_map=None, **_):
            return attention(q, k, v, layout=layout, kv_lens=kv_lens, sm_scale=sm_scale, p_mode=p_mode,
                             smooth_k=smooth_k, smooth_v=smooth_v, block_n=block_n, smooth_q=smooth_q,
                             block_map=block_map)

        return run

    return KernelEntry(
        run=runner(int4_attention_cuda),
        checks=(*cuda_checks.FIRST_CHECKS, *cuda_checks.LAST_CHECKS),
        block_n=default_block_n,
        describe=_describe_cuda,
        run_unchecked=runner(int4_attention_unchecked),
    )


def _describe_cuda() -> str:
    entry = cuda_build.arch_entry()
    text = f"{entry.path} path" + (", wgmma kernel (default)" if entry.wgmma else "")
    return text + f", block_n {default_block_n()} by default"


def _int4_recipe(p_mode: str, *, name: str, summary: str, **auto) -> Recipe:
    """An INT4 recipe whose P is ``p_mode`` (``"range"``: range-optimized, ``"sym"``: symmetric), with the INT4
    smoothing above, the reference and CUDA kernel of that P and the Hopper note; ``auto``: its ``auto_on`` /
    ``auto_elsewhere`` rows (:class:`~rotvid.kernels.recipes.base.Recipe`)."""
    return Recipe(
        name=name,
        summary=summary,
        labels=RecipeLabels(datatype="INT4", optim_p="✓" if p_mode == "range" else "×"),
        quantized=True,
        **SMOOTHING,
        reference=partial(attention_int4, p_mode=p_mode),
        reference_block_n=DEFAULT_BLOCK_N,
        kernels={"cuda": _cuda_kernel(p_mode)},
        requested_notes={(9, 0): HOPPER_FOUR_BIT_NOTE},
        **auto,
    )


RECIPE = _int4_recipe(
    "range",
    name="int4",
    summary="RotateAttention: INT4 Q/K/V, range-optimized INT4 P (the paper's recipe)",
    auto_on=AUTO_ON,
    auto_elsewhere=ELSEWHERE_REASON,
)
SYM_P_RECIPE = _int4_recipe(
    "sym",
    name="int4-sym-p",
    summary="INT4 Q/K/V with symmetric INT4 P in [0, 7] (the ablation of range-optimized P)",
)
