"""3D RoPE tables against diffusers' own modules (bit-exact), and the facts table."""

import subprocess
import sys

import pytest
import torch
from diffusers.models.embeddings import apply_rotary_emb, get_3d_rotary_pos_embed
from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoRotaryPosEmbed
from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15RotaryPosEmbed
from diffusers.models.transformers.transformer_skyreels_v2 import SkyReelsV2RotaryPosEmbed
from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed
from diffusers.pipelines.cogvideo.pipeline_cogvideox import get_resize_crop_region_for_grid

from rotvid.rope.model_facts import ROPE_FACTS, get_rope_facts
from rotvid.rope.tables import apply_rope_interleaved, as_token_table, rope_table_3d


def test_facts_table_released_splits():
    assert get_rope_facts("wan").segments(128) == (44, 42, 42)
    assert get_rope_facts("hunyuan_video").segments(128) == (16, 56, 56)
    assert get_rope_facts("cogvideox").segments(64) == (16, 24, 24)
    assert get_rope_facts("hunyuan_video15").segments(128) == (16, 56, 56)
    assert get_rope_facts("skyreels_v2").segments(128) == (44, 42, 42)
    assert get_rope_facts("hunyuan_video").theta == 256.0
    assert all(f.pair_layout == "interleaved" for f in ROPE_FACTS.values())


