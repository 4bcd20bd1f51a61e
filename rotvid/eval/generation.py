"""Generating videos with rotvid attached (or not, for the FP16 reference): mp4 + JSON sidecar.

:func:`generate_video` runs one prompt through a loaded diffusers pipeline, with a rotvid
:class:`~rotvid.pipelines.config.RotvidConfig` applied for the duration of the call (``None``:
the untouched pipeline, the FP16 reference), times every denoising step through the pipeline's
``callback_on_step_end``, writes the video (:func:`rotvid.eval.video_io.write_video`) and its
sidecar (:mod:`rotvid.eval.sidecar`).

The initial noise comes from a CPU ``torch.Generator`` seeded with ``seed``, so the reference and
every variant of one prompt start from the same latents (on any device); the sidecar records a
hash of those latents to make that checkable.

Frame rates come from the one model table (:func:`rotvid.pipelines.model_table.frame_rate`: the
checkpoint's where it has its own, else the family's). A pipeline loaded from a local folder that
holds a ``rotvid_tiny.json`` (the tiny test pipelines of :mod:`rotvid.pipelines.tiny`) gets that
file's ``call_defaults`` under the request's own arguments; real checkpoints never have it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import logging
import os
import platform
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rotvid.atomic import check_can_write
from rotvid.eval.sidecar import read_sidecar, sidecar_path, write_sidecar
from rotvid.eval.video_io import to_uint8_frames, write_video
from rotvid.kernels.recipes import fp16
from rotvid.pipelines.pipeline_config import accepts_image, pipeline_device, pipeline_family_and_task

logger = logging.getLogger(__name__)

StepCallback = Callable[[int, int], None]  # (steps done, total steps)


@dataclass(frozen=True)
class GenerationRequest:
    """What to generate. ``None`` fields take the pipeline's own defaults (Wan: 480×832, 81 frames,
    50 steps, guidance 5.0), except ``fps`` which defaults to the model's frame rate in
    :mod:`rotvid.pipelines.model_table` (the family's, e.g. Wan 16, or the checkpoint's: Wan2.2-TI2V-5B 24)."""

    prompt: str
    seed: int = 0
    negative_prompt: str | None = None
    image: str | None = None
    height: int | None = None
    width: int | None = None
    frames: int | None = None
    steps: int | None = None
    guidance_scale: float | None = None
    max_sequence_length: int | None = None
    fps: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def load_prompts(path: str | Path) -> list[str]:
    """Prompts of a text file: one per line; blank lines and lines starting with ``#`` skipped."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"prompt file {p} does not exist")
    if not p.is_file():
        raise ValueError(f"--prompt-file {p}: expected a text file, got a folder")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"--prompt-file {p}: expected UTF-8 text") from None
    prompts = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not prompts:
        raise ValueError(f"--prompt-file {p} has no prompts (one per line expected)")
    return prompts


def video_name(index: int, prompt: str, *, max_len: int = 48) -> str:
    """``"003-a-red-cat-runs"``: index and a file-name-safe slug of the prompt."""
    slug = re.sub(r"[^a-z0-9]+", "-", prompt.lower()).strip("-")[:max_len].rstrip("-") or "video"
    return f"{index:03d}-{slug}"


def versions() -> dict[str, str]:
    import av
    import diffusers
    import transformers

    import rotvid

    return {
        "rotvid": rotvid.__version__,
        "diffusers": diffusers.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "av": av.__version__,
        "python": platform.python_version(),
    }


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} (cpu)"


def _latents_sha256(t: torch.Tensor) -> str:
    t = t.detach().to("cpu").contiguous()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()


@contextlib.contextmanager
def _record_initial_latents(pipe, record: dict):
    """Observe what the pipeline's own ``prepare_latents`` returns (the initial noise) for this call.

    A per-instance wrapper, removed on exit; the pipeline's behaviour is unchanged.
    """
    original = pipe.prepare_latents

    def wrapper(*args, **kwargs):
        out = original(*args, **kwargs)
        first = out[0] if isinstance(out, (tuple, list)) else out
        if "sha256" not in record and isinstance(first, torch.Tensor):
            record["sha256"] = _latents_sha256(first)
            record["shape"] = list(first.shape)
        return out

    pipe.prepare_latents = wrapper
    try:
        yield
    finally:
        del pipe.prepare_latents


