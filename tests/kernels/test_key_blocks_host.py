"""The block-sparse key walk (csrc/key_blocks.cuh, MapKeyBlocks) on the host, against a brute-force rule: compiled
with the host C++ compiler (the device qualifiers and __ldg shimmed), over random map rows, kv_lens, key counts,
kernel blocks of 64 and 128 and 1-4 splits.

What must hold: the splits together visit, in ascending order and once each, exactly the kernel blocks of the row's
kept map blocks that hold a key before kv_len; ``partial_at`` marks exactly the block that also holds keys at or past
kv_len (KeyBlocks::partial) and nothing else; a density-1 row walks what KeyBlocks::dense walks, split for split.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[2] / "rotvid" / "kernels" / "csrc"

PROGRAM = r"""
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#define __device__
#define __forceinline__ inline
#define __ldg(p) (*(p))
using std::max;
#include "key_blocks.cuh"
using namespace rotvid;

template <int BN> int check(unsigned seed, int iterations) {
  constexpr int SUB = 128 / BN;
  srand(seed);
  int bad = 0;
  for (int it = 0; it < iterations; ++it) {
    const int n_kv = 1 + rand() % 2000, tk = (n_kv + 127) / 128;
    const int kv_len = rand() % 3 == 0 ? n_kv : rand() % (n_kv + 1);
    const bool full = rand() % 5 == 0;
    std::vector<int> list;
    for (int j = 0; j < tk; ++j) if (full || rand() % 3 == 0) list.push_back(j);
    const int kept = (int)list.size();
    while ((int)list.size() < tk) list.push_back(kept ? list[kept - 1] : 0);  // padding slots
    std::vector<int> want;
    int want_partial = -1;
    for (int e = 0; e < kept; ++e)
      for (int s = 0; s < SUB; ++s) {
        const int blk = SUB * list[e] + s;
        if (blk * BN < kv_len) {
          want.push_back(blk);
          if ((blk + 1) * BN > kv_len) want_partial = blk;
        }
      }
    for (int splits = 1; splits <= 4; ++splits) {
      std::vector<int> got;
      int got_partial = -1, marks = 0;
      for (int part = splits == 1 ? -1 : 0; part < (splits == 1 ? 0 : splits); ++part) {
        const auto kb = MapKeyBlocks<BN>::of_row(list.data(), kept, kv_len, n_kv, part, splits);
        for (int i = 0; i < kb.count; ++i) {
          got.push_back(kb.block(i));
          if (kb.partial_at(i)) { got_partial = kb.block(i); ++marks; }
        }
        if (full) {  // density 1: the dense walk, split for split
          const KeyBlocks d = KeyBlocks::dense(kv_len, BN, part, splits);
          if (d.first != kb.first || d.count != kb.count) ++bad;
        }
      }
      if (got != want || got_partial != want_partial || marks > 1) {
        if (bad < 5) printf("BN %d n_kv %d kv_len %d kept %d splits %d: %zu blocks, want %zu; partial %d, want %d\n",
                            BN, n_kv, kv_len, kept, splits, got.size(), want.size(), got_partial, want_partial);
        ++bad;
      }
    }
  }
  return bad;
}

int main() {
  const int bad = check<128>(1, 20000) + check<64>(2, 20000);
  printf("bad %d\n", bad);
  return bad != 0;
}
"""


def test_map_walk_visits_exactly_the_kept_blocks_before_kv_len(tmp_path):
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler (g++ / clang++) on PATH")
    src, exe = tmp_path / "walk.cpp", tmp_path / "walk"
    src.write_text(PROGRAM)
    build = subprocess.run([cxx, "-std=c++17", "-O2", f"-I{CSRC}", str(src), "-o", str(exe)], capture_output=True,
                           text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip().endswith("bad 0"), run.stdout + run.stderr
