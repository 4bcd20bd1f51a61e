"""Block maps in the config, the schedule's sparsity rules and the run report's sparsity fields (no pipeline)."""

import json

import pytest

from rotvid.kernels.sparsity import SparsitySpec, parse_sparsity
from rotvid.pipelines import RotvidConfig, Schedule
from rotvid.pipelines.call_counts import SparseSums
from rotvid.pipelines.report import DROPPED_MASS_ESTIMATED, DROPPED_MASS_NOT_ESTIMATED, RunReport

# ---- RotvidConfig(sparsity=...) ---------------------------------------------------------------------------------


def test_config_sparsity_defaults_to_none_and_takes_a_spec_or_its_text():
    assert RotvidConfig().sparsity == SparsitySpec() and not RotvidConfig().sparsity.enabled
    by_text = RotvidConfig(sparsity="topp:0.9,sim=0.25")
    assert by_text.sparsity == parse_sparsity("topp:0.9,sim=0.25") == RotvidConfig(sparsity=by_text.sparsity).sparsity
    assert RotvidConfig(sparsity="radial:band=2").sparsity.options["band"] == 2


def test_config_with_sparsity_and_schedule_rules_round_trips_through_json(tmp_path):
    schedule = Schedule(1, 1, 0, 0, fp16_cells=((0, -1),), dense_first_steps=2, dense_blocks=(0, -1),
                        block_sparsity=((3, "topp:0.95"), (-2, "none")), name="mine")
    cfg = RotvidConfig(recipe="int8-fp8", sparsity="radial:band=2,decay=0.25", schedule=schedule)
    assert RotvidConfig.from_json(cfg.to_json()) == cfg
    path = tmp_path / "cfg.json"
    cfg.to_json(path)
    data = json.loads(path.read_text())
    # the spec with every parameter and its version; the per-block specs as text
    assert data["sparsity"] == {"version": 1, "kind": "radial", "params": {"band": 2, "window": None, "decay": 0.25}}
    assert data["schedule"]["block_sparsity"] == [[3, "topp:0.95"], [-2, "none"]]
    assert RotvidConfig.from_json(path) == cfg


def test_config_json_without_sparsity_is_dense():
    """A config written before block maps existed loads as before: no map, no sparsity rules."""
    d = RotvidConfig().to_dict()
    d.pop("sparsity")
    for key in ("dense_first_steps", "dense_blocks", "block_sparsity"):
        d["schedule"].pop(key)
    cfg = RotvidConfig.from_dict(d)
    assert cfg == RotvidConfig() and not cfg.sparsity.enabled


@pytest.mark.parametrize("value", ["bogus", "topp", "topp:1.5", "radial:band=-1", "topp:0.9,speed=2", 3, ""])
def test_config_bad_sparsity_names_the_field(value):
    with pytest.raises(ValueError, match=r"^sparsity"):
        RotvidConfig(sparsity=value)
    with pytest.raises(ValueError, match=r"^sparsity"):
        RotvidConfig.from_dict({**RotvidConfig().to_dict(), "sparsity": value})


# ---- the schedule's sparsity rules ------------------------------------------------------------------------------

TOPP = parse_sparsity("topp:0.9")


def at(schedule, step, block, base=TOPP, num_steps=10, num_blocks=6):
    return schedule.sparsity_at(base, step=step, num_steps=num_steps, block=block, num_blocks=num_blocks)


def test_without_rules_every_quantized_call_runs_the_configs_map():
    assert all(at(Schedule(), s, b) == TOPP for s in range(10) for b in range(6))
    assert all(at(Schedule(), s, b, base=SparsitySpec()) is None for s in range(10) for b in range(6))


def test_dense_first_steps_and_dense_blocks():
    s = Schedule(dense_first_steps=3, dense_blocks=(1, -1))
    dense = {(step, b) for step in range(10) for b in range(6) if at(s, step, b) is None}
    assert dense == {(step, b) for step in range(10) for b in range(6) if step < 3 or b in (1, 5)}
    # outside a tracked run (no step): the block rules alone
    assert at(s, None, 0) == TOPP and at(s, None, 1) is None and at(s, None, 5) is None


def test_block_sparsity_overrides_the_configs_map_and_the_dense_rules_win():
    s = Schedule(dense_first_steps=1, dense_blocks=(2,),
                 block_sparsity=((0, "topp:0.99"), (2, "topp:0.5"), (-1, "none"), (4, "radial")))
    assert at(s, 5, 0) == parse_sparsity("topp:0.99")
    assert at(s, 5, 1) == TOPP  # no override: the config's
    assert at(s, 5, 2) is None  # dense_blocks wins over the block's own spec
    assert at(s, 5, 5) is None  # "none": that block dense
    assert at(s, 5, 4) == parse_sparsity("radial")
    assert at(s, 0, 0) is None  # dense_first_steps wins too
    # a block's own spec applies even when the config has no map
    assert at(s, 5, 0, base=SparsitySpec()) == parse_sparsity("topp:0.99") and at(s, 5, 1, base=SparsitySpec()) is None
    assert s.sparsity_specs == tuple(map(parse_sparsity, ("topp:0.99", "topp:0.5", "none", "radial")))


