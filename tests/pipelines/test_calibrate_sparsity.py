"""`calibrate` with a block map: the probe under the map, top-p tau chosen per block against the cosine floor, and
the FP16 cells chosen from what each cell will run."""

import json

import pytest

from rotvid.kernels.sparsity import parse_sparsity
from rotvid.pipelines import RotvidConfig, apply, remove
from rotvid.pipelines.adaptive_schedule import (
    TAU_LADDER, AccuracyTable, choose_block_sparsity, effective_table, read_schedule, tau_candidates,
)
from rotvid.pipelines.calibrate import CalibrationOptions, calibrate
from rotvid.pipelines.tiny import tiny_call_kwargs

STEPS = 2


def table(cosines: dict[tuple[int, int], float]) -> AccuracyTable:
    t = AccuracyTable(num_steps=4, num_blocks=3)
    for (step, block), cos in cosines.items():
        t.add(step, block, cos, 1 - cos)
    return t


def topp(tau):
    return parse_sparsity(f"topp:{tau}")


def test_tau_candidates_climb_the_ladder_from_the_given_tau():
    assert tau_candidates(0.8) == (0.8, 0.9, 0.95, 0.98, 0.99)
    assert tau_candidates(0.85) == (0.85, 0.9, 0.95, 0.98, 0.99)
    assert tau_candidates(0.3) == (0.3, *TAU_LADDER)
    assert tau_candidates(1.0) == (1.0,)


def test_each_block_gets_the_lowest_tau_whose_mean_cosine_reaches_the_floor():
    candidates = {
        topp(0.5): table({(1, 0): 0.99, (2, 0): 0.97, (1, 1): 0.90, (2, 1): 0.92, (1, 2): 0.80, (2, 2): 0.80}),
        topp(0.9): table({(1, 0): 0.99, (2, 0): 0.99, (1, 1): 0.96, (2, 1): 0.96, (1, 2): 0.90, (2, 2): 0.92}),
    }
    chosen = choose_block_sparsity(candidates, 0.95)
    # block 0: mean 0.98 at tau 0.5; block 1: 0.91 at 0.5, 0.96 at 0.9; block 2: below the floor at both: dense
    assert chosen == {0: topp(0.5), 1: topp(0.9), 2: None}
    dense = table({(s, b): 0.999 for s in range(4) for b in range(3)})
    eff = effective_table(dense, candidates, chosen)
    # the chosen map's accuracy where it was measured (steps 1-2), the dense one elsewhere and for block 2
    assert eff.cells[(1, 1)].cosine == pytest.approx(0.96) and eff.cells[(2, 0)].cosine == pytest.approx(0.97)
    assert eff.cells[(0, 1)].cosine == pytest.approx(0.999) and eff.cells[(1, 2)].cosine == pytest.approx(0.999)
    assert len(eff.cells) == 12
    with pytest.raises(ValueError, match="cosine_floor"):
        choose_block_sparsity(candidates, 1.5)


def run(pipe, prompt):
    kw = tiny_call_kwargs("wan", steps=STEPS, frames=9, size=128)
    kw["prompt"] = prompt
    return pipe(**kw).frames


@pytest.mark.parametrize("floor, expected", [(-1.0, "topp:0.5,sim=-1.0"), (1.0, "none")])
def test_calibrate_chooses_tau_per_block_and_generation_runs_it(tiny, tmp_path, floor, expected):
    """Floor -1: every candidate reaches it, the sparsest (the given tau) wins; floor 1: no quantized map reaches
    it, every block runs dense (and every cell FP16)."""
    pipe = tiny("wan", num_layers=2)
    opts = CalibrationOptions(iters=2, max_tokens=64, cosine_floor=floor, target_quantized_fraction=None,
                              backend="reference", recipe="int8-fp8", sparsity="topp:0.5,sim=-1",
                              dense_first_steps=1)
    res = calibrate(pipe, ["a red cat"], tmp_path, call=run, options=opts)
    schedule = read_schedule(res.schedule_path)
    assert schedule.dense_first_steps == 1
    assert [(b, str(spec)) for b, spec in schedule.block_sparsity] == [(0, expected), (1, expected)]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["block_sparsity"] == {"0": expected, "1": expected}
    measured = summary["block_cosines"]["0"]
    assert sorted(measured) == sorted(f"topp:{t},sim=-1.0" for t in (0.5, *TAU_LADDER[1:]))
    assert all(-1 <= c <= 1 for c in measured.values())
    # generation with the schedule alone (no --sparsity) runs each block's map, from step 1
    handle = apply(pipe, RotvidConfig(recipe="int8-fp8", backend="reference", schedule=schedule))
    try:
        run(pipe, "a dog")
        report = handle.report
    finally:
        remove(pipe)
    if expected == "none":
        assert report.sparse_calls == 0 and report.quantized_calls == 0  # every cell below a floor of 1: FP16
    else:
        cells = {(c["site"], c["step"]) for c in report.to_dict()["sparsity"]["per_block_step"]}
        assert cells == {("transformer/0", 1), ("transformer/1", 1)} and report.sparse_calls == 4


def test_calibrate_with_a_static_map_probes_it_and_records_it_per_block(tiny, tmp_path):
    pipe = tiny("wan", num_layers=2)
    opts = CalibrationOptions(iters=2, max_tokens=64, target_quantized_fraction=0.5, backend="reference",
                              recipe="int8-fp8", sparsity="radial:band=0,window=0", dense_blocks=(1,))
    res = calibrate(pipe, ["a red cat"], tmp_path, call=run, options=opts)
    schedule = read_schedule(res.schedule_path)
    assert schedule.dense_blocks == (1,) and [(b, str(s)) for b, s in schedule.block_sparsity] == [
        (0, "radial:band=0,window=0")]
    assert list(res.block_cosines) == [0] and len(schedule.fp16_cells) == 2  # 4 cells, half kept FP16
