"""What a block map saves in time: the block-sparse kernel's attention time against density, a line fitted to
measurements, for estimates (``rotvid calibrate``'s expected speed-up).

**Measured.** ``python benchmarks/kernel_bench.py --sparse --shapes wan1.3b-480p wan14b-720p`` on an
**NVIDIA H200** (``benchmarks/results/kernel_bench_sparse.json``: commit 5ad526e, 2026-11-26; the section of
``benchmarks/RESULTS.md`` names the merge 1de05f0): the int8-fp8 Hopper kernel with random block maps (128×128
blocks, the diagonal kept) at densities 0.2, 0.35, 0.5 and 0.75, its time over the same kernel's dense time
(``kernel_vs_dense``: the attention kernel alone, medians of CUDA-event timings), on two shapes (bf16 random inputs):

* ``wan1.3b-480p``: B 1, H 12, N 32,760, D 128 (Wan2.1-1.3B at 480p);
* ``wan14b-720p``: B 1, H 40, N 75,600, D 128 (Wan 14B at 720p).

The eight points are :data:`MEASURED_POINTS`, copied here (nothing is read from ``benchmarks/`` at run time).

**The line.** Least squares over the eight points: ``time / dense time = INTERCEPT + SLOPE · density`` with
:data:`INTERCEPT` 0.0098 (the part of the kernel that does not shrink with the map) and :data:`SLOPE` 0.9893; it
meets every point within 0.0034 (:data:`LINE_TOLERANCE` 0.005). Each shape's own line lies within 0.008 of the
other's over the measured range, so one line stands for both.

**What it leaves out.** The pre-processing pass over Q, K and V (the same with or without a map), the top-p map
build (1.8-3.1% of a dense call, per call: ``benchmarks/RESULTS.md``), and every other GPU, kernel and recipe (INT4,
the mma.sync kernels: unmeasured with maps). An estimate, not a measurement.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = [
    "ESTIMATE_BASIS", "INTERCEPT", "LINE_TOLERANCE", "MEASURED_COMMIT", "MEASURED_DEVICE", "MEASURED_KERNEL",
    "MEASURED_POINTS", "SLOPE", "attention_speedup", "relative_attention_time",
]

MEASURED_DEVICE = "NVIDIA H200"
MEASURED_COMMIT = "5ad526e"
MEASURED_KERNEL = "int8-fp8 block-sparse (Hopper)"
# what an estimate from this line stands on, in one line (for summaries)
ESTIMATE_BASIS = (f"estimate from the {MEASURED_KERNEL} kernel's time-vs-density line measured on an {MEASURED_DEVICE} "
                  f"(commit {MEASURED_COMMIT}; attention kernel time, calls without a map counted dense)")

# (shape, map density, kernel time / dense kernel time) -- benchmarks/results/kernel_bench_sparse.json,
# rows rotvid-int8-fp8-sparse-d*: "density" and "kernel_vs_dense"
MEASURED_POINTS: tuple[tuple[str, float, float], ...] = (
    ("wan1.3b-480p", 0.1992, 0.2096),
    ("wan1.3b-480p", 0.3516, 0.3576),
    ("wan1.3b-480p", 0.5000, 0.5025),
    ("wan1.3b-480p", 0.7500, 0.7487),
    ("wan14b-720p", 0.1997, 0.2064),
    ("wan14b-720p", 0.3503, 0.3533),
    ("wan14b-720p", 0.5008, 0.5084),
    ("wan14b-720p", 0.7496, 0.7547),
)

INTERCEPT = 0.0098
SLOPE = 0.9893
LINE_TOLERANCE = 0.005  # |line - measured| at every point of MEASURED_POINTS (the largest is 0.0033)


def relative_attention_time(density: float) -> float:
    """The kernel's attention time under a map of ``density`` (kept blocks over all blocks, as
    :meth:`BlockMap.density() <rotvid.kernels.sparsity.block_map.BlockMap.density>`), relative to its dense time:
    ``INTERCEPT + SLOPE · density`` (module docstring). ``density`` in [0, 1]."""
    if isinstance(density, bool) or not isinstance(density, (int, float)) or not 0.0 <= density <= 1.0:
        raise ValueError(f"density: expected a fraction in [0, 1], got {density!r}")
    return INTERCEPT + SLOPE * float(density)


def attention_speedup(densities: Iterable[float | None]) -> float:
    """The expected attention speed-up of a run whose calls have these map densities (``None``: a call without a
    map, counted at its dense time 1), over the same calls without maps: ``calls / Σ relative time``. Every call is
    taken to cost the same dense time (one shape per run, as in a video transformer's self-attention). NaN for no
    calls."""
    times = [1.0 if d is None else relative_attention_time(d) for d in densities]
    return len(times) / sum(times) if times else math.nan
