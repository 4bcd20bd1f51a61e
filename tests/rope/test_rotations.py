"""Rotations: orthogonality, exactness of scores and attention in float64, JSON round trip,
learned files."""

import json
import math

import pytest
import torch

from rotvid.rope.rotations import (
    FullHadamardRotation,
    NoRotation,
    PairRotation,
    Rotation,
    half_rotation_pairs,
    load_learned_rotation,
    make_rotation,
    pair_blocks,
    save_learned_rotation,
)
from rotvid.rope.tables import apply_rope_interleaved, rope_table_3d

WAN = (44, 42, 42)
KINDS = ["none", "interleaved", "half", "full"]


def _learned(gen, lead=(), pairing="half", head_dim=128, segments=WAN):
    angles = torch.rand(*lead, head_dim // 2, generator=gen, dtype=torch.float64) * 2 * math.pi
    reflect = (torch.rand(*lead, head_dim // 2, generator=gen) > 0.5).to(torch.int8)
    return PairRotation.learned(angles, reflect, pairing=pairing, head_dim=head_dim, segments=segments)


def _all_rotations(gen):
    rots = [make_rotation(k, 128, WAN) for k in KINDS]
    rots.append(_learned(gen, pairing="half"))
    rots.append(_learned(gen, pairing="interleaved"))
    return rots


def test_half_pairs_odd_half_sizes():
    pairs = half_rotation_pairs(WAN)
    assert pairs.shape == (64, 2)
    assert pairs[0].tolist() == [0, 22] and pairs[21].tolist() == [21, 43]
    assert pairs[22].tolist() == [44, 65] and pairs[42].tolist() == [64, 85]
    assert pairs[43].tolist() == [86, 107] and pairs[63].tolist() == [106, 127]
    assert sorted(pairs.flatten().tolist()) == list(range(128))


def test_default_blocks_are_h2():
    r = make_rotation("interleaved", 8, None).matrix()
    s = math.sqrt(0.5)
    assert torch.equal(r[:2, :2], torch.tensor([[s, s], [s, -s]], dtype=torch.float64))
    assert torch.allclose(pair_blocks(torch.tensor([math.pi / 4]), torch.tensor([1]))[0], r[:2, :2], atol=1e-15)


def test_half_matrix_structure():
    r = make_rotation("half", 12, (4, 8)).matrix()
    s = math.sqrt(0.5)
    # segment 0 (size 4): pairs (0, 2), (1, 3); segment 1 (size 8): pairs (4, 8), (5, 9), ...
    assert r[0, 0] == s and r[0, 2] == s and r[2, 0] == s and r[2, 2] == -s
    assert r[4, 8] == s and r[8, 8] == -s and r[4, 5] == 0


def test_orthogonal_and_apply_equals_matmul():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 17, 128, generator=gen, dtype=torch.float64)
    eye = torch.eye(128, dtype=torch.float64)
    for rot in _all_rotations(gen):
        m = rot.matrix()
        assert (m @ m.T - eye).abs().max() < 1e-14, rot.kind
        assert (rot.apply(x) - x @ m).abs().max() < 1e-13, rot.kind
        assert rot.apply(x.float()).dtype == torch.float32


@pytest.mark.parametrize("family,head_dim,grid", [("wan", 128, (3, 4, 5)), ("hunyuan_video", 128, (2, 5, 3)),
                                                  ("cogvideox", 64, (3, 3, 4))])
def test_scores_and_attention_unchanged_float64(family, head_dim, grid):
    from rotvid.rope.model_facts import get_rope_facts
    from rotvid.rope.hadamard import hadamard_matrix

    gen = torch.Generator().manual_seed(1)
    segs = get_rope_facts(family).segments(head_dim)
    cos, sin = rope_table_3d(family, grid, head_dim)
    n = cos.shape[0]
    q = torch.randn(2, 3, n, head_dim, generator=gen, dtype=torch.float64) + 2.0
    k = torch.randn(2, 3, n, head_dim, generator=gen, dtype=torch.float64) - 1.0
    v = torch.randn(2, 3, n, head_dim, generator=gen, dtype=torch.float64)
    qr, kr = apply_rope_interleaved(q, cos, sin), apply_rope_interleaved(k, cos, sin)
    scores = qr @ kr.transpose(-1, -2)
    out = torch.softmax(scores / math.sqrt(head_dim), -1) @ v
    h = hadamard_matrix(head_dim)
    rots = [make_rotation(s, head_dim, segs) for s in KINDS]
    rots += [_learned(gen, pairing="half", head_dim=head_dim, segments=segs)]
    for rot in rots:
        s2 = rot.apply(qr) @ rot.apply(kr).transpose(-1, -2)
        assert (s2 - scores).abs().max() < 1e-12 * scores.abs().max(), rot.kind
        out2 = (torch.softmax(s2 / math.sqrt(head_dim), -1) @ (v @ h)) @ h.T
        assert (out2 - out).abs().max() < 1e-13, rot.kind


def test_json_round_trip(tmp_path):
    gen = torch.Generator().manual_seed(2)
    path = tmp_path / "rot.safetensors"
    angles = torch.rand(4, 2, 64, generator=gen) * 6
    reflect = (torch.rand(4, 2, 64, generator=gen) > 0.5).to(torch.int8)
    save_learned_rotation(path, angles, reflect, pairing="half", head_dim=128, segments=WAN)
    from_file = make_rotation(f"learned:{path}", 128, WAN)
    rots = _all_rotations(gen) + [from_file, from_file.select(2), from_file.select(2).select(1)]
    for rot in rots:
        d = json.loads(json.dumps(rot.to_json()))
        back = Rotation.from_json(d)
        assert type(back) is type(rot) and back.kind == rot.kind
        assert torch.equal(back.matrix(), rot.matrix()), d["kind"]
    assert "path" in from_file.select(2).to_json() and from_file.select(2).to_json()["select"] == [2]
    with pytest.raises(ValueError, match="kind"):
        Rotation.from_json({"kind": "diagonal"})
    with pytest.raises(ValueError, match="version"):
        Rotation.from_json({"kind": "none", "head_dim": 8, "version": 99})


def test_learned_file_round_trip_and_per_head_apply(tmp_path):
    gen = torch.Generator().manual_seed(3)
    path = tmp_path / "r.safetensors"
    angles = torch.rand(3, 2, 32, generator=gen) * 6
    reflect = (torch.rand(3, 2, 32, generator=gen) > 0.5).to(torch.int8)
    save_learned_rotation(path, angles, reflect, pairing="interleaved", head_dim=64)
    rot = load_learned_rotation(path, 64)
    assert rot.lead_shape == (3, 2) and rot.pairing == "interleaved"
    per_block = rot.select(1)  # per-head blocks [2, 32, 2, 2]
    x = torch.randn(5, 2, 9, 64, generator=gen, dtype=torch.float64)
    m = per_block.matrix()  # [2, 64, 64]
    assert (per_block.apply(x) - x @ m).abs().max() < 1e-13
    head1 = PairRotation.learned(angles[1, 1].double(), reflect[1, 1], pairing="interleaved", head_dim=64)
    assert (per_block.apply(x)[:, 1] - head1.apply(x[:, 1])).abs().max() < 1e-6  # file stores float32 angles
    with pytest.raises(ValueError, match="x must be"):
        per_block.apply(torch.randn(5, 3, 9, 64))
    with pytest.raises(ValueError, match="head_dim"):
        load_learned_rotation(path, 128)


def test_learned_file_segment_mismatch(tmp_path):
    path = tmp_path / "r.safetensors"
    save_learned_rotation(path, torch.rand(64), torch.zeros(64, dtype=torch.int8), pairing="half",
                          head_dim=128, segments=WAN)
    with pytest.raises(ValueError, match="segments"):
        make_rotation(f"learned:{path}", 128, (16, 56, 56))


def test_make_rotation_bad_input():
    with pytest.raises(ValueError, match="spec"):
        make_rotation("hadamard", 128)
    with pytest.raises(ValueError, match="power of two"):
        make_rotation("full", 96)
    with pytest.raises(ValueError, match="segments"):
        make_rotation("half", 128, (44, 42, 40))
    with pytest.raises(ValueError, match="head_dim"):
        make_rotation("none", 7)
    with pytest.raises(ValueError, match="path"):
        make_rotation("learned:/nonexistent/r.safetensors", 128)
    with pytest.raises(ValueError, match="reflect"):
        pair_blocks(torch.zeros(3), torch.tensor([0, 2, 1]))


def test_types():
    assert isinstance(make_rotation("none", 8), NoRotation)
    assert isinstance(make_rotation("full", 8), FullHadamardRotation)
    assert make_rotation("half", 8).segments == (8,)
