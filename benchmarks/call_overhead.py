"""Host time per attention call: what rotvid's own Python costs each call, before any kernel runs.

    python -m benchmarks.call_overhead                      # CPU rows (and the GPU rows on a CUDA machine)
    python -m benchmarks.call_overhead --json-out FILE      # the rows as JSON too

Rows (median µs per call over ``--rounds`` rounds of ``--calls`` calls each, after warm-up):

* ``attention() [null backend]`` -- :func:`rotvid.kernels.attention` through a registered backend that computes
  nothing (returns ``v``): the checks, the recipe's resolution, the backend choice and the run, per recipe;
* ``prepare_attention`` / ``run_attention [null backend]`` -- the two halves as the pipelines call them (prepared
  once per call site, run per call);
* ``processor [...]`` -- a tiny Wan block's self-attention module (2 heads, 8 tokens) without rotvid
  (``diffusers``: its own processor, SDPA), with rotvid applied (``reference``: the recipe computed by the PyTorch
  reference) and with rotvid's reference backend replaced by one that computes nothing (``null backend``: what
  rotvid's processor and runtime cost per call around the attention);
* on a CUDA GPU, ``attention() [cuda]`` and ``run_attention [cuda]`` (a call prepared once, as the pipelines run
  it) against ``kernels only [cuda]`` -- one head of 128 tokens, so that the GPU waits on the host: the wall time per
  call of the public entry point against the extension's pre-processing and attention functions called directly
  (the floor of the same work).

Numbers for decisions (the per-call overhead before and after a change of the dispatch), not a product figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

RECIPES = ("int8-fp8", "int4")


def per_call_us(fn, calls: int, rounds: int, sync=None) -> float:
    """Median over rounds of the wall time per call (µs) of ``calls`` back-to-back calls (``sync`` after each round)."""
    for _ in range(max(calls // 10, 3)):
        fn()
    if sync:
        sync()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if sync:
            sync()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


class NullBackend:
    """A backend that runs every call and computes nothing: the host path alone."""

    name = "null"

    def unsupported_reason(self, q, k, v, **opts):
        return None

    def run(self, q, k, v, **opts):
        return v


def dispatch_rows(args) -> list[dict]:
    from rotvid.kernels import attention, dispatch, prepare_attention, run_attention

    dispatch.register_backend("null", NullBackend())
    try:
        q, k, v = (torch.randn(1, 2, 64, 64) for _ in range(3))
        rows = []
        for recipe in RECIPES:
            us = per_call_us(lambda: attention(q, k, v, recipe=recipe, backend="null"), args.calls, args.rounds)
            rows.append({"row": "attention() [null backend]", "recipe": recipe, "device": "cpu", "us": us})
            us = per_call_us(lambda: prepare_attention(q, k, v, recipe=recipe, backend="null"), args.calls, args.rounds)
            rows.append({"row": "prepare_attention [null backend]", "recipe": recipe, "device": "cpu", "us": us})
            call = prepare_attention(q, k, v, recipe=recipe, backend="null")
            us = per_call_us(lambda: run_attention(call, q, k, v), args.calls, args.rounds)
            rows.append({"row": "run_attention [null backend]", "recipe": recipe, "device": "cpu", "us": us})
        return rows
    finally:
        dispatch._BACKENDS.pop("null", None)


def processor_rows(args) -> list[dict]:
    import tempfile

    from diffusers import WanTransformer3DModel

    from rotvid.pipelines import RotvidConfig, Schedule, apply, remove
    from rotvid.pipelines.tiny import build_tiny_pipeline

    with tempfile.TemporaryDirectory() as folder:
        build_tiny_pipeline("wan", folder, num_layers=2)
        tr = WanTransformer3DModel.from_pretrained(f"{folder}/transformer").eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, tr.config.in_channels, 1, 4, 8, generator=g)  # 1 x 2 x 4 patches: 8 tokens per frame
    text = torch.randn(1, 7, tr.config.text_dim, generator=g)
    hidden = {}
    hook = tr.blocks[0].attn1.register_forward_pre_hook(
        lambda m, a, kw: hidden.update(args=a, kwargs=kw), with_kwargs=True)
    with torch.no_grad():
        tr(hidden_states=x, encoder_hidden_states=text, timestep=torch.tensor([500]), return_dict=False)
    hook.remove()
    attn = tr.blocks[0].attn1

    def call():
        with torch.no_grad():
            attn(*hidden["args"], **hidden["kwargs"])

    from rotvid.kernels import dispatch

    rows = [{"row": "processor [diffusers]", "recipe": "-", "device": "cpu",
             "us": per_call_us(call, args.calls, args.rounds)}]
    for recipe in RECIPES:
        for label, backend in (("reference", None), ("null backend", NullBackend())):
            saved = dispatch._BACKENDS["reference"]
            if backend is not None:  # the runtime's reference calls compute nothing: its host path alone
                dispatch._BACKENDS["reference"] = backend
            handle = apply(tr, RotvidConfig(recipe=recipe, backend="reference", schedule=Schedule()))
            try:
                handle.tracker.begin(1)
                handle.tracker.set_step(0)
                rows.append({"row": f"processor [{label}]", "recipe": recipe, "device": "cpu",
                             "us": per_call_us(call, args.calls, args.rounds)})
            finally:
                remove(tr)
                dispatch._BACKENDS["reference"] = saved
    return rows


def cuda_rows(args) -> list[dict]:
    from rotvid.kernels import attention, prepare_attention, run_attention
    from rotvid.kernels.recipes.int8_fp8.ops import attention_int8fp8_quantized, preprocess_int8fp8_cuda

    q, k, v = (torch.randn(1, 1, 128, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    attention(q, k, v, recipe="int8-fp8", backend="cuda")  # builds / loads the extension

    def direct():
        kq = preprocess_int8fp8_cuda(q, k, v)
        return attention_int8fp8_quantized(kq, n_q=128, n_kv=128, head_dim=128)

    call = prepare_attention(q, k, v, recipe="int8-fp8", backend="cuda")
    sync = torch.cuda.synchronize
    return [
        {"row": "attention() [cuda]", "recipe": "int8-fp8", "device": torch.cuda.get_device_name(),
         "us": per_call_us(lambda: attention(q, k, v, recipe="int8-fp8", backend="cuda"), args.calls, args.rounds, sync)},
        {"row": "run_attention [cuda]", "recipe": "int8-fp8", "device": torch.cuda.get_device_name(),
         "us": per_call_us(lambda: run_attention(call, q, k, v), args.calls, args.rounds, sync)},
        {"row": "kernels only [cuda]", "recipe": "int8-fp8", "device": torch.cuda.get_device_name(),
         "us": per_call_us(direct, args.calls, args.rounds, sync)},
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=300, help="calls per round (default 300)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds; the median is reported (default 5)")
    ap.add_argument("--json-out", type=Path, default=None, help="also write the rows here as JSON")
    args = ap.parse_args(argv)
    if args.calls < 1 or args.rounds < 1:
        ap.error(f"--calls and --rounds: expected positive counts, got {args.calls} and {args.rounds}")
    torch.set_num_threads(1)
    rows = dispatch_rows(args) + processor_rows(args)
    if torch.cuda.is_available():
        rows += cuda_rows(args)
    print(f"torch {torch.__version__}; median of {args.rounds} rounds of {args.calls} calls\n")
    print("| row | recipe | device | µs per call |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['row']} | {r['recipe']} | {r['device']} | {r['us']:.1f} |")
    if args.json_out:
        args.json_out.write_text(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
