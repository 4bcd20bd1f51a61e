"""What must agree across the ranks of a context-parallel run (2 gloo processes, tiny Wan, reference backend, int4;
and on two GPUs: NCCL, bf16, the CUDA backend, int8-fp8 -- or on ``ROTVID_TEST_GPUS`` of them: the tiny Wan's 2 heads
on 4 GPUs run as Ulysses 2 × ring 2, :func:`~rotvid.pipelines.context_parallel.split_degrees`).

* the forward guard's **non-finite redo**: one rank's output is made non-finite (a forward hook on rank 1 only);
  both ranks must redo the forward in FP16 and record it -- a redo decided on one rank alone runs its all-to-alls
  alone and hangs (the deadline turns that into a failure);
* **diffusers' caches**: TaylorSeer decides from the step alone, so every rank runs the tail blocks in the same
  forwards (counted per rank and compared); FirstBlockCache (decides from each rank's shard) and MagCache
  (diffusers' hook fails under CP) are refused with one error naming the cache and context parallelism, at
  ``apply`` and -- enabled after ``apply`` -- at the forward;
* **compile**: ``apply(compile=True)`` (fullgraph, a counting backend) under CP gives the eager CP output, with one
  graph for all the steps (no recompile).
"""

from __future__ import annotations

import pytest
import torch

from tests.pipelines.cp_spawn import finish, gpu_world, join_group, needs_gloo, needs_gpus, run_group

STEPS = 4
# (recipe, backend) of each device kind's run
RUNS = {"cpu": ("int4", "reference"), "cuda": ("int8-fp8", "cuda")}


def _inputs(tr, device, dtype):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, tr.config.in_channels, 4, 6, 10, generator=g)
    text = torch.randn(2, 7, tr.config.text_dim, generator=g)
    return dict(hidden_states=x.to(device, dtype), encoder_hidden_states=text.to(device, dtype),
                timestep=torch.tensor([700, 300]).to(device), return_dict=False)


def _load(folder, device, dtype, world):
    from diffusers import WanTransformer3DModel

    from rotvid.pipelines.context_parallel import enable_context_parallel, split_degrees

    tr = WanTransformer3DModel.from_pretrained(f"{folder}/transformer", torch_dtype=dtype).to(device).eval()
    enable_context_parallel(tr, *split_degrees(tr.config.num_attention_heads, world))
    return tr


def _guard_case(tr, rank, inputs, run):
    from rotvid.pipelines import RotvidConfig, Schedule, apply, remove

    handle = apply(tr, RotvidConfig(recipe=run[0], backend=run[1], schedule=Schedule()))

    def poison(module, args, output):  # rank 1's output only, and not the redo's
        if rank == 1 and not handle.runtime.redo:
            return (torch.full_like(output[0], float("nan")),) + tuple(output[1:])
        return output

    hook = tr.register_forward_hook(poison)
    try:
        handle.tracker.begin(1)
        handle.tracker.set_step(0)
        with torch.no_grad():
            out = tr(**inputs)[0].float()
        report = handle.report.to_dict()
    finally:
        hook.remove()
        remove(tr)
    return {"redos": report["redos"], "finite": bool(torch.isfinite(out).all()), "sum": out.double().sum().item(),
            "fp16_calls": report["total_calls"] - report["quantized_calls"]}


def _cache_config(kind):
    from diffusers import FirstBlockCacheConfig, MagCacheConfig, TaylorSeerCacheConfig

    if kind == "first-block":
        return FirstBlockCacheConfig(threshold=0.5)
    if kind == "taylorseer":
        return TaylorSeerCacheConfig(cache_interval=2, disable_cache_before_step=1)
    return MagCacheConfig(threshold=1.0, num_inference_steps=STEPS, retention_ratio=0.0, mag_ratios=torch.ones(STEPS))


def _cache_case(tr, kind, inputs, run):
    """Per forward, whether the last block's self-attention ran on this rank (the skip decisions), and the outputs' sums."""
    from rotvid.pipelines import RotvidConfig, Schedule, apply, remove

    ran = []
    hook = tr.blocks[-1].attn1.register_forward_pre_hook(lambda m, a: ran.__setitem__(-1, True))
    tr.enable_cache(_cache_config(kind))
    try:
        handle = apply(tr, RotvidConfig(recipe=run[0], backend=run[1], schedule=Schedule()))
        try:
            handle.tracker.begin(STEPS)
            sums = []
            for step in range(STEPS):
                handle.tracker.set_step(step)
                ran.append(False)
                with torch.no_grad(), tr.cache_context("cond"):
                    sums.append(tr(**inputs)[0].double().sum().item())
        finally:
            remove(tr)
    finally:
        hook.remove()
        tr.disable_cache()
    return {"tail_ran": ran, "sums": sums}


def _refusals(tr, kind, inputs, run):
    """A cache refused under CP: by apply, and at the forward when enabled after apply."""
    from rotvid.pipelines import RotvidConfig, Schedule, apply, remove

    cfg = RotvidConfig(recipe=run[0], backend=run[1], schedule=Schedule())
    errors = []
    tr.enable_cache(_cache_config(kind))
    try:
        apply(tr, cfg)
    except ValueError as e:
        errors.append(str(e))
    finally:
        tr.disable_cache()
    handle = apply(tr, cfg)
    try:
        tr.enable_cache(_cache_config(kind))
        handle.tracker.begin(1)
        handle.tracker.set_step(0)
        try:
            with torch.no_grad(), tr.cache_context("cond"):
                tr(**inputs)
        except ValueError as e:
            errors.append(str(e))
        finally:
            tr.disable_cache()
    finally:
        remove(tr)
    return errors


