"""What the V/O Hadamard buys, per recipe, on the bundled proxy's own attention inputs.

The proxy (a trained Wan pipeline bundled with rotvid) runs in float32 with rotvid's ``fp16`` recipe and a
calibration observer that keeps the post-RoPE Q, K and V of every self-attention call at a few steps. Each recipe's
reference (the exact model of its kernels) then attends on those tensors with the V/O Hadamard off and on
(:func:`rotvid.rope.hadamard.rotate_v_online` before the call, :func:`~rotvid.rope.hadamard.unrotate_o_online`
after it: the same maths as the fused weights), against float64 attention on the same Q/K/V. The rotation is exact in
full precision, so any difference is what it does to quantization error. Prints mean and worst SQNR (dB) per recipe
and writes them to ``benchmarks/results/vo_hadamard_study.json``.

    python -m benchmarks.vo_hadamard_study [--size 256 --frames 17 --prompts 1 --steps 8 --keep-steps 1,5]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from rotvid.kernels.recipes import attention_reference, get_recipe
from rotvid.pipelines import RotvidConfig, apply, remove
from rotvid.pipelines.loading import load_pipeline
from rotvid.pipelines.proxy.clips import held_out_prompts
from rotvid.rope.hadamard import rotate_v_online, unrotate_o_online, vo_hadamard_block

from benchmarks.provenance import git_commit
from benchmarks.study_io import command_line

RECIPES = ("int8-fp8", "int4", "int4-fp8", "int4-sym-p", "nvfp4")
RESULTS = Path(__file__).resolve().parent / "results" / "vo_hadamard_study.json"


def capture(args) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    pipe = load_pipeline("proxy", dtype="fp32", device="cpu")
    pipe.set_progress_bar_config(disable=True)
    keep = {int(s) for s in args.keep_steps.split(",")}
    calls = []

    def observer(site, step, num_steps, q, k, v, kv_lens, fp16_attention):
        if step in keep:
            calls.append((q.detach().clone(), k.detach().clone(), v.detach().clone()))

    handle = apply(pipe, RotvidConfig(recipe="fp16", rotation="none", backend="reference"))
    handle.runtime.observers.append(observer)
    try:
        for i, prompt in enumerate(held_out_prompts(args.prompts, seed=0)):
            pipe(prompt=prompt, generator=torch.Generator().manual_seed(i), height=args.size, width=args.size,
                 num_frames=args.frames, num_inference_steps=args.steps, guidance_scale=5.0, max_sequence_length=16,
                 output_type="latent")
    finally:
        remove(pipe)
    return calls


def sqnr_db(out: torch.Tensor, truth: torch.Tensor) -> float:
    return float(10 * torch.log10(truth.pow(2).sum() / (out.double() - truth).pow(2).sum()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--frames", type=int, default=17)
    ap.add_argument("--prompts", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--keep-steps", default="1,5")
    ap.add_argument("--recipes", default=",".join(RECIPES))
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    calls = capture(args)
    print(f"{len(calls)} self-attention calls of {tuple(calls[0][0].shape)} (B, H, N, D)", flush=True)
    rows = []
    print("| recipe | V/O Hadamard off: mean (worst) dB | on: mean (worst) dB |")
    print("| --- | --- | --- |")
    for recipe in args.recipes.split(","):
        smooth_q, smooth_v = get_recipe(recipe).smoothing(None, None)
        per = {}
        for mode in ("off", "on"):
            vals = []
            for q, k, v in calls:
                truth = torch.softmax(q.double() @ k.double().transpose(-1, -2) * q.shape[-1] ** -0.5, -1) @ v.double()
                block = vo_hadamard_block(v.shape[-1]) if mode == "on" else 1
                out = attention_reference(q, k, rotate_v_online(v, block), recipe=recipe, layout="BHND",
                                          smooth_q=smooth_q, smooth_v=smooth_v)
                vals.append(sqnr_db(unrotate_o_online(out, block), truth))
            t = torch.tensor(vals)
            per[mode] = (float(t.mean()), float(t.min()))
            rows.append(dict(recipe=recipe, vo_hadamard=mode, sqnr_mean_db=round(per[mode][0], 3),
                             sqnr_worst_db=round(per[mode][1], 3), calls=len(vals)))
        print(f"| {recipe} | {per['off'][0]:.2f} ({per['off'][1]:.2f}) | {per['on'][0]:.2f} ({per['on'][1]:.2f}) |",
              flush=True)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(dict(commit=git_commit(), command=command_line("vo_hadamard_study", None),
                                           shape=list(calls[0][0].shape), rows=rows), indent=1) + "\n")


if __name__ == "__main__":
    main()
