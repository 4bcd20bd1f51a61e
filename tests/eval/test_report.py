import csv
import json

import numpy as np
import pytest
from PIL import Image

from rotvid.eval.pixel_metrics import compare_arrays
from rotvid.eval.report import (
    EvalReport, VariantResult, metrics_json, report_markdown, sample_indices, summary_table, write_report,
)
from rotvid.eval.video_io import write_video


def _report(rng):
    ref = rng.integers(0, 256, (3, 16, 16, 3), dtype=np.uint8)
    noisy = np.clip(ref.astype(int) + rng.integers(-4, 5, ref.shape), 0, 255).astype(np.uint8)
    same = VariantResult("int4_half", "a", [compare_arrays(ref, ref, name="v0")], ("INT4", "✓", "Half"),
                         step_seconds=2.0, quantized_fraction=0.81, vbench={"temporal_flickering": 0.97})
    diff = VariantResult("int4_none", "b", [compare_arrays(ref, noisy, name="v0")], ("INT4", "✓", "W/O"),
                         step_seconds=4.0, quantized_fraction=0.81, vbench={"temporal_flickering": 0.95})
    rep = EvalReport("FP16 (reference)", "ref", [same, diff], reference_step_seconds=3.0,
                     reference_vbench={"temporal_flickering": 0.96}, vbench_dimensions=["temporal_flickering"],
                     meta={"model": "tiny"})
    return ref, noisy, rep


def test_report_folder_contents(tmp_path):
    rng = np.random.default_rng(0)
    ref, noisy, rep = _report(rng)
    write_video(tmp_path / "v" / "ref.mp4", ref, 8)
    write_video(tmp_path / "v" / "noisy.mp4", noisy, 8)
    written = write_report(tmp_path / "out", rep, comparison_rows=[("FP16", tmp_path / "v" / "ref.mp4"),
                                                                  ("int4_none", tmp_path / "v" / "noisy.mp4")])
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["report.md", "metrics.csv", "metrics.json", "psnr_per_frame.png", "comparison.png"])
    assert set(written) == {"markdown", "csv", "json", "plot", "comparison"}

    md = (out / "report.md").read_text()
    header = next(ln for ln in md.splitlines() if ln.startswith("| Variant | Datatype"))
    assert header.split(" | ")[4:8] == ["Cosine ↑", "MSE ↓", "SSIM ↑", "PSNR ↑"]
    half = next(ln for ln in md.splitlines() if ln.startswith("| int4_half | INT4"))
    assert "| ∞ |" in half and "| 0.9700 |" in half and "| 81% |" in half and "1.50×" in half
    none_row = next(ln for ln in md.splitlines() if ln.startswith("| int4_none | INT4"))
    assert f"| {rep.variants[1].videos[0].psnr:.3f} |" in none_row and "0.75×" in none_row

    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert rows[0]["variant"] == "int4_half" and rows[0]["psnr"] == "inf"
    assert float(rows[2]["mse"]) == pytest.approx(rep.variants[1].videos[0].mse)
    assert rows[-1]["variant"] == "FP16 (reference)" and float(rows[-1]["temporal_flickering"]) == 0.96

    data = json.loads((out / "metrics.json").read_text())  # strict JSON: no Infinity
    assert data["variants"][0]["mean"]["psnr"] == "inf"
    assert data["variants"][0]["videos"][0]["psnr_per_frame"] == ["inf"] * 3
    assert data["variants"][1]["videos"][0]["psnr"] == pytest.approx(rep.variants[1].videos[0].psnr)

    img = Image.open(out / "comparison.png")
    assert img.size[1] == 22 + 2 * 256  # header + two rows of 256-pixel tiles (16x16 frames upscaled)
    assert Image.open(out / "psnr_per_frame.png").format == "PNG"


def test_summary_table_without_times_has_no_speedup():
    _, _, rep = _report(np.random.default_rng(1))
    rep.variants[1].step_seconds = None
    table = summary_table(rep)
    assert "Speedup" not in table and "temporal_flickering ↑" in table
    assert table.splitlines()[2].startswith("| FP16 (reference) | FP16 | – | – | 1.0000 | 0.00 | 1.0000 | ∞ |")


