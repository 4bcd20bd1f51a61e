"""rotvid under diffusers' ring attention and Ulysses × ring: 4 processes vs 1 on the tiny Wan transformer (2 heads).

The tiny Wan has 2 heads, which 4 ranks cannot split: it runs as Ulysses 2 × ring 2 and as ring 4
(``enable_context_parallel(transformer, ulysses_degree, ring_degree)``), against a single-process transformer from
the same folder, every recipe case with the same ``RotvidConfig``. Workers write JSON; the parent asserts.

Bounds (fp32, reference backend): ``fp16`` (the model's own attention over every key of the ring) within float
rounding; a quantized recipe within twice its own error on these inputs (the single-process result against its fp16
twin): the ring quantizes each key chunk on its own (K after the chunk's mean, V with the chunk's scales), so after
four blocks the two results are two draws of the recipe's noise -- a logic error moves the output by its scale
(``test_context_parallel_ring_same_inputs.py`` pins the attention itself down, per call).

Ring 2 on 2 processes composes with the forward guard's redo and ``apply(compile=True)`` (the cases of
``test_context_parallel_compose.py``).

In-process checks: what is refused under ring attention (block maps, a CUDA kernel without an LSE, uneven shards)
and ``split_degrees``.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rotvid.pipelines import RotvidConfig, apply, remove
from rotvid.pipelines.attach import HANDLE_ATTR
from tests.pipelines.cp_spawn import finish, join_group, needs_gloo, run_group

CASES = [("fp16", "half"), ("int4", "half"), ("int8-fp8", "none")]
TOKENS = 60  # 4 latent frames of 6x10 after 2x2 patching


def _load(folder: str, device: str, dtype: torch.dtype):
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel.from_pretrained(Path(folder) / "transformer", torch_dtype=dtype).to(device).eval()


def _inputs(tr, device, dtype):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, tr.config.in_channels, 4, 6, 10, generator=g)
    text = torch.randn(2, 7, tr.config.text_dim, generator=g)
    return dict(hidden_states=x.to(device, dtype), encoder_hidden_states=text.to(device, dtype),
                timestep=torch.tensor([700, 300]).to(device), return_dict=False)


def _forward(tr, config, inputs):
    handle = apply(tr, config)
    try:
        handle.tracker.begin(1)
        handle.tracker.set_step(0)
        with torch.no_grad():
            out = tr(**inputs)[0].float().cpu()
        return out, handle.report.to_dict()
    finally:
        remove(tr)


def _worker(rank, world, port, folder, out_dir, degrees, cases):
    from rotvid.distributed_run import shutdown_worker
    from rotvid.pipelines.context_parallel import enable_context_parallel

    device, dtype = join_group(rank, world, port, "cpu")
    try:
        ref_tr = _load(folder, device, dtype)
        inputs = _inputs(ref_tr, device, dtype)
        refs = {case: _forward(ref_tr, RotvidConfig(recipe=case[0], rotation=case[1], backend="reference"), inputs)[0]
                for case in cases}
        twins = {rot: _forward(ref_tr, RotvidConfig(recipe="fp16", rotation=rot, backend="reference"), inputs)[0]
                 for rot in {rot for _, rot in cases}}
        results = {"rank": rank, "cases": []}
        for u, r in degrees:
            cp_tr = _load(folder, device, dtype)
            enable_context_parallel(cp_tr, u, r)
            seen = []
            for blk in cp_tr.blocks:
                blk.attn1.register_forward_pre_hook(lambda m, args, seen=seen: seen.append(args[0].shape[1]))
            for recipe, rotation in cases:
                cfg = RotvidConfig(recipe=recipe, rotation=rotation, backend="reference")
                out, report = _forward(cp_tr, cfg, inputs)
                ref = refs[(recipe, rotation)]
                results["cases"].append({
                    "degrees": [u, r], "recipe": recipe, "rotation": rotation,
                    "max_abs": (out - ref).abs().max().item(), "scale": ref.abs().max().item(),
                    "recipe_error": (ref - twins[rotation]).abs().max().item(), "report": report,
                })
            results.setdefault("tokens_seen", []).extend(seen)
    except BaseException:
        shutdown_worker()
        raise
    finish(out_dir, rank, results)


def test_ring_and_ulysses_x_ring_equal_one_process_gloo_4(tiny, tiny_dir, tmp_path):
    """4 CPU processes, 2 heads: Ulysses 2 × ring 2 and ring 4, each recipe case against one process."""
    needs_gloo()
    tiny("wan")
    degrees = [(2, 2), (1, 4)]
    results = run_group(_worker, (str(tiny_dir / "wan-4"), str(tmp_path), degrees, CASES), tmp_path,
                        deadline_s=400, world=4)
    for res in results:
        assert set(res["tokens_seen"]) == {TOKENS // 4}, res["tokens_seen"][:8]
        assert len(res["cases"]) == len(degrees) * len(CASES)
        for case in res["cases"]:
            u, r = case["degrees"]
            name = f"rank {res['rank']} ulysses {u} x ring {r} {case['recipe']}/{case['rotation']}"
            rep = case["report"]
            assert rep["total_calls"] == 4 and rep["fallback_calls"] == 0, f"{name}: {rep}"
            if case["recipe"] == "fp16":
                assert case["max_abs"] <= 1e-5 * case["scale"], f"{name}: {case}"
            else:
                assert rep["quantized_calls"] == 4, f"{name}: {rep}"
                assert case["max_abs"] <= 2 * case["recipe_error"], f"{name}: {case}"


def _compose_worker(rank, world, port, folder, out_dir):
    """Ring 2: the forward guard's redo (decided by every rank: one rank's output poisoned) and apply(compile=True)
    (one graph, the eager result) -- the cases of test_context_parallel_compose.py under ring attention."""
    from rotvid.pipelines.context_parallel import enable_context_parallel
    from tests.pipelines.test_context_parallel_compose import RUNS, _compile_case, _guard_case

    device, dtype = join_group(rank, world, port, "cpu")
    tr = _load(folder, device, dtype)
    enable_context_parallel(tr, 1, world)
    inputs = _inputs(tr, device, dtype)
    results = {"rank": rank, "guard": _guard_case(tr, rank, inputs, RUNS["cpu"])}
    try:
        results["compile"] = _compile_case(tr, inputs, RUNS["cpu"])
    except Exception as e:  # reported by the parent
        results["compile"] = {"error": f"{type(e).__name__}: {e}"[:2000]}
    finish(out_dir, rank, results)


def test_ring_composes_with_the_guard_and_compile_gloo_2(tiny, tiny_dir, tmp_path):
    from tests.pipelines.test_context_parallel_compose import STEPS

    needs_gloo()
    tiny("wan")
    results = run_group(_compose_worker, (str(tiny_dir / "wan-4"), str(tmp_path)), tmp_path, world=2)
    for res in results:
        guard = res["guard"]
        assert guard["finite"] and len(guard["redos"]) == 1 and guard["fp16_calls"] == 4, guard
        c = res["compile"]
        assert "error" not in c, c
        assert c["graphs"] == 1 and c["max_abs"] == 0.0 and c["quantized"] == c["calls"] == 4 * STEPS, c
    assert results[0]["guard"]["sum"] == results[1]["guard"]["sum"]


# ---- in-process checks (no process group) -------------------------------------------------------


def _fake_cp(ulysses_degree=1, ring_degree=2, ring_anything=False):
    cp = SimpleNamespace(ulysses_degree=ulysses_degree, ring_degree=ring_degree, ulysses_anything=False,
                         ring_anything=ring_anything, _ulysses_mesh=None, _ring_mesh=None, _flattened_mesh=None)
    return SimpleNamespace(context_parallel_config=cp)


@pytest.mark.parametrize("config,match", [
    (dict(recipe="int4", sparsity="radial"), r"sparsity: transformer runs ring attention \(ring_degree=2\).*radial"),
    (dict(recipe="int8-fp8", sparsity="topp:0.9"), r"sparsity: .*does not split block maps per key chunk"),
    (dict(recipe="int4", backend="cuda"), r"backend: transformer runs ring attention .*recipe 'int4' returns none"),
])
def test_what_ring_attention_refuses_at_apply(tiny, config, match):
    pipe = tiny("wan")
    pipe.transformer._parallel_config = _fake_cp()
    try:
        with pytest.raises(ValueError, match=match):
            apply(pipe, RotvidConfig(**config))
    finally:
        pipe.transformer._parallel_config = None
    assert getattr(pipe, HANDLE_ATTR, None) is None


def test_ring_with_what_it_runs_passes_the_checks_and_needs_a_set_up_config(tiny):
    """fp16 with a CUDA backend (no rotvid kernel is called), int4 on the reference: the ring checks pass; the fake
    config was never set up (no meshes), which is the next error."""
    pipe = tiny("wan")
    for config in (RotvidConfig(recipe="fp16", backend="cuda"), RotvidConfig(recipe="int4", backend="reference")):
        pipe.transformer._parallel_config = _fake_cp(ulysses_degree=2, ring_degree=2)
        try:
            with pytest.raises(ValueError, match="was not set up"):
                apply(pipe, config)
        finally:
            pipe.transformer._parallel_config = None


def test_ring_anything_is_refused(tiny):
    pipe = tiny("wan")
    pipe.transformer._parallel_config = _fake_cp(ring_anything=True)
    try:
        with pytest.raises(ValueError, match="ring_anything"):
            apply(pipe, RotvidConfig(recipe="int4", backend="reference"))
    finally:
        pipe.transformer._parallel_config = None


def test_heads_not_divisible_by_ulysses_names_the_ring_split(tiny):
    pipe = tiny("wan")  # 2 heads
    pipe.transformer._parallel_config = _fake_cp(ulysses_degree=4, ring_degree=1)
    try:
        with pytest.raises(ValueError, match=r"ulysses_degree=2, ring_degree=2\) runs 2 heads on 4 ranks"):
            apply(pipe, RotvidConfig(recipe="fp16"))
    finally:
        pipe.transformer._parallel_config = None


def test_split_degrees():
    from rotvid.pipelines.context_parallel import split_degrees

    assert split_degrees(40, 8) == (8, 1)
    assert split_degrees(12, 8) == (4, 2)
    assert split_degrees(40, 3) == (1, 3)
    assert split_degrees(2, 4) == (2, 2)
    assert split_degrees(7, 4) == (1, 4)


def test_enable_context_parallel_degree_errors(tiny):
    from rotvid.pipelines.context_parallel import enable_context_parallel

    tr = tiny("wan").transformer
    with pytest.raises(ValueError, match="ring_degree: expected an int >= 1"):
        enable_context_parallel(tr, 2, 0)
    with pytest.raises(ValueError, match=r"ulysses_degree: expected an int >= 2 \(or ring_degree >= 2\)"):
        enable_context_parallel(tr, 1, 1)
    if not torch.distributed.is_initialized():
        with pytest.raises(ValueError, match="not initialized"):
            enable_context_parallel(tr, 1, 2)


def test_merge_partial_weighs_an_empty_side_zero():
    from rotvid.pipelines.ring import merge_partial

    g = torch.Generator().manual_seed(0)
    out_a, out_b = torch.randn(1, 2, 3, 4, generator=g), torch.randn(1, 2, 3, 4, generator=g)
    lse_a = torch.tensor([[[0.5, -torch.inf, -torch.inf], [2.0, 1.0, -1.0]]])
    lse_b = torch.tensor([[[-torch.inf, 3.0, -torch.inf], [1.0, 1.0, 40.0]]])
    out_b[0, 0, 0] = float("nan")  # a side of weight 0 is never multiplied in
    out, lse = merge_partial(*merge_partial(None, None, out_a, lse_a), out_b, lse_b)
    assert torch.equal(out[0, 0, 0], out_a[0, 0, 0]) and lse[0, 0, 0] == 0.5
    assert torch.equal(out[0, 0, 1], out_b[0, 0, 1]) and lse[0, 0, 1] == 3.0
    assert torch.equal(out[0, 0, 2], torch.zeros(4)) and torch.isneginf(lse[0, 0, 2])
    w = torch.softmax(torch.stack([lse_a[0, 1], lse_b[0, 1]]), dim=0)
    torch.testing.assert_close(out[0, 1], w[0, :, None] * out_a[0, 1] + w[1, :, None] * out_b[0, 1])
    torch.testing.assert_close(lse[0, 1], torch.logsumexp(torch.stack([lse_a[0, 1], lse_b[0, 1]]), dim=0))


def test_key_chunks_merge_to_one_call_with_an_empty_chunk():
    """fp16 numerics in float64 (K smoothed per chunk, K biased per chunk): 4 chunks of 32 keys, batch row 1 with 50
    valid keys (chunks 2 and 3 empty there) -- equal to one call over all keys to fp64 rounding, finite."""
    from rotvid.kernels import attention
    from rotvid.pipelines.ring import attend_key_chunks

    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, 40, 16, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, 128, 16, generator=g, dtype=torch.float64)
    k = k + 3 * torch.randn(1, 3, 4, 1, 16, generator=g, dtype=torch.float64).repeat_interleave(32, 2).flatten(2, 3)
    v = torch.randn(2, 3, 128, 16, generator=g, dtype=torch.float64)
    kv_lens = torch.tensor([128, 50])
    opts = dict(recipe="fp16", backend="reference", smooth_k=True, smooth_v=True)

    def run_chunk(k_c, v_c, lens):
        return attention(q, k_c, v_c, kv_lens=lens, return_lse=True, **opts)

    merged = attend_key_chunks(run_chunk, k, v, kv_lens, 4)
    assert torch.isfinite(merged).all()
    assert merged.dtype == torch.float64
    torch.testing.assert_close(merged, attention(q, k, v, kv_lens=kv_lens, **opts), rtol=0, atol=1e-12)
