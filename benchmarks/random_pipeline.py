"""A Wan pipeline of the released 14B architecture with random weights, saved as a local pipeline folder, so the CLI
path (``rotvid generate --model FOLDER``: loading, context parallelism over ``--gpus``, the VAE, the mp4) runs end to
end at full size where no weights can be downloaded.

    python -m benchmarks.random_pipeline --out build/wan14b-random [--layers 40] [--device cuda] [--seed 0]

The folder holds what ``save_pretrained`` writes for a ``WanPipeline``: the transformer of Wan2.1 / 2.2-14B
(:data:`benchmarks.random_wan.WAN_14B`, 40 blocks of 40 heads x 128; bf16, the modules diffusers keeps in float32 cast
as ``from_pretrained`` casts), the Wan VAE at its released configuration (diffusers' ``AutoencoderKLWan`` defaults),
UniPC with the 720p flow shift 5.0, and a text side that keeps the transformer's input width but not UMT5-XXL's
size: a 2-layer UMT5 encoder of width 4096 on rotvid's tiny word-level tokenizer
(:func:`rotvid.pipelines.families.tiny_parts.t5_text_encoder`) -- the text encoder runs once per prompt and is not
what ``--gpus`` spreads. Speed and agreement across GPU counts do not depend on the weights' values; the video is
noise.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from benchmarks.random_wan import WAN_14B, random_wan_transformer


def build_random_wan_pipeline(layers: int, device: str, seed: int):
    """The ``WanPipeline`` described in the module doc (transformer on ``device`` in bf16, the rest on the CPU)."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline
    from transformers import UMT5Config, UMT5EncoderModel

    from rotvid.pipelines.families.tiny_parts import t5_text_encoder

    torch.manual_seed(seed)
    tokenizer, text_encoder = t5_text_encoder(UMT5EncoderModel, UMT5Config, WAN_14B["text_dim"])
    vae = AutoencoderKLWan().eval()
    transformer = random_wan_transformer(dict(WAN_14B, num_layers=layers), device, torch.bfloat16)
    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0)
    return WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=scheduler,
                       transformer=transformer)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the pipeline folder to write (new or empty)")
    ap.add_argument("--layers", type=int, default=40, help="transformer blocks (default 40, the released model's)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="where the transformer's random weights are drawn (default cuda when available)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.layers < 1:
        ap.error(f"--layers: expected a positive number of blocks, got {args.layers}")
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())):
        ap.error(f"--out: expected a new or empty folder, got {str(args.out)!r}")
    t0 = time.perf_counter()
    pipe = build_random_wan_pipeline(args.layers, args.device, args.seed)
    params = sum(p.numel() for p in pipe.transformer.parameters())
    print(f"random_pipeline: transformer {params / 1e9:.2f} B parameters ({args.layers} blocks), built in "
          f"{time.perf_counter() - t0:.0f} s; saving to {args.out}", flush=True)
    t1 = time.perf_counter()
    pipe.save_pretrained(args.out)
    print(f"random_pipeline: saved in {time.perf_counter() - t1:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
