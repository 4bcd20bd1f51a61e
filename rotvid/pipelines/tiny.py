"""Tiny random pipelines of every supported family, built offline (for tests and smoke runs).

Nothing comes from the hub: every component is built from a config with random weights — 2–4
transformer blocks with head_dim 64, a small VAE, a 2-layer text encoder (UMT5 for Wan, T5 for
CogVideoX, Llama + CLIP for HunyuanVideo) and a word-level tokenizer built in-process with
``tokenizers`` and wrapped in ``PreTrainedTokenizerFast``. :func:`build_tiny_pipeline` saves the
pipeline with ``save_pretrained`` and loads it back through
:func:`rotvid.pipelines.loading.load_pipeline`, so tests exercise the real loading path.

Families (``TINY_FAMILIES``): ``wan`` (Wan2.1-style T2V), ``wan2.2`` (two experts,
``transformer`` + ``transformer_2`` with a ``boundary_ratio``), ``wan-i2v`` (Wan2.2-style
image-to-video: ``WanImageToVideoPipeline`` without a CLIP image encoder, one expert; its
transformer reads the noise latents concatenated with the condition — the frame mask and the VAE
latents of the first frame), ``hunyuan_video``, ``cogvideox`` (5B-style, with RoPE) and
``cogvideox-2b`` (no RoPE).

Sizes are chosen so a full denoise of a few steps at 5 frames, 32x32 takes about a second on a
CPU. Suggested call arguments per family are in :func:`tiny_call_kwargs`.

Call defaults file
------------------
A tiny pipeline should not be called with its pipeline class's own defaults: HunyuanVideo's
default ``prompt_template`` has a ``crop_start`` (95) counted in the real Llama tokenizer's tokens,
so with the tiny word-level tokenizer the crop is misaligned and template words leak into the
text embedding around the prompt; CogVideoX's default ``max_sequence_length`` (226) exceeds the
16 text tokens the tiny 2B-style transformer's positional embedding covers; and the default sizes (480x832 with 81 frames for Wan,
720x1280 with 129 for HunyuanVideo) take far too long on a CPU. So
:func:`build_tiny_pipeline` also writes :data:`TINY_DEFAULTS_FILE` (``rotvid_tiny.json``) into
the folder::

    {"version": 1, "family": "hunyuan_video", "num_layers": 4, "seed": 0,
     "call_defaults": {"prompt_template": {"template": "{}", "crop_start": 0},
                       "max_sequence_length": 16, "height": 32, "width": 32, "num_frames": 5}}

``rotvid generate`` / ``rotvid eval`` (:func:`rotvid.eval.generation.call_kwargs`) merge
``call_defaults`` under the run's own arguments (``--height`` etc. win) when the pipeline was
loaded from a local folder holding that file. Real checkpoints never have it, so their runs are
unchanged. :func:`read_tiny_call_defaults` reads and checks it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from rotvid.pipelines.folder_defaults import (  # noqa: F401  (public here too; _RUN_ONLY_ARGS: its old home)
    _RUN_ONLY_ARGS, TINY_DEFAULTS_FILE, TINY_DEFAULTS_VERSION, read_tiny_call_defaults,
)

__all__ = [
    "TINY_FAMILIES",
    "TINY_DEFAULTS_FILE",
    "build_tiny_components",
    "build_tiny_pipeline",
    "read_tiny_call_defaults",
    "tiny_call_defaults",
    "tiny_call_kwargs",
    "tiny_image",
    "tiny_tokenizer",
]

TINY_FAMILIES = ("wan", "wan2.2", "wan-i2v", "hunyuan_video", "cogvideox", "cogvideox-2b")
IMAGE_TO_VIDEO_FAMILIES = ("wan-i2v",)

_WORDS = (
    "a the of and in on with to is at by from for over under near "
    "cat dog bird fish horse car boat tree river sea sky sun moon city street forest mountain "
    "red green blue yellow black white small big fast slow bright dark "
    "runs walks flies swims jumps drives sits stands looks turns video camera scene light"
).split()

HEAD_DIM = 64
TEXT_LEN = 16


def tiny_tokenizer(*, specials: dict[str, str], post: str | None = None, model_max_length: int = 512):
    """A word-level ``PreTrainedTokenizerFast`` built in-process.

    Args:
        specials: ``{"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>", ...}``;
            they take the first ids, in order.
        post: ``"eos"`` appends the eos token (T5 style), ``"bos"`` prepends bos (Llama style),
            ``"bos_eos"`` wraps in both (CLIP style), ``None`` adds nothing.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for tok in specials.values():
        vocab.setdefault(tok, len(vocab))
    for w in _WORDS:
        vocab.setdefault(w, len(vocab))
    unk = specials.get("unk_token", next(iter(specials.values())))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unk))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if post is not None:
        bos, eos = specials.get("bos_token"), specials.get("eos_token")
        single = {"eos": f"$A {eos}", "bos": f"{bos} $A", "bos_eos": f"{bos} $A {eos}"}[post]
        used = [t for t in (bos, eos) if t is not None and t in single]
        tok.post_processor = processors.TemplateProcessing(
            single=single, special_tokens=[(t, vocab[t]) for t in used]
        )
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=model_max_length, **specials)


