import os
import sys
from pathlib import Path

import numpy as np
import pytest

from rotvid.eval import vbench_runner as vb
from rotvid.eval.video_io import iter_frames, write_video


def test_parse_dimensions():
    assert vb.parse_dimensions("temporal_flickering, subject_consistency,temporal_flickering") == [
        "temporal_flickering", "subject_consistency"]
    with pytest.raises(ValueError, match="needs VBench's own prompt suite"):
        vb.parse_dimensions("color")
    with pytest.raises(ValueError, match="unknown dimension 'sharpness'"):
        vb.parse_dimensions("sharpness")
    with pytest.raises(ValueError, match="expected one or more"):
        vb.parse_dimensions(",")


def test_every_custom_dimension_has_a_weight_entry():
    assert set(vb.VBENCH_WEIGHTS) == set(vb.CUSTOM_INPUT_DIMENSIONS)
    assert vb.VBENCH_WEIGHTS["temporal_flickering"] == ()


def test_missing_weights_are_listed_with_sources(tmp_path):
    with pytest.raises(vb.VBenchError) as err:
        vb.check_weights(["temporal_flickering", "subject_consistency", "imaging_quality"], tmp_path)
    msg = str(err.value)
    assert "\n" not in msg
    assert f"VBENCH_CACHE_DIR={tmp_path}" in msg and "subject_consistency" in msg and "imaging_quality" in msg
    assert str(tmp_path / "dino_model/dino_vitbase16_pretrain.pth") in msg
    assert "musiq_spaq_ckpt-358bb6af.pth" in msg and "https://" in msg
    assert "temporal_flickering" not in msg  # needs nothing
    vb.check_weights(["temporal_flickering"], tmp_path)  # no error
    # once the files are there, the check passes
    for _, rel, _ in vb.missing_weights(["subject_consistency"], tmp_path):
        p = tmp_path / rel
        if rel.endswith("/"):
            p.mkdir(parents=True)
        else:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(b"w")
    vb.check_weights(["subject_consistency"], tmp_path)


def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("VBENCH_CACHE_DIR", str(tmp_path))
    assert vb.vbench_cache_dir() == tmp_path
    monkeypatch.delenv("VBENCH_CACHE_DIR")
    assert vb.vbench_cache_dir() == Path.home() / ".cache" / "vbench"


def test_bad_vbench_python(tmp_path, monkeypatch):
    monkeypatch.delenv("ROTVID_VBENCH_PYTHON", raising=False)
    with pytest.raises(vb.VBenchError, match="--vbench-python.*is not an executable file.*rotvid vbench-setup"):
        vb.resolve_vbench_python(tmp_path / "nope" / "python")
    assert vb.resolve_vbench_python(sys.executable) == Path(sys.executable)


def test_interpreter_without_vbench_fails_clearly(tmp_path):
    """rotvid's own environment has no vbench: the driver says so in the error's first line."""
    pytest.importorskip("torch")
    try:
        import vbench  # noqa: F401
        pytest.skip("vbench is importable in this environment")
    except ImportError:
        pass
    clip = np.random.default_rng(0).integers(0, 256, (2, 16, 16, 3), dtype=np.uint8)
    write_video(tmp_path / "v" / "a.mp4", clip, 8)
    with pytest.raises(vb.VBenchError, match=r"VBench failed \(exit 3\): vbench cannot be imported"):
        vb.run_vbench(sys.executable, tmp_path / "v", {"a.mp4": "a"}, ["temporal_flickering"], cache_dir=tmp_path)


def test_prompts_must_cover_videos(tmp_path):
    clip = np.random.default_rng(1).integers(0, 256, (2, 16, 16, 3), dtype=np.uint8)
    write_video(tmp_path / "v" / "a.mp4", clip, 8)
    with pytest.raises(vb.VBenchError, match="no prompt for a.mp4"):
        vb.run_vbench(sys.executable, tmp_path / "v", {}, ["temporal_flickering"], cache_dir=tmp_path)


