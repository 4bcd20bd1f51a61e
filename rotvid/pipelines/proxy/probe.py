"""The automatic probe: did a generated clip show what its grammar prompt asked for?

For a clip ``(T, H, W, 3)`` in ``[0, 1]`` (what a pipeline returns with ``output_type="np"``) and a
prompt of :mod:`rotvid.pipelines.proxy.clips`'s grammar:

1. every pixel is given the nearest named colour of :data:`~rotvid.pipelines.proxy.clips.COLOURS`
   (pixels farther than ``max_colour_distance`` from all of them are left unassigned);
2. the **background** is the most frequent colour over the clip, the **object** the next most
   frequent (the dominant colour of what is not background); the colour check passes when the
   object's colour is the prompt's;
3. the object's mask (pixels of its colour) gives a centroid and an area per frame; the motion
   check compares the first and last quarter of the frames: ``left`` / ``right`` / ``up`` /
   ``down`` need a displacement of at least ``min_travel`` (fraction of the frame) along that
   direction, larger than the displacement across it; ``grow`` needs the area to grow by
   ``min_growth``; ``bounce`` needs a vertical centroid range of at least ``min_travel`` that
   exceeds the horizontal range, with the centroid back near its start height at the end.

A clip passes when both checks pass. The probe is checked on the procedural clips themselves
(true positives with the right prompt, true negatives with a wrong colour or direction) in the
tests.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from rotvid.pipelines.proxy.clips import COLOURS, parse_prompt

__all__ = ["ProbeResult", "probe_clip"]

_NAMES = tuple(COLOURS)
_PALETTE = np.array([COLOURS[n] for n in _NAMES], dtype=np.float32)


@dataclass(frozen=True)
class ProbeResult:
    """What the probe saw: the colours found, the object's motion, and the two checks."""

    prompt: str
    background: str | None
    object_colour: str | None
    displacement: tuple[float, float]  # (dx, dy) of the centroid, fractions of the frame (x right, y down)
    growth: float  # area of the last quarter over the first quarter
    vertical_range: float
    colour_ok: bool
    motion_ok: bool

    @property
    def passed(self) -> bool:
        return self.colour_ok and self.motion_ok

    def to_dict(self) -> dict:
        return dict(asdict(self), passed=self.passed)


def _check_frames(frames) -> np.ndarray:
    arr = np.asarray(frames, dtype=np.float32)
    if arr.ndim != 4 or arr.shape[-1] != 3 or arr.shape[0] < 4:
        raise ValueError(f"frames: expected (T >= 4, H, W, 3) RGB in [0, 1], got shape {arr.shape}")
    if arr.max() > 1.5:  # uint8 frames
        arr = arr / 255.0
    return arr


def probe_clip(frames, prompt: str, *, max_colour_distance: float = 0.35, min_travel: float = 0.1,
               min_growth: float = 1.5, min_area: float = 0.003) -> ProbeResult:
    """Check one clip against its prompt (see the module doc).

    Args:
        frames: ``(T, H, W, 3)`` RGB in ``[0, 1]`` (float) or ``0..255`` (uint8), ``T >= 4``.
        prompt: a prompt of the grammar.

    Raises:
        ValueError: frames of the wrong shape, or a prompt outside the grammar.
    """
    colour, _shape, motion, _bg = parse_prompt(prompt)
    arr = _check_frames(frames)
    t, h, w, _ = arr.shape
    dist = np.linalg.norm(arr[..., None, :] - _PALETTE, axis=-1)  # (T, H, W, K)
    label = dist.argmin(-1)
    label[dist.min(-1) > max_colour_distance] = -1
    counts = np.bincount(label[label >= 0].ravel(), minlength=len(_NAMES))
    order = np.argsort(-counts)
    background = _NAMES[order[0]] if counts[order[0]] > 0 else None
    obj = int(order[1]) if counts[order[1]] >= min_area * t * h * w else None
    none = ProbeResult(prompt, background, None, (0.0, 0.0), 0.0, 0.0, False, False)
    if obj is None:
        return none
    mask = label == obj  # (T, H, W)
    area = mask.reshape(t, -1).mean(1)
    present = area >= min_area
    if present.sum() < t // 2:
        return ProbeResult(prompt, background, _NAMES[obj], (0.0, 0.0), 0.0, 0.0, _NAMES[obj] == colour, False)
    ys, xs = (np.arange(h, dtype=np.float32) + 0.5) / h, (np.arange(w, dtype=np.float32) + 0.5) / w
    m = mask.astype(np.float32)
    tot = np.maximum(m.sum((1, 2)), 1.0)
    cy = (m.sum(2) * ys).sum(1) / tot
    cx = (m.sum(1) * xs).sum(1) / tot
    q = max(1, t // 4)
    first, last = slice(0, q), slice(t - q, t)
    pf, pl = present[first], present[last]
    if not pf.any() or not pl.any():
        return ProbeResult(prompt, background, _NAMES[obj], (0.0, 0.0), 0.0, 0.0, _NAMES[obj] == colour, False)
    dx = float(cx[last][pl].mean() - cx[first][pf].mean())
    dy = float(cy[last][pl].mean() - cy[first][pf].mean())
    growth = float(area[last].mean() / max(area[first].mean(), 1e-9))
    cyp, cxp = cy[present], cx[present]
    v_range = float(cyp.max() - cyp.min())
    h_range = float(cxp.max() - cxp.min())
    along = {"right": dx, "left": -dx, "down": dy, "up": -dy}
    across = {"right": dy, "left": dy, "down": dx, "up": dx}
    if motion in along:
        motion_ok = along[motion] >= min_travel and along[motion] > abs(across[motion])
    elif motion == "grow":
        motion_ok = growth >= min_growth
    else:  # bounce
        motion_ok = v_range >= min_travel and v_range > h_range and abs(dy) < 0.5 * v_range
    return ProbeResult(prompt, background, _NAMES[obj], (dx, dy), growth, v_range, _NAMES[obj] == colour,
                       bool(motion_ok))
