"""`rotvid calibrate` through CliRunner on a tiny Wan pipeline, then `generate` using its output."""

import json

from safetensors import safe_open

from tests.test_cli import TINY, assert_fails, run, tiny_wan  # noqa: F401  (fixture)


def test_calibrate_then_generate_with_its_rotations_and_schedule(tiny_wan, tmp_path):  # noqa: F811
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red cat\na blue car\n")
    out = tmp_path / "calib"
    r = run("calibrate", "--prompt-file", prompts, "--model", tiny_wan, *TINY, "--out", out,
            "--iters", "10", "--lr", "0.03", "--max-tokens", "128", "--target-quantized", "0.5", "--backend", "reference")
    assert r.exit_code == 0, r.output
    assert "objective per block" in r.stdout and "INT4 fraction 50.0%" in r.stdout
    with safe_open(str(out / "rotations.safetensors"), framework="pt") as f:
        assert f.get_tensor("angles").shape == (2, 32) and f.metadata()["pairing"] == "half"
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["blocks"]) == 2
    assert all(b["objective_learned"] <= b["objective_H2"] for b in summary["blocks"])
    assert any(b["objective_learned"] < b["objective_H2"] for b in summary["blocks"])  # it learned somewhere
    # --recipe defaults to auto: the probe measured this device's recipe (the CPU: int4), recorded with why
    assert summary["options"]["recipe"] == "auto" and summary["recipe"] == "int4"
    assert summary["recipe_reason"].startswith("auto on cpu:")
    video = tmp_path / "v.mp4"
    r = run("generate", "-p", "a dog", "--model", tiny_wan, *TINY, "--quiet", "--out", video, "--backend", "reference",
            "--rotation", f"learned:{out / 'rotations.safetensors'}", "--schedule", out / "schedule.json")
    assert r.exit_code == 0, r.output
    side = json.loads(video.with_suffix(".json").read_text())
    assert side["quantized_fraction"] == 0.5  # 2 steps x 2 blocks = 4 cells, 2 kept FP16
    # the table is for 2 steps: another --steps is refused by name (its cells would mark other calls)
    three = [a if a != "2" else "3" for a in TINY]  # --steps 3
    r = run("generate", "-p", "a dog", "--model", tiny_wan, *three, "--out", tmp_path / "w.mp4",
            "--schedule", out / "schedule.json")
    assert_fails(r, "--schedule", "calibrated for 2 steps, but --steps is 3")
    # Calibrating into the same folder again needs --overwrite.
    r = run("calibrate", "--prompt-file", prompts, "--model", tiny_wan, *TINY, "--out", out, "--iters", "1")
    assert_fails(r, "rotations.safetensors exists", "--overwrite")


def test_calibrate_bad_input(tiny_wan, tmp_path):  # noqa: F811
    prompts = tmp_path / "p.txt"
    prompts.write_text("a cat\n")
    assert_fails(run("calibrate", "--prompt-file", tmp_path / "missing.txt", "--out", tmp_path / "o"), "missing.txt")
    assert_fails(run("calibrate", "--prompt-file", prompts, "--model", tiny_wan, "--out", tmp_path / "o",
                     "--pairing", "diagonal"), "--pairing")
    assert_fails(run("calibrate", "--prompt-file", prompts, "--model", tiny_wan, "--out", tmp_path / "o",
                     "--target-quantized", "1.5"), "--target-quantized", "[0, 1]")
    # --target-int4, the old name, still works for one version: it warns and is read as --target-quantized
    r = run("calibrate", "--prompt-file", prompts, "--model", tiny_wan, "--out", tmp_path / "o", "--target-int4", "1.5")
    assert_fails(r, "--target-quantized", "got 1.5")
    assert "--target-int4 is deprecated" in r.stderr
    assert_fails(run("calibrate", "--prompt-file", prompts, "--model", tiny_wan, "--out", tmp_path / "o",
                     "--target-int4", "0.5", "--target-quantized", "0.5"), "--target-quantized", "not both")
    # refused before loading or learning anything, each by its flag
    assert_fails(run("calibrate", "--prompt-file", prompts, "--model", tiny_wan, "--out", tmp_path / "o",
                     "--cosine-floor", "5"), "--cosine-floor", "[-1, 1]")
    assert_fails(run("calibrate", "--prompt-file", prompts, "--model", tiny_wan, "--out", tmp_path / "o",
                     "--backend", "foo"), "--backend", "auto, reference or cuda")
    (tmp_path / "dumpfile").write_text("x")
    assert_fails(run("calibrate", "--prompt-file", prompts, "--model", tiny_wan, "--out", tmp_path / "o",
                     "--dump-dir", tmp_path / "dumpfile"), "--dump-dir", "expected a folder")
    assert_fails(run("calibrate", "--prompt-file", prompts, "--model", tiny_wan, *TINY, "--out", tmp_path / "o",
                     "--capture-steps", "0,2"), "--capture-steps", "past the run's 2 steps")
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "summary.json").write_text("{}")  # any output of the run, not only the rotations
    assert_fails(run("calibrate", "--prompt-file", prompts, "--model", tiny_wan, "--out", tmp_path / "o"),
                 "summary.json exists", "--overwrite")
    assert not (tmp_path / "o" / "rotations.safetensors").exists()


def test_calibrate_dumps_are_readable_by_the_accuracy_study(tiny_wan, tmp_path):  # noqa: F811
    from rotvid.rope.dumps import load_qkv_dump

    prompts = tmp_path / "p.txt"
    prompts.write_text("a cat\n")
    r = run("calibrate", "--prompt-file", prompts, "--model", tiny_wan, *TINY, "--out", tmp_path / "c",
            "--iters", "2", "--capture-steps", "1", "--dump-dir", tmp_path / "dumps", "--quiet")
    assert r.exit_code == 0, r.output
    files = sorted((tmp_path / "dumps").glob("*.safetensors"))
    assert len(files) == 4  # step 1: 2 blocks x (cond + uncond)
    d = load_qkv_dump(files[0])
    assert d.grid == (2, 2, 2) and d.step == 1 and d.block == 0 and d.q.shape == (1, 2, 8, 64)
    assert_fails(run("calibrate", "--prompt-file", prompts, "--model", tiny_wan, "--out", tmp_path / "d",
                     "--capture-steps", "1,x"), "--capture-steps")
    # a second run into the same dump folder would renumber from 0000 over the first one's dumps
    assert_fails(run("calibrate", "--prompt-file", prompts, "--model", tiny_wan, *TINY, "--out", tmp_path / "e",
                     "--capture-steps", "1", "--dump-dir", tmp_path / "dumps"), "--dump-dir", "--overwrite")


def test_generate_on_cpu_says_it_uses_the_reference(tiny_wan, tmp_path):  # noqa: F811
    r = run("generate", "-p", "a dog", "--model", tiny_wan, *TINY, "--out", tmp_path / "a.mp4", "--schedule", "none")
    assert r.exit_code == 0, r.output
    assert "running on the CPU" in r.stderr and "PyTorch reference" in r.stderr
