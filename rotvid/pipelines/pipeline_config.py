"""What a pipeline's config files say about the calls it takes, read before any weight loads.

A diffusers pipeline folder (or hub repo) holds small JSON files next to its weights:
``model_index.json`` (the pipeline class and its components), ``vae/config.json`` and
``transformer/config.json``. They are enough to check a request before a multi-GB load:

* the pipeline class's ``__call__`` signature: whether it takes a conditioning ``image``
  (image-to-video) and which arguments it takes at all;
* the height/width multiple: diffusers' own ``check_inputs`` (the family's ``check_inputs_multiple``: 16 for Wan,
  8 for CogVideoX, diffusers 0.42.1) and the VAE's spatial factor times the transformer's patch size
  (Wan silently rounds a size down to that multiple, CogVideoX truncates its patch grid);
* the frame rule: the VAE compresses ``4k + 1`` frames into ``k + 1`` latent frames (its temporal
  factor is 4 in every released checkpoint), so another count is silently changed (Wan rounds
  ``--frames 6`` to 5; HunyuanVideo and CogVideoX decode fewer frames). CogVideoX 1.5
  (``patch_size_t``) also needs a latent frame count divisible by ``patch_size_t``.

Which config keys hold the VAE's factors is a fact of the family (:attr:`Family.video_factors
<rotvid.pipelines.families.base.Family.video_factors>`), as is the RoPE table's position limit.

Only those files are fetched for a hub id (through the Hugging Face cache); no weights.

The same facts of a pipeline once loaded sit at the end: its family and task (:func:`pipeline_family_and_task`), its
device (:func:`pipeline_device`), and the paper's schedule preset for a model (:func:`default_schedule`: from the
model table or the config files before loading, from the loaded pipeline otherwise).
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from rotvid.pipelines.hub import HubUnreachableError, hub_unreachable_message
from rotvid.pipelines.families import family_of_transformer_class

__all__ = [
    "PipelineConfig", "read_pipeline_config", "HubUnreachableError", "hub_unreachable_message",
    "accepts_image", "default_schedule", "pipeline_device", "pipeline_family_and_task",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PipelineConfig:
    """The facts of a pipeline read from its config files.

    Attributes:
        source: the folder or repo id the files came from.
        pipeline_class: ``_class_name`` of ``model_index.json`` (``WanPipeline``, ...).
        family: the rotvid family of its transformer (``None``: not one rotvid knows).
        call_parameters: the arguments of the pipeline class's ``__call__`` (empty when diffusers
            has no class of that name).
        size_multiple: height and width must be multiples of this (``None``: unknown).
        temporal_factor: the VAE's temporal compression (frames must be ``k·t + 1``; ``None``: unknown).
        latent_frames_multiple: the latent frame count must be a multiple of this (CogVideoX 1.5's
            ``patch_size_t``; 1 otherwise).
        call_defaults: the defaults of the call's size arguments (``height``, ``width``, ``num_frames``,
            ``num_inference_steps``, ``max_sequence_length``): the pipeline class's, under those of a local
            folder's ``rotvid_tiny.json`` (the bundled proxy, the tiny test pipelines).
        spatial_factor / patch_hw / patch_t: the VAE's spatial compression and the transformer's patch (the
            token grid of a size: ``frames' × (height / (spatial·patch_hw)) × (width / ...)``).
        rope_max_positions: the positions per axis the transformer's RoPE table holds (Wan's
            ``rope_max_seq_len``; ``None``: no such limit known).
        inner_dim: heads × head_dim of the transformer (``None``: unknown).
        text_encoder_class: the class of ``text_encoder`` (``UMT5EncoderModel``, ``LlamaModel``, ...).
        text_max_positions: the text encoder's ``max_position_embeddings`` (``None`` for T5-style relative
            positions, which have no limit but cost ``L²`` memory).
        text_heads: the text encoder's attention heads (``num_heads`` / ``num_attention_heads``; ``None``: unknown).
    """

    source: str
    pipeline_class: str
    family: str | None
    call_parameters: tuple[str, ...]
    size_multiple: int | None
    temporal_factor: int | None
    latent_frames_multiple: int = 1
    call_defaults: dict = field(default_factory=dict, compare=False)
    spatial_factor: int | None = None
    patch_hw: int = 1
    patch_t: int = 1
    rope_max_positions: int | None = None
    inner_dim: int | None = None
    text_encoder_class: str | None = None
    text_max_positions: int | None = None
    text_heads: int | None = None

    @property
    def takes_image(self) -> bool:
        """Whether the pipeline is image-to-video (its ``__call__`` takes ``image``)."""
        return "image" in self.call_parameters


def _check_hub_resolves(model: str, repo_id: str) -> None:
    """Fail at once when the hub's host name does not resolve (no network): huggingface_hub would retry
    for about a minute first. Skipped behind a proxy (the proxy resolves names) and in offline mode."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                                                                   "all_proxy", "HTTP_PROXY", "http_proxy")):
        return
    host = urlparse(constants.ENDPOINT).hostname
    if not host:
        return
    try:
        socket.getaddrinfo(host, 443)
    except OSError as exc:
        raise HubUnreachableError(hub_unreachable_message(model, repo_id, f"cannot connect: {host}: {exc}")) from exc


