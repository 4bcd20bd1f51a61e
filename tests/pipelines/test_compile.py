"""rotvid under torch.compile on the tiny pipelines (CPU): fullgraph, equal to eager, few graphs, counts.

Backends: ``torch._dynamo.explain`` for graph breaks; a counting backend (the traced graph run
as is) or ``aot_eager`` (AOTAutograd + functionalization, no code generation) for equality and
graph counts: both run the same ATen ops as eager, so their outputs must equal eager *bit for
bit* — any difference means the compiled graph computes something else (a stale RoPE table,
another plan). One test uses inductor, whose generated code reorders float32 arithmetic.
"""

import pytest
import torch
import torch.nn.functional as F

import rotvid.kernels as kernels
from rotvid.pipelines import RotvidConfig, Schedule, apply, remove
from rotvid.pipelines.attach import HANDLE_ATTR
from rotvid.pipelines.compiling import compile_options
from rotvid.pipelines.report import RunReport
from rotvid.pipelines.runtime import MASK_NOT_PADDING, AttentionSite, Runtime
from rotvid.pipelines.step_tracker import StepTracker
from rotvid.pipelines.tiny import tiny_call_kwargs
from tests.graph_counter import GraphCounter

FAMILIES = ["wan", "hunyuan_video", "cogvideox"]
# First and last step FP16, first block of each stack FP16: a mixed plan in the middle steps.
MIXED = Schedule(fp16_first_steps=1, fp16_last_steps=1, fp16_first_blocks=1)



@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


def run(pipe, family, steps=3):
    return pipe(**tiny_call_kwargs(family, steps=steps)).frames


def eager_run(pipe, family, cfg, steps):
    """``cfg`` applied without compile for one run of ``steps``, then removed: the frames, the report (as a dict) and
    the transformer forwards per step -- what the compiled run must reproduce."""
    handle = apply(pipe, cfg)
    try:
        return run(pipe, family, steps), handle.report.to_dict(), dict(handle.tracker.forwards_per_step)
    finally:
        remove(pipe)


def transformer_inputs(pipe, family, **call_kw):
    """The (args, kwargs) the pipeline passes to its transformer (first forward of a 1-step run;
    ``call_kw``: more :func:`tiny_call_kwargs` arguments, e.g. ``size``)."""
    seen = []
    hook = pipe.transformer.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append((args, kwargs)) if not seen else None, with_kwargs=True
    )
    try:
        pipe(**tiny_call_kwargs(family, steps=1, **call_kw))
    finally:
        hook.remove()
    return seen[0]


@pytest.mark.parametrize("recipe, rotation", [("fp16", "half"), ("int4", "half"), ("int4", "full")])
@pytest.mark.parametrize("family", [*FAMILIES, "cogvideox-2b"])
def test_fullgraph_without_graph_break(tiny, family, recipe, rotation):
    """``full``: the Walsh–Hadamard transform after the RoPE table, traced like the rest; CogVideoX-2B (no RoPE):
    the table of identity rows built inside the graph."""
    pipe = tiny(family, num_layers=2)
    args, kwargs = transformer_inputs(pipe, family)
    handle = apply(pipe, RotvidConfig(recipe=recipe, rotation=rotation, backend="reference"))
    try:
        handle.tracker.begin(3)
        handle.tracker.set_step(1)
        explained = torch._dynamo.explain(pipe.transformer)(*args, **kwargs)
        # Twice, with fresh inputs: the second forward must not need a new graph (no stale state).
        counter = GraphCounter()
        compiled = torch.compile(pipe.transformer, backend=counter, fullgraph=True)
        with torch.no_grad():
            eager = pipe.transformer(*args, **kwargs)[0]
            outs = [compiled(*args, **kwargs)[0] for _ in range(2)]
    finally:
        remove(pipe)
    assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]
    assert explained.graph_count == 1
    assert counter.graphs == 1
    assert all(torch.equal(o, eager) for o in outs)
    rep = handle.report  # explain, eager and the two compiled forwards: 4 forwards
    assert rep.total_calls == 4 * 2
    if recipe == "int4":
        assert rep.quantized_calls == rep.total_calls and rep.fallback_calls == 0
    else:
        assert rep.fp16_calls == rep.total_calls


