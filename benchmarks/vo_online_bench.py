"""What the online V/O Hadamard costs: one self-attention call as a pipeline makes it, with and without the rotation.

The runtime hands the quantized call BHND views of BNHD memory; with ``vo_hadamard="online"`` the call is prepared
with ``v_hadamard`` (:func:`rotvid.kernels.dispatch.prepare_attention`): on the int8-fp8 CUDA call the pre-processing
rotates V as it reads it and the attention kernel turns the output back in its epilogue at head_dim 128
(``AttnParams.o_hadamard``; one pass over the output inside the call at 64);
elsewhere V and O are rotated outside the kernel (the CUDA pass ``csrc/common/hadamard_rows.cu``, or the PyTorch
functions :func:`rotvid.rope.hadamard.rotate_v_online`, :func:`~rotvid.rope.hadamard.unrotate_o_online`).
This script times, per shape, in interleaved rounds on one GPU (same process, the order rotating per round):

* ``off``: the int8-fp8 call alone (what ``vo_hadamard="off"`` and ``"fused"`` run);
* ``online``: the call as the runtime makes it with ``vo_hadamard="online"`` (the fused path);
* ``online-pytorch``: the PyTorch path around the same call (what a call that cannot fuse runs: other recipes,
  blocks smaller than the head_dim);
* ``o-pass``: the separate CUDA pass over the output alone (what the calls that do not fuse the rotation run);
* ``off`` and ``online`` compiled (``torch.compile(fullgraph=True)``), as a compiled pipeline runs them;
* cuDNN bf16 SDPA, the baseline every kernel ratio in this project is against;

and prints the rotation's share of the call (eager, compiled, and the PyTorch path's), with the cosine of each
output against float64 attention on sampled rows, after checking that the fused and the PyTorch path are one
rounding apart (the kernel's inverse rounds once, the PyTorch path rounds the rotated output first). Rows go to
``benchmarks/results/vo_online_bench.json`` (GPU, commit, command).

    python -m benchmarks.vo_online_bench [--shapes wan1.3b-480p wan14b-720p cogvideox5b] [--rounds 3] [--no-write]
    python -m benchmarks.vo_online_bench --kernels [--shapes ...]   # where the cost goes, kernel by kernel
    python -m benchmarks.vo_online_bench --kernels --epilogue-head-dims 64 128 --shapes cogvideox5b  # 64 in-kernel too
    ncu --profile-from-start off --clock-control none --set full --kernel-name regex:hopper_attention \
        python -m benchmarks.vo_online_bench --profile-window --epilogue-head-dims 64 128 --shapes cogvideox5b

``--kernels`` times no ratio: it runs ``off`` and ``online`` eagerly under ``torch.profiler`` (``--iters`` calls each
per round, the two alternating over ``--rounds`` rounds, after a warm-up) and prints every kernel's mean GPU time
per call for both, so the rotation's cost is seen kernel by kernel (the statistics and quantize launches of the
pre-processing, the attention with its epilogue). ``--epilogue-head-dims`` sets
:data:`rotvid.kernels.recipes.int8_fp8.ops.O_EPILOGUE_HEAD_DIMS` for the run (the head dims whose output the kernel's
epilogue turns back; the others take the pass). ``--profile-window`` runs ``off`` and ``online`` once each after a
warm-up between ``cudaProfilerStart`` / ``Stop``, for a profiler started with the window off (Nsight Compute's
``--profile-from-start off``), and times nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from rotvid.kernels.dispatch import prepare_attention, unrotate_output
from rotvid.kernels.hadamard_op import vo_hadamard_cuda
from rotvid.pipelines.runtime import attention_into_bnhd, run_into_bnhd
from rotvid.rope.hadamard import rotate_v_online, unrotate_o_online, vo_hadamard_block

from benchmarks.kernel_bench import SHAPES, cos_fp64_rows, time_interleaved
from benchmarks.provenance import git_commit
from benchmarks.study_io import command_line
from benchmarks.timing import kernel_us

RESULTS = Path(__file__).resolve().parent / "results" / "vo_online_bench.json"


OPTS = dict(recipe="int8-fp8", backend="cuda")


def _inputs(name: str, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded q, k, v of shape ``name``: BHND views of BNHD memory, as the processors give; k with a shared channel
    bias, as real keys have (the recipes smooth it away)."""
    shape = SHAPES[name]
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(shape.b, shape.n, shape.h, shape.d, device="cuda", dtype=torch.bfloat16,
                           generator=g).transpose(1, 2) for _ in range(3))
    return q, k + 0.5, v


