"""Video files through PyAV: H.264 mp4 writing (atomic), probing and reading frames back.

Frames are RGB ``uint8`` arrays laid out ``[F, H, W, 3]`` (frame, row, column, channel) — the
layout diffusers' ``output_type="np"`` gives after scaling to 0..255. H.264 in ``yuv420p`` (the
pixel format every player reads) needs an even height and width.

Writes go to a temporary name in the destination folder and are renamed when the file is
complete, so an interrupted run never leaves a truncated mp4 under the final name.
"""

from __future__ import annotations

import logging
import math
import numbers
import os
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from rotvid.atomic import check_can_write, temporary_path

logger = logging.getLogger(__name__)

VIDEO_SUFFIXES = (".mp4",)
DEFAULT_CRF = 18  # visually lossless for x264; eval metrics of a video against itself stay exact


@dataclass(frozen=True)
class VideoInfo:
    """What a video file holds: frame count, frame size (pixels) and frame rate."""

    path: Path
    frames: int
    height: int
    width: int
    fps: Fraction


def to_uint8_frames(frames) -> np.ndarray:
    """Convert a video to RGB ``uint8 [F, H, W, 3]``.

    Accepts ``uint8`` arrays of that layout as they are, and float arrays/tensors in ``[0, 1]``
    (diffusers' ``output_type="np"`` / ``"pt"`` convention; ``[F, 3, H, W]`` torch tensors are
    permuted). Floats are clipped to ``[0, 1]`` and rounded (half to even) after scaling by 255.
    """
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        torch = None
    if torch is not None and isinstance(frames, torch.Tensor):
        t = frames.detach().cpu()
        if t.ndim == 4 and t.shape[1] == 3 and t.shape[-1] != 3:
            t = t.permute(0, 2, 3, 1)
        frames = t.float().numpy() if t.is_floating_point() else t.numpy()
    arr = np.asarray(frames)
    if arr.ndim != 4 or arr.shape[-1] != 3:
        raise ValueError(f"frames: expected an RGB video of shape [F, H, W, 3], got shape {arr.shape}")
    if arr.shape[0] < 1:
        raise ValueError("frames: expected at least one frame, got 0")
    if arr.dtype == np.uint8:
        return np.ascontiguousarray(arr)
    if not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"frames: expected uint8 (0..255) or float (0..1) values, got dtype {arr.dtype}")
    if not np.isfinite(arr).all():
        raise ValueError("frames: expected finite values, got NaN or inf")
    return np.round(np.clip(arr.astype(np.float64), 0.0, 1.0) * 255.0).astype(np.uint8)


def write_video(
    path: str | os.PathLike,
    frames,
    fps: float | Fraction,
    *,
    overwrite: bool = False,
    crf: int = DEFAULT_CRF,
) -> Path:
    """Write ``frames`` (see :func:`to_uint8_frames`) as an H.264 ``yuv420p`` mp4 at ``fps``.

    The file is encoded under :func:`temporary_path` and renamed to ``path`` once complete.
    Raises ``FileExistsError`` if ``path`` exists and ``overwrite`` is false, ``ValueError`` for
    bad frames (odd height/width included: ``yuv420p`` needs even sizes), a non-positive fps, or
    a crf outside 0..51. Returns the final path.
    """
    import av

    path = Path(path)
    if path.suffix.lower() not in VIDEO_SUFFIXES:
        raise ValueError(f"path: expected a file name ending in .mp4, got {str(path)!r}")
    check_can_write(path, overwrite=overwrite, what="video")
    video = to_uint8_frames(frames)
    n, h, w, _ = video.shape
    if h % 2 or w % 2:
        raise ValueError(f"frames: H.264 (yuv420p) needs an even height and width, got {h}x{w}")
    if not isinstance(fps, Fraction) and (isinstance(fps, bool) or not isinstance(fps, numbers.Real)
                                          or not math.isfinite(fps)):
        raise ValueError(f"fps: expected a positive, finite frame rate, got {fps!r}")
    rate = Fraction(float(fps)).limit_denominator(1001) if not isinstance(fps, Fraction) else fps
    if rate <= 0:
        raise ValueError(f"fps: expected a positive frame rate, got {fps}")
    if isinstance(crf, bool) or not isinstance(crf, numbers.Integral) or not 0 <= crf <= 51:
        raise ValueError(f"crf: expected 0..51 (x264 quality, lower is better), got {crf}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        with av.open(str(tmp), mode="w", format="mp4") as container:
            stream = container.add_stream("libx264", rate=rate)
            stream.width, stream.height = w, h
            stream.pix_fmt = "yuv420p"
            stream.options = {"crf": str(int(crf))}
            for i in range(n):
                frame = av.VideoFrame.from_ndarray(video[i], format="rgb24")
                for packet in stream.encode(frame):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    logger.info("wrote %s (%d frames, %dx%d, %s fps)", path, n, h, w, rate)
    return path


def _open_video(path: Path):
    import av

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"video {path} does not exist")
    if not path.is_file():
        raise ValueError(f"video {path}: expected a file, got a folder or special file")
    try:
        container = av.open(str(path))
    except (av.error.FFmpegError, OSError) as exc:
        raise ValueError(f"video {path} cannot be read as a video: {exc}") from None
    if not container.streams.video:
        container.close()
        raise ValueError(f"video {path} has no video stream")
    return container


def iter_frames(path: str | os.PathLike) -> Iterator[np.ndarray]:
    """Yield the frames of a video file one by one as RGB ``uint8 [H, W, 3]`` arrays."""
    import av

    container = _open_video(Path(path))
    try:
        stream = container.streams.video[0]
        try:
            for frame in container.decode(stream):
                yield frame.to_ndarray(format="rgb24")
        except av.error.FFmpegError as exc:
            raise ValueError(f"video {path} is damaged: {exc}") from None
    finally:
        container.close()


def read_video(path: str | os.PathLike) -> tuple[np.ndarray, Fraction]:
    """Decode a whole video: (RGB ``uint8 [F, H, W, 3]``, frame rate)."""
    info = probe_video(path)
    frames = np.stack(list(iter_frames(path)))
    return frames, info.fps


def probe_video(path: str | os.PathLike, *, count_frames: bool = True) -> VideoInfo:
    """Frame count, size and frame rate of a video file.

    The frame count comes from decoding the file when ``count_frames`` (exact, costs one decode
    pass); otherwise from the container header (may be 0 for some containers).
    """
    path = Path(path)
    container = _open_video(path)
    try:
        stream = container.streams.video[0]
        fps = stream.average_rate or stream.guessed_rate or Fraction(0)
        height, width = stream.codec_context.height, stream.codec_context.width
        n = stream.frames
    finally:
        container.close()
    if count_frames:
        n = sum(1 for _ in iter_frames(path))
    if n < 1:
        raise ValueError(f"video {path} has no frames")
    return VideoInfo(path=path, frames=int(n), height=int(height), width=int(width), fps=Fraction(fps))


def list_videos(folder: str | os.PathLike) -> list[Path]:
    """The video files (``*.mp4``, not hidden, i.e. not partial writes) in ``folder``, sorted."""
    folder = Path(folder)
    return sorted(
        p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in VIDEO_SUFFIXES and not p.name.startswith(".")
    )
