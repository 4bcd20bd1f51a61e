"""What a request alone can tell, checked before any model loads: each error names the option and the path.

A real model takes minutes to load and a generation hours; a request that cannot succeed should fail in the first
second, not after the work. This module holds the checks that need no weights:

* an output location (``--out``, ``--dump-dir``): of the right kind (a file name or a folder), its parent a folder,
  and writable -- tried by creating (and removing) a hidden probe file where the output would go, since
  ``os.access`` says yes to root and to pseudo file systems (``/proc``) that refuse the write;
* a conditioning image (``--image``): a file that PIL reads as an image;
* the size of a run against the model's limits (Wan's RoPE table covers ``rope_max_seq_len`` positions per axis, a
  text encoder's ``max_position_embeddings``) and against the memory of the device (:func:`memory_lower_bound`, a
  lower bound of the peak: a request it refuses cannot fit; one it passes may still not).

The functions raise ``ValueError`` (one line, naming the option); the CLI turns that into ``Error: ...``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = [
    "check_output_file",
    "check_output_folder",
    "check_image",
    "check_size_fits",
    "memory_lower_bound",
    "device_memory",
    "check_backend_device",
    "steps_of_schedule",
]

GIB = 1024 ** 3


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (``path`` made absolute first)."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_writable_folder(option: str, path: Path, folder: Path) -> None:
    """``folder`` (an existing folder on the way to ``path``) lets a file be created in it: tried, not asked."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".rotvid-write-check-", dir=folder)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ValueError(f"{option} {path}: cannot write in {folder} ({reason})") from None
    os.close(fd)
    os.unlink(probe)


def _check_parents(option: str, path: Path) -> Path:
    """The nearest existing ancestor of ``path``'s parent, checked to be a writable folder."""
    parent = Path(os.path.abspath(path)).parent
    existing = _nearest_existing(parent)
    if not existing.is_dir():
        raise ValueError(f"{option} {path}: {existing} is a file, not a folder (the output would go inside it)")
    _check_writable_folder(option, path, existing)
    return existing


def check_output_file(option: str, path: str | os.PathLike) -> None:
    """``path`` can be created (or replaced) as a file: not a folder, its parent a folder (or creatable) that can be
    written. Raises ``ValueError`` naming ``option`` and the path."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option} {path}: is a folder; expected a file name")
    if path.exists() and not path.is_file():
        raise ValueError(f"{option} {path}: is not a regular file")
    _check_parents(option, path)


def check_output_folder(option: str, path: str | os.PathLike) -> None:
    """``path`` is (or can be made) a folder whose files can be written. Raises ``ValueError`` naming ``option``."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise ValueError(f"{option} {path}: expected a folder, got a file")
        _check_writable_folder(option, path, path)
        return
    _check_parents(option, path)


