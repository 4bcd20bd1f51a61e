"""Hadamard matrices and the offline V/O Hadamard fusion on real (tiny) diffusers modules."""

import pytest
import torch
from diffusers.models.attention_processor import FusedCogVideoXAttnProcessor2_0
from diffusers.models.embeddings import get_3d_rotary_pos_embed
from diffusers.models.transformers.cogvideox_transformer_3d import CogVideoXBlock
from diffusers.models.transformers.transformer_hunyuan_video import (
    HunyuanVideoRotaryPosEmbed,
    HunyuanVideoSingleTransformerBlock,
    HunyuanVideoTransformerBlock,
)
from diffusers.models.transformers.transformer_wan import WanAttention, WanAttnProcessor, WanRotaryPosEmbed

from rotvid.rope.hadamard import (
    fuse_v_hadamard,
    fwht,
    fuse_v_hadamard_single_stream,
    hadamard_matrix,
    is_v_hadamard_fused,
    unfuse_v_hadamard,
    unfuse_v_hadamard_single_stream,
)

HEAD_DIM = 32
HEADS = 2
DIM = HEAD_DIM * HEADS


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _randomize(module):
    """Fresh random weights (diffusers zero-inits some biases/norms) so nothing is trivially exact."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif p.dim() == 1:
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    return module


def _snapshot(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _assert_restored(module, before):
    after = module.state_dict()
    for k, v in before.items():
        assert torch.allclose(after[k], v, atol=1e-6, rtol=1e-5), k


def _close(a, b):
    scale = b.abs().max()
    assert (a - b).abs().max() <= 2e-5 * scale, float((a - b).abs().max() / scale)


@pytest.mark.parametrize("n", [1, 2, 8, 64, 128])
def test_hadamard_matrix(n):
    h = hadamard_matrix(n)
    assert torch.allclose(h @ h, torch.eye(n, dtype=torch.float64), atol=1e-14)
    assert torch.equal(h, h.T)
    assert torch.allclose(h.abs(), torch.full((n, n), n ** -0.5, dtype=torch.float64))
    if n >= 2:
        h2 = hadamard_matrix(2)
        assert torch.allclose(h, torch.kron(h2, hadamard_matrix(n // 2)), atol=1e-15)


@pytest.mark.parametrize("n", [0, 12, 96, -4])
def test_hadamard_matrix_bad_n(n):
    with pytest.raises(ValueError, match="power of two"):
        hadamard_matrix(n)


def _wan_case(fused_projections):
    attn = _randomize(WanAttention(dim=DIM, heads=HEADS, dim_head=HEAD_DIM, eps=1e-6, processor=WanAttnProcessor()))
    if fused_projections:
        attn.fuse_projections()
    rope = WanRotaryPosEmbed(HEAD_DIM, (1, 2, 2), max_seq_len=64)
    x = torch.randn(2, 3 * 4 * 5, DIM)
    freqs = rope(torch.randn(1, 4, 3, 8, 10))
    return attn, lambda: attn(x, rotary_emb=freqs)


@pytest.mark.parametrize("fused_projections", [False, True])
def test_wan_attention(fused_projections):
    attn, run = _wan_case(fused_projections)
    with torch.no_grad():
        ref = run()
        before = _snapshot(attn)
        fuse_v_hadamard(attn, HEAD_DIM)
        assert is_v_hadamard_fused(attn)
        assert not torch.allclose(attn.to_v.weight, before["to_v.weight"])
        if fused_projections:
            assert torch.equal(attn.to_qkv.weight[2 * DIM :], attn.to_v.weight)
            assert torch.equal(attn.to_qkv.weight[:DIM], before["to_q.weight"])
        _close(run(), ref)
        with pytest.raises(ValueError, match="already"):
            fuse_v_hadamard(attn, HEAD_DIM)
        unfuse_v_hadamard(attn, HEAD_DIM)
        assert not is_v_hadamard_fused(attn)
        _assert_restored(attn, before)
        with pytest.raises(ValueError, match="nothing to undo"):
            unfuse_v_hadamard(attn, HEAD_DIM)


def test_wan_bad_head_dim():
    attn, _ = _wan_case(False)
    with pytest.raises(ValueError, match="head_dim"):
        fuse_v_hadamard(attn, 16)  # 4 heads, but attn.heads == 2
    with pytest.raises(ValueError, match="power of two"):
        fuse_v_hadamard(WanAttention(dim=48, heads=2, dim_head=24), 24)


def _hunyuan_rope(f, h, w):
    rope = HunyuanVideoRotaryPosEmbed(patch_size=1, patch_size_t=1, rope_dim=[4, 14, 14], theta=256.0)
    return rope(torch.randn(1, 2, f, h, w))


def test_hunyuan_double_stream():
    block = _randomize(HunyuanVideoTransformerBlock(HEADS, HEAD_DIM, mlp_ratio=2.0))
    attn = block.attn
    x, ctx = torch.randn(2, 2 * 3 * 4, DIM), torch.randn(2, 7, DIM)
    freqs = _hunyuan_rope(2, 3, 4)
    with torch.no_grad():
        ref_video, ref_text = attn(x, ctx, image_rotary_emb=freqs)
        before = _snapshot(attn)
        fuse_v_hadamard(attn, HEAD_DIM)
        # the text branch gets the same per-head H: its values are attended together with video's.
        assert not torch.allclose(attn.add_v_proj.weight, before["add_v_proj.weight"])
        assert not torch.allclose(attn.to_add_out.weight, before["to_add_out.weight"])
        video, text = attn(x, ctx, image_rotary_emb=freqs)
        _close(video, ref_video)
        _close(text, ref_text)
        unfuse_v_hadamard(attn, HEAD_DIM)
        _assert_restored(attn, before)


def test_hunyuan_double_stream_fused_projections():
    block = _randomize(HunyuanVideoTransformerBlock(HEADS, HEAD_DIM, mlp_ratio=2.0))
    attn = block.attn
    attn.fuse_projections()
    x, ctx = torch.randn(1, 12, DIM), torch.randn(1, 5, DIM)
    freqs = _hunyuan_rope(1, 3, 4)
    with torch.no_grad():
        ref = attn(x, ctx, image_rotary_emb=freqs)
        fuse_v_hadamard(attn, HEAD_DIM)
        assert torch.equal(attn.to_added_qkv.weight[2 * DIM :], attn.add_v_proj.weight)
        out = attn(x, ctx, image_rotary_emb=freqs)
        _close(out[0], ref[0])
        _close(out[1], ref[1])


def test_hunyuan_single_stream_block():
    block = _randomize(HunyuanVideoSingleTransformerBlock(HEADS, HEAD_DIM, mlp_ratio=2.0))
    x, ctx, temb = torch.randn(2, 24, DIM), torch.randn(2, 6, DIM), torch.randn(2, DIM)
    freqs = _hunyuan_rope(2, 3, 4)
    with torch.no_grad():
        ref = block(x, ctx, temb, image_rotary_emb=freqs)
        before = _snapshot(block)
        with pytest.raises(ValueError, match="output_projection"):
            fuse_v_hadamard(block.attn, HEAD_DIM)
        fuse_v_hadamard_single_stream(block, HEAD_DIM)
        # only the attention columns of proj_out change; the MLP columns stay.
        assert torch.equal(block.proj_out.weight[:, DIM:], before["proj_out.weight"][:, DIM:])
        assert not torch.allclose(block.proj_out.weight[:, :DIM], before["proj_out.weight"][:, :DIM])
        out = block(x, ctx, temb, image_rotary_emb=freqs)
        _close(out[0], ref[0])
        _close(out[1], ref[1])
        with pytest.raises(ValueError, match="differ"):
            unfuse_v_hadamard(block.attn, HEAD_DIM)
        unfuse_v_hadamard_single_stream(block, HEAD_DIM)
        _assert_restored(block, before)


@pytest.mark.parametrize("fused_projections", [False, True])
def test_cogvideox_attention(fused_projections):
    block = _randomize(CogVideoXBlock(dim=DIM, num_attention_heads=HEADS, attention_head_dim=HEAD_DIM, time_embed_dim=16))
    attn = block.attn1
    if fused_projections:
        attn.fuse_projections()
        attn.set_processor(FusedCogVideoXAttnProcessor2_0())
    x, ctx = torch.randn(2, 3 * 4 * 5, DIM), torch.randn(2, 6, DIM)
    freqs = get_3d_rotary_pos_embed(HEAD_DIM, ((0, 0), (4, 5)), (4, 5), 3)
    with torch.no_grad():
        ref = attn(x, ctx, image_rotary_emb=freqs)
        before = _snapshot(attn)
        fuse_v_hadamard(attn, HEAD_DIM)
        out = attn(x, ctx, image_rotary_emb=freqs)
        _close(out[0], ref[0])
        _close(out[1], ref[1])
        unfuse_v_hadamard(attn, HEAD_DIM)
        _assert_restored(attn, before)


def test_hunyuan_text_branch_needs_the_same_h():
    """Video and text values are attended together: H on the video branch alone is not exact."""
    block = _randomize(HunyuanVideoTransformerBlock(HEADS, HEAD_DIM, mlp_ratio=2.0))
    attn = block.attn
    x, ctx = torch.randn(1, 12, DIM), torch.randn(1, 5, DIM)
    freqs = _hunyuan_rope(1, 3, 4)
    with torch.no_grad():
        ref_video, _ = attn(x, ctx, image_rotary_emb=freqs)
        text_w, text_b = attn.add_v_proj.weight.clone(), attn.add_v_proj.bias.clone()
        fuse_v_hadamard(attn, HEAD_DIM)
        attn.add_v_proj.weight.copy_(text_w)  # undo H on the text values only
        attn.add_v_proj.bias.copy_(text_b)
        video, _ = attn(x, ctx, image_rotary_emb=freqs)
        assert (video - ref_video).abs().max() > 1e-2 * ref_video.abs().max()


@pytest.mark.parametrize("d", [1, 2, 8, 64, 128])
def test_fwht_equals_the_hadamard_matrix(d):
    x = torch.randn(3, 5, d, dtype=torch.float64)
    assert (fwht(x) - x @ hadamard_matrix(d)).abs().max() < 1e-12
    x32 = x.float()
    out = fwht(x32)
    assert out.dtype == torch.float32 and (out.double() - x @ hadamard_matrix(d)).abs().max() < 1e-5 * d
    assert fwht(x.bfloat16()).dtype == torch.bfloat16


def test_fwht_order_is_the_documented_butterfly():
    """Stage s = 0, 1, ... maps (x_i, x_{i + 2^s}) -> (x_i + x_{i + 2^s}, x_i - x_{i + 2^s}) in float32, then one
    multiply by D^-1/2 rounded to float32: the CUDA kernels follow this order, so it must not drift. A per-element
    loop written from that sentence gives the same bits."""
    d = 16
    x = torch.randn(7, d) * torch.logspace(-3, 3, d)  # magnitudes that make the rounding order visible
    want = x.clone()
    for s in range(4):
        h = 1 << s
        nxt = want.clone()
        for i in range(d):
            if i & h == 0:
                nxt[:, i] = want[:, i] + want[:, i + h]
                nxt[:, i + h] = want[:, i] - want[:, i + h]
        want = nxt
    want = want * torch.tensor(d**-0.5, dtype=torch.float32)
    assert torch.equal(fwht(x), want)
    # the order matters at these magnitudes: the matmul's float32 sums differ somewhere
    assert not torch.equal(fwht(x), x @ hadamard_matrix(d, torch.float32))


def test_fwht_rejects_non_power_of_two():
    with pytest.raises(ValueError, match="power of two"):
        fwht(torch.zeros(2, 12))


def test_block_hadamard_for_head_dims_that_are_not_powers_of_two():
    from rotvid.rope.hadamard import block_hadamard_matrix, vo_hadamard_block

    assert [vo_hadamard_block(d) for d in (64, 128, 12, 10, 24, 9)] == [64, 128, 4, 2, 8, 1]
    for d in (12, 10, 24):
        h = block_hadamard_matrix(d, vo_hadamard_block(d))
        torch.testing.assert_close(h @ h, torch.eye(d, dtype=torch.float64), rtol=0, atol=1e-15)
        assert torch.equal(h, h.T)
    torch.testing.assert_close(block_hadamard_matrix(16, 16), hadamard_matrix(16), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"head_dim 12: .*block=8.*vo_hadamard=False"):
        block_hadamard_matrix(12, 8)


def test_fuse_with_a_block_is_exact_and_undone_for_head_dim_24():
    attn = WanAttention(dim=48, heads=2, dim_head=24)
    before = {k: v.clone() for k, v in attn.state_dict().items()}
    with pytest.raises(ValueError, match=r"head_dim 24 is not a power of two.*block=8.*vo_hadamard=False"):
        fuse_v_hadamard(attn, 24)
    fuse_v_hadamard(attn, 24, block=8)
    assert not torch.equal(attn.to_v.weight, before["to_v.weight"])
    unfuse_v_hadamard(attn, 24)
    for k, v in attn.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=1e-6, atol=1e-6)


# ---- the online V/O Hadamard -----------------------------------------------------------------------------------
@pytest.mark.parametrize("head_dim", [128, 64, 12, 10])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_online_vo_pair_is_the_identity_and_is_the_block_hadamard(head_dim, dtype):
    from rotvid.rope.hadamard import block_hadamard_matrix, rotate_v_online, unrotate_o_online, vo_hadamard_block

    block = vo_hadamard_block(head_dim)
    g = torch.Generator().manual_seed(0)
    v = torch.randn(2, 7, 3, head_dim, generator=g).to(dtype).transpose(1, 2)  # a BHND view of BNHD memory
    r = rotate_v_online(v, block)
    assert r.shape == v.shape and r.stride() == v.stride()  # the layout is kept
    k = block.bit_length() - 1
    want = v.double() @ block_hadamard_matrix(head_dim, block) * (block ** 0.5 * 2.0 ** -((k + 1) // 2))
    tol = 0 if dtype == torch.float64 else 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(r.double(), want, rtol=tol, atol=tol * want.abs().max().item() + 1e-12)
    back = unrotate_o_online(r, block)
    if dtype == torch.float64:
        torch.testing.assert_close(back, v, rtol=0, atol=1e-12)
    else:  # two roundings in dtype, no drift of scale (the pair multiplies to exactly I)
        torch.testing.assert_close(back.double(), v.double(), rtol=0, atol=4 * tol * v.abs().max().item())


def documented_butterflies(x: torch.Tensor, block: int) -> torch.Tensor:
    """The unnormalized transform of each block of ``block`` channels, one element at a time in float32, written from
    the sentence of :func:`rotvid.rope.hadamard._butterflies` (stage s maps (x_i, x_{i + 2^s}) to their sum and
    difference): the order the CUDA kernels' ``roperows::wht8`` runs."""
    d = x.shape[-1]
    want = x.float().clone()
    h = 1
    while h < block:
        nxt = want.clone()
        for i in range(d):
            if i & h == 0:
                nxt[..., i] = want[..., i] + want[..., i + h]
                nxt[..., i + h] = want[..., i] - want[..., i + h]
        want = nxt
        h *= 2
    return want


