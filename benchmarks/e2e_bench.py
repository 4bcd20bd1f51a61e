"""End-to-end benchmark: Wan transformer forwards, eager and ``torch.compile``, bf16 SDPA vs rotvid.

Speed does not depend on the weights' values, so full-size architectures are built with random
weights and fed random inputs of the real shapes:

* ``wan2.1-1.3b 480p`` — ``WanTransformer3DModel`` with the released Wan2.1-T2V-1.3B config (30
  blocks, 12 heads of 128, ffn 8960, text_dim 4096); latents [1, 16, 21, 60, 104] (480x832, 81
  frames -> 32760 video tokens) and a 512-token UMT5 text embedding;
* ``wan14b 720p slice`` — a slice of ``--slice-layers`` blocks (default 4) of the Wan2.1/2.2-14B
  config (40 heads of 128 = 5120 wide, ffn 13824); latents [1, 16, 21, 90, 160] (720x1280, 81
  frames -> 75600 video tokens). The slice stands for middle blocks: the paper schedule's block
  rule (first/last 2 blocks FP16) is left out there, its step rule kept.

Rows, each in ``eager`` and ``compiled`` mode (``torch.compile(fullgraph=True)``, ``--compile-mode``;
rotvid compiled through ``apply(model, config, compile=...)``):

* ``bf16 SDPA`` — the untouched transformer (diffusers' own attention);
* ``rotvid <recipe>, all calls`` — the default recipe (``--recipe auto``: this GPU's, ``int8-fp8`` on
  Hopper, ``int4`` elsewhere; half rotation, V/O Hadamard) with schedule ``none``: every self-attention
  call quantized;
* ``rotvid <recipe>, paper schedule`` — ``--schedule`` (default the paper's Wan T2V one): the time of a
  forward averaged over the ``--steps`` steps of a run (FP16 steps and mixed steps each timed);
* ``SageAttention2-8b`` — ``sageattn_qk_int8_pv_fp8_cuda_sm90`` on every self-attention call,
  when the ``sageattention`` package can be imported (never a dependency). Its compiled row is
  not fullgraph (the extension is opaque to dynamo).

Columns: median ms per forward (CUDA events, after warm-up, same process), ratio to the eager and
to the same-mode SDPA row, peak GPU memory (``torch.cuda.max_memory_allocated`` during the timed
forwards), and compile time (first forward(s) of a compiled row minus its steady forward time; one
first forward per distinct plan). The N-step estimate multiplies per-forward times by 2 forwards
(cond + uncond); VAE and text encoder are not included.

When the CUDA kernel cannot run the shape (not built, no nvcc, unsupported GPU), the rotvid rows
are left empty with the dispatcher's reason — the PyTorch reference is an exact model of the
kernels, not a fast path — unless ``--allow-reference`` is given.

    python -m benchmarks.e2e_bench                       # both setups, eager + compiled; appends to RESULTS.md
    python -m benchmarks.e2e_bench --setups wan2.1-1.3b-480p --modes compiled --no-append
    python -m benchmarks.e2e_bench --tiny --modes eager  # CPU smoke run (tiny model, reference backend)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from rotvid import kernels
from rotvid.pipelines import (
    RotvidConfig, Schedule, apply, expected_quantized_fraction, remove, schedule_preset,
)
from rotvid.pipelines.compiling import compile_transformers, uncompile_transformers

from benchmarks.provenance import device_description, git_commit, utc_stamp
from benchmarks.random_wan import (
    LATENT_480P, LATENT_720P, WAN21_13B, WAN_14B, build_random_wan, video_tokens,
)
from benchmarks.results_log import add_append_options, append_table
from benchmarks.timing import call_ms, sync

TINY = dict(
    patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=64, in_channels=4, out_channels=4,
    text_dim=32, freq_dim=32, ffn_dim=64, num_layers=6, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
    eps=1e-6, rope_max_seq_len=64,
)
SETUPS = ("wan2.1-1.3b-480p", "wan14b-720p-slice")
MODES = ("eager", "compiled")
ROWS = ("sdpa", "all", "schedule", "sage")  # the SDPA row is every ratio's base: always timed


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
    middle_slice: bool = False  # a slice of middle blocks: no block rule in the schedule


def make_setup(name: str, steps: int, slice_layers: int) -> Setup:
    if name == "wan2.1-1.3b-480p":
        return Setup("wan2.1-1.3b 480p 81f", WAN21_13B, LATENT_480P, 512, "cuda", torch.bfloat16, steps)
    if name == "wan14b-720p-slice":
        cfg = dict(WAN_14B, num_layers=slice_layers)
        return Setup(f"wan 14B 720p 81f, {slice_layers}-block slice", cfg, LATENT_720P, 512, "cuda", torch.bfloat16,
                     steps, middle_slice=True)
    raise ValueError(f"--setups: expected names among {', '.join(SETUPS)}, got {name!r}")


def tiny_setup(steps: int) -> Setup:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    return Setup("tiny wan (smoke)", TINY, (1, 4, 3, 16, 16), 16, dev, torch.float32, steps)


def build(setup: Setup, seed: int):
    """The setup's transformer with random weights and random inputs of the real shapes."""
    return build_random_wan(setup.config, setup.latent, setup.text_len, setup.device, setup.dtype, seed)


