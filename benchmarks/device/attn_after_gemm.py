"""Device helper: the attention kernel's time when each call follows a burst of bf16 GEMMs, as inside a forward.

In the compiled Wan 14B 720p slice the int8-fp8 kernel took 145 ms per call against 136-138 ms back to back
alone (RESULTS.md, session 13). Between two self-attention calls a forward runs about 60 ms of GEMMs at the
power limit. This script times the kernel (CUDA events around the attention call only) in four regimes:
back to back; after ``--gemm-ms`` of bf16 GEMMs of the block's projection shape; after the same time of a
memory-bound copy; after the same time idle. It also runs cuDNN in the same regimes, as the baseline.

    python3 benchmarks/device/attn_after_gemm.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rotvid.kernels import cuda_backend as cb  # noqa: E402


def per_call(n: int, fn, ms: float) -> float:
    """How many calls of ``fn`` take about ``ms`` (fn timed once)."""
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    torch.cuda.synchronize()
    return max(1, round(ms / (a.elapsed_time(b) / n)))


def regime_ms(attn, filler, reps: int, warm: int) -> float:
    times = []
    for i in range(warm + reps):
        filler()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        attn()
        b.record()
        if i >= warm:
            times.append((a, b))
    torch.cuda.synchronize()
    return statistics.median(x.elapsed_time(y) for x, y in times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gemm-ms", type=float, default=60.0)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--warm", type=int, default=4)
    args = ap.parse_args()
    b, h, n, d = 1, 40, 75600, 128
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    qkv = cb.preprocess_int8fp8_cuda(q, k, v)
    methods = {
        "rotvid int8-fp8 (attn only)": lambda: cb.attention_int8fp8_quantized(qkv, n_q=n, n_kv=n, head_dim=d),
    }

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v)

    methods["sdpa-cudnn bf16"] = cudnn
    x = torch.randn(n, h * d, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(h * d, h * d, device="cuda", dtype=torch.bfloat16) * 0.01
    src = torch.empty(1 << 30, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    n_gemm = per_call(4, lambda: x @ w, args.gemm_ms)
    n_copy = per_call(4, lambda: dst.copy_(src), args.gemm_ms)
    fillers = {
        "back to back": lambda: None,
        f"after {args.gemm_ms:.0f} ms of GEMMs ({n_gemm} x [{n}, {h * d}] @ [{h * d}, {h * d}])":
            lambda: [x @ w for _ in range(n_gemm)],
        f"after {args.gemm_ms:.0f} ms of 1 GiB copies ({n_copy})": lambda: [dst.copy_(src) for _ in range(n_copy)],
        f"after {args.gemm_ms:.0f} ms idle": lambda: (torch.cuda.synchronize(), time.sleep(args.gemm_ms / 1e3)),
    }
    print(f"{torch.cuda.get_device_name()}, B H N D = {b, h, n, d}, bf16 randn; attention call time only (CUDA "
          f"events), median of {args.reps} after {args.warm} warm-up rounds\n")
    print("| regime | " + " | ".join(methods) + " |\n| --- |" + " --- |" * len(methods))
    for name, filler in fillers.items():
        row = [regime_ms(fn, filler, args.reps, args.warm) for fn in methods.values()]
        print(f"| {name} | " + " | ".join(f"{ms:.2f}" for ms in row) + " |", flush=True)


if __name__ == "__main__":
    main()