def _load_image(path: str):
    from PIL import Image, UnidentifiedImageError

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--image {p} does not exist")
    try:
        with Image.open(p) as im:
            return im.convert("RGB")
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"--image {p} cannot be read as an image: {exc}") from None


def folder_call_defaults(pipe) -> dict:
    """Call defaults of the local folder ``pipe`` was loaded from (its ``rotvid_tiny.json``), else ``{}``.

    Only a folder written by :func:`rotvid.pipelines.tiny.build_tiny_pipeline` has that file; a hub
    checkpoint (``name_or_path`` a repo id, not a folder) never does.
    """
    from rotvid.pipelines.tiny import read_tiny_call_defaults

    source = getattr(getattr(pipe, "config", None), "_name_or_path", None)
    if not isinstance(source, (str, os.PathLike)) or not Path(source).is_dir():
        return {}
    return dict(read_tiny_call_defaults(source) or {})


def check_requirements(pipe) -> None:
    """Raise ValueError naming the package when the pipeline class needs one that is not installed
    (:data:`rotvid.pipelines.model_table.PIPELINE_REQUIREMENTS`)."""
    from rotvid.pipelines.model_table import PIPELINE_REQUIREMENTS

    cls = type(pipe).__name__
    missing = [m for m in PIPELINE_REQUIREMENTS.get(cls, ()) if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"{cls} needs the Python package(s) {', '.join(missing)}, not installed here "
                         f"(pip install {' '.join(missing)})")


# GenerationRequest field -> (CLI option, pipeline argument)
_REQUEST_ARGUMENTS = (
    ("negative_prompt", "--negative-prompt", "negative_prompt"), ("height", "--height", "height"),
    ("width", "--width", "width"), ("frames", "--frames", "num_frames"), ("steps", "--steps", "num_inference_steps"),
    ("guidance_scale", "--guidance-scale", "guidance_scale"),
    ("max_sequence_length", "--max-sequence-length", "max_sequence_length"),
)


