"""Multi-GPU benchmark: Wan 14B 720p on 1 GPU vs N GPUs (Ulysses) -- bf16 SDPA, diffusers' own context parallelism
and rotvid (dense and block-sparse), eager or compiled -- with the all-to-all's share and the minutes of a whole video.

Speed does not depend on the weights' values, so the Wan2.1-T2V-14B architecture (40 heads of 128, dim 5120, ffn
13824, text_dim 4096; ``--layers`` of its 40 blocks: 4, the default, is a slice, 40 the full forward) is built with
random weights (same seed on every rank, directly in bf16) and fed random inputs of the real shapes: latents
[1, 16, 21, 90, 160] (720x1280, 81 frames -> 21 x 45 x 80 = 75,600 video tokens) and a 512-token text embedding.

For each world size in ``--gpus`` (default ``1,2``) the script runs itself under torchrun (one process per GPU,
NCCL; ``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1``: NVLink multicast stays off), builds the
model once per process and times, on rank 0, with CUDA events (every rank in step: a barrier before each timed
forward), the median of ``--iters`` forwards after ``--warmup`` warm-up forwards. Rows (``method`` in the JSON):

* ``sdpa`` (1 GPU) / ``diffusers-cp-sdpa`` (N > 1) — the untouched transformer, diffusers' attention (native
  SDPA); with N > 1 under diffusers' own Ulysses (``ContextParallelConfig(ulysses_degree=N)``);
* ``rotvid`` — one row per ``--sparsity`` spec: rotvid applied with the configuration users get by default
  (``RotvidConfig``: ``--recipe auto`` -- this GPU's recipe, int8-fp8 on Hopper --, half rotation, no V/O
  Hadamard, every call quantized) on the ``cuda`` backend and that block map (``none``: dense); with N > 1 under
  rotvid's Ulysses exchange (:mod:`rotvid.pipelines.context_parallel`). ``--sparsity`` takes one or more specs,
  space-separated or repeated, since a spec has commas of its own (``--sparsity none radial:window=40`` or
  ``--sparsity none --sparsity radial:window=40,band=2``; the forms of ``rotvid generate --sparsity``); default
  ``none``.

``--no-sdpa`` leaves the SDPA rows out (they may come from an earlier run in the JSON, below: a long run split into
several invocations, e.g. the full forward under a per-command time limit).

``--compile``: every row compiled as rotvid users compile — ``transformer.compile(fullgraph=True)``, for rotvid
through ``apply(model, config, compile=...)`` (:mod:`rotvid.pipelines.compiling`), for the SDPA rows the same
call on the untouched transformer; dynamo is reset before each row, so each compiles from scratch. The first
warm-up forward compiles (its time less the steady time is the row's ``compile_s``); graphs compiled during the
timed forwards are reported as recompiles (expected 0; ``fullgraph`` makes a graph break an error).
``--compile-backend eager`` / ``aot_eager`` trace with dynamo without code generation (CPU smoke tests).

Memory: one model per process (the full 40 blocks: 28 GB of bf16 weights per GPU, no float32 copy at any point); the
world sizes run one after the other; before each row the previous row's compiled graphs are dropped and cached GPU
memory is released; each row reports its peak GPU memory (``peak_gb``, rank 0, timed forwards).

The **all-to-all** time of one forward: the exchanges of one self-attention call (Q, K, V sequence→heads and the
output heads→sequence, :func:`sequence_to_heads` / :func:`heads_to_sequence` on the call's real shapes) timed
alone × the number of blocks; its share of each N-GPU row (diffusers' Ulysses moves the same tensors; the
exchanges are synchronous, nothing overlaps them).

The table has one row per (GPUs, method, sparsity): ms per forward, the ratio to the SDPA row of the same GPU count
(``vs SDPA``) and to the 1-GPU SDPA row (``vs 1-GPU SDPA``), scaling (the same method's 1-GPU time / the row's;
``diffusers-cp-sdpa`` against ``sdpa``), all-to-all ms and share, and minutes per video: ``--steps`` (50) x
``--cfg-forwards`` (2, cond + uncond) x the full 40-block forward -- measured with ``--layers 40``, else
extrapolated per block (ms x 40 / layers; the embeddings and the output head scaled with the blocks), labelled so.
Below it the issue's bars at 2 GPUs, each where its rows exist: rotvid (dense) ≥ 1.8× its 1-GPU forward; rotvid's
ratio over SDPA on 2 GPUs within 5% of its 1-GPU ratio; rotvid with a block map ≥ 3.4× the 1-GPU SDPA forward (the
issue's figures are for compiled forwards).

The JSON (``--json-out``; by default ``benchmarks/results/parallel_bench.json`` for a run that appends its table,
i.e. not ``--tiny`` and not ``--no-append``): ``{"device", "commit", "date", "setup", "torch", "commands",
"rows"}``, one row per measurement: ``gpus``, ``method`` (sdpa | rotvid | diffusers-cp-sdpa), ``mode`` (eager |
compiled), ``sparsity`` (``none`` or the canonical spec), ``layers``, ``ms``, ``vs_sdpa``, ``vs_1gpu_sdpa``,
``scaling``, ``a2a_ms``, ``a2a_share``, ``video_min`` with ``video_basis`` (measured | extrapolated per block),
``steps``, ``cfg_forwards``, ``compile_s``, ``graphs``, ``recompiles``, ``peak_gb``, ``command``, ``date``; rotvid
rows also ``recipe``, ``backends``, ``fallbacks`` (rank 0's; ``fallbacks_by_rank`` when the ranks' reports
differ), ``density`` (the map's mean). An existing file of the same
device, commit and setup is merged into: its rows of other (gpus, method, mode, sparsity, layers) are kept -- so the
1-GPU and 2-GPU runs, or the slice and the full forward, may come from separate invocations -- and the ratios, the
table and the bars use them (marked ``earlier run``); a file of another device, commit or setup is replaced.

    python -m benchmarks.parallel_bench --compile --sparsity none radial:window=40      # 4-block slice, 1 and 2 GPUs
    python -m benchmarks.parallel_bench --compile --sparsity none radial:window=40 --layers 40 --warmup 2 --iters 3
    python -m benchmarks.parallel_bench --gpus 1,2,4 --layers 8 --no-append
    python -m benchmarks.parallel_bench --tiny --gpus 1,2 --compile --sparsity none radial:window=1  # CPU smoke run

``--tiny``: a 4-head Wan on CPU processes over gloo, the reference backend, latents 1x4x8x16x16 (8 x 8 x 8 tokens,
four map blocks: ``radial:window=1`` keeps 10 of 16); minutes and bars are computed as for the real model.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch

from benchmarks.provenance import device_description, git_commit, utc_stamp
from benchmarks.random_wan import LATENT_720P, WAN_14B, build_random_wan, video_tokens
from benchmarks.results_log import add_append_options, append_table
from benchmarks.timing import call_ms, sync

TINY = dict(
    patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=64, in_channels=4, out_channels=4,
    text_dim=32, freq_dim=32, ffn_dim=64, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
    rope_max_seq_len=64,
)
# 8 x 8 x 8 = 512 tokens: 4 map blocks of 128, so a radial map (window=1) drops some
LATENT_TINY = (1, 4, 8, 16, 16)
FULL_DEPTH = WAN_14B["num_layers"]  # the whole forward's blocks: minutes per video scale a slice to these
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "parallel_bench.json"
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
ROW_KEY = ("gpus", "method", "mode", "sparsity", "layers")  # one measurement; a merge replaces rows of equal keys
# the issue's bars (at 2 GPUs)
BAR_SCALING, BAR_RATIO_DRIFT, BAR_SPARSE_VS_1GPU_SDPA = 1.8, 0.05, 3.4


def sdpa_method(world: int) -> str:
    """The untouched transformer's method name: ``sdpa`` on one process, ``diffusers-cp-sdpa`` under diffusers'
    context parallelism."""
    return "sdpa" if world == 1 else "diffusers-cp-sdpa"


def setup_name(tiny: bool) -> str:
    return "tiny Wan (smoke)" if tiny else "Wan2.1-14B 720p 81f"


# ---- worker (one process per GPU, under torchrun) ------------------------------------------------


def _graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process (cumulative; differences count a row's compiles)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def _measure(forward, device: str, warmup: int, iters: int, compiled: bool) -> dict:
    """Time ``forward`` (every rank calls it): ``warmup`` forwards, the first timed apart (it compiles a compiled row),
    then the median of ``iters`` timed forwards; the graphs compiled in each phase; peak GPU memory of the timed
    forwards."""
    graphs0 = _graphs_compiled()
    first_s = None
    for i in range(warmup):
        _barrier()
        sync(device)
        t0 = time.perf_counter()
        forward()
        sync(device)
        if i == 0:
            first_s = time.perf_counter() - t0
    graphs1 = _graphs_compiled()
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(iters):
        _barrier()
        times.append(call_ms(forward, device))
    ms = statistics.median(times)
    compile_s = max(0.0, first_s - ms / 1e3) if compiled and first_s is not None else None
    return {
        "ms": ms, "compile_s": compile_s, "graphs": graphs1 - graphs0, "recompiles": _graphs_compiled() - graphs1,
        "peak_gb": torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None,
    }


def _compile_options(args) -> dict:
    """``torch.compile`` options of every compiled row: the ``apply(compile=True)`` default plus the backend."""
    return {"fullgraph": True} if args.compile_backend == "inductor" else {"fullgraph": True,
                                                                          "backend": args.compile_backend}


def _free(device: str) -> None:
    """Drop the previous row's compiled graphs and give cached GPU memory back before the next row."""
    torch._dynamo.reset()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def _say(rank: int, text: str) -> None:
    if rank == 0:
        print(f"[parallel_bench] {text}", file=sys.stderr, flush=True)


