"""The online V/O Hadamard in the dispatcher (CPU): which path a call takes, decided once when it is prepared.

A call prepared with ``v_hadamard=block`` attends ``rotate_v_online(v, block)``: inside the backend's pre-processing
where the backend says it fuses the rotation (the int8-fp8 CUDA recipe, block = head_dim 64 or 128), then
``unrotate_output`` runs the one-pass CUDA kernel, unless the kernel entry turns the output back itself
(``KernelEntry.unrotates_output``: the int8-fp8 CUDA entry); everywhere else both sides run in PyTorch. A stand-in
backend that fuses (it rotates V itself with the PyTorch function) shows the routing without a GPU: both paths give
the same bits, the backend sees V unrotated exactly when it fuses, and the CUDA pass runs once per call (once after a
ring attention's merge)."""

import pytest
import torch

from rotvid.kernels import dispatch
from rotvid.kernels.cuda_backend import CudaBackend
from rotvid.kernels.dispatch import ReferenceBackend, prepare_attention, run_attention, unrotate_output
from rotvid.kernels.recipes.int8_fp8.ops import v_hadamard_fusion_unsupported
from rotvid.pipelines.config import RotvidConfig
from rotvid.pipelines.report import RunReport
from rotvid.pipelines.runtime import AttentionSite, Runtime
from rotvid.pipelines.step_tracker import StepTracker
from rotvid.rope.hadamard import rotate_v_online, unrotate_o_online, vo_hadamard_block


def qkv(d=128, n=67, layout="BHND", dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, n, d, generator=g).to(dtype) for _ in range(3))
    if layout == "BNHD":
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    return q, k, v


class FusingBackend:
    """A backend whose "pre-processing" rotates V itself (with the PyTorch function: the bits the CUDA kernel
    reproduces) for a block equal to the head_dim, and V only (the int8-fp8 CUDA entry also turns the output back:
    ``unrotates_output``); records what it was given."""

    name = "reference"

    def __init__(self):
        self.calls = []

    def unsupported_reason(self, q, k, v, **opts):
        return ReferenceBackend().unsupported_reason(q, k, v, **opts)

    def fuses_v_hadamard(self, q, k, v, block, *, recipe, layout="BHND"):
        return block == v.shape[-1]

    def run(self, q, k, v, *, v_hadamard=1, **opts):
        if not torch.compiler.is_compiling():  # (no side effect inside a traced torch.cond branch)
            self.calls.append((v, v_hadamard))
        return ReferenceBackend().run(q, k, rotate_v_online(v, v_hadamard), **opts)


@pytest.fixture
def fusing(monkeypatch):
    """The stand-in backend as ``reference``, and the CUDA pass replaced by its PyTorch twin (counted)."""
    backend = FusingBackend()
    monkeypatch.setitem(dispatch._BACKENDS, "reference", backend)
    passes = []

    def cuda_pass(x, block, *, side):
        assert side == "o"
        if not torch.compiler.is_compiling():
            passes.append(x.shape)
        return unrotate_o_online(x, block)

    monkeypatch.setattr(dispatch, "vo_hadamard_cuda", cuda_pass)
    return backend, passes


def test_the_int8fp8_entry_fuses_whole_rows_of_64_or_128():
    for d, block, fuses in [(128, 128, True), (64, 64, True), (128, 64, False), (96, 32, False), (256, 256, False)]:
        q, k, v = qkv(d=d, n=5)
        reason = v_hadamard_fusion_unsupported(q, k, v, block)
        assert (reason == "") == fuses, (d, block, reason)
        if not fuses:
            assert str(block) in reason or str(d) in reason
        assert CudaBackend().fuses_v_hadamard(q, k, v, block, recipe="int8-fp8") == fuses
        # the INT4 recipes' kernels never rotate V themselves
        assert not CudaBackend().fuses_v_hadamard(q, k, v, block, recipe="int4")


@pytest.mark.parametrize("recipe", ["int8-fp8", "int4"])
@pytest.mark.parametrize("layout", ["BHND", "BNHD"])
def test_reference_calls_rotate_and_unrotate_in_pytorch(recipe, layout):
    q, k, v = qkv(layout=layout)
    call = prepare_attention(q, k, v, recipe=recipe, layout=layout, backend="reference", v_hadamard=128)
    assert (call.v_hadamard, call.v_hadamard_fused) == (128, False)
    assert "v_hadamard" not in call.opts  # (a backend that does not rotate V never sees the option)
    plain = dispatch.attention(q, k, rotate_v_online(v, 128), recipe=recipe, layout=layout, backend="reference")
    assert torch.equal(run_attention(call, q, k, v), plain)
    want = unrotate_o_online(plain, 128)
    assert torch.equal(unrotate_output(call, run_attention(call, q, k, v)), want)
    assert torch.equal(dispatch.attention(q, k, v, recipe=recipe, layout=layout, backend="reference",
                                          vo_hadamard=128), want)
    out, lse = dispatch.attention(q, k, v, recipe=recipe, layout=layout, backend="reference", vo_hadamard=128,
                                  return_lse=True)
    assert torch.equal(out, want)
    _, lse_plain = dispatch.attention(q, k, v, recipe=recipe, layout=layout, backend="reference", return_lse=True)
    assert torch.equal(lse, lse_plain)  # (the LSE does not depend on V)


