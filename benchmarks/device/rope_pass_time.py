"""Device aid (session 8): what a RoPE·R pass fused into the pre-processing could save at most.

Times, on the kernel_bench shapes with RoPE on every token (Wan): the one-pass Triton RoPE·R kernel on Q and on K
(half rotation, the default; the generalized table shared by the heads), the int8-fp8 pre-processing, and the
int8-fp8 attention with pre-processing, in interleaved rounds (kernel_bench.time_interleaved). A pre-processing
that applied RoPE·R itself would remove at most the two RoPE passes (it still reads Q and K once).

    python3 benchmarks/device/rope_pass_time.py [--shapes wan1.3b-480p wan14b-720p]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.kernel_bench import SHAPES, time_interleaved  # noqa: E402
from benchmarks.device.rope_fused_time import wan_inputs  # noqa: E402
from rotvid.kernels import cuda_backend as cb  # noqa: E402
from rotvid.kernels.rope_op import apply_generalized_rope  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--shapes", nargs="*", default=["wan1.3b-480p", "wan14b-480p", "wan14b-720p"])
ap.add_argument("--rounds", type=int, default=3)
args = ap.parse_args()
print("| shape | RoPE·R on Q + K (ms) | int8-fp8 pre-processing (ms) | int8-fp8 attention + pre (ms) | RoPE passes / (attention + pre + RoPE) |")
print("| --- | --- | --- | --- | --- |")
for name in args.shapes:
    sh = SHAPES[name]
    q, k, v, table = wan_inputs(sh)
    times = time_interleaved({
        "rope": lambda: (apply_generalized_rope(q, table), apply_generalized_rope(k, table)),
        "pre": lambda: cb.preprocess_int8fp8_cuda(q, k, v, smooth_v=False),
        "attn": lambda: cb.int8fp8_attention_cuda(q, k, v, smooth_v=False),
    }, args.rounds)
    share = times["rope"] / (times["attn"] + times["rope"])
    print(f"| {name} | {times['rope']:.3f} | {times['pre']:.3f} | {times['attn']:.3f} | {100 * share:.2f}% |", flush=True)
    del q, k, v, table
    torch.cuda.empty_cache()