def _read_json(source: str, is_local: bool, relpath: str, *, model: str, required: bool) -> dict | None:
    """One config file of the pipeline (``None`` when it is not there and not ``required``)."""
    if is_local:
        path = Path(source) / relpath
        if not path.is_file():
            if required:
                raise ValueError(f"model: folder {source!r} has no {relpath}")
            return None
    else:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import (
            EntryNotFoundError, GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError,
        )

        try:
            try:  # the cache first: no network when the files are there
                path = Path(hf_hub_download(source, relpath, local_files_only=True))
            except LocalEntryNotFoundError:
                _check_hub_resolves(model, source)
                path = Path(hf_hub_download(source, relpath))
        except LocalEntryNotFoundError as exc:  # offline and not in the cache
            raise HubUnreachableError(hub_unreachable_message(model, source, exc)) from exc
        except EntryNotFoundError:  # the hub answered: the repo has no such file
            if required:
                raise ValueError(f"model: {source} has no {relpath} (not a diffusers pipeline)") from None
            return None
        except GatedRepoError:
            raise ValueError(f"model: {source} is gated on the Hugging Face Hub: accept its licence there and log "
                             "in (`hf auth login`), or pass --model FOLDER, a local pipeline folder") from None
        except RepositoryNotFoundError:
            raise ValueError(f"model: {source} is not a repository on the Hugging Face Hub (or is private: log in "
                             "with `hf auth login`)") from None
        except Exception as exc:  # offline, no cache, DNS, timeouts: the hint says what to do
            raise HubUnreachableError(hub_unreachable_message(model, source, exc)) from exc
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"model: {relpath} of {source} cannot be read as JSON ({exc})") from None
    return data if isinstance(data, dict) else None


def _class_default(library_class: str | None, key: str):
    """The ``__init__`` default of ``key`` in the diffusers class ``library_class`` (config files leave
    defaults out), or ``None``."""
    import diffusers

    cls = getattr(diffusers, library_class, None) if library_class else None
    if cls is None:
        return None
    param = inspect.signature(cls.__init__).parameters.get(key)
    return None if param is None or param.default is inspect.Parameter.empty else param.default


def _value(config: dict | None, library_class: str | None, key: str):
    if config is not None and key in config:
        return config[key]
    return _class_default(library_class, key)


def _component(index: dict, names: tuple[str, ...]) -> tuple[str | None, str | None]:
    """(attribute, class) of the first component of ``names`` that the pipeline has."""
    for name in names:
        entry = index.get(name)
        if isinstance(entry, (list, tuple)) and len(entry) == 2 and entry[1]:
            return name, entry[1]
    return None, None


