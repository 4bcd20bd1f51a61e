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


def test_ste_gradient_is_one_at_the_int4_boundary():
    """The intended gradient, pinned independently of ``clamp``'s boundary gradient (torch 2.15 gives a value
    equal to the clamp bound a zero gradient, 2.13 a one): values that round to ±7 pass the gradient through
    like every other value, in the per-token (Q, K) and the per-group (V) quantizers."""
    from rotvid.kernels.fake_quant import fake_quant_per_token_int4, round_clamp_ste

    x = torch.tensor([-7.0, -6.9, -6.5, -3.4, 0.0, 2.5, 6.5, 6.6, 7.0], dtype=torch.float64, requires_grad=True)
    y = round_clamp_ste(x, 7)
    torch.testing.assert_close(y.detach(), torch.tensor([-7.0, -7, -6, -3, 0, 2, 6, 7, 7], dtype=torch.float64))
    y.backward(torch.arange(1.0, 10.0, dtype=torch.float64))
    torch.testing.assert_close(x.grad, torch.arange(1.0, 10.0, dtype=torch.float64), rtol=0, atol=0)
    # beyond the bound (only float error can put a value there): the forward clamps, the gradient still passes
    z = torch.tensor([7.0000001, -7.2], dtype=torch.float64, requires_grad=True)
    out = round_clamp_ste(z, 7)
    out.sum().backward()
    assert out.tolist() == [7.0, -7.0] and z.grad.tolist() == [1.0, 1.0]

    # per token: scale = max|row| / 7 = 1 for this row; 6.8 and -6.7 round to ±7 (not the row max): gradient g
    row = torch.tensor([[7.0, 6.8, -6.7, 3.3, -0.2, 6.4]], dtype=torch.float64, requires_grad=True)
    fq = fake_quant_per_token_int4(row)
    assert fq.detach().tolist() == [[7.0, 7.0, -7.0, 3.0, -0.0, 6.0]]
    g = torch.tensor([[0.0, 1.5, -2.0, 0.25, 3.0, -1.0]], dtype=torch.float64)
    fq.backward(g)
    torch.testing.assert_close(row.grad[0, 1:], g[0, 1:], rtol=0, atol=1e-15)

    # per group (V): one block of 4 keys, channel 0 has max 7 and 6.9 / -6.6 round to ±7
    v = torch.tensor([[[7.0, 1.0], [6.9, 0.5], [-6.6, -1.0], [2.0, 0.25]]], dtype=torch.float64, requires_grad=True)
    fv = fake_quant_v_per_group_int4(v, 4)
    assert fv.detach()[0, :, 0].tolist() == [7.0, 7.0, -7.0, 2.0]
    gv = torch.randn_like(v.detach())
    fv.backward(gv)
    torch.testing.assert_close(v.grad[0, 1:3, 0], gv[0, 1:3, 0], rtol=0, atol=1e-15)
