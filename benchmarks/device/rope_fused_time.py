"""Device aid (session 11): RoPE·R inside the int8-fp8 pre-processing against the RoPE·R pass + pre-processing.

On the kernel_bench shapes with RoPE on every token (Wan's case; ``--rotation``: half, the default, or any other,
``full`` included -- its Walsh–Hadamard transform in registers; the generalized table shared by the heads),
interleaved rounds (kernel_bench.time_interleaved), ms per call:
  no-rope pre    preprocess_int8fp8_cuda(q, k, v) without any rotation (what RoPE·R adds is measured against it)
  two-pass pre   apply_generalized_rope on Q and on K (rope_table.cu), then preprocess_int8fp8_cuda
  fused pre      preprocess_int8fp8_cuda(q, k, v, rope=table) (rope_q_kernel, K's RoPE·R, the statistics and the
                 K / V quantize launch)
  two-pass attn / fused attn   the same with the int8-fp8 attention kernel after them
and checks that the fused operands equal the two-pass ones byte for byte on each shape. With ``--rotation full`` one
more column, "matmul pre": the path ``full`` took before the transform moved into the kernels (session 12): RoPE by
``apply_rope_interleaved``, then ``x @ H`` in float32, then the pre-processing. ``--profile``: instead, the
GPU time per kernel of both pre-processings (torch.profiler, 5 calls after a warm-up).

    python3 benchmarks/device/rope_fused_time.py [--shapes wan1.3b-480p wan14b-720p] [--rounds 3] [--rotation full]
        [--profile]
"""
import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.kernel_bench import SHAPES, time_interleaved  # noqa: E402
from rotvid.kernels import cuda_backend as cb  # noqa: E402
from rotvid.pipelines.config import smooth_v_for  # noqa: E402
from rotvid.kernels.rope_op import apply_generalized_rope  # noqa: E402
from rotvid.rope.fused_table import fuse_rope_and_rotation  # noqa: E402
from rotvid.rope.hadamard import hadamard_matrix  # noqa: E402
from rotvid.rope.rotations import make_rotation  # noqa: E402
from rotvid.rope.tables import apply_rope_interleaved  # noqa: E402


def wan_inputs(sh, rotation="half", cos_sin=False):
    """bf16 q, k, v [B, H, N, D] of a shape and the table of random RoPE angles (Wan's [1, N, 1, D]) and
    ``rotation`` (``cos_sin``: then cos and sin too)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(sh.b, sh.h, sh.n, sh.d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ang = torch.rand(sh.n, sh.d // 2, device="cuda", dtype=torch.float64) * 6.283
    cos = torch.cos(ang).repeat_interleave(2, dim=-1).float()[None, :, None, :]
    sin = torch.sin(ang).repeat_interleave(2, dim=-1).float()[None, :, None, :]
    table = fuse_rope_and_rotation(cos, sin, make_rotation(rotation, sh.d)).to(dtype=torch.float32)
    return (q, k, v, table, cos, sin) if cos_sin else (q, k, v, table)


def profile_kernels(name, pre2, pre1):
    for label, fn in (("two-pass", pre2), ("fused", pre1)):
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
        print(f"## {name} {label} (5 calls)")
        for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:8]:
            print(f"  {e.device_time_total / 5 / 1000:8.3f} ms/call  x{e.count // 5}  {e.key[:90]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="*", default=["wan1.3b-480p", "wan14b-480p", "wan14b-720p", "hunyuan-720p"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rotation", default="half", help="none, interleaved, half or full (default half)")
    ap.add_argument("--profile", action="store_true", help="per-kernel GPU time of both pre-processings instead")
    args = ap.parse_args()
    smooth_v = smooth_v_for("int8-fp8", None)
    print(f"smooth_k True, smooth_v {smooth_v} (the runtime's int8-fp8 defaults); rotation {args.rotation}")
    if not args.profile:
        print("| shape | no-rope pre (ms) | two-pass pre (ms) | fused pre (ms) | saved (ms) | two-pass attn (ms) | "
              "fused attn (ms) | saved share | same bytes |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.shapes:
        sh = SHAPES[name]
        q, k, v, table, cos, sin = wan_inputs(sh, args.rotation, cos_sin=True)
        rot = lambda x: apply_generalized_rope(x, table)  # noqa: E731
        pre2 = lambda: cb.preprocess_int8fp8_cuda(rot(q), rot(k), v, smooth_v=smooth_v)  # noqa: E731
        pre1 = lambda: cb.preprocess_int8fp8_cuda(q, k, v, smooth_v=smooth_v, rope=table)  # noqa: E731
        if args.profile:
            profile_kernels(name, pre2, pre1)
        else:
            bits = lambda t: t.view(torch.int32) if t.dtype == torch.float32 else t  # noqa: E731
            same = all((x is None and y is None) or torch.equal(bits(x), bits(y)) for x, y in zip(pre2(), pre1()))
            fns = {
                "pre0": lambda: cb.preprocess_int8fp8_cuda(q, k, v, smooth_v=smooth_v),
                "pre2": pre2,
                "pre1": pre1,
                "attn2": lambda: cb.int8fp8_attention_cuda(rot(q), rot(k), v, smooth_v=smooth_v),
                "attn1": lambda: cb.int8fp8_attention_cuda(q, k, v, smooth_v=smooth_v, rope=table),
            }
            if args.rotation == "full":
                hm = hadamard_matrix(sh.d, torch.float32, "cuda")
                old = lambda x: (apply_rope_interleaved(x, cos, sin).float() @ hm).to(x.dtype)  # noqa: E731
                fns["pre_mm"] = lambda: cb.preprocess_int8fp8_cuda(old(q), old(k), v, smooth_v=smooth_v)
            times = time_interleaved(fns, args.rounds)
            saved = times["pre2"] - times["pre1"]
            print(f"| {name} | {times['pre0']:.3f} | {times['pre2']:.3f} | {times['pre1']:.3f} | {saved:.3f} | {times['attn2']:.3f} | "
                  f"{times['attn1']:.3f} | {100 * (times['attn2'] - times['attn1']) / times['attn2']:.2f}% | {same} |"
                  + (f" matmul pre {times['pre_mm']:.3f} ms |" if "pre_mm" in times else ""), flush=True)
        del q, k, v, table, cos, sin
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
