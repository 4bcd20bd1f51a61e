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