@pytest.mark.parametrize("family", FAMILIES)
def test_compiled_run_equals_eager_with_one_graph_per_plan_and_the_same_report(tiny, family):
    pipe = tiny(family)
    steps = 5
    cfg = RotvidConfig(recipe="int4", backend="reference", schedule=MIXED)
    ref, ref_report, ref_forwards = eager_run(pipe, family, cfg, steps)
    counter = GraphCounter()
    handle = apply(pipe, cfg, compile={"backend": counter})
    try:
        out = run(pipe, family, steps)
        graphs_first_run = counter.graphs
        report = handle.report.to_dict()
        forwards = dict(handle.tracker.forwards_per_step)
        handle.reset_report()
        again = run(pipe, family, steps)
    finally:
        remove(pipe)
    assert torch.equal(out, ref) and torch.equal(again, ref)
    # Two plans: every block FP16 (steps 0 and 4), block 0 of each stack FP16 (steps 1-3).
    assert graphs_first_run == 2
    assert counter.graphs == 2  # the second run reuses both graphs
    assert report == ref_report and forwards == ref_forwards
    assert report["quantized_calls"] > 0 and report["fp16_calls"] > 0
    reasons = {"schedule: first 1 steps", "schedule: last 1 steps", "schedule: first 1 blocks"}
    assert set(report["fp16_reasons"]) == reasons


def test_graph_count_is_the_number_of_distinct_plans(tiny):
    """A table cell that only one step has gives that step its own plan, hence its own graph."""
    pipe = tiny("wan")
    sched = Schedule(fp16_first_steps=1, fp16_cells=((2, 3),))
    counter = GraphCounter()
    handle = apply(pipe, RotvidConfig(recipe="int4", backend="reference", schedule=sched),
                   compile={"backend": counter})
    try:
        run(pipe, "wan", steps=5)
    finally:
        remove(pipe)
    # Plans: step 0 (all FP16), steps 1, 3, 4 (all quantized), step 2 (block 3 FP16).
    assert counter.graphs == 3
    assert handle.report.fp16_reasons == {"schedule: first 1 steps": 4 * 2, "schedule: table": 2}


@pytest.mark.parametrize("family", ["hunyuan_video", "cogvideox"])
def test_a_table_with_many_distinct_plans_reads_the_plan_as_data_in_one_graph(tiny, family):
    """A calibrated-style table whose FP16 blocks change every step: 8 distinct plans in 8 steps.

    One graph per plan would hit dynamo's recompile limit (8) and fail under fullgraph; the plan
    goes to the graph as data instead (one graph), with the same output and counts as eager.
    HunyuanVideo also has its text-padding mask checked on the device in the same torch.cond.
    """
    pipe = tiny(family)
    steps = 8
    cells = tuple((s, b) for s in range(steps) for b in range(4) if (s + 1) >> b & 1)  # block b FP16: bit b of s+1
    cfg = RotvidConfig(recipe="int4", backend="reference", schedule=Schedule(fp16_cells=cells))
    ref, ref_report, _ = eager_run(pipe, family, cfg, steps)
    counter = GraphCounter()
    handle = apply(pipe, cfg, compile={"backend": counter})
    try:
        out = run(pipe, family, steps)
        assert handle.runtime.plan_as_data
    finally:
        remove(pipe)
    assert counter.graphs == 1
    assert torch.equal(out, ref)
    report = handle.report.to_dict()
    assert report == ref_report
    assert report["fp16_reasons"] == {"schedule: table": sum(bin(s + 1).count("1") for s in range(steps))}


def test_aot_eager_with_a_mask_equals_eager(tiny):
    """HunyuanVideo passes a text-padding mask: under compile it takes the torch.cond path."""
    pipe = tiny("hunyuan_video")
    cfg = RotvidConfig(recipe="int4", backend="reference", schedule=MIXED)
    ref, _, _ = eager_run(pipe, "hunyuan_video", cfg, steps=3)
    handle = apply(pipe, cfg, compile={"backend": "aot_eager"})
    try:
        out = run(pipe, "hunyuan_video", steps=3)
    finally:
        remove(pipe)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2  # all-FP16 and mixed plans
    assert torch.equal(out, ref)
    assert handle.report.fallback_calls == 0 and handle.report.quantized_calls == 1 * 2  # step 1, 1 block per stack


