// The key-block walk: which key blocks of BN keys one CTA (one query tile, or one split of it) visits, in order.
// Every attention kernel's producer and consumers iterate the same walk,
//
//   const KeyBlocks kb = KeyBlocks::dense(kv_len, BN, part, splits);       // or MapKeyBlocks<BN>::of_row(...)
//   int pos = kb.first;
//   for (int i = 0; i < kb.count; ++i) { const int blk = next_block(kb, i, pos); ... keys [blk * BN, blk * BN + BN) }
//
// and mask keys by their absolute index (blk * BN + offset >= kv_len), never by i, so a walk that skips blocks
// changes no numerics: a skipped block is a block of -inf scores. Two walks:
// - KeyBlocks (dense): all blocks up to kv_len, or the share [first, first + count) of them that split `part` of
//   `splits` takes (the tail split over keys);
// - MapKeyBlocks (block-sparse): the kept blocks of one row of a block map (rotvid/kernels/sparsity/block_map.py:
//   kept map blocks of kMapBlock keys, ascending in a valid map), those wholly past kv_len or outside the map
//   skipped, each map block walked as kMapBlock / BN kernel blocks; a split takes an even share of the row.
// Both visit only blocks that hold at least one key before kv_len.
#pragma once

#include <type_traits>

namespace rotvid {

// The block map's granularity in tokens, for query tiles and key blocks alike (MAP_BLOCK in block_map.py).
constexpr int kMapBlock = 128;

struct KeyBlocks {
  int first;  // the first block visited
  int count;  // blocks visited

  __device__ __forceinline__ int block(int i) const { return first + i; }
  // The key mask in the walk's own terms: key o of the i-th block visited is key mask_block(i) * bn + o of a
  // sequence mask_len(kv_len, bn) keys long. Dense: counted from `first` (the form the Hopper int8-fp8 kernel at
  // head_dim 64 was tuned in: the absolute form, block(i) and kv_len, ran it 3.4% slower); a block list gives block(i)
  // and kv_len.
  __device__ __forceinline__ int mask_block(int i) const { return i; }
  __device__ __forceinline__ int mask_len(int kv_len, int bn) const { return kv_len - first * bn; }
  // Whether key block `blk` holds keys at or past kv_len (the one block that needs the key mask).
  __device__ __forceinline__ static bool partial(int blk, int bn, int kv_len) { return (blk + 1) * bn > kv_len; }

  // All ceil(kv_len / bn) blocks (part < 0: a tile run whole, whatever `splits`), or split `part`'s share when the
  // tile is split evenly over `splits` CTAs (block boundaries at nblk * part / splits). (One branch on part: the
  // form of the Hopper kernel's code as it was measured.)
  __device__ __forceinline__ static KeyBlocks dense(int kv_len, int bn, int part, int splits) {
    KeyBlocks kb{0, (kv_len + bn - 1) / bn};
    if (part >= 0) {
      kb.first = (int)((long long)kb.count * part / splits);
      kb.count = (int)((long long)kb.count * (part + 1) / splits) - kb.first;
    }
    return kb;
  }
};

// The walk over one block-map row: positions 0 .. n - 1 of the row's kernel blocks (map entry list[e] is kernel
// blocks SUB list[e] .. SUB list[e] + SUB - 1, SUB = kMapBlock / BN), of which this CTA walks [first, end) and
// visits the `count` valid ones. The map's values are not trusted (a map a host check never saw -- under
// torch.compile, or written in place -- reaches the kernel as it is; rotvid/kernels/sparsity/block_map.py,
// BlockMap.visit_counts, is the same rule):
// - the row's count is clamped to [0, Kmax];
// - a position is valid when its entry lies in [0, Tk) and its kernel block holds a key before kv_len (block in
//   [0, nblk)); an invalid one is skipped wherever it sits in the row (no order is assumed: an entry past kv_len
//   in the middle of a row is skipped as one at its end), so no load leaves the operands;
// - an entry listed twice is visited twice.
// `count` is exact (the valid positions of [first, end), counted once per CTA, 32 at a time by each warp), so the
// producer's and the consumers' loops run `count` steps as in the dense walk, and each side reads the blocks in
// order with its own cursor (next(pos): one index fetch and one or two integer compares per block).
// For a valid map (entries ascending in [0, Tk)) every position of [0, n) is valid: the walk, its split shares and
// so the output bits are those of the walk that trusted the map.
template <int BN>
struct MapKeyBlocks {
  static_assert(kMapBlock % BN == 0, "kernel key blocks subdivide the map's blocks");
  static constexpr int SUB = kMapBlock / BN;
  const int* list;  // the row's entries
  int first;        // the first position walked
  int end;          // one past the last position walked
  int count;        // valid positions in [first, end): the blocks visited
  int nblk;         // kernel blocks holding keys before kv_len (a valid block lies in [0, nblk))
  int tail;         // the kernel block holding keys at or past kv_len (nblk - 1 when kv_len % BN != 0), or -1

