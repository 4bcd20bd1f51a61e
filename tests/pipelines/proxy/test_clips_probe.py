"""The procedural clips, the prompt grammar and the probe (true positives and true negatives)."""

import numpy as np
import pytest
import torch

from rotvid.pipelines.proxy.clips import (
    BACKGROUND_COLOURS, DIRECTIONS, MOTIONS, OBJECT_COLOURS, SHAPES, ClipSpec, held_out_prompts, is_held_out,
    parse_prompt, prompt_of, render_clips, sample_specs,
)
from rotvid.pipelines.proxy.probe import probe_clip

OPPOSITE = {"left": "right", "right": "left", "up": "down", "down": "up"}


def frames_of(clip: torch.Tensor) -> np.ndarray:
    """(3, T, H, W) in [-1, 1] -> (T, H, W, 3) in [0, 1], as a pipeline's np output."""
    return ((clip + 1) / 2).permute(1, 2, 3, 0).numpy()


def test_grammar_round_trip_and_split():
    assert prompt_of("red", "circle", "right", "blue") == "a red circle moves to the right on a blue background"
    for c, s, m, b in [("red", "circle", "right", None), ("white", "triangle", "grow", "black")]:
        assert parse_prompt(prompt_of(c, s, m, b)) == (c, s, m, b)
    with pytest.raises(ValueError, match="prompt: expected"):
        parse_prompt("a red cat runs")
    combos = [(c, s, m, b) for c in OBJECT_COLOURS for s in SHAPES for m in MOTIONS for b in BACKGROUND_COLOURS
              if c != b]
    held = [cmb for cmb in combos if is_held_out(*cmb)]
    assert 0.05 < len(held) / len(combos) < 0.2
    # training clips never use a held-out combination, and every held-out prompt is one
    for spec in sample_specs(300, seed=0):
        assert not is_held_out(spec.colour, spec.shape, spec.motion, spec.background) and spec.colour != spec.background
    for p in held_out_prompts(20, seed=1):
        c, s, m, b = parse_prompt(p)
        assert is_held_out(c, s, m, b)


def test_sampling_and_rendering_are_seeded():
    a, b = sample_specs(8, seed=3), sample_specs(8, seed=3)
    assert a == b and a != sample_specs(8, seed=4)
    x = render_clips(a, frames=5, size=32)
    assert x.shape == (8, 3, 5, 32, 32) and x.min() >= -1 and x.max() <= 1
    assert torch.equal(x, render_clips(b, frames=5, size=32))
    with pytest.raises(ValueError, match="frames, size"):
        render_clips(a, frames=1, size=32)


def test_object_alpha_is_the_shape_in_the_rendered_clips():
    from rotvid.pipelines.proxy.clips import COLOURS, object_alpha

    specs = sample_specs(6, seed=21)
    clips, alpha = render_clips(specs, frames=5, size=48), object_alpha(specs, frames=5, size=48)
    assert alpha.shape == (6, 1, 5, 48, 48) and alpha.min() >= 0 and alpha.max() <= 1
    for spec, clip, a in zip(specs, clips, alpha):
        inside = a[0] == 1
        assert 0.003 < inside.float().mean() < 0.5  # a shape, not the whole frame
        colour = torch.tensor(COLOURS[spec.colour]).view(3, 1) * 2 - 1
        torch.testing.assert_close(clip[:, inside], colour.expand(3, int(inside.sum())))
        outside = a[0] == 0
        assert (clip[:, outside] - colour).abs().amax(0).min() > 0.05  # the background is never the shape's colour
    with pytest.raises(ValueError, match="specs"):
        object_alpha([])


@pytest.mark.parametrize("size,frames", [(64, 9), (96, 17)])
def test_probe_passes_the_procedural_clips_with_their_prompts(size, frames):
    specs = sample_specs(36, seed=size)
    clips = render_clips(specs, frames=frames, size=size)
    results = [probe_clip(frames_of(c), s.prompt) for s, c in zip(specs, clips)]
    assert all(r.passed for r in results), [r for r in results if not r.passed]
    assert all(r.background == s.background for s, r in zip(specs, results))


def test_probe_rejects_a_wrong_colour_or_direction():
    specs = [s for s in sample_specs(60, seed=11) if s.motion in DIRECTIONS][:12]
    clips = render_clips(specs, frames=9, size=64)
    for spec, clip in zip(specs, clips):
        frames = frames_of(clip)
        wrong_colour = next(c for c in OBJECT_COLOURS if c not in (spec.colour, spec.background))
        r = probe_clip(frames, prompt_of(wrong_colour, spec.shape, spec.motion, spec.background))
        assert not r.passed and not r.colour_ok and r.motion_ok
        r = probe_clip(frames, prompt_of(spec.colour, spec.shape, OPPOSITE[spec.motion], spec.background))
        assert not r.passed and r.colour_ok and not r.motion_ok
        # played backwards, the clip shows the opposite motion
        assert not probe_clip(frames[::-1], spec.prompt).passed


def test_probe_rejects_still_and_empty_clips():
    spec = ClipSpec("red", "circle", "right", "blue", speed=0.0)  # never moves
    frames = frames_of(render_clips([spec], frames=9, size=64)[0])
    r = probe_clip(frames, spec.prompt)
    assert r.colour_ok and not r.motion_ok
    assert not probe_clip(frames, prompt_of("red", "circle", "grow", "blue")).passed
    assert not probe_clip(frames, prompt_of("red", "circle", "bounce", "blue")).passed
    flat = np.full((9, 32, 32, 3), 0.5, dtype=np.float32)  # grey: no named colour at all
    assert not probe_clip(flat, spec.prompt).passed
    with pytest.raises(ValueError, match="frames: expected"):
        probe_clip(flat[0], spec.prompt)
