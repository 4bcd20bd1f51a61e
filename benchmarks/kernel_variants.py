"""Tuning aid: time the Hopper attention kernel under other schedules (stages, ping-pong, pipe) than the ones its table
ships (rotvid/kernels/csrc/hopper/hopper_schedule.cuh), attention only (pre-processing excluded), against cuDNN bf16.

    python -m benchmarks.kernel_variants --recipe int4 --schedules table 3,2,1 4,1,1 --shapes wan1.3b-480p
    python -m benchmarks.kernel_variants --recipe int8-fp8 --schedules table 3,0,1 --shapes cogvideox5b

How: the schedule is a compile-time choice (a release build reads no environment variable). For each setting the
script runs itself in a child process with ``ROTVID_EXT_CUDA_FLAGS="-DROTVID_HOPPER_STAGES=s -DROTVID_HOPPER_PINGPONG=p
-DROTVID_HOPPER_PIPE=q"`` for the setting ``s,p,q`` (every row of the table takes that schedule; the numerics stay
the table's) and ``ROTVID_EXT_CACHE`` set to its own folder (``hopper-schedule-s-p-q`` under the usual cache), so
each setting is its own extension, built on first use (minutes) and reused afterwards; ``table`` is the shipping
build, without the flags; ``def:ROTVID_NAME=VALUE`` builds with that macro (e.g. ``def:ROTVID_HOPPER_RELEASE=1``, an
experiment's switch in the kernel source). Each child times its kernel
and cuDNN in interleaved rounds (kernel_bench.time_interleaved) on the same seeded inputs as kernel_bench, and hashes
its output. The table: ms, TOP/s, speed relative to that child's own cuDNN, and whether the output has the first
setting's bits (a schedule does not change the numerics: expect yes). The settings run one after another, so compare
the vs-cuDNN column rather than raw ms across rows. Numbers for decisions only; recorded
results come from kernel_bench.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from rotvid.kernels import cuda_build
from rotvid.kernels.cuda_layout import SUPPORTED_BLOCK_N
from rotvid.kernels.recipes.int4.ops import attention_int4_quantized, default_block_n, preprocess_int4_cuda
from rotvid.kernels.recipes.int8_fp8.ops import attention_int8fp8_quantized, preprocess_int8fp8_cuda

from benchmarks.kernel_bench import SHAPES, time_interleaved

SCHEDULE = re.compile(r"^(table|\d+,[012],[012]|def:ROTVID_[A-Z_]+=\w+(\+ROTVID_[A-Z_]+=\w+)*)$")


def cache_for(setting: str) -> Path:
    return cuda_build.cache_dir() / ("hopper-schedule-" + re.sub(r"[^A-Za-z0-9_]+", "-", setting))


def flags_for(setting: str) -> str | None:
    """The nvcc flags of a setting: none for the table; the schedule's three macros; a ``def:`` setting's macros."""
    if setting == "table":
        return None
    if setting.startswith("def:"):
        return " ".join(f"-D{d}" for d in setting[4:].split("+"))
    stages, pingpong, pipe = setting.split(",")
    return f"-DROTVID_HOPPER_STAGES={stages} -DROTVID_HOPPER_PINGPONG={pingpong} -DROTVID_HOPPER_PIPE={pipe}"


def child(args) -> None:
    """Time one setting's extension (this process was started with its build flags) on every shape."""
    results = {}
    for shape_name in args.shapes:
        s = SHAPES[shape_name]
        torch.manual_seed(0)
        q, k, v = (torch.randn(s.b, s.h, s.n, s.d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        k += torch.randn(1, s.h, 1, s.d, device="cuda", dtype=torch.bfloat16)  # as kernel_bench: a channel bias
        kv_lens = None if s.kv_len is None else torch.full((s.b,), s.kv_len, dtype=torch.int32, device="cuda")
        if args.recipe == "int4":
            block_n = args.block_n or default_block_n()
            qkv = preprocess_int4_cuda(q, k, v, kv_lens=kv_lens, block_n=block_n, p_mode=args.p_mode,
                                       smooth_v=args.smooth, smooth_q=args.smooth)

            def kernel():
                return attention_int4_quantized(qkv, n_q=s.n, n_kv=s.n, head_dim=s.d, block_n=block_n,
                                                kv_lens=kv_lens, p_mode=args.p_mode, out_dtype=q.dtype)
        else:
            qkv = preprocess_int8fp8_cuda(q, k, v, kv_lens=kv_lens, smooth_v=args.smooth)

            def kernel():
                return attention_int8fp8_quantized(qkv, n_q=s.n, n_kv=s.n, head_dim=s.d, kv_lens=kv_lens,
                                                   out_dtype=q.dtype)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v)

        bits = hashlib.sha256(kernel().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()
        times = time_interleaved({"kernel": kernel, "cudnn": cudnn}, args.rounds)
        results[shape_name] = {"ms": times["kernel"], "cudnn_ms": times["cudnn"], "sha256": bits,
                               "tops": 4.0 * s.b * s.h * s.n * s.n * s.d / times["kernel"] / 1e9}
    Path(args.out).write_text(json.dumps(results))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", choices=["int4", "int8-fp8"], default="int4")
    ap.add_argument("--schedules", nargs="+", default=["table"],
                    help="'table' (the shipping build), stages,pingpong,pipe (pingpong and pipe 0, 1 or 2), or "
                         "def:ROTVID_NAME=VALUE[+ROTVID_NAME=VALUE] (a build with those macros)")
    ap.add_argument("--shapes", nargs="*", default=["wan1.3b-480p"], choices=list(SHAPES))
    ap.add_argument("--block-n", type=int, default=None, choices=SUPPORTED_BLOCK_N, help="int4 only")
    ap.add_argument("--p-mode", default="range", choices=["range", "sym"], help="int4 only")
    ap.add_argument("--smooth", action="store_true",
                    help="int4: smooth Q, K and V (the recipe's default) instead of K only; int8-fp8: V smoothed too")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)  # a setting: time it (started by the parent)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    for setting in args.schedules:
        if not SCHEDULE.match(setting):
            ap.error(f"--schedules: expected 'table', stages,pingpong,pipe (e.g. 3,1,1) or def:ROTVID_NAME=VALUE[+...] "
                     f"(e.g. def:ROTVID_HOPPER_RELEASE=1), got {setting!r}")
    results = {}
    for setting in args.schedules:
        cache = cache_for(setting)
        cache.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, ROTVID_EXT_CACHE=str(cache))
        env.pop("ROTVID_EXT_CUDA_FLAGS", None)
        if flags_for(setting):
            env["ROTVID_EXT_CUDA_FLAGS"] = flags_for(setting)
        out = cache / f"times-{args.recipe}.json"
        cmd = [sys.executable, "-m", "benchmarks.kernel_variants", "--child", setting, "--out", str(out),
               "--recipe", args.recipe, "--p-mode", args.p_mode, "--rounds", str(args.rounds), "--shapes", *args.shapes]
        if args.block_n:
            cmd += ["--block-n", str(args.block_n)]
        if args.smooth:
            cmd.append("--smooth")
        print(f"setting {setting}: building (first use) and timing in {cache} ...", flush=True)
        subprocess.run(cmd, env=env, check=True)
        results[setting] = json.loads(out.read_text())
    first = args.schedules[0]
    print(f"\n{torch.cuda.get_device_name()}, {args.recipe}, attention only")
    print(f"| shape | schedule | ms | TOP/s | vs cuDNN | bits of {first} |")
    print("| --- | --- | --- | --- | --- | --- |")
    for shape_name in args.shapes:
        ref = results[first][shape_name]["sha256"]
        for setting in args.schedules:
            r = results[setting][shape_name]
            same = "yes" if r["sha256"] == ref else "NO"
            print(f"| {shape_name} | {setting} | {r['ms']:.2f} | {r['tops']:.0f} | {r['cudnn_ms'] / r['ms']:.2f}× | "
                  f"{same} |")


if __name__ == "__main__":
    main()
