"""The tiny Wan image-to-video pipeline (Wan2.2-style, no CLIP encoder) under apply/remove; the
tiny pipelines' call-defaults file; frame rates in the model table (CPU, reference backend)."""

import dataclasses
import json

import pytest
import torch

from rotvid.pipelines import RotvidConfig, Schedule, apply, remove
from rotvid.pipelines import model_table
from rotvid.pipelines.tiny import (
    TINY_DEFAULTS_FILE,
    read_tiny_call_defaults,
    tiny_call_defaults,
    tiny_call_kwargs,
    tiny_image,
)

FAMILY = "wan-i2v"


def run(pipe, **overrides):
    kw = tiny_call_kwargs(FAMILY)
    kw.update(overrides)
    return pipe(**kw).frames


def close_to(out, ref):
    """Equal within float32 rounding of a few dozen layers (relative to the output's scale)."""
    return (out - ref).abs().max().item() <= 2e-5 * ref.abs().max().item()


def test_round_trip_is_a_wan22_style_i2v_pipeline(tiny, tiny_dir):
    pipe = tiny(FAMILY)
    assert type(pipe).__name__ == "WanImageToVideoPipeline"
    assert pipe.image_encoder is None and pipe.image_processor is None and pipe.transformer_2 is None
    z = pipe.vae.config.z_dim
    # noise latents + frame mask (one channel per frame of a temporal VAE group) + condition latents
    assert pipe.transformer.config.in_channels == z + pipe.vae.config.scale_factor_temporal + z
    assert pipe.transformer.config.out_channels == z and pipe.transformer.config.image_dim is None
    index = json.loads((tiny_dir / f"{FAMILY}-4" / "model_index.json").read_text())
    assert index["image_encoder"] == [None, None] and index["transformer"][1] == "WanTransformer3DModel"
    assert read_tiny_call_defaults(tiny_dir / f"{FAMILY}-4") == tiny_call_defaults(FAMILY)
    out = run(pipe)
    # 5 frames -> 2 latent frames; 32x32 -> 4x4 latents
    assert out.shape == (1, z, 2, 4, 4) and torch.isfinite(out).all()


def test_the_image_conditions_the_video(tiny):
    pipe = tiny(FAMILY)
    a = run(pipe)
    assert torch.equal(run(pipe), a)  # deterministic for one image and seed
    b = run(pipe, image=tiny_image(size=32, seed=99))
    assert (a - b).abs().max().item() > 1e-3 * a.abs().max().item()


@pytest.mark.parametrize("rotation", ["none", "interleaved", "half", "full"])
def test_fp16_recipe_with_rotation_and_vo_hadamard_equals_untouched(tiny, rotation):
    pipe = tiny(FAMILY)
    ref = run(pipe)
    cross = [blk.attn2.processor for blk in pipe.transformer.blocks]
    handle = apply(pipe, RotvidConfig(recipe="fp16", rotation=rotation, vo_hadamard="fused"))
    try:
        assert [blk.attn2.processor for blk in pipe.transformer.blocks] == cross  # cross-attention untouched
        out = run(pipe)
    finally:
        remove(pipe)
    assert close_to(out, ref), (out - ref).abs().max().item()
    # 3 steps x 4 blocks x (cond + uncond): every self-attention call went through rotvid
    assert handle.report.total_calls == handle.report.fp16_calls == 3 * 4 * 2


def test_vo_hadamard_is_really_fused(tiny):
    """Guard on the equality above: the fused weights differ from the originals while applied."""
    pipe = tiny(FAMILY)
    before = pipe.transformer.blocks[1].attn1.to_v.weight.detach().clone()
    apply(pipe, RotvidConfig(recipe="fp16", rotation="half", vo_hadamard="fused"))
    try:
        fused = pipe.transformer.blocks[1].attn1.to_v.weight.detach().clone()
    finally:
        remove(pipe)
    assert (fused - before).abs().max().item() > 1e-3
    assert torch.equal(pipe.transformer.blocks[1].attn1.to_v.weight, before)


def test_int4_runs_differs_fraction_matches_hand_count_and_remove_is_exact(tiny):
    pipe = tiny(FAMILY)
    steps = 5
    ref = run(pipe, num_inference_steps=steps)
    weights = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}
    sched = Schedule(fp16_first_steps=1, fp16_last_steps=2, fp16_first_blocks=1, fp16_last_blocks=1)
    handle = apply(pipe, RotvidConfig(recipe="int4", rotation="half", backend="reference", schedule=sched))
    try:
        out = run(pipe, num_inference_steps=steps)
    finally:
        remove(pipe)
    assert torch.isfinite(out).all()
    assert (out - ref).abs().max().item() > 1e-4 * ref.abs().max().item()
    # by hand: steps 1, 2 of 0..4 (first 1 and last 2 are FP16), blocks 1, 2 of 0..3, 2 forwards each
    expected = {b: (2 * 2 if b in (1, 2) else 0) for b in range(4)}
    rep = handle.report
    assert {int(k.split("/")[1]): c.quantized for k, c in rep.per_block.items()} == expected
    assert rep.total_calls == steps * 4 * 2 and rep.fallback_calls == 0
    assert rep.quantized_calls == 8
    assert rep.quantized_fraction == pytest.approx(8 / 40)
    after = pipe.transformer.state_dict()
    assert all(torch.equal(after[k], weights[k]) for k in weights)
    assert torch.equal(run(pipe, num_inference_steps=steps), ref)


