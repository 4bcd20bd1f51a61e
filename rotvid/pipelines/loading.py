"""``load_pipeline``: a diffusers video pipeline from a friendly name, a hub id or a local folder."""

from __future__ import annotations

import functools
import inspect
import logging
import os
from pathlib import Path

import torch

from rotvid.pipelines.model_table import DEFAULT_MODEL, FAMILIES, MODELS

__all__ = ["load_pipeline", "resolve_model", "DTYPES"]

logger = logging.getLogger(__name__)

DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
}


def resolve_model(model: str | os.PathLike | None) -> tuple[str, bool]:
    """``(path or repo id, is_local)`` for a friendly name, hub id or folder (None: the default).

    Friendly names (case-insensitive) are the keys of :data:`rotvid.pipelines.model_table.MODELS`,
    e.g. ``wan2.1-t2v-1.3b`` -> ``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``; ``proxy`` -> the folder of the
    model bundled in the package (local).
    """
    if model is None:
        model = DEFAULT_MODEL
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if not isinstance(model, str) or not model:
        raise ValueError(f"model: expected a friendly name, a hub id or a folder, got {model!r}")
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "model_index.json").is_file():
            raise ValueError(f"model: folder {str(path)!r} has no model_index.json (not a diffusers pipeline)")
        return str(path), True
    entry = MODELS.get(model.lower())
    if entry is not None:
        if entry.bundled and not (Path(entry.repo_id) / "model_index.json").is_file():
            raise FileNotFoundError(f"model: the bundled {entry.name!r} model is missing from {entry.repo_id} "
                                    "(was rotvid installed without its package data?)")
        return entry.repo_id, entry.bundled
    if model.count("/") == 1 and not model.startswith((".", "/", "~")):
        return model, False
    raise ValueError(
        f"model: {model!r} is not a folder, a hub id (owner/name) or a known name "
        f"({', '.join(sorted(MODELS))})"
    )


def _dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"dtype: expected bfloat16, float16 or float32, got {dtype}")
        return dtype
    if isinstance(dtype, str) and dtype.lower() in DTYPES:
        return DTYPES[dtype.lower()]
    raise ValueError(f"dtype: expected a torch dtype or one of {', '.join(DTYPES)}, got {dtype!r}")


def _family_from_index(source: str, is_local: bool) -> str | None:
    """The family of a local folder's transformer (from model_index.json), or of a known repo id."""
    if is_local:
        import json

        index = json.loads((Path(source) / "model_index.json").read_text())
        cls = (index.get("transformer") or index.get("transformer_2") or [None, None])[1]
        for fam in FAMILIES.values():
            if cls in fam.transformer_classes:
                return fam.name
        return None
    for entry in MODELS.values():
        if entry.repo_id == source:
            return entry.family
    return None