def test_inductor_matches_eager(tiny):
    """Inductor's generated code reorders float32 sums: equal to eager within float32 rounding.

    The fp16 recipe (rotations and V/O Hadamard, FP16 attention) keeps no quantizer whose rounding
    a 1-ulp difference could flip, so the bound is the same as test_apply's eager-vs-untouched one:
    2e-5 of the output's scale for a few dozen float32 layers.
    """
    pipe = tiny("wan", num_layers=2)
    cfg = RotvidConfig(recipe="fp16", rotation="half")
    ref, _, _ = eager_run(pipe, "wan", cfg, steps=2)
    handle = apply(pipe, cfg, compile=True)
    try:
        out = run(pipe, "wan", steps=2)
    finally:
        remove(pipe)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1  # it did compile, once
    assert (out - ref).abs().max().item() <= 2e-5 * ref.abs().max().item()
    assert handle.report.fp16_calls == handle.report.total_calls == 2 * 2 * 2


def test_fallbacks_are_counted_under_compile(tiny):
    """A backend that cannot run the call (cuda on a CPU) is a fallback, compiled or not."""
    pipe = tiny("wan", num_layers=2)
    handle = apply(pipe, RotvidConfig(recipe="int4", backend="cuda"), compile={"backend": "aot_eager"})
    try:
        run(pipe, "wan", steps=2)
    finally:
        remove(pipe)
    rep = handle.report
    assert rep.fallback_calls == rep.total_calls == 2 * 2 * 2
    (reason,) = rep.fallbacks
    assert "cuda" in reason


class _MaskedAttention(torch.nn.Module):
    def __init__(self, runtime, site):
        super().__init__()
        self.runtime, self.site = runtime, site

    def forward(self, q, k, v, mask):
        fp16 = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # noqa: E731
        return self.runtime.attend(self.site, q, k, v, mask=mask, fp16_attention=fp16)


def test_mask_check_on_the_device_counts_the_fallback_in_the_same_graph():
    tracker = StepTracker()
    tracker.begin(2)
    report = RunReport(recipe="int4", backend_requested="reference")
    runtime = Runtime(RotvidConfig(recipe="int4", backend="reference"), tracker, report)
    site = AttentionSite("transformer", 0, 1, 0, 0, 1)
    module = _MaskedAttention(runtime, site)
    runtime.add_site(site, module)
    counter = GraphCounter()
    compiled = torch.compile(module, backend=counter, fullgraph=True)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 7, 64, generator=g) for _ in range(3))
    holes = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    holes[1, ..., 2] = False
    padded = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    padded[1, ..., 4:] = False
    with torch.no_grad():
        out_holes = compiled(q, k, v, holes)
        out_padded = compiled(q, k, v, padded)
    assert counter.graphs == 1
    assert torch.equal(out_holes, F.scaled_dot_product_attention(q, k, v, attn_mask=holes))
    # (RotvidConfig smooths Q and V for int4 by default; the dispatcher's own default is K only)
    ref = kernels.attention(q, k, v, recipe="int4", backend="reference", kv_lens=torch.tensor([7, 4]), smooth_v=True,
                            smooth_q=True)
    assert torch.equal(out_padded, ref)
    runtime.drain_counts()
    assert report.fallbacks == {MASK_NOT_PADDING: 1}
    assert report.quantized_calls == 1 and report.total_calls == 2


def test_remove_after_compile_leaves_a_usable_pipeline(tiny):
    pipe = tiny("cogvideox", num_layers=2)
    untouched = run(pipe, "cogvideox", steps=2)
    # apply compiled: remove un-compiles.
    apply(pipe, RotvidConfig(recipe="int4", backend="reference"), compile={"backend": "aot_eager"})
    run(pipe, "cogvideox", steps=2)
    remove(pipe)
    assert pipe.transformer._compiled_call_impl is None
    assert not [n for n, _ in pipe.transformer.named_buffers() if "rotvid" in n]
    assert torch.equal(run(pipe, "cogvideox", steps=2), untouched)
    # The user compiled after apply: remove leaves the compile; the next forward recompiles.
    apply(pipe, RotvidConfig(recipe="int4", backend="reference"))
    counter = GraphCounter()
    pipe.transformer.compile(backend=counter, fullgraph=True)
    try:
        run(pipe, "cogvideox", steps=2)
        remove(pipe)
        assert getattr(pipe, HANDLE_ATTR, None) is None
        after = run(pipe, "cogvideox", steps=2)
        assert counter.graphs >= 2  # rotvid's graph(s), then one for the original processors
        assert torch.equal(after, untouched)
    finally:
        pipe.transformer._compiled_call_impl = None


