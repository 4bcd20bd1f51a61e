"""RoPE·R inside the int8-fp8 pre-processing (preprocess_int8fp8.cu: rope_q_kernel; K through rope_table.cu): the operands it
writes are byte for byte those of the RoPE·R pass (rope_table.cu) followed by the pre-processing, for every pair
rotation and the full Hadamard (its transform in registers), both head dims and layouts, odd lengths, kv_lens and the
smoothing switches; the attention through the
dispatcher (``rope=``) equals the attention of the rotated tensors, eager and compiled."""

import pytest
import torch

from rotvid.kernels import attention
from rotvid.kernels.recipes.int8_fp8.ops import preprocess_int8fp8_cuda, rope_fusion_unsupported
from rotvid.kernels.rope_op import apply_generalized_rope
from tests.kernels.helpers import cuda_qkv
from tests.kernels.test_cuda_int8fp8 import needs_sm90
from tests.kernels.test_rope_table_cuda import make_table

pytestmark = pytest.mark.gpu

FIELDS = ("q_hat", "q_scale", "k_hat", "k_scale", "vt", "vparams", "v_mean")


def poison_allocator(mb=256):
    """Fill and free a large block, so that the outputs' uninitialized memory (at::empty) reads NaN bytes."""
    t = torch.full((mb * 2**18,), float("nan"), device="cuda")
    del t


def inputs(d, dtype, layout, grid, spec, heads, lens, seed):
    table, n = make_table(d, spec, grid, "cuda", seed=seed)
    q, k, v, kv_lens = cuda_qkv(2, heads, n, n, d, dtype, layout, seed=seed, kv_lens=lens(n) if lens else None)
    return table, n, q, k, v, kv_lens


def rotated(x, table, layout):
    if layout == "BHND":
        return apply_generalized_rope(x, table)
    return apply_generalized_rope(x.transpose(1, 2), table).transpose(1, 2)


@pytest.mark.parametrize("spec", ["none", "interleaved", "half", "learned", "full"])
@pytest.mark.parametrize("d, dtype", [(128, torch.bfloat16), (64, torch.float16)], ids=str)
@pytest.mark.parametrize("layout", ["BHND", "BNHD"])
def test_fused_rope_preprocess_equals_rope_pass_then_preprocess(spec, d, dtype, layout):
    needs_sm90()
    # N = 97, 1029, 4410 (CTA tails of 16 / 32 tokens); 5 heads (a step of 4 + 1)
    for grid, lens in [((1, 97, 1), None), ((3, 7, 49), lambda n: [n, n // 3]), ((10, 21, 21), lambda n: [n - 5, 1])]:
        table, n, q, k, v, kv_lens = inputs(d, dtype, layout, grid, spec, 5, lens, seed=grid[1] + d)
        qr, kr = rotated(q, table, layout), rotated(k, table, layout)
        for smooth_k, smooth_v in [(True, False), (False, True), (True, True)]:
            opts = dict(layout=layout, kv_lens=kv_lens, smooth_k=smooth_k, smooth_v=smooth_v)
            want = preprocess_int8fp8_cuda(qr, kr, v, **opts)
            poison_allocator()
            got = preprocess_int8fp8_cuda(q, k, v, rope=table, **opts)
            torch.cuda.synchronize()
            for name in FIELDS:
                a, b = getattr(got, name), getattr(want, name)
                assert torch.equal(a.view(torch.int32) if a.dtype == torch.float32 else a,
                                   b.view(torch.int32) if b.dtype == torch.float32 else b), (
                    f"{spec} d{d} {layout} N{n} smooth_k={smooth_k} smooth_v={smooth_v}: {name} differs")


@pytest.mark.parametrize("layout", ["BHND", "BNHD"])
def test_attention_with_rope_equals_attention_of_rotated_inputs(layout):
    needs_sm90()
    table, n, q, k, v, kv_lens = inputs(128, torch.bfloat16, layout, (4, 15, 20), "half", 3, lambda n: [n, 700], 7)
    out = attention(q, k, v, recipe="int8-fp8", backend="cuda", layout=layout, kv_lens=kv_lens, smooth_v=True,
                    rope=table)
    want = attention(rotated(q, table, layout), rotated(k, table, layout), v, recipe="int8-fp8", backend="cuda",
                     layout=layout, kv_lens=kv_lens, smooth_v=True)
    assert torch.equal(out, want)
    # a recipe without the fusion rotates first in the dispatcher: the same as rotating by hand
    out4 = attention(q, k, v, recipe="int4", backend="cuda", layout=layout, rope=table)
    want4 = attention(rotated(q, table, layout), rotated(k, table, layout), v, recipe="int4", backend="cuda",
                      layout=layout)
    assert torch.equal(out4, want4)


def test_attention_with_rope_compiles_fullgraph():
    needs_sm90()
    table, n, q, k, v, _ = inputs(64, torch.bfloat16, "BNHD", (2, 9, 20), "half", 4, None, 11)

    def f(q, k, v, coef):
        t = type(table)(coef=coef, index=table.index)
        return attention(q, k, v, recipe="int8-fp8", backend="auto", layout="BNHD", rope=t)

    explain = torch._dynamo.explain(f)(q, k, v, table.coef)
    assert explain.graph_break_count == 0, explain.break_reasons
    assert torch.equal(torch.compile(f, fullgraph=True)(q, k, v, table.coef), f(q, k, v, table.coef))


def test_fusion_refusals_are_named():
    needs_sm90()
    table, n, q, k, v, _ = inputs(128, torch.bfloat16, "BHND", (1, 9, 9), "half", 2, None, 3)
    per_head = type(table)(coef=table.coef.expand(2, *table.coef.shape), index=table.index)
    assert "per-head" in rope_fusion_unsupported(q, k, per_head)
    assert "N_q == N_kv" in rope_fusion_unsupported(q, k[:, :, :40], table)
    with pytest.raises(ValueError, match="rope: a per-head"):
        preprocess_int8fp8_cuda(q, k, v, rope=per_head)
