"""Tuning aid (tuning build, -DROTVID_INT8FP8_VARIANTS): the int8-fp8 kernel with key blocks of 128 / 192 / 256.

Each variant is checked against the reference twin at 128, 192 and 256 keys per block (the block max is part of
the numerics: a variant must match the twin of its own block size to within fp32 summation order) on inputs that
exercise a partial last block, a sub-block past the padding, two heads, kv_lens and a long head without V smoothing,
with the output NaN-poisoned first; then timed on the benchmark shapes, variants interleaved over rounds.

    ROTVID_EXT_CUDA_FLAGS=-DROTVID_INT8FP8_VARIANTS python benchmarks/device/int8fp8_blocks.py --variants 0,41 --rounds 2
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
ap.add_argument("--variants", default="0,40,41")
ap.add_argument("--shapes", nargs="*", default=["wan1.3b-480p", "wan14b-720p", "cogvideox5b"])
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--budget-ms", type=float, default=800)
args = ap.parse_args()
variants = args.variants.split(",")


# (b, h, n, d, kv_lens, smooth_v)
CHECKS = [(1, 2, 2000, 128, None, True), (2, 2, 1100, 128, [1100, 333], False), (1, 1, 4099, 64, None, False),
          (2, 3, 1025, 64, [1025, 129], True), (1, 1, 97, 128, None, False)]
torch.manual_seed(1)
for b, h, n, d, lens, sv in CHECKS:
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    kv_lens = torch.tensor(lens, device="cuda", dtype=torch.int32) if lens else None
    kq = cb.preprocess_int8fp8_cuda(q, k, v, kv_lens=kv_lens, smooth_v=sv)
    refs = {bn: twin(kq, n, n, kv_lens, block_n=bn).float() for bn in (128, 192, 256)}
    for var in variants:
        os.environ["ROTVID_INT8FP8_VARIANT"] = var
        for split in (False, True):
            out = torch.full((b, h, n, d), float("nan"), device="cuda", dtype=torch.bfloat16)
            got = cb.attention_int8fp8_quantized(kq, n_q=n, n_kv=n, head_dim=d, kv_lens=kv_lens, out=out,
                                                 split_tail=split).float()
            errs = " ".join(f"{bn}:{float((got - r).norm() / r.norm()):.2e}" for bn, r in refs.items())
            print(f"check b{b}h{h}n{n}d{d} lens={lens} sv={sv} variant {var} split={split}: nan={bool(got.isnan().any())}"
                  f" rel-L2 vs twin {errs}", flush=True)

for name in args.shapes:
    sh = SHAPES[name]
    torch.manual_seed(0)
    q, k, v = (torch.randn(sh.b, sh.h, sh.n, sh.d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    kq = cb.preprocess_int8fp8_cuda(q, k, v)
    flops = 4.0 * sh.b * sh.h * sh.n * sh.n * sh.d
    res = {var: [] for var in variants}
    for _ in range(args.rounds):
        for var in variants:
            os.environ["ROTVID_INT8FP8_VARIANT"] = var
            f = lambda: cb.attention_int8fp8_quantized(kq, n_q=sh.n, n_kv=sh.n, head_dim=sh.d)  # noqa: E731
            res[var].append(flops / time_ms(f, budget_ms=args.budget_ms) / 1e9)
    for var in variants:
        print(f"{name} variant {var}: TOP/s " + " / ".join(f"{x:.0f}" for x in res[var]), flush=True)
