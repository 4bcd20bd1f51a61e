"""Procedural clips and their prompts: the proxy model's training data (seeded, no files).

A clip is one shape (circle, square, triangle) of a named colour over a textured background of
another named colour (stripes, a checkerboard or smooth noise, all shades of that colour), moving
to the left / right, up / down, bouncing, or growing. Its prompt comes from a small grammar::

    a {colour} {shape} {motion} [on a {background} background]

e.g. ``"a red circle moves to the right on a blue background"``; about a quarter of the prompts
leave the background out (it is then drawn at random).

:func:`sample_specs` draws :class:`ClipSpec` s from a seeded ``random.Random``;
:func:`render_clips` draws a batch of them on any device, vectorized, as ``(B, 3, T, H, W)`` in
``[-1, 1]`` (the Wan VAE's input range). :func:`is_held_out` splits the grammar's
(colour, shape, motion, background) combinations into a training part and a held-out part (about
one in eight, by a fixed hash), so the probe can be run on prompts never seen in training.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

import torch

__all__ = [
    "COLOURS",
    "OBJECT_COLOURS",
    "BACKGROUND_COLOURS",
    "SHAPES",
    "MOTIONS",
    "DIRECTIONS",
    "TEXTURES",
    "VOCABULARY",
    "ClipSpec",
    "prompt_of",
    "parse_prompt",
    "is_held_out",
    "sample_specs",
    "held_out_prompts",
    "render_clips",
    "object_alpha",
]

# Named colours (RGB in [0, 1]); the probe classifies pixels against this palette.
COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.90, 0.10, 0.10),
    "green": (0.10, 0.75, 0.20),
    "blue": (0.15, 0.30, 0.95),
    "yellow": (0.95, 0.90, 0.10),
    "white": (0.95, 0.95, 0.95),
    "purple": (0.60, 0.15, 0.80),
    "black": (0.05, 0.05, 0.05),
}
OBJECT_COLOURS = ("red", "green", "blue", "yellow", "white", "purple")
BACKGROUND_COLOURS = ("red", "green", "blue", "yellow", "white", "purple", "black")
SHAPES = ("circle", "square", "triangle")
# motion key -> phrase in the prompt
MOTIONS: dict[str, str] = {
    "left": "moves to the left",
    "right": "moves to the right",
    "up": "moves up",
    "down": "moves down",
    "bounce": "bounces",
    "grow": "grows",
}
DIRECTIONS = ("left", "right", "up", "down")
TEXTURES = ("stripes", "checker", "noise")

VOCABULARY: tuple[str, ...] = tuple(
    dict.fromkeys(
        ["a", "on", "background", *COLOURS, *SHAPES]
        + [w for phrase in MOTIONS.values() for w in phrase.split()]
    )
)

HELD_OUT_EVERY = 8  # about one combination in eight is held out


@dataclass(frozen=True)
class ClipSpec:
    """One clip: what the prompt names, plus the free choices the prompt does not fix.

    Positions are fractions of the frame (x to the right, y down); ``size`` is the shape's radius
    as a fraction of the frame side; ``texture_seed`` seeds the background's random pattern.
    """

    colour: str
    shape: str
    motion: str
    background: str
    say_background: bool = True
    texture: str = "stripes"
    texture_seed: int = 0
    x0: float = 0.5
    y0: float = 0.5
    travel: float = 0.45
    size: float = 0.14
    speed: float = 1.0

    @property
    def prompt(self) -> str:
        return prompt_of(self.colour, self.shape, self.motion, self.background if self.say_background else None)


def prompt_of(colour: str, shape: str, motion: str, background: str | None = None) -> str:
    """The grammar's prompt (``background`` None: no background clause)."""
    text = f"a {colour} {shape} {MOTIONS[motion]}"
    return text if background is None else f"{text} on a {background} background"


def parse_prompt(prompt: str) -> tuple[str, str, str, str | None]:
    """``(colour, shape, motion, background or None)`` of a grammar prompt.

    Raises:
        ValueError: the prompt is not one of the grammar's.
    """
    words = " ".join(prompt.lower().split())
    for colour in OBJECT_COLOURS:
        for shape in SHAPES:
            for motion, phrase in MOTIONS.items():
                head = f"a {colour} {shape} {phrase}"
                if words == head:
                    return colour, shape, motion, None
                for bg in BACKGROUND_COLOURS:
                    if words == f"{head} on a {bg} background":
                        return colour, shape, motion, bg
    raise ValueError(f"prompt: expected 'a COLOUR SHAPE MOTION [on a COLOUR background]' with COLOUR in "
                     f"{', '.join(OBJECT_COLOURS)}, SHAPE in {', '.join(SHAPES)}, MOTION one of "
                     f"{', '.join(repr(p) for p in MOTIONS.values())}; got {prompt!r}")


