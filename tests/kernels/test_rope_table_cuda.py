"""RoPE·R by the generalized table on rotvid's CUDA kernel (rope_table.cu): the same bits as the Triton kernel and
as the compiled PyTorch form, every output element written, the dispatch of ``apply_generalized_rope``, and the
reasons it names when it cannot take an input (those on CPU)."""

import pytest
import torch

from rotvid.kernels.cuda_build import load_extension
from rotvid.kernels.rope_op import apply_generalized_rope, generalized_rope_cuda, generalized_rope_unsupported
from rotvid.rope.fused_table import fuse_rope_and_rotation
from rotvid.rope.hadamard import fwht
from rotvid.rope.rotations import PairRotation, make_rotation
from rotvid.rope.tables import rope_table_3d

SEGMENTS = {128: (44, 42, 42), 64: (16, 24, 24)}
FAMILY = {128: "wan", 64: "cogvideox"}


def make_table(d, spec, grid, device, seed=0):
    cos, sin = rope_table_3d(FAMILY[d], grid, d)
    if spec == "learned":
        g = torch.Generator().manual_seed(seed)
        rot = PairRotation.learned(torch.rand(d // 2, generator=g) * 6.28, torch.randint(0, 2, (d // 2,), generator=g),
                                   pairing="half", head_dim=d, segments=SEGMENTS[d])
    else:
        rot = make_rotation(spec, d, SEGMENTS[d])
    return fuse_rope_and_rotation(cos.to(device), sin.to(device), rot).to(dtype=torch.float32), cos.shape[0]


def test_unsupported_inputs_are_named_on_cpu():
    x = torch.randn(1, 2, 8, 128, dtype=torch.bfloat16)
    assert "CUDA" in generalized_rope_unsupported(x, torch.zeros(8, 128, 4))
    with pytest.raises(ValueError, match="x: expected a CUDA"):
        generalized_rope_cuda(x, torch.zeros(8, 128, 4), torch.zeros(128, 4, dtype=torch.long))


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ["none", "interleaved", "half", "learned", "full"])
@pytest.mark.parametrize("d, dtype", [(128, torch.bfloat16), (64, torch.float16), (128, torch.float16)], ids=str)
@pytest.mark.parametrize("layout", ["BHND", "BNHD"])
def test_cuda_kernel_equals_triton_and_compiled_form(spec, d, dtype, layout):
    """``full``: RoPE's table with the Walsh–Hadamard transform in registers; the references are then the Triton
    kernel / compiled form followed by ``fwht`` (rotvid.rope.hadamard), which fixes the order of additions."""
    from rotvid.kernels.rope_triton import apply_generalized_rope_triton

    then = fwht if spec == "full" else (lambda y: y)
    for grid in [(1, 1, 1), (1, 97, 1), (3, 7, 49)]:  # N = 1, 97, 1029: tails of the 16- / 32-token CTAs
        table, n = make_table(d, spec, grid, "cuda", seed=n_seed(grid))
        b, h = 2, 5  # 5 heads: a step of 4 and a tail of 1
        torch.manual_seed(n)
        if layout == "BNHD":  # diffusers' projection layout, seen through a transpose
            x = torch.randn(b, n, h, d, device="cuda", dtype=torch.float32).to(dtype).transpose(1, 2)
        else:
            x = torch.randn(b, h, n, d, device="cuda", dtype=torch.float32).to(dtype)
        assert generalized_rope_unsupported(x, table.coef) == ""
        out = torch.full((b, h, n, d), float("nan"), device="cuda", dtype=dtype)
        ext = load_extension(x.device)
        assert table.hadamard == (spec == "full")
        ext.generalized_rope(x, table.coef.contiguous(), table.index.to(torch.int32).contiguous(), out,
                             hadamard=table.hadamard)
        torch.cuda.synchronize()
        assert not torch.isnan(out).any(), "kernel left output elements unwritten (NaN poison survived)"
        want = then(apply_generalized_rope_triton(x, table.coef, table.index))
        assert torch.equal(out, want), f"{spec} {grid}: differs from the Triton kernel"
        if layout == "BHND" and n > 1000:  # (one compile per case)
            idx = table.index.to(x.device)
            compiled = torch.compile(lambda x, c: (x.float()[..., idx] * c).sum(-1).to(x.dtype), fullgraph=True)
            assert torch.equal(out, then(compiled(x, table.coef))), f"{spec} {grid}: differs from the compiled form"
        # and the dispatch takes it
        assert torch.equal(apply_generalized_rope(x, table), out)


def n_seed(grid):
    return grid[0] * 10000 + grid[1] * 100 + grid[2]


@pytest.mark.gpu
def test_compiled_dispatch_runs_the_custom_op_without_graph_breaks():
    table, n = make_table(128, "half", (2, 6, 10), "cuda")
    x = torch.randn(1, 3, n, 128, device="cuda", dtype=torch.bfloat16)

    def f(x):
        return apply_generalized_rope(x, table) * 2

    explain = torch._dynamo.explain(f)(x)
    assert explain.graph_break_count == 0, explain.break_reasons
    torch._dynamo.reset()
    assert torch.equal(torch.compile(f, fullgraph=True)(x), f(x))


@pytest.mark.gpu
def test_per_head_tables_and_float32_keep_the_triton_kernel():
    cos, sin = rope_table_3d("wan", (2, 2, 3), 128)
    rot = PairRotation.learned(torch.rand(3, 64) * 6.28, torch.randint(0, 2, (3, 64)), pairing="half", head_dim=128,
                               segments=(44, 42, 42))
    table = fuse_rope_and_rotation(cos.cuda(), sin.cuda(), rot).to(dtype=torch.float32)
    x = torch.randn(1, 3, cos.shape[0], 128, device="cuda", dtype=torch.bfloat16)
    assert "per-head" in generalized_rope_unsupported(x, table.coef)
    assert "fp16 / bf16" in generalized_rope_unsupported(x.float(), table.coef[0])
    from rotvid.kernels.rope_triton import apply_generalized_rope_triton

    assert torch.equal(apply_generalized_rope(x, table), apply_generalized_rope_triton(x, table.coef, table.index))
