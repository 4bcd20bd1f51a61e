"""GPU: tiny bf16 pipelines on CUDA run their quantized blocks on the CUDA kernel, and agree with
the reference backend (the kernel's exact model) end to end. Skipped without a CUDA GPU."""

import pytest
import torch

from rotvid.pipelines import RotvidConfig, Schedule, apply, remove
from rotvid.pipelines.tiny import build_tiny_pipeline, tiny_call_kwargs

from .test_compile import transformer_inputs


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["wan", "hunyuan_video", "cogvideox"])
def test_tiny_pipeline_on_cuda_kernel_matches_reference_backend(tmp_path, family):
    """Every quantized call of a real (tiny, bf16) pipeline run: the CUDA kernel against the
    reference on the same Q/K/V (rotated, with the model's padding mask as kv_lens).

    The comparison is per call: a whole bf16 diffusion run amplifies any rounding difference
    (two correct implementations end up as far apart as INT4 is from FP16 on these random tiny
    models), so the end-to-end output is only checked for being finite."""
    import rotvid.kernels as kernels
    from rotvid.kernels import metrics

    pipe = build_tiny_pipeline(family, tmp_path / family, dtype=torch.bfloat16).to("cuda")
    pipe.set_progress_bar_config(disable=True)
    weights = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}
    per_call = []

    # the key-block size is part of the numerics: the reference models the kernel at the kernel's block size
    # (128 with the wgmma kernel on Hopper, 64 elsewhere; the reference's own default is 64)
    from rotvid.kernels.recipes.int4.ops import default_block_n

    bn = default_block_n(torch.device("cuda"))

    def compare(site, step, num_steps, q, k, v, kv_lens, fp16_attention):
        outs = [
            kernels.attention(q, k, v, recipe="int4", backend=b, kv_lens=kv_lens, block_n=bn)
            for b in ("cuda", "reference")
        ]
        per_call.append(metrics.relative_l2(outs[1].float(), outs[0].float()))

    handle = apply(pipe, RotvidConfig(recipe="int4", rotation="half", backend="cuda", schedule=Schedule()))
    handle.runtime.observers.append(compare)
    try:
        out = pipe(**tiny_call_kwargs(family, size=64)).frames.float()
    finally:
        remove(pipe)
    report = handle.report
    assert report.fallback_calls == 0 and report.quantized_calls == report.total_calls == len(per_call) > 0
    assert all(name.startswith("cuda") for name in report.backends), report.backends
    assert torch.isfinite(out).all()
    # kernel tests: rel. L2 <= 2e-3 on the same quantized inputs, plus bf16 output rounding (~2e-3)
    assert max(per_call) < 6e-3, max(per_call)
    # apply/remove on GPU weights (V/O Hadamard fused through the CPU) gives them back bit for bit.
    after = pipe.transformer.state_dict()
    assert all(torch.equal(after[k], weights[k]) for k in weights)
    assert all(v.is_cuda for v in after.values())


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["int4", "auto"])
@pytest.mark.parametrize("family", ["wan", "hunyuan_video", "cogvideox"])
def test_tiny_transformer_compiled_fullgraph_on_cuda_kernel_matches_eager(tmp_path, family, recipe):
    """``torch.compile(transformer, fullgraph=True)`` (inductor) with rotvid on the CUDA kernels: no graph
    break, the same output as eager within bf16 re-association, every call counted as quantized on CUDA,
    and a second forward without a new graph."""
    from rotvid.kernels import metrics

    torch._dynamo.reset()
    pipe = build_tiny_pipeline(family, tmp_path / family, dtype=torch.bfloat16).to("cuda")
    pipe.set_progress_bar_config(disable=True)
    args, kwargs = transformer_inputs(pipe, family, size=64)
    handle = apply(pipe, RotvidConfig(recipe=recipe, rotation="half", backend="cuda", schedule="none"))
    try:
        handle.tracker.begin(3)
        handle.tracker.set_step(1)
        with torch.no_grad():
            eager = pipe.transformer(*args, **kwargs)[0].float()
            explained = torch._dynamo.explain(pipe.transformer)(*args, **kwargs)
            torch._dynamo.reset()
            before = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # cumulative over the process
            compiled = torch.compile(pipe.transformer, fullgraph=True)
            outs = [compiled(*args, **kwargs)[0].float() for _ in range(2)]
            frame_count = torch._dynamo.utils.counters["stats"]["unique_graphs"] - before
    finally:
        remove(pipe)
        torch._dynamo.reset()
    assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]
    assert frame_count == 1, frame_count
    for out in outs:
        assert torch.isfinite(out).all()
        assert metrics.relative_l2(eager, out) < 2e-2, metrics.relative_l2(eager, out)
    report = handle.report
    assert report.fallback_calls == 0 and report.quantized_calls == report.total_calls > 0
    assert all(name.startswith("cuda") for name in report.backends), report.backends


