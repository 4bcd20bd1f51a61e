"""The block-sparse kernel's time-vs-density line: its points are the measured ones, the line is their least-squares
fit and meets each within the stated tolerance, and the speed-up counts calls without a map dense."""

import json
from pathlib import Path

import pytest
import torch

from rotvid.kernels.sparsity import cost

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "kernel_bench_sparse.json"


def test_the_points_are_the_benchmarks_measured_ones():
    data = json.loads(RESULTS.read_text())
    assert data["device"] == cost.MEASURED_DEVICE and data["commit"] == cost.MEASURED_COMMIT
    measured = sorted((shape, row["density"], row["kernel_vs_dense"])
                      for shape, rows in data["shapes"].items() for row in rows.values() if "kernel_vs_dense" in row)
    assert sorted(cost.MEASURED_POINTS) == measured and len(measured) == 8


def test_the_line_is_the_least_squares_fit_and_meets_every_point():
    x = torch.tensor([p[1] for p in cost.MEASURED_POINTS], dtype=torch.float64)
    y = torch.tensor([p[2] for p in cost.MEASURED_POINTS], dtype=torch.float64)
    fit = torch.linalg.lstsq(torch.stack([torch.ones_like(x), x], dim=1), y.unsqueeze(1)).solution.squeeze(1)
    assert (cost.INTERCEPT, cost.SLOPE) == pytest.approx(tuple(fit.tolist()), abs=1e-4)  # the constants, rounded
    assert cost.LINE_TOLERANCE <= 0.005
    for shape, density, measured in cost.MEASURED_POINTS:
        assert abs(cost.relative_attention_time(density) - measured) <= cost.LINE_TOLERANCE, (shape, density)


def test_relative_time_grows_with_density_and_rejects_what_is_not_a_density():
    times = [cost.relative_attention_time(d) for d in (0.0, 0.25, 0.5, 1.0)]
    assert times == sorted(times) and times[0] == cost.INTERCEPT and times[-1] == pytest.approx(1.0, abs=0.005)
    for bad in (-0.1, 1.5, float("nan"), True, "0.5", None):
        with pytest.raises(ValueError, match="density"):
            cost.relative_attention_time(bad)


def test_speedup_counts_calls_without_a_map_at_their_dense_time():
    half = cost.relative_attention_time(0.5)
    assert cost.attention_speedup([0.5, 0.5, None, None]) == pytest.approx(4 / (2 + 2 * half))
    assert cost.attention_speedup([None, None]) == 1.0
    assert cost.attention_speedup([0.2]) == pytest.approx(1 / (cost.INTERCEPT + 0.2 * cost.SLOPE)) and \
        cost.attention_speedup([0.2]) > 4.5
    assert cost.attention_speedup([]) != cost.attention_speedup([])  # NaN: no calls
