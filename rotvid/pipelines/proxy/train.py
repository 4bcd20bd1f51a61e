"""Train the proxy model: the VAE on procedural clips, then the transformer (+ text encoder) by flow matching.

Commands (the ones that made the bundled weights, one H200, two runs: the VAE alone, 1,728 steps in
408 s, then the transformer on it, 6,097 steps in 378 s, 417 s with its latent set; 825 GPU-seconds in all)::

    python -m rotvid.pipelines.proxy.train --out OUT --seed 0 --vae-only
    python -m rotvid.pipelines.proxy.train --out OUT --seed 0 --vae-from OUT/vae --recon-probe 0

(the defaults are that run's settings: VAE batch 24 for 6.8 minutes, transformer 6.3 minutes on 10,000
clips of 128x128 and 600 of 256x256, 15% of its steps at 256x256, text encoder at learning rate 1e-3).
Repeating the step counts without time budgets: ``--vae-steps 1728 --vae-minutes 0`` and
``--dit-steps 6097 --dit-minutes 0``. The VAE passes the probe on 32 of 32 of its reconstructions of
held-out procedural clips; the model on 29 of 32 held-out prompts (``benchmarks/proxy_results.md``).

``benchmarks/proxy_train_and_measure.sh`` runs it and then the measurements.

Stages:

1. **VAE** (``AutoencoderKLWan``): clips of 9 frames at 128x128 rendered on the fly
   (:func:`rotvid.pipelines.proxy.clips.render_clips`), loss L1 + MSE of the reconstruction, each
   pixel weighted by ``1 + --vae-object-weight`` x the shape's coverage
   (:func:`rotvid.pipelines.proxy.clips.object_alpha`), of the posterior mean (``--vae-posterior mode``,
   the default, with a small penalty on the latents' mean square) or of a posterior sample (``sample``,
   with a small KL term: at the start its noise has a standard deviation of about 1, larger than the
   latents' own spread, and the decoder learns to ignore them), AdamW, bf16 autocast. Then the
   **reconstruction probe**: :func:`reconstruction_probe` on ``--recon-probe`` held-out clips.
2. **Latent statistics**: the per-channel mean and standard deviation of the VAE's latents
   (posterior means) become ``latents_mean`` / ``latents_std`` of its config, as Wan's.
3. **Latent set**: ``--clips-128`` clips of 17 frames at 128x128 and ``--clips-256`` of 33 frames
   at 256x256 (training combinations of the grammar only; held-out ones never appear), encoded
   once and kept on the device.
4. **Transformer + text encoder**: rectified flow as Wan: ``x_t = (1 - s) x_0 + s ε`` with
   ``s`` logit-normal, shifted by 3 (the scheduler's ``flow_shift``), target ``ε - x_0``,
   ``timestep = 1000 s``; 10% of prompts are dropped to ``""`` for classifier-free guidance; an
   exponential moving average of the weights is what gets saved. The text encoder's attention is fixed to word
   offsets (:func:`rotvid.pipelines.proxy.build.fix_text_attention`; left free it collapsed to each
   word attending to itself and the model swapped the object's and the background's colours).
5. **Quick probe**: ``--probe-prompts`` held-out prompts generated at 128x128 and checked by
   :func:`rotvid.pipelines.proxy.probe.probe_clip`; the pass rate goes to the log and the record.

Each stage stops at its step count or its time budget (``--vae-minutes`` / ``--dit-minutes``),
whichever comes first; ``training.json`` in the output records the steps actually run, so the run
is repeated exactly (up to GPU non-determinism) with ``--vae-steps N --dit-steps M`` and no time
budget (``--vae-minutes 0 --dit-minutes 0``). The pipeline is written to ``OUT/proxy`` in fp16
(:func:`rotvid.pipelines.proxy.build.save_proxy`); copy that folder to
``rotvid/pipelines/proxy/weights`` to ship it.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from rotvid.pipelines.proxy.build import (
    PROXY_CALL_DEFAULTS, TEXT_LEN, assemble_pipeline, build_text_encoder, build_transformer, build_vae,
    proxy_tokenizer, save_proxy,
)
from rotvid.pipelines.proxy.clips import held_out_prompts, object_alpha, render_clips, sample_specs

logger = logging.getLogger("rotvid.proxy.train")

FLOW_SHIFT = 3.0
PROMPT_DROP = 0.1


def encode_prompts(tokenizer, text_encoder, prompts: list[str], device) -> torch.Tensor:
    """Text embeddings exactly as ``WanPipeline._get_t5_prompt_embeds`` makes them (zeros past each prompt)."""
    enc = tokenizer([" ".join(p.split()) for p in prompts], padding="max_length", max_length=TEXT_LEN,
                    truncation=True, add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
    ids, mask = enc.input_ids.to(device), enc.attention_mask.to(device)
    hidden = text_encoder(ids, mask).last_hidden_state
    return hidden * mask[..., None].to(hidden.dtype)


def _autocast(device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


class _Clock:
    def __init__(self, minutes: float):
        self.start = time.perf_counter()
        self.limit = minutes * 60 if minutes > 0 else math.inf

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.start

    def over(self) -> bool:
        return self.seconds >= self.limit


def train_vae(vae, args, device) -> dict:
    vae.train()
    opt = torch.optim.AdamW(vae.parameters(), lr=args.vae_lr, betas=(0.9, 0.99), weight_decay=0.0)
    clock = _Clock(args.vae_minutes)
    step, losses = 0, []
    while step < args.vae_steps and not clock.over():
        specs = sample_specs(args.vae_batch, seed=args.seed * 1_000_003 + step)
        x = render_clips(specs, frames=args.vae_frames, size=args.vae_size, device=device)
        lr = args.vae_lr * min(1.0, (step + 1) / args.vae_warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        with _autocast(device):
            posterior = vae.encode(x).latent_dist
            z = posterior.sample(generator=None) if args.vae_posterior == "sample" else posterior.mode()
            rec = vae.decode(z).sample
        rec = rec.float()
        if args.vae_posterior == "sample":
            kl = 0.5 * (posterior.mean.float() ** 2 + posterior.var.float() - 1.0 - posterior.logvar.float()).mean()
        else:  # a plain autoencoder: only the latents' size is held in check
            kl = 0.5 * (posterior.mean.float() ** 2).mean()
        err = (rec - x).abs() + (rec - x) ** 2
        if args.vae_object_weight > 0:  # the shape covers a few percent of the pixels: weigh it up
            alpha = object_alpha(specs, frames=args.vae_frames, size=args.vae_size, device=device)
            err = err * (1 + args.vae_object_weight * alpha)
        loss = err.mean() + args.vae_kl * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        step += 1
        if step % args.log_every == 0 or step == 1:
            logger.info("vae step %d loss %.4f (l1+mse) kl %.3f  %.0f s", step, sum(losses[-50:]) / len(losses[-50:]),
                        kl.item(), clock.seconds)
    vae.eval()
    return {"steps": step, "seconds": round(clock.seconds, 1), "final_loss": sum(losses[-50:]) / max(1, len(losses[-50:]))}


@torch.no_grad()
def reconstruction_probe(vae, n: int, *, seed: int, device, size: int = 128, frames: int = 17,
                         batch: int = 8) -> dict:
    """The probe on the VAE's reconstructions (decode of the posterior mean) of ``n`` held-out procedural clips.

    The whole model cannot do better than this: a generated clip is a decode of the VAE. Also returns the
    reconstructions' mean square error (clips in [-1, 1]).
    """
    from rotvid.pipelines.proxy.probe import probe_clip

    specs = sample_specs(n, seed=seed, held_out=True)
    passed, sq = 0, 0.0
    for i in range(0, n, batch):
        part = specs[i:i + batch]
        x = render_clips(part, frames=frames, size=size, device=device)
        with _autocast(device):
            rec = vae.decode(vae.encode(x).latent_dist.mode()).sample.float()
        sq += F.mse_loss(rec, x, reduction="sum").item()
        video = ((rec.permute(0, 2, 3, 4, 1) + 1) / 2).clamp(0, 1).cpu().numpy()
        passed += sum(probe_clip(video[j], spec.prompt).passed for j, spec in enumerate(part))
    mse = sq / (n * 3 * frames * size * size)
    logger.info("reconstruction probe: %d / %d held-out clips pass; reconstruction MSE %.4f", passed, n, mse)
    return {"clips": n, "passed": passed, "rate": passed / n, "mse": mse}


@torch.no_grad()
def _encode(vae, x, device) -> torch.Tensor:
    with _autocast(device):
        return vae.encode(x).latent_dist.mode().float()


@torch.no_grad()
def latent_statistics(vae, args, device) -> tuple[list[float], list[float]]:
    zs = []
    for i in range(4):
        specs = sample_specs(args.stats_clips, seed=args.seed * 7919 + 10_000 + i)
        zs.append(_encode(vae, render_clips(specs, frames=17, size=args.vae_size, device=device), device))
    z = torch.cat(zs).transpose(0, 1).reshape(zs[0].shape[1], -1)
    return z.mean(1).tolist(), z.std(1).clamp_min(1e-3).tolist()


@torch.no_grad()
def latent_set(vae, n: int, frames: int, size: int, seed: int, device, batch: int) -> tuple[torch.Tensor, list[str]]:
    specs = sample_specs(n, seed=seed)
    mean = torch.tensor(vae.config.latents_mean, device=device).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std, device=device).view(1, -1, 1, 1, 1)
    out = []
    for i in range(0, n, batch):
        z = _encode(vae, render_clips(specs[i:i + batch], frames=frames, size=size, device=device), device)
        out.append(((z - mean) / std).to(torch.bfloat16))
    return torch.cat(out), [s.prompt for s in specs]


def train_transformer(transformer, text_encoder, tokenizer, sets, args, device) -> tuple[dict, dict, dict]:
    text_params = [p for p in text_encoder.parameters() if p.requires_grad]  # (its attention pattern is fixed)
    params = list(transformer.parameters()) + text_params
    groups = [{"params": list(transformer.parameters()), "base_lr": args.dit_lr},
              {"params": text_params, "base_lr": args.text_lr}]
    opt = torch.optim.AdamW(groups, lr=args.dit_lr, betas=(0.9, 0.99), weight_decay=0.01)
    ema_t = copy.deepcopy(transformer).eval().requires_grad_(False)
    ema_e = copy.deepcopy(text_encoder).eval().requires_grad_(False)
    transformer.train()
    text_encoder.train()
    rng = random.Random(args.seed + 17)
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 23)
    clock = _Clock(args.dit_minutes)
    step, losses = 0, []
    while step < args.dit_steps and not clock.over():
        key = "256" if ("256" in sets and rng.random() < args.hi_res_share) else "128"
        latents, prompts = sets[key]
        bs = args.dit_batch if key == "128" else max(1, args.dit_batch // 4)
        idx = torch.randint(0, latents.shape[0], (bs,), generator=gen)
        x0 = latents[idx.to(latents.device)].float()
        batch_prompts = ["" if rng.random() < PROMPT_DROP else prompts[i] for i in idx.tolist()]
        u = torch.sigmoid(torch.randn(bs, generator=gen)).to(device)
        sigma = FLOW_SHIFT * u / (1 + (FLOW_SHIFT - 1) * u)
        noise = torch.randn(x0.shape, generator=gen).to(device)
        s = sigma.view(-1, 1, 1, 1, 1)
        xt = (1 - s) * x0 + s * noise
        warm = min(1.0, (step + 1) / 300)
        for g in opt.param_groups:
            g["lr"] = g["base_lr"] * warm
        with _autocast(device):
            text = encode_prompts(tokenizer, text_encoder, batch_prompts, device)
            pred = transformer(hidden_states=xt, timestep=sigma * 1000, encoder_hidden_states=text,
                               return_dict=False)[0]
        loss = F.mse_loss(pred.float(), noise - x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        decay = min(args.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for ema, live in ((ema_t, transformer), (ema_e, text_encoder)):
                for pe, pl in zip(ema.parameters(), live.parameters()):
                    pe.lerp_(pl, 1 - decay)
        losses.append(loss.item())
        step += 1
        if step % args.log_every == 0 or step == 1:
            logger.info("transformer step %d (%s) loss %.4f  %.0f s", step, key,
                        sum(losses[-100:]) / len(losses[-100:]), clock.seconds)
    record = {"steps": step, "seconds": round(clock.seconds, 1),
              "final_loss": sum(losses[-100:]) / max(1, len(losses[-100:]))}
    return record, ema_t, ema_e


def quick_probe(pipe, args, device) -> dict:
    from rotvid.pipelines.proxy.probe import probe_clip

    prompts = held_out_prompts(args.probe_prompts, seed=args.seed + 1,
                               motions=("left", "right", "up", "down"))
    passed = 0
    results = []
    for i, p in enumerate(prompts):
        kw = dict(PROXY_CALL_DEFAULTS, height=args.probe_size, width=args.probe_size, num_frames=args.probe_frames,
                  num_inference_steps=args.probe_steps)
        video = pipe(prompt=p, generator=torch.Generator("cpu").manual_seed(i), output_type="np", **kw).frames[0]
        r = probe_clip(video, p)
        passed += r.passed
        results.append(r.to_dict())
    rate = passed / len(prompts)
    logger.info("quick probe: %d / %d held-out prompts pass (%.0f%%)", passed, len(prompts), 100 * rate)
    return {"prompts": len(prompts), "passed": passed, "rate": rate, "results": results}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Train the rotvid proxy video model (VAE, then transformer).")
    p.add_argument("--out", type=Path, required=True, help="output folder (the pipeline goes to OUT/proxy)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:N")
    p.add_argument("--vae-steps", type=int, default=100_000)
    p.add_argument("--vae-minutes", type=float, default=6.8, help="time budget of the VAE stage (0: none)")
    p.add_argument("--vae-batch", type=int, default=24)
    p.add_argument("--vae-size", type=int, default=128)
    p.add_argument("--vae-frames", type=int, default=9)
    p.add_argument("--vae-lr", type=float, default=1.5e-3)
    p.add_argument("--vae-warmup", type=int, default=100, help="steps of linear learning-rate warm-up")
    p.add_argument("--vae-object-weight", type=float, default=4.0,
                   help="extra loss weight on the shape's pixels (the loss is weighted by 1 + this x coverage)")
    p.add_argument("--recon-probe", type=int, default=32,
                   help="held-out procedural clips (--probe-size, --probe-frames) for the probe on the VAE's "
                        "reconstructions (0: none)")
    p.add_argument("--vae-kl", type=float, default=1e-4,
                   help="weight of the KL term (--vae-posterior sample) or of the latents' mean square (mode)")
    p.add_argument("--vae-posterior", choices=("sample", "mode"), default="mode",
                   help="decode the posterior mean (a plain autoencoder, with a small penalty on the latents' mean "
                        "square) or a sample of the posterior (a VAE with a small KL term: its noise of standard "
                        "deviation ~1 at the start swamps the latents, and the decoder learns to ignore them)")
    p.add_argument("--vae-from", type=Path, default=None,
                   help="skip stage 1: load the VAE from this folder (written by --vae-only), so the VAE and the "
                        "transformer can be trained in two runs")
    p.add_argument("--vae-only", action="store_true", help="stop after stage 1; write the VAE to OUT/vae")
    p.add_argument("--stats-clips", type=int, default=16, help="clips per batch (4 batches) for the latent statistics")
    p.add_argument("--clips-128", type=int, default=10_000, help="17-frame clips of --low-size in the latent set")
    p.add_argument("--low-size", type=int, default=128, help="frame size of the --clips-128 clips")
    p.add_argument("--clips-256", type=int, default=600, help="33-frame 256x256 clips in the latent set")
    p.add_argument("--encode-batch", type=int, default=32)
    p.add_argument("--dit-steps", type=int, default=1_000_000)
    p.add_argument("--dit-minutes", type=float, default=6.3, help="time budget of the transformer stage (0: none)")
    p.add_argument("--dit-batch", type=int, default=32, help="batch at 128x128 (a quarter of it at 256x256)")
    p.add_argument("--dit-lr", type=float, default=3e-4)
    p.add_argument("--text-lr", type=float, default=1e-3, help="learning rate of the text encoder (trained jointly)")
    p.add_argument("--hi-res-share", type=float, default=0.15, help="share of steps on the 256x256 clips")
    p.add_argument("--ema", type=float, default=0.998)
    p.add_argument("--probe-prompts", type=int, default=24)
    p.add_argument("--probe-size", type=int, default=128)
    p.add_argument("--probe-frames", type=int, default=17)
    p.add_argument("--probe-steps", type=int, default=12)
    p.add_argument("--log-every", type=int, default=100)
    args = p.parse_args(argv)
    for name in ("vae_steps", "vae_batch", "vae_warmup", "clips_128", "encode_batch", "dit_steps", "dit_batch",
                 "stats_clips"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')}: expected a positive number, got {getattr(args, name)}")
    for name in ("vae_object_weight", "recon_probe", "probe_prompts"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')}: expected zero or more, got {getattr(args, name)}")
    if (args.vae_frames - 1) % 4 or args.vae_size % 16 or args.low_size % 16 or args.probe_size % 16:
        p.error("--vae-frames must be 4k+1 and --vae-size, --low-size, --probe-size multiples of 16")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    t0 = time.perf_counter()
    if args.vae_from is not None:
        from diffusers import AutoencoderKLWan

        vae = AutoencoderKLWan.from_pretrained(args.vae_from, torch_dtype=torch.float32).to(device).eval()
        vae_record = {"from": str(args.vae_from)}
        logger.info("stage 1: VAE loaded from %s", args.vae_from)
    else:
        vae = build_vae().to(device)
        logger.info("stage 1: VAE (%.2f M parameters) on %s", sum(p.numel() for p in vae.parameters()) / 1e6, device)
        vae_record = train_vae(vae, args, device)
    vae.requires_grad_(False)
    recon = {}
    if args.recon_probe > 0:
        recon["reconstruction_probe"] = reconstruction_probe(vae, args.recon_probe, seed=args.seed + 2, device=device,
                                                             size=args.probe_size, frames=args.probe_frames)
    if args.vae_only:
        vae.save_pretrained(args.out / "vae", safe_serialization=True)
        record = {"seed": args.seed, "vae": vae_record} | recon
        (args.out / "train_record.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        logger.info("wrote %s (VAE only)", args.out / "vae")
        return record
    mean, std = latent_statistics(vae, args, device)
    vae.register_to_config(latents_mean=mean, latents_std=std)
    logger.info("stage 2: latent mean %s std %s", [round(m, 2) for m in mean[:4]], [round(s, 2) for s in std[:4]])
    sets = {"128": latent_set(vae, args.clips_128, 17, args.low_size, args.seed * 31 + 1, device, args.encode_batch)}
    if args.clips_256 > 0:
        sets["256"] = latent_set(vae, args.clips_256, 33, 256, args.seed * 31 + 2, device,
                                 max(1, args.encode_batch // 8))
    logger.info("stage 3: latent set %s in %.0f s", {k: tuple(v[0].shape) for k, v in sets.items()},
                time.perf_counter() - t0)
    transformer, text_encoder, tokenizer = build_transformer().to(device), build_text_encoder().to(device), \
        proxy_tokenizer()
    logger.info("stage 4: transformer (%.2f M) + text encoder (%.2f M)",
                sum(p.numel() for p in transformer.parameters()) / 1e6,
                sum(p.numel() for p in text_encoder.parameters()) / 1e6)
    dit_record, transformer, text_encoder = train_transformer(transformer, text_encoder, tokenizer, sets, args, device)
    del sets
    pipe = assemble_pipeline(vae.float(), transformer.float(), text_encoder.float(), tokenizer)
    pipe.set_progress_bar_config(disable=True)
    record = {"command": "python -m rotvid.pipelines.proxy.train " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
        "seed": args.seed, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "vae": vae_record, **recon, "transformer": dit_record}
    if args.probe_prompts > 0:
        with _autocast(device):
            record["quick_probe"] = quick_probe(pipe, args, device)
    record["total_seconds"] = round(time.perf_counter() - t0, 1)
    out = save_proxy(pipe, args.out / "proxy", training={k: v for k, v in record.items() if k != "quick_probe"} | {
        "quick_probe_rate": record.get("quick_probe", {}).get("rate")})
    (args.out / "train_record.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    logger.info("wrote %s (%.0f s in all)", out, record["total_seconds"])
    return record


if __name__ == "__main__":
    main()
