"""The JSON sidecar written next to every generated video (``clip.mp4`` -> ``clip.json``).

Fields (``SIDECAR_VERSION`` 1):

- ``request``: what was asked — model, prompt, negative prompt, image, seed, height, width,
  frames, steps, guidance scale, fps, and the rotvid ``config`` (``null`` for the untouched FP16
  reference). A finished video whose request equals a new one is not generated again (resume).
- ``recipe`` / ``rotation``: the attention variant (``fp16`` / ``none`` for the reference);
  ``recipe`` is the one that ran (``auto`` resolved per GPU), ``recipe_reason`` says why.
- ``sparsity``: the block map of the quantized calls (``none``: dense); ``mean_density`` (kept key blocks / all,
  mean over the calls that ran with a map; ``null`` when none did) and ``mean_dropped_mass`` (top-p's estimate of
  the skipped mass; ``null`` for static maps, which have no estimate, and without a map). ``run_report.sparsity``
  has them per (block, step), with the schedule's sparsity rules. ``mean_kept_mass`` (the true attention mass of
  the kept blocks, mean over query rows and calls) and ``mean_oracle_kept_mass`` (the oracle's at the same per-row
  block counts): measured with ``RotvidConfig(measure_kept_mass=True)`` and for ``oracle`` maps, ``null`` otherwise.
- ``model``: the resolved source, pipeline class and family; ``device``, ``dtype``.
- ``gpus``: the processes that ran it (``rotvid generate --gpus N``: N, one GPU each, or gloo processes on
  CPU; 1 otherwise). With N > 1 ``run_report`` is the ranks' merged report: ``world_size``, ``ranks`` (each
  rank's calls, backends, fallback counts and reasons, redos), ``ranks_agree``
  (:func:`rotvid.distributed_run.merge_run_reports`).
- ``initial_noise_sha256``: hash of the initial latents, identical across variants of one eval.
- ``timing``: ``per_step_seconds`` (one per denoising step; step 0 also holds prompt encoding
  and latent preparation), ``denoise_seconds``, ``decode_seconds``, ``total_seconds``.
- ``quantized_fraction`` (the fraction of self-attention calls that ran the quantized recipe,
  whatever it is; ``int4_fraction``, the same number under its old name, is written beside it for
  one version and read from older sidecars), ``fallbacks`` and ``run_report`` (rotvid's per-call
  counts; ``null`` for the reference), ``versions`` (rotvid, diffusers, torch, transformers, PyAV,
  Python).

The video is written first and its sidecar after it, each through a temporary name and a rename,
so a sidecar always names a video that exists.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rotvid.atomic import write_file_atomically

SIDECAR_VERSION = 1


def sidecar_path(video: str | os.PathLike) -> Path:
    """``x.mp4`` -> ``x.json``."""
    return Path(video).with_suffix(".json")


def write_sidecar(video: str | os.PathLike, data: dict) -> Path:
    """Write the sidecar of ``video`` (atomically); adds ``sidecar_version``."""
    payload = {"sidecar_version": SIDECAR_VERSION, **data}
    return write_file_atomically(sidecar_path(video), json.dumps(payload, indent=2, ensure_ascii=False) + "\n")


def read_sidecar(video: str | os.PathLike) -> dict | None:
    """The sidecar of ``video``, or ``None`` when there is none or it is not a rotvid sidecar."""
    p = sidecar_path(video)
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or "sidecar_version" not in data:
        return None
    return data
