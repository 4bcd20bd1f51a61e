"""Q smoothing and the CUDA backend, seen from the dispatcher and the pipeline runtime (CPU).

The INT4 CUDA kernels smooth Q with one mean per head (its ΔS added to the scores as a bias per key);
the int8-fp8 kernels do not smooth Q, and per-block Q means (``q_block``) are reference-only. A call
the kernels cannot take must never reach them: ``backend="auto"`` picks the reference and says why;
``backend="cuda"`` refuses; inside a pipeline the call is recorded as a fallback with the CUDA
backend's reason. The real :class:`CudaBackend` is asked, with its environment checks (GPU present,
arch table, nvcc) stubbed and the CPU tensors presented as CUDA tensors.
"""

import pytest
import torch

from rotvid.kernels import cuda_backend, cuda_build, dispatch
from rotvid.kernels.dispatch import select_backend
from rotvid.pipelines.config import RotvidConfig
from rotvid.pipelines.report import RunReport
from rotvid.pipelines.runtime import AttentionSite, Runtime
from rotvid.pipelines.step_tracker import StepTracker


class _AsCuda:
    """A CPU tensor presented as a contiguous, aligned tensor on cuda:0 (for the checks only)."""

    def __init__(self, t: torch.Tensor):
        self._t = t
        self.is_cuda = True
        self.device = torch.device("cuda", 0)
        self.dtype = t.dtype
        self.shape = t.shape

    def stride(self, *dim):
        return self._t.stride(*dim)

    def data_ptr(self):
        return 0


class _CudaChecksOnCpu:
    """The real CudaBackend's ``unsupported_reason`` on CPU tensors; never runs a kernel."""

    name = "cuda"

    def __init__(self):
        self.real = cuda_backend.CudaBackend()

    def unsupported_reason(self, q, k, v, **opts):
        return self.real.unsupported_reason(_AsCuda(q), _AsCuda(k), _AsCuda(v), **opts)

    def run(self, q, k, v, **opts):  # pragma: no cover - the tests must not get here
        raise AssertionError("the CUDA kernel was asked to run a call it cannot take")


@pytest.fixture
def cuda_checks(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda_build, "arch_entry", lambda device=None: cuda_build.ARCH_TABLE[(9, 0)])
    monkeypatch.setattr(cuda_build, "_nvcc", lambda: "nvcc")
    monkeypatch.setitem(dispatch._BACKENDS, "cuda", _CudaChecksOnCpu())


def bf16_qkv(n=128):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, 2, n, 128, generator=g).to(torch.bfloat16) for _ in range(3))


OPTS = dict(recipe="int4", layout="BHND", kv_lens=None, smooth_k=True, smooth_v=True)


def test_cuda_backend_takes_per_head_q_smoothing_for_int4_only(cuda_checks):
    q, k, v = bf16_qkv()
    backend = dispatch._BACKENDS["cuda"]
    assert backend.unsupported_reason(q, k, v, smooth_q=False, **OPTS) is None
    assert backend.unsupported_reason(q, k, v, smooth_q=True, **OPTS) is None
    assert backend.unsupported_reason(q, k, v, smooth_q=True, **{**OPTS, "recipe": "int4-sym-p"}) is None
    why = backend.unsupported_reason(q, k, v, smooth_q=True, **{**OPTS, "recipe": "int8-fp8", "smooth_v": False})
    assert "smooth_q=True" in why and "int8-fp8" in why
    assert backend.unsupported_reason(q, k, v, smooth_q=False, **{**OPTS, "recipe": "int8-fp8"}) is None
    why = backend.unsupported_reason(q, k, v, smooth_q=True, q_block=64, **OPTS)
    assert "q_block=64" in why and "one mean per head" in why


def test_auto_backend_runs_what_the_kernels_cannot_on_the_reference_and_says_why(cuda_checks):
    q, k, v = bf16_qkv()
    chosen, _ = select_backend(q, k, v, backend="auto", smooth_q=True, **OPTS)
    assert chosen.name == "cuda"
    chosen, reason = select_backend(q, k, v, backend="auto", smooth_q=True, q_block=32, **OPTS)
    assert chosen.name == "reference" and "q_block=32" in reason
    fp8 = {**OPTS, "recipe": "int8-fp8"}
    chosen, reason = select_backend(q, k, v, backend="auto", smooth_q=True, **fp8)
    assert chosen.name == "reference" and "smooth_q=True" in reason
    with pytest.raises(ValueError, match="smooth_q=True"):
        select_backend(q, k, v, backend="cuda", smooth_q=True, **fp8)


def test_dispatch_rejects_a_bad_q_block():
    q, k, v = bf16_qkv(8)
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="q_block"):
            dispatch.attention(q.float(), k.float(), v.float(), backend="reference", smooth_q=True, q_block=bad)


def test_pipeline_runtime_records_int8fp8_q_smoothing_on_cuda_as_a_fallback(cuda_checks):
    tracker = StepTracker()
    tracker.begin(2)
    tracker.set_step(0)
    config = RotvidConfig(recipe="int8-fp8", backend="cuda", smooth_q=True)
    report = RunReport(recipe="int8-fp8", backend_requested="cuda")
    runtime = Runtime(config, tracker, report)
    site = AttentionSite("transformer", 0, 1, 0, 0, 1)
    runtime.add_site(site, torch.nn.Linear(1, 1))  # its call counters live on that module
    q, k, v = bf16_qkv()
    sentinel = torch.zeros_like(q)
    out = runtime.attend(site, q, k, v, mask=None, fp16_attention=lambda: sentinel)
    assert out is sentinel
    runtime.drain_counts()  # counted on the device until drained
    assert report.fallback_calls == 1 and report.quantized_calls == 0
    (reason,) = report.fallbacks
    assert "smooth_q=True" in reason and "int8-fp8" in reason
