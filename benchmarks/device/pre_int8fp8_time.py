"""Device helper: time per call of the int8-fp8 pre-processing (``preprocess_int8fp8_cuda``, default recipe:
smooth_k=True, smooth_v=False; B=1, bf16, BHND) at the five benchmark shapes, beside the bytes it must move at the
GPU's nominal bandwidth. CUDA events, median of 20 calls after 5 warm-up calls. Prints one table and appends it to
``benchmarks/results/pre_int8fp8.md``. (The A/B against the older per-tensor kernels, removed after it, is in
RESULTS.md, session 6.)

    PYTHONPATH=$PWD python3 benchmarks/device/pre_int8fp8_time.py [--shapes cogvideox5b ...]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import statistics
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernel_bench import SHAPES  # noqa: E402

from rotvid.kernels import cuda_backend as c  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results" / "pre_int8fp8.md"
HBM_GBPS = {"H100": 3350.0, "H200": 4800.0}  # nominal peak, for the lower bound column only


def time_ms(fn, reps: int = 20, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def min_bytes(h: int, n: int, d: int) -> int:
    """Read Q once, K and V twice (statistics, then quantize) in bf16; write the int8/fp8 operands once."""
    return h * n * d * (2 * 5 + 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    args = ap.parse_args()
    gpu = torch.cuda.get_device_name()
    bw = next((v for k, v in HBM_GBPS.items() if k in gpu), None)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        f"## int8-fp8 pre-processing, {gpu}, commit {commit}, {_dt.datetime.now():%Y-%m-%d %H:%M}",
        "",
        "| shape | H | N | D | kv_len | ms | bound ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in args.shapes:
        s = SHAPES[name]
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(s.b, s.h, s.n, s.d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        kv_lens = torch.full((s.b,), s.kv_len, dtype=torch.int32, device="cuda") if s.kv_len else None

        def run():
            return c.preprocess_int8fp8_cuda(q, k, v, kv_lens=kv_lens)

        ms = time_ms(run)
        bound = min_bytes(s.h, s.n, s.d) / (bw * 1e6) if bw else float("nan")
        lines.append(
            f"| {name} | {s.h} | {s.n} | {s.d} | {s.kv_len or s.n} | {ms:.4f} | {bound:.4f} |"
        )
        print(lines[-1], flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    table = "\n".join(lines)
    print("\n" + table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write(table + "\n\n")


if __name__ == "__main__":
    main()
