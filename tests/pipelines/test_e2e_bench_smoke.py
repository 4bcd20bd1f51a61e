"""benchmarks/e2e_bench.py --tiny runs on the CPU and prints a complete table."""

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "e2e_bench.py"


def test_e2e_bench_tiny_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("e2e_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["e2e_bench"] = mod  # dataclasses look their module up there
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.modules.pop("e2e_bench", None)
    out = tmp_path / "results.md"
    md = mod.main(["--tiny", "--steps", "6", "--warmup", "0", "--iters", "1", "--append", str(out)])
    assert out.read_text().strip() == md.strip()
    assert "| rotvid mixed step |" in md and "int4 on 2/6 blocks" in md  # paper schedule: blocks 2, 3
    # paper-wan2.2-t2v over 6 steps x 6 blocks: steps 2, 3 and blocks 2, 3 run INT4 -> 4/36.
    assert "6-step estimate" in md and "INT4 fraction of self-attention calls 11.1%" in md
    assert "(2 FP16 + 4 mixed steps)" not in md and "(4 FP16 + 2 mixed steps)" in md
