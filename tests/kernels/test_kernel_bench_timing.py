"""The kernel benchmark's interleaved timing (CPU: ``time_ms`` replaced by a recorder)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
kb = pytest.importorskip("benchmarks.kernel_bench")


def test_rounds_rotate_the_order_and_take_the_median_of_round_medians(monkeypatch):
    calls = []
    times = {"a": iter([5.0, 1.0, 3.0]), "b": iter([2.0, 2.0, 9.0]), "c": iter([7.0, 4.0, 4.0])}

    def fake_time_ms(fn, *, min_reps=3, budget_ms=1500.0):
        key = fn()
        calls.append((key, min_reps, budget_ms))
        return next(times[key])

    monkeypatch.setattr(kb, "time_ms", fake_time_ms)
    fns = {"a": lambda: "a", "b": (lambda: "b", 1, 30.0), "c": lambda: "c"}
    got = kb.time_interleaved(fns, rounds=3, budget_ms=900.0)
    assert [c[0] for c in calls] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # every method once per round
    assert got == {"a": 3.0, "b": 2.0, "c": 4.0}  # median of each method's round medians
    assert ("b", 1, 10.0) in calls and ("a", 3, 300.0) in calls  # per-method options, budget split over rounds


def test_no_methods_and_bad_rounds():
    assert kb.time_interleaved({}, rounds=3) == {}
    with pytest.raises(ValueError, match="rounds: expected at least 1, got 0"):
        kb.time_interleaved({"a": lambda: None}, rounds=0)


def test_results_json_keeps_an_untimed_peer_and_rounds_the_ratios(monkeypatch):
    monkeypatch.setattr(kb.torch.cuda, "get_device_name", lambda: "Test GPU")
    monkeypatch.setenv("ROTVID_COMMIT", "abc1234")
    rows = [
        dict(shape="cogvideox5b", method="sdpa-cudnn", ms=10.0, tops=400.0, cos=1.0, note=""),
        dict(shape="cogvideox5b", method="sageattention2-8b", ms=None, tops=None, cos=None, note="not importable: x"),
        dict(shape="cogvideox5b", method="rotvid-int4", ms=8.0, tops=500.04, cos=0.9737812, note=""),
        dict(shape="cogvideox5b", method="rotvid-int4 [wgmma] (attn only)", ms=7.0, tops=571.0, cos=None, note=""),
    ]
    got = kb.results_json(rows)
    assert got["device"] == "Test GPU" and got["commit"] == "abc1234"
    s = got["shapes"]["cogvideox5b"]
    assert set(s) == {"sdpa-cudnn", "sageattention2-8b", "rotvid-int4"}  # table-only rows stay out
    assert s["rotvid-int4"] == {"tops": 500.0, "vs_cudnn": 1.25, "cos_fp64": 0.973781}
    assert s["sageattention2-8b"] == {"tops": None, "vs_cudnn": None, "cos_fp64": None, "note": "not importable: x"}
