"""Device aid (session 11): per-kernel GPU time of the int8-fp8 pre-processing with and without RoPE·R inside it
(torch.profiler, 5 calls each after a warm-up), on the kernel_bench shapes.

    python3 benchmarks/device/rope_fused_profile.py [--shapes wan14b-720p]
"""
import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.kernel_bench import SHAPES  # noqa: E402
from rotvid.kernels import cuda_backend as cb  # noqa: E402
from rotvid.rope.fused_table import apply_generalized_rope, fuse_rope_and_rotation  # noqa: E402
from rotvid.rope.rotations import make_rotation  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--shapes", nargs="*", default=["wan1.3b-480p", "wan14b-720p"])
args = ap.parse_args()
for name in args.shapes:
    sh = SHAPES[name]
    torch.manual_seed(0)
    q, k, v = (torch.randn(sh.b, sh.h, sh.n, sh.d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ang = torch.rand(sh.n, sh.d // 2, device="cuda", dtype=torch.float64) * 6.283
    cos = torch.cos(ang).repeat_interleave(2, dim=-1).float()
    sin = torch.sin(ang).repeat_interleave(2, dim=-1).float()
    table = fuse_rope_and_rotation(cos, sin, make_rotation("half", sh.d)).to(dtype=torch.float32)
    rot = lambda x: apply_generalized_rope(x, table)  # noqa: E731
    for label, fn in (("two-pass", lambda: cb.preprocess_int8fp8_cuda(rot(q), rot(k), v)),
                      ("fused", lambda: cb.preprocess_int8fp8_cuda(q, k, v, rope=table))):
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
        print(f"## {name} {label} (5 calls)")
        for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:8]:
            print(f"  {e.device_time_total / 5 / 1000:8.3f} ms/call  x{e.count // 5}  {e.key[:90]}")
    del q, k, v, table
    torch.cuda.empty_cache()