def load_pipeline(
    model: str | os.PathLike | None = None,
    *,
    dtype: torch.dtype | str = torch.bfloat16,
    device: str | torch.device | None = None,
    local_files_only: bool | None = None,
):
    """Load a supported video pipeline through ``diffusers.DiffusionPipeline.from_pretrained``.

    Args:
        model: a friendly name (``wan2.1-t2v-1.3b``, ``wan2.2-t2v-a14b``, ``wan2.2-ti2v-5b``,
            ``hunyuanvideo-t2v``, ``cogvideox-2b``, ``cogvideox-5b``, ...; see ``MODELS``; ``proxy`` is
            the small model bundled with rotvid, loaded from the package offline), a hub id, or a local
            folder written by ``save_pretrained``. Default: Wan2.1-T2V-1.3B.
        dtype: dtype of the pipeline's modules (``bf16`` | ``fp16`` | ``fp32`` or a torch dtype).
            Components the family keeps in float32 (Wan's VAE) stay float32.
        device: where to move the pipeline (``None``: leave it on the CPU).
        local_files_only: never touch the network. Default: True for a local folder, else the
            ``HF_HUB_OFFLINE`` setting (diffusers' default).

    Returns:
        The pipeline (``WanPipeline``, ``WanImageToVideoPipeline``, ``HunyuanVideoPipeline``,
        ``CogVideoXPipeline``, ...), its transformer(s) checked against the family table. A folder with its own
        call defaults (``rotvid_tiny.json``: the bundled ``proxy``, the tiny test pipelines) gives a pipeline whose
        ``__call__`` defaults are those (``pipe(prompt=...)`` runs the proxy at 128×128, 17 frames, 12 steps, not
        WanPipeline's 480×832, 81 frames, 50 steps); they are in ``pipe.rotvid_call_defaults``. Its
        ``pipeline_attributes`` (sizes a class fixes in ``__init__``) are set on the instance.

    Raises:
        ValueError: bad argument, or a pipeline whose transformer rotvid does not support.
        HubUnreachableError (an ``OSError``): a hub model neither in the cache nor reachable; the
            message says what to do (a local folder, ``proxy``, or ``HF_HUB_OFFLINE=1`` with the cache).
    """
    from diffusers import DiffusionPipeline

    from rotvid.pipelines.attach import find_transformers

    source, is_local = resolve_model(model)
    torch_dtype = _dtype(dtype)
    if local_files_only is None:
        local_files_only = True if is_local else None
    fam_name = _family_from_index(source, is_local)
    dtypes = {"default": torch_dtype}
    if fam_name is not None:
        dtypes.update({name: torch.float32 for name in FAMILIES[fam_name].float32_components})
    kwargs = {"dtype": dtypes}
    if local_files_only is not None:
        kwargs["local_files_only"] = bool(local_files_only)
    logger.info("loading %s (%s, %s)", source, "local" if is_local else "hub", torch_dtype)
    try:
        pipe = DiffusionPipeline.from_pretrained(source, **kwargs)
    except OSError as exc:
        if is_local:
            raise
        from rotvid.pipelines.hub import HubUnreachableError, hub_unreachable_message

        raise HubUnreachableError(hub_unreachable_message(str(model), source, exc)) from exc
    find_transformers(pipe)
    if is_local:
        from rotvid.pipelines.folder_defaults import read_tiny_call_defaults, read_tiny_pipeline_attributes

        defaults = read_tiny_call_defaults(source)
        if defaults:
            _set_call_defaults(pipe, defaults)
        _set_pipeline_attributes(pipe, read_tiny_pipeline_attributes(source), source)
    if device is not None:
        pipe.to(device)
    return pipe


def _class_with_defaults(cls: type, given: dict) -> type:
    """A subclass of the pipeline class ``cls`` (same name: diffusers records ``_class_name`` from it) whose
    ``__call__`` takes ``given`` for the arguments the caller leaves out; its signature shows them
    (``inspect.signature(pipe.__call__)``)."""
    base_call = cls.__call__
    signature = inspect.signature(base_call)
    signature = signature.replace(parameters=[
        p.replace(default=given[p.name]) if p.name in given else p for p in signature.parameters.values()
    ])

    @functools.wraps(base_call)
    def __call__(self, *args, **kwargs):
        passed = signature.bind_partial(self, *args, **kwargs).arguments
        for name, value in given.items():
            if name not in passed:
                kwargs[name] = value
        return base_call(self, *args, **kwargs)

    __call__.__signature__ = signature
    return type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})


def _set_call_defaults(pipe, defaults: dict) -> None:
    """Give ``pipe`` (one instance) the call defaults of its folder (arguments its ``__call__`` takes only)."""
    params = inspect.signature(type(pipe).__call__).parameters
    usable = {k: v for k, v in defaults.items() if k in params}
    pipe.__class__ = _class_with_defaults(type(pipe), usable)
    pipe.rotvid_call_defaults = dict(usable)


def _set_pipeline_attributes(pipe, attributes: dict, source: str) -> None:
    """Set the sizes the folder's ``rotvid_tiny.json`` fixes (``pipeline_attributes``) on ``pipe``: attributes its
    class's ``__init__`` set to ints (ValueError for any other)."""
    for name, value in attributes.items():
        if type(getattr(pipe, name, None)) is not int:
            raise ValueError(f"{source}: rotvid_tiny.json: pipeline_attributes: {type(pipe).__name__} has no int "
                             f"attribute {name!r}")
        setattr(pipe, name, value)
