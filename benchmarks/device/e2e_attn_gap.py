"""Device helper: why the int8-fp8 attention kernel runs slower inside a compiled forward than in kernel_bench.

At the Wan 14B 720p slice the kernel took 145 ms per call in the e2e profile (e2e_profile.py) against
135 ms in kernel_bench on random inputs. This script separates the two suspects:

* data: it runs one eager forward of the slice with rotvid applied, captures the pre-processing op's
  inputs of the first self-attention call (after the model's norms; RoPE·R still to be applied inside the
  op), and times the kernel on those operands against operands pre-processed the same way from
  ``randn`` inputs of the same shape;
* GPU state: each is timed back to back (``--burst`` calls, one event pair) and isolated (a sleep and a
  sync before each call, an event pair per call: ``sustained_power.isolated_ms``), while ``nvidia-smi``
  samples the SM clock and power (``sustained_power.Sampler``).

It also counts, on sampled query rows of both inputs, how often the kernel's lazy running max moves
(a block max above the running max by more than 8 in log2 units), and prints the score spread.

    python3 benchmarks/device/e2e_attn_gap.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from e2e_bench import build, make_setup  # noqa: E402
from sustained_power import Sampler, isolated_ms  # noqa: E402

from rotvid.kernels import cuda_backend as cb  # noqa: E402
from rotvid.pipelines import RotvidConfig, apply, remove  # noqa: E402

LOG2E = 1.4426950408889634


def capture(setup) -> tuple[tuple, tuple]:
    """(pre-processing op args, attention op args) of the forward's first self-attention call."""
    model, inputs = build(setup, 0)
    seen: dict[str, tuple] = {}
    pre_op, attn_op = cb._int8fp8_preprocess_op, cb._int8fp8_attention_op

    def pre(*args):
        seen.setdefault("pre", args)
        return pre_op(*args)

    def attn(*args):
        seen.setdefault("attn", args)
        return attn_op(*args)

    cb._int8fp8_preprocess_op, cb._int8fp8_attention_op = pre, attn
    handle = apply(model, RotvidConfig(recipe="int8-fp8", rotation="half", schedule="none"))
    try:
        handle.tracker.begin(50)
        handle.tracker.set_step(25)
        with torch.inference_mode():
            model(**inputs)
    finally:
        cb._int8fp8_preprocess_op, cb._int8fp8_attention_op = pre_op, attn_op
        remove(model)
    del model
    torch.cuda.empty_cache()
    if "pre" not in seen or "attn" not in seen:
        raise SystemExit(f"captured {sorted(seen)}: the forward did not reach the CUDA int8-fp8 ops")
    return seen["pre"], seen["attn"]


def attn_args_from(pre_args: tuple, attn_args: tuple, q, k, v) -> tuple:
    """The attention op's args on operands pre-processed from (q, k, v) with the captured call's flags."""
    qkv = cb._int8fp8_preprocess_op(q, k, v, *pre_args[3:])
    return tuple(qkv) + tuple(attn_args[7:])


def time_burst(args: tuple, burst: int) -> float:
    with torch.inference_mode():
        cb._int8fp8_attention_op(*args)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(burst):
            cb._int8fp8_attention_op(*args)
        end.record()
        torch.cuda.synchronize()
    return start.elapsed_time(end) / burst


def score_stats(q: torch.Tensor, k: torch.Tensor, rows: int, block: int = 128) -> str:
    """Lazy-max moves per row and score spread on ``rows`` query rows of head 0 (BNHD bf16 inputs, before
    RoPE, K mean removed as K smoothing does)."""
    qh = q[0, :, 0].float()
    kh = k[0, :, 0].float()
    kh = kh - kh.mean(0, keepdim=True)
    idx = torch.randperm(qh.shape[0], device=qh.device)[:rows]
    s = (qh[idx] @ kh.T) * (qh.shape[-1] ** -0.5 * LOG2E)
    n = s.shape[1] // block * block
    bmax = s[:, :n].reshape(rows, -1, block).amax(-1)
    m_run = bmax[:, 0].clone()
    moves = torch.zeros(rows, device=s.device)
    for b in range(1, bmax.shape[1]):
        jump = bmax[:, b] > m_run + 8
        moves += jump
        m_run = torch.where(jump, torch.maximum(m_run, bmax[:, b]), m_run)
    spread = (s.amax(1) - s.mean(1)).mean().item()
    return (f"moves/row mean {moves.mean().item():.3f} max {moves.max().item():.0f}; score std {s.std().item():.2f}, "
            f"row max - row mean {spread:.2f} (log2 units)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setup", default="wan14b-720p-slice")
    ap.add_argument("--slice-layers", type=int, default=1)
    ap.add_argument("--burst", type=int, default=8)
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--sleep", type=float, default=0.5)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    setup = make_setup(args.setup, 50, args.slice_layers)
    pre_args, attn_args = capture(setup)
    q, k, v = pre_args[:3]
    print(f"captured q {tuple(q.shape)} {q.dtype} bnhd={pre_args[4]} smooth_k={pre_args[5]} smooth_v={pre_args[6]} "
          f"rope={'yes' if pre_args[7] is not None else 'no'}; attention path {attn_args[-2]} split_tail "
          f"{attn_args[-1]}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        tf = t.float()
        print(f"  {name}: std {tf.std().item():.3f}, |mean over tokens| {tf.mean(1).abs().mean().item():.3f}, "
              f"absmax {tf.abs().max().item():.2f}")
    g = torch.Generator(device=q.device).manual_seed(1)
    rq, rk, rv = (torch.randn(q.shape, generator=g, device=q.device, dtype=q.dtype) for _ in range(3))
    sets = {
        "captured (e2e) operands": attn_args_from(pre_args, attn_args, q, k, v),
        "randn operands": attn_args_from(pre_args, attn_args, rq, rk, rv),
        "captured q, randn k, v": attn_args_from(pre_args, attn_args, q, rk, rv),
        "randn q, captured k, v": attn_args_from(pre_args, attn_args, rq, k, v),
    }
    print(f"captured: {score_stats(q, k, args.rows)}")
    print(f"randn:    {score_stats(rq, rk, args.rows)}")
    sampler = Sampler()
    print("\n| operands | round | back to back, ms/call | isolated, ms/call |\n| --- | --- | --- | --- |")
    for rnd in range(args.rounds):
        for name, a in sets.items():
            b2b = time_burst(a, args.burst)
            with torch.inference_mode():
                iso = isolated_ms(lambda a=a: cb._int8fp8_attention_op(*a), args.calls, args.sleep)
            print(f"| {name} | {rnd} | {b2b:.2f} | {iso:.2f} |", flush=True)
    samples = sampler.stop()
    clocks = [smp[1] for smp in samples]
    power = [smp[2] for smp in samples]
    if clocks:
        print(f"\nnvidia-smi over the timing ({len(clocks)} samples): SM clock min {min(clocks):.0f} / median "
              f"{statistics.median(clocks):.0f} / max {max(clocks):.0f} MHz; "
              f"power median {statistics.median(power):.0f}"
              f" / max {max(power):.0f} W")


if __name__ == "__main__":
    main()
