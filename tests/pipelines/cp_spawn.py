"""Spawning a process group for the context-parallel tests (2 by default, 4 for ring × Ulysses; gloo on CPU, NCCL
on two GPUs).

Workers write their results to ``rank{r}.json`` in ``out_dir``; the parent reads them and asserts, so a failure
names the case. A deadline kills the group, so a hang (a collective one rank never reaches) fails the test instead
of blocking CI.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch

WORLD = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join_group(rank: int, world: int, port: int, device_kind: str) -> tuple[str, torch.dtype]:
    """Initialize this worker's process group; returns (device, dtype): cuda:rank + bf16 + NCCL, or cpu + fp32 +
    gloo."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if device_kind == "cuda":
        torch.cuda.set_device(rank)
        device, dtype, pg = f"cuda:{rank}", torch.bfloat16, "nccl"
    else:
        device, dtype, pg = "cpu", torch.float32, "gloo"
    dist.init_process_group(pg, rank=rank, world_size=world, timeout=timedelta(seconds=120))
    return device, dtype


def finish(out_dir: str, rank: int, results: dict) -> None:
    """Write this rank's results, leave together with the other ranks, end without the interpreter's teardown (see
    tests/pipelines/test_context_parallel.py: a rank aborted there in CI under load)."""
    from rotvid.distributed_run import finish_worker

    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    finish_worker()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_group(fn, args: tuple, out_dir: Path, deadline_s: float = 240, world: int = WORLD) -> list[dict]:
    """Run ``fn(rank, world, port, *args)`` on ``world`` spawned processes; kill them and fail past ``deadline_s``."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(fn, args=(world, free_port(), *args), nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + deadline_s
    try:
        while not ctx.join(timeout=2):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                pytest.fail(f"context-parallel workers did not finish within {deadline_s} s (hang?)")
    except mp.ProcessExitedException as e:
        written = [r for r in range(world) if (out_dir / f"rank{r}.json").exists()]
        pytest.fail(f"{e} (results written by ranks {written} of {world})")
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]


def needs_gloo():
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this torch build")


def needs_two_gpus(monkeypatch):
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs two CUDA GPUs; this machine has {torch.cuda.device_count()}")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