def first_forward_s(model, inputs, device: str) -> float:
    """Seconds of one forward from cold (for a compiled model: tracing and code generation included)."""
    with torch.inference_mode():
        sync(device)
        t0 = time.perf_counter()
        model(**inputs)
        sync(device)
    return time.perf_counter() - t0


def time_forward(model, inputs, device: str, warmup: int, iters: int) -> tuple[float, float | None]:
    """(median ms per forward, peak GB or None on CPU)."""
    with torch.inference_mode():
        for _ in range(warmup):
            model(**inputs)
        sync(device)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times = [call_ms(lambda: model(**inputs), device) for _ in range(iters)]
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return statistics.median(times), peak


def kernel_probe(setup: Setup, recipe: str, backend: str) -> tuple[str, str]:
    """(backend name, reason) the dispatcher picks for one self-attention of this shape."""
    b, n = setup.latent[0], video_tokens(setup.config, setup.latent)
    heads, d = setup.config["num_attention_heads"], setup.config["attention_head_dim"]
    q = torch.randn(b, heads, n, d, device=setup.device, dtype=setup.dtype)
    try:
        chosen, why = kernels.select_backend(q, q, q, backend=backend, recipe=recipe, layout="BHND", kv_lens=None)
    except ValueError as e:
        return "none", str(e)
    return chosen.name, why


# ---- SageAttention2-8b (optional peer; never a dependency) -------------------------------------


def sage_function():
    """``sageattn_qk_int8_pv_fp8_cuda_sm90`` if the ``sageattention`` package imports, else None."""
    try:
        from sageattention import sageattn_qk_int8_pv_fp8_cuda_sm90
    except ImportError:
        return None
    return sageattn_qk_int8_pv_fp8_cuda_sm90


class SageSelfAttention:
    """Wan self-attention (``attn1``) with SageAttention2-8b in place of SDPA; the rest as diffusers."""

    def __init__(self, sage):
        self.sage = sage

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        from rotvid.rope.tables import apply_rope_interleaved

        q = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1)).transpose(1, 2)
        k = attn.norm_k(attn.to_k(hidden_states)).unflatten(2, (attn.heads, -1)).transpose(1, 2)
        v = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1)).transpose(1, 2)
        if rotary_emb is not None:
            q, k = apply_rope_interleaved(q, *rotary_emb), apply_rope_interleaved(k, *rotary_emb)
        out = self.sage(q.contiguous(), k.contiguous(), v.contiguous(), tensor_layout="HND",
                        qk_quant_gran="per_thread", pv_accum_dtype="fp32+fp32")
        out = out.transpose(1, 2).flatten(2, 3).type_as(q)
        return attn.to_out[1](attn.to_out[0](out))


# ---- rows -------------------------------------------------------------------------------------


def paper_schedule(setup: Setup, name: str) -> Schedule:
    sched = schedule_preset(name)
    if setup.middle_slice:
        return Schedule(sched.fp16_first_steps, sched.fp16_last_steps, 0, 0, name=f"{name}, steps only (slice)")
    return sched


