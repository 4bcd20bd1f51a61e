"""Tuning aid (tuning build, -DROTVID_INT8FP8_VARIANTS): time and check the int8-fp8 kernel variants.

    ROTVID_EXT_CUDA_FLAGS=-DROTVID_INT8FP8_VARIANTS python benchmarks/device/int8fp8_variants.py --variants 0,1,2,6
"""
import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.kernel_bench import SHAPES, time_ms  # noqa: E402
from rotvid.kernels import cuda_backend as cb  # noqa: E402
from tests.kernels.test_cuda_int8fp8 import twin  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--variants", default="0,1,2,3,4,5,6,7,8,9")
ap.add_argument("--shapes", nargs="*", default=["wan1.3b-480p", "cogvideox5b"])
args = ap.parse_args()
for name in args.shapes:
    sh = SHAPES[name]
    torch.manual_seed(0)
    q, k, v = (torch.randn(sh.b, sh.h, sh.n, sh.d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    kq = cb.preprocess_int8fp8_cuda(q, k, v)
    small = cb.preprocess_int8fp8_cuda(q[:, :1, :2000], k[:, :1, :2000], v[:, :1, :2000])
    ref = twin(small, 2000, 2000, None)
    flops = 4.0 * sh.b * sh.h * sh.n * sh.n * sh.d
    for var in args.variants.split(","):
        os.environ["ROTVID_INT8FP8_VARIANT"] = var
        got = cb.attention_int8fp8_quantized(small, n_q=2000, n_kv=2000, head_dim=sh.d).float()
        cos = float(torch.nn.functional.cosine_similarity(ref.flatten(), got.flatten(), dim=0))
        f = lambda: cb.attention_int8fp8_quantized(kq, n_q=sh.n, n_kv=sh.n, head_dim=sh.d)  # noqa: E731
        ms = time_ms(f, budget_ms=800)
        print(f"{name} variant {var}: {ms:.2f} ms {flops / ms / 1e9:.0f} TOP/s cos-vs-twin {cos:.6f}", flush=True)
