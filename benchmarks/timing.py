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


def kernel_us(fn, iters: int) -> dict[str, float]:
    """GPU microseconds per ``fn()`` of every kernel it launches, by name: torch.profiler's kernel durations over
    ``iters`` calls (no warm-up here), divided by ``iters``. Kernel time only, so a call whose host work overlaps the
    GPU's (as in a pipeline) is counted at what it costs the GPU."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            out[e.name] = out.get(e.name, 0.0) + e.device_time / iters
    return out