@pytest.mark.gpu
def test_tiny_wan_transformer_under_cuda_graphs_matches_eager(tmp_path):
    """``torch.compile(mode="reduce-overhead")`` (CUDA graphs) with rotvid on the CUDA kernels: replays equal the
    first compiled run, agree with eager within bf16 re-association, and every replayed call is still counted (the
    call counters are device tensors inside the graph)."""
    from rotvid.kernels import metrics

    torch._dynamo.reset()
    pipe = build_tiny_pipeline("wan", tmp_path / "wan", dtype=torch.bfloat16).to("cuda")
    args, kwargs = transformer_inputs(pipe, "wan", size=64)
    handle = apply(pipe, RotvidConfig(recipe="auto", rotation="half", backend="cuda", schedule="none"))
    try:
        handle.tracker.begin(5)
        handle.tracker.set_step(1)
        with torch.no_grad():
            eager = pipe.transformer(*args, **kwargs)[0].float()
            calls_eager = handle.report.total_calls
            compiled = torch.compile(pipe.transformer, fullgraph=True, mode="reduce-overhead")
            outs = [compiled(*args, **kwargs)[0].float().clone() for _ in range(4)]
            torch.cuda.synchronize()
            calls = handle.report.total_calls
    finally:
        remove(pipe)
        torch._dynamo.reset()
    for out in outs:
        assert torch.isfinite(out).all()
        assert torch.equal(out, outs[0])
    assert metrics.relative_l2(eager, outs[0]) < 2e-2, metrics.relative_l2(eager, outs[0])
    assert calls == 5 * calls_eager, (calls, calls_eager)
    report = handle.report
    assert report.fallback_calls == 0 and report.quantized_calls == report.total_calls


@pytest.mark.gpu
@pytest.mark.parametrize("rotation", ["half", "full"])
@pytest.mark.parametrize("family", ["wan", "hunyuan_video", "cogvideox", "cogvideox-2b"])
def test_tiny_rope_in_the_preprocessing_equals_the_rope_pass(tmp_path, monkeypatch, family, rotation):
    """The processors hand the RoPE·R table of the whole joint sequence (text tokens: R alone; CogVideoX-2B, no
    RoPE: R alone on every token; ``full``: the table then the Walsh–Hadamard transform) to the int8-fp8 call,
    whose CUDA pre-processing applies it (no separate pass). The transformer's output is bit for bit that of the RoPE·R pass followed by the same kernels
    (the deferral switched off)."""
    from rotvid.pipelines import qk_rotation

    pipe = build_tiny_pipeline(family, tmp_path / family, dtype=torch.bfloat16).to("cuda")
    args, kwargs = transformer_inputs(pipe, family, size=64)
    seen = []
    original = qk_rotation.QKRotator.deferred_table

    def spy(self, x, rope, span):
        table = original(self, x, rope, span)
        seen.append(table is not None)
        return table

    outs = []
    for defer in (True, False):
        monkeypatch.setattr(qk_rotation.QKRotator, "deferred_table", spy if defer else lambda *a: None)
        handle = apply(pipe, RotvidConfig(recipe="int8-fp8", rotation=rotation, backend="cuda", schedule="none"))
        try:
            handle.tracker.begin(3)
            handle.tracker.set_step(1)
            with torch.no_grad():
                outs.append(pipe.transformer(*args, **kwargs)[0].clone())
        finally:
            remove(pipe)
        assert handle.report.quantized_calls == handle.report.total_calls > 0
    assert seen and all(seen)
    assert torch.equal(outs[0], outs[1])
