"""Multi-GPU benchmark: a Wan 14B 720p layer slice, 1 GPU vs N GPUs (Ulysses), bf16 SDPA vs rotvid.

Speed does not depend on the weights' values, so a slice of the Wan2.1-T2V-14B architecture
(40 heads of 128, dim 5120, ffn 13824, text_dim 4096; ``--layers`` of its 40 blocks, default 4) is
built with random weights (same seed on every rank) and fed random inputs of the real shapes:
latents [1, 16, 21, 90, 160] (720x1280, 81 frames -> 21 x 45 x 80 = 75,600 video tokens) and a
512-token text embedding.

For each world size in ``--gpus`` (default ``1,2``) the script runs itself under torchrun (one
process per GPU, NCCL; ``NCCL_NVLS_ENABLE=0`` and ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``: NVLink
multicast stays off) and times, on rank 0, with CUDA events after warm-up:

* ``bf16 SDPA`` — the untouched transformer; with N > 1 under diffusers' own Ulysses
  (``ContextParallelConfig(ulysses_degree=N)``, native SDPA backend);
* ``rotvid`` — rotvid applied (``--recipe``, default ``auto``, on every block, ``--rotation`` + V/O Hadamard, the
  ``cuda`` backend), with N > 1 under rotvid's Ulysses exchange
  (:mod:`rotvid.pipelines.context_parallel`);
* the **all-to-all** time of one forward: the exchanges of one self-attention call (Q, K, V
  sequence→heads and the output heads→sequence, :func:`sequence_to_heads` /
  :func:`heads_to_sequence` on the call's real shapes) timed alone × the number of blocks, and
  its share of the rotvid forward (the exchanges are synchronous, nothing overlaps them).

The table has one row per (GPUs, method): ms per forward, ratio to bf16 SDPA on the same GPU
count (same run), scaling against the same method on 1 GPU, all-to-all ms and share; below it
the issue's bar: N-GPU rotvid ≥ 1.8× the 1-GPU rotvid forward (N = 2), and rotvid's speedup over
SDPA on N GPUs within 5% of its 1-GPU speedup.

    python benchmarks/parallel_bench.py                  # 1 and 2 GPUs, appends to benchmarks/RESULTS.md
    python benchmarks/parallel_bench.py --gpus 1,2,4 --layers 8 --no-append
    python benchmarks/parallel_bench.py --tiny --gpus 1,2   # CPU smoke run (gloo, tiny model, reference)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.provenance import device_description, git_commit, utc_stamp  # noqa: E402
from benchmarks.random_wan import LATENT_720P, WAN_14B, build_random_wan, video_tokens  # noqa: E402
from benchmarks.results_log import add_append_options, append_table  # noqa: E402
from benchmarks.timing import call_ms, sync  # noqa: E402

TINY = dict(
    patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=64, in_channels=4, out_channels=4,
    text_dim=32, freq_dim=32, ffn_dim=64, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
    rope_max_seq_len=64,
)
LATENT_TINY = (1, 4, 4, 8, 16)


# ---- worker (one process per GPU, under torchrun) ------------------------------------------------


def _time(fn, device: str, warmup: int, iters: int) -> float:
    """Median ms of ``fn()`` (CUDA events on GPUs, perf_counter on CPU); every rank calls it."""
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(iters):
        if dist.is_initialized():
            dist.barrier()
        times.append(call_ms(fn, device))
    return statistics.median(times)


def worker(args) -> None:
    import torch.distributed as dist

    from rotvid.pipelines import RotvidConfig, Schedule, apply, remove
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
    if world > 1:
        dist.init_process_group("gloo" if args.tiny else "nccl")
    model, inputs = build_random_wan(dict(config, num_layers=args.layers), latent, text_len, device, dtype, args.seed)
    if world > 1:
        enable_context_parallel(model, world)

    def forward():
        with torch.inference_mode():
            model(**inputs)

    rows = {"bf16 SDPA" if dtype == torch.bfloat16 else f"{str(dtype).removeprefix('torch.')} SDPA":
            _time(forward, device, args.warmup, args.iters)}
    cfg = RotvidConfig(recipe=args.recipe, rotation=args.rotation, vo_hadamard="online", backend=backend,
                       schedule=Schedule())
    handle = apply(model, cfg)
    try:
        handle.tracker.begin(1)
        handle.tracker.set_step(0)
        rows["rotvid"] = _time(forward, device, args.warmup, args.iters)
        report = handle.report.to_dict()
    finally:
        remove(model)

    a2a_ms = 0.0
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

        a2a_ms = _time(exchanges, device, args.warmup, args.iters) * args.layers
    if rank == 0:
        fallbacks = report["fallbacks"]
        Path(args.worker_out).write_text(json.dumps({
            "world": world, "rows": rows, "a2a_ms": a2a_ms, "recipe": report["recipe"], "backends": report["backends"], "fallbacks": fallbacks,
            "device_name": device_description(device),
        }))
    if world > 1:
        dist.destroy_process_group()


# ---- launcher ----------------------------------------------------------------------------------


def launch(args, world: int, out: Path) -> dict:
    argv = [a for a in sys.argv[1:]]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
           str(Path(__file__).resolve()), *argv, "--worker-out", str(out)]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    rc = subprocess.call(cmd, env=env)
    if rc != 0:
        sys.exit(f"parallel_bench: the {world}-process run failed (exit code {rc})")
    return json.loads(out.read_text())


def markdown(results: list[dict], args) -> str:
    latent = LATENT_TINY if args.tiny else LATENT_720P
    name = "tiny Wan" if args.tiny else "Wan2.1-14B 720p 81f"
    one = next((r for r in results if r["world"] == 1), None)
    lines = [
        f"### parallel_bench: {results[0]['device_name']}, {utc_stamp()}, commit {git_commit()}",
        "",
        f"torch {torch.__version__}; {name} slice of {args.layers} blocks, random weights; latents "
        f"{'x'.join(map(str, latent))}; recipe {results[0].get('recipe', args.recipe)} (asked: {args.recipe}) on every block, rotation {args.rotation} + V/O Hadamard; "
        f"Ulysses over N processes (NVLink multicast off); median of {args.iters} forwards after {args.warmup} "
        "warm-up; vs SDPA = SDPA time / row time at the same N; scaling = the method's 1-GPU time / row time.",
        "",
        "| GPUs | method | ms / forward | vs SDPA | scaling | all-to-all ms | all-to-all share | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        base_name = next(k for k in r["rows"] if k.endswith("SDPA"))
        base = r["rows"][base_name]
        for method, ms in r["rows"].items():
            scaling = f"{one['rows'][method] / ms:.2f}×" if one is not None else "—"
            a2a = r["a2a_ms"] if r["world"] > 1 and method == "rotvid" else None
            a2a_txt = f"{a2a:.1f}" if a2a is not None else "—"
            share = f"{100 * a2a / ms:.1f}%" if a2a is not None else "—"
            note = ""
            if method == "rotvid":
                note = "backend " + (", ".join(sorted(r["backends"])) or "none")
                if r["fallbacks"]:
                    note += f"; FALLBACKS {r['fallbacks']}"
            lines.append(f"| {r['world']} | {method} | {ms:.1f} | {base / ms:.3f}× | {scaling} | {a2a_txt} | {share} "
                         f"| {note} |")
    lines.append("")
    if one is not None:
        s1 = one["rows"][next(k for k in one["rows"] if k.endswith("SDPA"))] / one["rows"]["rotvid"]
        for r in results:
            if r["world"] == 1:
                continue
            scale = one["rows"]["rotvid"] / r["rows"]["rotvid"]
            sn = r["rows"][next(k for k in r["rows"] if k.endswith("SDPA"))] / r["rows"]["rotvid"]
            lines.append(f"{r['world']} GPUs: rotvid {scale:.2f}× its 1-GPU forward"
                         f"{' (bar ≥ 1.8×: ' + ('met' if scale >= 1.8 else 'NOT met') + ')' if r['world'] == 2 else ''}; "
                         f"speedup over SDPA {sn:.3f}× vs {s1:.3f}× on 1 GPU ({100 * (sn / s1 - 1):+.1f}%, bar within "
                         f"5%: {'met' if abs(sn / s1 - 1) <= 0.05 else 'NOT met'}).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str | None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", default="1,2", help="comma-separated world sizes to run (default 1,2)")
    ap.add_argument("--layers", type=int, default=4, help="Wan 14B blocks in the slice (default 4 of 40)")
    ap.add_argument("--recipe", default="auto",
                    help="quantized recipe (default auto: the GPU's recipe, resolved by apply and named in the table)")
    ap.add_argument("--rotation", default="half", help="Q/K rotation (default half)")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "auto"), help="rotvid backend (default cuda)")
    ap.add_argument("--tiny", action="store_true", help="tiny model on CPU processes over gloo: a smoke run")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up forwards per row (default 3; tiny 1)")
    ap.add_argument("--iters", type=int, default=None, help="timed forwards per row (default 10; tiny 2)")
    ap.add_argument("--seed", type=int, default=0)
    add_append_options(ap)
    ap.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)  # set by the launcher on its workers
    args = ap.parse_args(argv)
    try:
        worlds = sorted({int(x) for x in args.gpus.split(",") if x.strip()})
    except ValueError:
        ap.error(f"--gpus: expected comma-separated process counts, got {args.gpus!r}")
    if not worlds or worlds[0] < 1:
        ap.error(f"--gpus: expected positive process counts, got {args.gpus!r}")
    if args.layers < 1:
        ap.error("--layers: expected a positive int")
    if args.warmup is None:
        args.warmup = 1 if args.tiny else 3
    if args.iters is None:
        args.iters = 2 if args.tiny else 10
    if args.worker_out is not None:
        worker(args)
        return None
    if not args.tiny:
        have = torch.cuda.device_count()
        if have < worlds[-1]:
            sys.exit(f"parallel_bench: --gpus {args.gpus} needs {worlds[-1]} CUDA GPUs; this machine has {have} "
                     "(use --tiny for a CPU smoke run)")
    with tempfile.TemporaryDirectory() as tmp:
        results = [launch(args, w, Path(tmp) / f"world{w}.json") for w in worlds]
    md = markdown(results, args)
    print(md)
    append_table(md, args)
    return md


if __name__ == "__main__":
    main()
