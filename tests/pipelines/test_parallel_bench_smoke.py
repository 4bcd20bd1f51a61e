"""benchmarks.parallel_bench: the tiny smoke run (1 and 2 gloo processes, compiled, dense and a block map) writes
the JSON rows the issue asks for; bad arguments stop before anything runs; rows merge, and the bars read them."""

import json
from pathlib import Path

import pytest

from benchmarks import parallel_bench
from tests.pipelines.cp_spawn import needs_gloo

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    return parallel_bench


@pytest.fixture(autouse=True)
def from_the_repository_root(monkeypatch):
    """The workers start as ``python -m benchmarks.parallel_bench``, where the benchmarks run: the repository root
    (pytest's own path to the package is not theirs)."""
    monkeypatch.chdir(REPO)


def test_tiny_compiled_sparse_rows(bench, tmp_path):
    """--tiny --gpus 1,2 --compile --sparsity none radial:window=1: six compiled rows, one graph each and no recompile
    (dynamo only: the eager backend keeps the CPU run short), the map's density below 1, the JSON's fields."""
    needs_gloo()
    out = tmp_path / "parallel_bench.json"
    md = bench.main(["--tiny", "--gpus", "1,2", "--layers", "1", "--compile", "--compile-backend", "eager",
                     "--sparsity", "none", "radial:window=1", "--warmup", "1", "--iters", "1", "--json-out", str(out),
                     "--no-append"])
    doc = json.loads(out.read_text())
    assert doc["device"].startswith("CPU") and doc["commit"] and doc["setup"] == "tiny Wan (smoke)"
    assert len(doc["commands"]) == 1 and "--sparsity none radial:window=1" in doc["commands"][0]
    rows = doc["rows"]
    assert [(r["gpus"], r["method"], r["sparsity"]) for r in rows] == [
        (1, "sdpa", "none"), (1, "rotvid", "none"), (1, "rotvid", "radial:window=1"),
        (2, "diffusers-cp-sdpa", "none"), (2, "rotvid", "none"), (2, "rotvid", "radial:window=1")]
    for r in rows:
        assert r["mode"] == "compiled" and r["layers"] == 1 and r["ms"] > 0, r
        assert r["graphs"] == 1 and r["recompiles"] == 0, r  # fullgraph: one graph per row, compiled in warm-up
        assert r["command"] == doc["commands"][0] and r["steps"] == 50 and r["cfg_forwards"] == 2
        assert r["video_basis"] == "extrapolated per block"
        assert r["video_min"] == pytest.approx(50 * 2 * r["ms"] * 40 / 1 / 60e3, rel=1e-3)
        assert (r["a2a_ms"] is not None) == (r["a2a_share"] is not None) == (r["gpus"] == 2), r
        if r["method"] == "rotvid":
            assert r["recipe"] == "int4" and r["fallbacks"] == {} and sum(r["backends"].values()) > 0, r
            assert r["density"] == 1.0 if r["sparsity"] == "none" else 0 < r["density"] < 1, r
        else:
            assert "recipe" not in r
    one_sdpa = rows[0]["ms"]
    for r in rows:
        assert r["vs_1gpu_sdpa"] == pytest.approx(one_sdpa / r["ms"], rel=1e-3)
    assert "| 2 | diffusers-cp-sdpa | none |" in md and "| 1 | sdpa | none |" in md
    assert "bar ≥ 1.8×" in md and "bar within 5%" in md and "bar ≥ 3.4×" in md
    assert "extrapolated per block (ms × 40 / 1)" in md

    # a second run into the same file: only the 1-GPU map row, without SDPA; the other rows stay, marked earlier
    md = bench.main(["--tiny", "--gpus", "1", "--layers", "1", "--compile", "--compile-backend", "eager", "--no-sdpa",
                     "--sparsity", "radial:window=1", "--warmup", "1", "--iters", "1", "--json-out", str(out),
                     "--no-append"])
    again = json.loads(out.read_text())
    assert len(again["commands"]) == 2 and "--no-sdpa" in again["commands"][1]
    assert [(r["gpus"], r["method"], r["sparsity"], r["command"] == again["commands"][1]) for r in again["rows"]] == [
        (1, "sdpa", "none", False), (1, "rotvid", "none", False), (1, "rotvid", "radial:window=1", True),
        (2, "diffusers-cp-sdpa", "none", False), (2, "rotvid", "none", False), (2, "rotvid", "radial:window=1", False)]
    assert md.count("earlier run") >= 5 and "bar ≥ 3.4×" in md


@pytest.mark.parametrize("argv, says", [
    (["--gpus", "0"], "--gpus"),
    (["--gpus", "1,x"], "--gpus"),
    (["--gpus", "1,3"], "do not divide 40"),
    (["--layers", "41"], "--layers"),
    (["--sparsity", "radial:wndow=4"], "no parameter 'wndow'"),
    (["--sparsity", "none", "lattice"], "unknown kind 'lattice'"),
    (["--recipe", "int3"], "recipe"),
    (["--compile", "--warmup", "0"], "--warmup"),
    (["--compile-backend", "eager"], "only with --compile"),
    (["--steps", "0"], "--steps"),
    (["--cfg-forwards", "0"], "--cfg-forwards"),
])
def test_bad_arguments_fail_before_any_work(bench, capsys, argv, says):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(argv)
    assert exc.value.code == 2
    assert says in capsys.readouterr().err