def test_the_rope_side_knows_the_families_that_registered():
    """rotvid.rope imports nothing of rotvid.pipelines: alone it knows no family, and says where they come from."""
    code = """import sys
from rotvid.rope.model_facts import get_rope_facts, rope_facts
from rotvid.rope.tables import rope_table_3d
assert rope_facts() == {} and "rotvid.pipelines" not in sys.modules
try:
    get_rope_facts("wan")
except ValueError as e:
    print(e)
import rotvid.pipelines.families
print(list(rope_facts()), tuple(rope_table_3d("wan", (1, 2, 3), 128)[0].shape))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "family must be one of [], got 'wan' (the model families register theirs: import " \
                     "rotvid.pipelines.families)"
    assert out[1] == str(list(ROPE_FACTS)) + " (6, 128)"


def test_facts_bad_input():
    with pytest.raises(ValueError, match="family"):
        get_rope_facts("flux")
    with pytest.raises(ValueError, match="head_dim"):
        get_rope_facts("wan").segments(127)
    for theta in (0, -1.0, float("inf")):  # (a NaN table otherwise)
        with pytest.raises(ValueError, match="theta: expected a positive, finite RoPE base"):
            rope_table_3d("wan", (2, 2, 2), 128, theta=theta)


@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("grid", [(5, 7, 9), (1, 3, 2), (21, 30, 52)])
def test_wan_matches_diffusers_module(head_dim, grid):
    f, h, w = grid
    module = WanRotaryPosEmbed(head_dim, (1, 2, 2), max_seq_len=1024)
    cos_ref, sin_ref = module(torch.randn(1, 2, f, 2 * h, 2 * w))  # [1, N, 1, D] float32
    cos, sin = rope_table_3d("wan", grid, head_dim)
    assert cos.dtype == torch.float64 and cos.shape == (f * h * w, head_dim)
    assert torch.equal(cos, cos_ref.reshape(-1, head_dim).double())
    assert torch.equal(sin, sin_ref.reshape(-1, head_dim).double())


@pytest.mark.parametrize("grid", [(5, 7, 9), (2, 1, 4), (33, 30, 53)])
def test_hunyuan_matches_diffusers_module(grid):
    f, h, w = grid
    module = HunyuanVideoRotaryPosEmbed(patch_size=2, patch_size_t=1, rope_dim=[16, 56, 56], theta=256.0)
    cos_ref, sin_ref = module(torch.randn(1, 2, f, 2 * h, 2 * w))
    cos, sin = rope_table_3d("hunyuan_video", grid, 128)
    assert torch.equal(cos, cos_ref.double()) and torch.equal(sin, sin_ref.double())


@pytest.mark.parametrize("grid", [(5, 7, 9), (2, 1, 4), (31, 30, 53)])
def test_hunyuan15_matches_diffusers_module(grid):
    f, h, w = grid
    module = HunyuanVideo15RotaryPosEmbed(patch_size=1, patch_size_t=1, rope_dim=[16, 56, 56], theta=256.0)
    cos_ref, sin_ref = module(torch.randn(1, 2, f, h, w))
    cos, sin = rope_table_3d("hunyuan_video15", grid, 128)
    assert torch.equal(cos, cos_ref.double()) and torch.equal(sin, sin_ref.double())


@pytest.mark.parametrize("head_dim", [128, 64])
@pytest.mark.parametrize("grid", [(5, 7, 9), (25, 34, 60)])
def test_skyreels_v2_matches_diffusers_module(head_dim, grid):
    f, h, w = grid
    module = SkyReelsV2RotaryPosEmbed(head_dim, (1, 2, 2), max_seq_len=1024)
    cos_ref, sin_ref = module(torch.randn(1, 2, f, 2 * h, 2 * w))  # [1, N, 1, D] float32
    cos, sin = rope_table_3d("skyreels_v2", grid, head_dim)
    assert torch.equal(cos, cos_ref.reshape(-1, head_dim).double())
    assert torch.equal(sin, sin_ref.reshape(-1, head_dim).double())


def test_hunyuan_explicit_rope_axes_dim():
    module = HunyuanVideoRotaryPosEmbed(patch_size=1, patch_size_t=1, rope_dim=[8, 12, 12], theta=256.0)
    cos_ref, sin_ref = module(torch.randn(1, 2, 3, 4, 5))
    cos, sin = rope_table_3d("hunyuan_video", (3, 4, 5), 32, segments=(8, 12, 12))
    assert torch.equal(cos, cos_ref.double()) and torch.equal(sin, sin_ref.double())


@pytest.mark.parametrize("grid", [(13, 30, 45), (7, 20, 36), (3, 9, 5)])
def test_cogvideox_linspace_matches_diffusers(grid):
    f, h, w = grid
    crops = get_resize_crop_region_for_grid((h, w), 45, 30)  # CogVideoX-5B base 720x480 / 8 / 2
    cos_ref, sin_ref = get_3d_rotary_pos_embed(64, crops, (h, w), f)
    cos, sin = rope_table_3d("cogvideox", grid, 64, crops_coords=crops)
    assert torch.equal(cos, cos_ref.double()) and torch.equal(sin, sin_ref.double())


def test_cogvideox_slice_matches_diffusers():
    cos_ref, sin_ref = get_3d_rotary_pos_embed(64, None, (20, 30), 11, grid_type="slice", max_size=(48, 85))
    cos, sin = rope_table_3d("cogvideox", (11, 20, 30), 64, grid_type="slice")
    assert torch.equal(cos, cos_ref.double()) and torch.equal(sin, sin_ref.double())


@pytest.mark.parametrize("family,head_dim", [("wan", 128), ("hunyuan_video", 128), ("cogvideox", 64)])
def test_float64_precision_close_to_diffusers_and_unit_norm(family, head_dim):
    cos32, sin32 = rope_table_3d(family, (4, 6, 5), head_dim)
    cos64, sin64 = rope_table_3d(family, (4, 6, 5), head_dim, precision="float64")
    assert (cos64 - cos32).abs().max() < 1e-5 and (sin64 - sin32).abs().max() < 1e-5
    assert not torch.equal(cos64, cos32)
    assert (cos64**2 + sin64**2 - 1).abs().max() < 1e-14


def test_token_order_frame_major():
    # Token (f, h, w) = (1, 2, 3) on grid (2, 4, 5): n = (1*4 + 2)*5 + 3 = 33.
    cos, _ = rope_table_3d("wan", (2, 4, 5), 128, precision="float64")
    t, hh, _ = get_rope_facts("wan").segments(128)
    # pair 0 of each segment has frequency 1: its angle is the raw position.
    assert cos[33, 0].item() == pytest.approx(torch.cos(torch.tensor(1.0, dtype=torch.float64)).item(), abs=1e-15)
    assert cos[33, t].item() == pytest.approx(torch.cos(torch.tensor(2.0, dtype=torch.float64)).item(), abs=1e-15)
    assert cos[33, t + hh].item() == pytest.approx(torch.cos(torch.tensor(3.0, dtype=torch.float64)).item(), abs=1e-15)


def test_table_bad_input():
    with pytest.raises(ValueError, match="grid"):
        rope_table_3d("wan", (4, 0, 5), 128)
    with pytest.raises(ValueError, match="segments"):
        rope_table_3d("wan", (4, 3, 5), 128, segments=(40, 40, 40))
    with pytest.raises(ValueError, match="precision"):
        rope_table_3d("wan", (4, 3, 5), 128, precision="half")
    with pytest.raises(ValueError, match="crops_coords"):
        rope_table_3d("wan", (4, 3, 5), 128, crops_coords=((0, 0), (3, 5)))


def test_apply_rope_matches_diffusers_bitwise():
    cos, sin = get_3d_rotary_pos_embed(64, ((0, 0), (6, 7)), (6, 7), 3)
    x = torch.randn(2, 3, 126, 64)
    assert torch.equal(apply_rotary_emb(x, (cos, sin)), apply_rope_interleaved(x, cos.double(), sin.double()))


def test_as_token_table_shapes():
    t = torch.randn(1, 10, 1, 8)
    assert as_token_table(t).shape == (10, 8)
    with pytest.raises(ValueError, match="token axis"):
        as_token_table(torch.randn(2, 10, 8))
