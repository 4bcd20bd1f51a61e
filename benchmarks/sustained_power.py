"""Attention kernels isolated vs sustained (back to back for seconds), with SM clock and power.

Inside a forward the attention kernels run back to back with GEMMs; kernel_bench times them in short
interleaved bursts. At the Wan 14B 720p slice the int8-fp8 kernel took 145 ms per call in the compiled
forward against 130 ms isolated (benchmarks/RESULTS.md), with the board at its 700 W limit. This script asks
whether that is the same for every method: per method, the median of ``--calls`` isolated calls (a sync and a
``--sleep`` pause before each), then ``--seconds`` of back-to-back calls, timed over their second half,
while ``nvidia-smi`` samples the SM clock, power and temperature every 100 ms.

    python -m benchmarks.sustained_power --shape wan14b-720p
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import subprocess
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from rotvid.kernels.recipes.int4.ops import int4_attention_cuda
from rotvid.kernels.recipes.int8_fp8.ops import (
    attention_int8fp8_quantized, int8fp8_attention_cuda, preprocess_int8fp8_cuda,
)

from benchmarks.timing import call_ms

SHAPES = {"wan14b-720p": (1, 40, 75600, 128), "wan1.3b-480p": (1, 12, 32760, 128), "cogvideox5b": (1, 48, 17776, 64)}


class Sampler:
    """``nvidia-smi`` samples (time, SM MHz, W, °C) every 100 ms, read back per time window."""

    def __init__(self):
        self.proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
             "--format=csv,noheader,nounits", "-lms", "100"], stdout=subprocess.PIPE, text=True)

    def stop(self) -> list[tuple[dt.datetime, float, float, float]]:
        self.proc.terminate()
        out = []
        for line in self.proc.communicate()[0].splitlines():
            parts = [s.strip() for s in line.split(",")]
            try:
                out.append((dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f"), *map(float, parts[1:4])))
            except (ValueError, IndexError):
                continue
        return out


def window_stats(samples, t0: dt.datetime, t1: dt.datetime) -> str:
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if not inside:
        return "— | — | —"
    med = lambda i: statistics.median(s[i] for s in inside)  # noqa: E731
    return f"{med(1):.0f} | {med(2):.0f} | {med(3):.0f}"


def isolated_ms(fn, calls: int, sleep_s: float) -> float:
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()
        time.sleep(sleep_s)
        times.append(call_ms(fn, "cuda"))
    return statistics.median(times)


def sustained_ms(fn, seconds: float, est_ms: float) -> tuple[float, dt.datetime, dt.datetime]:
    """Per-call ms over the second half of ``seconds`` of back-to-back calls, and that half's time window."""
    n = max(4, int(seconds * 1e3 / est_ms))
    half = n // 2
    torch.cuda.synchronize()
    for _ in range(half):
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0 = dt.datetime.now()
    a.record()
    for _ in range(n - half):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / (n - half), t0, dt.datetime.now()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="wan14b-720p", choices=sorted(SHAPES))
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--sleep", type=float, default=0.5)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--int4", action="store_true", help="also the INT4 recipe (Q/K/V smoothing, range P)")
    ap.add_argument("--cooldown", type=float, default=3.0, help="idle seconds between methods")
    args = ap.parse_args()
    b, h, n, d = SHAPES[args.shape]
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    k += torch.randn(1, h, 1, d, device="cuda", dtype=torch.bfloat16)
    methods = {}
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        F.scaled_dot_product_attention(q, k, v)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v)

    methods["sdpa-cudnn bf16"] = cudnn
    try:
        from sageattention import sageattn_qk_int8_pv_fp8_cuda_sm90
    except ImportError as err:
        print(f"peer not importable: {err}")
    else:
        methods["sageattention2-8b"] = lambda: sageattn_qk_int8_pv_fp8_cuda_sm90(
            q, k, v, tensor_layout="HND", qk_quant_gran="per_thread", pv_accum_dtype="fp32+fp32")
    qkv = preprocess_int8fp8_cuda(q, k, v)
    methods["rotvid int8-fp8 (attn only)"] = lambda: attention_int8fp8_quantized(qkv, n_q=n, n_kv=n, head_dim=d)
    methods["rotvid int8-fp8 (pre + attn)"] = lambda: int8fp8_attention_cuda(q, k, v)
    if args.int4:  # issue 12's recipe, as kernel_bench times it: Q, K, V smoothed, range P
        methods["rotvid int4 (pre + attn)"] = lambda: int4_attention_cuda(q, k, v, smooth_v=True, smooth_q=True)
    for fn in methods.values():
        fn()
    torch.cuda.synchronize()

    sampler = Sampler()
    time.sleep(1.0)
    rows = []
    for name, fn in methods.items():
        time.sleep(args.cooldown)
        iso = isolated_ms(fn, args.calls, args.sleep)
        sus, t0, t1 = sustained_ms(fn, args.seconds, iso)
        rows.append((name, iso, sus, t0, t1))
    samples = sampler.stop()
    print(f"\n{torch.cuda.get_device_name()}, shape {args.shape} (B, H, N, D = {b, h, n, d}), bf16 randn; "
          f"isolated = median of {args.calls} calls after a {args.sleep} s pause each; sustained = per call over the "
          f"second half of {args.seconds} s back to back; clock / power / temperature = medians of nvidia-smi "
          f"samples in that half.\n")
    print("| method | isolated ms | sustained ms | sustained / isolated | SM MHz | W | °C |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, iso, sus, t0, t1 in rows:
        print(f"| {name} | {iso:.2f} | {sus:.2f} | {sus / iso:.3f} | {window_stats(samples, t0, t1)} |")
    base = {name: (iso, sus) for name, iso, sus, _, _ in rows}["sdpa-cudnn bf16"]
    print("\n| method | vs cuDNN isolated | vs cuDNN sustained |\n| --- | --- | --- |")
    for name, iso, sus, _, _ in rows:
        print(f"| {name} | {base[0] / iso:.3f}× | {base[1] / sus:.3f}× |")


if __name__ == "__main__":
    main()
