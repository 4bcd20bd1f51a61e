"""Block maps in tiny pipeline runs (CPU, reference backend): the token grid of each family, which calls get a map,
that the map reaches the attention, the report's density, and every map kind under torch.compile fullgraph.

Sizes: 9 frames of 128x128 give 3 latent frames (more than one 128-token map block per sequence), 17 frames 5.
"""

import pytest
import torch

from rotvid.kernels.sparsity import TokenGrid
from rotvid.pipelines import RotvidConfig, Schedule, apply, remove
from rotvid.pipelines.tiny import tiny_call_kwargs
from tests.graph_counter import GraphCounter

SIZE = dict(frames=9, size=128)
# radial with the temporal band alone: a query tile keeps the key blocks of its own frames only
BAND_ONLY = "radial:band=0,window=0"


def config(sparsity, **schedule):
    return RotvidConfig(recipe="int8-fp8", backend="reference", sparsity=sparsity, schedule=Schedule(**schedule))


def run(pipe, family, steps=2, **size):
    return pipe(**tiny_call_kwargs(family, steps=steps, **(size or SIZE))).frames


def run_applied(pipe, family, cfg, steps=2, **size):
    handle = apply(pipe, cfg)
    try:
        out = run(pipe, family, steps, **size)
        return out, handle.report
    finally:
        remove(pipe)



@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize(
    "family, expected",
    [
        ("wan", lambda n: TokenGrid(3, 8, 8)),
        ("wan-i2v", lambda n: TokenGrid(2, 8, 8, prefix=64)),  # the first (image) frame: conditioning tokens
        ("hunyuan_video", lambda n: TokenGrid(3, 16, 16, suffix=n - 3 * 256)),  # text after the video
        ("cogvideox", lambda n: TokenGrid(3, 8, 8, prefix=n - 3 * 64)),  # text before the video
    ],
)
def test_token_grid_of_each_family_matches_its_attention_sequence(tiny, family, expected):
    pipe = tiny(family, num_layers=2)
    handle = apply(pipe, config("radial"))
    grids, lengths = [], []
    begin = handle.runtime.begin_forward
    handle.runtime.begin_forward = lambda name, grid, *a, **kw: (grids.append(grid), begin(name, grid, *a, **kw))
    handle.runtime.observers.append(lambda site, step, n, q, k, *rest: lengths.append(q.shape[2]))
    try:
        run(pipe, family, steps=1)
    finally:
        remove(pipe)
    n = lengths[0]
    assert set(lengths) == {n} and set(grids) == {expected(n)} and expected(n).num_tokens == n
    assert handle.report.fallback_calls == 0 and handle.report.sparse_calls == handle.report.quantized_calls > 0


def test_only_the_quantized_calls_the_rules_leave_sparse_get_a_map(tiny):
    pipe = tiny("wan", num_layers=3)
    # 4 steps x 3 blocks: FP16 at step 0 and in the last block; dense (no map) in steps 0-1 and block 0
    cfg = config("topp:0.9", fp16_first_steps=1, fp16_last_blocks=1, dense_first_steps=2, dense_blocks=(0,))
    _, report = run_applied(pipe, "wan", cfg, steps=4)
    cells = {(c["site"], c["step"]): c["calls"] for c in report.to_dict()["sparsity"]["per_block_step"]}
    assert cells == {("transformer/1", 2): 2, ("transformer/1", 3): 2}  # cond and uncond forwards
    assert report.sparse_calls == 4 and report.fp16_calls == (3 + 3) * 2 and report.fallback_calls == 0


def test_a_full_map_gives_the_dense_bits_and_a_sparse_map_changes_the_output(tiny):
    pipe = tiny("wan", num_layers=2)
    dense, _ = run_applied(pipe, "wan", config("none"))
    full, full_report = run_applied(pipe, "wan", config("radial:band=100"))
    sparse, sparse_report = run_applied(pipe, "wan", config(BAND_ONLY))
    assert full_report.mean_density == 1.0 and torch.equal(full, dense)
    # 3 frames of 64 tokens: blocks {frames 0-1} and {frame 2}, only the diagonal kept
    assert sparse_report.mean_density == 0.5 and not torch.equal(sparse, dense)
    assert sparse_report.mean_dropped_mass is None  # a static map: not estimated
    assert "not estimated" in sparse_report.to_dict()["sparsity"]["dropped_mass"]


def test_wan_i2v_keeps_the_first_frame_both_ways(tiny):
    """5 latent frames: the image frame (64 tokens) and frame 1 in block 0, frames 2-3 in block 1, frame 4 in
    block 2. With the band alone, blocks 1 and 2 skip each other but both keep block 0 (conditioning): 7 of 9."""
    pipe = tiny("wan-i2v", num_layers=2)
    _, report = run_applied(pipe, "wan-i2v", config(BAND_ONLY), steps=1, frames=17, size=128)
    assert report.mean_density == pytest.approx(7 / 9) and report.fallback_calls == 0


