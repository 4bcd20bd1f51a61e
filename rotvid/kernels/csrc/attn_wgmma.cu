// Host side of the Hopper kernel (int4_attention_wgmma.cuh): TMA tensor maps and the launch.
// The device code exists only in an sm90a build; elsewhere the launcher reports cudaErrorNotSupported.
#include <algorithm>
#include <cstdlib>

#include "int4_attention_wgmma.cuh"
#include "tma_map.cuh"

namespace rotvid {
namespace {

using tma::encode_fn;
using tma::make_map;

template <int D, int PMODE, int STAGES, int PINGPONG = 0, int PIPE = 0, int BN = 128, bool SQ = false, int FP8PV = 2>
cudaError_t launch_d(const AttnParams& p, cudaStream_t stream) {
  using C = wg::Cfg<D, STAGES, BN>;
  const uint64_t bh = (uint64_t)p.B * p.H;
  CUtensorMap tm_q, tm_k, tm_v;
  if (!make_map(&tm_q, p.q, bh * p.Nq_pad, D, wg::kBM, D, C::QK_SWIZZLE) ||
      !make_map(&tm_k, p.k, bh * p.Nkv_pad, D, BN, D, C::QK_SWIZZLE) ||
      !make_map(&tm_v, p.vt, bh * D, p.Nkv_pad, D, BN, C::V_SWIZZLE))
    return cudaErrorInvalidValue;
  auto kernel = wg::int4_attention_wgmma_kernel<D, BN, PMODE, STAGES, PINGPONG, PIPE, SQ, FP8PV>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
  if (err != cudaSuccess) return err;
  const long long tiles = (long long)(p.Nq_pad / wg::kBM) * p.H * p.B;
  const long long ctas = p.split_from + (tiles - p.split_from) * p.splits;
  // (the kernel treats every tile from split_from on as split: without splits, split_from must be the tile count)
  if (p.splits < 1 || p.split_from > tiles || (p.splits == 1 && p.split_from != tiles) ||
      (p.splits > 1 && p.ws == nullptr) || ctas > 0x7fffffffLL)
    return cudaErrorInvalidValue;
  kernel<<<dim3((unsigned)ctas), wg::kThreads, C::SMEM, stream>>>(p, tm_q, tm_k, tm_v);
  if (p.splits > 1 && tiles > p.split_from) {
    const dim3 cgrid((unsigned)(tiles - p.split_from), wg::kBM / 8);
    wg::combine_splits_kernel<D><<<cgrid, 256, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

template <int D, int PMODE, bool SQ>
cudaError_t launch_dp(const AttnParams& p, int block_n, cudaStream_t stream) {
  if (block_n == 64) {
#ifdef ROTVID_WGMMA_VARIANTS
    // tuning build only: ROTVID_WGMMA_VARIANT=<n> picks a block_n 64 variant, read per call: 1 two S buffers
    // with a 3-stage ring; 4 two S buffers, 2 stages; 3 plain order, 3 stages; 0: the default (PIPE 1)
    const char* env = std::getenv("ROTVID_WGMMA_VARIANT");
    const int variant = env != nullptr ? std::atoi(env) : 0;
    if (variant == 1) return launch_d<D, PMODE, 3, 0, 3, 64, SQ>(p, stream);
    if (variant == 4) return launch_d<D, PMODE, 2, 0, 3, 64, SQ>(p, stream);
    if (variant == 3) return launch_d<D, PMODE, 3, 0, 0, 64, SQ>(p, stream);
#endif
    return launch_d<D, PMODE, 2, 0, 1, 64, SQ>(p, stream);
  }
#ifdef ROTVID_WGMMA_VARIANTS
  {  // block_n 128 tuning variants: 21 ping-pong 1 (turn around the QK^T issue); 22 ping-pong 2 (turn around
     // P.V + next QK^T); 23 ping-pong 2 with 3 stages; 24 ping-pong 2, plain order; 25 ping-pong 2, 4 stages;
     // 26 ping-pong 2, PIPE 2, 3 stages; 27 ping-pong 1, 3 stages (31/32, the thread
     // index kept in a register through a shuffle, measured within noise and were removed)
    const char* env = std::getenv("ROTVID_WGMMA_VARIANT");
    const int variant = env != nullptr ? std::atoi(env) : 0;
    if (variant == 21) return launch_d<D, PMODE, 2, 1, 1, 128, SQ>(p, stream);
    if (variant == 22) return launch_d<D, PMODE, 2, 2, 1, 128, SQ>(p, stream);
    if (variant == 23) return launch_d<D, PMODE, 3, 2, 1, 128, SQ>(p, stream);
    if (variant == 24) return launch_d<D, PMODE, 2, 2, 0, 128, SQ>(p, stream);
    if (variant == 25) return launch_d<D, PMODE, 4, 2, 1, 128, SQ>(p, stream);
    if (variant == 26) return launch_d<D, PMODE, 3, 2, 2, 128, SQ>(p, stream);
    if (variant == 27) return launch_d<D, PMODE, 3, 1, 1, 128, SQ>(p, stream);
    // 30: head_dim 64's default before session 16 (plain order, 3 stages; see the default below)
    if constexpr (D == 64) {
      if (variant == 30) return launch_d<D, PMODE, 3, 0, 0, 128, SQ>(p, stream);
    }
    // 40: the u8 x s8 P.V of before (FP8PV 0: p.vt must hold two's-complement V^ bytes, the s8 pre-processing's);
    // 41: P^ bytes formed as the s8 path does, P.V in e4m3 (FP8PV 1: bit-identical to s8); both with the schedule
    // of fbf1c47's default (head_dim 128: ping-pong 2, as variant 23), where their A/B was run
    if (variant == 40 || variant == 41) {
      constexpr int PP = D == 128 ? 2 : 0, PI = D == 128 ? 1 : 0;
      return variant == 40 ? launch_d<D, PMODE, 3, PP, PI, 128, SQ, 0>(p, stream)
                           : launch_d<D, PMODE, 3, PP, PI, 128, SQ, 1>(p, stream);
    }
  }
#endif
  // block_n 128 (H100, kernel_variants.py, same runs; identical output bits): head_dim 128 overlaps the next
  // block's QK^T with this block's O update (605 -> 630 TOP/s at Wan2.1-1.3B 480p) with a 3-stage ring; the two
  // consumer warpgroups take turns issuing the QK^T (ping-pong 1: with the e4m3 P.V of FP8PV 2, 668 -> 722 TOP/s
  // at Wan2.1-1.3B and 674 -> 724 at Wan 14B 720p against ping-pong 2's turn around P.V + the next QK^T, which
  // was the better one with the u8 x s8 P.V: 632 -> 658). Head_dim 64 takes no ping-pong (CogVideoX-5B: it lost
  // 4-16% there, with either P.V) and issues the next block's QK^T during this block's O update with a 4-stage
  // ring (session 16, CogVideoX-5B, attention only, Q/K/V smoothed: 9.36 -> 8.57 ms against the plain order with 3
  // stages; K only: 8.38 -> 7.93; 2, 3 and 5 stages and PIPE 2 in between).
  if constexpr (D == 128) {
    return launch_d<D, PMODE, 3, 1, 1, 128, SQ>(p, stream);
  } else {
    return launch_d<D, PMODE, 4, 0, 1, 128, SQ>(p, stream);
  }
}

// Q smoothing (p.k_bias: its per-key bias) picks the SQ kernels
template <int D, int PMODE>
cudaError_t launch_dq(const AttnParams& p, int block_n, cudaStream_t stream) {
  return p.k_bias != nullptr ? launch_dp<D, PMODE, true>(p, block_n, stream) : launch_dp<D, PMODE, false>(p, block_n, stream);
}

}  // namespace

// Tail split: with T query tiles on n SMs the last wave holds rem = T mod n tiles and leaves n - rem SMs idle for
// a whole tile; splitting those tiles over the keys in S = min(4, n / rem) parts (each at least 2 key blocks)
// lets the last wave take ~1/S of the time (Wan2.1-1.3B 480p: 3072 tiles = 23.3 waves on 132 SMs).
int wgmma_split_plan(int B, int H, int Nq_pad, int Nkv, int block_n, int num_sms, int* split_from) {
  const long long tiles = (long long)(Nq_pad / wg::kBM) * H * B;
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
  const long long tiles = (long long)(Nq_pad / wg::kBM) * H * B;
  if (splits <= 1) return 0;
  return (tiles - split_from) * splits * wg::kBM * (head_dim + 2);
}

bool wgmma_kernel_available() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
    return false;
  return major == 9 && encode_fn() != nullptr;
}

cudaError_t launch_int4_attention_wgmma(const AttnParams& p, int head_dim, int block_n, int p_mode,
                                        cudaStream_t stream) {
  if (!wgmma_kernel_available()) return cudaErrorNotSupported;
  if ((block_n != 64 && block_n != 128) || p.Nq_pad % wg::kBM != 0 || p.Nkv_pad % block_n != 0)
    return cudaErrorInvalidValue;
  if (head_dim == 128)
    return p_mode == kPRange ? launch_dq<128, kPRange>(p, block_n, stream) : launch_dq<128, kPSym>(p, block_n, stream);
  if (head_dim == 64)
    return p_mode == kPRange ? launch_dq<64, kPRange>(p, block_n, stream) : launch_dq<64, kPSym>(p, block_n, stream);
  return cudaErrorInvalidValue;
}

}  // namespace rotvid
