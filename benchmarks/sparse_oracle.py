"""Block maps against the oracle on the bundled proxy, at a size where blocks matter: PSNR / SSIM against the dense
int8-fp8 video and kept attention mass, for ``oracle``, ``topp``, ``pmin`` and ``radial`` at matched densities.

    python -m benchmarks.sparse_oracle --json-out F.json --markdown-out F.md    # GPU: 512x512, 65 frames, 3 prompts
    python -m benchmarks.sparse_oracle --tiny                                   # CPU smoke run (seconds)

**Size.** The proxy (:mod:`rotvid.pipelines.proxy`: VAE 8x spatial / 4x temporal, patch (1, 2, 2), Wan's 3-D RoPE
to 1024 positions per axis) turns 512x512, 65 frames into a 17 x 32 x 32 token grid: 17,408 tokens, 136 key blocks
of 128 per query tile (at its own 128x128, 17 frames a row has 3). It was trained on 128x128 clips of 17 frames and
256x256 clips of 33, so the run first checks whether it still draws the prompted scene: per prompt, the bf16 video
(the model's own attention) and the dense int8-fp8 video, each through the proxy's probe
(:func:`~rotvid.pipelines.proxy.probe_clip`: the prompted colour moving the prompted way). ``--sizes`` may list
several sizes to try in order: the first where the dense int8-fp8 video passes on at least ``--min-pass`` of the
prompts is the study's; when none does, the first listed, said so in the output. The default lists 512x512x65 alone:
on the CPU (bf16, 12 steps) the three default prompts passed at 128x128, 17 frames, but at 256x256, 17 frames only
one did, and the first prompt failed at 256x256 with 65 frames, 384x384 with 33 or 65 and 512x512 with 65 (the
second too at 512x512): no size where a row has 100 blocks is known to pass, and each size tried costs the GPU run
its references. Every probe result is in the output either way.

**Maps at matched densities** (``--densities``, default 0.3, 0.5, 0.7), each with and without dense first steps
(``--dense-first-steps``: the schedule's rule that runs the first steps' quantized calls without a map):

* ``oracle:D`` keeps D of every row's blocks by construction (:mod:`rotvid.kernels.sparsity.oracle`);
* ``radial``: the band and window whose map of this grid has the density closest to D (exact, from the grid:
  :func:`rotvid.kernels.sparsity.density.radial_for_density`);
* ``topp``: the ``tau`` whose maps have the mean density closest to D over every call of the prompts' dense
  int8-fp8 runs (their top-p estimates are recorded during those runs; the calls of the first steps are left out
  when the first steps run dense): :func:`rotvid.kernels.sparsity.density.topp_tau_for_density`. A sparse run
  drifts from the dense one, so each video's own mean density is reported beside its target;
* ``pmin``: likewise the threshold on the same estimates (:func:`rotvid.kernels.sparsity.density.pmin_for_density`):
  one threshold on each block's estimated share of its row's mass, for every row, head and call.

Per video, from the run report (``RotvidConfig(measure_kept_mass=True)``): the mean density over the calls that ran
with a map, the **kept mass** (the true attention mass of the kept blocks, exact full-precision scores, mean over
query rows and calls) and the **oracle's kept mass** at the same per-row block counts (the most any map with those
counts keeps); PSNR and SSIM against the same prompt's dense int8-fp8 video (:func:`rotvid.eval.pixel_metrics.
compare_arrays`, on the decoded 8-bit frames, no codec); the probe. Then issue 42's bar: at density <= 0.5, ``topp``
within 1 dB PSNR of ``oracle`` at the same density, keeping >= 95% of the oracle's mass at its counts (and the same
comparison for ``pmin``, the candidate selection).

**One rotation path for every run.** Each rotvid run carries a runtime observer (the calibration hook of
:mod:`rotvid.pipelines.runtime`); with one, the processors apply RoPE·R to Q and K before every call instead of
deferring it to the int8-fp8 kernel. A sparse run rotates first anyway (a map is built, and the kept mass measured,
on rotated Q and K), so the dense reference does the same: the PSNR measures the map, not the rounding difference
between a deferred and an applied rotation. The dense runs' observer also records the top-p estimates.

Same seed for every video of a prompt (the initial noise is drawn on the CPU). The exact block masses cost a dense
float32 attention per call with a map (:func:`~rotvid.kernels.sparsity.oracle.block_attention_mass`, in query-tile
chunks of at most 2**26 scores, 256 MiB). PSNR, SSIM and the probe run on the CPU, in ``--workers`` processes beside
the GPU's work.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import torch

from rotvid.atomic import write_file_atomically
from rotvid.eval.generation import GenerationRequest, call_kwargs, check_request
from rotvid.eval.pixel_metrics import compare_arrays, float_to_json
from rotvid.eval.video_io import to_uint8_frames
from rotvid.kernels.sparsity import TokenGrid, parse_sparsity
from rotvid.kernels.sparsity.block_map import blocks_for
from rotvid.kernels.sparsity.density import pmin_for_density, radial_for_density, topp_tau_for_density
from rotvid.kernels.sparsity.topp import DEFAULT_SIM, topp_estimate
from rotvid.pipelines import RotvidConfig, Schedule, apply, load_pipeline, remove
from rotvid.pipelines.capture import latent_grid
from rotvid.pipelines.pipeline_config import read_pipeline_config
from rotvid.pipelines.proxy import probe_clip
from rotvid.pipelines.proxy.clips import DIRECTIONS, held_out_prompts

from benchmarks.provenance import device_description, git_commit, utc_stamp
from benchmarks.study_io import RESULTS_DIR, command_line

KINDS = ("oracle", "topp", "pmin", "radial")
DEFAULTS = dict(sizes="512x512x65", prompts=3, steps=None, densities="0.3,0.5,0.7",
                dense_first_steps=3, device="auto", backend="auto", workers=None,
                json_out=RESULTS_DIR / "sparse_oracle.json")
TINY = dict(sizes="128x128x25", prompts=1, steps=2, densities="0.5", dense_first_steps=1, device="cpu",
            backend="reference", workers=0, json_out=None)
RADIAL_BANDS = (1, 0, 2, 3, 4, 5, 6, 7, 8)  # band 1 (Radial Attention's rule) first: it wins ties
ISSUE_BAR = dict(max_density=0.5, psnr_gap_db=1.0, mass_ratio=0.95)
ROW_KEYS = ("prompt", "kind", "spec", "density", "kept_mass", "oracle_kept_mass", "psnr", "ssim", "blocks_per_row",
            "dense_first_steps")


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---- arguments ------------------------------------------------------------------------------------------------


def parse_size(text: str) -> tuple[int, int, int]:
    """``HxWxF`` (height, width, frames in pixels and frames) -> (H, W, F); an argparse type."""
    try:
        h, w, f = (int(x) for x in text.lower().strip().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"size must look like HxWxF (e.g. 512x512x65), got {text!r}") from None
    if min(h, w, f) < 1:
        raise argparse.ArgumentTypeError(f"size: every number must be >= 1, got {text!r}")
    return h, w, f


def _fraction_list(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, got {text!r}") from None
    if not values or not all(0 < v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected densities in (0, 1], got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true",
                   help=f"CPU smoke run: reference backend, {TINY['sizes']}, {TINY['prompts']} prompt, "
                   f"{TINY['steps']} steps, density {TINY['densities']}, dense first steps 0 and "
                   f"{TINY['dense_first_steps']}; writes no JSON unless --json-out")
    p.add_argument("--sizes", default=None,
                   help=f"HxWxF sizes to try in order, the first whose dense video passes the probe used "
                   f"(default {DEFAULTS['sizes']})")
    p.add_argument("--height", type=int, default=None, help="with --width and --frames: one size, instead of --sizes")
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--frames", type=int, default=None)
    p.add_argument("--min-pass", type=float, default=0.5,
                   help="fraction of the prompts whose dense int8-fp8 video must pass the probe for a size to be "
                   "used (default 0.5)")
    p.add_argument("--prompts", type=int, default=None,
                   help=f"held-out proxy prompts with a directional motion (default {DEFAULTS['prompts']})")
    p.add_argument("--prompt-seed", type=int, default=0, help="which held-out prompts (default 0)")
    p.add_argument("--steps", type=int, default=None, help="denoising steps (default: the proxy's own, 12)")
    p.add_argument("--seed", type=int, default=0, help="the initial noise's seed, the same for every video")
    p.add_argument("--densities", default=None, help=f"target densities (default {DEFAULTS['densities']})")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"map kinds, a subset of {','.join(KINDS)}")
    p.add_argument("--dense-first-steps", type=int, default=None,
                   help=f"the dense-first-steps setting run beside 0 (default {DEFAULTS['dense_first_steps']})")
    p.add_argument("--topp-sim", type=float, default=DEFAULT_SIM, help=f"top-p's sim (default {DEFAULT_SIM})")
    p.add_argument("--radial-bands", default=",".join(map(str, RADIAL_BANDS)),
                   help="temporal bands radial's matching may use, in order of preference")
    p.add_argument("--recipe", default="int8-fp8", help="quantized recipe (default int8-fp8)")
    p.add_argument("--rotation", default="half", help="Q/K rotation (default half)")
    p.add_argument("--device", default=None, help="auto, cuda or cpu (default auto)")
    p.add_argument("--backend", default=None, help="auto, cuda or reference (default auto)")
    p.add_argument("--dtype", default="bf16", help="the pipeline's dtype (default bf16)")
    p.add_argument("--no-unquantized", action="store_true", help="skip the bf16 video (the model's own attention)")
    p.add_argument("--workers", type=int, default=None,
                   help="CPU processes for PSNR / SSIM / the probe (default: CPU count - 2 on a GPU; 0 = inline)")
    p.add_argument("--json-out", type=Path, default=None,
                   help="results JSON (default benchmarks/results/sparse_oracle.json; --tiny: none)")
    p.add_argument("--markdown-out", type=Path, default=None, help="also write the tables here")
    return p


def resolve_args(argv: list[str] | None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    base = TINY if args.tiny else DEFAULTS
    for name, value in base.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps: expected a count >= 1, got {args.steps}")
    if args.prompts < 1:
        p.error(f"--prompts: expected a count >= 1, got {args.prompts}")
    one = (args.height, args.width, args.frames)
    if any(v is not None for v in one):
        if any(v is None for v in one):
            p.error("--height, --width and --frames: give all three (one size), or none (--sizes)")
        args.sizes = [parse_size(f"{args.height}x{args.width}x{args.frames}")]
    else:
        try:
            args.sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
        except argparse.ArgumentTypeError as err:
            p.error(f"--sizes: {err}")
    config = read_pipeline_config("proxy")
    for h, w, f in args.sizes:  # the proxy's size multiple and frame rule, before anything loads
        try:
            check_request(config, GenerationRequest(prompt="", height=h, width=w, frames=f))
        except ValueError as err:
            p.error(f"size {h}x{w}x{f}: {err}")
    try:
        args.densities = _fraction_list(args.densities)
    except argparse.ArgumentTypeError as err:
        p.error(f"--densities: {err}")
    args.kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    if not args.kinds or set(args.kinds) - set(KINDS):
        p.error(f"--kinds: expected a subset of {','.join(KINDS)}, got {args.kinds}")
    if args.dense_first_steps < 0:
        p.error(f"--dense-first-steps: expected a count >= 0, got {args.dense_first_steps}")
    if args.steps is not None and args.dense_first_steps >= args.steps:
        p.error(f"--dense-first-steps {args.dense_first_steps}: leaves no sparse step of {args.steps}")
    args.dfs_settings = tuple(dict.fromkeys((0, args.dense_first_steps)))
    try:
        args.radial_bands = tuple(int(b) for b in args.radial_bands.split(",") if b.strip())
    except ValueError:
        p.error(f"--radial-bands: expected ints separated by commas, got {args.radial_bands!r}")
    if not 0 < args.min_pass <= 1:
        p.error(f"--min-pass: expected a fraction in (0, 1], got {args.min_pass}")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.workers is None:
        args.workers = max(1, (os.cpu_count() or 2) - 2) if args.device.startswith("cuda") else 0
    return args


# ---- generating ---------------------------------------------------------------------------------------------


class CallObserver:
    """A runtime observer (``handle.runtime.observers``) on every rotvid run of the study: its presence makes the
    processors rotate Q and K before every call (module docstring); with ``record`` it keeps, per self-attention
    call, ``(step, top-p estimate)`` -- the block masses top-p ranks, which do not depend on ``tau`` -- for
    matching ``tau`` to a density."""

    def __init__(self, *, record: bool, sim: float = DEFAULT_SIM, sm_scale: float | None = None):
        self.record, self.sim, self.sm_scale = record, sim, sm_scale
        self.calls: list[tuple[int | None, object]] = []

    def __call__(self, site, step, num_steps, q, k, v, kv_lens, fp16_attention) -> None:
        if self.record:
            est = topp_estimate(q, k, tau=1.0, sim=self.sim, kv_lens=kv_lens, sm_scale=self.sm_scale)
            self.calls.append((step, est))


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def generate(pipe, args, prompt: str, size, config: RotvidConfig | None, observer: CallObserver | None):
    """One video: (uint8 frames [F, H, W, 3], the run report's dict or None, seconds). ``config`` None: the
    untouched pipeline (the model's own attention)."""
    h, w, f = size
    request = GenerationRequest(prompt=prompt, seed=args.seed, height=h, width=w, frames=f, steps=args.steps)
    kwargs = call_kwargs(pipe, request)  # the seeded CPU generator, the proxy's own call defaults
    kwargs["output_type"] = "pt"  # (the frames stay on the device for uint8_frames)
    handle = apply(pipe, config) if config is not None else None
    try:
        if handle is not None and observer is not None:
            observer.sm_scale = handle.runtime.call_options.get("sm_scale")
            handle.runtime.observers.append(observer)
        _sync(args.device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            frames = uint8_frames(pipe(**kwargs).frames[0])
        _sync(args.device)
        seconds = time.perf_counter() - t0
        report = handle.report.to_dict() if handle is not None else None
    finally:
        if handle is not None:
            remove(pipe)
    return frames, report, seconds


def uint8_frames(video: torch.Tensor):
    """A pipeline's ``output_type="pt"`` video, float [F, 3, H, W] in [0, 1] on its device, as RGB uint8
    [F, H, W, 3] on the host: :func:`~rotvid.eval.video_io.to_uint8_frames`'s values (float64, clipped, x 255,
    rounded half to even), computed on the device -- on the host that takes seconds for a 65 x 512 x 512 video,
    every video of the study."""
    u8 = video.double().clamp(0.0, 1.0).mul(255.0).round().to(torch.uint8).permute(0, 2, 3, 1)
    return to_uint8_frames(u8.cpu().numpy())


class InlineExecutor:
    """The executor interface, computing at submission (``--workers 0``: the CPU runs, where processes would only
    compete with the pipeline)."""

    def submit(self, fn, *args, **kwargs) -> Future:
        fut: Future = Future()
        fut.set_result(fn(*args, **kwargs))
        return fut

    def shutdown(self, wait: bool = True) -> None:
        pass


def make_executor(workers: int):
    if workers <= 0:
        return InlineExecutor()
    # spawn: the workers import numpy / scikit-image only, never touch the parent's CUDA context
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


def dense_config(args) -> RotvidConfig:
    return RotvidConfig(recipe=args.recipe, rotation=args.rotation, backend=args.backend, schedule=Schedule())


# ---- the study ----------------------------------------------------------------------------------------------


def size_text(size) -> str:
    return "x".join(map(str, size))


def check_size(pipe, args, size, prompts, pool) -> dict:
    """The references at ``size``: per prompt the bf16 and dense int8-fp8 videos, their probes, int8-fp8 against
    bf16, and the dense runs' top-p estimates."""
    h, w, f = size
    grid = latent_grid(pipe, pipe.transformer, height=h, width=w, frames=f)
    tokens = grid[0] * grid[1] * grid[2]
    entry = {"size": size_text(size), "grid": list(grid), "tokens": tokens, "blocks_per_row": blocks_for(tokens),
             "prompts": []}
    say(f"size {size_text(size)}: token grid {grid[0]}x{grid[1]}x{grid[2]} = {tokens} tokens, "
        f"{entry['blocks_per_row']} key blocks per row")
    pending = []
    for prompt in prompts:
        item: dict = {"prompt": prompt}
        futures = {}
        if not args.no_unquantized:
            bf16, _, secs = generate(pipe, args, prompt, size, None, None)
            item["bf16_seconds"] = secs
            futures["bf16_probe"] = pool.submit(probe_clip, bf16, prompt)
        observer = CallObserver(record=True, sim=args.topp_sim)
        dense, report, secs = generate(pipe, args, prompt, size, dense_config(args), observer)
        item.update(dense_seconds=secs, dense_report=_report_summary(report), frames=dense, estimates=observer.calls)
        futures["dense_probe"] = pool.submit(probe_clip, dense, prompt)
        if not args.no_unquantized:
            futures["dense_vs_bf16"] = pool.submit(compare_arrays, bf16, dense, name=prompt)
        say(f"  {prompt!r}: dense {args.recipe} {secs:.1f} s, {len(observer.calls)} calls"
            + (f"; bf16 {item['bf16_seconds']:.1f} s" if "bf16_seconds" in item else ""))
        pending.append((item, futures))
    for item, futures in pending:
        item["bf16_probe"] = futures["bf16_probe"].result().to_dict() if "bf16_probe" in futures else None
        item["dense_probe"] = futures["dense_probe"].result().to_dict()
        if "dense_vs_bf16" in futures:
            m = futures["dense_vs_bf16"].result()
            item["dense_vs_bf16"] = {"psnr": float_to_json(m.psnr), "ssim": m.ssim}
        entry["prompts"].append(item)
    entry["dense_passed"] = sum(bool(i["dense_probe"]["passed"]) for i in entry["prompts"])
    entry["bf16_passed"] = (None if args.no_unquantized else
                            sum(bool(i["bf16_probe"]["passed"]) for i in entry["prompts"]))
    say(f"  probe at {size_text(size)}: dense {args.recipe} {entry['dense_passed']}/{len(prompts)} pass"
        + ("" if entry["bf16_passed"] is None else f", bf16 {entry['bf16_passed']}/{len(prompts)}"))
    return entry


def _report_summary(report: dict | None) -> dict | None:
    if report is None:
        return None
    sp = report.get("sparsity") or {}
    return {"quantized_calls": report["quantized_calls"], "fallback_calls": report["fallback_calls"],
            "fp16_calls": report["fp16_calls"], "backends": report["backends"], "sparse_calls": sp.get("sparse_calls"),
            "mean_density": sp.get("mean_density"), "mean_kept_mass": sp.get("mean_kept_mass"),
            "mean_oracle_kept_mass": sp.get("mean_oracle_kept_mass"), "kept_mass_calls": sp.get("kept_mass_calls")}


def choose_size(pipe, args, prompts, pool) -> tuple[dict, list[dict], str]:
    """The study's size (module docstring): (its entry, every tried size's probe summary, why it was chosen)."""
    need = math.ceil(args.min_pass * len(prompts) - 1e-9)
    tried, first = [], None
    for size in args.sizes:
        entry = check_size(pipe, args, size, prompts, pool)
        tried.append(entry)
        if entry["dense_passed"] >= need:
            return entry, tried, (f"the first size listed whose dense {args.recipe} video passes the probe on "
                                  f">= {need} of {len(prompts)} prompts")
        if first is None:
            first = entry
        else:  # (only the first size's videos are kept as the fallback)
            for item in entry["prompts"]:
                item.pop("frames"), item.pop("estimates")
    return first, tried, (f"NO size passed the probe (>= {need} of {len(prompts)} prompts): the first size listed, "
                          "where the proxy may not draw the prompted scene")


def _sparse_step_estimates(entry, dense_first_steps: int) -> list:
    """The top-p estimates the prompts' dense runs recorded at the steps a sparse run gives a map (those past its dense
    first steps)."""
    return [est for item in entry["prompts"] for step, est in item["estimates"]
            if step is None or step >= dense_first_steps]


def match_specs(args, entry) -> tuple[dict, dict]:
    """Per (kind, target density, dense first steps): the spec and its matched density (module docstring)."""
    grid = TokenGrid(*entry["grid"])
    specs, calibration = {}, {"radial": [], "topp": [], "pmin": [], "oracle": []}
    for d in args.densities:
        if "oracle" in args.kinds:
            spec = parse_sparsity(f"oracle:{d}")
            for dfs in args.dfs_settings:
                specs["oracle", d, dfs] = spec
            calibration["oracle"].append({"target": d, "spec": str(spec)})
        if "radial" in args.kinds:
            spec, got = radial_for_density(grid, d, bands=args.radial_bands)
            for dfs in args.dfs_settings:
                specs["radial", d, dfs] = spec
            calibration["radial"].append({"target": d, "spec": str(spec), "density": got})
        if "topp" in args.kinds:
            for dfs in args.dfs_settings:
                estimates = _sparse_step_estimates(entry, dfs)
                tau, got = topp_tau_for_density(estimates, d, sim=args.topp_sim)
                spec = parse_sparsity(f"topp:{tau},sim={args.topp_sim}")
                specs["topp", d, dfs] = spec
                calibration["topp"].append({"target": d, "dense_first_steps": dfs, "spec": str(spec), "tau": tau,
                                            "density_on_dense_runs": got, "calls": len(estimates)})
        if "pmin" in args.kinds:
            for dfs in args.dfs_settings:
                estimates = _sparse_step_estimates(entry, dfs)
                pmin, got = pmin_for_density(estimates, d, sim=args.topp_sim)
                spec = parse_sparsity(f"pmin:{pmin},sim={args.topp_sim}")
                specs["pmin", d, dfs] = spec
                calibration["pmin"].append({"target": d, "dense_first_steps": dfs, "spec": str(spec), "pmin": pmin,
                                            "density_on_dense_runs": got, "calls": len(estimates)})
    for kind, rows in calibration.items():
        for r in rows:
            say(f"  {kind} at {r['target']}: {r['spec']}"
                + (f" (density {r['density']:.3f} on the grid)" if "density" in r else "")
                + (f" (dense first steps {r['dense_first_steps']}: density {r['density_on_dense_runs']:.3f} over "
                   f"{r['calls']} calls of the dense runs)" if "calls" in r else ""))
    return specs, calibration


def run_sparse(pipe, args, entry, specs, pool, progress) -> list[tuple[dict, dict]]:
    """Every sparse video: (row without its metrics, futures of its metrics)."""
    out = []
    total = len(entry["prompts"]) * len(specs)
    done, t0 = 0, time.perf_counter()
    for item in entry["prompts"]:
        prompt, ref = item["prompt"], item["frames"]
        for d in args.densities:
            for kind in args.kinds:
                for dfs in args.dfs_settings:
                    spec = specs[kind, d, dfs]
                    config = dense_config(args).with_(sparsity=spec, measure_kept_mass=True,
                                                      schedule=Schedule(dense_first_steps=dfs))
                    frames, report, secs = generate(pipe, args, prompt, tuple(entry["size_tuple"]), config,
                                                    CallObserver(record=False))
                    summary = _report_summary(report)
                    row = {"prompt": prompt, "kind": kind, "spec": str(spec), "target_density": d,
                           "density": summary["mean_density"], "kept_mass": summary["mean_kept_mass"],
                           "oracle_kept_mass": summary["mean_oracle_kept_mass"],
                           "blocks_per_row": entry["blocks_per_row"], "dense_first_steps": dfs,
                           "sparse_calls": summary["sparse_calls"], "kept_mass_calls": summary["kept_mass_calls"],
                           "fallback_calls": summary["fallback_calls"], "seconds": secs}
                    futures = {"metrics": pool.submit(compare_arrays, ref, frames, name=prompt),
                               "probe": pool.submit(probe_clip, frames, prompt)}
                    out.append((row, futures))
                    done += 1
                    eta = (time.perf_counter() - t0) / done * (total - done)
                    say(f"  [{done}/{total}] {kind} {spec} dfs {dfs}: density {_f(row['density'])}, kept "
                        f"{_f(row['kept_mass'])} / oracle {_f(row['oracle_kept_mass'])}, {secs:.1f} s "
                        f"(about {eta:.0f} s to go)")
        progress(out)
    return out


def finish_rows(pending, *, wait: bool = True) -> list[dict]:
    rows = []
    for row, futures in pending:
        if not wait and not all(f.done() for f in futures.values()):
            continue
        m = futures["metrics"].result()
        probe = futures["probe"].result()
        rows.append(dict(row, psnr=m.psnr, ssim=m.ssim, probe_passed=probe.passed))
    return rows


# ---- summaries ----------------------------------------------------------------------------------------------


def _f(x, digits=3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.{digits}f}"


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def summarize(rows: list[dict]) -> list[dict]:
    """Means over the prompts per (kind, target density, dense first steps)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["target_density"], r["dense_first_steps"], r["kind"]), []).append(r)
    out = []
    for (d, dfs, kind), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0], KINDS.index(kv[0][2]))):
        kept, best = _mean([r["kept_mass"] for r in rs]), _mean([r["oracle_kept_mass"] for r in rs])
        out.append({"kind": kind, "target_density": d, "dense_first_steps": dfs, "videos": len(rs),
                    "specs": sorted({r["spec"] for r in rs}), "density": _mean([r["density"] for r in rs]),
                    "kept_mass": kept, "oracle_kept_mass": best,
                    "kept_of_oracle": None if kept is None or not best else kept / best,
                    "psnr": _mean([r["psnr"] for r in rs]), "ssim": _mean([r["ssim"] for r in rs]),
                    "probe_passed": sum(bool(r["probe_passed"]) for r in rs)})
    return out


def _bar_checks(by: dict, kind: str) -> list[dict]:
    """Issue 42's two tests for ``kind`` against ``oracle`` at each target density <= 0.5 and dense-first-steps
    setting (means over prompts)."""
    checks = []
    for (k, d, dfs), s in by.items():
        o = by.get(("oracle", d, dfs))
        if k != kind or o is None or d > ISSUE_BAR["max_density"] + 1e-9:
            continue
        gap = None if s["psnr"] is None or o["psnr"] is None else o["psnr"] - s["psnr"]
        ratio = s["kept_of_oracle"]
        checks.append({"kind": kind, "target_density": d, "dense_first_steps": dfs, "density": s["density"],
                       "oracle_density": o["density"], "psnr": s["psnr"], "oracle_psnr": o["psnr"],
                       "psnr_gap_db": gap, "kept_mass": s["kept_mass"],
                       "oracle_kept_mass_at_counts": s["oracle_kept_mass"], "kept_of_oracle": ratio,
                       "oracle_video_kept_mass": o["kept_mass"],
                       "psnr_ok": gap is not None and gap <= ISSUE_BAR["psnr_gap_db"],
                       "mass_ok": ratio is not None and ratio >= ISSUE_BAR["mass_ratio"]})
    checks.sort(key=lambda c: (c["dense_first_steps"], c["target_density"]))
    return checks


def bar_check(summary: list[dict]) -> dict:
    """Issue 42's bar on the means over prompts: at each target density <= 0.5 and dense-first-steps setting,
    ``topp`` within 1 dB PSNR of ``oracle`` and its kept mass >= 95% of the oracle's at its own block counts
    (``checks``, ``met``); the same tests for ``pmin`` beside it (``pmin_checks``, ``pmin_met``)."""
    by = {(s["kind"], s["target_density"], s["dense_first_steps"]): s for s in summary}
    checks, pmin_checks = _bar_checks(by, "topp"), _bar_checks(by, "pmin")
    return {"rule": "at density <= 0.5: topp's PSNR (vs dense int8-fp8) within 1 dB of oracle's at the same target "
                    "density, and topp's kept mass >= 95% of the oracle's at topp's own per-row block counts "
                    "(means over prompts)",
            "checks": checks, "met": bool(checks) and all(c["psnr_ok"] and c["mass_ok"] for c in checks),
            "pmin_checks": pmin_checks,
            "pmin_met": bool(pmin_checks) and all(c["psnr_ok"] and c["mass_ok"] for c in pmin_checks)}


def bar_lines(bar: dict) -> list[str]:
    lines = [f"Bar (issue 42): {bar['rule']}."]
    for c in bar["checks"] + bar.get("pmin_checks", []):
        lines.append(
            f"- {c['kind']}, density {c['target_density']}, dense first steps {c['dense_first_steps']}: PSNR "
            f"{_f(c['psnr'], 2)} dB (density {_f(c['density'])}) vs oracle {_f(c['oracle_psnr'], 2)} dB "
            f"(density {_f(c['oracle_density'])}): gap {_f(c['psnr_gap_db'], 2)} dB "
            f"{'ok' if c['psnr_ok'] else 'NOT MET'}; kept mass {_f(c['kept_mass'], 4)} of the oracle's "
            f"{_f(c['oracle_kept_mass_at_counts'], 4)} at the same counts = "
            f"{_f(None if c['kept_of_oracle'] is None else 100 * c['kept_of_oracle'], 1)}% "
            f"{'ok' if c['mass_ok'] else 'NOT MET'} (the oracle video's own: {_f(c['oracle_video_kept_mass'], 4)})")
    lines.append(f"Bar {'MET' if bar['met'] else 'NOT MET'}" + ("" if bar["checks"] else " (nothing to check: "
                                                                  "no topp and oracle rows at density <= 0.5)"))
    if bar.get("pmin_checks"):
        lines.append(f"The same tests for pmin: {'all met' if bar['pmin_met'] else 'NOT all met'}")
    return lines


def markdown(result: dict) -> str:
    r = result
    lines = [f"# Block maps against the oracle on the proxy ({r['date']}, commit {r['commit']}, {r['device']})", "",
             f"command: `{r['command']}`  ",
             f"{r['size']} ({r['grid'][0]}x{r['grid'][1]}x{r['grid'][2]} tokens = {r['tokens']}, "
             f"{r['blocks_per_row']} key blocks per row), {r['steps']} steps, seed {r['seed']}, {r['recipe']} "
             f"{r['rotation']} ({', '.join(r['dense_backends'])}), {len(r['prompts'])} held-out prompts; size: "
             f"{r['size_choice']}; {r['seconds']:.0f} s."
             + (f" **{r['fallback_calls']} calls fell back to the model's own attention.**" if r["fallback_calls"]
                else ""), "", "Probe (the prompted colour moving the prompted way):", ""]
    lines += ["| size | blocks per row | bf16 passes | dense int8-fp8 passes | int8-fp8 vs bf16 PSNR dB (mean) |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for t in r["sizes_tried"]:
        n = len(t["prompts"])
        psnrs = [p["dense_vs_bf16"]["psnr"] for p in t["prompts"] if p.get("dense_vs_bf16")]
        psnr = _mean([math.inf if x == "inf" else x for x in psnrs])
        bf16 = "–" if t["bf16_passed"] is None else f"{t['bf16_passed']}/{n}"
        lines.append(f"| {t['size']} | {t['blocks_per_row']} | {bf16} | {t['dense_passed']}/{n} | {_f(psnr, 2)} |")
    lines += ["", "Means over the prompts (PSNR / SSIM against the dense int8-fp8 video; density: the mean over the "
              "calls that ran with a map; kept mass: true attention mass of the kept blocks; oracle: the most any "
              "map with the same per-row block counts keeps):", "",
              "| kind | target | dense first steps | spec(s) | density | kept mass | oracle at same counts | kept / "
              "oracle | PSNR dB | SSIM | probe passes |",
              "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for s in r["summary"]:
        lines.append(f"| {s['kind']} | {s['target_density']} | {s['dense_first_steps']} | "
                     f"{', '.join(f'`{x}`' for x in s['specs'])} | {_f(s['density'])} | {_f(s['kept_mass'], 4)} | "
                     f"{_f(s['oracle_kept_mass'], 4)} | {_f(s['kept_of_oracle'])} | {_f(s['psnr'], 2)} | "
                     f"{_f(s['ssim'], 4)} | {s['probe_passed']}/{s['videos']} |")
    lines += ["", *bar_lines(r["bar"]), "", "Every video:", "",
              "| prompt | kind | spec | dense first steps | density | kept mass | oracle kept mass | PSNR dB | SSIM |"
              " probe |", "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for row in r["rows"]:
        psnr = math.inf if row["psnr"] == "inf" else row["psnr"]
        lines.append(f"| {row['prompt']} | {row['kind']} | `{row['spec']}` | {row['dense_first_steps']} | "
                     f"{_f(row['density'])} | {_f(row['kept_mass'], 4)} | {_f(row['oracle_kept_mass'], 4)} | "
                     f"{_f(psnr, 2)} | {_f(row['ssim'], 4)} | {'pass' if row['probe_passed'] else 'fail'} |")
    return "\n".join(lines) + "\n"


# ---- main ---------------------------------------------------------------------------------------------------


def _json_rows(rows: list[dict]) -> list[dict]:
    return [dict(r, psnr=float_to_json(r["psnr"])) for r in rows]


def _sizes_for_json(tried: list[dict]) -> list[dict]:
    keep = ("size", "grid", "tokens", "blocks_per_row", "dense_passed", "bf16_passed")
    out = []
    for t in tried:
        prompts = [{k: v for k, v in p.items() if k not in ("frames", "estimates")} for p in t["prompts"]]
        out.append(dict({k: t[k] for k in keep}, prompts=prompts))
    return out


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file_atomically(path, text)


def main(argv: list[str] | None = None) -> dict:
    args = resolve_args(argv)
    t_start = time.perf_counter()
    if args.device == "cpu":
        torch.set_num_threads(max(1, os.cpu_count() or 1))
    say(f"loading the proxy ({args.dtype}, {args.device}); {args.workers or 'no'} worker processes")
    pipe = load_pipeline("proxy", dtype=args.dtype, device=args.device)
    pipe.set_progress_bar_config(disable=True)
    if args.steps is None:
        args.steps = int(pipe.rotvid_call_defaults["num_inference_steps"])
        if args.dense_first_steps >= args.steps:
            raise SystemExit(f"--dense-first-steps {args.dense_first_steps}: leaves no sparse step of {args.steps}")
    prompts = held_out_prompts(args.prompts, seed=args.prompt_seed, motions=DIRECTIONS)
    pool = make_executor(args.workers)
    base = {"study": "sparse_oracle", "device": device_description(args.device), "commit": git_commit(),
            "command": command_line("sparse_oracle", argv), "date": utc_stamp(), "model": "proxy",
            "recipe": args.recipe, "rotation": args.rotation, "backend": args.backend, "dtype": args.dtype,
            "steps": args.steps, "seed": args.seed, "prompts": prompts, "densities": list(args.densities),
            "kinds": list(args.kinds), "dense_first_steps_settings": list(args.dfs_settings),
            "topp_sim": args.topp_sim}
    try:
        entry, tried, why = choose_size(pipe, args, prompts, pool)
        entry["size_tuple"] = next(s for s in args.sizes if size_text(s) == entry["size"])
        say(f"study size {entry['size']} ({entry['blocks_per_row']} key blocks per row): {why}")
        specs, calibration = match_specs(args, entry)
        t_dense = time.perf_counter() - t_start

        def write_partial(pending):
            if args.json_out is not None:
                partial = dict(base, complete=False, size=entry["size"], rows=_json_rows(finish_rows(pending,
                                                                                                     wait=False)))
                _write(args.json_out, json.dumps(partial, indent=1) + "\n")

        pending = run_sparse(pipe, args, entry, specs, pool, write_partial)
        rows = finish_rows(pending)
    finally:
        pool.shutdown(wait=True)
    summary = summarize(rows)
    bar = bar_check(summary)
    dense_reports = [item["dense_report"] for item in entry["prompts"]]
    fallbacks = sum(r["fallback_calls"] for r in rows) + sum(r["fallback_calls"] for r in dense_reports)
    if fallbacks:
        say(f"WARNING: {fallbacks} calls fell back to the model's own attention (see fallback_calls per row): those "
            f"videos are not all {args.recipe}")
    result = dict(base, complete=True, size=entry["size"], grid=entry["grid"], tokens=entry["tokens"],
                  blocks_per_row=entry["blocks_per_row"], size_choice=why, sizes_tried=_sizes_for_json(tried),
                  dense_backends=dense_reports[0]["backends"], fallback_calls=fallbacks,
                  calibration=calibration, summary=summary, bar=bar, rows=_json_rows(rows),
                  seconds=time.perf_counter() - t_start, seconds_references=t_dense,
                  seconds_per_sparse_video=_mean([r["seconds"] for r in rows]))
    text = markdown(result)
    print(text)
    if args.json_out is not None:
        _write(args.json_out, json.dumps(result, indent=1) + "\n")
        say(f"wrote {args.json_out}")
    if args.markdown_out is not None:
        _write(args.markdown_out, text)
        say(f"wrote {args.markdown_out}")
    return result


if __name__ == "__main__":
    main()
