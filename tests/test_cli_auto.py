"""CLI: recipe auto (issue 13) and the smoothing switches (issue 12), through CliRunner on a tiny Wan."""

import json

import torch

from rotvid.kernels.recipes import auto as recipe_table
from tests.test_cli import TINY, assert_fails, run, tiny_wan  # noqa: F401  (fixture)


def test_backends_names_the_auto_recipe_on_the_cpu():
    r = run("backends")
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("recipe"))
    assert "auto -> int4 (auto on cpu:" in line and "--recipe int4" in line


def test_backends_names_the_auto_recipe_on_a_hopper_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(recipe_table, "_device_capability", lambda device: (9, 0))
    monkeypatch.setattr("rotvid.kernels.dispatch.describe_backends", lambda: {"reference": "available"})
    r = run("backends")
    assert r.exit_code == 0, r.output
    assert "auto -> int8-fp8 (auto on sm90: no INT4 tensor cores on Hopper" in r.stdout


def test_generate_smoothing_switches_and_explicit_recipe(tiny_wan, tmp_path):  # noqa: F811
    out = tmp_path / "s.mp4"
    r = run("generate", "-p", "a cat", "--model", tiny_wan, *TINY, "--schedule", "none", "--quiet", "--out", out,
            "--recipe", "int4", "--smooth-q", "--no-smooth-v", "--no-smooth-k", "--backend", "reference")
    assert r.exit_code == 0, r.output
    side = json.loads(out.with_suffix(".json").read_text())
    cfg = side["request"]["config"]
    assert (cfg["recipe"], cfg["smooth_k"], cfg["smooth_q"], cfg["smooth_v"]) == ("int4", False, True, False)
    assert side["recipe"] == "int4" and side["recipe_reason"] == "int4 as requested"
    assert side["quantized_fraction"] == 1.0 and side["fallbacks"] == {}  # Q smoothing runs on the reference


def test_smoothing_switches_override_a_config_file_only_when_given(tmp_path):
    from rotvid.pipelines.config import RotvidConfig

    base = RotvidConfig(recipe="int8-fp8", smooth_v=False, smooth_q=True)
    none_given = dict(smooth_k=None, smooth_q=None, smooth_v=None)
    kept = RotvidConfig.from_options(base=base, **none_given)
    assert (kept.recipe, kept.smooth_k, kept.smooth_q, kept.smooth_v) == ("int8-fp8", True, True, False)
    changed = RotvidConfig.from_options(base=base, **{**none_given, "smooth_v": True, "smooth_q": False})
    assert (changed.smooth_q, changed.smooth_v) == (False, True)


def test_eval_variants_auto_runs_the_devices_recipe(tiny_wan, tmp_path):  # noqa: F811
    pf = tmp_path / "prompts.txt"
    pf.write_text("a red cat runs\n")
    out = tmp_path / "ev"
    r = run("eval", "--prompt-file", pf, "--model", tiny_wan, "--variants", "auto:half,int8-fp8:none", *TINY,
            "--schedule", "none", "--out", out)
    assert r.exit_code == 0, r.output
    assert "variant auto:half runs as int4:half (auto on cpu:" in r.stderr
    videos = out / "videos"
    assert sorted(p.name for p in videos.iterdir()) == ["int4_half", "int8-fp8_none", "reference"]
    side = json.loads((videos / "int8-fp8_none" / "000-a-red-cat-runs.json").read_text())
    assert side["recipe"] == "int8-fp8" and side["quantized_fraction"] == 1.0
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("| int8-fp8_none |")).split(" | ")
    assert row[1:4] == ["INT8/FP8", "–", "W/O"]
    assert_fails(run("eval", "--prompt-file", pf, "--model", tiny_wan, "--variants", "auto:half,int4:half", *TINY,
                     "--out", tmp_path / "ev2"), "listed more than once")


def test_calibrate_recipe_accepts_auto_and_rejects_fp16(tiny_wan, tmp_path):  # noqa: F811
    prompts = tmp_path / "p.txt"
    prompts.write_text("a cat\n")
    assert_fails(run("calibrate", "--prompt-file", prompts, "--model", tiny_wan, "--out", tmp_path / "o",
                     "--recipe", "fp16"), "--recipe: expected auto or a quantized recipe")
