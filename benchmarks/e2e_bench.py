"""End-to-end benchmark: one Wan2.1-1.3B transformer forward at 480p / 81 frames, bf16 SDPA vs rotvid.

Speed does not depend on the weights' values, so the full-size architecture is built with random
weights (``WanTransformer3DModel`` with the released Wan2.1-T2V-1.3B config: 30 blocks, 12 heads
of 128, ffn 8960, text_dim 4096) and fed random inputs of the real shapes: latents
[1, 16, 21, 60, 104] (480x832, 81 frames -> 21 x 30 x 52 = 32760 video tokens) and a 512-token
UMT5 text embedding.

Rows (median of CUDA-event timings after warm-up, same process):

* ``bf16 SDPA`` — the untouched transformer (diffusers' own attention);
* ``rotvid fp16 step`` — rotvid applied (half rotation + V/O Hadamard), a step the schedule keeps
  in FP16 (every block runs SDPA on the rotated tensors: the cost of rotvid's Q/K path alone);
* ``rotvid mixed step`` — a middle step of the paper's Wan T2V schedule (FP16 for the first and last
  2 steps and blocks): blocks 2..27 run the quantized recipe on the ``cuda`` backend.

The 50-step estimate multiplies per-step transformer time by 2 forwards (cond + uncond) and the
schedule's step counts (2 + 2 FP16 steps, 46 mixed); VAE and text encoder are not included.
Peak GPU memory is ``torch.cuda.max_memory_allocated`` during each row's forwards.

When the CUDA kernel cannot run the shape (not built yet, no nvcc, unsupported GPU), the rotvid
mixed row is left empty with the dispatcher's reason — the PyTorch reference is an exact model of
the kernels, not a fast path — unless ``--allow-reference`` is given.

    python benchmarks/e2e_bench.py                       # full size on a GPU, appends to benchmarks/RESULTS.md
    python benchmarks/e2e_bench.py --no-append
    python benchmarks/e2e_bench.py --tiny                # CPU smoke run (tiny model, reference backend)
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rotvid import kernels  # noqa: E402
from rotvid.pipelines import RotvidConfig, apply, remove, schedule_preset  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"

WAN21_13B = dict(
    patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
    text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
    qk_norm="rms_norm_across_heads", eps=1e-6,
)
TINY = dict(
    patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=64, in_channels=4, out_channels=4,
    text_dim=32, freq_dim=32, ffn_dim=64, num_layers=6, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
    eps=1e-6, rope_max_seq_len=64,
)


@dataclass(frozen=True)
class Setup:
    name: str
    config: dict
    latent: tuple[int, int, int, int, int]  # B, C, F, H, W
    text_len: int
    device: str
    dtype: torch.dtype
    steps: int = 50
    forwards_per_step: int = 2  # classifier-free guidance: cond + uncond


def full_setup(steps: int) -> Setup:
    return Setup("wan2.1-1.3b 480p 81f", WAN21_13B, (1, 16, 21, 60, 104), 512, "cuda", torch.bfloat16, steps)


def tiny_setup(steps: int) -> Setup:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    return Setup("tiny wan (smoke)", TINY, (1, 4, 3, 16, 16), 16, dev, torch.float32, steps)


def cast_like_from_pretrained(model, dtype: torch.dtype) -> None:
    """Cast parameters to ``dtype`` except the modules diffusers keeps in float32 when loading
    (``model._keep_in_fp32_modules``: Wan's rope, time embedder, scale/shift tables, norms)."""
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    for name, p in model.named_parameters():
        parts = set(name.split("."))
        p.data = p.data.to(torch.float32 if parts & keep else dtype)


def build(setup: Setup, seed: int):
    """The transformer with random weights and random inputs of the real shapes."""
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    with torch.device(setup.device):
        model = WanTransformer3DModel(**setup.config)
    cast_like_from_pretrained(model, setup.dtype)
    model = model.eval().requires_grad_(False)
    g = torch.Generator(device=setup.device).manual_seed(seed + 1)
    x = torch.randn(setup.latent, generator=g, device=setup.device, dtype=setup.dtype)
    text = torch.randn(1, setup.text_len, setup.config["text_dim"], generator=g, device=setup.device, dtype=setup.dtype)
    t = torch.tensor([500.0], device=setup.device)
    return model, dict(hidden_states=x, encoder_hidden_states=text, timestep=t, return_dict=False)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_forward(model, inputs, device: str, warmup: int, iters: int) -> tuple[float, float | None]:
    """(median ms per forward, peak GB or None on CPU)."""
    with torch.inference_mode():
        for _ in range(warmup):
            model(**inputs)
        sync(device)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(iters):
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                model(**inputs)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                model(**inputs)
                times.append((time.perf_counter() - t0) * 1e3)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return statistics.median(times), peak


def kernel_probe(setup: Setup, recipe: str, backend: str) -> tuple[str, str]:
    """(backend name, reason) the dispatcher picks for one self-attention of this shape."""
    b, c, f, h, w = setup.latent
    p = setup.config["patch_size"]
    n = (f // p[0]) * (h // p[1]) * (w // p[2])
    heads, d = setup.config["num_attention_heads"], setup.config["attention_head_dim"]
    q = torch.randn(b, heads, n, d, device=setup.device, dtype=setup.dtype)
    try:
        chosen, why = kernels.select_backend(q, q, q, backend=backend, recipe=recipe, layout="BHND", kv_lens=None)
    except ValueError as e:
        return "none", str(e)
    return chosen.name, why


def run(args) -> tuple[list[dict], Setup, dict]:
    setup = tiny_setup(args.steps) if args.tiny else full_setup(args.steps)
    if setup.device == "cuda" and not torch.cuda.is_available():
        sys.exit("e2e_bench: the full-size run needs a CUDA GPU (use --tiny for a CPU smoke run)")
    backend = "reference" if args.tiny and setup.device == "cpu" else args.backend
    model, inputs = build(setup, args.seed)
    schedule = schedule_preset(args.schedule)
    num_blocks = setup.config["num_layers"]
    rows = []

    ms, peak = time_forward(model, inputs, setup.device, args.warmup, args.iters)
    rows.append(dict(method="bf16 SDPA" if setup.dtype == torch.bfloat16 else f"{setup.dtype} SDPA", ms=ms, peak=peak, note=""))

    # Which backend runs the quantized blocks: the CUDA kernel if it takes this shape, else
    # (only when asked, or for --tiny) the PyTorch reference, else nothing (row left empty).
    name, why = kernel_probe(setup, args.recipe, backend)
    run_mixed = name == "cuda" or args.tiny or args.allow_reference
    effective = backend if name == "cuda" else "reference"
    cfg = RotvidConfig(recipe=args.recipe, rotation=args.rotation, vo_hadamard=True, backend=effective, schedule=schedule)
    handle = apply(model, cfg)
    try:
        handle.tracker.begin(setup.steps)
        handle.tracker.set_step(0)
        ms, peak = time_forward(model, inputs, setup.device, args.warmup, args.iters)
        rows.append(dict(method="rotvid fp16 step", ms=ms, peak=peak, note=f"{args.rotation} rotation + V/O Hadamard, SDPA"))
        if not run_mixed:
            rows.append(dict(method="rotvid mixed step", ms=None, peak=None,
                             note=f"CUDA kernel not available ({why}); row left for it"))
        else:
            handle.tracker.set_step(setup.steps // 2)
            handle.reset_report()
            ms, peak = time_forward(model, inputs, setup.device, args.warmup, args.iters)
            rep = handle.report
            per_fwd_q = rep.quantized_calls / max(1, rep.total_calls) * num_blocks
            used = ", ".join(sorted(rep.backends)) or "none"
            rows.append(dict(method="rotvid mixed step", ms=ms, peak=peak,
                             note=f"{args.recipe} on {int(round(per_fwd_q))}/{num_blocks} blocks, backend {used}"))
            if rep.fallbacks:
                rows[-1]["note"] += f"; FALLBACKS: {rep.fallbacks}"
    finally:
        remove(model)

    # 50-step estimate under the schedule.
    fp16_steps = sum(1 for s in range(setup.steps) if s < schedule.fp16_first_steps or s >= setup.steps - schedule.fp16_last_steps)
    mixed_steps = setup.steps - fp16_steps
    base = rows[0]["ms"] * setup.steps * setup.forwards_per_step / 1e3
    est = {"baseline_s": base, "fp16_steps": fp16_steps, "mixed_steps": mixed_steps}
    if rows[2]["ms"] is not None:
        est["rotvid_s"] = (rows[1]["ms"] * fp16_steps + rows[2]["ms"] * mixed_steps) * setup.forwards_per_step / 1e3
        est["speedup"] = base / est["rotvid_s"]
    from rotvid.pipelines import expected_quantized_fraction

    est["int4_fraction"] = expected_quantized_fraction(schedule, setup.steps, (num_blocks,))
    return rows, setup, est


def device_name(setup: Setup) -> str:
    if setup.device == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU ({os.cpu_count()} threads)"


def git_commit() -> str:
    commit = os.environ.get("ROTVID_COMMIT")
    if commit:
        return commit
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def markdown(rows: list[dict], setup: Setup, est: dict, args) -> str:
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    b, c, f, h, w = setup.latent
    lines = [
        f"### e2e_bench: {device_name(setup)}, {date}, commit {git_commit()}",
        "",
        f"torch {torch.__version__}; {setup.name}, random weights; latents {b}x{c}x{f}x{h}x{w}, text {setup.text_len} "
        f"tokens, {setup.dtype}; schedule {args.schedule}, rotation {args.rotation}, recipe {args.recipe}; "
        f"median of {args.iters} forwards after {args.warmup} warm-up; ratio = SDPA time / row time (same run).",
        "",
        "| method | ms / forward | vs SDPA | peak GB | note |",
        "| --- | --- | --- | --- | --- |",
    ]
    base = rows[0]["ms"]
    for r in rows:
        if r["ms"] is None:
            lines.append(f"| {r['method']} | — | — | — | {r['note']} |")
            continue
        peak = f"{r['peak']:.1f}" if r["peak"] is not None else "—"
        lines.append(f"| {r['method']} | {r['ms']:.1f} | {base / r['ms']:.3f}× | {peak} | {r['note']} |")
    lines.append("")
    line = (
        f"{setup.steps}-step estimate (x{setup.forwards_per_step} forwards for CFG, transformer only): "
        f"SDPA {est['baseline_s']:.1f} s"
    )
    if "rotvid_s" in est:
        line += (
            f"; rotvid {est['rotvid_s']:.1f} s ({est['fp16_steps']} FP16 + {est['mixed_steps']} mixed steps) "
            f"= {est['speedup']:.3f}×"
        )
    else:
        line += "; rotvid: — (no CUDA kernel in this run)"
    line += f"; INT4 fraction of self-attention calls {100 * est['int4_fraction']:.1f}%."
    lines.append(line)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny model on CPU (or the GPU if present): a smoke run")
    ap.add_argument("--steps", type=int, default=50, help="denoising steps of the estimate (default 50)")
    ap.add_argument("--schedule", default="paper-wan2.2-t2v", help="schedule preset (default paper-wan2.2-t2v)")
    ap.add_argument("--rotation", default="half", help="Q/K rotation (default half)")
    ap.add_argument("--recipe", default="int4", help="quantized recipe (default int4)")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "auto", "reference"),
                    help="rotvid backend for the full-size run (default cuda)")
    ap.add_argument("--allow-reference", action="store_true", help="time the PyTorch reference if no kernel runs")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up forwards per row (default 2; tiny 1)")
    ap.add_argument("--iters", type=int, default=None, help="timed forwards per row (default 5; tiny 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--append", type=Path, default=None,
                    help=f"results file to append to (default {RESULTS.relative_to(RESULTS.parents[1])} for full runs)")
    ap.add_argument("--no-append", action="store_true", help="print only")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps: expected a positive int")
    if args.warmup is None:
        args.warmup = 1 if args.tiny else 2
    if args.iters is None:
        args.iters = 2 if args.tiny else 5
    rows, setup, est = run(args)
    md = markdown(rows, setup, est, args)
    print(md)
    target = args.append if args.append is not None else (None if args.tiny else RESULTS)
    if target is not None and not args.no_append:
        with open(target, "a") as fh:
            fh.write("\n" + md)
        print(f"appended to {target}")
    return md


if __name__ == "__main__":
    main()