def worker(args) -> None:
    from rotvid.distributed_run import finish_worker, merge_run_reports
    from rotvid.pipelines import RotvidConfig, Schedule, apply, remove
    from rotvid.pipelines.compiling import compile_transformers, uncompile_transformers
    from rotvid.pipelines.context_parallel import (
        enable_context_parallel, heads_to_sequence, sequence_to_heads, ulysses_group,
    )

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if args.tiny:
        device, dtype, backend, config, latent, text_len = "cpu", torch.float32, "reference", TINY, LATENT_TINY, 16
    else:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device, dtype, backend, config, latent, text_len = f"cuda:{local}", torch.bfloat16, args.backend, \
            WAN_14B, LATENT_720P, 512
    if world > 1:  # a long timeout: a rank may wait at a barrier while the other compiles the full model
        import torch.distributed as dist

        dist.init_process_group("gloo" if args.tiny else "nccl", timeout=timedelta(seconds=1800))
    mode = "compiled" if args.compile else "eager"
    t0 = time.perf_counter()
    model, inputs = build_random_wan(dict(config, num_layers=args.layers), latent, text_len, device, dtype, args.seed)
    _say(rank, f"{world} process(es): built {args.layers} blocks in {time.perf_counter() - t0:.0f} s")
    if world > 1:
        enable_context_parallel(model, world)
    base = {"gpus": world, "mode": mode, "layers": args.layers}
    timing = dict(device=device, warmup=args.warmup, iters=args.iters, compiled=args.compile)

    def forward():
        with torch.inference_mode():
            model(**inputs)

    rows = []
    if not args.no_sdpa:
        _free(device)
        options = _compile_options(args)
        compiled = compile_transformers({"transformer": model}, options) if args.compile else []
        try:
            rows.append({**base, "method": sdpa_method(world), "sparsity": "none", **_measure(forward, **timing)})
        finally:
            uncompile_transformers({"transformer": model}, compiled)
        _say(rank, f"{world} process(es): {rows[-1]['method']} {rows[-1]['ms']:.1f} ms")
    for spec in args.sparsity:
        _free(device)
        cfg = RotvidConfig(recipe=args.recipe, rotation=args.rotation, backend=backend, schedule=Schedule(),
                           sparsity=spec)
        handle = apply(model, cfg, compile=_compile_options(args) if args.compile else False)
        try:
            handle.tracker.begin(1)
            handle.tracker.set_step(0)
            timed = _measure(forward, **timing)
            report = merge_run_reports(handle.report.to_dict())  # every rank's (a collective)
            row = {**base, "method": "rotvid", "sparsity": spec, **timed, "recipe": report["recipe"],
                   "backends": report["backends"], "fallbacks": report["fallbacks"],
                   "density": report["sparsity"]["mean_density"] if spec != "none" else 1.0}
            if not report.get("ranks_agree", True):  # e.g. a fallback on one rank only
                row["fallbacks_by_rank"] = [r["fallbacks"] for r in report["ranks"]]
            rows.append(row)
        finally:
            remove(model)
        _say(rank, f"{world} process(es): rotvid {spec} {rows[-1]['ms']:.1f} ms")
    _free(device)

    a2a_ms = None
    if world > 1:
        b, n = latent[0], video_tokens(config, latent)
        heads, d = config["num_attention_heads"], config["attention_head_dim"]
        group = ulysses_group(model._parallel_config)
        shard = torch.randn(b, heads, n // world, d, device=device, dtype=dtype)
        full = torch.randn(b, heads // world, n, d, device=device, dtype=dtype)

        def exchanges():
            for _ in range(3):
                sequence_to_heads(shard, group)
            heads_to_sequence(full, group)

        a2a_ms = _measure(exchanges, device, max(1, args.warmup), args.iters, False)["ms"] * args.layers
        del shard, full
    if rank == 0:
        for r in rows:
            r["a2a_ms"], r["a2a_share"] = (None, None) if a2a_ms is None else (a2a_ms, a2a_ms / r["ms"])
        Path(args.worker_out).write_text(json.dumps({"rows": rows, "device_name": device_description(device)}))
    finish_worker()  # the process ends here: its model goes with it, before the next world size starts


# ---- launcher ----------------------------------------------------------------------------------


def launch(args, world: int, out: Path) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
           "-m", "benchmarks.parallel_bench", *args.argv, "--worker-out", str(out)]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    rc = subprocess.call(cmd, env=env)
    if rc != 0:
        sys.exit(f"parallel_bench: the {world}-process run failed (exit code {rc})")
    return json.loads(out.read_text())


# ---- rows: derived figures, JSON, table, bars ----------------------------------------------------


def _find(rows: list[dict], **key) -> dict | None:
    return next((r for r in rows if all(r.get(k) == v for k, v in key.items())), None)


def _ratio(num: dict | None, den: dict | None) -> float | None:
    return None if num is None or den is None else num["ms"] / den["ms"]


def video_minutes(ms: float, layers: int, steps: int, cfg_forwards: int) -> tuple[float, str]:
    """(minutes of the transformer for a whole video, basis): ``steps`` x ``cfg_forwards`` x the full
    :data:`FULL_DEPTH`-block forward -- ``ms`` itself when ``layers`` is the full depth, else ``ms`` x FULL_DEPTH /
    ``layers`` (extrapolated per block)."""
    full_ms = ms if layers == FULL_DEPTH else ms * FULL_DEPTH / layers
    basis = "measured" if layers == FULL_DEPTH else "extrapolated per block"
    return steps * cfg_forwards * full_ms / 60e3, basis


def derive(rows: list[dict]) -> None:
    """Fill each row's ratios in place from the rows of the same mode and layers: ``vs_sdpa`` (the same GPU count's
    SDPA row / the row), ``vs_1gpu_sdpa`` and ``scaling`` (the same method and map on 1 GPU / the row; the SDPA rows
    against ``sdpa``)."""
    for r in rows:
        group = [x for x in rows if x["mode"] == r["mode"] and x["layers"] == r["layers"]]
        one_sdpa = _find(group, gpus=1, method="sdpa")
        one_same = _find(group, gpus=1, method="sdpa" if r["method"].endswith("sdpa") else r["method"],
                         sparsity=r["sparsity"])
        r["vs_sdpa"] = _ratio(_find(group, gpus=r["gpus"], method=sdpa_method(r["gpus"])), r)
        r["vs_1gpu_sdpa"] = _ratio(one_sdpa, r)
        r["scaling"] = _ratio(one_same, r)


def _rounded(row: dict) -> dict:
    out = {}
    for k, v in row.items():
        if k.startswith("_"):
            continue
        out[k] = round(v, 4) if isinstance(v, float) else v
    return out


def load_json(path: Path) -> dict | None:
    """The JSON at ``path`` (None when there is none); ValueError naming the file when it is not ours."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not readable JSON ({err}); move it away or pass another --json-out") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) or not all(
            isinstance(r, dict) and all(k in r for k in (*ROW_KEY, "ms")) for r in data["rows"]):
        raise ValueError(f"{path}: not a parallel_bench result (expected an object whose rows have "
                         f"{', '.join(ROW_KEY)}, ms); move it away or pass another --json-out")
    return data


def merge_rows(existing: dict | None, run: dict, rows: list[dict]) -> tuple[list[dict], list[str], str | None]:
    """(rows, commands, note): this run's rows, and those of ``existing`` (a file of the same device, commit and
    setup) whose key (:data:`ROW_KEY`) this run did not measure (they carry no ``_this_run`` mark: the table calls them
    an earlier run's). ``note`` says when ``existing`` is of another device, commit or setup and is replaced."""
    if existing is None:
        return rows, [run["command"]], None
    same = all(existing.get(k) == run[k] for k in ("device", "commit", "setup"))
    if not same:
        note = (f"replacing the rows of {existing.get('device')}, commit {existing.get('commit')}, "
                f"{existing.get('setup')}")
        return rows, [run["command"]], note
    measured = {tuple(r[k] for k in ROW_KEY) for r in rows}
    kept = [dict(r) for r in existing["rows"] if tuple(r[k] for k in ROW_KEY) not in measured]
    commands = [c for c in existing.get("commands", []) if c != run["command"]] + [run["command"]]
    return kept + rows, commands, None


def row_order(r: dict) -> tuple:
    """Table order: mode, layers, GPUs; the SDPA row first, then rotvid dense, then the maps."""
    return r["mode"], r["layers"], r["gpus"], r["method"] == "rotvid", r["sparsity"] != "none", r["sparsity"]


def write_json(path: Path, run: dict, rows: list[dict], commands: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {**{k: run[k] for k in ("device", "commit", "date", "setup", "torch")}, "commands": commands,
           "rows": [_rounded(r) for r in rows]}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)  # atomic: a reader never sees half a file
    print(f"wrote {path} ({len(rows)} rows)")


def _fmt(value, spec: str, suffix: str = "") -> str:
    return "—" if value is None else format(value, spec) + suffix


def _label(r: dict) -> str:
    return r["method"] + ("" if r["sparsity"] == "none" else f" + {r['sparsity']}")


def bar_lines(rows: list[dict], mode: str, layers: int) -> list[str]:
    """The issue's bars at 2 GPUs (met / NOT met with the figures), each where its rows exist, and the same figures
    without a verdict at other GPU counts."""
    group = [r for r in rows if r["mode"] == mode and r["layers"] == layers]
    one_sdpa = _find(group, gpus=1, method="sdpa")
    one_rot = _find(group, gpus=1, method="rotvid", sparsity="none")
    lines = []
    for n in sorted({r["gpus"] for r in group if r["gpus"] > 1}):
        rot = _find(group, gpus=n, method="rotvid", sparsity="none")
        cp = _find(group, gpus=n, method="diffusers-cp-sdpa")
        bar = n == 2
        if rot is not None and one_rot is not None:
            scale = one_rot["ms"] / rot["ms"]
            verdict = f" (bar ≥ {BAR_SCALING}×: {'met' if scale >= BAR_SCALING else 'NOT met'})" if bar else ""
            lines.append(f"- {n} GPUs: rotvid {scale:.2f}× its 1-GPU forward ({one_rot['ms']:.1f} → "
                         f"{rot['ms']:.1f} ms){verdict}.")
        if rot is not None and cp is not None and one_rot is not None and one_sdpa is not None:
            s1, sn = one_sdpa["ms"] / one_rot["ms"], cp["ms"] / rot["ms"]
            drift = sn / s1 - 1
            verdict = (f", bar within {100 * BAR_RATIO_DRIFT:.0f}%: "
                       f"{'met' if abs(drift) <= BAR_RATIO_DRIFT else 'NOT met'}") if bar else ""
            lines.append(f"- {n} GPUs: rotvid over SDPA {sn:.3f}× (diffusers-cp-sdpa {cp['ms']:.1f} ms) vs {s1:.3f}× "
                         f"on 1 GPU ({100 * drift:+.1f}%{verdict}).")
        for sparse in (r for r in group if r["gpus"] == n and r["method"] == "rotvid" and r["sparsity"] != "none"):
            if one_sdpa is None:
                continue
            x = one_sdpa["ms"] / sparse["ms"]
            verdict = (f" (bar ≥ {BAR_SPARSE_VS_1GPU_SDPA}×: {'met' if x >= BAR_SPARSE_VS_1GPU_SDPA else 'NOT met'})"
                       if bar else "")
            lines.append(f"- {n} GPUs: rotvid + {sparse['sparsity']} (density {_fmt(sparse.get('density'), '.3f')}) "
                         f"{x:.2f}× the 1-GPU SDPA forward ({one_sdpa['ms']:.1f} → {sparse['ms']:.1f} ms){verdict}.")
    if not lines:
        lines.append("- no bar: it needs the 1-GPU and the 2-GPU rows of a method (--gpus 1,2).")
    return lines


def markdown(run: dict, rows: list[dict], args) -> str:
    """The run's table (rows of this run's modes and layers, earlier runs' rows of the same commit included and
    marked), the minutes per video and the bars."""
    latent = LATENT_TINY if args.tiny else LATENT_720P
    mode = "compiled" if args.compile else "eager"
    this = [r for r in rows if r.get("_this_run")]
    recipes = sorted({r["recipe"] for r in this if "recipe" in r})
    how = (f"compiled: `transformer.compile(fullgraph=True)` (rotvid: `apply(..., compile=...)`), backend "
           f"{args.compile_backend}, dynamo reset before each row" if args.compile else "eager")
    lines = [
        f"### parallel_bench: {run['device']}, {run['date']}, commit {run['commit']}",
        "",
        f"torch {torch.__version__}; {run['setup']}, random weights; latents {'x'.join(map(str, latent))}; rotvid: "
        f"recipe {', '.join(recipes) or '—'} (asked: {args.recipe}), rotation {args.rotation}, no V/O Hadamard, "
        f"every call quantized; Ulysses over N processes (NVLink multicast off); {how}; median of {args.iters} "
        f"forwards after {args.warmup} warm-up. vs SDPA = the same N's SDPA row / the row; scaling = the same "
        "method's 1-GPU time / the row's; all-to-all = the four exchanges of one self-attention call timed alone × "
        "blocks.",
        "",
    ]
    for layers in sorted({r["layers"] for r in this}):
        group = [r for r in rows if r["mode"] == mode and r["layers"] == layers]
        basis = video_minutes(1.0, layers, args.steps, args.cfg_forwards)[1]
        what = "the full forward" if layers == FULL_DEPTH else f"a {layers}-block slice"
        lines += [
            f"**{layers} blocks ({what}), {mode}**",
            "",
            "| GPUs | method | sparsity | ms / forward | vs SDPA | vs 1-GPU SDPA | scaling | all-to-all ms "
            "| all-to-all share | min / video | note |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in group:
            notes = []
            if r["method"] == "rotvid":
                notes.append(f"{r.get('recipe')}, backend {', '.join(sorted(r.get('backends') or {})) or 'none'}")
                if r["sparsity"] != "none":
                    notes.append(f"density {_fmt(r.get('density'), '.3f')}")
                if r.get("fallbacks"):
                    notes.append(f"FALLBACKS {r['fallbacks']}")
            if r["mode"] == "compiled":
                notes.append(f"compile {_fmt(r.get('compile_s'), '.0f', ' s')}, {r.get('graphs')} graph(s)")
            if r.get("recompiles"):
                notes.append(f"RECOMPILED {r['recompiles']}× while timed")
            if r.get("peak_gb") is not None:
                notes.append(f"peak {r['peak_gb']:.1f} GB")
            if not r.get("_this_run"):
                notes.append(f"earlier run ({r.get('date', '?')})")
            lines.append(
                f"| {r['gpus']} | {r['method']} | {r['sparsity']} | {r['ms']:.1f} | {_fmt(r['vs_sdpa'], '.3f', '×')} "
                f"| {_fmt(r['vs_1gpu_sdpa'], '.3f', '×')} | {_fmt(r['scaling'], '.2f', '×')} "
                f"| {_fmt(r.get('a2a_ms'), '.1f')} | {_fmt(r.get('a2a_share'), '.1%')} | {r['video_min']:.1f} "
                f"| {'; '.join(notes)} |")
        lines.append("")
        per_n = []
        for n in sorted({r["gpus"] for r in group}):
            parts = [f"{_label(r)} {r['video_min']:.1f}" for r in group if r["gpus"] == n]
            per_n.append(f"{n} GPU{'s' if n > 1 else ''}: {', '.join(parts)}")
        scale = "" if basis == "measured" else f" (ms × {FULL_DEPTH} / {layers})"
        lines.append(f"Whole video = {args.steps} steps × {args.cfg_forwards} forwards × the {FULL_DEPTH}-block "
                     f"forward, {basis}{scale}, transformer only, minutes: {'; '.join(per_n)}.")
        lines.append("")
        lines.append(f"Bars ({mode}, {layers} blocks; the issue's are for compiled forwards):")
        lines += bar_lines(rows, mode, layers)
        if any(not r.get("_this_run") for r in group):
            lines.append("- rows marked `earlier run` (same device and commit, from the JSON) stand in where this run "
                         "measured nothing.")
        recompiled = [_label(r) + f" on {r['gpus']}" for r in group if r.get("recompiles")]
        if recompiled:
            lines.append(f"- RECOMPILES during the timed forwards ({', '.join(recompiled)}): those times include "
                         "compilation.")
        lines.append("")
    return "\n".join(lines)


# ---- arguments and main ------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None):
    """Parse and validate every option (one clear error, before anything is built or launched)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", default="1,2", help="comma-separated world sizes to run (default 1,2)")
    ap.add_argument("--layers", type=int, default=4,
                    help=f"Wan 14B blocks timed (default 4: a slice; {FULL_DEPTH}: the full forward)")
    ap.add_argument("--recipe", default="auto",
                    help="quantized recipe (default auto: the GPU's recipe, resolved by apply and named in the table)")
    ap.add_argument("--rotation", default="half", help="Q/K rotation (default half)")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "auto"), help="rotvid backend (default cuda)")
    ap.add_argument("--sparsity", nargs="+", action="extend", default=None, metavar="SPEC",
                    help="one rotvid row per block map: none (dense) or a spec as rotvid generate --sparsity takes it "
                         "(radial[:band=INT,window=INT,decay=FLOAT], topp:TAU[,sim=FLOAT]); space-separated or "
                         "repeated (default: none)")
    ap.add_argument("--no-sdpa", action="store_true",
                    help="skip the SDPA row (a run that adds rotvid rows to a JSON holding it: runs split to fit a "
                         "time limit)")
    ap.add_argument("--compile", action="store_true",
                    help="compile every row: transformer.compile(fullgraph=True) (rotvid through apply(compile=...))")
    ap.add_argument("--compile-backend", default="inductor", choices=COMPILE_BACKENDS,
                    help="torch.compile backend with --compile (default inductor; eager / aot_eager: dynamo only, "
                         "for smoke tests)")
    ap.add_argument("--steps", type=int, default=50, help="denoising steps of a whole video (default 50)")
    ap.add_argument("--cfg-forwards", type=int, default=2,
                    help="transformer forwards per step (default 2: cond + uncond, classifier-free guidance)")
    ap.add_argument("--tiny", action="store_true", help="tiny model on CPU processes over gloo: a smoke run")
    ap.add_argument("--warmup", type=int, default=None,
                    help="warm-up forwards per row (default 3; tiny 1); with --compile the first one compiles")
    ap.add_argument("--iters", type=int, default=None, help="timed forwards per row (default 10; tiny 2)")
    ap.add_argument("--seed", type=int, default=0)
    add_append_options(ap)
    ap.add_argument("--json-out", type=Path, default=None,
                    help=f"write the rows as JSON here, merged with the file's rows of the same device, commit and "
                         f"setup (default {DEFAULT_JSON.relative_to(DEFAULT_JSON.parents[2])} for a run that appends "
                         "its table: not --tiny, not --no-append)")
    ap.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)  # set by the launcher on its workers
    args = ap.parse_args(argv)
    args.argv = argv
    try:
        worlds = sorted({int(x) for x in args.gpus.split(",") if x.strip()})
    except ValueError:
        ap.error(f"--gpus: expected comma-separated process counts, got {args.gpus!r}")
    if not worlds or worlds[0] < 1:
        ap.error(f"--gpus: expected positive process counts, got {args.gpus!r}")
    args.worlds = worlds
    heads = (TINY if args.tiny else WAN_14B)["num_attention_heads"]
    odd = [w for w in worlds if heads % w]
    if odd:
        ap.error(f"--gpus {args.gpus}: Ulysses splits the {heads} heads evenly; {odd} do not divide {heads}")
    if args.layers < 1 or (not args.tiny and args.layers > FULL_DEPTH):
        ap.error(f"--layers: expected 1 to {FULL_DEPTH} (Wan 14B's blocks), got {args.layers}")
    for name in ("steps", "cfg_forwards", "iters"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: expected a positive int, got {getattr(args, name)}")
    if args.warmup is None:
        args.warmup = 1 if args.tiny else 3
    if args.iters is None:
        args.iters = 2 if args.tiny else 10
    if args.warmup < (1 if args.compile else 0):
        need = "at least 1 with --compile (the first forward compiles)" if args.compile else "a count >= 0"
        ap.error(f"--warmup: expected {need}, got {args.warmup}")
    if args.compile_backend != "inductor" and not args.compile:
        ap.error(f"--compile-backend {args.compile_backend}: only with --compile")
    from rotvid.pipelines import RotvidConfig

    specs = []
    for text in args.sparsity or ["none"]:
        try:  # the config's own check: recipe, rotation and the map spec, as apply will see them
            spec = str(RotvidConfig(recipe=args.recipe, rotation=args.rotation, sparsity=text).sparsity)
        except ValueError as err:
            ap.error(f"--recipe/--rotation/--sparsity: {err}")
        if spec not in specs:
            specs.append(spec)
    args.sparsity = specs
    if args.json_out is None and not args.tiny and not args.no_append:
        args.json_out = DEFAULT_JSON
    if args.json_out is not None and args.worker_out is None:
        try:
            load_json(args.json_out)
        except ValueError as err:
            ap.error(f"--json-out: {err}")
    return args


def _measuring_args(argv: list[str]) -> list[str]:
    """The arguments that decide what is measured: the output paths (``--append``, ``--json-out``; machine-specific,
    often outside the repository) left out of the recorded command."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--append", "--json-out"):
            skip = True
        elif not a.startswith(("--append=", "--json-out=")):
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> str | None:
    args = parse_args(argv)
    if args.worker_out is not None:
        worker(args)
        return None
    if not args.tiny:
        have = torch.cuda.device_count()
        if have < args.worlds[-1]:
            sys.exit(f"parallel_bench: --gpus {args.gpus} needs {args.worlds[-1]} CUDA GPUs; this machine has {have} "
                     "(use --tiny for a CPU smoke run)")
    command = shlex.join(["python", "-m", "benchmarks.parallel_bench", *_measuring_args(args.argv)])
    with tempfile.TemporaryDirectory() as tmp:
        results = [launch(args, w, Path(tmp) / f"world{w}.json") for w in args.worlds]
    run = {"device": results[0]["device_name"], "commit": git_commit(), "date": utc_stamp(),
           "setup": setup_name(args.tiny), "torch": torch.__version__, "command": command}
    rows = [{**r, "command": command, "date": run["date"], "_this_run": True} for res in results for r in res["rows"]]
    existing = load_json(args.json_out) if args.json_out is not None else None
    rows, commands, note = merge_rows(existing, run, rows)
    rows.sort(key=row_order)
    derive(rows)
    for r in rows:  # every row's minutes at this run's --steps / --cfg-forwards
        r["video_min"], r["video_basis"] = video_minutes(r["ms"], r["layers"], args.steps, args.cfg_forwards)
        r["steps"], r["cfg_forwards"] = args.steps, args.cfg_forwards
    md = markdown(run, rows, args)
    print(md)
    if args.json_out is not None:
        if note:
            print(f"{args.json_out}: {note}")
        write_json(args.json_out, run, rows, commands)
    append_table(md, args)
    return md


if __name__ == "__main__":
    main()
