// The key-block walk: which key blocks of BN keys one CTA (one query tile, or one split of it) visits, in order.
// Every attention kernel's producer and consumers iterate the same walk,
//
//   const KeyBlocks kb = KeyBlocks::dense(kv_len, BN, part, splits);       // or MapKeyBlocks<BN>::of_row(...)
//   for (int i = 0; i < kb.count; ++i) { const int blk = kb.block(i); ... keys [blk * BN, blk * BN + BN) ... }
//
// and mask keys by their absolute index (blk * BN + offset >= kv_len), never by i, so a walk that skips blocks
// changes no numerics: a skipped block is a block of -inf scores. Two walks:
// - KeyBlocks (dense): all blocks up to kv_len, or the share [first, first + count) of them that split `part` of
//   `splits` takes (the tail split over keys);
// - MapKeyBlocks (block-sparse): the kept blocks of one row of a block map (rotvid/kernels/sparsity/block_map.py:
//   kept map blocks of kMapBlock keys, ascending), those wholly past kv_len dropped, each map block walked as
//   kMapBlock / BN kernel blocks; a split takes an even share of that list.
// Both visit only blocks that hold at least one key before kv_len.
#pragma once

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

// The walk over one block-map row: positions 0 .. n - 1 of the row's kernel blocks (map block list[e] is kernel
// blocks SUB list[e] .. SUB list[e] + SUB - 1, SUB = kMapBlock / BN), of which this CTA visits [first, first + count).
template <int BN>
struct MapKeyBlocks {
  static_assert(kMapBlock % BN == 0, "kernel key blocks subdivide the map's blocks");
  static constexpr int SUB = kMapBlock / BN;
  const int* list;  // the row's kept map blocks, ascending
  int first;        // the first position visited
  int count;        // positions visited
  int tail;         // the row's position whose block holds keys at or past kv_len (its last), or -1

  __device__ __forceinline__ int block(int i) const {
    const int pos = first + i;
    if constexpr (SUB == 1) {
      return __ldg(list + pos);
    } else {
      return SUB * __ldg(list + pos / SUB) + pos % SUB;
    }
  }
  // Whether the i-th block visited holds keys at or past kv_len (KeyBlocks::partial of its block, without reading
  // the map: only the row's last block can).
  __device__ __forceinline__ bool partial_at(int i) const { return first + i == tail; }
  // The key mask's terms (KeyBlocks::mask_block / mask_len): absolute, the block's own index and kv_len.
  __device__ __forceinline__ int mask_block(int i) const { return block(i); }
  __device__ __forceinline__ static int mask_len(int kv_len, int) { return kv_len; }

  // The row `list` with `kept` entries (the map's count) for keys [0, kv_len) of n_kv (the map covers
  // ceil(n_kv / kMapBlock) blocks); part / splits as KeyBlocks::dense. Entries wholly past kv_len are dropped, and
  // with SUB > 1 the last entry's kernel blocks past kv_len: only when kv_len leaves some of the map's blocks out
  // (one read of the row's last entry, then one per dropped entry). `tail` reads the row's last entry when kv_len
  // is not a multiple of BN (a walk that never asks partial_at compiles without that read).
  __device__ __forceinline__ static MapKeyBlocks of_row(const int* list, int kept, int kv_len, int n_kv, int part,
                                                        int splits) {
    const int nblk = (kv_len + BN - 1) / BN;  // kernel blocks holding keys before kv_len
    int n = kept * SUB;
    if (kept > 0 && nblk < SUB * ((n_kv + kMapBlock - 1) / kMapBlock)) {
      int last = __ldg(list + kept - 1);
      while (kept > 0 && SUB * last >= nblk) {
        --kept;
        last = kept > 0 ? __ldg(list + kept - 1) : 0;
      }
      n = kept > 0 ? kept * SUB - max(0, SUB * (last + 1) - nblk) : 0;
    }
    int tail = -1;
    if (n > 0 && kv_len % BN != 0) {
      const int last_blk = SUB * __ldg(list + (n - 1) / SUB) + (n - 1) % SUB;
      if (last_blk == nblk - 1) tail = n - 1;
    }
    MapKeyBlocks kb{list, 0, n, tail};
    if (part >= 0) {
      kb.first = (int)((long long)n * part / splits);
      kb.count = (int)((long long)n * (part + 1) / splits) - kb.first;
    }
    return kb;
  }
};

}  // namespace rotvid