def off(q, k, v):
    """The int8-fp8 call without the rotation."""
    return attention_into_bnhd(q, k, v, **OPTS)


def online(q, k, v):
    """The runtime's call with ``vo_hadamard="online"``: prepared once with the rotation, run, turned back."""
    block = vo_hadamard_block(q.shape[-1])
    call = prepare_attention(q, k, v, v_hadamard=block, **OPTS)
    return unrotate_output(call, run_into_bnhd(call, q, k, v))


def bench(name: str, rounds: int, seed: int = 0) -> list[dict]:
    shape = SHAPES[name]
    q, k, v = _inputs(name, seed)
    block = vo_hadamard_block(shape.d)

    def online_pytorch(q, k, v):
        return unrotate_o_online(attention_into_bnhd(q, k, rotate_v_online(v, block), **OPTS), block)

    if not prepare_attention(q, k, v, v_hadamard=block, **OPTS).v_hadamard_fused:
        raise SystemExit(f"vo_online_bench.py: {name}: the int8-fp8 CUDA call does not fuse the rotation here")
    o_rot = off(q, k, v)

    def o_pass(q, k, v):
        return vo_hadamard_cuda(o_rot, block, side="o")

    def sdpa(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    fns = {"cudnn": sdpa, "off": off, "online": online, "online-pytorch": online_pytorch, "o-pass": o_pass,
           "off-compiled": torch.compile(off, fullgraph=True), "online-compiled": torch.compile(online, fullgraph=True)}
    fused, unfused = online(q, k, v).float(), online_pytorch(q, k, v).float()
    rms_diff, rms = (fused - unfused).pow(2).mean().sqrt().item(), unfused.pow(2).mean().sqrt().item()
    if not rms_diff <= 4 * 2.0**-8 * rms:  # (bf16: test_cuda_int8fp8_vo_hadamard.assert_one_rounding_apart)
        raise SystemExit(f"vo_online_bench.py: {name}: the fused and the PyTorch path are more than one rounding "
                         f"apart (rms difference {rms_diff:.3g}, output rms {rms:.3g}: run "
                         "tests/kernels/test_cuda_int8fp8_vo_hadamard.py)")
    rows = torch.randperm(shape.n, generator=torch.Generator().manual_seed(seed))[:256].to("cuda")
    cos = {m: cos_fp64_rows(fns[m](q, k, v), q, k, v, rows, None) for m in ("off", "online")}
    times = time_interleaved({m: (lambda f=f: f(q, k, v)) for m, f in fns.items()}, rounds)
    out = []
    for method, ms in times.items():
        out.append(dict(shape=name, method=method, ms=round(ms, 4), ratio_to_cudnn=round(times["cudnn"] / ms, 4),
                        cos_fp64=round(cos[method], 6) if method in cos else None))
    shares = {
        "overhead-eager": times["online"] / times["off"] - 1,
        "overhead-compiled": times["online-compiled"] / times["off-compiled"] - 1,
        "overhead-pytorch": times["online-pytorch"] / times["off"] - 1,
        "o-pass-share": times["o-pass"] / times["off"],
    }
    out += [dict(shape=name, method=label, share=round(share, 5)) for label, share in shares.items()]
    return out


def kernel_breakdown(name: str, iters: int, rounds: int = 1, seed: int = 0) -> list[dict]:
    """Mean GPU time per call of every kernel ``off`` and ``online`` launch (torch.profiler, ``iters`` calls per
    method and round; the methods alternate over ``rounds`` rounds, so a drift of the GPU's clocks falls on all) and of
    ``off-rotated-v``: the plain call on V rotated beforehand (PyTorch) -- the plain kernels on the rotated operands,
    so its attention row against ``off``'s is what the rotated data alone costs (clocks, power) and against
    ``online``'s what the epilogue costs on the same data."""
    q, k, v = _inputs(name, seed)
    v_rot = rotate_v_online(v, vo_hadamard_block(q.shape[-1]))

    def off_rotated_v(q, k, v):
        return off(q, k, v_rot)

    methods = (("off", off), ("off-rotated-v", off_rotated_v), ("online", online))
    for _, fn in methods:
        for _ in range(3):
            fn(q, k, v)
    torch.cuda.synchronize()
    per_kernel: dict[str, dict[str, float]] = {m: {} for m, _ in methods}
    for _ in range(rounds):
        for method, fn in methods:
            acc = per_kernel[method]
            for k_name, us in kernel_us(lambda fn=fn: fn(q, k, v), iters).items():
                acc[k_name] = acc.get(k_name, 0.0) + us / rounds
    return [dict(shape=name, method=method, kernel=k_name[:110], us=round(us, 1))
            for method, _ in methods for k_name, us in sorted(per_kernel[method].items(), key=lambda kv: -kv[1])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="*", default=["wan1.3b-480p", "wan14b-720p", "cogvideox5b"],
                    choices=list(SHAPES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--kernels", action="store_true", help="per-kernel GPU times of off and online (torch.profiler)")
    ap.add_argument("--iters", type=int, default=10, help="--kernels: profiled calls per method")
    ap.add_argument("--epilogue-head-dims", type=int, nargs="+", choices=(64, 128), default=None,
                    help="head dims turned back in the kernel's epilogue (default: the recipe's, 128)")
    ap.add_argument("--profile-window", action="store_true",
                    help="off and online once each between cudaProfilerStart / Stop (for ncu), no timing")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("vo_online_bench.py: needs a CUDA GPU")
    if args.epilogue_head_dims is not None:
        from rotvid.kernels.recipes.int8_fp8 import ops as int8fp8_ops

        int8fp8_ops.O_EPILOGUE_HEAD_DIMS = tuple(args.epilogue_head_dims)
    if args.profile_window:
        for name in args.shapes:
            q, k, v = _inputs(name, 0)
            for _ in range(2):
                off(q, k, v)
                online(q, k, v)
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            off(q, k, v)
            online(q, k, v)
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
        return
    if args.kernels:
        for name in args.shapes:
            print(f"\n{name}: kernel, mean GPU µs per call (off / off on rotated V / online)")
            rows = kernel_breakdown(name, args.iters, args.rounds)
            names = list(dict.fromkeys(r["kernel"] for r in rows))
            methods = ("off", "off-rotated-v", "online")
            for kn in names:
                t = {r["method"]: r["us"] for r in rows if r["kernel"] == kn}
                print("  " + " ".join(f"{t.get(m, 0.0):10.1f}" for m in methods) + f"  {kn}")
            tot = {m: sum(r["us"] for r in rows if r["method"] == m) for m in methods}
            print("  " + " ".join(f"{tot[m]:10.1f}" for m in methods) + "  (sum)")
        return
    rows = []
    for name in args.shapes:
        rows += bench(name, args.rounds)
        for r in rows:
            if r["shape"] == name:
                print(json.dumps(r), flush=True)
    print("\n| shape | int8-fp8 call (ms) | + online V/O Hadamard (ms) | share, eager | share, compiled "
          "| O pass alone | PyTorch path's share | cos fp64 off / online |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.shapes:
        by = {r["method"]: r for r in rows if r["shape"] == name}
        print(f"| {name} | {by['off']['ms']:.3f} | {by['online']['ms']:.3f} | {100 * by['overhead-eager']['share']:+.2f}% "
              f"| {100 * by['overhead-compiled']['share']:+.2f}% | {by['o-pass']['ms'] * 1e3:.1f} µs "
              f"({100 * by['o-pass-share']['share']:.2f}%) | {100 * by['overhead-pytorch']['share']:+.2f}% "
              f"| {by['off']['cos_fp64']:.5f} / {by['online']['cos_fp64']:.5f} |")
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        doc = dict(device=torch.cuda.get_device_name(), commit=git_commit(), command=command_line("vo_online_bench", None),
                   torch=torch.__version__, rows=rows)
        RESULTS.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
