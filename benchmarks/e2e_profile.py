"""Where one compiled forward's GPU time goes, bf16 SDPA vs rotvid, per kernel.

Builds an ``e2e_bench`` setup (random weights, real shapes), compiles the untouched transformer and
then the rotvid one (``apply(..., compile=...)``, schedule none: every self-attention call quantized),
and profiles ``--forwards`` forwards of each after warm-up. Prints, per row, the kernels by self GPU time
per forward and a summary by group (attention, rotvid pre-processing, everything else), so the two rows'
non-attention time can be compared.

    python -m benchmarks.e2e_profile --setup wan14b-720p-slice --rotation half
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from rotvid.pipelines import RotvidConfig, apply, remove
from rotvid.pipelines.compiling import compile_transformers, uncompile_transformers

from benchmarks.e2e_bench import build, make_setup

# Substrings of kernel names, first match wins.
GROUPS = (
    ("attention", ("attention", "flash", "fmha", "cudnn", "sdpa", "attn_")),
    ("rotvid pre + split combine",
     ("preprocess", "rope_", "quantize", "quant_", "stats_kernel", "colsum", "combine_splits")),
    ("gemm", ("gemm", "sm90_xmma", "cutlass", "nvjet", "matmul")),
)


def group_of(name: str) -> str:
    low = name.lower()
    for group, keys in GROUPS:
        if any(k in low for k in keys):
            return group
    return "other (elementwise, norms, copies)"


def self_gpu_us(evt) -> float:
    for attr in ("self_device_time_total", "self_cuda_time_total"):
        val = getattr(evt, attr, None)
        if val is not None:
            return float(val)
    return 0.0


def profile_row(label: str, model, inputs, forwards: int, top: int) -> dict:
    with torch.inference_mode():
        for _ in range(3):
            model(**inputs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(forwards):
                model(**inputs)
            torch.cuda.synchronize()
    rows = [(evt.key, self_gpu_us(evt) / forwards / 1e3, evt.count // forwards) for evt in prof.key_averages()]
    rows = [r for r in rows if r[1] > 0]
    rows.sort(key=lambda r: -r[1])
    total = sum(r[1] for r in rows)
    groups: dict[str, float] = {}
    for name, ms, _ in rows:
        groups[group_of(name)] = groups.get(group_of(name), 0.0) + ms
    print(f"\n## {label}: GPU time per forward {total:.1f} ms (sum of kernel self times)")
    print("| kernel | ms / forward | launches / forward | group |\n| --- | --- | --- | --- |")
    for name, ms, n in rows[:top]:
        print(f"| `{name[:90]}` | {ms:.2f} | {n} | {group_of(name)} |")
    print("\n| group | ms / forward |\n| --- | --- |")
    for g, ms in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"| {g} | {ms:.2f} |")
    return groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setup", default="wan14b-720p-slice")
    ap.add_argument("--slice-layers", type=int, default=4)
    ap.add_argument("--rotation", default="half")
    ap.add_argument("--recipe", default="auto")
    ap.add_argument("--forwards", type=int, default=2)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    setup = make_setup(args.setup, 50, args.slice_layers)
    model, inputs = build(setup, 0)
    opts = {"fullgraph": True}

    compiled = compile_transformers({"transformer": model}, opts)
    try:
        base = profile_row("compiled bf16 SDPA", model, inputs, args.forwards, args.top)
    finally:
        uncompile_transformers({"transformer": model}, compiled)
    torch._dynamo.reset()

    handle = apply(model, RotvidConfig(recipe=args.recipe, rotation=args.rotation, schedule="none"), compile=opts)
    try:
        handle.tracker.begin(50)
        handle.tracker.set_step(25)
        rot = profile_row(f"compiled rotvid {args.recipe}, rotation {args.rotation}", model, inputs, args.forwards,
                          args.top)
        print(f"\nfallbacks: {handle.report.fallbacks}, backends: {sorted(handle.report.backends)}")
    finally:
        remove(model)
    print("\n| group | SDPA ms | rotvid ms | difference |\n| --- | --- | --- | --- |")
    for g in sorted(set(base) | set(rot)):
        print(f"| {g} | {base.get(g, 0):.2f} | {rot.get(g, 0):.2f} | {rot.get(g, 0) - base.get(g, 0):+.2f} |")


if __name__ == "__main__":
    main()
