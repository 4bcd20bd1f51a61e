"""A pipeline folder's own call defaults: the ``rotvid_tiny.json`` that the tiny test pipelines
(:mod:`rotvid.pipelines.tiny`) and the bundled proxy (:mod:`rotvid.pipelines.proxy`) hold beside their weights.

Read by :func:`rotvid.pipelines.loading.load_pipeline` (the pipeline's ``__call__`` takes them as defaults), by
:func:`rotvid.pipelines.pipeline_config.read_pipeline_config` (the size a request without ``--height`` etc. asks for)
and by :func:`rotvid.eval.generation.call_kwargs`. A module of its own, importing nothing of rotvid, so that each of
those can read it without an import circle.

The file may also hold ``pipeline_attributes``: sizes a pipeline class fixes in its ``__init__`` rather than taking
as call arguments (HunyuanVideo 1.5's text lengths and image-token count), which ``load_pipeline`` sets on the loaded
instance so that a tiny pipeline's sequence stays tiny (:func:`read_tiny_pipeline_attributes`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["TINY_DEFAULTS_FILE", "TINY_DEFAULTS_VERSION", "read_tiny_call_defaults", "read_tiny_pipeline_attributes"]

TINY_DEFAULTS_FILE = "rotvid_tiny.json"
TINY_DEFAULTS_VERSION = 1
# arguments a defaults file may not set: they belong to the run (or to rotvid) alone
_RUN_ONLY_ARGS = frozenset(
    {"prompt", "image", "last_image", "generator", "latents", "output_type", "return_dict", "callback_on_step_end",
     "callback_on_step_end_tensor_inputs", "prompt_embeds", "negative_prompt_embeds", "image_embeds"}
)


def _read_record(folder: str | os.PathLike) -> tuple[Path, dict] | None:
    """``(path, the record)`` of ``folder``'s :data:`TINY_DEFAULTS_FILE`, or ``None`` when it has none."""
    path = Path(folder) / TINY_DEFAULTS_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("version") != TINY_DEFAULTS_VERSION:
        got = data.get("version") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{path}: expected a rotvid tiny-pipeline record of version {TINY_DEFAULTS_VERSION}, got {got!r}")
    return path, data


def read_tiny_call_defaults(folder: str | os.PathLike) -> dict | None:
    """``call_defaults`` of ``folder``'s :data:`TINY_DEFAULTS_FILE`, or ``None`` when it has none.

    Raises:
        ValueError: the file is not valid JSON, has another ``version``, its ``call_defaults`` is
            not an object, or it sets an argument that belongs to the run (``prompt``, ``image``,
            ``generator``, ``output_type``, ...).
    """
    record = _read_record(folder)
    if record is None:
        return None
    path, data = record
    defaults = data.get("call_defaults")
    if not isinstance(defaults, dict):
        raise ValueError(f"{path}: call_defaults: expected an object of pipeline call arguments, got {defaults!r}")
    reserved = sorted(set(defaults) & _RUN_ONLY_ARGS)
    if reserved:
        raise ValueError(f"{path}: call_defaults may not set {', '.join(reserved)} (they belong to the run)")
    return defaults


def read_tiny_pipeline_attributes(folder: str | os.PathLike) -> dict:
    """``pipeline_attributes`` of ``folder``'s :data:`TINY_DEFAULTS_FILE` (``{}`` when it has none or no file).

    Raises:
        ValueError: the file cannot be read (as :func:`read_tiny_call_defaults`), or ``pipeline_attributes`` is not an
            object of names to positive ints.
    """
    record = _read_record(folder)
    if record is None:
        return {}
    path, data = record
    attributes = data.get("pipeline_attributes", {})
    if not isinstance(attributes, dict) or not all(
        isinstance(k, str) and k.isidentifier() and not k.startswith("_") and type(v) is int and v > 0
        for k, v in attributes.items()
    ):
        raise ValueError(f"{path}: pipeline_attributes: expected an object of attribute names to positive ints, "
                         f"got {attributes!r}")
    return dict(attributes)
