"""--sparsity, --dense-first-steps and --dense-blocks through CliRunner on a tiny Wan pipeline: generate's sidecar,
eval's sparse variants against FP16 and their dense twin, calibrate's tau per block, and the errors."""

import json

import pytest

from rotvid.kernels.sparsity.cost import relative_attention_time
from tests.test_cli import TINY, assert_fails, run, tiny_wan  # noqa: F401  (fixture)

# 9 frames of 128x128: 3 latent frames of 64 tokens, two 128-token map blocks
BIG = [a for a in TINY]
for flag, value in (("--height", "128"), ("--width", "128"), ("--frames", "9")):
    BIG[BIG.index(flag) + 1] = value
BAND_ONLY = "radial:band=0,window=0"  # keeps the diagonal only here: density 0.5
QUANTIZED = ["--recipe", "int8-fp8", "--backend", "reference", "--schedule", "none"]


def test_generate_with_a_block_map_reports_its_density_per_block_and_step(tiny_wan, tmp_path):  # noqa: F811
    out = tmp_path / "v.mp4"
    r = run("generate", "-p", "a red cat", "--model", tiny_wan, *BIG, *QUANTIZED, "--sparsity", BAND_ONLY,
            "--dense-first-steps", "1", "--dense-blocks", "-1", "--out", out)
    assert r.exit_code == 0, r.output
    side = json.loads(out.with_suffix(".json").read_text())
    assert side["sparsity"] == BAND_ONLY and side["mean_density"] == 0.5 and side["mean_dropped_mass"] is None
    config = side["request"]["config"]
    assert config["sparsity"]["kind"] == "radial" and config["schedule"]["dense_first_steps"] == 1
    assert config["schedule"]["dense_blocks"] == [-1]
    sparsity = side["run_report"]["sparsity"]
    # 2 steps x 2 blocks: step 0 dense by the rule, block 1 (the last) dense: one sparse cell, cond + uncond
    assert [(c["site"], c["step"], c["calls"], c["density"]) for c in sparsity["per_block_step"]] == [
        ("transformer/0", 1, 2, 0.5)]
    assert sparsity["dense_quantized_calls"] == 6 and "not estimated" in sparsity["dropped_mass"]


def test_sparsity_options_bad_input(tiny_wan, tmp_path):  # noqa: F811
    base = ["generate", "-p", "a cat", "--model", tiny_wan, *TINY, "--out", tmp_path / "x.mp4"]
    assert_fails(run(*base, "--sparsity", "bogus"), "sparsity (--sparsity): unknown kind 'bogus'")
    assert_fails(run(*base, "--sparsity", "topp:2"), "sparsity (--sparsity): topp tau must be in (0, 1]")
    assert_fails(run(*base, "--dense-first-steps", "2"), "--dense-first-steps: sparsity rules without a block map")
    assert_fails(run(*base, "--sparsity", "topp:0.9", "--dense-blocks", "0,x"), "--dense-blocks: expected")
    assert_fails(run(*base, "--sparsity", "topp:0.9", "--dense-first-steps", "-1"), "--dense-first-steps")
    assert_fails(run(*base, "--recipe", "fp16", "--sparsity", "topp:0.9"), "--sparsity topp:0.9: --recipe fp16")
    assert_fails(run(*base, "--recipe", "fp16", "--rotation", "half", "--sparsity", "radial"),
                 "--sparsity radial: --recipe fp16 runs the model's own attention")
    prompts = tmp_path / "p.txt"
    prompts.write_text("a cat\n")
    ev = ["eval", "--prompt-file", prompts, "--model", tiny_wan, *TINY, "--out", tmp_path / "ev"]
    assert_fails(run(*ev, "--variants", "int4:half:bogus"), "--variants: unknown sparsity 'bogus' in 'int4:half:bogus'")
    assert_fails(run(*ev, "--variants", "int4:half:topp"), "'int4:half:topp'", "needs tau")
    assert_fails(run(*ev, "--variants", "fp16:none:topp0.9"), "'fp16:none:topp0.9' asks for a block map")
    assert_fails(run(*ev, "--variants", "int4:half,int4:half:none"), "listed more than once: int4_half")
    assert_fails(run(*ev, "--variants", "int4:half", "--dense-first-steps", "1"), "no variant has a block map")
    assert not (tmp_path / "ev").exists()  # all refused before any video
    # eval on existing videos generates nothing: a generation option is refused by name
    assert_fails(run("eval", tmp_path, tmp_path, "--sparsity", "topp:0.9"), "--sparsity: only with --prompt-file")


def test_eval_compares_a_sparse_variant_with_fp16_and_with_its_dense_twin(tiny_wan, tmp_path):  # noqa: F811
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red cat\n")
    out = tmp_path / "ev"
    r = run("eval", "--prompt-file", prompts, "--model", tiny_wan, *BIG, "--backend", "reference", "--schedule",
            "none", "--variants", "int8-fp8:half,int8-fp8:half:radial+band=0+window=0", "--out", out, "--quiet")
    assert r.exit_code == 0, r.output
    metrics = json.loads((out / "metrics.json").read_text())
    by_label = {v["label"]: v for v in metrics["variants"]}
    assert by_label["int8-fp8_half"]["density"] is None
    assert by_label["int8-fp8_half_radial+band=0+window=0"]["density"] == 0.5
    (twin,) = metrics["versus_dense"]
    assert twin["label"] == "int8-fp8_half_radial+band=0+window=0 vs int8-fp8_half" and twin["density"] == 0.5
    assert twin["mean"]["mse"] > 0  # the map changed the video
    report = (out / "report.md").read_text()
    assert "Density" in report and "## Sparse variants against their dense twin" in report
    (sidecar,) = (out / "videos" / "int8-fp8_half_radial+band=0+window=0").glob("*.json")
    side = json.loads(sidecar.read_text())
    assert side["sparsity"] == BAND_ONLY and side["eval_variant"] == "int8-fp8_half_radial+band=0+window=0"


