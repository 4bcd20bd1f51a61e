"""benchmarks/sparse_oracle.py: the --tiny run on the CPU (the bundled proxy, reference backend) writes one row per
sparse video with the issue's keys, the oracle keeps the most mass, and the summaries and the bar read the rows."""

import json
import math

import pytest

from benchmarks import sparse_oracle


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sparse_oracle")
    result = sparse_oracle.main(["--tiny", "--json-out", str(out / "so.json"), "--markdown-out", str(out / "so.md")])
    return result, json.loads((out / "so.json").read_text()), (out / "so.md").read_text()


def test_tiny_run_rows_and_provenance(tiny_run):
    result, data, md = tiny_run
    for key in ("device", "commit", "command", "date"):
        assert data[key], key
    assert data["complete"] and data["command"].startswith("python -m benchmarks.sparse_oracle --tiny")
    rows = data["rows"]
    settings = {(k, d) for k in sparse_oracle.KINDS for d in (0, 1)}
    assert {(r["kind"], r["dense_first_steps"]) for r in rows} == settings and len(rows) == len(settings)
    for r in rows:
        assert set(sparse_oracle.ROW_KEYS) <= set(r), r
        assert r["blocks_per_row"] == data["blocks_per_row"] == 4  # 128x128, 25 frames: 7x8x8 = 448 tokens
        assert 0 < r["density"] <= 1 and r["fallback_calls"] == 0 and r["kept_mass_calls"] == r["sparse_calls"] > 0
        assert r["sparse_calls"] == 6 * 2 * (2 - r["dense_first_steps"])  # 6 blocks, 2 forwards a step (CFG)
        psnr = math.inf if r["psnr"] == "inf" else r["psnr"]
        assert psnr > 0 and 0 < r["ssim"] <= 1
        # the oracle at a map's own per-row counts keeps at least the map's mass (the same calls: exact)
        assert 0 < r["kept_mass"] <= r["oracle_kept_mass"] + 1e-6 <= 1 + 1e-6
        if r["kind"] == "oracle":
            assert r["spec"] == "oracle:0.5" and r["density"] == pytest.approx(0.5)
            assert r["kept_mass"] == pytest.approx(r["oracle_kept_mass"])
    for r in rows:  # and the oracle's video keeps more than any map that keeps no more blocks (where densities allow)
        oracle = next(o for o in rows if o["kind"] == "oracle" and o["dense_first_steps"] == r["dense_first_steps"])
        if r["density"] <= oracle["density"] + 1e-9:
            assert oracle["kept_mass"] >= r["kept_mass"] - 0.01, (oracle, r)
    assert data["sizes_tried"][0]["prompts"][0]["dense_probe"]["prompt"] == rows[0]["prompt"]
    assert "| oracle | 0.5 | 0 | `oracle:0.5` |" in md and "Bar (issue 42)" in md


def test_tiny_run_matches_densities_and_checks_the_bar(tiny_run):
    _, data, _ = tiny_run
    topp = data["calibration"]["topp"]
    assert {c["dense_first_steps"] for c in topp} == {0, 1}
    for c in topp:  # tau matched on the dense runs' calls (those of the sparse steps)
        assert c["density_on_dense_runs"] == pytest.approx(0.5, abs=0.15) and 0 < c["tau"] <= 1
        assert c["calls"] == 6 * 2 * (2 - c["dense_first_steps"])
    pmin = data["calibration"]["pmin"]
    assert {c["dense_first_steps"] for c in pmin} == {0, 1}
    for c in pmin:  # the threshold matched on the same calls
        assert c["density_on_dense_runs"] == pytest.approx(0.5, abs=0.15) and 0 < c["pmin"] <= 1
        assert c["spec"].startswith("pmin:")
    radial = data["calibration"]["radial"][0]
    assert radial["spec"].startswith("radial") and 0 < radial["density"] <= 1
    checks = data["bar"]["checks"]
    assert [c["dense_first_steps"] for c in checks] == [0, 1] and isinstance(data["bar"]["met"], bool)
    for c in checks:
        assert c["psnr_ok"] == (c["psnr_gap_db"] <= 1.0) and c["mass_ok"] == (c["kept_of_oracle"] >= 0.95)


def _row(kind, d, dfs, psnr, kept, best, density=None, prompt="p"):
    return {"prompt": prompt, "kind": kind, "spec": f"{kind}:{d}", "target_density": d, "dense_first_steps": dfs,
            "density": d if density is None else density, "kept_mass": kept, "oracle_kept_mass": best, "psnr": psnr,
            "ssim": 0.9, "probe_passed": True}


