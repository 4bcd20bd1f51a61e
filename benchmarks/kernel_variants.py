"""Tuning aid: time rotvid's INT4 attention kernel (attention only, pre-processing excluded) under
run-time variant switches of a tuning build, against cuDNN bf16 in the same process.

    ROTVID_EXT_CUDA_FLAGS=-DROTVID_WGMMA_VARIANTS python benchmarks/kernel_variants.py \
        --var ROTVID_WGMMA_STAGES=2,3,4 --shapes wan1.3b-480p cogvideox5b

Each value of the variable is set in the environment before each timed call (the tuning build
reads it per call); the values and cuDNN are timed in interleaved rounds (kernel_bench.time_interleaved).
``--smooth`` pre-processes as kernel_bench's rotvid-int4 rows (Q, K and V smoothed) instead of K only.
Numbers for decisions only; recorded results come from kernel_bench.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.kernel_bench import SHAPES, time_interleaved, time_ms  # noqa: E402
from rotvid.kernels import cuda_backend  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--var", required=True, help="NAME=v1,v2,... (environment variable read by the tuning build)")
    ap.add_argument("--shapes", nargs="*", default=["wan1.3b-480p"], choices=list(SHAPES))
    ap.add_argument("--block-n", type=int, default=None, choices=cuda_backend.SUPPORTED_BLOCK_N)
    ap.add_argument("--compare-block-n", type=int, default=None, choices=cuda_backend.SUPPORTED_BLOCK_N,
                    help="also time the default kernel at this block_n (variable unset)")
    ap.add_argument("--smooth", action="store_true", help="smooth Q, K and V (the INT4 default) instead of K only")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    name, _, values = args.var.partition("=")
    block_n = args.block_n or cuda_backend.default_block_n()
    print(f"| shape | {name} | ms | TOP/s | vs cuDNN | max abs diff vs first |")
    print("| --- | --- | --- | --- | --- | --- |")
    for shape_name in args.shapes:
        s = SHAPES[shape_name]
        torch.manual_seed(0)
        q, k, v = (torch.randn(s.b, s.h, s.n, s.d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flops = 4.0 * s.b * s.h * s.n * s.n * s.d
        kv_lens = None if s.kv_len is None else torch.full((s.b,), s.kv_len, dtype=torch.int32, device="cuda")
        qkv = cuda_backend.preprocess_int4_cuda(q, k, v, kv_lens=kv_lens, block_n=block_n, smooth_v=args.smooth,
                                                smooth_q=args.smooth)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v)

        def att_with(val):
            os.environ[name] = val
            return cuda_backend.attention_int4_quantized(
                qkv, n_q=s.n, n_kv=s.n, head_dim=s.d, block_n=block_n, kv_lens=kv_lens, out_dtype=q.dtype)

        vals = values.split(",")
        first = att_with(vals[0])
        diffs = {val: (att_with(val).float() - first.float()).abs().max().item() for val in vals}
        times = time_interleaved({"cudnn": cudnn, **{val: (lambda val=val: att_with(val)) for val in vals}},
                                 args.rounds)
        base = times["cudnn"]
        for val in vals:
            ms = times[val]
            print(f"| {shape_name} | {val} | {ms:.2f} | {flops / ms / 1e9:.0f} | {base / ms:.2f}× | {diffs[val]:.3g} |",
                  flush=True)
        if args.compare_block_n:
            os.environ.pop(name, None)
            bn2 = args.compare_block_n
            qkv2 = cuda_backend.preprocess_int4_cuda(q, k, v, kv_lens=kv_lens, block_n=bn2)
            ms = time_ms(lambda: cuda_backend.attention_int4_quantized(
                qkv2, n_q=s.n, n_kv=s.n, head_dim=s.d, block_n=bn2, kv_lens=kv_lens, out_dtype=q.dtype))
            print(f"| {shape_name} | default, block_n {bn2} | {ms:.2f} | {flops / ms / 1e9:.0f} | {base / ms:.2f}× | |")
        print(f"| {shape_name} | cuDNN | {base:.2f} | {flops / base / 1e9:.0f} | 1.00× | |", flush=True)


if __name__ == "__main__":
    main()