def calibrate_big(model, tmp_path, *options, env=None):
    """``rotvid calibrate`` on one prompt at the BIG size, int8-fp8 on the reference: (result, output folder)."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red cat\n")
    out = tmp_path / "calib"
    r = run("calibrate", "--prompt-file", prompts, "--model", model, *BIG, "--out", out, "--iters", "2",
            "--max-tokens", "64", "--recipe", "int8-fp8", "--backend", "reference", *options, env=env)
    assert r.exit_code == 0, r.output
    return r, out


def test_calibrate_chooses_a_tau_per_block_that_generate_then_runs(tiny_wan, tmp_path):  # noqa: F811
    r, out = calibrate_big(tiny_wan, tmp_path, "--sparsity", "topp:0.5,sim=-1", "--cosine-floor", "-1",
                           "--dense-first-steps", "1")
    text = " ".join(r.stdout.split())
    assert "block maps: 0: topp:0.5,sim=-1.0, 1: topp:0.5,sim=-1.0" in text
    assert "dense first steps: 1 (given)" in text
    schedule = json.loads((out / "schedule.json").read_text())["schedule"]
    assert schedule["block_sparsity"] == [[0, "topp:0.5,sim=-1.0"], [1, "topp:0.5,sim=-1.0"]]
    video = tmp_path / "v.mp4"
    r = run("generate", "-p", "a dog", "--model", tiny_wan, *BIG, "--recipe", "int8-fp8", "--backend", "reference",
            "--rotation", f"learned:{out / 'rotations.safetensors'}", "--schedule", out / "schedule.json",
            "--out", video, "--quiet")
    assert r.exit_code == 0, r.output
    sparsity = json.loads(video.with_suffix(".json").read_text())["run_report"]["sparsity"]
    assert sparsity["spec"] == "none" and sparsity["rules"]["block_sparsity"][0] == [0, "topp:0.5,sim=-1.0"]
    assert sparsity["sparse_calls"] == 4 and sparsity["mean_dropped_mass"] is not None
    r = run("calibrate", "--prompt-file", tmp_path / "p.txt", "--model", tiny_wan, *TINY, "--out", tmp_path / "c2",
            "--dense-blocks", "0")
    assert_fails(r, "--dense-blocks: sparsity rules without a block map")


def test_calibrate_summary_shows_kept_mass_dense_first_steps_and_the_expected_speedup(tiny_wan, tmp_path):  # noqa: F811
    r, out = calibrate_big(tiny_wan, tmp_path, "--sparsity", "oracle:0.5", "--cosine-floor", "-1",
                           env={"COLUMNS": "200"})
    summary = json.loads((out / "summary.json").read_text())
    kept, speedup = summary["mean_kept_mass"], summary["expected_speedup"]
    assert 0 < kept < 1 and kept == pytest.approx(summary["mean_oracle_kept_mass"], abs=1e-6)
    text = " ".join(r.stdout.split())
    assert "block maps: attention mass kept" in text
    assert f"│ 0 │ oracle:0.5 │ 0.500 │ {summary['block_map_measures']['0']['kept_mass']:.4f} │" in text
    assert f"kept mass: {kept:.4f} (oracle at the same block counts {kept:.4f})" in text
    assert "dense first steps: 0 (chosen among 0..1: every step's sparse calls reach the cosine floor -1.0)" in text
    assert f"expected attention speed-up: {speedup:.2f}x (estimate from the int8-fp8 block-sparse (Hopper) kernel's " \
           "time-vs-density line measured on an NVIDIA H200" in text
    assert speedup == pytest.approx(1 / relative_attention_time(0.5))  # every call at density 0.5
    assert json.loads((out / "schedule.json").read_text())["schedule"]["dense_first_steps"] == 0


def test_generate_with_the_oracle_writes_kept_mass_to_the_sidecar(tiny_wan, tmp_path):  # noqa: F811
    out = tmp_path / "v.mp4"
    r = run("generate", "-p", "a red cat", "--model", tiny_wan, *BIG, *QUANTIZED, "--sparsity", "oracle:0.5",
            "--out", out)
    assert r.exit_code == 0, r.output
    side = json.loads(out.with_suffix(".json").read_text())
    assert side["sparsity"] == "oracle:0.5" and side["mean_density"] == 0.5
    kept, best = side["mean_kept_mass"], side["mean_oracle_kept_mass"]
    assert 0 < kept <= 1 and abs(kept - best) < 1e-6  # the oracle keeps its own best
    assert side["run_report"]["sparsity"]["kept_mass_calls"] == side["run_report"]["sparsity"]["sparse_calls"] > 0
