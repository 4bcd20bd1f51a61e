"""Generalized RoPE table: RoPE followed by none / interleaved / half / learned in one
element-wise op, exact in float64; the full Hadamard as RoPE's table flagged ``hadamard`` (then the FWHT)."""

import math

import pytest
import torch
from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

from rotvid.rope.fused_table import GeneralizedRopeTable, apply_generalized_rope, fuse_rope_and_rotation
from rotvid.rope.hadamard import fwht
from rotvid.rope.model_facts import get_rope_facts
from rotvid.rope.rotations import PairRotation, make_rotation
from rotvid.rope.tables import apply_rope_interleaved, rope_table_3d


def _rotations(head_dim, segs, gen):
    rots = [make_rotation(s, head_dim, segs) for s in ("none", "interleaved", "half", "full")]
    for pairing in ("half", "interleaved"):
        angles = torch.rand(head_dim // 2, generator=gen, dtype=torch.float64) * 2 * math.pi
        reflect = (torch.rand(head_dim // 2, generator=gen) > 0.5).to(torch.int8)
        rots.append(PairRotation.learned(angles, reflect, pairing=pairing, head_dim=head_dim, segments=segs))
    return rots


@pytest.mark.parametrize("family,head_dim,grid", [("wan", 128, (3, 5, 4)), ("wan", 64, (2, 3, 7)),
                                                  ("hunyuan_video", 128, (3, 4, 3)), ("cogvideox", 64, (4, 3, 5))])
def test_fused_equals_rope_then_rotation_float64(family, head_dim, grid):
    gen = torch.Generator().manual_seed(0)
    segs = get_rope_facts(family).segments(head_dim)
    cos, sin = rope_table_3d(family, grid, head_dim)
    x = torch.randn(2, 3, cos.shape[0], head_dim, generator=gen, dtype=torch.float64) * 3
    for rot in _rotations(head_dim, segs, gen):
        table = fuse_rope_and_rotation(cos, sin, rot)
        assert table.coef.shape == (cos.shape[0], head_dim, 4) and table.index.shape == (head_dim, 4)
        assert table.hadamard == (rot.kind == "full")
        ref = rot.apply(apply_rope_interleaved(x, cos, sin))
        assert (apply_generalized_rope(x, table) - ref).abs().max() < 1e-13, (rot.kind, rot.pairing if hasattr(rot, "pairing") else "")


def test_sources_are_own_pair_and_partner_pair():
    cos, sin = rope_table_3d("wan", (2, 2, 2), 128)
    half = fuse_rope_and_rotation(cos, sin, make_rotation("half", 128, (44, 42, 42)))
    # channel 44 (first of segment h, half size 21) is paired with 65, whose RoPE pair is (64, 65).
    assert half.index[44].tolist() == [44, 45, 64, 65]
    assert half.index[65].tolist() == [64, 65, 44, 45]
    inter = fuse_rope_and_rotation(cos, sin, make_rotation("interleaved", 128))
    assert inter.index[7].tolist() == [6, 7, 6, 7]
    assert torch.count_nonzero(inter.coef[..., 2:]) == 0  # a plain 2x2-block table


def test_per_head_learned_table():
    gen = torch.Generator().manual_seed(1)
    cos, sin = rope_table_3d("cogvideox", (2, 3, 4), 64)
    angles = torch.rand(3, 32, generator=gen, dtype=torch.float64) * 6
    reflect = (torch.rand(3, 32, generator=gen) > 0.5).to(torch.int8)
    rot = PairRotation.learned(angles, reflect, pairing="half", head_dim=64, segments=(16, 24, 24))
    table = fuse_rope_and_rotation(cos, sin, rot)
    assert table.coef.shape == (3, 24, 64, 4)
    x = torch.randn(2, 3, 24, 64, generator=gen, dtype=torch.float64)
    ref = rot.apply(apply_rope_interleaved(x, cos, sin))
    assert (apply_generalized_rope(x, table) - ref).abs().max() < 1e-13


def test_accepts_wan_module_tables_and_float32():
    gen = torch.Generator().manual_seed(2)
    cos, sin = WanRotaryPosEmbed(128, (1, 2, 2), 64)(torch.randn(1, 2, 3, 8, 6))  # [1, N, 1, D] float32
    rot = make_rotation("half", 128, (44, 42, 42))
    table = fuse_rope_and_rotation(cos, sin, rot)
    x = torch.randn(1, 2, 36, 128, generator=gen)
    ref = rot.apply(apply_rope_interleaved(x.double(), cos.double(), sin.double()))
    out = apply_generalized_rope(x, table)
    assert out.dtype == torch.float32
    assert (out.double() - ref).abs().max() < 1e-5
    out_bf16 = apply_generalized_rope(x.bfloat16(), table.to(dtype=torch.float32))
    assert out_bf16.dtype == torch.bfloat16 and (out_bf16.double() - ref).abs().max() < 0.05 * ref.abs().max()


def test_bad_input():
    cos, sin = rope_table_3d("wan", (2, 2, 2), 128)
    with pytest.raises(ValueError, match="head_dim"):
        fuse_rope_and_rotation(cos, sin, make_rotation("half", 64))
    table = fuse_rope_and_rotation(cos, sin, make_rotation("none", 128))
    with pytest.raises(ValueError, match="x must be"):
        apply_generalized_rope(torch.randn(1, 9, 128), table)
    with pytest.raises(ValueError, match="index"):
        GeneralizedRopeTable(coef=torch.zeros(8, 128, 4), index=torch.zeros(128, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="hadamard: .*power-of-two head_dim, got 96"):
        GeneralizedRopeTable(coef=torch.zeros(8, 96, 4), index=torch.zeros(96, 4, dtype=torch.long), hadamard=True)


def test_full_table_is_rope_table_then_fwht_bit_for_bit():
    """The full rotation's table: RoPE's own table (no pair rotation), flagged; applying it is the table op rounded to
    x's dtype, then fwht -- the bits the CUDA kernels reproduce."""
    gen = torch.Generator().manual_seed(3)
    cos, sin = rope_table_3d("wan", (2, 3, 4), 128)
    full = fuse_rope_and_rotation(cos, sin, make_rotation("full", 128)).to(dtype=torch.float32)
    rope_only = fuse_rope_and_rotation(cos, sin, make_rotation("none", 128)).to(dtype=torch.float32)
    assert full.hadamard and not rope_only.hadamard and full.to(dtype=torch.float64).hadamard
    assert torch.equal(full.coef, rope_only.coef) and torch.equal(full.index, rope_only.index)
    x = torch.randn(1, 2, 24, 128, generator=gen).bfloat16()
    out = apply_generalized_rope(x, full)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, fwht(apply_generalized_rope(x, rope_only)))


@pytest.mark.parametrize("family, head_dim", [("wan", 128), ("cogvideox", 64)])
def test_rope_only_table_closed_form_equals_the_general_construction(family, head_dim):
    """none / full build RoPE's table by selects (no computed-index gather inside a compiled graph); bit for bit the
    general construction's table for an identity pair rotation (learned, angle 0, interleaved pairing)."""
    cos, sin = rope_table_3d(family, (3, 5, 4), head_dim)
    zeros = torch.zeros(head_dim // 2, dtype=torch.float64)
    identity = PairRotation.learned(zeros, zeros.to(torch.int8), pairing="interleaved", head_dim=head_dim)
    general = fuse_rope_and_rotation(cos, sin, identity)
    for kind in ("none", "full"):
        closed = fuse_rope_and_rotation(cos, sin, make_rotation(kind, head_dim))
        assert torch.equal(closed.index, general.index)
        assert torch.equal(closed.coef.view(torch.int64), general.coef.view(torch.int64)), kind


def test_integer_inputs_are_refused_not_truncated():
    from rotvid.rope.fused_table import apply_generalized_rope, fuse_rope_and_rotation
    from rotvid.rope.rotations import make_rotation
    from rotvid.rope.tables import apply_rope_interleaved, rope_table_3d

    cos, sin = rope_table_3d("wan", (1, 2, 2), 128)
    rot = make_rotation("half", 128, (44, 42, 42))
    x = torch.ones(1, 2, cos.shape[0], 128, dtype=torch.int32)
    with pytest.raises(ValueError, match="x: expected a floating-point tensor, got torch.int32"):
        apply_rope_interleaved(x, cos, sin)
    with pytest.raises(ValueError, match="x: expected a floating-point tensor"):
        apply_generalized_rope(x, fuse_rope_and_rotation(cos, sin, rot))
    with pytest.raises(ValueError, match="x: expected a floating-point tensor"):
        rot.apply(x)