def test_unreadable_json_out_fails_before_any_work(bench, tmp_path, capsys):
    bad = tmp_path / "old.json"
    bad.write_text('{"rows": [{"gpus": 1}]}')
    with pytest.raises(SystemExit):
        bench.parse_args(["--json-out", str(bad)])
    assert "not a parallel_bench result" in capsys.readouterr().err


def test_sparsity_specs_are_canonical_and_repeatable(bench):
    args = bench.parse_args(["--tiny", "--sparsity", "none", "radial:window=40,band=1",
                             "--sparsity", "radial:window=40"])
    assert args.sparsity == ["none", "radial:window=40"]  # band=1 is the default: the same map, timed once
    assert bench.parse_args(["--tiny"]).sparsity == ["none"]
    assert bench.parse_args([]).json_out == bench.DEFAULT_JSON  # a full run that appends writes the results file
    assert bench.parse_args(["--no-append"]).json_out is None and bench.parse_args(["--tiny"]).json_out is None


def _row(gpus, method, ms, sparsity="none", layers=4, **extra):
    return {"gpus": gpus, "method": method, "mode": "compiled", "sparsity": sparsity, "layers": layers, "ms": ms,
            **extra}


def test_merge_keeps_other_measurements_and_bars_read_them(bench):
    run = {"device": "H100", "commit": "abc1234", "setup": "Wan2.1-14B 720p 81f", "command": "python second"}
    earlier = {"device": "H100", "commit": "abc1234", "setup": "Wan2.1-14B 720p 81f", "commands": ["python first"],
               "rows": [_row(1, "sdpa", 1000.0), _row(1, "rotvid", 750.0), _row(1, "rotvid", 900.0, layers=40)]}
    now = [_row(1, "rotvid", 760.0, _this_run=True), _row(2, "diffusers-cp-sdpa", 520.0, _this_run=True),
           _row(2, "rotvid", 400.0, _this_run=True), _row(2, "rotvid", 290.0, "radial:window=40", _this_run=True)]
    rows, commands, note = bench.merge_rows(earlier, run, now)
    assert note is None and commands == ["python first", "python second"]
    keys = sorted((r["gpus"], r["method"], r["sparsity"], r["layers"], r["ms"]) for r in rows)
    assert keys == [(1, "rotvid", "none", 4, 760.0), (1, "rotvid", "none", 40, 900.0), (1, "sdpa", "none", 4, 1000.0),
                    (2, "diffusers-cp-sdpa", "none", 4, 520.0), (2, "rotvid", "none", 4, 400.0),
                    (2, "rotvid", "radial:window=40", 4, 290.0)]  # this run's 1-GPU rotvid replaced the earlier one
    rows.sort(key=bench.row_order)
    bench.derive(rows)
    cp = next(r for r in rows if r["method"] == "diffusers-cp-sdpa")
    assert cp["scaling"] == pytest.approx(1000 / 520) and cp["vs_sdpa"] == 1.0
    lines = "\n".join(bench.bar_lines(rows, "compiled", 4))
    assert "rotvid 1.90× its 1-GPU forward (760.0 → 400.0 ms) (bar ≥ 1.8×: met)" in lines
    # 520 / 400 = 1.300 vs 1000 / 760 = 1.316: -1.2%
    assert ("rotvid over SDPA 1.300× (diffusers-cp-sdpa 520.0 ms) vs 1.316× on 1 GPU (-1.2%, bar within 5%: met)"
            in lines)
    assert ("rotvid + radial:window=40 (density —) 3.45× the 1-GPU SDPA forward (1000.0 → 290.0 ms) "
            "(bar ≥ 3.4×: met)") in lines
    assert "no bar" in "\n".join(bench.bar_lines(rows, "compiled", 40))  # the full forward: 1 GPU only

    other = dict(earlier, commit="def5678")
    rows, commands, note = bench.merge_rows(other, run, now)
    assert rows == now and commands == ["python second"] and "def5678" in note


def test_video_minutes(bench):
    assert bench.video_minutes(12_000.0, 40, 50, 2) == (pytest.approx(20.0), "measured")
    assert bench.video_minutes(1_200.0, 4, 50, 2) == (pytest.approx(20.0), "extrapolated per block")


def test_the_recorded_command_has_no_output_paths(bench):
    argv = ["--gpus", "1,2", "--append", "out/x.md", "--json-out=out/y.json", "--json-out", "out/z.json",
            "--sparsity", "none"]
    assert bench._measuring_args(argv) == ["--gpus", "1,2", "--sparsity", "none"]
