"""RoPE·R inside the INT4 pre-processing (preprocess_int4_rope.cu: the means of the rotated Q and K and of V in one
launch, the rotated rows in another): every operand it writes is byte for byte that of the RoPE·R pass (rope_table.cu)
on q and k followed by the INT4 pre-processing, for every pair rotation and the full Hadamard, both head dims, dtypes
and layouts, head counts that split into several head sets (and sets that leave lanes idle), odd lengths, kv_lens,
every smoothing switch (Q smoothing's per-key bias included), both block sizes and every V^T format; the attention
through the dispatcher (``rope=``) equals the attention of the rotated tensors, eager and compiled."""

import pytest
import torch

from rotvid.kernels import attention
from tests.kernels.test_cuda_int8fp8_rope import inputs, poison_allocator, rotated

pytestmark = pytest.mark.gpu

FIELDS = ("q_hat", "q_scale", "k_hat", "k_scale", "vt", "vparams", "v_mean", "k_bias")
# (smooth_q, smooth_k, smooth_v): none, the INT4 default (Q and K), K and V, all three, Q alone
SMOOTHING = [(False, False, False), (True, True, False), (False, True, True), (True, True, True), (True, False, False)]


def cb():
    from rotvid.kernels import cuda_backend

    return cuda_backend


def needs_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    problem = cb().CudaBackend().availability()
    if not problem.startswith("available"):
        pytest.skip(problem)


def assert_same_operands(got, want, what):
    for name in FIELDS:
        a, b = getattr(got, name), getattr(want, name)
        assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: {name} {tuple(a.shape)} vs {tuple(b.shape)}"
        if a.dtype == torch.float32:
            a, b = a.view(torch.int32), b.view(torch.int32)
        assert torch.equal(a, b), f"{what}: {name} differs ({(a != b).sum().item()} of {a.numel()})"


@pytest.mark.parametrize("spec", ["none", "interleaved", "half", "learned", "full"])
@pytest.mark.parametrize("d, dtype", [(128, torch.bfloat16), (64, torch.float16)], ids=str)
@pytest.mark.parametrize("layout", ["BHND", "BNHD"])
def test_fused_rope_int4_preprocess_equals_rope_pass_then_preprocess(spec, d, dtype, layout):
    needs_cuda()
    # N = 97, 1029, 4410 (token ranges of 64 / 128 with tails); 5 heads (one set, idle lanes), 17 (two sets of 9 at
    # D 128), 40 (two sets of 20 at D 64)
    cases = [((1, 97, 1), None, 5), ((3, 7, 49), lambda n: [n, n // 3], 17), ((10, 21, 21), lambda n: [n - 5, 1], 40)]
    for grid, lens, heads in cases:
        table, n, q, k, v, kv_lens = inputs(d, dtype, layout, grid, spec, heads, lens, seed=grid[1] + d + heads)
        qr, kr = rotated(q, table, layout), rotated(k, table, layout)
        for smooth_q, smooth_k, smooth_v in SMOOTHING:
            opts = dict(layout=layout, kv_lens=kv_lens, smooth_q=smooth_q, smooth_k=smooth_k, smooth_v=smooth_v,
                        block_n=128)
            want = cb().preprocess_int4_cuda(qr, kr, v, **opts)
            poison_allocator()
            got = cb().preprocess_int4_cuda(q, k, v, rope=table, **opts)
            torch.cuda.synchronize()
            assert_same_operands(got, want, f"{spec} d{d} {layout} N{n} H{heads} smooth q/k/v "
                                            f"{smooth_q}/{smooth_k}/{smooth_v}")


@pytest.mark.parametrize("path", ["s8", "s4", None])
@pytest.mark.parametrize("block_n", [64, 128])
def test_fused_rope_int4_every_row_layout(path, block_n):
    """The s8 and s4 row layouts (the s4 path's nibbles), the arch default's V^T bytes, both key block sizes."""
    needs_cuda()
    for d, dtype in [(128, torch.float16), (64, torch.bfloat16)]:
        table, n, q, k, v, kv_lens = inputs(d, dtype, "BNHD", (2, 9, 21), "half", 6, lambda n: [n - 3, 200], 5)
        qr, kr = rotated(q, table, "BNHD"), rotated(k, table, "BNHD")
        opts = dict(layout="BNHD", kv_lens=kv_lens, smooth_q=True, smooth_v=True, block_n=block_n, path=path)
        want = cb().preprocess_int4_cuda(qr, kr, v, **opts)
        poison_allocator()
        got = cb().preprocess_int4_cuda(q, k, v, rope=table, **opts)
        torch.cuda.synchronize()
        assert_same_operands(got, want, f"path {path} block_n {block_n} d{d}")


@pytest.mark.parametrize("layout", ["BHND", "BNHD"])
@pytest.mark.parametrize("recipe", ["int4", "int4-sym-p"])
def test_int4_attention_with_rope_equals_attention_of_rotated_inputs(layout, recipe):
    needs_cuda()
    table, n, q, k, v, kv_lens = inputs(128, torch.bfloat16, layout, (4, 15, 20), "full", 3, lambda n: [n, 700], 7)
    assert cb().CudaBackend().fuses_rope(q, k, table, recipe=recipe, layout=layout)
    opts = dict(recipe=recipe, backend="cuda", layout=layout, kv_lens=kv_lens, smooth_q=True, smooth_v=True)
    out = attention(q, k, v, rope=table, **opts)
    want = attention(rotated(q, table, layout), rotated(k, table, layout), v, **opts)
    assert not torch.isnan(out).any()
    assert torch.equal(out, want)


def test_int4_attention_with_rope_compiles_fullgraph():
    needs_cuda()
    table, n, q, k, v, _ = inputs(64, torch.bfloat16, "BNHD", (2, 9, 20), "interleaved", 4, None, 11)

    def f(q, k, v, coef):
        t = type(table)(coef=coef, index=table.index, hadamard=table.hadamard)
        return attention(q, k, v, recipe="int4", backend="cuda", layout="BNHD", smooth_q=True, rope=t)

    explain = torch._dynamo.explain(f)(q, k, v, table.coef)
    assert explain.graph_break_count == 0, explain.break_reasons
    assert torch.equal(torch.compile(f, fullgraph=True)(q, k, v, table.coef), f(q, k, v, table.coef))


def test_int4_fusion_refusal_is_named():
    needs_cuda()
    table, n, q, k, v, _ = inputs(128, torch.bfloat16, "BHND", (1, 9, 9), "half", 2, None, 3)
    per_head = type(table)(coef=table.coef.expand(2, *table.coef.shape), index=table.index)
    assert not cb().CudaBackend().fuses_rope(q, k, per_head, recipe="int4")
    with pytest.raises(ValueError, match="rope: a per-head"):
        cb().preprocess_int4_cuda(q, k, v, rope=per_head)
    # the dispatcher rotates first where the fusion does not apply: the same as rotating by hand
    out = attention(q, k, v, recipe="int4", backend="cuda", rope=per_head)
    want = attention(rotated(q, per_head, "BHND"), rotated(k, per_head, "BHND"), v, recipe="int4", backend="cuda")
    assert torch.equal(out, want)
