"""Running one rotvid command on N processes: ``rotvid generate --gpus N`` / ``rotvid eval --gpus N``.

The command line re-runs itself under ``torch.distributed.run`` (torchrun) with N processes
(:func:`launch`). Each worker (:func:`init_worker`) joins the process group — NCCL with one GPU
per process (``LOCAL_RANK``), gloo on CPUs — loads the pipeline and puts its transformer(s)
under diffusers' Ulysses context parallelism (:func:`parallelize_pipeline`). Every rank runs the
whole denoising loop on its sequence shard; rank 0 alone shows progress and writes the mp4, its
sidecar and reports (:func:`is_main_process`), with the run report of every rank merged into one
(:func:`merge_run_reports`).

From Python, the same is::

    torchrun --nproc-per-node 2 my_script.py   # my_script: init_worker(2, "auto"), load, parallelize, apply
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = [
    "WorkerInfo",
    "check_gpus",
    "in_launched_worker",
    "torchrun_argv",
    "launch",
    "init_worker",
    "is_main_process",
    "barrier",
    "finish_worker",
    "merge_run_reports",
    "world_size",
    "parallelize_pipeline",
    "shutdown_worker",
]

logger = logging.getLogger(__name__)

# set on the workers :func:`launch` starts: the --gpus they were launched for
WORKER_ENV = "ROTVID_GPUS"


@dataclass(frozen=True)
class WorkerInfo:
    rank: int
    world_size: int
    local_rank: int
    device: str  # "cuda" (this process's GPU is the current device) or "cpu"
    backend: str  # "nccl" | "gloo"


def check_gpus(gpus: int, device: str) -> None:
    """Validate ``--gpus`` against ``--device`` and the machine.

    Raises:
        ValueError: not a positive int, or more GPUs than the machine has (CUDA runs).
    """
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ValueError(f"--gpus: expected a positive number of processes, got {gpus!r}")
    if gpus == 1:
        return
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"--device {device}: with --gpus {gpus} use auto, cuda (one GPU per process) or cpu (gloo)")
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return
    have = torch.cuda.device_count()
    if have < gpus:
        raise ValueError(f"--gpus {gpus}: this machine has {have} CUDA GPU(s)")


def in_launched_worker() -> bool:
    """True inside a process :func:`launch` started."""
    return os.environ.get(WORKER_ENV) is not None


def torchrun_argv(gpus: int, cli_args: list[str]) -> list[str]:
    """The torchrun command that runs ``rotvid <cli_args>`` on ``gpus`` local processes."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
            "-m", "rotvid.cli", *cli_args]


def launch(gpus: int, cli_args: list[str]) -> int:
    """Run ``rotvid <cli_args>`` on ``gpus`` processes through torchrun; returns its exit code."""
    env = dict(os.environ, **{WORKER_ENV: str(gpus)})
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // gpus)))
    argv = torchrun_argv(gpus, cli_args)
    logger.info("launching: %s", " ".join(argv))
    return subprocess.call(argv, env=env)


def init_worker(gpus: int, device: str, *, timeout_s: float = 1800) -> WorkerInfo:
    """Join the process group of a torchrun-launched worker (env ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``).

    ``device``: ``auto`` (CUDA when available), ``cuda`` or ``cpu``. With CUDA, the process's
    GPU (``LOCAL_RANK``) becomes the current device and the backend is NCCL; else gloo.

    Raises:
        ValueError: not launched by torchrun, or a world size other than ``gpus``.
    """
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        raise ValueError(f"--gpus {gpus}: not running under torchrun (no WORLD_SIZE / RANK in the environment)")
    world = int(os.environ["WORLD_SIZE"])
    if world != gpus:
        raise ValueError(f"--gpus {gpus}: torchrun started {world} processes")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(local_rank)
    backend = "nccl" if use_cuda else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return WorkerInfo(dist.get_rank(), world, local_rank, "cuda" if use_cuda else "cpu", backend)


