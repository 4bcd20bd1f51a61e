"""benchmarks/topp_estimate_study.py on a small proxy run: the oracle's ranking keeps the most mass, every ranking's
kept mass is a fraction, and bad arguments stop before the pipeline loads."""

from __future__ import annotations

import pytest

from benchmarks import topp_estimate_study as study


def test_a_small_run_ranks_the_oracle_first():
    result = study.main(["--size", "256x256x9", "--step", "0", "--densities", "0.2", "0.5", "--no-write"])
    assert result["calls"] == 12 and result["blocks_per_row"] == 6  # 6 blocks x 2 CFG branches; 768 tokens: 2 and 3 of 6 key blocks
    for d in ("0.2", "0.5"):
        best = result["kept"]["oracle"][d]
        assert 0 < best <= 1 + 1e-9
        for name in study.RANKINGS:
            assert 0 < result["kept"][name][d] <= best + 1e-12, (name, d)
    assert result["kept"]["oracle"]["0.5"] > result["kept"]["oracle"]["0.2"]
    for d in ("0.2", "0.5"):  # the exact masses' threshold keeps the most mass of any maps of its total size
        alloc = result["allocations"]
        best, size = alloc["oracle-threshold"][d]
        assert 0 < best <= 1 + 1e-9 and abs(alloc["threshold"][d][1] - size) < 1e-6
        assert alloc["threshold"][d][0] <= best + 1e-12  # ("even" rounds each row up: a larger map)


def test_per_call_budgets_and_the_steps_table():
    result = study.main(["--size", "256x256x9", "--step", "1", "0", "--densities", "0.5", "--no-write"])
    assert result["step"] == [0, 1] and result["calls"] == 24  # 12 calls a step
    alloc, by_step = result["allocations"], result["by_step"]
    # each call keeps round(0.5 * 36) = 18 of its 36 blocks per head: the per-call maps all have density 0.5
    for name in ("threshold-per-call", "oracle-threshold-per-call"):
        assert abs(alloc[name]["0.5"][1] - 0.5) < 1e-9
        for st in ("0", "1"):
            assert abs(by_step[name]["0.5"][st][1] - 0.5) < 1e-9
    # within a call the exact masses' threshold keeps the most of any map of that call's size
    assert alloc["threshold-per-call"]["0.5"][0] <= alloc["oracle-threshold-per-call"]["0.5"][0] + 1e-12
    # one budget over every call can only do better than a budget fixed per call, on the exact masses
    assert alloc["oracle-threshold-per-call"]["0.5"][0] <= alloc["oracle-threshold"]["0.5"][0] + 1e-12
    for name in study.ALLOCATIONS:  # the steps' rows average to the whole
        per = by_step[name]["0.5"]
        assert abs((per["0"][0] + per["1"][0]) / 2 - alloc[name]["0.5"][0]) < 1e-9
    assert "Per step" in study.markdown(result)


@pytest.mark.parametrize("argv, needle", [
    (["--size", "250x256x9"], "multiples of 16"),
    (["--densities", "0"], "--densities"),
    (["--step", "-1"], "--step"),
])
def test_bad_arguments_stop_first(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        study.main(argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err