def read_pipeline_config(model: str | os.PathLike | None) -> PipelineConfig:
    """Read ``model``'s ``model_index.json`` and its VAE and transformer configs (no weights).

    Raises:
        HubUnreachableError: a hub id that is not cached and cannot be fetched (the message says
            what to do offline).
        ValueError: not a diffusers pipeline, a gated or missing repo.
    """
    import diffusers

    from rotvid.pipelines.loading import resolve_model

    source, is_local = resolve_model(model)
    name = str(model)
    index = _read_json(source, is_local, "model_index.json", model=name, required=True)
    cls_name = str(index.get("_class_name") or "")
    t_attr, t_cls = _component(index, ("transformer", "transformer_2"))
    fam = family_of_transformer_class(t_cls)
    family = fam.name if fam is not None else None
    pipe_cls = getattr(diffusers, cls_name, None)
    signature = inspect.signature(pipe_cls.__call__).parameters if pipe_cls else {}
    params = tuple(p for p in signature if p != "self")
    defaults = {k: signature[k].default for k in _SIZE_ARGUMENTS
                if k in signature and signature[k].default is not inspect.Parameter.empty}
    if is_local:  # a tiny pipeline's (or the bundled proxy's) own call defaults
        from rotvid.pipelines.folder_defaults import read_tiny_call_defaults

        defaults.update({k: v for k, v in (read_tiny_call_defaults(source) or {}).items() if k in _SIZE_ARGUMENTS})
    size_multiple = temporal = spatial = None
    latent_multiple = patch_hw = patch_t = 1
    rope_max = inner_dim = None
    _, te_cls = _component(index, ("text_encoder",))
    try:  # the text encoder's limits only inform a check: a file that cannot be fetched leaves them unknown
        te = _read_json(source, is_local, "text_encoder/config.json", model=name, required=False) if te_cls else None
    except (HubUnreachableError, ValueError):
        te = None
    text_max = (te or {}).get("max_position_embeddings")
    text_max = int(text_max) if isinstance(text_max, int) and text_max > 0 else None
    text_heads = (te or {}).get("num_heads") or (te or {}).get("num_attention_heads")
    text_heads = int(text_heads) if isinstance(text_heads, int) and text_heads > 0 else None
    if fam is not None:
        _, vae_cls = _component(index, ("vae",))
        vae = _read_json(source, is_local, "vae/config.json", model=name, required=False)
        tcfg = _read_json(source, is_local, f"{t_attr}/config.json", model=name, required=False)
        patch = _value(tcfg, t_cls, "patch_size")
        patch_hw = int(patch[1]) if isinstance(patch, (list, tuple)) else int(patch or 1)
        patch_t = int(patch[0]) if isinstance(patch, (list, tuple)) else int(_value(tcfg, t_cls, "patch_size_t") or 1)
        heads, head_dim = _value(tcfg, t_cls, "num_attention_heads"), _value(tcfg, t_cls, "attention_head_dim")
        inner_dim = int(heads) * int(head_dim) if isinstance(heads, int) and isinstance(head_dim, int) else None
        rope_max = _value(tcfg, t_cls, fam.rope_max_config_attr) if fam.rope_max_config_attr else None
        rope_max = int(rope_max) if isinstance(rope_max, int) else None
        spatial, temporal, latent_multiple = fam.video_factors(
            lambda key: _value(vae, vae_cls, key), lambda key: _value(tcfg, t_cls, key))
        base = fam.check_inputs_multiple
        size_multiple = math.lcm(base, int(spatial) * patch_hw) if spatial else base
        temporal = int(temporal) if temporal else None
        spatial = int(spatial) if spatial else None
    return PipelineConfig(source=source, pipeline_class=cls_name, family=family, call_parameters=params,
                          size_multiple=size_multiple, temporal_factor=temporal, latent_frames_multiple=latent_multiple,
                          call_defaults=defaults, spatial_factor=spatial, patch_hw=patch_hw, patch_t=patch_t,
                          rope_max_positions=rope_max, inner_dim=inner_dim, text_encoder_class=te_cls,
                          text_max_positions=text_max, text_heads=text_heads)


# the call arguments that size a run (their defaults are read for the memory and limit checks)
_SIZE_ARGUMENTS = ("height", "width", "num_frames", "num_inference_steps", "max_sequence_length")


# ---- a loaded pipeline ---------------------------------------------------------------------------


def pipeline_family_and_task(pipe) -> tuple[str, str]:
    """(family name, ``"t2v"`` | ``"i2v"``) of a loaded pipeline."""
    from rotvid.pipelines.attach import find_transformers

    family, _ = find_transformers(pipe)
    return family.name, ("i2v" if accepts_image(pipe) else "t2v")


def accepts_image(pipe) -> bool:
    """Whether the pipeline's ``__call__`` takes a conditioning ``image`` (image-to-video)."""
    return "image" in inspect.signature(pipe.__call__).parameters


def pipeline_device(pipe) -> torch.device:
    """The device a loaded pipeline runs on: its execution device, else its ``device``, else the CPU."""
    dev = getattr(pipe, "_execution_device", None) or getattr(pipe, "device", None)
    return torch.device(dev) if dev is not None else torch.device("cpu")


def default_schedule(model: str | None, pipe=None) -> str | None:
    """The paper's schedule preset for ``model`` (the family's; ``"none"`` where the paper has none).

    Named checkpoints come from :data:`rotvid.pipelines.model_table.MODELS`; a local folder from
    its ``model_index.json`` pipeline class (its family's :meth:`~rotvid.pipelines.families.base.Family.default_preset`
    for the task: image-to-video when the class name says ``ImageToVideo``); otherwise from the loaded ``pipe``'s
    family and task. Returns ``None`` when it cannot be told without loading and ``pipe`` is not given.
    """
    from rotvid.pipelines.families import family_by_name, family_of_pipeline_class
    from rotvid.pipelines.loading import resolve_model
    from rotvid.pipelines.model_table import model_entry

    source, is_local = resolve_model(model)
    entry = model_entry(source)
    if entry is not None:
        return entry.preset or "none"
    if is_local:
        try:
            cls = json.loads((Path(source) / "model_index.json").read_text(encoding="utf-8")).get("_class_name", "")
        except (OSError, ValueError):
            cls = ""
        fam = family_of_pipeline_class(str(cls))
        if fam is not None:
            return fam.default_preset("i2v" if "ImageToVideo" in str(cls) else "t2v")
    if pipe is None:
        return None
    name, task = pipeline_family_and_task(pipe)
    return family_by_name(name).default_preset(task)