def test_paper_i2v_preset_fraction(tiny):
    """paper-wan2.2-i2v: FP16 for the first 6 / last 4 steps and the first / last 2 blocks."""
    pipe = tiny(FAMILY, num_layers=6)
    steps = 12
    handle = apply(pipe, RotvidConfig(recipe="int4", backend="reference", schedule="paper-wan2.2-i2v"))
    try:
        run(pipe, num_inference_steps=steps)
    finally:
        remove(pipe)
    quantized = {(s, b) for s in range(steps) for b in range(6) if 6 <= s < steps - 4 and 2 <= b < 6 - 2}
    assert len(quantized) == 4
    got = {int(k.split("/")[1]): c.quantized for k, c in handle.report.per_block.items() if c.quantized}
    assert got == {2: 4, 3: 4}
    assert handle.report.quantized_fraction == pytest.approx(2 * len(quantized) / (steps * 6 * 2))


# ---- the call-defaults file -------------------------------------------------------------------


def test_tiny_call_defaults_per_family():
    assert tiny_call_defaults("hunyuan_video")["prompt_template"] == {"template": "{}", "crop_start": 0}
    for family in ("wan", "wan-i2v", "cogvideox", "cogvideox-2b"):
        d = tiny_call_defaults(family)
        assert d == {"max_sequence_length": 16, "height": 32, "width": 32, "num_frames": 5}
    with pytest.raises(ValueError, match="family: expected one of"):
        tiny_call_defaults("wan-v2v")
    assert "image" in tiny_call_kwargs("wan-i2v") and "image" not in tiny_call_kwargs("wan")


def test_read_tiny_call_defaults_checks_the_file(tmp_path):
    assert read_tiny_call_defaults(tmp_path) is None  # a real checkpoint's folder: no file
    f = tmp_path / TINY_DEFAULTS_FILE
    f.write_text(json.dumps({"version": 1, "call_defaults": {"height": 48}}))
    assert read_tiny_call_defaults(tmp_path) == {"height": 48}
    f.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        read_tiny_call_defaults(tmp_path)
    f.write_text(json.dumps({"version": 7, "call_defaults": {}}))
    with pytest.raises(ValueError, match="version 1, got 7"):
        read_tiny_call_defaults(tmp_path)
    f.write_text(json.dumps({"version": 1, "call_defaults": ["height", 48]}))
    with pytest.raises(ValueError, match="call_defaults: expected an object"):
        read_tiny_call_defaults(tmp_path)
    f.write_text(json.dumps({"version": 1, "call_defaults": {"prompt": "x", "generator": 3, "width": 32}}))
    with pytest.raises(ValueError, match="may not set generator, prompt"):
        read_tiny_call_defaults(tmp_path)


# ---- frame rates: one table -------------------------------------------------------------------


def test_frame_rates_in_the_model_table():
    assert model_table.frame_rate("wan") == 16
    assert model_table.frame_rate("hunyuan_video") == 24
    assert model_table.frame_rate("cogvideox") == 8
    ti2v = model_table.MODELS["wan2.2-ti2v-5b"]
    assert ti2v.fps == 24 and model_table.frame_rate("wan", ti2v.repo_id) == 24
    assert model_table.frame_rate("wan", model_table.MODELS["wan2.2-i2v-a14b"].repo_id) == 16
    assert model_table.frame_rate("wan", "someone/unknown") == 16
    assert model_table.model_entry(ti2v.repo_id) is ti2v and model_table.model_entry("x/y") is None
    with pytest.raises(ValueError, match="family: expected one of"):
        model_table.frame_rate("sora")
    with pytest.raises(ValueError, match="is a wan checkpoint, not cogvideox"):
        model_table.frame_rate("cogvideox", ti2v.repo_id)


def test_generation_reads_the_frame_rate_from_the_table(monkeypatch):
    from rotvid.eval import generation as gen

    assert not hasattr(gen, "FPS_BY_FAMILY") and not hasattr(gen, "FPS_BY_REPO")
    req = gen.GenerationRequest(prompt="x")
    monkeypatch.setitem(model_table.FAMILIES, "cogvideox",
                        dataclasses.replace(model_table.FAMILIES["cogvideox"], fps=10))
    assert gen.fps_for(None, req, "cogvideox-5b") == 10.0
    ti2v = model_table.MODELS["wan2.2-ti2v-5b"]
    monkeypatch.setitem(model_table.MODELS, "wan2.2-ti2v-5b", dataclasses.replace(ti2v, fps=30))
    assert gen.fps_for(None, req, "wan2.2-ti2v-5b") == 30.0
