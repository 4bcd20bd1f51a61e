"""The oracle map and the kept mass in tiny pipeline runs (CPU, reference backend): the report and the sidecar fields,
the warning, the switch, and kept mass <= oracle kept mass for every map kind."""

import logging

import pytest
import torch

from rotvid.pipelines import RotvidConfig, Schedule, apply, remove
from rotvid.pipelines.tiny import tiny_call_kwargs
from tests.pipelines import test_sparse_runs as sparse_runs
from tests.pipelines.test_sparse_runs import fresh_dynamo  # noqa: F401 (its autouse fixture, shared)

SIZE = dict(frames=17, size=128)  # 5 latent frames of 64 tokens: 320 tokens, 3 map blocks


def config(sparsity, measure=False, **schedule):
    return RotvidConfig(recipe="int8-fp8", backend="reference", sparsity=sparsity, measure_kept_mass=measure,
                        schedule=Schedule(**schedule))


def run_applied(pipe, cfg, steps=2):
    return sparse_runs.run_applied(pipe, "wan", cfg, steps, **SIZE)


def test_oracle_run_reports_kept_mass_and_oracle_kept_mass(tiny, caplog):
    pipe = tiny("wan", num_layers=2)
    with caplog.at_level(logging.WARNING, logger="rotvid"):
        out, report = run_applied(pipe, config("oracle:0.5", measure=True))
    warnings = [r for r in caplog.records if "evaluation tool" in r.getMessage()]
    assert len(warnings) == 1 and "oracle:0.5" in warnings[0].getMessage()
    assert torch.isfinite(out).all() and report.fallback_calls == 0
    d = report.to_dict()["sparsity"]
    assert d["spec"] == "oracle:0.5" and d["sparse_calls"] == report.quantized_calls > 0
    assert d["kept_mass_calls"] == d["sparse_calls"]
    assert d["mean_density"] == pytest.approx(2 / 3)  # ceil(0.5 * 3) of 3 blocks per row
    kept, best = d["mean_kept_mass"], d["mean_oracle_kept_mass"]
    assert 0 < kept <= 1 and kept == pytest.approx(best, abs=1e-6)  # the oracle is its own best
    # exact for the oracle; a mean over query tiles, where the kept mass is one over rows (the last tile has 64)
    assert d["mean_dropped_mass"] == pytest.approx(1 - kept, abs=0.01)
    assert all("kept_mass" in c and "oracle_kept_mass" in c for c in d["per_block_step"])
    assert f"kept mass {kept:.4f} (oracle at the same density {best:.4f}" in report.summary()


def test_oracle_kept_mass_is_measured_without_the_switch(tiny):
    pipe = tiny("wan", num_layers=2)
    _, report = run_applied(pipe, config("oracle:0.5"), steps=1)
    assert report.kept_mass_calls == report.sparse_calls > 0 and report.mean_kept_mass is not None


@pytest.mark.parametrize("sparsity", ["radial:band=0,window=0", "topp:0.6,sim=-1"])
def test_kept_mass_of_other_maps_only_when_asked_and_at_most_the_oracles(tiny, sparsity):
    pipe = tiny("wan", num_layers=2)
    _, plain = run_applied(pipe, config(sparsity), steps=1)
    assert plain.mean_kept_mass is None and plain.kept_mass_calls == 0
    assert "kept_mass" not in plain.to_dict()["sparsity"]["per_block_step"][0]
    assert "kept mass" not in plain.summary()
    out, measured = run_applied(pipe, config(sparsity, measure=True), steps=1)
    d = measured.to_dict()["sparsity"]
    assert d["kept_mass_calls"] == d["sparse_calls"] > 0
    assert 0 < d["mean_kept_mass"] <= d["mean_oracle_kept_mass"] + 1e-6 <= 1 + 1e-6
    for cell in d["per_block_step"]:
        assert cell["kept_mass"] <= cell["oracle_kept_mass"] + 1e-6
    # measuring does not change the video
    again, _ = run_applied(pipe, config(sparsity), steps=1)
    assert torch.equal(out, again)


@pytest.mark.parametrize("sparsity, measure", [("oracle:0.5", False), ("topp:0.6,sim=-1", True),
                                               ("radial:band=0,window=0", True)])
def test_oracle_and_kept_mass_compile_fullgraph_and_equal_eager(tiny, sparsity, measure):
    from tests.graph_counter import GraphCounter

    pipe = tiny("wan", num_layers=2)
    cfg = config(sparsity, measure)
    eager, eager_report = run_applied(pipe, cfg)
    handle = apply(pipe, cfg, compile={"backend": GraphCounter()})  # fullgraph=True: a graph break is an error
    try:
        compiled = pipe(**tiny_call_kwargs("wan", steps=2, **SIZE)).frames
        report = handle.report
    finally:
        remove(pipe)
    assert torch.equal(compiled, eager) and report.fallback_calls == 0
    d, e = report.to_dict()["sparsity"], eager_report.to_dict()["sparsity"]
    assert d["kept_mass_calls"] == e["kept_mass_calls"] == d["sparse_calls"] > 0
    assert d["mean_kept_mass"] == pytest.approx(e["mean_kept_mass"], abs=1e-6)
    assert d["mean_oracle_kept_mass"] == pytest.approx(e["mean_oracle_kept_mass"], abs=1e-6)
