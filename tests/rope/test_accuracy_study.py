"""Smoke test of benchmarks.accuracy_study on a tiny configuration (synthetic + a dump)."""

import json
from pathlib import Path

import torch

from benchmarks import accuracy_study as study
from rotvid.rope.dumps import save_qkv_dump
from rotvid.rope.rotations import save_learned_rotation
from rotvid.rope.synthetic import synthetic_rope_qkv


def test_study_tiny_synthetic_and_dump(tmp_path):
    s = synthetic_rope_qkv("hunyuan_video", (2, 3, 4), heads=2, head_dim=128, seed=3)
    text = torch.randn(1, 2, 5, 128)
    dump = tmp_path / "d.safetensors"
    save_qkv_dump(dump, torch.cat([s.q, text], 2), torch.cat([s.k, text], 2), torch.cat([s.v, text], 2),
                  model="tiny", family="hunyuan_video", block=1, step=0, grid=(2, 3, 4), text_tokens=5,
                  text_position="last", kv_len=27)
    learned = tmp_path / "r.safetensors"
    save_learned_rotation(learned, torch.rand(3, 64) * 6, torch.ones(3, 64, dtype=torch.int8), pairing="half",
                          head_dim=128, segments=(16, 56, 56))
    result = study.main([
        "--families", "wan", "--grids", "2x3x4", "--seeds", "1", "--heads", "1", "--recipes", "int4,int4-sym-p",
        "--rotations", "none,half,full", "--dump", str(dump), "--out-dir", str(tmp_path / "out"),
    ])  # fmt: skip
    rows = result["rows"]
    assert {r["source"] for r in rows} == {"synthetic:wan", "dump:d.safetensors"}
    assert len(rows) == 2 * 3 * 2
    assert all(0.5 < r["cosine"] <= 1.0 and r["sqnr_db"] > 5 for r in rows)
    # unquantized attention of every rotation is exact up to float32 rounding.
    assert min(r["sqnr_db"] for r in result["exact_rows"]) > 100
    assert "| synthetic:wan | int4 | range | half |" in result["text"]
    written = Path(result["written"])
    assert written.with_suffix(".md").read_text().startswith("# Accuracy study")
    assert len(json.loads(written.with_suffix(".json").read_text())["rows"]) == len(rows)
    # a per-block learned rotation file applies to dumps (which carry the block index).
    result = study.main(["--families", "", "--dump", str(dump), "--rotations", f"learned:{learned}",
                         "--recipes", "int4", "--no-write", "--no-v-table"])  # fmt: skip
    assert len(result["rows"]) == 1 and result["rows"][0]["rotation"].startswith("learned:")
