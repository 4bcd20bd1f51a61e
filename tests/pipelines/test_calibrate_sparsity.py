"""`calibrate` with a block map: the probe under the map, top-p tau chosen per block against the cosine floor, and
the FP16 cells chosen from what each cell will run."""

import json

import pytest

from rotvid.kernels.sparsity import parse_sparsity
from rotvid.pipelines import RotvidConfig, apply, remove
from rotvid.kernels.sparsity.cost import relative_attention_time
from rotvid.pipelines.adaptive_schedule import (
    TAU_LADDER, AccuracyTable, block_map_measures, choose_block_maps, choose_block_sparsity, choose_sparse_schedule,
    dense_first_steps_candidates, effective_table, expected_speedup, read_schedule, tau_candidates,
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
    assert schedule.dense_first_steps == 1 and (res.dense_first_steps, res.dense_first_steps_rule) == (1, "given")
    assert [(b, str(spec)) for b, spec in schedule.block_sparsity] == [(0, expected), (1, expected)]
    if expected == "none":  # no map, no speed-up
        assert res.block_map_measures == {} and res.expected_speedup == 1.0
    else:  # step 0 dense, step 1 sparse: half the calls at the maps' density
        assert list(res.block_map_measures) == [0, 1] and 1 < res.expected_speedup < 2
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


# ---- the dense first steps, chosen with the maps ------------------------------------------------------------------

def sparse_table(cosine_by_step: dict[int, float], density: float, blocks=(0, 1), kept=None) -> AccuracyTable:
    """Cells of every step in ``cosine_by_step`` and every block of ``blocks``, measured under a map of ``density``
    (``kept``: (kept mass, oracle kept mass) of each call)."""
    t = AccuracyTable(num_steps=4, num_blocks=3)
    masses = {} if kept is None else {"kept_mass": kept[0], "oracle_kept_mass": kept[1]}
    for step, cos in cosine_by_step.items():
        for block in blocks:
            t.add(step, block, cos, 1 - cos, density=density, **masses)
    return t


def dense_tables(blocks=(0, 1)) -> dict[str, AccuracyTable]:
    return {"transformer": table({(s, b): 0.999 for s in range(4) for b in blocks})}


def every_step(cos: float) -> dict[int, float]:
    return {s: cos for s in range(4)}


def test_a_floor_met_from_step_0_gets_no_dense_step():
    sparse = {"transformer": {topp(0.5): sparse_table(every_step(0.98), 0.3),
                              topp(0.9): sparse_table(every_step(0.995), 0.6)}}
    choice = choose_sparse_schedule(dense_tables(), sparse, cosine_floor=0.97, dense_first_steps=range(4),
                                    tau_ladder=True)
    assert choice.dense_first_steps == 0 and choice.floor_met is True
    assert choice.block_maps == {0: topp(0.5), 1: topp(0.5)}
    assert choice.step_cosines == pytest.approx(every_step(0.98))
    assert choice.speedup == pytest.approx(1 / relative_attention_time(0.3))
    # each dense step costs time with the same maps: the speed-up falls with the count
    speedups = [choice.tried[d][1] for d in range(4)]
    assert speedups == sorted(speedups, reverse=True) and speedups[3] < speedups[0]


def test_a_floor_the_first_step_misses_gets_dense_first_steps():
    """Step 0 is bad under every tau: over all steps every block's mean misses the floor (every block would run
    dense); from step 1 the sparsest tau reaches it."""
    bad_start = {0: 0.5, 1: 0.98, 2: 0.98, 3: 0.98}
    sparse = {"transformer": {topp(0.5): sparse_table(bad_start, 0.3),
                              topp(0.9): sparse_table({**bad_start, 1: 0.995, 2: 0.995, 3: 0.995}, 0.6)}}
    assert choose_block_maps(sparse, 0.97) == {0: None, 1: None}  # from step 0: every block dense
    choice = choose_sparse_schedule(dense_tables(), sparse, cosine_floor=0.97, dense_first_steps=range(4),
                                    tau_ladder=True)
    assert choice.dense_first_steps == 1 and choice.floor_met is True
    assert choice.block_maps == {0: topp(0.5), 1: topp(0.5)}
    assert choice.step_cosines == pytest.approx({1: 0.98, 2: 0.98, 3: 0.98})
    assert choice.speedup == pytest.approx(8 / (2 + 6 * relative_attention_time(0.3)))
    assert choice.tried[0][1] == 1.0  # no map left at 0 dense steps
    # a floor no tau reaches from any step: every block dense, nothing to gain from dense steps
    none = choose_sparse_schedule(dense_tables(), sparse, cosine_floor=0.999, dense_first_steps=range(4),
                                  tau_ladder=True)
    assert none.dense_first_steps == 0 and none.block_maps == {0: None, 1: None} and none.speedup == 1.0


def test_one_map_and_a_floor_missed_at_the_first_steps_or_everywhere():
    """Without a tau ladder every block keeps the one map: the per-step fidelity alone decides."""
    radial = parse_sparsity("radial:band=0,window=0")
    sparse = {"transformer": {radial: sparse_table({0: 0.9, 1: 0.95, 2: 0.999, 3: 0.999}, 0.5)}}
    choice = choose_sparse_schedule(dense_tables(), sparse, cosine_floor=0.99, dense_first_steps=range(4))
    assert choice.dense_first_steps == 2 and choice.floor_met is True and choice.block_maps == {0: radial, 1: radial}
    assert choice.tried[0][0] == pytest.approx(0.9) and choice.tried[1][0] == pytest.approx(0.95)
    unmet = choose_sparse_schedule(dense_tables(), sparse, cosine_floor=0.9999, dense_first_steps=range(4))
    assert unmet.floor_met is False and unmet.dense_first_steps == 2  # the best worst step (0.999), fewest steps
    given = choose_sparse_schedule(dense_tables(), sparse, cosine_floor=0.99, dense_first_steps=(1,))
    assert given.dense_first_steps == 1 and given.floor_met is False and set(given.tried) == {1}
    free = choose_sparse_schedule(dense_tables(), sparse, cosine_floor=None, dense_first_steps=range(4))
    assert free.dense_first_steps == 0 and free.floor_met is None
    with pytest.raises(ValueError, match="dense_first_steps"):
        choose_sparse_schedule(dense_tables(), sparse, cosine_floor=0.99, dense_first_steps=())
    with pytest.raises(ValueError, match="cosine_floor"):
        choose_sparse_schedule(dense_tables(), sparse, cosine_floor=2.0, dense_first_steps=(0,))


def test_dense_first_step_candidates():
    assert list(dense_first_steps_candidates(2)) == [0, 1]
    assert list(dense_first_steps_candidates(50)) == list(range(14))  # a quarter, rounded up
    assert list(dense_first_steps_candidates(50, 3)) == [0, 1, 2, 3]
    assert list(dense_first_steps_candidates(3, 10)) == [0, 1, 2]  # never every step
    with pytest.raises(ValueError, match="max_dense_first_steps"):
        dense_first_steps_candidates(10, -1)


def test_the_dense_first_steps_run_dense_in_the_effective_table_and_the_measures():
    sparse = {"transformer": {topp(0.5): sparse_table(every_step(0.9), 0.25, kept=(0.8, 0.9))}}
    maps = {0: topp(0.5), 1: None}
    eff = effective_table(dense_tables()["transformer"], sparse["transformer"], maps, from_step=2)
    assert [eff.cells[(s, 0)].cosine for s in range(4)] == pytest.approx([0.999, 0.999, 0.9, 0.9])
    assert eff.cells[(3, 1)].cosine == pytest.approx(0.999)  # block 1 chosen dense
    measures = block_map_measures(sparse, maps, from_step=2)
    assert measures == {0: pytest.approx({"density": 0.25, "kept_mass": 0.8, "oracle_kept_mass": 0.9})}
    speedup = expected_speedup(dense_tables(), sparse, maps, 2, fp16_cells=[(3, 0)])
    assert speedup == pytest.approx(8 / (7 + relative_attention_time(0.25)))  # only (2, 0) runs its map
    written = {(c["step"], c["block"]): c for c in eff.to_dict()["cells"]}
    assert (written[2, 0]["density"], written[2, 0]["kept_mass"], written[2, 0]["oracle_kept_mass"]) == (0.25, 0.8, 0.9)
    assert "kept_mass" not in written[1, 0] and "density" not in written[1, 0]  # a dense cell
    with pytest.raises(ValueError, match="both or neither"):
        AccuracyTable(num_steps=1, num_blocks=1).add(0, 0, 1.0, 0.0, kept_mass=0.5)


def test_two_experts_pool_their_measures_under_the_denser_choice():
    low = {"transformer": {topp(0.5): sparse_table({0: 0.99, 1: 0.99}, 0.2, kept=(0.6, 0.7)),
                           topp(0.9): sparse_table({0: 0.999, 1: 0.999}, 0.5, kept=(0.9, 0.95))},
           "transformer_2": {topp(0.5): sparse_table({2: 0.90, 3: 0.90}, 0.2, kept=(0.5, 0.6)),
                             topp(0.9): sparse_table({2: 0.99, 3: 0.99}, 0.4, kept=(0.8, 0.85))}}
    maps = choose_block_maps(low, 0.95)
    assert maps == {0: topp(0.9), 1: topp(0.9)}  # the second expert needs tau 0.9
    measures = block_map_measures(low, maps)
    assert measures[0] == pytest.approx({"density": 0.45, "kept_mass": 0.85, "oracle_kept_mass": 0.9})


@pytest.mark.parametrize("sparsity", ["topp:0.5,sim=-1", "oracle:0.5"])
def test_calibrate_reports_the_kept_mass_against_the_oracle_and_chooses_the_dense_first_steps(tiny, tmp_path,
                                                                                              sparsity):
    """A floor every map reaches (-1): no dense first step (the candidates are 0 and 1 of 2 steps); each block's
    map keeps at most the oracle's mass at its block counts (the oracle map: exactly that), below all of it at a
    density below 1; the expected speed-up is the cost line's at the maps' densities."""
    pipe = tiny("wan", num_layers=2)
    opts = CalibrationOptions(iters=2, max_tokens=64, cosine_floor=-1.0, target_quantized_fraction=None,
                              backend="reference", recipe="int8-fp8", sparsity=sparsity)
    res = calibrate(pipe, ["a red cat"], tmp_path, call=run, options=opts)
    assert res.dense_first_steps == 0 and read_schedule(res.schedule_path).dense_first_steps == 0
    assert res.dense_first_steps_rule.startswith("chosen among 0..1: every step's sparse calls reach")
    assert sorted(res.step_cosines) == [0, 1]  # the maps measured from step 0
    assert sorted(res.block_map_measures) == [0, 1]
    for row in res.block_map_measures.values():
        assert 0 < row["density"] < 1
        assert 0 <= row["kept_mass"] <= row["oracle_kept_mass"] + 1e-6 and row["oracle_kept_mass"] < 1
        if sparsity.startswith("oracle"):
            assert row["density"] == 0.5 and row["kept_mass"] == pytest.approx(row["oracle_kept_mass"], abs=1e-6)
    densities = [row["density"] for row in res.block_map_measures.values()]
    # every cell sparse (no FP16 cell at a floor of -1), two steps per block: the line at the mean density
    assert res.expected_speedup == pytest.approx(1 / relative_attention_time(sum(densities) / 2))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["block_map_measures"]["0"] == pytest.approx(res.block_map_measures[0])
    assert summary["mean_kept_mass"] == pytest.approx(res.mean_kept_mass) and summary["dense_first_steps"] == 0
    assert summary["expected_speedup"] == pytest.approx(res.expected_speedup)
    assert "NVIDIA H200" in summary["expected_speedup_basis"]
    cells = json.loads(res.schedule_path.read_text())["accuracy"]["cells"]
    assert all(0 <= c["kept_mass"] <= c["oracle_kept_mass"] + 1e-6 for c in cells)  # every cell ran its map