def test_missing_matplotlib_is_a_note_not_silence(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_mpl(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    _, _, rep = _report(np.random.default_rng(2))
    monkeypatch.setattr(builtins, "__import__", no_mpl)
    written = write_report(tmp_path, rep)
    assert "plot" not in written and not (tmp_path / "psnr_per_frame.png").exists()
    assert "matplotlib is not installed" in (tmp_path / "report.md").read_text()


def test_sample_indices():
    assert sample_indices(81, 4) == [0, 27, 53, 80]
    assert sample_indices(2, 4) == [0, 1]
    assert sample_indices(1, 4) == [0]


def test_partly_identical_variant_shows_the_finite_mean_too():
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
    b = a.copy()
    b[:, 0, 0, 0] ^= 4
    same, diff = compare_arrays(a, a, name="s"), compare_arrays(a, b, name="d")
    rep = EvalReport("ref", "ref", [VariantResult("v", "v", [same, diff])])
    row = next(ln for ln in summary_table(rep).splitlines() if ln.startswith("| v |"))
    assert f"∞ (1/2 identical; others {diff.psnr:.3f})" in row
    data = json.loads(metrics_json(rep))["variants"][0]
    assert data["mean"]["psnr"] == "inf" and data["identical_videos"] == 1
    assert data["psnr_mean_of_finite"] == pytest.approx(diff.psnr)


def _side(recipe, device, dtype="bfloat16", steps=3, fraction_key="quantized_fraction", backends=None):
    run_report = None if recipe == "fp16" else {"backend_requested": "auto", "backends": backends or {"cuda": 6}}
    side = {"sidecar_version": 1, "recipe": recipe, "rotation": "none" if recipe == "fp16" else "half",
            "device": device, "device_name": "NVIDIA H100" if device == "cuda" else "x86_64 (cpu)", "dtype": dtype,
            "steps": steps, "timing": {"per_step_seconds": [9.0, 2.0, 2.0]}, "run_report": run_report}
    side[fraction_key] = 0.0 if recipe == "fp16" else 0.75
    return side


def _measured(tmp_path, ref_side, cand_side):
    from rotvid.eval.compare import measure
    from rotvid.eval.matching import CandidateSet, VideoPair
    from rotvid.eval.sidecar import write_sidecar

    rng = np.random.default_rng(5)
    ref = rng.integers(0, 256, (2, 16, 16, 3), dtype=np.uint8)
    write_video(tmp_path / "ref" / "v.mp4", ref, 8)
    write_video(tmp_path / "cand" / "v.mp4", ref // 2, 8)
    write_sidecar(tmp_path / "ref" / "v.mp4", ref_side)
    write_sidecar(tmp_path / "cand" / "v.mp4", cand_side)
    sets = [CandidateSet("int8-fp8_half", tmp_path / "cand",
                         (VideoPair("v", tmp_path / "ref" / "v.mp4", tmp_path / "cand" / "v.mp4"),))]
    return measure("reference", str(tmp_path / "ref"), sets)


def test_labels_say_what_ran_and_gpu_timings_give_a_speedup(tmp_path):
    rep = _measured(tmp_path, _side("fp16", "cuda", dtype="bfloat16"), _side("int8-fp8", "cuda"))
    # the reference's datatype is the dtype that ran (bf16), not "FP16"; the fraction is recipe-neutral
    assert rep.reference_columns[0] == "BF16"
    assert rep.variants[0].quantized_fraction == 0.75 and rep.variants[0].columns[0] == "INT8/FP8"
    assert rep.reference_run == {"device": "cuda", "device_name": "NVIDIA H100", "dtype": "bfloat16", "steps": 3,
                                 "recipe": "fp16", "backend": "the model's own attention"}
    assert rep.variants[0].run["recipe"] == "int8-fp8" and rep.variants[0].run["backend"] == "cuda"
    table = summary_table(rep)
    head = table.splitlines()[0]
    assert "Quantized calls" in head and "INT4 calls" not in head and "Speedup" in head
    assert table.splitlines()[2].startswith("| reference | BF16 | – | – |") and "| 0% |" in table.splitlines()[2]
    assert "| 75% |" in table.splitlines()[3]
    data = json.loads(metrics_json(rep))
    assert data["timings_are_speed_measurements"] is True
    assert data["variants"][0]["quantized_fraction"] == 0.75 == data["variants"][0]["int4_fraction"]
    assert data["variants"][0]["run"]["device"] == "cuda" and data["reference"]["run"]["dtype"] == "bfloat16"
    md = report_markdown(rep, images={})
    assert "## What ran" in md and "| int8-fp8_half | int8-fp8 | cuda | cuda (NVIDIA H100) | bfloat16 | 3 |" in md
    assert "| reference | none (bfloat16 attention) | the model's own attention |" in md


def test_cpu_timings_are_not_shown_as_speed(tmp_path):
    cand = _side("int4", "cpu", fraction_key="int4_fraction", backends={"reference (auto; cuda: no CUDA GPU)": 6})
    rep = _measured(tmp_path, _side("fp16", "cpu", dtype="float32"), cand)
    assert rep.timed_on_cpu and rep.reference_columns[0] == "FP32"
    assert rep.variants[0].quantized_fraction == 0.75  # read from an old sidecar's int4_fraction
    table = summary_table(rep)
    assert "Speedup" not in table and "×" not in table and "s/step (CPU, not a speed measurement)" in table
    md = report_markdown(rep, images={})
    assert "not speed measurements" in md and "Speedup" not in md
    assert json.loads(metrics_json(rep))["timings_are_speed_measurements"] is False