def vbench_python_or_skip() -> Path:
    cand = os.environ.get("ROTVID_VBENCH_PYTHON") or str(vb.DEFAULT_VENV / "bin" / "python")
    if not Path(cand).is_file():
        pytest.skip(f"no VBench environment ({cand} missing): create one with `rotvid vbench-setup` "
                    "or set ROTVID_VBENCH_PYTHON")
    return Path(cand)


def flicker_score(path: Path) -> float:
    """VBench's temporal_flickering, computed independently: (255 − mean |frame_t+1 − frame_t|) / 255."""
    frames = [f.astype(np.float32) for f in iter_frames(path)]
    mae = [np.abs(b - a).mean() for a, b in zip(frames, frames[1:])]
    return (255.0 - float(np.mean(mae))) / 255.0


@pytest.mark.slow
def test_real_vbench_temporal_flickering(tmp_path):
    python = vbench_python_or_skip()
    rng = np.random.default_rng(2)
    base = rng.integers(0, 256, (1, 32, 32, 3)).astype(np.float64)
    still = np.repeat(base, 6, axis=0).astype(np.uint8)
    flicker = np.clip(base + rng.normal(0, 20, (6, 32, 32, 3)), 0, 255).astype(np.uint8)
    write_video(tmp_path / "v" / "still.mp4", still, 8)
    write_video(tmp_path / "v" / "flicker.mp4", flicker, 8)
    scores = vb.run_vbench(python, tmp_path / "v", {"still.mp4": "a still scene", "flicker.mp4": "a flicker"},
                           ["temporal_flickering"], cache_dir=tmp_path / "cache", device="cpu", timeout=600)
    per_video = scores.dimensions["temporal_flickering"]["videos"]
    assert set(per_video) == {"still.mp4", "flicker.mp4"}
    for name, score in per_video.items():
        # VBench decodes with OpenCV, rotvid with PyAV: same H.264 stream, tolerance for the YUV->RGB step
        assert score == pytest.approx(flicker_score(tmp_path / "v" / name), abs=2e-3)
    assert per_video["flicker.mp4"] < per_video["still.mp4"]
    assert scores.dimensions["temporal_flickering"]["mean"] == pytest.approx(np.mean(list(per_video.values())))


def test_add_vbench_says_which_group_it_scores(tmp_path, monkeypatch):
    """One progress line per group (the reference, then each variant) before VBench runs on it: a group takes
    minutes, and VBench's own output is captured."""
    from pathlib import Path

    import rotvid.eval.vbench_runner as runner
    from rotvid.eval.compare import VBenchRequest, add_vbench
    from rotvid.eval.matching import CandidateSet, VideoPair
    from rotvid.eval.report import EvalReport, VariantResult

    lines, scored = [], []

    def fake_run(python, folder, prompts, dimensions, **kw):
        scored.append(sorted(prompts))
        return runner.VBenchScores(dimensions={d: {"mean": 0.5, "videos": {}} for d in dimensions})

    monkeypatch.setattr(runner, "run_vbench", fake_run)
    for name in ("ref", "a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "x.mp4").write_bytes(b"")
    sets = [CandidateSet(v, tmp_path / v, (VideoPair("x", tmp_path / "ref" / "x.mp4", tmp_path / v / "x.mp4"),))
            for v in ("a", "b")]
    report = EvalReport("ref", str(tmp_path / "ref"), [VariantResult(v, str(tmp_path / v), []) for v in ("a", "b")])
    request = VBenchRequest(["temporal_flickering"], Path("python"), "cpu", tmp_path)
    add_vbench(report, sets, request, progress=lines.append)
    assert lines == ["VBench [1/3] reference: 1 video(s), temporal_flickering",
                     "VBench [2/3] a: 1 video(s), temporal_flickering", "VBench [3/3] b: 1 video(s), temporal_flickering"]
    assert len(scored) == 3 and report.reference_vbench == {"temporal_flickering": 0.5}