def test_topp_judges_the_rotated_q_and_k(tiny):
    """Wan defers its RoPE·R table to the attention call; the top-p estimate must see the rotated tensors, as it
    does when an observer makes the runtime rotate first."""
    pipe = tiny("wan", num_layers=2)
    cfg = config("topp:0.6,sim=-1")
    _, deferred = run_applied(pipe, "wan", cfg)
    handle = apply(pipe, cfg)
    handle.runtime.observers.append(lambda *args: None)  # rotates q and k before the call
    try:
        run(pipe, "wan")
        rotated = handle.report
    finally:
        remove(pipe)
    cells = lambda r: [(c["site"], c["step"], c["density"], c["dropped_mass"])  # noqa: E731
                       for c in r.to_dict()["sparsity"]["per_block_step"]]
    assert cells(deferred) == cells(rotated) and deferred.mean_density < 1


def test_a_forward_the_guard_did_not_see_is_a_counted_fallback_for_a_static_map(tiny):
    """torch.compile(transformer) traces the forward guard, which then prepares no map: every call that needed one
    runs FP16, counted with the reason (never a silent dense or stale map)."""
    pipe = tiny("wan", num_layers=2)
    seen = []
    hook = pipe.transformer.register_forward_pre_hook(lambda m, a, kw: seen.append((a, kw)) if not seen else None,
                                                      with_kwargs=True)
    try:
        run(pipe, "wan", steps=1)
    finally:
        hook.remove()
    args, kwargs = seen[0]
    handle = apply(pipe, config("radial"))
    try:
        handle.tracker.begin(2)
        handle.tracker.set_step(1)
        with torch.no_grad():
            pipe.transformer._call_impl(*args, **kwargs)  # the module's forward without the guard in front
        report = handle.report
    finally:
        remove(pipe)
    assert report.fallback_calls == 2 and report.quantized_calls == 0 and report.sparse_calls == 0
    (reason,) = report.fallbacks
    assert reason.startswith("sparsity radial: no token grid for this forward") and "apply(compile=True)" in reason


@pytest.mark.parametrize(
    "family, sparsity, size",
    [
        ("wan", BAND_ONLY, SIZE),
        ("wan", "topp:0.6,sim=-1", SIZE),  # (sim=-1: no block of the tiny random model is kept for its mean alone)
        ("hunyuan_video", "topp:0.6,sim=-1", SIZE),  # a key-padding mask: the call and its map under torch.cond
        ("cogvideox", BAND_ONLY, dict(frames=9, size=256)),  # text prefix; cond and uncond batched
    ],
)
def test_each_map_kind_compiles_fullgraph_and_equals_eager(tiny, family, sparsity, size):
    pipe = tiny(family, num_layers=2)
    cfg = config(sparsity, dense_first_steps=1)
    eager, eager_report = run_applied(pipe, family, cfg, steps=3, **size)
    counter = GraphCounter()
    handle = apply(pipe, cfg, compile={"backend": counter})  # fullgraph=True: a graph break is an error
    try:
        compiled = run(pipe, family, steps=3, **size)
        report = handle.report
    finally:
        remove(pipe)
    assert torch.equal(compiled, eager)
    assert counter.graphs == 2  # one per (plan, sparse plan): the dense first step, then the mapped steps
    assert report.fallback_calls == 0 and report.sparse_calls == eager_report.sparse_calls > 0
    assert report.to_dict()["sparsity"] == eager_report.to_dict()["sparsity"]
    assert report.mean_density < 1
    assert (report.mean_dropped_mass is None) == sparsity.startswith("radial")


@pytest.mark.parametrize(
    "schedule, graphs",
    [
        # plans: all FP16 (steps 0, 4), block 0 FP16 (1-3); maps from step 2. The FP16 cells' map entries are
        # dropped, so step 0 and step 4 share a graph: 3 graphs, not 4
        (dict(fp16_first_steps=1, fp16_last_steps=1, fp16_first_blocks=1, dense_first_steps=2), 3),
        # 5 distinct (plan, sparse plan) pairs (> MAX_PLANS_PER_RUN): the plan goes to the graph as data
        # (torch.cond around each call and its map); one graph per sparse plan: dense step 0, maps after
        (dict(fp16_cells=((2, 0), (3, 1), (4, 0), (4, 1)), dense_first_steps=1), 2),
    ],
)
def test_compiled_graphs_per_plan_with_a_map(tiny, schedule, graphs):
    pipe = tiny("wan", num_layers=2)
    cfg = config("topp:0.6,sim=-1", **schedule)
    eager, eager_report = run_applied(pipe, "wan", cfg, steps=5)
    counter = GraphCounter()
    handle = apply(pipe, cfg, compile={"backend": counter})
    try:
        compiled = run(pipe, "wan", steps=5)
        report, as_data = handle.report, handle.runtime.plan_as_data
    finally:
        remove(pipe)
    assert as_data == (graphs == 2)
    assert torch.equal(compiled, eager) and counter.graphs == graphs
    assert report.to_dict()["sparsity"] == eager_report.to_dict()["sparsity"] and report.sparse_calls > 0
    assert report.to_dict()["per_block"] == eager_report.to_dict()["per_block"]
