"""Device aid (session 11): RoPE·R inside the int8-fp8 pre-processing against the RoPE·R pass + pre-processing.

On the kernel_bench shapes with RoPE on every token (Wan's case; half rotation, the default; the generalized table
shared by the heads), interleaved rounds (kernel_bench.time_interleaved), ms per call:
  two-pass pre   apply_generalized_rope on Q and on K (rope_table.cu), then preprocess_int8fp8_cuda
  fused pre      preprocess_int8fp8_cuda(q, k, v, rope=table) (rope_q_kernel, rope_k_kernel, then V's statistics
                 and the K / V quantize launch)
  two-pass attn / fused attn   the same with the int8-fp8 attention kernel after them
and checks that the fused operands equal the two-pass ones byte for byte on each shape.

    python3 benchmarks/device/rope_fused_time.py [--shapes wan1.3b-480p wan14b-720p] [--rounds 3]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.kernel_bench import SHAPES, time_interleaved  # noqa: E402
from rotvid.kernels import cuda_backend as cb  # noqa: E402
from rotvid.pipelines.config import smooth_v_for  # noqa: E402
from rotvid.rope.fused_table import apply_generalized_rope, fuse_rope_and_rotation  # noqa: E402
from rotvid.rope.rotations import make_rotation  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--shapes", nargs="*", default=["wan1.3b-480p", "wan14b-480p", "wan14b-720p", "hunyuan-720p"])
ap.add_argument("--rounds", type=int, default=3)
args = ap.parse_args()
smooth_v = smooth_v_for("int8-fp8", None)
print(f"smooth_k True, smooth_v {smooth_v} (the runtime's int8-fp8 defaults)")
print("| shape | two-pass pre (ms) | fused pre (ms) | saved (ms) | two-pass attn (ms) | fused attn (ms) | saved share | same bytes |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for name in args.shapes:
    sh = SHAPES[name]
    torch.manual_seed(0)
    q, k, v = (torch.randn(sh.b, sh.h, sh.n, sh.d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ang = torch.rand(sh.n, sh.d // 2, device="cuda", dtype=torch.float64) * 6.283
    cos = torch.cos(ang).repeat_interleave(2, dim=-1).float()[None, :, None, :]  # Wan's [1, N, 1, D]
    sin = torch.sin(ang).repeat_interleave(2, dim=-1).float()[None, :, None, :]
    table = fuse_rope_and_rotation(cos, sin, make_rotation("half", sh.d)).to(dtype=torch.float32)
    rot = lambda x: apply_generalized_rope(x, table)  # noqa: E731
    a = cb.preprocess_int8fp8_cuda(rot(q), rot(k), v, smooth_v=smooth_v)
    b = cb.preprocess_int8fp8_cuda(q, k, v, smooth_v=smooth_v, rope=table)
    bits = lambda t: t.view(torch.int32) if t.dtype == torch.float32 else t  # noqa: E731
    same = all((x is None and y is None) or torch.equal(bits(x), bits(y)) for x, y in zip(a, b))
    del a, b
    times = time_interleaved({
        "pre2": lambda: cb.preprocess_int8fp8_cuda(rot(q), rot(k), v, smooth_v=smooth_v),
        "pre1": lambda: cb.preprocess_int8fp8_cuda(q, k, v, smooth_v=smooth_v, rope=table),
        "attn2": lambda: cb.int8fp8_attention_cuda(rot(q), rot(k), v, smooth_v=smooth_v),
        "attn1": lambda: cb.int8fp8_attention_cuda(q, k, v, smooth_v=smooth_v, rope=table),
    }, args.rounds)
    saved = times["pre2"] - times["pre1"]
    print(f"| {name} | {times['pre2']:.3f} | {times['pre1']:.3f} | {saved:.3f} | {times['attn2']:.3f} | "
          f"{times['attn1']:.3f} | {100 * (times['attn2'] - times['attn1']) / times['attn2']:.2f}% | {same} |",
          flush=True)
    del q, k, v, table
    torch.cuda.empty_cache()
