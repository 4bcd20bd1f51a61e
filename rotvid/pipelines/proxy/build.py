"""The proxy model's components: configs, the word-level tokenizer, and the bundled folder.

The proxy is a real diffusers ``WanPipeline`` (Wan2.1-style text-to-video) at reduced size:

* ``AutoencoderKLWan``: base width 32, ``z_dim`` 16, 8x spatial / 4x temporal compression as Wan
  (3.2 M parameters);
* ``WanTransformer3DModel``: 6 blocks, 2 heads of ``head_dim`` 128 (hidden 256, as Wan's head
  size), FFN 1024, patch (1, 2, 2), ``rms_norm_across_heads`` Q/K norm, Wan's 3-D RoPE (7 M);
* ``UMT5EncoderModel``: 2 layers, ``d_model`` 128, trained with the transformer, its attention
  fixed to word offsets (:func:`fix_text_attention`);
* a word-level tokenizer over the prompt grammar's vocabulary
  (:data:`rotvid.pipelines.proxy.clips.VOCABULARY`), built with ``tokenizers`` and saved as
  ``tokenizer.json`` (loaded by ``PreTrainedTokenizerFast``);
* ``UniPCMultistepScheduler`` with flow prediction and ``flow_shift`` 3.0, as Wan at 480p.

The trained weights ship inside the package, in :data:`PROXY_DIR` (fp16 safetensors written by
``save_pretrained``, plus ``rotvid_tiny.json`` with the call defaults of the proxy: 128x128, 17
frames, 16 text tokens, 12 steps, guidance 5, and ``checksums.json``, the SHA-256 of every file).
``rotvid ... --model proxy`` and ``load_pipeline("proxy")`` load that folder with no network.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from rotvid.pipelines.proxy.clips import VOCABULARY

__all__ = [
    "PROXY_DIR",
    "PROXY_NAME",
    "CHECKSUMS_FILE",
    "TEXT_LEN",
    "VAE_CONFIG",
    "TRANSFORMER_CONFIG",
    "TEXT_ENCODER_CONFIG",
    "SCHEDULER_CONFIG",
    "PROXY_CALL_DEFAULTS",
    "proxy_tokenizer",
    "build_vae",
    "build_transformer",
    "build_text_encoder",
    "build_scheduler",
    "assemble_pipeline",
    "save_proxy",
    "file_checksums",
    "verify_proxy",
]

PROXY_NAME = "proxy"
PROXY_DIR = Path(__file__).resolve().parent / "weights"
CHECKSUMS_FILE = "checksums.json"
TEXT_LEN = 16

VAE_CONFIG = dict(base_dim=32, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
                  temperal_downsample=[False, True, True], dropout=0.0)
TRANSFORMER_CONFIG = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=128, in_channels=16,
                          out_channels=16, text_dim=128, freq_dim=256, ffn_dim=1024, num_layers=6,
                          cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
TEXT_ENCODER_CONFIG = dict(d_model=128, d_kv=32, d_ff=256, num_layers=2, num_heads=4,
                           relative_attention_num_buckets=32, relative_attention_max_distance=32,
                           dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
SCHEDULER_CONFIG = dict(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)
PROXY_CALL_DEFAULTS = {"height": 128, "width": 128, "num_frames": 17, "max_sequence_length": TEXT_LEN,
                       "num_inference_steps": 12, "guidance_scale": 5.0}

_SPECIALS = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}


def proxy_tokenizer():
    """Word-level ``PreTrainedTokenizerFast``: ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2, then the grammar's words;
    lower-cases, splits on whitespace and punctuation, appends ``</s>`` (T5 style)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for tok in _SPECIALS.values():
        vocab.setdefault(tok, len(vocab))
    for word in VOCABULARY:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=_SPECIALS["unk_token"]))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", vocab["</s>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=TEXT_LEN, **_SPECIALS)


def build_vae():
    from diffusers import AutoencoderKLWan

    z = VAE_CONFIG["z_dim"]
    return AutoencoderKLWan(**VAE_CONFIG, latents_mean=[0.0] * z, latents_std=[1.0] * z)


def build_transformer():
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(**TRANSFORMER_CONFIG)


def build_text_encoder():
    from transformers import UMT5Config, UMT5EncoderModel

    encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(VOCABULARY) + len(_SPECIALS), **TEXT_ENCODER_CONFIG))
    fix_text_attention(encoder)
    return encoder


# The word offset each text-encoder head attends to (its relative position key - query).
TEXT_HEAD_OFFSETS = (-1, 0, 1, 2)