def step_mix(schedule: Schedule, steps: int) -> tuple[int, int]:
    """(FP16 steps, mixed steps) of a run: the steps every block runs FP16, and the others."""
    fp16 = sum(1 for s in range(steps) if s < schedule.fp16_first_steps or s >= steps - schedule.fp16_last_steps)
    return fp16, steps - fp16


class RowTimer:
    """Times one row in one mode; ``compiled`` rows also report their compile time."""

    def __init__(self, setup: Setup, args, compiled: bool):
        self.setup, self.args, self.compiled = setup, args, compiled

    def measure(self, model, inputs) -> tuple[float, float | None, float]:
        """(ms, peak GB, compile s): the first forward is timed apart (the compile for a compiled row)."""
        first = first_forward_s(model, inputs, self.setup.device)
        ms, peak = time_forward(model, inputs, self.setup.device, self.args.warmup, self.args.iters)
        return ms, peak, max(0.0, first - ms / 1e3) if self.compiled else 0.0

    def compile_options(self, fullgraph: bool = True) -> dict:
        opts = {"fullgraph": fullgraph}
        if self.args.compile_mode != "default":
            opts["mode"] = self.args.compile_mode
        return opts


def sdpa_row(model, inputs, timer: RowTimer) -> dict:
    compiled = compile_transformers({"transformer": model}, timer.compile_options()) if timer.compiled else []
    try:
        ms, peak, cs = timer.measure(model, inputs)
    finally:
        uncompile_transformers({"transformer": model}, compiled)
    dtype = str(timer.setup.dtype).removeprefix("torch.")
    name = "bf16 SDPA" if timer.setup.dtype == torch.bfloat16 else f"{dtype} SDPA"
    return dict(method=name, ms=ms, peak=peak, compile_s=cs, note="")


def rotvid_rows(model, inputs, timer: RowTimer, backend: str, available: str | None) -> list[dict]:
    """``rotvid <recipe>, all calls`` and ``rotvid <recipe>, paper schedule`` (None ms when no kernel runs)."""
    args = timer.args
    methods = (f"rotvid {args.recipe}, all calls", f"rotvid {args.recipe}, paper schedule")
    wanted = ("all" in args.rows, "schedule" in args.rows)
    if available is not None:
        return [dict(method=m, ms=None, peak=None, compile_s=None, note=f"CUDA kernel not available ({available})")
                for m, w in zip(methods, wanted) if w]
    compile_arg = timer.compile_options() if timer.compiled else False
    rows = []
    if wanted[0]:
        rows.append(_rotvid_all_row(model, inputs, timer, backend, methods[0], compile_arg))
    if wanted[1]:
        rows.append(_rotvid_schedule_row(model, inputs, timer, backend, methods[1], compile_arg))
    for spec in args.sparsity:  # every call quantized and given the map
        rows.append(_rotvid_all_row(model, inputs, timer, backend, f"{methods[0]}, sparsity {spec}", compile_arg,
                                    sparsity=spec))
    return rows


