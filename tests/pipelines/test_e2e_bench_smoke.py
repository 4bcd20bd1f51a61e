"""benchmarks.e2e_bench --tiny runs on the CPU and prints a complete table."""

import pytest

from benchmarks import e2e_bench as mod


def test_e2e_bench_tiny_smoke(tmp_path):
    out = tmp_path / "results.md"
    md = mod.main(["--tiny", "--steps", "6", "--warmup", "0", "--iters", "1", "--modes", "eager", "--append", str(out)])
    assert out.read_text().strip() == md.strip()
    assert "| eager | rotvid int4, all calls |" in md and "int4 on 6/6 blocks" in md  # schedule none
    assert "| vs compiled SDPA |" in md  # the baseline column ("—" here: compiled not run)
    sdpa = next(ln for ln in md.splitlines() if ln.startswith("| eager |") and "SDPA |" in ln.split("|")[2] + "|")
    assert sdpa.split("|")[4:7] == [" 1.000× ", " — ", " 1.000× "]
    paper = next(ln for ln in md.splitlines() if ln.startswith("| eager | rotvid int4, paper schedule |"))
    assert "int4 on 2/6 blocks" in paper  # paper schedule, a mixed step: blocks 2, 3
    # paper-wan2.2-t2v over 6 steps x 6 blocks: steps 2, 3 and blocks 2, 3 run INT4 -> 4/36.
    assert "6-step estimate" in md and "quantized fraction of self-attention calls 11.1%" in md
    assert "(2 FP16 + 4 mixed steps)" not in md and "(4 FP16 + 2 mixed steps)" in md
    assert "SageAttention2-8b" not in md  # CPU: the peer's row is only for a GPU with the package


def test_e2e_bench_arguments(capsys):
    args = mod.parse_args([])
    assert args.modes == ("eager", "compiled") and args.setups == ("wan2.1-1.3b-480p", "wan14b-720p-slice")
    setup = mod.make_setup("wan14b-720p-slice", 50, 4)
    assert setup.config["num_layers"] == 4 and setup.latent == (1, 16, 21, 90, 160) and setup.middle_slice
    sched = mod.paper_schedule(setup, "paper-wan2.2-t2v")
    assert (sched.fp16_first_blocks, sched.fp16_last_blocks, sched.fp16_first_steps) == (0, 0, 2)
    for bad in (["--modes", "lazy"], ["--setups", "wan9"], ["--slice-layers", "0"]):
        with pytest.raises(SystemExit):
            mod.parse_args(bad)
        assert bad[0] in capsys.readouterr().err


def test_sparse_rows_and_json(tmp_path):
    with pytest.raises(SystemExit):  # a bad map spec stops before anything is built
        mod.parse_args(["--tiny", "--sparsity", "topp:2"])
    args = mod.parse_args(["--tiny", "--sparsity", "radial", "topp:0.9"])
    assert args.sparsity == ["radial", "topp:0.9"]  # canonical specs
    setup = mod.tiny_setup(6)
    rows = [dict(method="float32 SDPA", mode="compiled", ms=10.0), dict(method="float32 SDPA", mode="eager", ms=20.0),
            dict(method="rotvid int8-fp8, all calls", mode="compiled", ms=5.0, density=1.0),
            dict(method="rotvid int8-fp8, all calls, sparsity radial", mode="compiled", ms=4.0, density=0.4)]
    mod.write_json([(setup, rows)], tmp_path / "e2e.json")
    import json

    got = json.loads((tmp_path / "e2e.json").read_text())["rows"]
    assert [(r["method"], r["mode"], r["vs_compiled_bf16"], r["density"]) for r in got] == [
        ("float32 SDPA", "compiled", 1.0, None), ("float32 SDPA", "eager", 0.5, None),
        ("rotvid int8-fp8, all calls", "compiled", 2.0, 1.0),
        ("rotvid int8-fp8, all calls, sparsity radial", "compiled", 2.5, 0.4)]
    assert all(r["setup"] == setup.name for r in got)