def test_schedule_with_sparsity_rules_round_trips_and_old_files_load():
    s = Schedule(fp16_first_steps=2, dense_first_steps=4, dense_blocks=(0, -2), block_sparsity=((1, "topp:0.8"),))
    assert Schedule.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    old = {k: v for k, v in Schedule(2, 2, 2, 2).to_dict().items()
           if k not in ("dense_first_steps", "dense_blocks", "block_sparsity")}
    assert Schedule.from_dict(old) == Schedule(2, 2, 2, 2)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dense_first_steps": -1}, "dense_first_steps"),
        ({"dense_first_steps": True}, "dense_first_steps"),
        ({"dense_blocks": (0, "1")}, "dense_blocks"),
        ({"dense_blocks": 3}, "dense_blocks"),
        ({"block_sparsity": ((0, "bogus"),)}, "block_sparsity: block 0: sparsity"),
        ({"block_sparsity": ((0, "topp:0.9"), (0, "radial"))}, "block_sparsity: block 0 given twice"),
        ({"block_sparsity": (("0", "radial"),)}, "block_sparsity"),
        ({"block_sparsity": "radial"}, "block_sparsity"),
    ],
)
def test_bad_sparsity_rules_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Schedule(**kwargs)


# ---- the run report ---------------------------------------------------------------------------------------------


def sparse_report(spec="topp:0.9"):
    report = RunReport(recipe="int8-fp8", backend_requested="reference", sparsity=spec,
                       sparsity_rules={"dense_first_steps": 1, "dense_blocks": [], "block_sparsity": []})
    for block in range(2):
        for step in range(3):
            report.record_quantized(f"transformer/{block}", "reference", 2)
    return report


def test_report_gives_density_and_dropped_mass_per_block_and_step():
    report = sparse_report()
    # two calls per (block, step) at steps 1 and 2 (step 0 dense by the rule)
    report.record_sparse("transformer/0", 1, SparseSums(2, 1.0, 0.2, 2))
    report.record_sparse("transformer/0", 2, SparseSums(2, 0.6, 0.1, 2))
    report.record_sparse("transformer/1", 1, SparseSums(1, 0.25, 0.05, 1))
    report.record_sparse("transformer/1", 1, SparseSums(1, 0.35, 0.15, 1))  # drained twice in one step: summed
    d = report.to_dict()["sparsity"]
    assert d["spec"] == "topp:0.9" and d["rules"]["dense_first_steps"] == 1
    assert d["sparse_calls"] == 6 and d["dense_quantized_calls"] == 12 - 6
    assert d["mean_density"] == pytest.approx((1.0 + 0.6 + 0.25 + 0.35) / 6)
    assert d["mean_dropped_mass"] == pytest.approx((0.2 + 0.1 + 0.05 + 0.15) / 6)
    assert d["dropped_mass"] == DROPPED_MASS_ESTIMATED
    cells = {(c["site"], c["step"]): c for c in d["per_block_step"]}
    assert list(cells) == [("transformer/0", 1), ("transformer/0", 2), ("transformer/1", 1)]
    assert cells[("transformer/1", 1)] == {"site": "transformer/1", "step": 1, "calls": 2, "density": 0.3,
                                           "dropped_mass": pytest.approx(0.1)}
    assert "block maps (topp:0.9): 6 of 12 quantized calls, mean density 0.367" in report.summary()
    json.dumps(report.to_dict())  # JSON-ready
    report.reset()
    assert report.to_dict()["sparsity"]["per_block_step"] == [] and report.sparse_calls == 0


def test_report_says_a_static_maps_dropped_mass_is_not_estimated():
    report = sparse_report("radial")
    report.record_sparse("transformer/0", 1, SparseSums(2, 1.2, 0.0, 0))
    d = report.to_dict()["sparsity"]
    assert d["mean_density"] == pytest.approx(0.6) and d["mean_dropped_mass"] is None
    assert d["dropped_mass"] == DROPPED_MASS_NOT_ESTIMATED
    assert d["per_block_step"][0]["dropped_mass"] is None
    assert "dropped mass not estimated (static maps)" in report.summary()
    report.record_sparse("transformer/1", 1, SparseSums(2, 1.0, 0.3, 2))  # a block with its own top-p map
    assert report.to_dict()["sparsity"]["dropped_mass"].startswith("estimated for 2 of 4 sparse calls")


def test_report_of_a_dense_run_has_no_sparsity_entry():
    report = RunReport(recipe="int8-fp8", backend_requested="reference")
    assert report.to_dict()["sparsity"] is None and "block maps" not in report.summary()
    # a schedule with a block's own map counts as configured even when the config has none
    report.sparsity_rules = {"block_sparsity": [[0, "topp:0.9"]]}
    assert report.to_dict()["sparsity"]["spec"] == "none"
