"""`rotvid generate` on the tiny image-to-video Wan pipeline and the tiny HunyuanVideo pipeline
(CliRunner, CPU), and the tiny pipelines' call-defaults file as `call_kwargs` merges it."""

import hashlib
import json
import shutil

import numpy as np
import pytest
from PIL import Image

from rotvid.eval import generation as gen
from rotvid.eval.video_io import iter_frames, probe_video
from rotvid.pipelines.tiny import TINY_DEFAULTS_FILE, build_tiny_pipeline
from tests.test_cli import TINY, assert_fails, run, tiny_wan  # noqa: F401  (tiny_wan: a fixture)


@pytest.fixture(scope="module")
def tiny_i2v(tmp_path_factory):
    """A tiny Wan image-to-video pipeline folder (2 blocks), built once per test module."""
    folder = tmp_path_factory.mktemp("tiny-i2v") / "wan-i2v"
    build_tiny_pipeline("wan-i2v", folder, num_layers=2)
    return folder


@pytest.fixture(scope="module")
def tiny_hunyuan(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-hy") / "hunyuan"
    build_tiny_pipeline("hunyuan_video", folder, num_layers=2)
    return folder


def random_image(path, seed):
    """A 32x32 RGB image of uniform random pixels (``seed``) saved at ``path``; returns ``path``."""
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(path)
    return path


def _frames(path):
    return np.stack(list(iter_frames(path))).astype(np.int32)


# ---- image-to-video ---------------------------------------------------------------------------


def test_generate_image_to_video_writes_playable_mp4_and_records_the_image(tiny_i2v, tmp_path):
    img = random_image(tmp_path / "first.png", 0)
    out = tmp_path / "i2v.mp4"
    r = run("generate", "-p", "a red cat runs", "--image", img, "--model", tiny_i2v, *TINY, "--schedule", "none",
            "--seed", "3", "--out", out)
    assert r.exit_code == 0, r.output
    info = probe_video(out)
    assert (info.frames, info.height, info.width, info.fps) == (5, 32, 32, 16)  # Wan: 16 fps
    frames = _frames(out)
    assert frames.shape == (5, 32, 32, 3)
    side = json.loads(out.with_suffix(".json").read_text())
    assert side["request"]["image"] == str(img)
    assert side["image_sha256"] == hashlib.sha256(img.read_bytes()).hexdigest()
    assert side["model"]["pipeline"] == "WanImageToVideoPipeline"
    assert side["model"]["family"] == "wan" and side["model"]["task"] == "i2v"
    assert side["recipe"] == "int4" and side["quantized_fraction"] == 1.0 and side["fallbacks"] == {}
    assert side["run_report"]["quantized_calls"] == 2 * 2 * 2  # 2 steps x (cond + uncond) x 2 blocks

    # another image, same seed: another video (the image really conditions the run)
    other = tmp_path / "other.mp4"
    r = run("generate", "-p", "a red cat runs", "--image", random_image(tmp_path / "second.png", 1),
            "--model", tiny_i2v, *TINY, "--schedule", "none", "--seed", "3", "--quiet", "--out", other)
    assert r.exit_code == 0, r.output
    assert np.abs(_frames(other) - frames).max() > 8


def test_generate_image_to_video_default_schedule_is_the_papers_i2v(tiny_i2v, tmp_path):
    out = tmp_path / "a.mp4"
    r = run("generate", "-p", "a dog", "--image", random_image(tmp_path / "im.png", 2), "--model", tiny_i2v, *TINY,
            "--quiet", "--out", out)
    assert r.exit_code == 0, r.output
    side = json.loads(out.with_suffix(".json").read_text())
    assert side["request"]["config"]["schedule"]["name"] == "paper-wan2.2-i2v"
    assert side["quantized_fraction"] == 0.0  # 2 steps: all within the first 6 FP16 steps


def test_image_flag_must_match_the_pipeline(tiny_i2v, tiny_wan, tmp_path):  # noqa: F811
    img = random_image(tmp_path / "img.png", 3)
    # both messages are call_kwargs' own
    assert_fails(run("generate", "-p", "x", "--model", tiny_wan, *TINY, "--image", img, "--out", tmp_path / "t.mp4"),
                 "--image: WanPipeline is a text-to-video pipeline and takes no image")
    assert_fails(run("generate", "-p", "x", "--model", tiny_i2v, *TINY, "--out", tmp_path / "i.mp4"),
                 "--image: WanImageToVideoPipeline is an image-to-video pipeline; pass --image FILE")
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png")
    assert_fails(run("generate", "-p", "x", "--model", tiny_i2v, *TINY, "--image", bad, "--out", tmp_path / "b.mp4"),
                 "cannot be read as an image")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.png", "img.png"]


def test_missing_pipeline_requirement_is_one_clear_error(tiny_i2v, tmp_path, monkeypatch):
    from rotvid.pipelines import model_table

    monkeypatch.setitem(model_table.PIPELINE_REQUIREMENTS, "WanImageToVideoPipeline", ("rotvid_no_such_pkg",))
    assert_fails(run("generate", "-p", "x", "--image", random_image(tmp_path / "i.png", 4), "--model", tiny_i2v, *TINY,
                     "--out", tmp_path / "r.mp4"),
                 "WanImageToVideoPipeline needs the Python package(s) rotvid_no_such_pkg", "pip install")
    assert not (tmp_path / "r.mp4").exists()


# ---- HunyuanVideo from the CLI: the folder's call defaults -------------------------------------


def test_generate_hunyuan_video_with_the_folders_call_defaults(tiny_hunyuan, tmp_path):
    from rotvid.pipelines.loading import load_pipeline

    # fail fast rather than denoise 129 frames of 720x1280 should the defaults not be merged
    kw = gen.call_kwargs(load_pipeline(tiny_hunyuan, dtype="fp32"), gen.GenerationRequest(prompt="x"))
    assert (kw["height"], kw["width"], kw["num_frames"]) == (32, 32, 5)
    out = tmp_path / "hy.mp4"
    # no size, frame or text-length options: they (and the prompt template) come from rotvid_tiny.json
    r = run("generate", "-p", "a bird flies over the sea", "--model", tiny_hunyuan, "--steps", "2", "--dtype", "fp32",
            "--device", "cpu", "--schedule", "none", "--quiet", "--out", out)
    assert r.exit_code == 0, r.output
    info = probe_video(out)
    assert (info.frames, info.height, info.width, info.fps) == (5, 32, 32, 24)  # HunyuanVideo: 24 fps
    assert _frames(out).shape == (5, 32, 32, 3)
    side = json.loads(out.with_suffix(".json").read_text())
    assert side["model"]["pipeline"] == "HunyuanVideoPipeline" and side["model"]["family"] == "hunyuan_video"
    # 2 steps x (1 double-stream + 1 single-stream block) x one forward per step (embedded guidance)
    assert side["run_report"]["quantized_calls"] == 2 * 2 and side["quantized_fraction"] == 1.0
    assert side["image_sha256"] is None
    assert side["call_defaults"]["prompt_template"] == {"template": "{}", "crop_start": 0}
    assert side["call_defaults"]["max_sequence_length"] == 16


def test_call_kwargs_merges_the_folders_defaults_under_the_request(tiny_hunyuan, tmp_path):
    from rotvid.pipelines.loading import load_pipeline

    pipe = load_pipeline(tiny_hunyuan, dtype="fp32")
    kw = gen.call_kwargs(pipe, gen.GenerationRequest(prompt="a cat", height=48, max_sequence_length=12))
    assert kw["prompt_template"] == {"template": "{}", "crop_start": 0}
    assert (kw["height"], kw["width"], kw["num_frames"], kw["max_sequence_length"]) == (48, 32, 5, 12)
    # a copy of the folder without the file: the pipeline's own defaults (what a real checkpoint gets)
    bare = tmp_path / "bare"
    shutil.copytree(tiny_hunyuan, bare)
    (bare / TINY_DEFAULTS_FILE).unlink()
    kw = gen.call_kwargs(load_pipeline(bare, dtype="fp32"), gen.GenerationRequest(prompt="a cat"))
    assert not {"prompt_template", "height", "width", "num_frames", "max_sequence_length"} & set(kw)
    # a defaults file naming an argument the pipeline does not take: one clear error
    (bare / TINY_DEFAULTS_FILE).write_text(json.dumps({"version": 1, "call_defaults": {"use_dynamic_cfg": False}}))
    with pytest.raises(ValueError, match=r"use_dynamic_cfg \(in the folder's rotvid_tiny.json\): "
                                         "HunyuanVideoPipeline does not take"):
        gen.call_kwargs(load_pipeline(bare, dtype="fp32"), gen.GenerationRequest(prompt="a cat"))
