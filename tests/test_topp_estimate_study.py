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


@pytest.mark.parametrize("argv, needle", [
    (["--size", "250x256x9"], "multiples of 16"),
    (["--densities", "0"], "--densities"),
    (["--step", "-1"], "--step"),
])
def test_bad_arguments_stop_first(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        study.main(argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err
