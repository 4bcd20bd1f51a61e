"""Tuning aid (tuning build, -DROTVID_INT8FP8_VARIANTS): the error of the int8-fp8 wgmma kernel against its own
reference twin and against float64 attention, for two variants of different key blocks on the same inputs, over
seeds (the FP8 wgmma accumulator keeps fewer bits than FP32: a longer P.V chain per block adds rounding).

    export ROTVID_EXT_CUDA_FLAGS=-DROTVID_INT8FP8_VARIANTS
    python benchmarks/device/int8fp8_block_error.py --variants 50:128,0:192
"""
import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from rotvid.kernels import cuda_backend as cb, metrics  # noqa: E402
from tests.kernels.helpers import attention_fp64  # noqa: E402
from tests.kernels.test_cuda_int8fp8 import twin  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--variants", default="50:128,0:192", help="variant:block_n pairs")
ap.add_argument("--seeds", type=int, default=6)
ap.add_argument("--n", type=int, default=4099)
ap.add_argument("--d", type=int, default=64)
args = ap.parse_args()
pairs = [tuple(int(x) for x in p.split(":")) for p in args.variants.split(",")]
for sv in (False, True):
    rows = {v: ([], []) for v, _ in pairs}
    for seed in range(args.seeds):
        torch.manual_seed(100 + seed)
        q, k, v = (torch.randn(1, 2, args.n, args.d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        kq = cb.preprocess_int8fp8_cuda(q, k, v, smooth_v=sv)
        truth = attention_fp64(q, k, v)
        for var, bn in pairs:
            os.environ["ROTVID_INT8FP8_VARIANT"] = str(var)
            ref = twin(kq, args.n, args.n, None, block_n=bn)
            got = cb.attention_int8fp8_quantized(kq, n_q=args.n, n_kv=args.n, head_dim=args.d, split_tail=False).float()
            rows[var][0].append(metrics.relative_l2(ref.float(), got))
            rows[var][1].append(metrics.relative_l2(truth.float(), got))
    for var, bn in pairs:
        tw, tr = rows[var]
        print(f"n{args.n} d{args.d} smooth_v={sv} variant {var} (block {bn}): rel-L2 vs twin "
              + " ".join(f"{x:.2e}" for x in tw) + f" (max {max(tw):.2e}); vs float64 mean {sum(tr) / len(tr):.4e}",
              flush=True)
