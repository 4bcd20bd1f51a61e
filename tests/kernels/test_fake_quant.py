"""The fake-quantized attention used by calibration: forward = reference, backward = Attn-QAT rules."""

import torch

from rotvid.kernels import metrics
from rotvid.kernels.fake_quant import _quantized_probs, fake_quant_attention, fake_quant_v_per_group_int4
from rotvid.kernels.recipes import attention_reference
from tests.kernels.helpers import attention_fp64, random_qkv


def test_forward_matches_the_int4_reference():
    q, k, v = random_qkv(1, 2, 100, 64, n_kv=150, dtype=torch.float64, bias=1.0)
    for p_mode, recipe in (("range", "int4"), ("sym", "int4-sym-p")):
        fq = fake_quant_attention(q, k, v, p_mode=p_mode, block_n=64)
        ref = attention_reference(q, k, v, recipe=recipe, block_n=64)
        assert metrics.relative_l2(ref, fq) < 1e-9


def test_quantized_probabilities_sum_to_one_per_row():
    """Like the kernels, the fake-quantized P is normalized by its own (quantized) row sum."""
    q, k, _ = random_qkv(1, 2, 50, 32, n_kv=150, dtype=torch.float64)
    s = q @ k.transpose(-1, -2) * 32**-0.5
    for p_mode in ("range", "sym"):
        p_full, p_q = _quantized_probs(s, 64, p_mode)
        torch.testing.assert_close(p_q.sum(-1), torch.ones_like(p_q.sum(-1)), rtol=0, atol=1e-12)
        assert (p_q - p_full).abs().max() > 1e-3  # it is quantized


def test_bypassed_quantizers_give_exact_attention_and_gradients():
    q, k, v = (t.requires_grad_(True) for t in random_qkv(1, 1, 9, 8, n_kv=11, dtype=torch.float64))
    out = fake_quant_attention(q, k, v, p_mode=None, quantize_qkv=False, smooth_k=False)
    assert metrics.max_abs_error(attention_fp64(q.detach(), k.detach(), v.detach()), out.detach()) < 1e-12
    assert torch.autograd.gradcheck(
        lambda a, b, c: fake_quant_attention(a, b, c, p_mode=None, quantize_qkv=False, smooth_k=False),
        (q, k, v), eps=1e-6, atol=1e-7,
    )


def test_backward_uses_the_forward_p_precision_and_high_precision_o():
    q, k, v = (t.requires_grad_(True) for t in random_qkv(1, 2, 40, 16, n_kv=70, dtype=torch.float64, bias=1.0))
    out = fake_quant_attention(q, k, v, p_mode="range", quantize_qkv=False, smooth_k=False, block_n=32)
    d_out = torch.randn_like(out)
    out.backward(d_out)
    s = (q @ k.transpose(-1, -2)).detach() * 16**-0.5
    p_full, p_q = _quantized_probs(s, 32, "range")
    assert not torch.allclose(p_q, p_full)
    # Rule 1: dV uses the quantized P of the forward pass, not the full-precision one.
    torch.testing.assert_close(v.grad, p_q.transpose(-1, -2) @ d_out, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(v.grad, p_full.transpose(-1, -2) @ d_out, rtol=1e-6, atol=1e-8)
    # Rule 2: the softmax term uses O' = P_full V, so dQ equals the exact gradient of softmax(S) V.
    q2, k2 = q.detach().clone().requires_grad_(True), k.detach().clone().requires_grad_(True)
    exact = torch.softmax(q2 @ k2.transpose(-1, -2) * 16**-0.5, dim=-1) @ v.detach()
    exact.backward(d_out)
    torch.testing.assert_close(q.grad, q2.grad, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(k.grad, k2.grad, rtol=1e-9, atol=1e-12)


def test_v_fake_quant_is_straight_through():
    """Forward: V on its per-(block, channel) INT4 grid, within half a step of that group's scale; backward: the
    straight-through estimator passes the gradient unchanged (round's zero gradient would give zeros)."""
    v = torch.randn(2, 70, 8, dtype=torch.float64, requires_grad=True)
    fq = fake_quant_v_per_group_int4(v, 32)
    assert fq.shape == v.shape and not torch.equal(fq, v)
    vd = v.detach()
    for start in range(0, 70, 32):  # per group: |fq - v| <= scale / 2, scale = amax(block, channel) / 7
        blk = slice(start, min(start + 32, 70))
        half_step = vd[:, blk].abs().amax(dim=1, keepdim=True) / 7 / 2
        assert ((fq[:, blk] - vd[:, blk]).abs() <= half_step * (1 + 1e-12)).all()
    g = torch.randn_like(vd)
    fq.backward(g)
    # every element but each group's max |v| (which also carries the scale's LSQ-style gradient) passes g through
    is_max = torch.zeros_like(vd, dtype=torch.bool)
    for start in range(0, 70, 32):
        blk = vd[:, start : start + 32].abs()
        is_max[:, start : start + 32] = blk == blk.amax(dim=1, keepdim=True)
    assert int(is_max.sum()) == 2 * 3 * 8  # one max per (batch, block, channel)
    torch.testing.assert_close(v.grad[~is_max], g[~is_max], rtol=1e-12, atol=0)
