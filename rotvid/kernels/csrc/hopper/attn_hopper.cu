// Host functions of the Hopper attention kernel shared by its recipes' entry points (attn_hopper_*.cu): whether
// it can run here, and the tail split's plan.
#include <algorithm>

#include "hopper/hopper_attention.cuh"
#include "hopper/tma_map.cuh"

namespace rotvid {

// Tail split: with T query tiles on n SMs the last wave holds rem = T mod n tiles and leaves n - rem SMs idle for
// a whole tile; splitting those tiles over the keys in S = min(4, n / rem) parts (each at least 2 key blocks)
// lets the last wave take ~1/S of the time (Wan2.1-1.3B 480p: 3072 tiles = 23.3 waves on 132 SMs).
int wgmma_split_plan(int B, int H, int Nq_pad, int Nkv, int block_n, int num_sms, int* split_from) {
  const long long tiles = (long long)(Nq_pad / hopper::kBM) * H * B;
  *split_from = (int)tiles;
  if (num_sms <= 0 || tiles <= 0) return 1;
  const long long rem = tiles % num_sms;
  if (rem == 0) return 1;
  const int nblk = (Nkv + block_n - 1) / block_n;
  int splits = (int)std::min<long long>(4, num_sms / rem);
  while (splits > 1 && nblk < 2 * splits) --splits;
  if (splits < 2) return 1;
  *split_from = (int)(tiles - rem);
  return splits;
}

long long wgmma_split_ws_floats(int B, int H, int Nq_pad, int head_dim, int split_from, int splits) {
  const long long tiles = (long long)(Nq_pad / hopper::kBM) * H * B;
  if (splits <= 1) return 0;
  return (tiles - split_from) * splits * hopper::kBM * (head_dim + 2);
}

bool wgmma_kernel_available() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
    return false;
  return major == 9 && tma::encode_fn() != nullptr;
}

}  // namespace rotvid
