"""The per-forward guard: a non-finite forward is redone in FP16 and counted; the CUDA kernel's refusals on a GPU run
the model's own attention (CPU, tiny pipelines)."""

import logging

import pytest
import torch

import rotvid.kernels as kernels
import rotvid.pipelines.runtime as runtime_module
from rotvid.pipelines import RotvidConfig, Schedule, apply, remove
from rotvid.pipelines.runtime import GPU_FALLBACK, REDO
from rotvid.pipelines.tiny import tiny_call_kwargs


def run(pipe, family, **overrides):
    kw = tiny_call_kwargs(family)
    kw.update(overrides)
    return pipe(**kw).frames


def poison_quantized_call(monkeypatch, number: int):
    """Test hook: the ``number``-th quantized attention call (1-based) returns inf everywhere."""
    real = runtime_module.run_attention  # every quantized call the runtime makes goes through it
    calls = [0]

    def attention(call, q, k, v, **kw):
        calls[0] += 1
        out = real(call, q, k, v, **kw)
        return torch.full_like(out, float("inf")) if calls[0] == number else out

    monkeypatch.setattr(runtime_module, "run_attention", attention)
    return calls


@pytest.mark.parametrize("family, forwards", [("cogvideox", 1), ("wan", 2)])
def test_one_inf_call_is_redone_in_fp16_and_counted_with_its_step(tiny, monkeypatch, family, forwards):
    pipe = tiny(family)
    steps = 3
    cfg = RotvidConfig(recipe="int4", backend="reference", schedule=Schedule())
    handle = apply(pipe, cfg)
    try:
        ref = run(pipe, family, num_inference_steps=steps)
    finally:
        remove(pipe)
    # 4 quantized calls per forward: call 4 * forwards + 2 is in step 1, block 1 of the first forward
    calls = poison_quantized_call(monkeypatch, 4 * forwards + 2)
    handle = apply(pipe, cfg)
    try:
        out = run(pipe, family, num_inference_steps=steps, output_type="np")
        latents = run(pipe, family, num_inference_steps=steps)  # (the hook fires once: this run is clean)
    finally:
        remove(pipe)
    assert calls[0] > 4 * forwards + 2
    assert torch.isfinite(torch.as_tensor(out)).all()
    assert torch.isfinite(latents).all() and torch.equal(latents, ref)
    rep = handle.report
    assert rep.redos == [{"transformer": "transformer", "step": 1, "num_steps": steps, "finite_after_redo": True}]
    assert rep.fp16_reasons == {REDO: 4}  # the redone forward's four calls, in FP16
    d = rep.to_dict()
    assert d["redos"] == rep.redos and "REDO transformer at step 1" in rep.summary()
    # the redo is not a forward of the pipeline: the step counts stay right
    assert rep.forwards == {"transformer": 2 * steps * forwards}


def test_non_finite_in_fp16_too_is_reported_as_the_models_own(tiny, monkeypatch):
    pipe = tiny("cogvideox")
    handle = apply(pipe, RotvidConfig(recipe="int4", backend="reference"))
    last = pipe.transformer.transformer_blocks[3]
    real_forward = last.forward  # (an instance attribute when diffusers hooks were ever registered on it)

    def broken(*args, **kwargs):  # the model itself overflows in its last block (every call)
        hidden, encoder = real_forward(*args, **kwargs)
        return hidden * float("inf"), encoder

    monkeypatch.setattr(last, "forward", broken)
    try:
        run(pipe, "cogvideox", num_inference_steps=1)
    finally:
        monkeypatch.undo()
        remove(pipe)
    rep = handle.report
    assert [r["step"] for r in rep.redos] == [0]
    assert not any(r["finite_after_redo"] for r in rep.redos)
    assert "the model's own" in rep.summary()


def test_non_finite_inputs_are_not_redone(tiny):
    pipe = tiny("cogvideox")
    tr = pipe.transformer
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 2, 4, 4, 4, generator=g)
    x[0, 0, 0, 0, 0] = float("nan")
    text = torch.randn(1, 16, 32, generator=g)
    handle = apply(tr, RotvidConfig(recipe="int4", backend="reference"))
    try:
        tr(hidden_states=x, encoder_hidden_states=text, timestep=torch.tensor([500]))
    finally:
        remove(tr)
    rep = handle.report
    assert rep.redos == [] and rep.nonfinite_inputs == [{"transformer": "transformer", "step": None}]


def test_gpu_call_the_cuda_kernel_refuses_runs_the_models_attention(tiny, monkeypatch, caplog):
    """backend auto on a (stubbed) CUDA device, CUDA backend stubbed to refuse: SDPA, a counted fallback, one warning."""
    pipe = tiny("cogvideox")
    ref = run(pipe, "cogvideox", num_inference_steps=2)

    class Refusing:
        name = "cuda"

        def unsupported_reason(self, q, k, v, **opts):
            return "rotvid CUDA kernels: nvcc not found (set CUDA_HOME or put nvcc on PATH)"

        def run(self, q, k, v, **opts):
            raise AssertionError("a refused backend must not run")

    backends = dict(kernels.dispatch._BACKENDS, cuda=Refusing())
    monkeypatch.setattr(kernels.dispatch, "_BACKENDS", backends)
    monkeypatch.setattr(runtime_module, "on_cuda_device", lambda t: True)
    reference_runs = [0]
    real_reference = kernels.dispatch.ReferenceBackend.run

    def counting_reference(self, q, k, v, **opts):
        reference_runs[0] += 1
        return real_reference(self, q, k, v, **opts)

    monkeypatch.setattr(kernels.dispatch.ReferenceBackend, "run", counting_reference)
    sdpa_calls = [0]
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def sdpa(*args, **kwargs):
        sdpa_calls[0] += 1
        return real_sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    handle = apply(pipe, RotvidConfig(recipe="int4", backend="auto", schedule=Schedule()))
    try:
        with caplog.at_level(logging.WARNING, logger="rotvid"):
            out = run(pipe, "cogvideox", num_inference_steps=2)
            rep = handle.report
    finally:
        remove(pipe)
    assert reference_runs[0] == 0 and sdpa_calls[0] >= 8  # the model's own attention, not the reference
    assert rep.quantized_calls == 0 and rep.fallback_calls == rep.total_calls == 8
    (reason,) = rep.fallbacks
    assert reason.startswith(GPU_FALLBACK) and "nvcc not found" in reason
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "CUDA kernel" in
                r.getMessage()]
    assert len(warnings) == 1 and "install a CUDA toolkit" in warnings[0]
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())


def test_reference_runs_when_asked_even_on_a_gpu(tiny, monkeypatch):
    pipe = tiny("cogvideox")
    monkeypatch.setattr(runtime_module, "on_cuda_device", lambda t: True)
    handle = apply(pipe, RotvidConfig(recipe="int4", backend="reference", schedule=Schedule()))
    try:
        run(pipe, "cogvideox", num_inference_steps=1)
    finally:
        remove(pipe)
    assert handle.report.quantized_calls == 4 and handle.report.backends == {"reference (requested)": 4}
