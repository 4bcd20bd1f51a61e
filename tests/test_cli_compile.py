"""`rotvid generate --compile` and `rotvid eval --compile` (CPU, tiny Wan).

The compile backend is swapped for one that counts the graphs and runs them as traced, so these
tests check the wiring (what gets compiled, the progress line, the sidecar) in seconds; inductor
itself is covered by tests/pipelines/test_compile.py.
"""

import json

import numpy as np
import pytest
import torch

import rotvid.pipelines.attach as attach
import rotvid.pipelines.compiling as compiling
from rotvid.eval.video_io import iter_frames
from tests.test_cli import TINY, assert_fails, run, tiny_wan  # noqa: F401  (fixture)
from tests.graph_counter import GraphCounter



@pytest.fixture
def counting_compile(monkeypatch):
    counter = GraphCounter()
    real = compiling.compile_options

    def with_counter(compile):
        options = real(compile)
        return None if options is None else {**options, "backend": counter}

    monkeypatch.setattr(compiling, "compile_options", with_counter)  # the untouched pipeline's compile
    monkeypatch.setattr(attach, "compile_options", with_counter)  # apply(..., compile=True)
    torch._dynamo.reset()
    yield counter
    torch._dynamo.reset()


@pytest.mark.parametrize("recipe", ["int4", "fp16"])
def test_generate_compile_equals_eager_and_says_it_compiles(tiny_wan, tmp_path, counting_compile, recipe):  # noqa: F811
    args = ["generate", "-p", "a red cat runs", "--model", tiny_wan, *TINY, "--schedule", "none", "--recipe", recipe]
    eager, compiled = tmp_path / "eager.mp4", tmp_path / "compiled.mp4"
    assert run(*args, "--quiet", "--out", eager).exit_code == 0
    assert counting_compile.graphs == 0
    r = run(*args, "--compile", "--out", compiled)
    assert r.exit_code == 0, r.output
    assert "compiling the transformer (first step is slow) ..." in r.stderr
    assert counting_compile.graphs == 1  # cond and uncond share one graph; schedule none: one plan
    assert all(np.array_equal(a, b) for a, b in zip(iter_frames(eager), iter_frames(compiled), strict=True))
    side_e = json.loads(eager.with_suffix(".json").read_text())
    side_c = json.loads(compiled.with_suffix(".json").read_text())
    assert side_c["compiled"] is True and side_e["compiled"] is False
    assert side_c["run_report"] == side_e["run_report"]
    if recipe == "fp16":  # nothing attached: no report to compare
        assert side_c["run_report"] is None
    else:  # the compiled run counted its calls like the eager one
        assert side_c["run_report"]["quantized_calls"] > 0


def test_eval_compile_generates_compiled_and_needs_the_generating_form(
    tiny_wan, tmp_path, counting_compile,  # noqa: F811
):
    pf = tmp_path / "prompts.txt"
    pf.write_text("a red cat runs\n")
    out = tmp_path / "ev"
    r = run("eval", "--prompt-file", pf, "--model", tiny_wan, "--variants", "int4:half", *TINY,
            "--schedule", "none", "--out", out, "--compile")
    assert r.exit_code == 0, r.output
    assert r.stderr.count("compiling the transformer") == 2  # the reference and the variant
    assert counting_compile.graphs == 2
    sides = [json.loads(p.read_text()) for p in (out / "videos").rglob("*.json")]
    assert len(sides) == 2 and all(s["compiled"] for s in sides)
    a = tmp_path / "a.mp4"
    a.write_bytes(b"")
    assert_fails(run("eval", a, a, "--compile", "--out", tmp_path / "ev2"), "--compile")
