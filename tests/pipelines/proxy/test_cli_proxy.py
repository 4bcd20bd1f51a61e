"""`--model proxy` through generate, eval and calibrate on the CPU (small sizes, a few steps)."""

import json

import pytest
from typer.testing import CliRunner

from rotvid.cli import app

runner = CliRunner()
SMALL = ["--height", "32", "--width", "32", "--frames", "5", "--steps", "2", "--dtype", "fp32", "--device", "cpu"]


def run(*args):
    return runner.invoke(app, [str(a) for a in args], env={"HF_HUB_OFFLINE": "1"})


def test_generate_with_the_proxy_uses_its_call_defaults(tmp_path):
    out = tmp_path / "v.mp4"
    r = run("generate", "--model", "proxy", "--prompt", "a red circle moves to the right", "--steps", "2",
            "--dtype", "fp32", "--device", "cpu", "--recipe", "fp16", "--out", out, "--quiet")
    assert r.exit_code == 0, r.output
    side = json.loads(out.with_suffix(".json").read_text())
    assert (side["frames"], side["width"], side["height"]) == (17, 128, 128)  # rotvid_tiny.json's defaults


def test_eval_and_calibrate_with_the_proxy(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red circle moves to the right\n")
    r = run("eval", "--prompt-file", prompts, "--model", "proxy", "--variants", "int4:half", *SMALL,
            "--backend", "reference", "--out", tmp_path / "ev", "--quiet")
    assert r.exit_code == 0, r.output
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert "int4_half" in json.dumps(metrics)
    r = run("calibrate", "--prompt-file", prompts, "--model", "proxy", *SMALL, "--out", tmp_path / "cal",
            "--iters", "2", "--max-tokens", "64", "--backend", "reference")
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "cal" / "summary.json").read_text())
    assert len(summary["blocks"]) == 6  # the proxy's six self-attention blocks


def test_generate_refuses_a_missing_hub_model_with_a_hint(tmp_path):
    r = run("generate", "--model", "nobody-here/no-such-model", "--prompt", "a cat", "--device", "cpu",
            "--out", tmp_path / "x.mp4")
    assert r.exit_code == 1
    assert "--model proxy" in r.stderr and "Traceback" not in r.output
