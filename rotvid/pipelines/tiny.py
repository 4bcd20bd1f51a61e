"""Tiny random pipelines of every registered family, built offline (for tests and smoke runs).

Nothing comes from the hub: every component is built from a config with random weights — 2–4
transformer blocks with head_dim 64, a small VAE, a 2-layer text encoder and a word-level tokenizer built in-process
with ``tokenizers`` and wrapped in ``PreTrainedTokenizerFast``
(:mod:`rotvid.pipelines.families.tiny_parts`). Each family's module says how its tiny pipelines are built
(``Family.tiny``: :class:`~rotvid.pipelines.families.base.TinyVariant`); this module builds, saves and calls them.
:func:`build_tiny_pipeline` saves the pipeline with ``save_pretrained`` and loads it back through
:func:`rotvid.pipelines.loading.load_pipeline`, so tests exercise the real loading path.

Tiny pipelines (``TINY_FAMILIES``, in the registry's order): ``wan`` (Wan2.1-style T2V), ``wan2.2`` (two experts,
``transformer`` + ``transformer_2`` with a ``boundary_ratio``), ``wan-i2v`` (Wan2.2-style
image-to-video: ``WanImageToVideoPipeline`` without a CLIP image encoder, one expert; its
transformer reads the noise latents concatenated with the condition — the frame mask and the VAE
latents of the first frame), ``hunyuan_video``, ``cogvideox`` (5B-style, with RoPE) and
``cogvideox-2b`` (no RoPE).

Sizes are chosen so a full denoise of a few steps at 5 frames, 32x32 takes about a second on a
CPU. Suggested call arguments per tiny pipeline are in :func:`tiny_call_kwargs`.

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

from rotvid.pipelines.families import tiny_variant, tiny_variants
from rotvid.pipelines.families.tiny_parts import HEAD_DIM, TEXT_LEN, tiny_tokenizer  # noqa: F401  (public here too)
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


def __getattr__(name: str):
    """``TINY_FAMILIES``: the names of the registered tiny pipelines; ``IMAGE_TO_VIDEO_FAMILIES``: those that take a
    conditioning image (both as of now)."""
    if name == "TINY_FAMILIES":
        return tuple(t.name for _, t in tiny_variants())
    if name == "IMAGE_TO_VIDEO_FAMILIES":
        return tuple(t.name for _, t in tiny_variants() if t.takes_image)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_tiny_components(family: str, *, num_layers: int = 4, seed: int = 0) -> tuple[type, dict]:
    """``(pipeline class, components)`` of a tiny random pipeline of ``family`` (not saved)."""
    _, tiny = tiny_variant(family)
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 2 <= num_layers <= 8:
        raise ValueError(f"num_layers: expected an int in [2, 8], got {num_layers!r}")
    import diffusers

    return getattr(diffusers, tiny.pipeline_class), tiny.components(num_layers, seed)


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
        which also holds :data:`TINY_DEFAULTS_FILE`, the call defaults of a tiny pipeline and, where its class fixes
        sizes in ``__init__``, its ``pipeline_attributes``).
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
    _, tiny = tiny_variant(family)
    if tiny.pipeline_attributes:
        record["pipeline_attributes"] = dict(tiny.pipeline_attributes)
    (directory / TINY_DEFAULTS_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return load_pipeline(directory, dtype=dtype)


def tiny_call_defaults(family: str, *, frames: int = 5, size: int = 32) -> dict:
    """The JSON-serializable call defaults a tiny pipeline of ``family`` needs (see the module doc).

    Text length :data:`TEXT_LEN` (``TinyVariant.max_sequence_length``; the tiny CogVideoX transformer takes exactly
    that many text tokens); ``frames`` frames of ``size`` x ``size`` pixels; then the tiny pipeline's own
    (``TinyVariant.call_defaults``: e.g. HunyuanVideo's ``prompt_template`` without a system prompt, ``crop_start``
    0).
    """
    _, tiny = tiny_variant(family)
    kw: dict = {} if tiny.max_sequence_length is None else {"max_sequence_length": tiny.max_sequence_length}
    kw.update(height=size, width=size, num_frames=frames)
    kw.update(json.loads(json.dumps(dict(tiny.call_defaults))))  # a copy: callers may change theirs
    return kw


def tiny_image(*, size: int = 32, seed: int = 0):
    """A random RGB ``PIL.Image`` of ``size`` x ``size`` (uint8 noise from a seeded CPU generator).

    The conditioning first frame of the image-to-video tiny pipelines in :func:`tiny_call_kwargs`.
    """
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (size, size, 3), generator=g, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy())


def tiny_call_kwargs(family: str, *, steps: int = 3, frames: int = 5, size: int = 32, seed: int = 0) -> dict:
    """Keyword arguments for calling a tiny pipeline of ``family`` (fixed-seed, latent output).

    :func:`tiny_call_defaults` plus a prompt, the step count, a seeded CPU generator, the tiny pipeline's guidance
    settings (``TinyVariant.call_kwargs``) and, for the image-to-video ones, :func:`tiny_image` (seeded with
    ``seed + 1``).
    """
    _, tiny = tiny_variant(family)
    kw = dict(
        tiny_call_defaults(family, frames=frames, size=size),
        prompt="a red cat runs in the forest",
        num_inference_steps=steps,
        generator=torch.Generator().manual_seed(seed),
        output_type="latent",
    )
    kw.update(tiny.call_kwargs)
    if tiny.takes_image:
        kw["image"] = tiny_image(size=size, seed=seed + 1)
    return kw