def check_request(config, request: GenerationRequest) -> None:
    """Check ``request`` against what the pipeline's config files say (no weights loaded).

    ``config``: a :class:`rotvid.pipelines.pipeline_config.PipelineConfig`. Checks ``--image``
    (required by an image-to-video pipeline, refused by a text-to-video one), the arguments the
    pipeline class takes, the packages it needs, the height/width multiple and the frame rule
    (``k·t + 1`` frames for a VAE of temporal factor ``t``), each error naming the CLI option.

    Raises:
        ValueError: the first problem found.
    """
    from rotvid.pipelines.model_table import PIPELINE_REQUIREMENTS

    cls = config.pipeline_class or "the pipeline"
    missing = [m for m in PIPELINE_REQUIREMENTS.get(config.pipeline_class, ()) if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"{cls} needs the Python package(s) {', '.join(missing)}, not installed here "
                         f"(pip install {' '.join(missing)})")
    if config.call_parameters:
        if request.image is not None and not config.takes_image:
            raise ValueError(f"--image: {cls} is a text-to-video pipeline and takes no image")
        if request.image is None and config.takes_image:
            raise ValueError(f"--image: {cls} is an image-to-video pipeline; pass --image FILE")
        for field_name, option, arg in _REQUEST_ARGUMENTS:
            if getattr(request, field_name) is not None and arg not in config.call_parameters:
                raise ValueError(f"{option}: {cls} does not take {arg}")
    m = config.size_multiple
    for option, value in (("--height", request.height), ("--width", request.width)):
        if value is not None and m and value % m:
            lower = value // m * m
            choices = f"{lower} or {lower + m}" if lower else f"{m}"
            raise ValueError(f"{option} {value}: {cls} needs a multiple of {m} (e.g. {choices})")
    t, n = config.temporal_factor, request.frames
    if n is not None and t:
        lower = (n - 1) // t * t + 1
        if lower != n:
            raise ValueError(f"--frames {n}: {cls} makes {t}k+1 frames (its VAE packs {t} frames into one latent "
                             f"frame; {n} would silently become another count): pass --frames {lower} or "
                             f"{lower + t}")
        p_t = config.latent_frames_multiple
        if p_t > 1 and ((n - 1) // t + 1) % p_t:
            step = t * p_t
            ok = [f for f in range(1, n + 2 * step) if (f - 1) % t == 0 and ((f - 1) // t + 1) % p_t == 0]
            below = [f for f in ok if f < n]
            above = [f for f in ok if f > n]
            hint = " or ".join(str(f) for f in (below[-1:] + above[:1]))
            raise ValueError(f"--frames {n}: {cls} needs a latent frame count divisible by its patch_size_t {p_t} "
                             f"(frames = {t}·(latent frames - 1) + 1): pass --frames {hint}")


def call_kwargs(pipe, request: GenerationRequest) -> dict:
    """The keyword arguments of ``pipe(...)`` for ``request`` (seeded CPU generator, numpy output).

    Order of precedence: the request's fields (``None`` ones are left out), then the call defaults
    of a tiny pipeline's folder (:func:`folder_call_defaults`), then the pipeline's own defaults.

    Raises:
        ValueError: ``--image`` given to a text-to-video pipeline or missing for an image-to-video
            one, an unreadable image, an argument the pipeline does not take, or a package the
            pipeline class needs is not installed.
    """
    check_requirements(pipe)
    kw: dict = {"prompt": request.prompt, "output_type": "np",
                "generator": torch.Generator("cpu").manual_seed(int(request.seed))}
    takes_image = accepts_image(pipe)
    if request.image is not None and not takes_image:
        raise ValueError(f"--image: {type(pipe).__name__} is a text-to-video pipeline and takes no image")
    if request.image is None and takes_image:
        raise ValueError(f"--image: {type(pipe).__name__} is an image-to-video pipeline; pass --image FILE")
    if request.image is not None:
        kw["image"] = _load_image(request.image)
    for field_name, arg in (
        ("negative_prompt", "negative_prompt"), ("height", "height"), ("width", "width"), ("frames", "num_frames"),
        ("steps", "num_inference_steps"), ("guidance_scale", "guidance_scale"),
        ("max_sequence_length", "max_sequence_length"),
    ):
        value = getattr(request, field_name)
        if value is not None:
            kw[arg] = value
    params = inspect.signature(pipe.__call__).parameters
    for arg in kw:
        if arg not in params:
            raise ValueError(f"{arg}: {type(pipe).__name__} does not take this argument")
    defaults = folder_call_defaults(pipe)
    for arg, value in defaults.items():
        if arg not in params:
            raise ValueError(f"{arg} (in the folder's rotvid_tiny.json): {type(pipe).__name__} does not take "
                             "this argument")
        kw.setdefault(arg, value)
    return kw


def fps_for(pipe, request: GenerationRequest, model: str | None = None) -> float:
    """``request.fps``, else the frame rate of ``model`` in the model table when it is a named
    checkpoint (no need to look at ``pipe``), else that of ``pipe``'s family
    (:func:`rotvid.pipelines.model_table.frame_rate`)."""
    from rotvid.pipelines.model_table import frame_rate, model_entry

    if request.fps is not None:
        if request.fps <= 0:
            raise ValueError(f"--fps: expected a positive frame rate, got {request.fps}")
        return float(request.fps)
    if model is not None:
        from rotvid.pipelines.loading import resolve_model

        source, _ = resolve_model(model)
        entry = model_entry(source)
        if entry is not None:
            return float(frame_rate(entry.family, entry.repo_id))
    fam, _ = pipeline_family_and_task(pipe)
    return float(frame_rate(fam))


def request_record(model: str, request: GenerationRequest, config_dict: dict | None) -> dict:
    """The part of a sidecar that identifies a run (compared on resume)."""
    return {"model": str(model), **request.to_dict(), "config": config_dict}


def finished(out: Path, record: dict) -> bool:
    """True when ``out`` and its sidecar exist and were made by the same request (resume).

    Raises ``FileExistsError`` when ``out`` exists but from another request or without a sidecar.
    """
    if not out.exists():
        return False
    side = read_sidecar(out)
    if side is None:
        raise FileExistsError(f"video {out} already exists without a rotvid sidecar (pass --overwrite to replace it)")
    if side.get("request") != record:
        old = side.get("request") or {}
        diff = sorted(k for k in set(old) | set(record) if old.get(k) != record.get(k))
        raise FileExistsError(
            f"video {out} already exists from a different request (differs in: {', '.join(diff)}); "
            "use another output folder or --overwrite"
        )
    return True


def generate_video(
    pipe,
    request: GenerationRequest,
    out: str | Path,
    *,
    model: str,
    config=None,
    overwrite: bool = False,
    on_step: StepCallback | None = None,
    extra: dict | None = None,
    compile: bool = False,
) -> dict:
    """Generate one video to ``out`` (mp4) and write its sidecar; returns the sidecar dict.

    ``config``: a :class:`~rotvid.pipelines.config.RotvidConfig` applied for this call only
    (``rotvid.pipelines.apply`` before, ``remove`` after), or ``None`` for the untouched pipeline
    (FP16 reference). ``on_step(done, total)`` is called after every denoising step.
    ``compile``: ``torch.compile`` the transformer(s) for this call (``apply(..., compile=True)``;
    the untouched pipeline's transformers are compiled the same way, then un-compiled). The first
    step of each distinct plan pays for compiling, in every video (``apply`` makes new processors).
    """
    from rotvid.distributed_run import is_main_process, merge_run_reports, world_size
    from rotvid.pipelines.attach import apply, find_transformers, remove
    from rotvid.pipelines.compiling import compile_options, compile_transformers, uncompile_transformers

    out = Path(out)
    check_outputs(out, overwrite=overwrite)
    kwargs = call_kwargs(pipe, request)
    # the conditioning image's bytes (its path is in the request): the same path may hold another image later
    image_sha256 = hashlib.sha256(Path(request.image).read_bytes()).hexdigest() if request.image else None
    fps = fps_for(pipe, request, model)
    device = pipeline_device(pipe)
    family, task = pipeline_family_and_task(pipe)
    step_times: list[float] = []
    mark = [0.0]
    total_steps = [kwargs.get("num_inference_steps") or inspect.signature(pipe.__call__).parameters[
        "num_inference_steps"].default]

    def callback(pipeline, step, timestep, callback_kwargs):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        now = time.perf_counter()
        step_times.append(now - mark[0])
        mark[0] = now
        n = len(getattr(pipeline, "scheduler").timesteps) if hasattr(pipeline, "scheduler") else total_steps[0]
        total_steps[0] = n
        if on_step is not None:
            on_step(step + 1, n)
        return {}

    noise: dict = {}
    handle = apply(pipe, config, compile=compile) if config is not None else None
    compiled_plain: list[str] = []
    if compile and handle is None:
        compiled_plain = compile_transformers(find_transformers(pipe)[1], compile_options(True))
    try:
        with _record_initial_latents(pipe, noise), torch.inference_mode():
            t0 = time.perf_counter()
            mark[0] = t0
            result = pipe(**kwargs, callback_on_step_end=callback)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t_done = time.perf_counter()
        run_report = handle.report.to_dict() if handle is not None else None
    finally:
        if handle is not None:
            remove(pipe)
        uncompile_transformers(find_transformers(pipe)[1], compiled_plain)
    # multi-process runs (rotvid generate --gpus N): one report for all ranks, files from rank 0 only
    run_report = merge_run_reports(run_report)
    writer = is_main_process()
    frames = result.frames[0] if hasattr(result, "frames") else result[0][0]
    video = to_uint8_frames(frames)
    # the video first, then its sidecar, each through a temporary name and a rename: a sidecar always
    # names a video that exists (an old sidecar goes first, so it never describes the new video)
    if writer:
        check_outputs(out, overwrite=overwrite)  # again: the destination may have changed while generating
        if overwrite:
            sidecar_path(out).unlink(missing_ok=True)
        write_video(out, video, fps, overwrite=overwrite)
    t_end = time.perf_counter()
    config_dict = config.to_dict() if config is not None else None
    side = {
        "request": request_record(model, request, config_dict),
        "video": out.name,
        # the recipe that ran (``auto`` resolved by apply) and why; the request keeps what was asked
        "recipe": run_report["recipe"] if run_report is not None else fp16.RECIPE.name,
        "recipe_reason": run_report["recipe_reason"] if run_report is not None else "the untouched FP16 pipeline",
        "rotation": config.rotation if config is not None else "none",
        # the block map of the quantized calls, and what it kept (run_report.sparsity has it per block and step)
        "sparsity": str(config.sparsity) if config is not None else "none",
        "mean_density": (run_report.get("sparsity") or {}).get("mean_density") if run_report is not None else None,
        "mean_dropped_mass": ((run_report.get("sparsity") or {}).get("mean_dropped_mass")
                              if run_report is not None else None),
        # the true mass the maps kept and the oracle's at the same counts (measure_kept_mass, oracle maps)
        "mean_kept_mass": ((run_report.get("sparsity") or {}).get("mean_kept_mass")
                           if run_report is not None else None),
        "mean_oracle_kept_mass": ((run_report.get("sparsity") or {}).get("mean_oracle_kept_mass")
                                  if run_report is not None else None),
        "model": {"name": str(model), "pipeline": type(pipe).__name__, "family": family, "task": task},
        "device": str(device),
        "device_name": device_description(device),
        # processes (one GPU each; gloo processes on CPU) that ran it: rotvid generate --gpus N
        "gpus": world_size(),
        "compiled": bool(compile),
        "dtype": str(getattr(pipe.transformer, "dtype", "unknown")).removeprefix("torch."),
        "frames": int(video.shape[0]),
        "height": int(video.shape[1]),
        "width": int(video.shape[2]),
        "fps": fps,
        "steps": len(step_times),
        "initial_noise_sha256": noise.get("sha256"),
        "initial_noise_shape": noise.get("shape"),
        "image_sha256": image_sha256,
        "call_defaults": folder_call_defaults(pipe),  # a tiny pipeline folder's rotvid_tiny.json; {} otherwise
        "timing": {
            "per_step_seconds": step_times,
            "denoise_seconds": sum(step_times),
            "decode_seconds": (t_done - t0) - sum(step_times),
            "total_seconds": t_end - t0,
        },
        # recipe-neutral; int4_fraction: the same number under its old name, kept for one version
        "quantized_fraction": run_report["quantized_fraction"] if run_report is not None else 0.0,
        "int4_fraction": run_report["quantized_fraction"] if run_report is not None else 0.0,
        "fallbacks": run_report["fallbacks"] if run_report is not None else {},
        "run_report": run_report,
        "versions": versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **(extra or {}),
    }
    if writer:
        write_sidecar(out, side)
    return side


def quantized_fraction(side: dict) -> float | None:
    """The quantized fraction of a sidecar or report dict: ``quantized_fraction``, else the old
    ``int4_fraction`` (sidecars written before the rename), else ``None``."""
    for key in ("quantized_fraction", "int4_fraction"):
        if side.get(key) is not None:
            return float(side[key])
    return None


def check_outputs(out: Path, *, overwrite: bool) -> None:
    """Refuse to replace an existing video (without ``overwrite``) or a JSON file that is not a
    rotvid sidecar; a sidecar whose video is missing (an interrupted run) may be replaced."""
    out = Path(out)
    if out.is_dir():
        raise IsADirectoryError(f"video {out} is a folder; expected an .mp4 file name (--overwrite replaces "
                                "files, not folders)")
    check_can_write(out, overwrite=overwrite, what="video")
    side = sidecar_path(out)
    if side.is_dir():
        raise IsADirectoryError(f"{side} (the sidecar of {out.name}) is a folder; expected a file name")
    if side.exists() and not overwrite and read_sidecar(out) is None:
        raise FileExistsError(f"{side} already exists and is not a rotvid sidecar (pass --overwrite to replace it)")