def test_bar_reads_the_means_over_prompts_at_density_half_and_below():
    rows = [_row("oracle", 0.3, 0, 30.0, 0.9, 0.9), _row("oracle", 0.3, 0, 28.0, 0.8, 0.8, prompt="q"),
            _row("topp", 0.3, 0, 29.5, 0.85, 0.88), _row("topp", 0.3, 0, 27.6, 0.80, 0.82, prompt="q"),
            _row("oracle", 0.5, 0, 33.0, 0.95, 0.95), _row("topp", 0.5, 0, 31.0, 0.94, 0.95),
            _row("oracle", 0.7, 0, 40.0, 0.99, 0.99), _row("topp", 0.7, 0, 20.0, 0.5, 0.99)]
    summary = sparse_oracle.summarize(rows)
    topp3 = next(s for s in summary if s["kind"] == "topp" and s["target_density"] == 0.3)
    assert topp3["videos"] == 2 and topp3["psnr"] == pytest.approx(28.55)
    assert topp3["kept_of_oracle"] == pytest.approx(0.825 / 0.85)
    bar = sparse_oracle.bar_check(summary)
    assert [c["target_density"] for c in bar["checks"]] == [0.3, 0.5]  # 0.7 is above the bar's range
    first, second = bar["checks"]
    assert first["psnr_gap_db"] == pytest.approx(0.45) and first["psnr_ok"] and first["mass_ok"]
    assert second["psnr_gap_db"] == pytest.approx(2.0) and not second["psnr_ok"] and second["mass_ok"]
    assert not bar["met"]
    assert any("NOT MET" in line for line in sparse_oracle.bar_lines(bar))
    # pmin beside it, the same tests
    rows += [_row("pmin", 0.3, 0, 29.9, 0.89, 0.9), _row("pmin", 0.5, 0, 32.5, 0.95, 0.96)]
    bar = sparse_oracle.bar_check(sparse_oracle.summarize(rows))
    assert [c["kind"] for c in bar["pmin_checks"]] == ["pmin", "pmin"] and bar["pmin_met"] and not bar["met"]
    assert bar["pmin_checks"][1]["psnr_gap_db"] == pytest.approx(0.5)
    assert any(line.startswith("- pmin, density 0.3") for line in sparse_oracle.bar_lines(bar))


@pytest.mark.parametrize("argv, needle", [
    (["--sizes", "512x512"], "--sizes"),
    (["--height", "512"], "give all three"),
    (["--densities", "0.5,1.5"], "--densities"),
    (["--kinds", "oracle,random"], "--kinds"),
    (["--tiny", "--dense-first-steps", "2"], "leaves no sparse step"),
    (["--min-pass", "0"], "--min-pass"),
    (["--sizes", "512x500x65"], "--width 500"),  # the proxy's multiple of 16
    (["--height", "512", "--width", "512", "--frames", "64"], "--frames 64"),  # 4k + 1 frames
])
def test_bad_arguments_stop_before_anything_runs(argv, needle, capsys):
    with pytest.raises(SystemExit):
        sparse_oracle.resolve_args(argv)
    assert needle in capsys.readouterr().err


def test_defaults_are_the_study_and_tiny_its_smoke_run():
    args = sparse_oracle.resolve_args(["--device", "cpu"])
    assert args.sizes[0] == (512, 512, 65) and args.prompts == 3 and args.densities == (0.3, 0.5, 0.7)
    assert args.dfs_settings == (0, 3) and args.steps is None and args.json_out.name == "sparse_oracle.json"
    tiny = sparse_oracle.resolve_args(["--tiny"])
    assert (tiny.device, tiny.backend, tiny.workers, tiny.json_out) == ("cpu", "reference", 0, None)
    one = sparse_oracle.resolve_args(["--height", "384", "--width", "384", "--frames", "97"])
    assert one.sizes == [(384, 384, 97)]


def test_the_first_size_whose_dense_video_passes_is_the_studys(monkeypatch):
    passes = {(512, 512, 65): 1, (448, 448, 65): 0, (384, 384, 97): 2}

    def fake_check(pipe, args, size, prompts, pool):
        return {"size": sparse_oracle.size_text(size), "dense_passed": passes[size],
                "prompts": [{"prompt": p, "frames": "video", "estimates": []} for p in prompts]}

    monkeypatch.setattr(sparse_oracle, "check_size", fake_check)
    args = sparse_oracle.resolve_args(["--sizes", "512x512x65,448x448x65,384x384x97", "--device", "cpu"])
    entry, tried, why = sparse_oracle.choose_size(None, args, ["a", "b", "c"], None)  # 2 of 3 must pass
    assert entry["size"] == "384x384x97" and [t["size"] for t in tried] == ["512x512x65", "448x448x65", "384x384x97"]
    assert "passes the probe" in why and "frames" not in tried[1]["prompts"][0]  # only the first size's kept
    passes[(384, 384, 97)] = 0
    entry, tried, why = sparse_oracle.choose_size(None, args, ["a", "b", "c"], None)
    assert entry["size"] == "512x512x65" and entry["prompts"][0]["frames"] == "video" and why.startswith("NO size")


def test_frames_are_converted_on_the_device_as_the_library_converts_them():
    import torch

    from rotvid.eval.video_io import to_uint8_frames

    video = torch.rand(3, 3, 20, 24, generator=torch.Generator().manual_seed(0))
    video[0, 0, 0, :5] = torch.tensor([0.5, 1.5, 2.5, 253.5, 254.5]) / 255  # ties: half to even
    video[1, 1, 0, :2] = torch.tensor([-0.2, 1.3])  # clipped
    got = sparse_oracle.uint8_frames(video)
    assert got.dtype.name == "uint8" and got.shape == (3, 20, 24, 3)
    assert (got == to_uint8_frames(video.permute(0, 2, 3, 1).numpy())).all()
