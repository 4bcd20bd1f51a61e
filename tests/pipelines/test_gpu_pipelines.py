"""GPU: tiny bf16 pipelines on CUDA run their quantized blocks on the CUDA kernel, and agree with
the reference backend (the kernel's exact model) end to end. Skipped without a CUDA GPU."""

import pytest
import torch

from rotvid.pipelines import RotvidConfig, Schedule, apply, remove
from rotvid.pipelines.tiny import build_tiny_pipeline, tiny_call_kwargs


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["wan", "hunyuan_video", "cogvideox"])
def test_tiny_pipeline_on_cuda_kernel_matches_reference_backend(tmp_path, family):
    pipe = build_tiny_pipeline(family, tmp_path / family, dtype=torch.bfloat16).to("cuda")
    pipe.set_progress_bar_config(disable=True)
    weights = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}
    outs, reports = {}, {}
    for backend in ("cuda", "reference"):
        handle = apply(pipe, RotvidConfig(recipe="int4", rotation="half", backend=backend, schedule=Schedule()))
        try:
            outs[backend] = pipe(**tiny_call_kwargs(family, size=64)).frames.float()
        finally:
            remove(pipe)
        reports[backend] = handle.report
    assert reports["cuda"].fallback_calls == 0 and reports["cuda"].quantized_calls == reports["cuda"].total_calls > 0
    assert all(name.startswith("cuda") for name in reports["cuda"].backends), reports["cuda"].backends
    a, b = outs["cuda"], outs["reference"]
    assert torch.isfinite(a).all()
    assert ((a - b).norm() / b.norm()).item() < 1e-2
    # apply/remove on GPU weights (V/O Hadamard fused through the CPU) gives them back bit for bit.
    after = pipe.transformer.state_dict()
    assert all(torch.equal(after[k], weights[k]) for k in weights)
    assert all(v.is_cuda for v in after.values())
