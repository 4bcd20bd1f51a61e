"""Spawning a process group for the context-parallel tests (2 by default, 4 for ring × Ulysses; gloo on CPU, NCCL
on two GPUs -- or on ``ROTVID_TEST_GPUS`` of them, 4 or 8 on a bigger machine: :func:`gpu_world`).

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


GPUS_ENV = "ROTVID_TEST_GPUS"


def gpu_world() -> int:
    """The process count of the NCCL tests: ``ROTVID_TEST_GPUS`` (a power of two >= 2), default 2. The same tests
    run on 4 or 8 GPUs with ``ROTVID_TEST_GPUS=4 pytest -m gpu ...``."""
    raw = os.environ.get(GPUS_ENV, "2")
    if not raw.isdigit() or int(raw) < 2 or int(raw) & (int(raw) - 1):
        raise ValueError(f"{GPUS_ENV}: expected a power of two >= 2 (the GPUs of the NCCL tests), got {raw!r}")
    return int(raw)


def needs_gpus(monkeypatch, world: int) -> None:
    """Skip unless ``world`` CUDA GPUs exist; NVLink multicast off (NCCL, symmetric memory, NVSHMEM)."""
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA GPUs; this machine has {torch.cuda.device_count()}")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    monkeypatch.setenv("NVSHMEM_DISABLE_NVLS", "1")

