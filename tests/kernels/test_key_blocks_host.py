"""The block-sparse key walk (csrc/common/key_blocks.cuh, MapKeyBlocks) on the host, against a brute-force rule:
compiled with the host C++ compiler (the device qualifiers and __ldg shimmed), over random map rows, kv_lens, key
counts, kernel blocks of 64 and 128 and 1-4 splits.

What must hold: for a valid row, the splits together visit, in ascending order and once each, exactly the kernel
blocks of the row's kept map blocks that hold a key before kv_len, every position of a split's share is valid (the
shares, and so the output bits, of the walk that trusted the map); ``partial`` marks exactly the block that also
holds keys at or past kv_len (KeyBlocks::partial) and nothing else; a density-1 row walks what KeyBlocks::dense
walks, split for split. For a malformed row (any order, duplicates, entries outside [0, Tk), counts outside [0,
Kmax]) the walk is BlockMap.visit_counts' rule: the first clamp(count, 0, Kmax) entries, those outside [0, Tk) and
the kernel blocks wholly past kv_len skipped wherever they sit, a duplicate visited twice -- never a read past the
row.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[2] / "rotvid" / "kernels" / "csrc"

PROGRAM = r"""
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <vector>
#define __device__
#define __forceinline__ inline
#define __ldg(p) (*(p))
using std::max;
using std::min;
#include "common/key_blocks.cuh"
using namespace rotvid;

// One row through every split: the blocks visited in walk order (splits in part order) and the partial marks.
template <int BN> void walk(const std::vector<int>& list, int kept, int kv_len, int n_kv, int splits,
                            std::vector<int>& got, int& marks, int& partial_blk, bool& exact_shares,
                            std::vector<int>* firsts = nullptr, std::vector<int>* counts = nullptr) {
  marks = 0, partial_blk = -1, exact_shares = true;
  for (int part = splits == 1 ? -1 : 0; part < (splits == 1 ? 0 : splits); ++part) {
    const auto kb = MapKeyBlocks<BN>::of_row(list.data(), kept, (int)list.size(), kv_len, n_kv, part, splits);
    if (kb.count != kb.end - kb.first) exact_shares = false;
    if (firsts) { firsts->push_back(kb.first); counts->push_back(kb.count); }
    int pos = kb.first;
    for (int i = 0; i < kb.count; ++i) {
      const int blk = next_block(kb, i, pos);
      got.push_back(blk);
      if (kb.partial(blk)) { partial_blk = blk; ++marks; }
    }
  }
}

// Valid rows (ascending entries in [0, Tk), padding as the builders write it): the splits together visit, in
// ascending order and once each, the kernel blocks before kv_len; every position of a share is valid (the walk and
// its shares are those of the walk that trusted the map); density 1 walks what KeyBlocks::dense walks.
template <int BN> int check_valid(unsigned seed, int iterations) {
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
      std::vector<int> got, firsts, counts;
      int marks, got_partial;
      bool exact;
      walk<BN>(list, kept, kv_len, n_kv, splits, got, marks, got_partial, exact, &firsts, &counts);
      if (full) {  // density 1: the dense walk, split for split
        for (int part = splits == 1 ? -1 : 0, k = 0; part < (splits == 1 ? 0 : splits); ++part, ++k) {
          const KeyBlocks d = KeyBlocks::dense(kv_len, BN, part, splits);
          if (d.first != firsts[k] || d.count != counts[k]) ++bad;
        }
      }
      if (got != want || got_partial != want_partial || marks > 1 || !exact) {
        if (bad < 5) printf("valid BN %d n_kv %d kv_len %d kept %d splits %d: %zu blocks, want %zu; partial %d, want %d\n",
                            BN, n_kv, kv_len, kept, splits, got.size(), want.size(), got_partial, want_partial);
        ++bad;
      }
    }
  }
  return bad;
}

// Malformed rows (any order, duplicates, entries outside [0, Tk) -- INT_MIN and INT_MAX too --, counts outside
// [0, Kmax]): the splits together visit, in row order, exactly the kernel blocks before kv_len of the row's first
// clamp(count, 0, Kmax) entries that lie in [0, Tk), each as often as it is listed; only block nblk - 1 is marked
// partial, when kv_len cuts it.
template <int BN> int check_malformed(unsigned seed, int iterations) {
  constexpr int SUB = 128 / BN;
  srand(seed);
  int bad = 0;
  const int odd[] = {INT_MIN, INT_MIN + 1, -1000000, INT_MAX, INT_MAX - 1, 1 << 30, (1 << 30) + 1};
  for (int it = 0; it < iterations; ++it) {
    const int n_kv = 1 + rand() % 2000, tk = (n_kv + 127) / 128;
    const int kv_len = rand() % 3 == 0 ? n_kv : rand() % (n_kv + 1);
    const int kmax = 1 + rand() % tk;
    std::vector<int> list(kmax);
    for (int& e : list) {
      const int r = rand() % 10;
      e = r < 6 ? rand() % tk : r < 8 ? tk + rand() % 3 - 1 - rand() % 2 * (tk + 1) : odd[rand() % 7];
    }
    const int r = rand() % 6;
    const int kept = r == 0 ? -(rand() % 3) - 1 : r == 1 ? kmax + 1 + rand() % 3 : r == 2 ? INT_MAX : rand() % (kmax + 1);
    const int live = min(max(kept, 0), kmax);
    std::vector<int> want;
    for (int e = 0; e < live; ++e) {
      if (list[e] < 0 || list[e] >= tk) continue;
      for (int s = 0; s < SUB; ++s) {
        const int blk = SUB * list[e] + s;
        if (blk * BN < kv_len) want.push_back(blk);
      }
    }
    const int nblk = (kv_len + BN - 1) / BN;
    for (int splits = 1; splits <= 4; ++splits) {
      std::vector<int> got;
      int marks, got_partial;
      bool exact;
      walk<BN>(list, kept, kv_len, n_kv, splits, got, marks, got_partial, exact);
      int want_marks = 0;
      for (int blk : want) want_marks += (blk + 1) * BN > kv_len;
      if (got != want || marks != want_marks || (marks && got_partial != nblk - 1)) {
        if (bad < 5) printf("malformed BN %d n_kv %d kv_len %d kmax %d kept %d splits %d: %zu blocks, want %zu\n", BN,
                            n_kv, kv_len, kmax, kept, splits, got.size(), want.size());
        ++bad;
      }
    }
  }
  return bad;
}

int main() {
  const int bad = check_valid<128>(1, 20000) + check_valid<64>(2, 20000) + check_malformed<128>(3, 20000) +
                  check_malformed<64>(4, 20000);
  printf("bad %d\n", bad);
  return bad != 0;
}
"""


def test_map_walk_visits_exactly_the_kept_blocks_before_kv_len_and_skips_malformed_entries(tmp_path):
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler (g++ / clang++) on PATH")
    src, exe = tmp_path / "walk.cpp", tmp_path / "walk"
    src.write_text(PROGRAM)
    build = subprocess.run([cxx, "-std=c++17", "-O2", f"-I{CSRC}", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", str(src), "-o", str(exe)], capture_output=True,
                           text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip().endswith("bad 0"), run.stdout + run.stderr
