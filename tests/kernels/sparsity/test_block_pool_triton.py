"""The top-p builder's one-pass Triton pooling (rotvid::block_pool) against the eager pooling: on CPU through Triton's
interpreter (TRITON_INTERPRET=1, in a subprocess so the setting does not leak), the compiled builder's graph on CPU
(traced, not run), and on CUDA when present."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (pip install triton) — the kernel needs it")

from rotvid.kernels.sparsity import topp  # noqa: E402
from rotvid.kernels.sparsity.block_map import MAP_BLOCK, blocks_for  # noqa: E402
from rotvid.kernels.sparsity.topp import _blocks, _pool, topp_block_map  # noqa: E402


def eager_pool(x, kv_lens=None):
    """The eager form's block means, counts and self-similarity of x [B, H, N, D] (float32)."""
    n = x.shape[2]
    t = blocks_for(n)
    j = torch.arange(t * MAP_BLOCK, device=x.device).view(1, 1, t, MAP_BLOCK)
    valid = j < n if kv_lens is None else (j < kv_lens.view(-1, 1, 1, 1)) & (j < n)
    return _pool(_blocks(x.float(), t), valid)


CHECK = textwrap.dedent(
    """
    import torch
    from rotvid.kernels.sparsity import topp
    from rotvid.kernels.sparsity.block_pool_triton import block_pool_triton
    from tests.kernels.sparsity.test_block_pool_triton import eager_pool

    gen = torch.Generator().manual_seed(0)
    worst_mean = worst_sim = 0.0
    for b, h, n, d, dtype, lens in [
        (2, 3, 300, 64, torch.bfloat16, [300, 129]),   # partial last block; kv_lens inside block 1
        (1, 2, 256, 128, torch.float16, None),         # whole blocks
        (3, 1, 200, 40, torch.float32, [1, 200, 64]),  # D not a power of 2; one key; a block with no valid key
    ]:
        x = (torch.randn(b, h, n, d, generator=gen) + torch.randn(b, h, 1, d, generator=gen)).to(dtype)
        kv = None if lens is None else torch.tensor(lens)
        want_mean, want_count, want_sim = eager_pool(x, kv)
        for layout in ("BHND", "BNHD"):
            xl = x if layout == "BHND" else x.transpose(1, 2).contiguous().transpose(1, 2)  # BNHD memory, no copy
            if kv is not None:  # keys past kv_lens are never read: poison them
                xl = xl.clone() if layout == "BHND" else xl.transpose(1, 2).clone().transpose(1, 2)
                for i, length in enumerate(lens):
                    xl[i, :, length:] = float("nan")
            mean, sim = block_pool_triton(xl, kv)
            assert mean.dtype == sim.dtype == torch.float32 and mean.shape == want_mean.shape
            assert sim.shape == want_sim.shape and not mean.isnan().any() and not sim.isnan().any()
            empty = want_count.expand_as(sim) == 0
            assert (mean[empty] == 0).all() and (sim[empty] == 0).all()
            scale = want_mean.abs().amax(-1, keepdim=True).clamp_min(1e-30)
            worst_mean = max(worst_mean, ((mean - want_mean).abs() / scale).max().item())
            worst_sim = max(worst_sim, (sim - want_sim).abs().max().item())

    # the builder on the kernel's pooling: the same maps as on the eager pooling
    centres = 3 * torch.randn(2, 2, 6, 64, generator=gen).repeat_interleave(128, 2)[:, :, :700]
    q = (centres + torch.randn(2, 2, 700, 64, generator=gen)).to(torch.bfloat16)
    k = (centres.roll(128, 2) + torch.randn(2, 2, 700, 64, generator=gen)).to(torch.bfloat16)
    kv = torch.tensor([700, 300])
    kwargs = dict(tau=0.8, sim=0.3, kv_lens=kv)
    eager = topp.topp_block_map(q, k, **kwargs)
    topp._use_kernel = lambda x: True
    for layout in ("BHND", "BNHD"):
        qq, kk = (q, k) if layout == "BHND" else (q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous())
        fast = topp.topp_block_map(qq, kk, layout=layout, **kwargs)
        assert torch.equal(fast.block_map.indices, eager.block_map.indices), layout
        assert torch.equal(fast.block_map.counts, eager.block_map.counts), layout
        torch.testing.assert_close(fast.dropped_mass, eager.dropped_mass, atol=1e-5, rtol=0)
    assert 0.1 < float(eager.block_map.density()) < 0.9
    print("WORST", worst_mean, worst_sim)
    """
)


def test_kernel_matches_the_eager_pooling_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    worst_mean, worst_sim = (float(x) for x in r.stdout.rsplit("WORST ", 1)[-1].split())
    assert worst_mean < 1e-5  # float32 sums of 128 terms in another order
    assert worst_sim < 1e-5


class _Traced(Exception):
    pass