def is_held_out(colour: str, shape: str, motion: str, background: str) -> bool:
    """Whether the combination belongs to the held-out part (fixed hash; no training clip uses it)."""
    key = f"{colour}|{shape}|{motion}|{background}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "little") % HELD_OUT_EVERY == 0


def _combinations(held_out: bool) -> list[tuple[str, str, str, str]]:
    return [
        (c, s, m, b)
        for c in OBJECT_COLOURS for s in SHAPES for m in MOTIONS for b in BACKGROUND_COLOURS
        if b != c and is_held_out(c, s, m, b) == held_out
    ]


def _free_choices(rng: random.Random, motion: str) -> dict:
    size = rng.uniform(0.11, 0.17)
    travel = rng.uniform(0.35, 0.5)
    lo, hi = 0.2, 0.8
    if motion in ("left", "right"):
        start = rng.uniform(lo, hi - travel)
        x0 = start if motion == "right" else 1.0 - start
        y0 = rng.uniform(0.3, 0.7)
    elif motion in ("up", "down"):
        start = rng.uniform(lo, hi - travel)
        y0 = start if motion == "down" else 1.0 - start
        x0 = rng.uniform(0.3, 0.7)
    elif motion == "bounce":
        x0, y0 = rng.uniform(0.3, 0.7), rng.uniform(0.7, 0.78)  # y0: the floor
        travel = rng.uniform(0.3, 0.45)  # bounce height
    else:  # grow
        x0, y0 = rng.uniform(0.4, 0.6), rng.uniform(0.4, 0.6)
        size = rng.uniform(0.06, 0.09)
    return dict(x0=x0, y0=y0, travel=travel, size=size, speed=rng.uniform(0.8, 1.0))


def sample_specs(n: int, *, seed: int, held_out: bool = False) -> list[ClipSpec]:
    """``n`` clip specs drawn from the training combinations (or the held-out ones), seeded."""
    if n <= 0:
        raise ValueError(f"n: expected a positive number of clips, got {n}")
    rng = random.Random(seed)
    combos = _combinations(held_out)
    specs = []
    for _ in range(n):
        c, s, m, b = rng.choice(combos)
        specs.append(ClipSpec(
            colour=c, shape=s, motion=m, background=b, say_background=rng.random() >= 0.25,
            texture=rng.choice(TEXTURES), texture_seed=rng.randrange(2**31), **_free_choices(rng, m),
        ))
    return specs


def held_out_prompts(n: int, *, seed: int = 0, motions: tuple[str, ...] = tuple(MOTIONS)) -> list[str]:
    """``n`` distinct held-out prompts (with their background clause) whose motion is in ``motions``."""
    combos = [cmb for cmb in _combinations(True) if cmb[2] in motions]
    if n > len(combos):
        raise ValueError(f"n: the grammar has {len(combos)} held-out combinations with these motions, asked for {n}")
    rng = random.Random(seed)
    return [prompt_of(c, s, m, b) for c, s, m, b in rng.sample(combos, n)]


def _texture(spec: ClipSpec, yy: torch.Tensor, xx: torch.Tensor) -> torch.Tensor:
    """A pattern in [0, 1] of shape (H, W)."""
    g = torch.Generator().manual_seed(spec.texture_seed)
    r = torch.rand(4, generator=g).tolist()
    if spec.texture == "stripes":
        angle = r[0] * torch.pi
        freq = 2 + 4 * r[1]
        phase = r[2] * 2 * torch.pi
        u = xx * torch.cos(torch.tensor(angle)) + yy * torch.sin(torch.tensor(angle))
        return 0.5 + 0.5 * torch.sin(2 * torch.pi * freq * u + phase)
    if spec.texture == "checker":
        cells = 3 + int(5 * r[0])
        return ((torch.floor(xx * cells + r[1]) + torch.floor(yy * cells + r[2])) % 2).float()
    grid = torch.rand(1, 1, 5, 5, generator=g).to(xx.device)
    up = torch.nn.functional.interpolate(grid, size=tuple(xx.shape), mode="bicubic", align_corners=True)[0, 0]
    return up.clamp(0, 1)


