"""Device aid (session 8): launch layouts of the Triton RoPE·R kernel, and the compiled (inductor) form, timed
in interleaved rounds; every variant's output compared bit for bit with the default launch.

    python3 benchmarks/device/rope_tune.py [--shapes wan1.3b-480p wan14b-720p]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.kernel_bench import SHAPES, time_interleaved  # noqa: E402
from rotvid.kernels.rope_triton import apply_generalized_rope_triton  # noqa: E402
from rotvid.rope.fused_table import fuse_rope_and_rotation  # noqa: E402
from rotvid.rope.rotations import make_rotation  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--shapes", nargs="*", default=["wan1.3b-480p", "wan14b-720p"])
ap.add_argument("--rounds", type=int, default=3)
args = ap.parse_args()
VARIANTS = {"loop-16-4": ("loop", 16, 4), "loop-32-8": ("loop", 32, 8), "head-16-4": ("head", 16, 4)}
for name in args.shapes:
    sh = SHAPES[name]
    torch.manual_seed(0)
    x = torch.randn(sh.b, sh.h, sh.n, sh.d, device="cuda", dtype=torch.bfloat16)
    ang = torch.rand(sh.n, sh.d // 2, device="cuda", dtype=torch.float64) * 6.283
    cos = torch.cos(ang).repeat_interleave(2, dim=-1).float()[None, :, None, :]
    sin = torch.sin(ang).repeat_interleave(2, dim=-1).float()[None, :, None, :]
    table = fuse_rope_and_rotation(cos, sin, make_rotation("half", sh.d)).to(dtype=torch.float32)
    coef, index = table.coef, table.index
    ref = apply_generalized_rope_triton(x, coef, index)
    fns = {}
    for key, (layout, bt, nw) in VARIANTS.items():
        f = lambda layout=layout, bt=bt, nw=nw: apply_generalized_rope_triton(  # noqa: E731
            x, coef, index, layout=layout, block_t=bt, num_warps=nw)
        same = torch.equal(f(), ref)
        print(f"{name} {key}: bit-identical to loop-16-4: {same}", flush=True)
        fns[key] = f
    from rotvid.kernels import cuda_backend  # noqa: E402

    fns["cuda"] = lambda: cuda_backend.generalized_rope_cuda(x, coef, index)
    print(f"{name} cuda: bit-identical to loop-16-4: {torch.equal(fns['cuda'](), ref)}", flush=True)
    idx = index.to(x.device)
    eager_form = lambda x, coef: (x.float()[..., idx] * coef).sum(-1).to(x.dtype)  # noqa: E731
    compiled = torch.compile(eager_form, fullgraph=True)
    got = compiled(x, coef)
    print(f"{name} inductor: max |diff| vs Triton {float((got.float() - ref.float()).abs().max()):.3g}, "
          f"equal {torch.equal(got, ref)}", flush=True)
    fns["inductor"] = lambda: compiled(x, coef)
    times = time_interleaved(fns, args.rounds)
    gb = 2 * x.numel() * 2 / 1e9
    for key, ms in times.items():
        print(f"{name} {key}: {ms:.3f} ms ({gb / ms:.2f} TB/s of x read + y written)", flush=True)
    del x, ref, table, coef
    torch.cuda.empty_cache()