def test_no_rotation_is_the_call_as_before():
    q, k, v = qkv()
    call = prepare_attention(q, k, v, recipe="int8-fp8", backend="reference")
    assert (call.v_hadamard, call.v_hadamard_fused) == (1, False)
    out = run_attention(call, q, k, v)
    assert unrotate_output(call, out) is out
    assert torch.equal(dispatch.attention(q, k, v, recipe="int8-fp8", backend="reference", vo_hadamard=1), out)


def test_a_fusing_backend_gets_v_unrotated_and_the_cuda_pass_undoes_it(fusing):
    backend, passes = fusing
    q, k, v = qkv()
    call = prepare_attention(q, k, v, recipe="int8-fp8", backend="reference", v_hadamard=128)
    assert (call.v_hadamard, call.v_hadamard_fused) == (128, True)
    out = unrotate_output(call, run_attention(call, q, k, v))
    (seen_v, seen_block), = backend.calls
    assert seen_v is v and seen_block == 128  # the backend rotates V itself
    assert len(passes) == 1  # and one CUDA pass turns the output back
    want = unrotate_o_online(ReferenceBackend().run(q, k, rotate_v_online(v, 128), recipe="int8-fp8"), 128)
    assert torch.equal(out, want)  # the same bits as the PyTorch pair


def test_a_block_the_backend_does_not_fuse_runs_in_pytorch(fusing):
    backend, passes = fusing
    q, k, v = qkv()
    call = prepare_attention(q, k, v, recipe="int8-fp8", backend="reference", v_hadamard=32)
    assert (call.v_hadamard, call.v_hadamard_fused) == (32, False)
    out = unrotate_output(call, run_attention(call, q, k, v))
    (seen_v, seen_block), = backend.calls
    assert seen_block == 1 and torch.equal(seen_v, rotate_v_online(v, 32))
    assert passes == []
    want = unrotate_o_online(ReferenceBackend().run(q, k, rotate_v_online(v, 32), recipe="int8-fp8"), 32)
    assert torch.equal(out, want)


def test_bad_v_hadamard_blocks_are_named():
    q, k, v = qkv(d=96, n=5)
    for bad in (0, 3, 64, 256, True, 2.0):
        with pytest.raises(ValueError, match="v_hadamard: expected a power of two dividing head_dim 96"):
            prepare_attention(q, k, v, recipe="int4", backend="reference", v_hadamard=bad)
    assert prepare_attention(q, k, v, recipe="int4", backend="reference", v_hadamard=32).v_hadamard == 32


def runtime_for(backend="reference", vo="online"):
    tracker = StepTracker()
    tracker.begin(4)
    tracker.set_step(1)
    config = RotvidConfig(recipe="int8-fp8", backend=backend, vo_hadamard=vo, smooth_v=False)
    report = RunReport(recipe="int8-fp8", backend_requested=backend)
    runtime = Runtime(config, tracker, report)
    site = AttentionSite("transformer", 0, 1, 0, 0, 1)
    runtime.add_site(site, torch.nn.Linear(1, 1))
    return runtime, site


@pytest.mark.parametrize("d", [128, 96])
def test_runtime_online_vo_takes_the_fused_path_where_the_backend_fuses(fusing, d):
    backend, passes = fusing
    runtime, site = runtime_for()
    q, k, v = qkv(d=d)
    out = runtime.attend(site, q, k, v, mask=None, fp16_attention=lambda: None)
    block = vo_hadamard_block(d)
    want = unrotate_o_online(ReferenceBackend().run(q, k, rotate_v_online(v, block), recipe="int8-fp8"), block)
    assert torch.equal(out, want)
    (seen_v, seen_block), = backend.calls
    fused = d == 128
    assert seen_block == (block if fused else 1) and len(passes) == (1 if fused else 0)
    # (the runtime runs the call in the BNHD layout: the backend sees BNHD views)
    assert torch.equal(seen_v.transpose(1, 2), v if fused else rotate_v_online(v, block))


def test_runtime_ring_rotates_each_chunk_and_unrotates_once_after_the_merge(fusing):
    backend, passes = fusing
    runtime, site = runtime_for()
    q, k, v = qkv(n=64)
    out = runtime.attend(site, q, k, v, mask=None, fp16_attention=lambda: None, key_chunks=2)
    assert [b for _, b in backend.calls] == [128, 128] and len(passes) == 1
    # the same merge with V rotated in PyTorch and O un-rotated in PyTorch
    runtime_off, site_off = runtime_for(vo="off")
    plain = runtime_off.attend(site_off, q, k, rotate_v_online(v, 128), mask=None, fp16_attention=lambda: None,
                               key_chunks=2)
    assert torch.equal(out, unrotate_o_online(plain, 128))


