"""Device helper: time per call of the INT4 pre-processing as kernel_bench's rotvid-int4 rows run it
(``preprocess_int4_cuda`` with Q, K and V smoothed, range P, block_n 128, the arch's default path; B=1, bf16, BHND)
at the benchmark shapes, beside the int8-fp8 pre-processing of the same inputs and the bytes the INT4 one must move
at the GPU's nominal bandwidth; then, with ``--profile SHAPE``, the per-kernel CUDA times of 10 INT4 calls
(torch.profiler). CUDA events, median of 20 calls after 5 warm-up calls.

    PYTHONPATH=$PWD python3 benchmarks/device/pre_int4_time.py [--shapes cogvideox5b ...] [--profile wan1.3b-480p]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernel_bench import SHAPES  # noqa: E402
from pre_int8fp8_time import HBM_GBPS, time_ms  # noqa: E402

from rotvid.kernels import cuda_backend as c  # noqa: E402


def min_bytes(h: int, n: int, d: int) -> int:
    """Read Q, K and V twice (the smoothing means, then quantize) in bf16; write the INT4-valued bytes once."""
    return h * n * d * (2 * 6 + 3)


def inputs(name: str):
    s = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(s.b, s.h, s.n, s.d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    kv_lens = torch.full((s.b,), s.kv_len, dtype=torch.int32, device="cuda") if s.kv_len else None
    return s, q, k, v, kv_lens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--profile", default=None, choices=list(SHAPES))
    args = ap.parse_args()
    gpu = torch.cuda.get_device_name()
    bw = next((v for k, v in HBM_GBPS.items() if k in gpu), None)
    print(f"INT4 pre-processing (Q, K, V smoothed), {gpu}")
    print("| shape | int4 ms | int8-fp8 ms | int4 bound ms |")
    print("| --- | --- | --- | --- |")
    for name in args.shapes:
        s, q, k, v, kv_lens = inputs(name)
        t4 = time_ms(lambda: c.preprocess_int4_cuda(q, k, v, kv_lens=kv_lens, block_n=128, smooth_v=True,
                                                    smooth_q=True))
        t8 = time_ms(lambda: c.preprocess_int8fp8_cuda(q, k, v, kv_lens=kv_lens))
        bound = min_bytes(s.h, s.n, s.d) / (bw * 1e6) if bw else float("nan")
        print(f"| {name} | {t4:.4f} | {t8:.4f} | {bound:.4f} |", flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    if args.profile:
        _, q, k, v, kv_lens = inputs(args.profile)

        def run():
            return c.preprocess_int4_cuda(q, k, v, kv_lens=kv_lens, block_n=128, smooth_v=True, smooth_q=True)

        for _ in range(3):
            run()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                run()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