def _trajectory(spec: ClipSpec, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, y, radius) at times ``t`` in [0, 1]."""
    p = (t * spec.speed).clamp(0, 1)
    x = torch.full_like(t, spec.x0)
    y = torch.full_like(t, spec.y0)
    r = torch.full_like(t, spec.size)
    if spec.motion == "right":
        x = spec.x0 + spec.travel * p
    elif spec.motion == "left":
        x = spec.x0 - spec.travel * p
    elif spec.motion == "down":
        y = spec.y0 + spec.travel * p
    elif spec.motion == "up":
        y = spec.y0 - spec.travel * p
    elif spec.motion == "bounce":
        y = spec.y0 - spec.travel * torch.abs(torch.sin(torch.pi * 2 * t))  # two hops
    else:
        r = spec.size * (1 + 2.2 * p)
    return x, y, r


def _shape_sdf(shape: str, dx: torch.Tensor, dy: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Signed distance (in frame fractions; < 0 inside) of a shape of radius ``r``."""
    if shape == "circle":
        return torch.sqrt(dx * dx + dy * dy) - r
    if shape == "square":
        return torch.maximum(dx.abs(), dy.abs()) - 0.85 * r
    # triangle pointing up, circumradius 1.25 r: the max of three half-plane distances
    d = None
    for angle in (torch.pi / 2, torch.pi / 2 + 2 * torch.pi / 3, torch.pi / 2 + 4 * torch.pi / 3):
        n = dx * torch.cos(torch.tensor(angle)) + dy * torch.sin(torch.tensor(angle))
        d = n if d is None else torch.maximum(d, n)
    return d - 0.625 * r


def _grid(frames: int, size: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    coords = (torch.arange(size, device=device, dtype=torch.float32) + 0.5) / size
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    return yy, xx, torch.linspace(0, 1, frames, device=device)


def _alpha(spec: ClipSpec, xx: torch.Tensor, yy: torch.Tensor, t: torch.Tensor, size: int) -> torch.Tensor:
    """The shape's coverage ``(T, H, W)`` in [0, 1], with a one-pixel soft edge."""
    x, y, r = _trajectory(spec, t)
    dx = xx[None] - x[:, None, None]
    dy = yy[None] - y[:, None, None]
    sdf = _shape_sdf(spec.shape, dx, dy, r[:, None, None])
    return (0.5 - sdf * size).clamp(0, 1)


def object_alpha(specs: list[ClipSpec], *, frames: int = 17, size: int = 128, device="cpu") -> torch.Tensor:
    """The moving shape's coverage in the clips of :func:`render_clips`: ``(B, 1, frames, size, size)`` in [0, 1]."""
    if not specs:
        raise ValueError("specs: expected at least one clip spec")
    yy, xx, t = _grid(frames, size, torch.device(device))
    return torch.stack([_alpha(spec, xx, yy, t, size) for spec in specs])[:, None]


def render_clips(specs: list[ClipSpec], *, frames: int = 17, size: int = 128, device="cpu") -> torch.Tensor:
    """Render ``specs`` as a float32 ``(B, 3, frames, size, size)`` tensor in ``[-1, 1]`` on ``device``."""
    if not specs:
        raise ValueError("specs: expected at least one clip spec")
    if frames < 2 or size < 16:
        raise ValueError(f"frames, size: expected at least 2 frames of 16 px, got {frames} frames of {size} px")
    device = torch.device(device)
    yy, xx, t = _grid(frames, size, device)
    palette = {k: torch.tensor(v, device=device) for k, v in COLOURS.items()}
    out = torch.empty(len(specs), 3, frames, size, size, device=device)
    for i, spec in enumerate(specs):
        pattern = _texture(spec, yy, xx)
        bg = palette[spec.background]
        if spec.background == "black":
            back = bg[:, None, None] + 0.12 * pattern[None]
        else:
            back = bg[:, None, None] * (0.72 + 0.28 * pattern[None])
        alpha = _alpha(spec, xx, yy, t, size)
        fg = palette[spec.colour][:, None, None, None]
        clip = back[:, None] * (1 - alpha[None]) + fg * alpha[None]
        out[i] = clip * 2 - 1
    return out