def check_image(path: str | os.PathLike, option: str = "--image") -> None:
    """``path`` is a file PIL reads as an image (its header and data: ``verify``)."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{option} {path}: is a folder; expected an image file")
    if not path.exists():
        raise FileNotFoundError(f"{option} {path} does not exist")
    try:
        with Image.open(path) as im:
            im.verify()
    except PermissionError as exc:
        raise ValueError(f"{option} {path}: cannot be read ({exc.strerror})") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise ValueError(f"{option} {path}: cannot be read as an image ({exc})") from None


# ---- the size of a run ----------------------------------------------------------------------------------------


def _size(config, request) -> dict:
    """height, width, frames and text tokens of ``request`` (a GenerationRequest), the pipeline's defaults where the
    request leaves them out (``None`` where neither says)."""
    d = config.call_defaults
    return {"height": request.height if request.height is not None else d.get("height"),
            "width": request.width if request.width is not None else d.get("width"),
            "frames": request.frames if request.frames is not None else d.get("num_frames"),
            "text": (request.max_sequence_length if request.max_sequence_length is not None
                     else d.get("max_sequence_length"))}


def _latent_grid(config, size: dict) -> tuple[int, int, int] | None:
    """(frames, height, width) of the transformer's token grid, or ``None`` when the config cannot tell."""
    if None in (size["height"], size["width"], size["frames"]) or not config.spatial_factor:
        return None
    t = config.temporal_factor or 1
    latent_frames = (size["frames"] - 1) // t + 1
    cell = config.spatial_factor * config.patch_hw
    return (-(-latent_frames // config.patch_t), size["height"] // cell, size["width"] // cell)


def memory_lower_bound(config, request, *, dtype_bytes: int = 2) -> tuple[int, str]:
    """A lower bound of the peak memory of a run, in bytes, with what it counts: the largest of

    * the decoded video in float32 (the VAE decodes in float32 and the pipeline returns float frames):
      ``frames × height × width × 3 × 4``;
    * the transformer's hidden states, one copy: ``tokens × heads·head_dim × dtype_bytes``;
    * a T5-style text encoder's position bias (UMT5 for Wan, T5 for CogVideoX): the int64 ``L × L`` relative
      positions and the float32 ``heads × L × L`` bias made from them.

    Weights are not counted (the files of a hub model are not read here), so the true peak is higher.
    """
    size = _size(config, request)
    parts = []
    if None not in (size["height"], size["width"], size["frames"]):
        parts.append((size["frames"] * size["height"] * size["width"] * 3 * 4, "the decoded video in float32"))
    grid = _latent_grid(config, size)
    if grid is not None and config.inner_dim:
        tokens = grid[0] * grid[1] * grid[2]
        parts.append((tokens * config.inner_dim * dtype_bytes, f"the transformer's hidden states ({tokens} tokens)"))
    if size["text"] is not None and "T5" in (config.text_encoder_class or ""):
        per_pair = 8 + 4 * (config.text_heads or 1)
        parts.append((size["text"] ** 2 * per_pair, f"the text encoder's position bias ({size['text']}² token pairs)"))
    if not parts:
        return 0, "nothing known"
    return max(parts)


def device_memory(device) -> tuple[int, str] | None:
    """(bytes, description) of the memory of a torch ``device``: the GPU's total memory, or the machine's RAM for the
    CPU; ``None`` when it cannot be told."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return int(props.total_memory), f"{props.name} (cuda:{index})"
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
    return int(ram), "this machine's RAM"


def _options(request, size: dict, keys: tuple[str, ...]) -> str:
    names = {"height": "--height", "width": "--width", "frames": "--frames", "text": "--max-sequence-length"}
    fields = {"height": "height", "width": "width", "frames": "frames", "text": "max_sequence_length"}
    given = [f"{names[k]} {size[k]}" for k in keys if getattr(request, fields[k]) is not None]
    return " ".join(given) or "the pipeline's default size"


def check_size_fits(config, request, device, *, dtype_bytes: int = 2) -> None:
    """Refuse a request beyond the model's limits or, by :func:`memory_lower_bound`, beyond the memory of
    ``device`` (a torch device or ``None``: not checked). ``config``: a
    :class:`~rotvid.pipelines.pipeline_config.PipelineConfig`; ``request``: a ``GenerationRequest``."""
    size = _size(config, request)
    cls = config.pipeline_class or "the pipeline"
    if size["text"] is not None and config.text_max_positions and size["text"] > config.text_max_positions:
        raise ValueError(f"--max-sequence-length {size['text']}: {cls}'s text encoder ({config.text_encoder_class}) "
                         f"takes at most {config.text_max_positions} tokens")
    grid = _latent_grid(config, size)
    if grid is not None and config.rope_max_positions:
        limit = config.rope_max_positions
        for axis, n, option, word in zip(("frames", "height", "width"), grid, ("--frames", "--height", "--width"),
                                         ("time", "height", "width")):
            if n > limit:
                raise ValueError(f"{option} {size[axis]}: {n} latent patches along {word}, more than the {limit} "
                                 f"positions per axis {cls}'s transformer has RoPE for")
    if device is None:
        return
    need, what = memory_lower_bound(config, request, dtype_bytes=dtype_bytes)
    have = device_memory(device)
    if have is None or need <= have[0]:
        return
    keys = ("text",) if what.startswith("the text encoder") else ("height", "width", "frames")
    raise ValueError(f"{_options(request, size, keys)}: needs at least {need / GIB:.1f} GiB ({what}), more than the "
                     f"{have[0] / GIB:.1f} GiB of {have[1]}; ask for a smaller size")


def check_backend_device(backend: str | None, device: str, option: str = "--backend") -> None:
    """``--backend cuda`` needs a CUDA GPU and a run on it (``--device cpu`` or a machine without a GPU: refused, as
    ``--device cuda`` is, instead of every call falling back to the model's own attention)."""
    if backend != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        raise ValueError(f"{option} cuda: no CUDA GPU on this machine (torch.cuda.is_available() is False); use "
                         "--backend auto or reference")
    if device != "auto" and torch.device(device).type != "cuda":
        raise ValueError(f"{option} cuda: the run is on --device {device}; the CUDA kernels need --device cuda")


def steps_of_schedule(schedule, steps: int | None, source: str) -> int | None:
    """The run's --steps: a schedule made for N steps (``num_steps``) gives N when --steps is not given, and refuses
    another count (its table names the cells of an N-step run); ``source``: the option it came from."""
    n = getattr(schedule, "num_steps", None)
    if n is None or steps == n:
        return steps
    if steps is None:
        return n
    raise ValueError(f"{source}: calibrated for {n} steps, but --steps is {steps} (its table names the (step, block) "
                     f"cells of a {n}-step run): pass --steps {n} (or leave --steps out), or calibrate again with "
                     f"--steps {steps}")
