"""Measurements of a proxy pipeline: the probe's pass rate on held-out prompts, and attention statistics.

::

    python -m rotvid.pipelines.proxy.measure probe --prompts 48 [--model DIR] [--height 128 --frames 17]
    python -m rotvid.pipelines.proxy.measure attention [--model DIR] [--height 256 --frames 33]

``probe`` generates each held-out prompt (combinations of the grammar no training clip used,
:func:`rotvid.pipelines.proxy.clips.held_out_prompts`; the directional motions, which the probe's
centroid check covers, then all motions) and prints the pass rate; ``attention`` prints a table of
:func:`rotvid.pipelines.proxy.attention_stats.self_attention_statistics` for the trained
transformer beside the same architecture with random weights (seeded), on a noised procedural
clip of a held-out prompt. ``--json FILE`` writes the full results.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from rotvid.pipelines.proxy.build import PROXY_DIR
from rotvid.pipelines.proxy.clips import DIRECTIONS, MOTIONS, held_out_prompts, parse_prompt, render_clips
from rotvid.pipelines.proxy.clips import sample_specs
from rotvid.pipelines.proxy.probe import probe_clip

logger = logging.getLogger("rotvid.proxy.measure")


def probe_pass_rate(pipe, prompts: list[str], *, seed: int = 0, **call) -> dict:
    """Generate every prompt (seed ``seed + i``) and probe it; ``{"passed", "prompts", "rate", "results"}``."""
    results = []
    for i, prompt in enumerate(prompts):
        video = pipe(prompt=prompt, generator=torch.Generator("cpu").manual_seed(seed + i), output_type="np",
                     **call).frames[0]
        results.append(probe_clip(video, prompt).to_dict())
    passed = sum(r["passed"] for r in results)
    return {"passed": passed, "prompts": len(prompts), "rate": passed / len(prompts), "results": results}


def _load(model, device, dtype):
    from rotvid.pipelines.loading import load_pipeline

    pipe = load_pipeline(model, dtype=dtype, device=device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run_probe(args) -> dict:
    pipe = _load(args.model, args.device, args.dtype)
    call = dict(height=args.height, width=args.height, num_frames=args.frames, num_inference_steps=args.steps,
                guidance_scale=args.guidance, max_sequence_length=16)
    out = {}
    for name, motions in (("directional", DIRECTIONS), ("all", tuple(MOTIONS))):
        prompts = held_out_prompts(args.prompts, seed=args.seed, motions=motions)
        t = time.perf_counter()
        res = probe_pass_rate(pipe, prompts, seed=args.seed, **call)
        res["seconds"] = round(time.perf_counter() - t, 1)
        colour = sum(r["colour_ok"] for r in res["results"]) / len(prompts)
        motion = sum(r["motion_ok"] for r in res["results"]) / len(prompts)
        logger.warning(f"probe ({name} motions, {args.height}x{args.height}, {args.frames} frames, {args.steps} steps): "
              f"{res['passed']}/{res['prompts']} pass = {100 * res['rate']:.0f}% (colour {100 * colour:.0f}%, "
              f"motion {100 * motion:.0f}%) in {res['seconds']} s")
        out[name] = res
    return out


def run_attention(args) -> dict:
    from rotvid.pipelines.proxy.attention_stats import self_attention_statistics
    from rotvid.pipelines.proxy.build import build_transformer
    from rotvid.pipelines.proxy.train import encode_prompts

    pipe = _load(args.model, args.device, torch.float32)
    dev = torch.device(args.device)
    prompt = held_out_prompts(1, seed=args.seed, motions=DIRECTIONS)[0]
    c, s, m, b = parse_prompt(prompt)
    spec = next(sp for sp in sample_specs(4000, seed=args.seed, held_out=True)
                if (sp.colour, sp.shape, sp.motion, sp.background) == (c, s, m, b))
    clip = render_clips([spec], frames=args.frames, size=args.height, device=dev)
    with torch.no_grad():
        z = pipe.vae.encode(clip).latent_dist.mode()
        mean = torch.tensor(pipe.vae.config.latents_mean, device=dev).view(1, -1, 1, 1, 1)
        std = torch.tensor(pipe.vae.config.latents_std, device=dev).view(1, -1, 1, 1, 1)
        x0 = (z - mean) / std
        text = encode_prompts(pipe.tokenizer, pipe.text_encoder, [prompt], dev)
    torch.manual_seed(args.seed)
    random_t = build_transformer().to(dev).eval()
    rows = {}
    for sigma in args.sigmas:
        noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(args.seed)).to(dev)
        xt = (1 - sigma) * x0 + sigma * noise
        ts = torch.tensor([sigma * 1000.0], device=dev)
        rows[sigma] = {"trained": self_attention_statistics(pipe.transformer, xt, ts, text),
                       "random": self_attention_statistics(random_t, xt, ts, text)}
    first = rows[args.sigmas[0]]["trained"][0]
    lines = [f"attention statistics, {prompt!r}, {args.height}x{args.height}, {args.frames} frames: "
          f"{first['tokens']} tokens; window ±(1, 2, 2) tokens holds {100 * first['window_share']:.1f}% of keys",
             "| σ | block | entropy / ln N (trained) | (random) | local mass (trained) | (random) | "
          "max prob (trained) | (random) |", "|---|---|---|---|---|---|---|---|"]
    for sigma, r in rows.items():
        for tr, rd in zip(r["trained"], r["random"]):
            lines.append(f"| {sigma} | {tr['block']} | {tr['entropy_ratio']:.3f} | {rd['entropy_ratio']:.3f} | "
                  f"{tr['local_mass']:.3f} | {rd['local_mass']:.3f} | {tr['max_prob']:.3f} | {rd['max_prob']:.3f} |")
    logger.warning("\n".join(lines))
    return {"prompt": prompt, "rows": {str(k): v for k, v in rows.items()}, "table": lines}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description="Measure the proxy model: probe pass rate, attention statistics.")
    p.add_argument("what", choices=("probe", "attention"))
    p.add_argument("--model", default=str(PROXY_DIR), help="pipeline folder (default: the bundled proxy)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--prompts", type=int, default=48)
    p.add_argument("--height", type=int, default=None, help="square size (probe 128, attention 256)")
    p.add_argument("--frames", type=int, default=None, help="frames (probe 17, attention 33)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--guidance", type=float, default=5.0)
    p.add_argument("--sigmas", type=float, nargs="+", default=[0.3, 0.7])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    big = args.what == "attention"
    args.height = args.height or (256 if big else 128)
    args.frames = args.frames or (33 if big else 17)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    result = run_attention(args) if big else run_probe(args)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
