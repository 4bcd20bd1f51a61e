"""The `rotvid` command line through typer's CliRunner, on a tiny random Wan pipeline (CPU)."""

import json
import math
import os
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from rotvid.cli import app
from rotvid.eval.video_io import iter_frames, probe_video, write_video

runner = CliRunner()

# small enough for a CPU: 5 frames of 32x32, 2 denoising steps
TINY = ["--height", "32", "--width", "32", "--frames", "5", "--steps", "2", "--dtype", "fp32", "--device", "cpu",
        "--max-sequence-length", "16"]


@pytest.fixture(scope="module")
def tiny_wan(tmp_path_factory):
    from rotvid.pipelines.tiny import build_tiny_pipeline

    folder = tmp_path_factory.mktemp("tiny") / "wan"
    build_tiny_pipeline("wan", folder, num_layers=2)
    return folder


def run(*args, env=None):
    return runner.invoke(app, [str(a) for a in args], env=env)


def assert_fails(result, *fragments):
    """Exit code 1, one line on stderr starting with 'Error:' (the last one), no traceback.

    Errors found after the model is loaded may follow the "loading ..." progress line."""
    assert result.exit_code == 1, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("Error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr
    for f in fragments:
        assert f in errors[0], errors[0]
    assert "Traceback" not in result.output


def test_version_and_backends():
    r = run("version")
    assert r.exit_code == 0 and r.stdout.strip()
    r = run("backends")
    assert r.exit_code == 0 and "reference" in r.stdout


# ---- generate ---------------------------------------------------------------------------------


def test_generate_writes_playable_mp4_and_sidecar(tiny_wan, tmp_path):
    out = tmp_path / "cat.mp4"
    r = run("generate", "--prompt", "a red cat runs in the forest", "--model", tiny_wan, *TINY,
            "--schedule", "none", "--seed", "7", "--out", out)
    assert r.exit_code == 0, r.output
    assert "2/2" in r.stderr  # the progress bar counted the denoising steps
    info = probe_video(out)
    assert (info.frames, info.height, info.width, info.fps) == (5, 32, 32, 16)
    frames = list(iter_frames(out))
    assert len(frames) == 5 and frames[0].shape == (32, 32, 3)
    side = json.loads(out.with_suffix(".json").read_text())
    assert side["request"]["prompt"] == "a red cat runs in the forest" and side["request"]["seed"] == 7
    # the default recipe is auto (issue 13): the request keeps "auto", the sidecar the recipe that ran
    # on this device (the CPU: int4) and why; K and V smoothing are on by default (issue 12)
    cfg = side["request"]["config"]
    assert cfg["recipe"] == "auto" and cfg["rotation"] == "half"
    assert (cfg["smooth_k"], cfg["smooth_q"], cfg["smooth_v"]) == (True, None, None)  # Q, V: the recipe's default
    assert side["recipe"] == "int4" and side["rotation"] == "half"
    assert side["recipe_reason"].startswith("auto on cpu:") and side["run_report"]["recipe_requested"] == "auto"
    assert side["model"]["family"] == "wan" and side["model"]["pipeline"] == "WanPipeline"
    assert side["device"] == "cpu" and side["dtype"] == "float32"
    assert len(side["timing"]["per_step_seconds"]) == 2 == side["steps"]
    assert side["timing"]["total_seconds"] >= side["timing"]["denoise_seconds"] > 0
    assert side["quantized_fraction"] == 1.0 and side["fallbacks"] == {}  # schedule none: every call INT4
    assert side["run_report"]["quantized_calls"] == 2 * 2 * 2  # 2 steps x (cond + uncond) x 2 blocks
    assert set(side["versions"]) >= {"rotvid", "diffusers", "torch"}
    assert len(side["initial_noise_sha256"]) == 64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cat.json", "cat.mp4"]


def test_generate_default_schedule_is_the_papers(tiny_wan, tmp_path):
    out = tmp_path / "a.mp4"
    r = run("generate", "-p", "a dog", "--model", tiny_wan, *TINY, "--quiet", "--out", out)
    assert r.exit_code == 0, r.output
    assert r.stdout == "" and r.stderr == ""  # --quiet
    side = json.loads(out.with_suffix(".json").read_text())
    assert side["request"]["config"]["schedule"]["name"] == "paper-wan2.2-t2v"
    # 2 steps, both within the first/last 2 FP16 steps: nothing quantized, and it says so
    assert side["quantized_fraction"] == 0.0 and side["run_report"]["fp16_calls"] == 8


def test_generate_fp16_reference_and_overwrite(tiny_wan, tmp_path):
    out = tmp_path / "ref.mp4"
    args = ["generate", "-p", "a dog", "--model", tiny_wan, *TINY, "--recipe", "fp16", "--quiet", "--out", out]
    assert run(*args).exit_code == 0
    side = json.loads(out.with_suffix(".json").read_text())
    assert side["recipe"] == "fp16" and side["request"]["config"] is None and side["run_report"] is None
    before = out.read_bytes()
    assert_fails(run(*args), "already exists", "--overwrite")
    assert out.read_bytes() == before
    assert run(*args, "--overwrite").exit_code == 0


def test_generate_prompt_file_one_video_each(tiny_wan, tmp_path):
    pf = tmp_path / "prompts.txt"
    pf.write_text("a cat\n\n# a comment\na bird flies\n")
    r = run("generate", "--prompt-file", pf, "--model", tiny_wan, *TINY, "--quiet", "--out", tmp_path / "vids")
    assert r.exit_code == 0, r.output
    names = sorted(p.name for p in (tmp_path / "vids").iterdir())
    assert names == ["000-a-cat.json", "000-a-cat.mp4", "001-a-bird-flies.json", "001-a-bird-flies.mp4"]
    assert probe_video(tmp_path / "vids" / "001-a-bird-flies.mp4").frames == 5
    # resume: after an interruption (here: the second video gone) the same command keeps the finished one
    kept = (tmp_path / "vids" / "000-a-cat.mp4").stat().st_mtime_ns
    (tmp_path / "vids" / "001-a-bird-flies.mp4").unlink()
    r = run("generate", "--prompt-file", pf, "--model", tiny_wan, *TINY, "--out", tmp_path / "vids")
    assert r.exit_code == 0, r.output
    assert "kept " in r.stderr and "000-a-cat.mp4" in r.stderr
    assert (tmp_path / "vids" / "000-a-cat.mp4").stat().st_mtime_ns == kept
    assert (tmp_path / "vids" / "001-a-bird-flies.mp4").is_file()
    # another request into the same folder is refused, not mixed in
    r = run("generate", "--prompt-file", pf, "--model", tiny_wan, *TINY, "--seed", "7", "--out", tmp_path / "vids")
    assert_fails(r, "000-a-cat.mp4", "different request", "seed")


def test_generate_bad_inputs(tiny_wan, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n# only a comment\n")
    assert_fails(run("generate", "--prompt-file", empty, "--model", tiny_wan), "has no prompts")
    assert_fails(run("generate", "--prompt-file", tmp_path / "nope.txt"), "nope.txt does not exist")
    assert_fails(run("generate", "-p", "x", "--model", "no-such-model", "--out", tmp_path / "x.mp4"),
                 "model: 'no-such-model' is not a folder")
    assert_fails(run("generate", "-p", "x", "--model", tmp_path, "--out", tmp_path / "x.mp4"), "no model_index.json")
    assert_fails(run("generate", "-p", "x", "--prompt-file", empty), "not both")
    assert_fails(run("generate"), "--prompt")
    assert_fails(run("generate", "-p", "x", "--image", tmp_path / "no.png"), "no.png does not exist")
    assert_fails(run("generate", "-p", "x", "--recipe", "int3", "--out", tmp_path / "x.mp4"), "recipe")
    assert_fails(run("generate", "-p", "x", "--schedule", "fastest", "--out", tmp_path / "x.mp4"),
                 "neither a preset")
    assert_fails(run("generate", "-p", "x", "--steps", "0", "--out", tmp_path / "x.mp4"), "--steps")
    assert_fails(run("generate", "-p", "x", "--out", tmp_path / "x.avi"), "ending in .mp4")
    assert_fails(run("generate", "-p", "x", "--dtype", "int8", "--out", tmp_path / "x.mp4"), "--dtype")
    assert_fails(run("generate", "-p", "x", "--device", "gpu0", "--out", tmp_path / "x.mp4"), "--device")
    pf = tmp_path / "two.txt"
    pf.write_text("a\nb\n")
    assert_fails(run("generate", "--prompt-file", pf, "--out", tmp_path / "x.mp4"), "expected a folder")
    # a text-to-video model given an image: caught from its config, before loading; one line
    img = tmp_path / "img.png"
    from PIL import Image

    Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(img)
    assert_fails(run("generate", "-p", "x", "--model", tiny_wan, *TINY, "--image", img, "--out", tmp_path / "i.mp4"),
                 "text-to-video pipeline and takes no image")
    assert not (tmp_path / "x.mp4").exists() and not (tmp_path / "i.mp4").exists()


# ---- eval on existing videos ------------------------------------------------------------------


def _video(rng, frames=4, h=32, w=48):
    y, x = np.mgrid[0:h, 0:w]
    ph = rng.uniform(0, 6.0, 3)
    return np.stack([np.stack([127 + 90 * np.sin(x / 7 + y / 11 + ph[c] + 0.4 * f) for c in range(3)], -1)
                     for f in range(frames)]).astype(np.uint8)


def test_eval_video_against_itself(tmp_path):
    v = _video(np.random.default_rng(0))
    write_video(tmp_path / "a.mp4", v, 16)
    r = run("eval", tmp_path / "a.mp4", tmp_path / "a.mp4", "--out", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| a |")]
    # the reference row (no sidecar: its datatype is unknown) and the candidate row
    assert rows[0].split(" | ")[1:4] == ["–", "–", "–"] and len(rows) == 2
    assert rows[1].split(" | ")[4:8] == ["1.0000", "0.00", "1.0000", "∞"]
    data = json.loads((tmp_path / "rep" / "metrics.json").read_text())
    mean = data["variants"][0]["mean"]
    assert mean["psnr"] == "inf" and mean["mse"] == 0.0
    assert mean["ssim"] == pytest.approx(1.0, abs=1e-12) and mean["cosine"] == pytest.approx(1.0, abs=1e-12)
    for f in ("report.md", "metrics.csv", "psnr_per_frame.png", "comparison.png"):
        assert (tmp_path / "rep" / f).is_file()


def test_eval_two_known_videos_gives_the_expected_numbers(tmp_path):
    from skimage.metrics import structural_similarity

    rng = np.random.default_rng(1)
    ref = _video(rng)
    cand = np.clip(ref.astype(int) + rng.integers(-12, 13, ref.shape), 0, 255).astype(np.uint8)
    write_video(tmp_path / "ref" / "clip.mp4", ref, 16)
    write_video(tmp_path / "noisy" / "clip.mp4", cand, 16)
    r = run("eval", tmp_path / "ref", tmp_path / "noisy", "--out", tmp_path / "rep", "--quiet")
    assert r.exit_code == 0, r.output
    # expected numbers, computed here from the decoded frames with plain numpy
    a = np.stack(list(iter_frames(tmp_path / "ref" / "clip.mp4"))).astype(np.float64)
    b = np.stack(list(iter_frames(tmp_path / "noisy" / "clip.mp4"))).astype(np.float64)
    mse = np.mean((a - b) ** 2)
    per_frame = [10 * math.log10(255**2 / np.mean((a[i] - b[i]) ** 2)) for i in range(len(a))]
    ssim = np.mean([structural_similarity(a[i].astype(np.uint8), b[i].astype(np.uint8), channel_axis=-1,
                                          data_range=255) for i in range(len(a))])
    got = json.loads((tmp_path / "rep" / "metrics.json").read_text())["variants"][0]
    assert got["label"] == "noisy"
    video = got["videos"][0]
    assert video["mse"] == pytest.approx(mse, rel=1e-12)
    assert video["psnr"] == pytest.approx(10 * math.log10(255**2 / mse), rel=1e-12)
    assert video["psnr_per_frame"] == pytest.approx(per_frame, rel=1e-12)
    assert video["cosine"] == pytest.approx(np.sum(a * b) / math.sqrt(np.sum(a * a) * np.sum(b * b)), rel=1e-12)
    assert video["ssim"] == pytest.approx(ssim, rel=1e-12)
    assert 0.5 < video["ssim"] < 0.999 and 20 < video["psnr"] < 40  # a real difference, not a trivial one


def test_eval_bad_inputs(tmp_path):
    rng = np.random.default_rng(2)
    write_video(tmp_path / "a.mp4", _video(rng), 16)
    write_video(tmp_path / "small.mp4", _video(rng, h=16, w=48), 16)
    write_video(tmp_path / "short.mp4", _video(rng, frames=3), 16)
    (tmp_path / "junk.mp4").write_bytes(rng.integers(0, 256, 2048, dtype=np.uint8).tobytes())
    rep = ["--out", tmp_path / "rep"]
    assert_fails(run("eval", tmp_path / "missing.mp4", tmp_path / "a.mp4", *rep), "missing.mp4 does not exist")
    assert_fails(run("eval", tmp_path / "a.mp4", tmp_path / "small.mp4", *rep), "is 48x16", "is 48x32")
    assert_fails(run("eval", tmp_path / "a.mp4", tmp_path / "short.mp4", *rep), "has 3 frames", "has 4")
    assert_fails(run("eval", tmp_path / "a.mp4", tmp_path / "junk.mp4", *rep), "cannot be read as a video")
    assert_fails(run("eval", tmp_path / "a.mp4", *rep), "CANDIDATE")
    assert_fails(run("eval", *rep), "REFERENCE")
    assert_fails(run("eval", tmp_path / "a.mp4", tmp_path / "a.mp4", "--variants", "int4:half", *rep), "not both")
    assert not (tmp_path / "rep").exists()
    assert run("eval", tmp_path / "a.mp4", tmp_path / "a.mp4", *rep, "--quiet").exit_code == 0
    assert_fails(run("eval", tmp_path / "a.mp4", tmp_path / "a.mp4", *rep), "already holds", "--overwrite")
    assert run("eval", tmp_path / "a.mp4", tmp_path / "a.mp4", *rep, "--overwrite", "--quiet").exit_code == 0


def test_eval_vbench_inputs_checked_before_any_work(tmp_path):
    write_video(tmp_path / "a.mp4", _video(np.random.default_rng(3)), 16)
    base = ["eval", tmp_path / "a.mp4", tmp_path / "a.mp4", "--out", tmp_path / "rep"]
    env = {"VBENCH_CACHE_DIR": str(tmp_path / "cache"), "ROTVID_VBENCH_PYTHON": None}
    assert_fails(run(*base, "--vbench", "subject_consistency,imaging_quality", "--vbench-python", sys.executable,
                     env=env), "VBench weights missing", "dino_vitbase16_pretrain.pth", "musiq_spaq")
    assert_fails(run(*base, "--vbench", "temporal_flickering", "--vbench-python", tmp_path / "no" / "python", env=env),
                 "is not an executable file", "rotvid vbench-setup")
    assert_fails(run(*base, "--vbench", "color", "--vbench-python", sys.executable, env=env), "prompt suite")
    assert not (tmp_path / "rep").exists()


# ---- eval that generates ----------------------------------------------------------------------


def test_eval_generates_reference_and_variants_then_resumes(tiny_wan, tmp_path, monkeypatch):
    pf = tmp_path / "prompts.txt"
    pf.write_text("a red cat runs\na blue bird flies\n")
    out = tmp_path / "ev"
    args = ["eval", "--prompt-file", pf, "--model", tiny_wan, "--variants", "int4:half,int4-sym-p:none",
            *TINY, "--schedule", "none", "--out", out]
    r = run(*args)
    assert r.exit_code == 0, r.output
    videos = out / "videos"
    assert sorted(p.name for p in videos.iterdir()) == ["int4-sym-p_none", "int4_half", "reference"]
    sides = {d.name: json.loads((d / "000-a-red-cat-runs.json").read_text()) for d in videos.iterdir()}
    # same seed and the same initial noise for the reference and every variant
    assert len({s["initial_noise_sha256"] for s in sides.values()}) == 1
    assert sides["reference"]["recipe"] == "fp16" and sides["int4_half"]["quantized_fraction"] == 1.0
    table = [ln for ln in r.stdout.splitlines() if ln.startswith("| ")]
    # the reference row names the dtype that ran (--dtype fp32 here), not "FP16" (issue 32)
    assert table[2].startswith("| FP32 (reference) | FP32 | – | – | 1.0000 | 0.00 | 1.0000 | ∞ |")
    half = next(ln for ln in table if ln.startswith("| int4_half |")).split(" | ")
    assert half[1:4] == ["INT4", "✓", "Half"] and half[8] == "100%"
    sym = next(ln for ln in table if ln.startswith("| int4-sym-p_none |")).split(" | ")
    assert sym[1:4] == ["INT4", "×", "W/O"]
    data = json.loads((out / "metrics.json").read_text())
    for v in data["variants"]:
        assert v["mean"]["psnr"] != "inf" and v["mean"]["ssim"] < 1.0  # INT4 attention changed the video
    # an interrupted run: one video lost (its sidecar left behind); only that one is made again
    mtimes = {p: p.stat().st_mtime_ns for p in videos.rglob("*.mp4")}
    lost = videos / "int4_half" / "001-a-blue-bird-flies.mp4"
    lost.unlink()
    r = run(*args, "--quiet")
    assert r.exit_code == 0, r.output
    again = {p: p.stat().st_mtime_ns for p in videos.rglob("*.mp4")}
    assert {p for p in again if again[p] != mtimes.get(p)} == {lost}
    # resume: nothing is generated again and the model is not even loaded
    mtimes = again
    import rotvid.cli.pipeline

    def no_load(*a, **k):
        raise AssertionError("the pipeline was loaded although every video exists")

    monkeypatch.setattr(rotvid.cli.pipeline, "load", no_load)
    r2 = run(*args, "--quiet")
    assert r2.exit_code == 0, r2.output
    assert {p: p.stat().st_mtime_ns for p in videos.rglob("*.mp4")} == mtimes
    # a different request on the same folder is refused, not silently mixed
    assert_fails(run(*[a if a != "2" else "3" for a in args]), "different request", "steps")


def test_eval_generating_bad_inputs(tiny_wan, tmp_path):
    pf = tmp_path / "p.txt"
    pf.write_text("a cat\n")
    empty = tmp_path / "e.txt"
    empty.write_text("")
    out = ["--out", tmp_path / "ev"]
    assert_fails(run("eval", "--prompt-file", pf, "--variants", "int4:spiral", *out), "unknown rotation 'spiral'")
    assert_fails(run("eval", "--prompt-file", empty, "--variants", "int4:half", *out), "has no prompts")
    assert_fails(run("eval", "--prompt-file", pf, *out), "--variants")
    assert_fails(run("eval", "--variants", "int4:half", *out), "--prompt-file")
    assert_fails(run("eval", "--prompt-file", pf, "--variants", "int4:half", "--model", "nope-model", *TINY, *out),
                 "model: 'nope-model'")
    assert not (tmp_path / "ev").exists()


def test_vbench_setup_dry_run(tmp_path):
    r = run("vbench-setup", "--venv", tmp_path / "venv", "--dry-run")
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert lines[0].endswith(f"-m venv {tmp_path / 'venv'}") and "vbench==0.1.5" in lines[1]
    assert not (tmp_path / "venv").exists()


@pytest.mark.slow
def test_eval_with_real_vbench_dimension(tmp_path):
    """`--vbench temporal_flickering` through the VBench environment (skipped when there is none)."""
    from tests.eval.test_vbench_runner import flicker_score, vbench_python_or_skip

    python = vbench_python_or_skip()
    rng = np.random.default_rng(4)
    write_video(tmp_path / "ref" / "clip.mp4", _video(rng), 16)
    write_video(tmp_path / "cand" / "clip.mp4", _video(rng), 16)
    r = run("eval", tmp_path / "ref", tmp_path / "cand", "--out", tmp_path / "rep", "--vbench", "temporal_flickering",
            "--vbench-python", python, "--vbench-device", "cpu", "--quiet",
            env={"VBENCH_CACHE_DIR": str(tmp_path / "cache")})
    assert r.exit_code == 0, r.output
    data = json.loads((tmp_path / "rep" / "metrics.json").read_text())
    assert data["reference"]["vbench"]["temporal_flickering"] == pytest.approx(
        flicker_score(tmp_path / "ref" / "clip.mp4"), abs=2e-3)
    assert data["variants"][0]["vbench"]["temporal_flickering"] == pytest.approx(
        flicker_score(tmp_path / "cand" / "clip.mp4"), abs=2e-3)
    assert "temporal_flickering ↑" in (tmp_path / "rep" / "report.md").read_text()
    assert os.path.isfile(tmp_path / "rep" / "metrics.csv")


def test_help_shows_the_documented_defaults():
    """Help texts say their defaults in parentheses: rich markup would eat a "[default: ...]" as a tag."""
    r = CliRunner().invoke(app, ["generate", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    assert "(default: the pipeline's, Wan: 50)" in r.output and "(default: half)" in r.output


def test_device_index_past_the_gpus_is_refused_by_name(monkeypatch):
    import torch

    from rotvid.cli.options import check_dtype_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_dtype_device("bf16", "cuda:1")
    with pytest.raises(ValueError, match=r"--device cuda:2: this machine has 2 CUDA GPU\(s\) \(cuda:0 \.\. cuda:1\)"):
        check_dtype_device("bf16", "cuda:2")


def test_missing_learned_rotation_file_is_refused_before_loading(tiny_wan, tmp_path):
    r = run("generate", "-p", "a dog", "--model", tiny_wan, *TINY, "--rotation", "learned:nope.safetensors",
            "--out", tmp_path / "a.mp4")
    assert_fails(r, "--rotation learned:nope.safetensors", "does not exist")
    assert "loading" not in r.stderr
    (tmp_path / "p.txt").write_text("a dog\n")
    r = run("eval", "--prompt-file", tmp_path / "p.txt", "--model", tiny_wan, *TINY,
            "--variants", "int4:learned:nope.safetensors", "--out", tmp_path / "e")
    assert_fails(r, "--variants", "nope.safetensors", "does not exist")
    assert not (tmp_path / "e").exists()  # nothing generated first


def test_eval_on_existing_videos_refuses_generation_options(tmp_path):
    """They would be ignored (nothing is generated): each is refused by name, before anything is measured."""
    rng = np.random.default_rng(2)
    write_video(tmp_path / "ref" / "clip.mp4", _video(rng), 16)
    write_video(tmp_path / "cand" / "clip.mp4", _video(rng), 16)
    for opt in (["--steps", "4"], ["--model", "wan2.1-t2v-14b"], ["--no-smooth-q"], ["--device", "cpu"],
                ["--seed", "3"]):
        r = run("eval", tmp_path / "ref", tmp_path / "cand", *opt, "--out", tmp_path / "rep")
        assert_fails(r, opt[0], "only with --prompt-file/--variants")
    assert not (tmp_path / "rep").exists()
    r = run("eval", tmp_path / "ref", tmp_path / "cand", "--out", tmp_path / "rep", "--quiet")  # defaults: fine
    assert r.exit_code == 0, r.output