def test_compiled_builder_pools_with_the_kernel_and_sorts_once(monkeypatch):
    """Fullgraph trace of the builder on the kernel path (CPU tensors; traced, not run): Q and K are read by the
    Triton kernel only (no float copies), and the only sort is the top-p ranking (the index list takes a binary
    search)."""
    monkeypatch.setattr(topp, "_use_kernel", lambda x: True)
    targets, readers = [], []

    def backend(gm, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified

        def record(graph, _):
            targets.extend(str(node.target) for node in graph.graph.nodes)
            # (Q and K: the 4-D inputs, wherever the trace put them among the placeholders)
            q_node, k_node = [node for node in graph.graph.nodes if node.op == "placeholder"
                              and node.meta["val"].dim() == 4]
            readers.extend(str(user.target) for node in (q_node, k_node) for user in node.users)
            raise _Traced

        return aot_module_simplified(gm, example_inputs, fw_compiler=record)

    def build(q, k, kv_lens):
        out = topp_block_map(q, k, tau=0.8, sim=0.3, kv_lens=kv_lens)
        return out.block_map.indices, out.block_map.counts, out.dropped_mass

    q = torch.randn(2, 3, 300, 64, dtype=torch.bfloat16)
    torch._dynamo.reset()
    with pytest.raises(Exception) as info:
        torch.compile(build, fullgraph=True, backend=backend)(q, q.clone(), torch.tensor([300, 200]))
    assert "_Traced" in repr(info.value), info.value
    torch._dynamo.reset()
    assert targets.count("triton_kernel_wrapper_functional") == 2
    assert sum(t.startswith("aten.sort") for t in targets) == 1 and "aten.searchsorted.Tensor" in targets
    assert readers == ["triton_kernel_wrapper_functional"] * 2  # Q and K are read by the kernel only


def test_bad_inputs_name_the_argument():
    from rotvid.kernels.sparsity.block_pool_triton import block_pool_triton

    with pytest.raises(ValueError, match="x: expected"):
        block_pool_triton(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="x: expected float16"):
        block_pool_triton(torch.zeros(1, 1, 4, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="kv_lens: expected"):
        block_pool_triton(torch.zeros(2, 1, 4, 8), torch.tensor([4]))


def clustered_cuda(b, h, n, d, dtype, layout, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    t = blocks_for(n)
    centres = 3 * torch.randn(b, h, t, d, generator=gen, device="cuda").repeat_interleave(MAP_BLOCK, 2)[:, :, :n]
    q = centres + torch.randn(b, h, n, d, generator=gen, device="cuda")
    k = centres.roll(MAP_BLOCK, 2) + torch.randn(b, h, n, d, generator=gen, device="cuda")
    q, k = q.to(dtype), k.to(dtype)
    if layout == "BNHD":
        q, k = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
    return q, k


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("layout", ["BHND", "BNHD"])
@pytest.mark.parametrize("d", [64, 128])
def test_cuda_kernel_matches_the_eager_pooling(dtype, layout, d):
    from rotvid.kernels.sparsity.block_pool_triton import block_pool_triton

    q, _ = clustered_cuda(2, 3, 1000, d, dtype, layout, seed=0)
    x = q if layout == "BHND" else q.transpose(1, 2)
    kv_lens = torch.tensor([1000, 333], device="cuda")
    for lens in (None, kv_lens):
        want_mean, want_count, want_sim = eager_pool(x, lens)
        mean, sim = block_pool_triton(x, lens)
        scale = want_mean.abs().amax(-1, keepdim=True)
        assert ((mean - want_mean).abs() <= 1e-5 * scale).all()
        assert (sim - want_sim).abs().max() < 1e-5
        empty = want_count.expand_as(sim) == 0
        assert (mean[empty] == 0).all() and (sim[empty] == 0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["BHND", "BNHD"])
def test_cuda_builder_eager_and_compiled_match_the_cpu_maps(layout):
    """On CUDA the builder pools with the kernel (eager, and inside the fullgraph compiled graph); its maps equal the
    CPU (eager pooling) maps on inputs whose estimate has no near-ties."""
    q, k = clustered_cuda(2, 4, 2000, 128, torch.bfloat16, layout, seed=1)
    kv_lens = torch.tensor([2000, 1500], device="cuda")

    def build(q, k, kv_lens):
        out = topp_block_map(q, k, tau=0.9, sim=0.5, layout=layout, kv_lens=kv_lens)
        return out.block_map.indices, out.block_map.counts, out.dropped_mass

    torch._dynamo.reset()
    compiled = torch.compile(build, fullgraph=True)
    cpu = build(q.cpu(), k.cpu(), kv_lens.cpu())
    for got in (build(q, k, kv_lens), compiled(q, k, kv_lens)):
        assert torch.equal(got[0].cpu(), cpu[0]) and torch.equal(got[1].cpu(), cpu[1])
        torch.testing.assert_close(got[2].cpu(), cpu[2], atol=1e-5, rtol=0)
    density = cpu[1].sum() / (cpu[1].numel() * cpu[0].shape[-1])
    assert 0.05 < float(density) < 0.9