@pytest.mark.parametrize("block", [1, 2, 4, 8, 16, 32, 64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_online_vo_is_the_butterfly_order_then_one_rounding(block, dtype):
    """Both sides are the float32 butterflies of each block in fwht's order, an exact power of two (2^-ceil(k/2) for
    V, 2^-floor(k/2) for O), and one rounding to the input's dtype: bit for bit, at magnitudes where the order of
    the float32 sums shows (the fused CUDA kernels reproduce exactly these bits)."""
    from rotvid.rope.hadamard import rotate_v_online, unrotate_o_online, vo_hadamard_exponent

    d = 128
    g = torch.Generator().manual_seed(block)
    x = (torch.randn(2, 3, 5, d, generator=g) * torch.logspace(-2, 2, d)).to(dtype)
    butterflies = documented_butterflies(x, block)
    for fn, side in ((rotate_v_online, "v"), (unrotate_o_online, "o")):
        want = (butterflies * 2.0 ** -vo_hadamard_exponent(block, side)).to(dtype)
        assert torch.equal(fn(x, block), want), (fn.__name__, block, dtype)
    k = block.bit_length() - 1
    assert vo_hadamard_exponent(block, "v") + vo_hadamard_exponent(block, "o") == k
    assert (vo_hadamard_exponent(block, "v"), vo_hadamard_exponent(block, "o")) == ((k + 1) // 2, k // 2)


def four_lane_butterflies(x: torch.Tensor) -> torch.Tensor:
    """The unnormalized transform of whole rows (block = head_dim, 64 or 128) as ``roperows::wht4lanes`` runs it, in
    float32: lane c of 4 holds y[c][8 i + e] = channel 8 (c + 4 i) + e; stages 0-2 inside a lane (index bits 0-2),
    stages 3-4 as the shuffles xor 1 and 2 (the upper lane takes other - own, the lower own + other), stages 5-6
    inside a lane again (index bits 3-4)."""
    d = x.shape[-1]
    v = d // 4
    xf = x.float()
    y = [[xf[..., 8 * (c + 4 * (j // 8)) + j % 8] for j in range(v)] for c in range(4)]

    def in_lane(h):
        for c in range(4):
            for j in range(v):
                if j & h == 0:
                    a, b = y[c][j], y[c][j + h]
                    y[c][j], y[c][j + h] = a + b, a - b

    for h in (1, 2, 4):
        in_lane(h)
    for m in (1, 2):
        y = [[y[c ^ m][j] - y[c][j] if c & m else y[c][j] + y[c ^ m][j] for j in range(v)] for c in range(4)]
    h = 8
    while h < v:
        in_lane(h)
        h *= 2
    out = torch.empty_like(xf)
    for c in range(4):
        for j in range(v):
            out[..., 8 * (c + 4 * (j // 8)) + j % 8] = y[c][j]
    return out


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_four_lane_layout_gives_the_online_v_bits(head_dim, dtype):
    """The int8-fp8 pre-processing's rotated V paths hold a row in 4 lanes (roperows::wht4lanes) instead of
    head_dim / 8: the same stages in the same order with the same operands per channel, so the float32 sums of wht8's
    order bit for bit (at these magnitudes another stage order changes some of them) and rotate_v_online's bits."""
    from rotvid.rope.hadamard import rotate_v_online, vo_hadamard_exponent

    g = torch.Generator().manual_seed(head_dim)
    x = (torch.randn(3, 7, head_dim, generator=g) * torch.logspace(-2, 2, head_dim)).to(dtype)
    sums = four_lane_butterflies(x)
    assert torch.equal(sums.view(torch.int32), documented_butterflies(x, head_dim).view(torch.int32))
    got = (sums * 2.0 ** -vo_hadamard_exponent(head_dim, "v")).to(dtype)
    assert torch.equal(got, rotate_v_online(x, head_dim))


@pytest.mark.parametrize("block", [1, 2, 4, 8, 16, 32, 64, 128])
@pytest.mark.parametrize("head_dim", [128, 256])
def test_online_vo_matches_the_sylvester_matrix_and_the_pair_is_the_identity(block, head_dim):
    """Against the explicit ±1 Sylvester matrix (float64): float64 inputs give it up to float64 rounding and the pair
    returns v (the scales are powers of two: exactly I in exact arithmetic); float32 within its rounding."""
    from rotvid.rope.hadamard import block_hadamard_matrix, rotate_v_online, unrotate_o_online, vo_hadamard_exponent

    g = torch.Generator().manual_seed(head_dim + block)
    v = torch.randn(2, 4, 9, head_dim, generator=g, dtype=torch.float64)
    signs = block_hadamard_matrix(head_dim, block) * block**0.5  # I ⊗ (±1 matrix)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-6)):
        x = v.to(dtype)
        r = rotate_v_online(x, block)
        want = x.double() @ signs * 2.0 ** -vo_hadamard_exponent(block, "v")
        torch.testing.assert_close(r.double(), want, rtol=0, atol=tol * want.abs().max().item())
        o = unrotate_o_online(r, block)
        want_o = r.double() @ signs * 2.0 ** -vo_hadamard_exponent(block, "o")
        torch.testing.assert_close(o.double(), want_o, rtol=0, atol=tol * want_o.abs().max().item())
        torch.testing.assert_close(o.double(), x.double(), rtol=0, atol=2 * tol * x.abs().max().item())
    # the ±1 entries and the powers of two are exact: integer inputs stay integers through the pair in float64
    ints = torch.randint(-50, 50, (3, head_dim), generator=g).double()
    assert torch.equal(unrotate_o_online(rotate_v_online(ints, block), block), ints)


def test_online_vo_keeps_the_bnhd_layout_and_rejects_a_bad_block():
    from rotvid.rope.hadamard import rotate_v_online, unrotate_o_online, vo_hadamard_exponent

    v = torch.randn(2, 7, 3, 64).transpose(1, 2)  # a BHND view of BNHD memory
    for fn in (rotate_v_online, unrotate_o_online):
        out = fn(v, 64)
        assert out.shape == v.shape and out.stride() == v.stride()
        assert torch.equal(out, fn(v.contiguous(), 64))
    with pytest.raises(ValueError, match="not a multiple"):
        rotate_v_online(torch.zeros(2, 12), 8)
    for bad in (0, 3, 12, True):
        with pytest.raises(ValueError, match="power of two"):
            vo_hadamard_exponent(bad, "v")
    with pytest.raises(ValueError, match="side"):
        vo_hadamard_exponent(8, "q")


def test_online_vo_compiled_equals_eager():
    from rotvid.rope.hadamard import rotate_v_online, unrotate_o_online

    v = torch.randn(1, 2, 33, 64)

    def both(x):
        return unrotate_o_online(rotate_v_online(x, 64), 64), rotate_v_online(x, 64)

    eager = both(v)
    compiled = torch.compile(both, fullgraph=True, backend="aot_eager")(v)
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