def _compile_case(tr, inputs, run):
    """``apply(compile=True)`` CP (fullgraph, a counting backend) vs eager CP over STEPS steps, on a transformer that
    has run no forward yet: the compiled forward is its first (diffusers' CP input hook reads the forward's signature
    on its first call, which dynamo cannot trace: compile_transformers fills that beforehand)."""
    from rotvid.pipelines import RotvidConfig, Schedule, apply, remove
    from tests.graph_counter import GraphCounter

    cfg = RotvidConfig(recipe=run[0], rotation="half", backend=run[1], schedule=Schedule())
    outs = {}
    counter = GraphCounter()
    for mode, compile_opt in (("compiled", {"backend": counter}), ("eager", False)):
        torch._dynamo.reset()
        handle = apply(tr, cfg, compile=compile_opt)
        try:
            handle.tracker.begin(STEPS)
            outs[mode] = []
            for step in range(STEPS):
                handle.tracker.set_step(step)
                with torch.no_grad():
                    outs[mode].append(tr(**inputs)[0].float())
            report = handle.report.to_dict()
        finally:
            remove(tr)
    return {"max_abs": max((a - b).abs().max().item() for a, b in zip(outs["eager"], outs["compiled"])),
            "graphs": counter.graphs, "quantized": report["quantized_calls"], "calls": report["total_calls"]}


def _worker(rank, world, port, folder, out_dir, device_kind="cpu"):
    device, dtype = join_group(rank, world, port, device_kind)
    run = RUNS[device_kind]
    tr = _load(folder, device, dtype, world)
    inputs = _inputs(tr, device, dtype)
    results = {"rank": rank, "guard": _guard_case(tr, rank, inputs, run),
               "caches": {kind: _cache_case(tr, kind, inputs, run) for kind in ("taylorseer",)},
               "refusals": {kind: _refusals(tr, kind, inputs, run) for kind in ("first-block", "mag")}}
    try:
        fresh = _load(folder, device, dtype, world)  # no forward yet: the compiled one is its first
        results["compile"] = _compile_case(fresh, inputs, run)
    except Exception as e:  # reported by the parent, after the other checks' results are written
        results["compile"] = {"error": f"{type(e).__name__}: {e}"[:2000]}
    finish(out_dir, rank, results)


def _run(tmp_path_factory, device_kind, world=2):
    from rotvid.pipelines.tiny import build_tiny_pipeline

    folder = tmp_path_factory.mktemp(f"cp-compose-wan-{device_kind}")  # its own folder (the tiny fixture caches its own)
    build_tiny_pipeline("wan", folder, num_layers=4)
    out = tmp_path_factory.mktemp(f"cp-compose-{device_kind}")
    return run_group(_worker, (str(folder), str(out), device_kind), out, deadline_s=300, world=world)


@pytest.fixture(scope="module")
def group_results(tmp_path_factory):
    """Both ranks' results of one gloo run of :func:`_worker` (the tests below read their parts)."""
    needs_gloo()
    return _run(tmp_path_factory, "cpu")


@pytest.fixture(scope="module")
def nccl_results(tmp_path_factory, monkeypatch_module):
    """The same on two GPUs (``ROTVID_TEST_GPUS``: 4 or 8; NCCL, the CUDA backend, int8-fp8; NVLink multicast off)."""
    world = gpu_world()
    needs_gpus(monkeypatch_module, world)
    return _run(tmp_path_factory, "cuda", world)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _check_composes(results):
    r0 = results[0]

    # the redo: on both ranks, finite, the same output
    for res in results:
        g = res["guard"]
        assert len(g["redos"]) == 1 and g["redos"][0]["finite_after_redo"] is True, (res["rank"], g)
        assert g["finite"] and g["fp16_calls"] == 4, (res["rank"], g)  # the redo's 4 calls ran FP16
    assert all(res["guard"]["sum"] == r0["guard"]["sum"] for res in results)

    # the caches: the same skip decisions on every rank, some skipped
    for kind in ("taylorseer",):
        for res in results[1:]:
            a, b = r0["caches"][kind], res["caches"][kind]
            assert a["tail_ran"] == b["tail_ran"], (kind, res["rank"])
            # (at these settings TaylorSeer skips no self-attention call, as in test_caches.py: agreement and no
            # hang are what this checks)
            assert a["sums"] == b["sums"], (kind, res["rank"])

    # FirstBlockCache, MagCache: refused at apply and at the forward, naming both
    for res in results:
        for kind, name in (("first-block", "FirstBlockCacheConfig"), ("mag", "MagCacheConfig")):
            msgs = res["refusals"][kind]
            assert len(msgs) == 2, (kind, msgs)
            for msg in msgs:
                assert name in msg and "context parallelism" in msg, msg


def _check_compiled(results):
    for res in results:
        c = res["compile"]
        assert "error" not in c, c["error"] if "error" in c else c
        assert c["graphs"] == 1 and c["max_abs"] == 0.0, c
        assert c["quantized"] == c["calls"] == 4 * STEPS, c


def test_context_parallel_composes_gloo(group_results):
    _check_composes(group_results)


def test_context_parallel_compiled_gloo(group_results):
    """apply(compile=True) under CP: the eager result, one graph for every step."""
    _check_compiled(group_results)


@pytest.mark.gpu
def test_context_parallel_composes_nccl(nccl_results):
    _check_composes(nccl_results)


@pytest.mark.gpu
def test_context_parallel_compiled_nccl(nccl_results):
    _check_compiled(nccl_results)
