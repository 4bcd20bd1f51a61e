"""Timing one call: between a pair of CUDA events on a GPU, by the wall clock on the CPU."""

from __future__ import annotations

import time

import torch


def sync(device: str) -> None:
    """Wait for the GPU's queued work when ``device`` is a CUDA device; nothing on the CPU."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def call_ms(fn, device: str) -> float:
    """Milliseconds of one ``fn()``: on a CUDA device between two events recorded around it (the GPU time, synchronised
    after the call), on the CPU by ``time.perf_counter``."""
    if device.startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3