def _vocab_size() -> int:
    return len(_WORDS) + 8


def _t5_text_encoder(model_cls, config_cls, text_dim: int) -> tuple:
    """``(tokenizer, text encoder)`` of the T5 family (``model_cls`` / ``config_cls``: UMT5 for Wan, T5 for
    CogVideoX): a 2-layer encoder of width ``text_dim`` on the tiny vocabulary, its tokenizer appending eos."""
    tokenizer = tiny_tokenizer(specials={"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}, post="eos")
    text_encoder = model_cls(
        config_cls(
            vocab_size=_vocab_size(), d_model=text_dim, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
            relative_attention_num_buckets=8, relative_attention_max_distance=16, pad_token_id=0,
            eos_token_id=1, decoder_start_token_id=0,
        )
    ).eval()
    return tokenizer, text_encoder


def _wan_components(num_layers: int, two_experts: bool, seed: int, image_to_video: bool = False) -> dict:
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(seed)
    text_dim = 32
    tokenizer, text_encoder = _t5_text_encoder(UMT5EncoderModel, UMT5Config, text_dim)
    z_dim = 4
    vae = AutoencoderKLWan(
        base_dim=8, z_dim=z_dim, dim_mult=[1, 1, 1, 1], num_res_blocks=1, temperal_downsample=[False, True, True],
        latents_mean=[0.0] * z_dim, latents_std=[1.0] * z_dim,
    ).eval()

    # Image-to-video (Wan2.2 I2V, no CLIP image encoder): the transformer reads
    # cat([noise latents (z_dim), frame mask (one channel per frame of a temporal VAE group),
    # VAE latents of [image, zeros...] (z_dim)]) along channels — WanImageToVideoPipeline.prepare_latents.
    in_channels = z_dim + vae.config.scale_factor_temporal + z_dim if image_to_video else z_dim

    def transformer():
        return WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=HEAD_DIM, in_channels=in_channels,
            out_channels=z_dim, text_dim=text_dim, freq_dim=32, ffn_dim=64, num_layers=num_layers,
            cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32,
        ).eval()

    scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
    comps = dict(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, scheduler=scheduler, transformer=transformer())
    if image_to_video:
        comps.update(image_encoder=None, image_processor=None)  # Wan2.2-style: no CLIP image embedding
    if two_experts:
        comps["transformer_2"] = transformer()
        comps["boundary_ratio"] = 0.875
    return comps


def _hunyuan_components(num_layers: int, seed: int) -> dict:
    from diffusers import AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoTransformer3DModel
    from transformers import CLIPTextConfig, CLIPTextModel, LlamaConfig, LlamaModel

    torch.manual_seed(seed)
    llama_dim, clip_dim = 32, 32
    tokenizer = tiny_tokenizer(
        specials={"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, post="bos"
    )
    text_encoder = LlamaModel(
        LlamaConfig(
            vocab_size=_vocab_size(), hidden_size=llama_dim, intermediate_size=64, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128, pad_token_id=0,
            bos_token_id=1, eos_token_id=2,
        )
    ).eval()
    tokenizer_2 = tiny_tokenizer(
        specials={"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
        post="bos_eos", model_max_length=77,
    )
    text_encoder_2 = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=_vocab_size(), hidden_size=clip_dim, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=77, projection_dim=clip_dim, pad_token_id=0,
            bos_token_id=1, eos_token_id=2,
        )
    ).eval()
    latent = 4
    vae = AutoencoderKLHunyuanVideo(
        in_channels=3, out_channels=3, latent_channels=latent,
        down_block_types=("HunyuanVideoDownBlock3D",) * 4, up_block_types=("HunyuanVideoUpBlock3D",) * 4,
        block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=4,
        spatial_compression_ratio=8, temporal_compression_ratio=4, mid_block_add_attention=True,
    ).eval()
    n_double = max(1, num_layers // 2)
    transformer = HunyuanVideoTransformer3DModel(
        in_channels=latent, out_channels=latent, num_attention_heads=2, attention_head_dim=HEAD_DIM,
        num_layers=n_double, num_single_layers=num_layers - n_double, num_refiner_layers=1, mlp_ratio=1.0,
        patch_size=1, patch_size_t=1, qk_norm="rms_norm", guidance_embeds=True, text_embed_dim=llama_dim,
        pooled_projection_dim=clip_dim, rope_theta=256.0, rope_axes_dim=(8, 28, 28),
    ).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(shift=7.0)
    return dict(
        tokenizer=tokenizer, text_encoder=text_encoder, tokenizer_2=tokenizer_2, text_encoder_2=text_encoder_2,
        vae=vae, transformer=transformer, scheduler=scheduler,
    )


def _cogvideox_components(num_layers: int, rope: bool, seed: int) -> dict:
    from diffusers import AutoencoderKLCogVideoX, CogVideoXDDIMScheduler, CogVideoXTransformer3DModel
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    text_dim = 32
    tokenizer, text_encoder = _t5_text_encoder(T5EncoderModel, T5Config, text_dim)
    latent = 4
    vae = AutoencoderKLCogVideoX(
        in_channels=3, out_channels=3, latent_channels=latent,
        down_block_types=("CogVideoXDownBlock3D",) * 4, up_block_types=("CogVideoXUpBlock3D",) * 4,
        block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=2, temporal_compression_ratio=4,
        sample_height=32, sample_width=32,
    ).eval()
    transformer = CogVideoXTransformer3DModel(
        num_attention_heads=2, attention_head_dim=HEAD_DIM, in_channels=latent, out_channels=latent,
        time_embed_dim=32, text_embed_dim=text_dim, num_layers=num_layers, sample_width=4, sample_height=4,
        sample_frames=5, patch_size=2, temporal_compression_ratio=4, max_text_seq_length=TEXT_LEN,
        use_rotary_positional_embeddings=rope,
    ).eval()
    scheduler = CogVideoXDDIMScheduler(timestep_spacing="trailing", rescale_betas_zero_snr=True, prediction_type="v_prediction")
    return dict(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer, scheduler=scheduler)


def build_tiny_components(family: str, *, num_layers: int = 4, seed: int = 0) -> tuple[type, dict]:
    """``(pipeline class, components)`` of a tiny random pipeline of ``family`` (not saved)."""
    if family not in TINY_FAMILIES:
        raise ValueError(f"family: expected one of {', '.join(TINY_FAMILIES)}, got {family!r}")
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 2 <= num_layers <= 8:
        raise ValueError(f"num_layers: expected an int in [2, 8], got {num_layers!r}")
    from diffusers import CogVideoXPipeline, HunyuanVideoPipeline, WanImageToVideoPipeline, WanPipeline

    if family in ("wan", "wan2.2"):
        return WanPipeline, _wan_components(num_layers, family == "wan2.2", seed)
    if family == "wan-i2v":
        return WanImageToVideoPipeline, _wan_components(num_layers, False, seed, image_to_video=True)
    if family == "hunyuan_video":
        return HunyuanVideoPipeline, _hunyuan_components(num_layers, seed)
    return CogVideoXPipeline, _cogvideox_components(num_layers, family == "cogvideox", seed)


def build_tiny_pipeline(
    family: str,
    directory: str | os.PathLike | None = None,
    *,
    num_layers: int = 4,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
):
    """Build a tiny random pipeline, ``save_pretrained`` it and load it back with ``load_pipeline``.

    Args:
        family: one of :data:`TINY_FAMILIES`.
        directory: where to save (a new temporary folder when ``None``); must be empty or absent.
        num_layers: self-attention blocks per transformer (HunyuanVideo: split between the
            double- and single-stream stacks).
        seed: torch seed of the random weights.
        dtype: dtype to load with.

    Returns:
        The loaded pipeline (its ``save_path`` attribute is not set; the folder is ``directory``,
        which also holds :data:`TINY_DEFAULTS_FILE`, the call defaults of a tiny pipeline).
    """
    from rotvid.pipelines.loading import load_pipeline

    cls, comps = build_tiny_components(family, num_layers=num_layers, seed=seed)
    pipe = cls(**comps)
    if directory is None:
        directory = tempfile.mkdtemp(prefix=f"rotvid-tiny-{family}-")
    directory = Path(directory)
    if directory.exists() and any(directory.iterdir()):
        raise ValueError(f"directory: expected an empty or new folder, got {str(directory)!r} (not empty)")
    pipe.save_pretrained(directory)
    record = {
        "version": TINY_DEFAULTS_VERSION, "family": family, "num_layers": num_layers, "seed": seed,
        "call_defaults": tiny_call_defaults(family),
    }
    (directory / TINY_DEFAULTS_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return load_pipeline(directory, dtype=dtype)


def tiny_call_defaults(family: str, *, frames: int = 5, size: int = 32) -> dict:
    """The JSON-serializable call defaults a tiny pipeline of ``family`` needs (see the module doc).

    Text length :data:`TEXT_LEN` for every family (the tiny CogVideoX transformer takes exactly
    that many text tokens); HunyuanVideo's ``prompt_template`` without a system prompt
    (``crop_start`` 0); ``frames`` frames of ``size`` x ``size`` pixels.
    """
    if family not in TINY_FAMILIES:
        raise ValueError(f"family: expected one of {', '.join(TINY_FAMILIES)}, got {family!r}")
    kw: dict = {"max_sequence_length": TEXT_LEN, "height": size, "width": size, "num_frames": frames}
    if family == "hunyuan_video":
        kw["prompt_template"] = {"template": "{}", "crop_start": 0}
    return kw


def tiny_image(*, size: int = 32, seed: int = 0):
    """A random RGB ``PIL.Image`` of ``size`` x ``size`` (uint8 noise from a seeded CPU generator).

    The conditioning first frame of the image-to-video families in :func:`tiny_call_kwargs`.
    """
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (size, size, 3), generator=g, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


def tiny_call_kwargs(family: str, *, steps: int = 3, frames: int = 5, size: int = 32, seed: int = 0) -> dict:
    """Keyword arguments for calling a tiny pipeline of ``family`` (fixed-seed, latent output).

    :func:`tiny_call_defaults` plus a prompt, the step count, a seeded CPU generator, guidance
    settings and, for the image-to-video families, :func:`tiny_image` (seeded with ``seed + 1``).
    """
    kw = dict(
        tiny_call_defaults(family, frames=frames, size=size),
        prompt="a red cat runs in the forest",
        num_inference_steps=steps,
        generator=torch.Generator().manual_seed(seed),
        output_type="latent",
    )
    if family in ("wan", "wan2.2", "wan-i2v"):
        kw.update(negative_prompt="dark", guidance_scale=5.0)
        if family in IMAGE_TO_VIDEO_FAMILIES:
            kw["image"] = tiny_image(size=size, seed=seed + 1)
    elif family == "hunyuan_video":
        kw.update(guidance_scale=6.0)
    else:
        kw.update(negative_prompt="dark", guidance_scale=6.0, use_dynamic_cfg=False)
    return kw
