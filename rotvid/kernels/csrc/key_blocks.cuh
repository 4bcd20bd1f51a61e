// The key-block walk: which key blocks of BN keys one CTA (one query tile, or one split of it) visits, in order.
// Every attention kernel's producer and consumers iterate the same walk,
//
//   const KeyBlocks kb = KeyBlocks::dense(kv_len, BN, part, splits);
//   for (int i = 0; i < kb.count; ++i) { const int blk = kb.block(i); ... keys [blk * BN, blk * BN + BN) ... }
//
// and mask keys by their absolute index (blk * BN + offset >= kv_len), never by i, so a walk that skips blocks
// changes no numerics: a skipped block is a block of -inf scores. Today the walk is dense: all blocks up to
// kv_len, or the share [first, first + count) of them that split `part` of `splits` takes (the tail split over
// keys). A block-sparse walk is the same struct over a list of block indices.
#pragma once

namespace rotvid {

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

}  // namespace rotvid