def fix_text_attention(encoder) -> list[str]:
    """Fix every attention head of the UMT5 ``encoder`` to one word offset; returns the frozen parameters' names.

    With its attention free, the jointly trained text encoder collapsed to each word attending to itself: a
    colour word came out the same as the object's colour and as the background's (cosine 1.0 between "blue" in
    "a blue triangle ... on a green background" and in "a green triangle ... on a blue background"), so the
    transformer saw a bag of colours and swapped them on half the held-out prompts. Here Q and K are zero and
    the relative-position bias is 0 at head h's offset (:data:`TEXT_HEAD_OFFSETS`) and -1e4 elsewhere, so head h
    reads the word at that offset: the encoder is a learned convolution over the words (two layers: a span of
    five words each side), the background's colour word sees "background" next to it and the object's its shape.
    Those parameters are frozen (``requires_grad`` off); the values, outputs and feed-forward layers learn.
    """
    frozen = []
    for name, module in encoder.named_modules():
        if not hasattr(module, "relative_attention_bias"):
            continue
        heads = module.relative_attention_bias.weight.shape[1]
        if heads != len(TEXT_HEAD_OFFSETS):
            raise ValueError(f"text encoder: {heads} heads, expected {len(TEXT_HEAD_OFFSETS)} (TEXT_HEAD_OFFSETS)")
        rel = torch.tensor(TEXT_HEAD_OFFSETS)
        buckets = module._relative_position_bucket(rel)  # (the encoder's own bucketing, as its compute_bias)
        with torch.no_grad():
            module.q.weight.zero_()
            module.k.weight.zero_()
            bias = module.relative_attention_bias.weight
            bias.fill_(-1e4)
            for h, bucket in enumerate(buckets.tolist()):
                bias[bucket, h] = 0.0
        for pname in ("q.weight", "k.weight", "relative_attention_bias.weight"):
            module.get_parameter(pname).requires_grad_(False)
            frozen.append(f"{name}.{pname}")
    return frozen


def build_scheduler():
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(**SCHEDULER_CONFIG)


def assemble_pipeline(vae, transformer, text_encoder, tokenizer=None):
    """A ``WanPipeline`` of the given (trained or random) components."""
    from diffusers import WanPipeline

    return WanPipeline(tokenizer=tokenizer or proxy_tokenizer(), text_encoder=text_encoder, vae=vae,
                       transformer=transformer, scheduler=build_scheduler())


def file_checksums(folder: str | os.PathLike) -> dict[str, str]:
    """SHA-256 of every file under ``folder`` (relative POSIX paths), ``checksums.json`` itself excepted."""
    folder = Path(folder)
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != CHECKSUMS_FILE and "__pycache__" not in p.parts:
            out[p.relative_to(folder).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def save_proxy(pipe, folder: str | os.PathLike, *, training: dict | None = None) -> Path:
    """Write ``pipe`` as the proxy folder: fp16 safetensors, ``rotvid_tiny.json``, ``checksums.json``.

    ``training`` (the training record: seed, steps, losses, time) is written as ``training.json``.
    """
    from rotvid.pipelines.tiny import TINY_DEFAULTS_FILE, TINY_DEFAULTS_VERSION

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    pipe.to(torch.float16)
    pipe.save_pretrained(folder, safe_serialization=True)
    record = {"version": TINY_DEFAULTS_VERSION, "family": "wan", "model": PROXY_NAME,
              "call_defaults": PROXY_CALL_DEFAULTS}
    (folder / TINY_DEFAULTS_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    if training is not None:
        (folder / "training.json").write_text(json.dumps(training, indent=2) + "\n", encoding="utf-8")
    sums = file_checksums(folder)
    (folder / CHECKSUMS_FILE).write_text(json.dumps(sums, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return folder


def verify_proxy(folder: str | os.PathLike = PROXY_DIR) -> dict[str, str]:
    """Check every file of the proxy folder against its ``checksums.json``; return the checksums.

    Raises:
        FileNotFoundError: the folder or its ``checksums.json`` is missing (the package was installed
            without its data files).
        ValueError: a file is missing, extra, or differs from its recorded SHA-256.
    """
    folder = Path(folder)
    path = folder / CHECKSUMS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"the proxy model's {CHECKSUMS_FILE} is missing from {folder} (was rotvid installed "
                                "without its package data?)")
    want = json.loads(path.read_text(encoding="utf-8"))
    got = file_checksums(folder)
    bad = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
    if bad:
        raise ValueError(f"proxy model at {folder}: {len(bad)} file(s) missing, extra or changed: {', '.join(bad[:5])}")
    return got