def is_main_process() -> bool:
    """Rank 0, or a single process (the one that shows progress and writes files)."""
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def barrier() -> None:
    """``dist.barrier()`` in a multi-process run; nothing in a single process."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


# what :func:`merge_run_reports` keeps of every rank's report, always (the sidecar's record of each rank)
RANK_SUMMARY_KEYS = ("total_calls", "quantized_calls", "fallback_calls", "backends", "fallbacks", "redos")


def world_size() -> int:
    """The number of processes of this run (1 without an initialized process group)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def merge_run_reports(report: dict | None) -> dict | None:
    """One run report from every rank's, on every rank (a collective: call it on all ranks).

    Each rank's report is gathered (``all_gather_object``; rank 0 writes the files). Every rank runs every
    self-attention call (on its H/P heads), so a call is counted once: the merged report is rank 0's, with

    * ``world_size``: the number of processes (GPUs) that ran it;
    * ``ranks``: one summary per rank, in rank order -- ``rank`` and its :data:`RANK_SUMMARY_KEYS` (calls,
      quantized / fallback counts, backends, fallback reasons, redos): which kernel ran on which GPU, and any
      fallback on one rank only, are in the sidecar;
    * ``ranks_agree``: whether every rank's whole report equals rank 0's; when not, ``per_rank`` keeps them all.

    Single process: ``report`` unchanged.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return report
    world = dist.get_world_size()
    reports: list = [None] * world
    dist.all_gather_object(reports, report)
    if reports[0] is None:
        return None
    merged = dict(reports[0])
    merged["world_size"] = world
    merged["ranks"] = [
        {"rank": r, **({key: rep.get(key) for key in RANK_SUMMARY_KEYS} if rep is not None else {"report": None})}
        for r, rep in enumerate(reports)
    ]
    differing = [r for r, rep in enumerate(reports) if rep != reports[0]]
    merged["ranks_agree"] = not differing
    if differing:
        logger.warning("rotvid: the run reports of ranks %s differ from rank 0's; all are in per_rank", differing)
        merged["per_rank"] = reports
    return merged


def parallelize_pipeline(pipe, world_size: int) -> None:
    """Put every transformer of ``pipe`` under context parallelism over ``world_size`` ranks: Ulysses over the
    largest degree that divides its heads, ring attention over the rest
    (:func:`~rotvid.pipelines.context_parallel.split_degrees`: 40 heads on 8 GPUs: Ulysses 8; 12 on 8: Ulysses 4 ×
    ring 2; 40 on 3: ring 3).

    Raises:
        ValueError: a family without a diffusers ``_cp_plan`` (``Family.context_parallel`` False).
    """
    from rotvid.pipelines.attach import find_transformers
    from rotvid.pipelines.context_parallel import enable_context_parallel, split_degrees
    from rotvid.pipelines.model_table import FAMILIES

    family, transformers = find_transformers(pipe)
    if not family.context_parallel:
        supported = ", ".join(name for name, fam in FAMILIES.items() if fam.context_parallel)
        raise ValueError(f"--gpus {world_size}: diffusers 0.42.1 ships no context-parallel plan (_cp_plan) for "
                         f"{family.name}; multi-GPU runs support {supported} only")
    for name, transformer in transformers.items():
        ulysses, ring = split_degrees(int(transformer.config.num_attention_heads), world_size)
        if ring > 1:
            logger.info("rotvid: %s has %d heads: %d processes run Ulysses %d x ring %d", name,
                        transformer.config.num_attention_heads, world_size, ulysses, ring)
        enable_context_parallel(transformer, ulysses, ring)


def finish_worker() -> None:
    """End a worker's run normally: wait for every rank (rank 0 may still be writing what it alone writes), then
    leave the process group. A rank that tore its gloo group down while rank 0 still worked was seen to abort
    ("terminate called without an active exception", CI under load). An error exit leaves without waiting
    (:func:`shutdown_worker`, at exit)."""
    barrier()
    shutdown_worker()


def shutdown_worker() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
