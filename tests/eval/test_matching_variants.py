import numpy as np
import pytest

from rotvid.eval.matching import match_videos
from rotvid.eval.variants import VariantSpec, parse_variant, parse_variants
from rotvid.eval.video_io import write_video


@pytest.fixture()
def clip():
    return np.random.default_rng(0).integers(0, 256, (2, 16, 16, 3), dtype=np.uint8)


def test_folder_matching_by_name(tmp_path, clip):
    for folder in ("ref", "a", "b"):
        for name in ("x.mp4", "y.mp4"):
            write_video(tmp_path / folder / name, clip, 8)
    sets = match_videos(tmp_path / "ref", [tmp_path / "a", tmp_path / "b"])
    assert [s.variant for s in sets] == ["a", "b"]
    assert [(p.name, p.reference.parent.name, p.candidate.parent.name) for p in sets[1].pairs] == [
        ("x", "ref", "b"), ("y", "ref", "b")]


def test_file_against_files(tmp_path, clip):
    for name in ("ref.mp4", "c1.mp4", "c2.mp4"):
        write_video(tmp_path / name, clip, 8)
    sets = match_videos(tmp_path / "ref.mp4", [tmp_path / "c1.mp4", tmp_path / "c2.mp4"])
    assert [s.variant for s in sets] == ["c1", "c2"]
    assert sets[0].pairs[0].reference.name == "ref.mp4"


def test_matching_errors(tmp_path, clip):
    write_video(tmp_path / "ref" / "x.mp4", clip, 8)
    write_video(tmp_path / "ref" / "y.mp4", clip, 8)
    write_video(tmp_path / "short" / "x.mp4", clip, 8)
    write_video(tmp_path / "more" / "x.mp4", clip, 8)
    write_video(tmp_path / "more" / "y.mp4", clip, 8)
    write_video(tmp_path / "more" / "z.mp4", clip, 8)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="lacks 1 of the reference's videos: y.mp4"):
        match_videos(tmp_path / "ref", [tmp_path / "short"])
    with pytest.raises(ValueError, match="has 1 videos the reference lacks: z.mp4"):
        match_videos(tmp_path / "ref", [tmp_path / "more"])
    with pytest.raises(FileNotFoundError, match="CANDIDATE .*nope does not exist"):
        match_videos(tmp_path / "ref", [tmp_path / "nope"])
    with pytest.raises(ValueError, match="holds no .mp4 videos"):
        match_videos(tmp_path / "empty", [tmp_path / "ref"])
    with pytest.raises(ValueError, match="each candidate must be a folder"):
        match_videos(tmp_path / "ref", [tmp_path / "ref" / "x.mp4"])
    with pytest.raises(ValueError, match="each candidate must be a video file"):
        match_videos(tmp_path / "ref" / "x.mp4", [tmp_path / "ref"])
    with pytest.raises(ValueError, match="at least one candidate"):
        match_videos(tmp_path / "ref", [])


def test_variant_specs():
    assert parse_variant("int4:half") == VariantSpec("int4", "half")
    assert parse_variant("int4-sym-p") == VariantSpec("int4-sym-p", "none")
    assert parse_variant("int4:half").table_columns() == ("INT4", "✓", "Half")
    assert parse_variant("int4-sym-p:none").table_columns() == ("INT4", "×", "W/O")
    assert parse_variant("int4:interleaved").table_columns()[2] == "Interleave"
    learned = parse_variant("int4:learned:/x/rot wan.safetensors")
    assert learned.label == "int4_learned-rot-wan" and learned.table_columns()[2] == "Trained"
    assert [s.label for s in parse_variants("int4:half, int4:none,int8-fp8:full")] == [
        "int4_half", "int4_none", "int8-fp8_full"]


@pytest.mark.parametrize(
    "text, match",
    [
        ("int3:half", "unknown recipe 'int3'"),
        ("int4:quarter", "unknown rotation 'quarter'"),
        ("int4:learned:", "unknown rotation"),
        ("int4:half,int4:half", "listed more than once: int4_half"),
        (" , ", "at least one"),
    ],
)
def test_bad_variants(text, match):
    with pytest.raises(ValueError, match=match):
        parse_variants(text)


def test_int8_fp8_variants_and_their_table_columns():
    spec = parse_variant("int8-fp8:half")
    assert spec == VariantSpec("int8-fp8", "half") and spec.label == "int8-fp8_half"
    assert spec.table_columns() == ("INT8/FP8", "–", "Half")
    assert parse_variant("int8-fp8").rotation == "none"


def test_auto_variants_resolve_to_the_devices_recipe(monkeypatch):
    import torch

    from rotvid.eval.variants import resolve_auto_variants
    from rotvid.kernels.recipes import auto as recipe_table

    specs = parse_variants("auto:half,int4:none")
    assert specs[0] == VariantSpec("auto", "half")
    cpu, notes = resolve_auto_variants(specs, torch.device("cpu"))
    assert [s.spec for s in cpu] == ["int4:half", "int4:none"] and "auto:half runs as int4:half" in notes[0]
    monkeypatch.setattr(recipe_table, "_device_capability", lambda device: (9, 0) if device.type == "cuda" else None)
    hopper, notes = resolve_auto_variants(specs, torch.device("cuda", 0))
    assert [s.label for s in hopper] == ["int8-fp8_half", "int4_none"] and "sm90" in notes[0]
    # auto:half is int4:half on the CPU: listing both is a duplicate
    with pytest.raises(ValueError, match="listed more than once: int4_half"):
        resolve_auto_variants(parse_variants("auto:half,int4:half"), torch.device("cpu"))