  // The kernel block at position pos, or -1 when the position is invalid. (SUB > 1: the block is formed in unsigned
  // arithmetic, so an entry far out of range wraps instead of overflowing; the entry's own compare rejects it.)
  __device__ __forceinline__ int block_at(int pos) const {
    if constexpr (SUB == 1) {
      const int e = __ldg(list + pos);
      return (unsigned)e < (unsigned)nblk ? e : -1;
    } else {
      const int e = __ldg(list + pos / SUB);
      const int blk = (int)(SUB * (unsigned)e + (unsigned)(pos % SUB));
      return (unsigned)e < (unsigned)((nblk + SUB - 1) / SUB) && blk < nblk ? blk : -1;
    }
  }
  // The next block visited from cursor pos on (pos moves past it); called once per step, in order, from
  // pos = first. (Past `end` without a valid position -- only if the map changed while the kernel ran -- block 0,
  // which every call has: a defined load, never one outside the operands.)
  __device__ __forceinline__ int next(int& pos) const {
    int blk = block_at(pos++);
    while (blk < 0 && pos < end) blk = block_at(pos++);
    return max(blk, 0);
  }
  // Whether block blk holds keys at or past kv_len (KeyBlocks::partial of a visited block: only block nblk - 1 can).
  __device__ __forceinline__ bool partial(int blk) const { return blk == tail; }
  // The key mask's terms (KeyBlocks::mask_len): absolute, the block's own index and kv_len.
  __device__ __forceinline__ static int mask_len(int kv_len, int) { return kv_len; }

  // Valid positions in [from, to). Every thread of the warp calls it (at the top of the kernel, converged): each
  // lane takes every 32nd position, a butterfly sums them.
  __device__ __forceinline__ int valid_in(int from, int to) const {
#ifdef __CUDA_ARCH__
    // (the loop's trip count is the warp's, not the lane's, and the lanes' counts meet in one ballot per 32
    // positions: a lane-divergent loop, or a shuffle reduction after it, made ptxas serialize the Hopper kernel's
    // wgmma in the sparse instantiations)
    const int lane = (int)(threadIdx.x & 31);
    int c = 0;
    for (int q0 = from; q0 < to; q0 += 32) {
      const int q = q0 + lane;
      c += __popc(__ballot_sync(0xffffffffu, q < to && block_at(q) >= 0));
    }
    return c;
#else  // (the host test of the walk, tests/kernels/test_key_blocks_host.py)
    int c = 0;
    for (int q = from; q < to; ++q) c += block_at(q) >= 0 ? 1 : 0;
    return c;
#endif
  }

  // The row `list` with `kept` entries (the map's count; Kmax entries in all) for keys [0, kv_len) of n_kv (the
  // map covers ceil(n_kv / kMapBlock) blocks); part / splits as KeyBlocks::dense, over the row's positions. The
  // positions [0, n) split: the row's count clamped to [0, Kmax], then, only when kv_len leaves some of the map's
  // blocks out, trailing entries wholly past kv_len dropped (one read of the row's last entry, then one per dropped
  // entry) and, with SUB > 1, the last entry's kernel blocks past kv_len -- so that the splits of an ascending row
  // take even shares of its valid blocks. What is left invalid anywhere in [0, n) is skipped by the walk.
  __device__ __forceinline__ static MapKeyBlocks of_row(const int* list, int kept, int kmax, int kv_len, int n_kv,
                                                        int part, int splits) {
    const int nblk = (kv_len + BN - 1) / BN;  // kernel blocks holding keys before kv_len
    kept = min(max(kept, 0), kmax);
    int n = kept * SUB;
    if (kept > 0 && nblk < SUB * ((n_kv + kMapBlock - 1) / kMapBlock)) {
      const int nent = (nblk + SUB - 1) / SUB;  // entries holding a key before kv_len: [0, nent)
      int last = __ldg(list + kept - 1);
      while (kept > 0 && last >= nent) {
        --kept;
        last = kept > 0 ? __ldg(list + kept - 1) : 0;
      }
      n = kept > 0 ? kept * SUB - (last >= 0 ? max(0, SUB * (last + 1) - nblk) : 0) : 0;
    }
    MapKeyBlocks kb{list, 0, n, 0, nblk, kv_len % BN != 0 ? nblk - 1 : -1};
    if (part >= 0) {
      kb.first = (int)((long long)n * part / splits);
      kb.end = (int)((long long)n * (part + 1) / splits);
    }
    kb.count = kb.valid_in(kb.first, kb.end);
    return kb;
  }
};

// Step i's key block of a walk, from cursor pos: KeyBlocks::block(i) (pos unused), or MapKeyBlocks::next(pos).
template <class KB>
__device__ __forceinline__ int next_block(const KB& kb, int i, int& pos) {
  if constexpr (std::is_same<KB, KeyBlocks>::value) {
    return kb.block(i);
  } else {
    return kb.next(pos);
  }
}

}  // namespace rotvid