def test_compile_argument_is_checked():
    assert compile_options(False) is None
    assert compile_options(True) == {"fullgraph": True}
    assert compile_options({"mode": "max-autotune"}) == {"fullgraph": True, "mode": "max-autotune"}
    with pytest.raises(ValueError, match="compile: unknown torch.compile options"):
        compile_options({"modee": "x"})
    with pytest.raises(ValueError, match="compile: expected True, False or a dict"):
        compile_options("yes")


def test_apply_under_inference_mode_then_a_no_grad_run_counts(tiny):
    """The counters are normal tensors even when apply runs under inference_mode (pipelines use no_grad)."""
    pipe = tiny("wan", num_layers=2)
    with torch.inference_mode():
        handle = apply(pipe, RotvidConfig(recipe="fp16"))
    try:
        run(pipe, "wan", steps=1)
    finally:
        remove(pipe)
    assert handle.report.fp16_calls == 1 * 2 * 2


def test_compile_true_compiles_both_experts_of_wan22(tiny):
    pipe = tiny("wan2.2", num_layers=2)
    cfg = RotvidConfig(recipe="int4", backend="reference", schedule=MIXED)
    ref, _, _ = eager_run(pipe, "wan2.2", cfg, steps=4)
    counter = GraphCounter()
    handle = apply(pipe, cfg, compile={"backend": counter})
    try:
        assert handle.compiled == ["transformer", "transformer_2"]
        assert all(t._compiled_call_impl is not None for t in (pipe.transformer, pipe.transformer_2))
        out = run(pipe, "wan2.2", steps=4)
        forwards = dict(handle.tracker.forwards_per_step)
    finally:
        remove(pipe)
    assert all(t._compiled_call_impl is None for t in (pipe.transformer, pipe.transformer_2))
    assert torch.equal(out, ref)
    # Boundary 0.875: transformer runs steps 0-1, transformer_2 steps 2-3 (cond + uncond each).
    assert forwards == {0: {"transformer": 2}, 1: {"transformer": 2}, 2: {"transformer_2": 2}, 3: {"transformer_2": 2}}
    # One graph per (expert, plan): transformer all-FP16 (step 0) and mixed (1); transformer_2
    # mixed (2) and all-FP16 (3).
    assert counter.graphs == 4


def test_remove_gives_back_the_callers_own_compile(tiny):
    """A transformer the user compiled before apply(compile=...) is compiled the user's way again after remove."""
    pipe = tiny("wan", num_layers=2)
    pipe.transformer.compile(backend="eager")
    mine = pipe.transformer._compiled_call_impl
    handle = apply(pipe, RotvidConfig(recipe="int4", backend="reference"), compile={"backend": GraphCounter()})
    assert handle.compiled == ["transformer"] and pipe.transformer._compiled_call_impl is not mine
    remove(pipe)
    assert pipe.transformer._compiled_call_impl is mine
    assert not any(k.startswith("_rotvid") for k in vars(pipe.transformer))


def test_the_context_parallel_gather_is_made_traceable_only_below_torch_2_13(monkeypatch):
    """torch 2.11's dynamo skips ``torch._utils._maybe_view_chunk_cat`` (diffusers' CP output gather): below 2.13
    the collectives module gets the same function marked traceable, once; from 2.13 on nothing is touched. Without
    the wrap, a fullgraph compile under context parallelism fails on torch 2.11 (the GPU image's torch)."""
    from torch.distributed import _functional_collectives as funcol

    from rotvid.pipelines import compiling

    original = funcol._maybe_view_chunk_cat
    monkeypatch.setattr(funcol, "_maybe_view_chunk_cat", original)  # restored after the test
    monkeypatch.setattr(compiling, "_torch_version", lambda: (2, 13))
    compiling._trace_context_parallel_gather()
    assert funcol._maybe_view_chunk_cat is original
    monkeypatch.setattr(compiling, "_torch_version", lambda: (2, 11))
    compiling._trace_context_parallel_gather()
    wrapped = funcol._maybe_view_chunk_cat
    assert wrapped is not original and getattr(wrapped, compiling._TRACED_ATTR)
    compiling._trace_context_parallel_gather()  # idempotent: no wrap of the wrap
    assert funcol._maybe_view_chunk_cat is wrapped
    x = torch.arange(24.0).reshape(2, 3, 4)
    torch.testing.assert_close(wrapped(x, 2, 1), original(x, 2, 1), rtol=0, atol=0)