def _rotvid_all_row(model, inputs, timer: RowTimer, backend: str, method: str, compile_arg,
                    sparsity: str = "none") -> dict:
    setup, args = timer.setup, timer.args
    num_blocks = setup.config["num_layers"]
    # Every call quantized: the default recipe, schedule none (one plan, one graph); with a block map if asked.
    cfg = RotvidConfig(recipe=args.recipe, rotation=args.rotation, backend=backend, schedule="none", sparsity=sparsity)
    handle = apply(model, cfg, compile=compile_arg)
    try:
        handle.tracker.begin(setup.steps)
        handle.tracker.set_step(setup.steps // 2)
        ms, peak, cs = timer.measure(model, inputs)
        rep = handle.report
        per_fwd = round(rep.quantized_calls / max(1, rep.total_calls) * num_blocks)
        note = f"{args.recipe} on {per_fwd}/{num_blocks} blocks, backend {', '.join(sorted(rep.backends)) or 'none'}"
        if rep.fallbacks:
            note += f"; FALLBACKS: {rep.fallbacks}"
        density = rep.mean_density if sparsity != "none" else 1.0
        if sparsity != "none":
            note += f"; sparsity {sparsity}, mean density {_fmt(density, '.3f')}"
    finally:
        remove(model)
    return dict(method=method, ms=ms, peak=peak, compile_s=cs, note=note, density=density)


def _rotvid_schedule_row(model, inputs, timer: RowTimer, backend: str, method: str, compile_arg) -> dict:
    setup, args = timer.setup, timer.args
    num_blocks = setup.config["num_layers"]
    # The paper schedule: an FP16 step and a mixed step (two plans, two graphs), weighted by the run.
    sched = paper_schedule(setup, args.schedule)
    fp16_steps, mixed_steps = step_mix(sched, setup.steps)
    handle = apply(model, RotvidConfig(recipe=args.recipe, rotation=args.rotation, backend=backend, schedule=sched),
                   compile=compile_arg)
    try:
        handle.tracker.begin(setup.steps)
        handle.tracker.set_step(0)
        ms_fp16, peak_fp16, cs_fp16 = timer.measure(model, inputs)
        handle.tracker.set_step(sched.fp16_first_steps if mixed_steps else 0)
        handle.reset_report()
        ms_mixed, peak_mixed, cs_mixed = timer.measure(model, inputs)
        rep = handle.report
        per_fwd_q = round(rep.quantized_calls / max(1, rep.total_calls) * num_blocks)
    finally:
        remove(model)
    ms = (ms_fp16 * fp16_steps + ms_mixed * mixed_steps) / setup.steps
    peaks = [p for p in (peak_fp16, peak_mixed) if p is not None]
    frac = expected_quantized_fraction(sched, setup.steps, (num_blocks,))
    note = (f"{sched.name}: {fp16_steps} FP16 steps ({ms_fp16:.1f} ms) + {mixed_steps} mixed steps ({ms_mixed:.1f} ms, "
            f"{args.recipe} on {per_fwd_q}/{num_blocks} blocks); quantized fraction {100 * frac:.1f}%")
    return dict(method=method, ms=ms, peak=max(peaks) if peaks else None, compile_s=cs_fp16 + cs_mixed,
                note=note, fp16_steps=fp16_steps, mixed_steps=mixed_steps, int4_fraction=frac)


def sage_row(model, inputs, timer: RowTimer, sage) -> dict:
    originals = [(blk.attn1, blk.attn1.processor) for blk in model.blocks]
    for attn, _ in originals:
        attn.set_processor(SageSelfAttention(sage))
    # Not fullgraph: the extension call is opaque to dynamo (a graph break around each call).
    compiled = []
    if timer.compiled:
        compiled = compile_transformers({"transformer": model}, timer.compile_options(fullgraph=False))
    try:
        ms, peak, cs = timer.measure(model, inputs)
    finally:
        uncompile_transformers({"transformer": model}, compiled)
        for attn, proc in originals:
            attn.set_processor(proc)
    return dict(method="SageAttention2-8b", ms=ms, peak=peak, compile_s=cs,
                note="sageattn_qk_int8_pv_fp8_cuda_sm90 (per_thread, fp32+fp32) on every self-attention call")


def run_setup(setup: Setup, args) -> list[dict]:
    """Every row of one setup, in every mode asked for (``mode`` key on each row)."""
    backend = "reference" if setup.device == "cpu" else args.backend
    name, why = kernel_probe(setup, args.recipe, backend)
    available = None if name == "cuda" or args.tiny or args.allow_reference else why
    backend = backend if name == "cuda" else "reference"
    sage = sage_function() if setup.device == "cuda" else None
    model, inputs = build(setup, args.seed)
    rows = []
    for mode in args.modes:
        torch._dynamo.reset()  # each mode and setup compiles from scratch (no shape-generalized graphs)
        timer = RowTimer(setup, args, compiled=mode == "compiled")
        mode_rows = [sdpa_row(model, inputs, timer), *rotvid_rows(model, inputs, timer, backend, available)]
        if sage is not None and "sage" in args.rows:
            mode_rows.append(sage_row(model, inputs, timer, sage))
        for r in mode_rows:
            r["mode"] = mode
        rows += mode_rows
    del model, inputs
    if setup.device == "cuda":
        torch.cuda.empty_cache()
    return rows


def _fmt(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def markdown(results: list[tuple[Setup, list[dict]]], args) -> str:
    first = results[0][0]
    lines = [
        f"### e2e_bench: {device_description(first.device)}, {utc_stamp()}, commit {git_commit()}",
        "",
        f"torch {torch.__version__}; random weights; text {first.text_len} tokens, {first.dtype}; rotation "
        f"{args.rotation}, recipe {args.recipe}, schedule {args.schedule}; compile mode {args.compile_mode}; median "
        f"of {args.iters} forwards after {args.warmup} warm-up (and one first forward, timed apart); ratios = SDPA "
        "time / row time (same run); the issue's baseline is the compiled SDPA column.",
        "",
    ]
    for setup, rows in results:
        b, c, f, h, w = setup.latent
        lines += [
            f"**{setup.name}** (latents {b}x{c}x{f}x{h}x{w})",
            "",
            "| mode | method | ms / forward | vs eager SDPA | vs compiled SDPA | vs same-mode SDPA | peak GB | compile s "
            "| note |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]

        def sdpa_ms(mode):
            return next((r["ms"] for r in rows if r["mode"] == mode and r["method"].endswith("SDPA")), None)

        for r in rows:
            ratios = []
            for base in (sdpa_ms("eager"), sdpa_ms("compiled"), sdpa_ms(r["mode"])):
                x = None if r["ms"] is None or base is None else base / r["ms"]
                ratios.append(_fmt(x, ".3f") + ("×" if x is not None else ""))
            cs = r["compile_s"] if r["mode"] == "compiled" else None
            lines.append(
                f"| {r['mode']} | {r['method']} | {_fmt(r['ms'], '.1f')} | {ratios[0]} | {ratios[1]} | {ratios[2]} "
                f"| {_fmt(r['peak'], '.1f')} | {_fmt(cs, '.1f')} | {r['note']} |"
            )
        lines.append("")
        for mode in args.modes:
            base = next(r for r in rows if r["mode"] == mode and r["method"].endswith("SDPA"))
            paper = next((r for r in rows if r["mode"] == mode and r["method"] == f"rotvid {args.recipe}, paper schedule"),
                         None)
            total = setup.steps * setup.forwards_per_step / 1e3
            line = (f"{mode}: {setup.steps}-step estimate (x{setup.forwards_per_step} forwards for CFG, transformer "
                    f"only): SDPA {base['ms'] * total:.1f} s")
            if paper is None:
                line += "; rotvid paper schedule: not timed (--rows)."
            elif paper["ms"] is not None:
                line += (f"; rotvid paper schedule {paper['ms'] * total:.1f} s ({paper['fp16_steps']} FP16 + "
                         f"{paper['mixed_steps']} mixed steps) = {base['ms'] / paper['ms']:.3f}×; quantized fraction of "
                         f"self-attention calls {100 * paper['int4_fraction']:.1f}%.")
            else:
                line += "; rotvid: — (no CUDA kernel in this run)."
            lines.append(line)
        lines.append("")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny model on CPU (or the GPU if present): a smoke run")
    ap.add_argument("--setups", default=",".join(SETUPS),
                    help=f"comma-separated full-size setups (default {','.join(SETUPS)}; ignored with --tiny)")
    ap.add_argument("--slice-layers", type=int, default=4, help="blocks in the Wan 14B 720p slice (default 4)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated: eager, compiled (default both)")
    ap.add_argument("--compile-mode", default="default", choices=("default", "reduce-overhead", "max-autotune"),
                    help="torch.compile mode of the compiled rows (default: default)")
    ap.add_argument("--rows", default=",".join(ROWS),
                    help="comma-separated rows to time: sdpa (always), all (rotvid, every call quantized), schedule "
                         "(rotvid, paper schedule), sage (the peer, when importable); default all four")
    ap.add_argument("--steps", type=int, default=50, help="denoising steps of the estimate (default 50)")
    ap.add_argument("--schedule", default="paper-wan2.2-t2v", help="schedule preset (default paper-wan2.2-t2v)")
    ap.add_argument("--rotation", default="half", help="Q/K rotation (default half)")
    ap.add_argument("--recipe", default="auto",
                    help="quantized recipe (default auto: this GPU's, rotvid.kernels.recipes.auto; int8-fp8 on Hopper)")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "auto", "reference"),
                    help="rotvid backend for the full-size run (default cuda)")
    ap.add_argument("--allow-reference", action="store_true", help="time the PyTorch reference if no kernel runs")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up forwards per row (default 2; tiny 1)")
    ap.add_argument("--iters", type=int, default=None, help="timed forwards per row (default 5; tiny 2)")
    ap.add_argument("--seed", type=int, default=0)
    add_append_options(ap)
    ap.add_argument("--sparsity", nargs="+", default=[], metavar="SPEC",
                    help="also time the all-calls row with each block map (e.g. radial topp:0.9; see --sparsity of "
                         "rotvid generate); the row gives the map's measured mean density")
    ap.add_argument("--json-out", type=Path, default=None,
                    help='write every row as JSON: {"rows": [{"setup", "method", "mode", "ms", "vs_compiled_bf16", '
                         '"density"}]} (vs_compiled_bf16: the compiled bf16 SDPA row of the same setup over the row)')
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps: expected a positive int")
    if args.slice_layers < 1:
        ap.error("--slice-layers: expected a positive int")
    args.modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not args.modes or any(m not in MODES for m in args.modes):
        ap.error(f"--modes: expected a comma-separated subset of {', '.join(MODES)}, got {','.join(args.modes)!r}")
    rows = {r.strip() for r in args.rows.split(",") if r.strip()}
    if not rows <= set(ROWS):
        ap.error(f"--rows: expected a comma-separated subset of {', '.join(ROWS)}, got {args.rows!r}")
    args.rows = tuple(r for r in ROWS if r in rows | {"sdpa"})
    args.setups = tuple(s.strip() for s in args.setups.split(",") if s.strip())
    if not args.tiny and (not args.setups or any(s not in SETUPS for s in args.setups)):
        ap.error(f"--setups: expected a comma-separated subset of {', '.join(SETUPS)}, got {','.join(args.setups)!r}")
    if args.sparsity:
        from rotvid.kernels.sparsity import parse_sparsity

        try:
            args.sparsity = [str(parse_sparsity(spec)) for spec in args.sparsity]
        except ValueError as err:
            ap.error(f"--sparsity: {err}")
    if args.recipe == "auto":
        from rotvid.kernels.recipes.auto import resolve_recipe

        args.recipe, _ = resolve_recipe("auto", "cuda" if torch.cuda.is_available() else "cpu")
    if args.warmup is None:
        args.warmup = 1 if args.tiny else 2
    if args.iters is None:
        args.iters = 2 if args.tiny else 5
    return args


def json_rows(results: list[tuple[Setup, list[dict]]]) -> dict:
    """Every row as ``{"setup", "method", "mode", "ms", "vs_compiled_bf16", "density"}`` (density 1 for dense rows,
    None where not applicable: the SDPA and the peer's rows)."""
    out = []
    for setup, rows in results:
        base = next((r["ms"] for r in rows if r["mode"] == "compiled" and r["method"].endswith("SDPA")), None)
        for r in rows:
            density = r.get("density", 1.0 if r["method"].startswith("rotvid") else None)
            out.append({"setup": setup.name, "method": r["method"], "mode": r["mode"], "ms": r["ms"],
                        "vs_compiled_bf16": None if base is None or not r["ms"] else round(base / r["ms"], 4),
                        "density": density})
    return {"rows": out}


def write_json(results: list[tuple[Setup, list[dict]]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(json_rows(results), indent=1) + "\n")
    tmp.replace(path)  # atomic: a reader never sees half a file
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> str:
    args = parse_args(argv)
    if args.tiny:
        setups = [tiny_setup(args.steps)]
    else:
        setups = [make_setup(name, args.steps, args.slice_layers) for name in args.setups]
        if not torch.cuda.is_available():
            sys.exit("e2e_bench: the full-size run needs a CUDA GPU (use --tiny for a CPU smoke run)")
    results = [(setup, run_setup(setup, args)) for setup in setups]
    md = markdown(results, args)
    print(md)
    if args.json_out is not None:
        write_json(results, args.json_out)
    append_table(md, args)
    return md


if __name__ == "__main__":
    main()
