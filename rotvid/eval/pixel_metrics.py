"""The paper's relative metrics between a reference video and a candidate, on 8-bit pixels.

Both videos are RGB ``uint8 [F, H, W, 3]`` (or two files decoded frame by frame). Every metric
is computed on pixel values in 0..255, in float64, accumulated frame by frame so that a
81×480×832 video never needs more than a few frames in memory:

- ``mse``     = mean over all pixels and channels of (cand − ref)²   (0..255² scale, as Table 1)
- ``psnr``    = 10·log10(255² / mse) in dB over the whole video; ``inf`` when mse is 0
- ``psnr_per_frame`` = the same per frame (``inf`` for identical frames)
- ``ssim``    = mean over frames of scikit-image's ``structural_similarity`` (``channel_axis=-1``,
  ``data_range=255``, its default 7×7 uniform window)
- ``cosine``  = ⟨ref, cand⟩ / (‖ref‖·‖cand‖) over the flattened pixel values (1.0 for two
  all-black videos, 0.0 when exactly one is all black)
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

MAX_PIXEL = 255.0


@dataclass
class VideoMetrics:
    """Relative metrics of one candidate video against its reference (see the module doc)."""

    name: str
    frames: int
    height: int
    width: int
    psnr: float
    ssim: float
    cosine: float
    mse: float
    psnr_per_frame: list[float] = field(default_factory=list)

    def to_json(self) -> dict:
        d = asdict(self)
        d["psnr"] = float_to_json(self.psnr)
        d["psnr_per_frame"] = [float_to_json(x) for x in self.psnr_per_frame]
        return d


def float_to_json(x: float) -> float | str:
    """JSON has no infinity: ``inf`` is written as the string ``"inf"``."""
    return "inf" if math.isinf(x) and x > 0 else x


def float_from_json(x: float | str) -> float:
    return math.inf if x == "inf" else float(x)


def psnr_from_mse(mse: float, max_value: float = MAX_PIXEL) -> float:
    """10·log10(max² / mse) in dB; ``inf`` when ``mse`` is 0."""
    if mse < 0:
        raise ValueError(f"mse: expected a value >= 0, got {mse}")
    return math.inf if mse == 0 else 10.0 * math.log10(max_value * max_value / mse)


def _check_frame_pair(ref: np.ndarray, cand: np.ndarray, index: int) -> None:
    if ref.shape != cand.shape:
        raise ValueError(
            f"candidate: frame {index} has size {cand.shape[1]}x{cand.shape[0]}, "
            f"the reference's is {ref.shape[1]}x{ref.shape[0]}"
        )
    if ref.ndim != 3 or ref.shape[-1] != 3 or ref.dtype != np.uint8 or cand.dtype != np.uint8:
        raise ValueError(
            f"frames: expected RGB uint8 frames [H, W, 3], got {ref.shape} {ref.dtype} and {cand.shape} {cand.dtype}"
        )


def compare_frames(
    reference: Iterable[np.ndarray], candidate: Iterable[np.ndarray], *, name: str = "video"
) -> VideoMetrics:
    """All metrics of ``candidate`` against ``reference``, two iterables of ``uint8 [H, W, 3]``.

    Raises ``ValueError`` when the frame counts or frame sizes differ.
    """
    from skimage.metrics import structural_similarity

    sse_total = dot = norm_r = norm_c = 0.0
    ssim_sum = 0.0
    psnr_frames: list[float] = []
    pixels_per_frame = None
    shape = None
    n = 0
    sentinel = object()
    ref_iter, cand_iter = iter(reference), iter(candidate)
    while True:
        r = next(ref_iter, sentinel)
        c = next(cand_iter, sentinel)
        if r is sentinel or c is sentinel:
            if r is not c:
                rest = sum(1 for _ in (cand_iter if r is sentinel else ref_iter)) + 1
                n_ref, n_cand = (n, n + rest) if r is sentinel else (n + rest, n)
                raise ValueError(f"candidate: has {n_cand} frames, the reference has {n_ref} ({name})")
            break
        _check_frame_pair(r, c, n)
        shape = r.shape
        rf, cf = r.astype(np.float64), c.astype(np.float64)
        sse = float(np.square(cf - rf).sum())
        pixels_per_frame = rf.size
        sse_total += sse
        dot += float(np.einsum("ijk,ijk->", rf, cf))
        norm_r += float(np.einsum("ijk,ijk->", rf, rf))
        norm_c += float(np.einsum("ijk,ijk->", cf, cf))
        psnr_frames.append(psnr_from_mse(sse / pixels_per_frame))
        ssim_sum += float(structural_similarity(r, c, channel_axis=-1, data_range=MAX_PIXEL))
        n += 1
    if n == 0:
        raise ValueError(f"reference: has no frames ({name})")
    mse = sse_total / (pixels_per_frame * n)
    if norm_r == 0 and norm_c == 0:
        cosine = 1.0
    elif norm_r == 0 or norm_c == 0:
        cosine = 0.0
    else:
        cosine = dot / math.sqrt(norm_r * norm_c)
    return VideoMetrics(
        name=name,
        frames=n,
        height=int(shape[0]),
        width=int(shape[1]),
        psnr=psnr_from_mse(mse),
        ssim=ssim_sum / n,
        cosine=cosine,
        mse=mse,
        psnr_per_frame=psnr_frames,
    )


def compare_arrays(reference: np.ndarray, candidate: np.ndarray, *, name: str = "video") -> VideoMetrics:
    """:func:`compare_frames` on two in-memory videos ``uint8 [F, H, W, 3]``."""
    ref, cand = np.asarray(reference), np.asarray(candidate)
    for arg, a in (("reference", ref), ("candidate", cand)):
        if a.ndim != 4 or a.shape[-1] != 3 or a.dtype != np.uint8:
            raise ValueError(f"{arg}: expected an RGB uint8 video [F, H, W, 3], got shape {a.shape} dtype {a.dtype}")
    return compare_frames(iter(ref), iter(cand), name=name)


def compare_files(reference: str | os.PathLike, candidate: str | os.PathLike, *, name: str | None = None) -> VideoMetrics:
    """:func:`compare_frames` on two video files, decoded frame by frame.

    The headers are checked first so that a size or frame-count mismatch is reported before any
    metric work: ``ValueError`` naming both files.
    """
    from rotvid.eval.video_io import iter_frames, probe_video

    ref_info, cand_info = probe_video(reference), probe_video(candidate)
    if (ref_info.height, ref_info.width) != (cand_info.height, cand_info.width):
        raise ValueError(
            f"candidate {candidate} is {cand_info.width}x{cand_info.height}, "
            f"reference {reference} is {ref_info.width}x{ref_info.height}"
        )
    if ref_info.frames != cand_info.frames:
        raise ValueError(
            f"candidate {candidate} has {cand_info.frames} frames, reference {reference} has {ref_info.frames}"
        )
    return compare_frames(iter_frames(reference), iter_frames(candidate), name=name or Path(candidate).stem)


def mean_metrics(videos: list[VideoMetrics]) -> dict[str, float]:
    """Average of each metric over videos (PSNR averaged per video: ∞ if any video is identical)."""
    if not videos:
        raise ValueError("videos: expected at least one VideoMetrics, got none")
    keys = ("psnr", "ssim", "cosine", "mse")
    return {k: float(np.mean([getattr(v, k) for v in videos])) for k in keys}
