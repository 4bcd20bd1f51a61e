"""Incoherence Ψ, the synthetic RoPE-structured generator, and Q/K/V dumps."""

import pytest
import torch

from rotvid.rope.dumps import load_qkv_dump, save_qkv_dump
from rotvid.rope.incoherence import incoherence, incoherence_summary, profile_correlation
from rotvid.rope.rotations import make_rotation
from rotvid.rope.synthetic import synthetic_rope_qkv


def test_incoherence_matches_definition():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 11, 8, generator=gen)
    psi = incoherence(x)
    assert psi.shape == (2, 3, 8) and psi.dtype == torch.float64
    b, h, c = 1, 2, 5
    col = x[b, h, :, c].double()
    assert psi[b, h, c] == (col - col.mean()).abs().max()
    shifted = x + torch.randn(1, 1, 1, 8, generator=gen) * 100  # a per-channel constant
    assert torch.allclose(incoherence(shifted), psi, atol=1e-4)


def test_summary_per_segment():
    psi = torch.cat([torch.full((4,), 4.0), torch.full((4,), 1.0), torch.full((6,), 2.0)])
    s = incoherence_summary(psi, (8, 6))
    assert set(s) == {"t", "h", "all"}
    assert s["t"]["first_half_mean"] == 4.0 and s["t"]["second_half_mean"] == 1.0
    assert s["t"]["half_ratio"] == 4.0 and s["t"]["peak_to_mean"] == pytest.approx(4.0 / 2.5)
    assert s["h"]["half_ratio"] == 1.0 and s["h"]["max"] == 2.0
    assert s["all"]["max"] == 4.0
    with pytest.raises(ValueError, match="segments"):
        incoherence_summary(psi, (8, 4))


def test_profile_correlation():
    a = torch.rand(16, dtype=torch.float64) + 0.1
    assert profile_correlation(a, 3 * a) == pytest.approx(1.0)
    assert profile_correlation(a, -a) == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="constant"):
        profile_correlation(a, torch.ones(16))


def test_synthetic_shapes_and_determinism():
    a = synthetic_rope_qkv("wan", (2, 3, 4), heads=3, head_dim=64, batch=2, seed=5)
    b = synthetic_rope_qkv("wan", (2, 3, 4), heads=3, head_dim=64, batch=2, seed=5)
    c = synthetic_rope_qkv("wan", (2, 3, 4), heads=3, head_dim=64, batch=2, seed=6)
    assert a.q.shape == a.k.shape == a.v.shape == (2, 3, 24, 64) and a.q.dtype == torch.float32
    assert torch.equal(a.q, b.q) and torch.equal(a.v, b.v) and not torch.equal(a.q, c.q)
    assert a.segments == (24, 20, 20)
    with pytest.raises(ValueError, match="qk_correlation"):
        synthetic_rope_qkv("wan", (2, 3, 4), qk_correlation=1.5)


@pytest.mark.parametrize("family,head_dim", [("wan", 128), ("hunyuan_video", 128), ("cogvideox", 64)])
def test_synthetic_has_rope_segment_structure(family, head_dim):
    s = synthetic_rope_qkv(family, (5, 10, 14), heads=8, head_dim=head_dim, seed=0)
    psi_q, psi_k = incoherence(s.q), incoherence(s.k)
    # Q and K share their outlier profile (cross-matrix symmetry).
    assert profile_correlation(psi_q.mean(1), psi_k.mean(1)) > 0.6
    summary = incoherence_summary(psi_q, s.segments)
    # in every RoPE segment the high-frequency half (first half, interleaved layout) holds more
    # incoherence: biases rotated by fast-turning pairs survive mean smoothing.
    for seg in ("t", "h", "w"):
        assert summary[seg]["first_half_mean"] > 1.1 * summary[seg]["second_half_mean"], (seg, summary[seg])
    # the half rotation mixes the two halves of each segment: the peak-to-mean ratio drops.
    rotated = incoherence_summary(incoherence(make_rotation("half", head_dim, s.segments).apply(s.q)), s.segments)
    assert rotated["all"]["peak_to_mean"] < summary["all"]["peak_to_mean"]


@pytest.mark.parametrize("layout", ["BHND", "BNHD"])
def test_dump_round_trip(tmp_path, layout):
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 2 * 3 * 4 + 5, 32, generator=gen).to(torch.bfloat16) for _ in range(3))
    if layout == "BNHD":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    path = tmp_path / "d.safetensors"
    save_qkv_dump(path, q, k, v, model="tiny/hunyuan", family="hunyuan_video", block=3, step=7, grid=(2, 3, 4),
                  layout=layout, text_tokens=5, text_position="last", kv_len=27, extra_metadata={"prompt_id": "12"})
    d = load_qkv_dump(path)
    assert torch.equal(d.q, q) and torch.equal(d.k, k) and torch.equal(d.v, v) and d.q.dtype == torch.bfloat16
    assert (d.model, d.family, d.block, d.step, d.grid, d.layout) == ("tiny/hunyuan", "hunyuan_video", 3, 7, (2, 3, 4), layout)
    assert (d.text_tokens, d.text_position, d.kv_len, d.extra) == (5, "last", 27, {"prompt_id": "12"})
    qb, _, _ = d.bhnd()
    assert qb.shape == (1, 2, 29, 32) and d.video_slice() == slice(0, 24)


def test_dump_bad_input(tmp_path):
    q = torch.randn(1, 2, 24, 32)
    with pytest.raises(ValueError, match="N="):
        save_qkv_dump(tmp_path / "x.safetensors", q, q, q, model="m", family="wan", block=0, step=0, grid=(2, 3, 5))
    with pytest.raises(ValueError, match="kv_len"):
        save_qkv_dump(tmp_path / "x.safetensors", q, q, q, model="m", family="wan", block=0, step=0, grid=(2, 3, 4),
                      kv_len=0)
    with pytest.raises(ValueError, match="family"):
        save_qkv_dump(tmp_path / "x.safetensors", q, q, q, model="m", family="sd3", block=0, step=0, grid=(2, 3, 4))
    with pytest.raises(ValueError, match="reserved"):
        save_qkv_dump(tmp_path / "x.safetensors", q, q, q, model="m", family="wan", block=0, step=0, grid=(2, 3, 4),
                      extra_metadata={"step": "1"})
    from safetensors.torch import save_file
    save_file({"q": q}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="format"):
        load_qkv_dump(tmp_path / "other.safetensors")