def test_runtime_without_online_vo_never_rotates(fusing):
    backend, passes = fusing
    runtime, site = runtime_for(vo="off")
    q, k, v = qkv()
    runtime.attend(site, q, k, v, mask=None, fp16_attention=lambda: None)
    (seen_v, seen_block), = backend.calls
    assert seen_v.transpose(1, 2).data_ptr() == v.data_ptr() and seen_block == 1 and passes == []


class _Attend(torch.nn.Module):
    def __init__(self, runtime, site):
        super().__init__()
        self.runtime, self.site = runtime, site

    def forward(self, q, k, v, mask):
        fp16 = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # noqa: E731
        return self.runtime.attend(self.site, q, k, v, mask=mask, fp16_attention=fp16)


@pytest.mark.parametrize("stand_in", [False, True], ids=["pytorch", "fused"])
def test_online_vo_compiles_fullgraph_and_equals_eager(request, stand_in):
    """Under torch.compile (a mask checked on the device: the torch.cond path) the call plan is traced once: the
    same outputs as eager, with the rotation where the backend put it."""
    backend = request.getfixturevalue("fusing")[0] if stand_in else None
    runtime, site = runtime_for()
    module = _Attend(runtime, site)
    runtime.sites.clear()
    runtime.add_site(site, module)
    q, k, v = qkv(d=64, n=33, dtype=torch.float32)
    padded = torch.ones(2, 1, 1, 33, dtype=torch.bool)
    padded[1, ..., 20:] = False
    with torch.no_grad():
        eager = module(q, k, v, padded)
        compiled = torch.compile(module, backend="aot_eager", fullgraph=True)(q, k, v, padded)
    assert torch.equal(compiled, eager)
    if backend is not None:
        assert [b for _, b in backend.calls] == [64]  # (eager; the compiled call took the same plan)
    want = dispatch.attention(q, k, v, recipe="int8-fp8", backend="reference", kv_lens=torch.tensor([33, 20]),
                              vo_hadamard=64)
    assert torch.equal(eager, want)


def test_a_kernel_that_turns_its_output_back_is_left_as_it_is(fusing):
    """A call whose kernel entry un-rotates its own output (``KernelEntry.unrotates_output``: the int8-fp8 CUDA entry)
    is marked so when prepared, and ``unrotate_output`` returns its output untouched (no CUDA pass); a registered
    backend that rotates V only still gets the pass."""
    from rotvid.kernels.dispatch import AttentionCall
    from rotvid.kernels.recipes import get_recipe

    assert get_recipe("int8-fp8").kernel("cuda").unrotates_output
    assert not get_recipe("int4").kernel("cuda").unrotates_output
    backend, passes = fusing
    q, k, v = qkv()
    out = torch.randn(q.shape).to(q.dtype)
    done = AttentionCall(backend, "test", {}, v_hadamard=128, v_hadamard_fused=True, v_hadamard_cuda=True,
                         v_hadamard_out_fused=True)
    assert unrotate_output(done, out) is out and passes == []
    call = prepare_attention(q, k, v, recipe="int8-fp8", backend="reference", v_hadamard=128)
    assert call.v_hadamard_fused and not call.v_hadamard_out_fused  # (a registered backend: V only)
    assert torch.equal(unrotate_output(call, out), unrotate_o_online(out, 128)) and len(passes) == 1


@pytest.mark.parametrize("unrotates", [True, False])
def test_prepare_marks_a_call_whose_kernel_entry_turns_its_output_back(monkeypatch, unrotates):
    """``prepare_attention`` asks the chosen built-in backend's kernel entry: one that rotates V and says
    ``unrotates_output`` gives a call marked ``v_hadamard_out_fused`` (left alone by ``unrotate_output``); one that
    rotates V only does not."""
    from rotvid.kernels.recipes.base import KernelEntry, Recipe

    entry = KernelEntry(run=None, checks=(), block_n=lambda device=None: 128,
                        fuses_v_hadamard=lambda q, k, v, block, layout="BHND": "", unrotates_output=unrotates)
    real = Recipe.kernel
    monkeypatch.setattr(Recipe, "kernel",
                        lambda self, backend: entry if backend == "reference" else real(self, backend))
    monkeypatch.setattr(dispatch, "vo_hadamard_cuda", lambda x, block, *, side: unrotate_o_online(x, block))
    q, k, v = qkv()
    call = prepare_attention(q, k, v, recipe="int8-fp8", backend="reference", v_hadamard=128)
    assert call.kernel is entry and call.v_hadamard_fused
    assert call.v_hadamard_out_fused == unrotates
    out = torch.randn(q.shape).to(q.dtype)
    assert (unrotate_output(call, out) is out) == unrotates
    if not unrotates:
        assert torch.equal(unrotate_output(call, out), unrotate_o_online(out, 128))
