// Host side of the int8-fp8 Hopper kernel (int8fp8_attention_wgmma.cuh): TMA tensor maps and the launch.
// The device code exists only in an sm90a build; elsewhere the launcher reports cudaErrorNotSupported.
#include <algorithm>
#include <cstdlib>

#include "int8fp8_attention_wgmma.cuh"
#include "tma_map.cuh"

namespace rotvid {
namespace {

template <int D, int STAGES, int PINGPONG, int PIPE, int NWG = 2, int BN = 128, int MAGIC = 0>
cudaError_t launch8_d(const AttnParams& p, cudaStream_t stream) {
  using C = wg8::Cfg<D, STAGES, BN, NWG>;
  using S = wg8::Shape<NWG>;
  const uint64_t bh = (uint64_t)p.B * p.H;
  CUtensorMap tm_q, tm_k, tm_v;
  if (!tma::make_map(&tm_q, p.q, bh * p.Nq_pad, D, S::BM, D, C::QK_SWIZZLE) ||
      !tma::make_map(&tm_k, p.k, bh * p.Nkv_pad, D, C::SUBN, D, C::QK_SWIZZLE) ||
      !tma::make_map(&tm_v, p.vt, bh * D, p.Nkv_pad, D, C::SUBN, C::V_SWIZZLE))
    return cudaErrorInvalidValue;
  auto kernel = wg8::int8fp8_attention_wgmma_kernel<D, BN, STAGES, PINGPONG, PIPE, NWG, MAGIC>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
  if (err != cudaSuccess) return err;
  const long long tiles = (long long)((p.Nq_pad + S::BM - 1) / S::BM) * p.H * p.B;
  AttnParams q = p;
  if (q.splits <= 1) {  // no tail split: every tile whole (whatever tile size this variant has)
    q.splits = 1;
    q.split_from = (int)std::min<long long>(tiles, 0x7fffffffLL);
  }
  const long long ctas = q.split_from + (tiles - q.split_from) * q.splits;
  // (the tail split, as the INT4 kernel's: 128-row tiles and wg::combine_splits_kernel, so two consumer warpgroups)
  if (q.split_from > tiles || (q.splits > 1 && (q.ws == nullptr || S::BM != wg::kBM)) || ctas > 0x7fffffffLL)
    return cudaErrorInvalidValue;
  kernel<<<dim3((unsigned)ctas), S::THREADS, C::SMEM, stream>>>(q, tm_q, tm_k, tm_v);
  if (q.splits > 1 && tiles > q.split_from) {
    const dim3 cgrid((unsigned)(tiles - q.split_from), wg::kBM / 8);
    wg::combine_splits_kernel<D><<<cgrid, 256, 0, stream>>>(q);
  }
  return cudaGetLastError();
}

template <int D>
cudaError_t launch8_dim(const AttnParams& p, cudaStream_t stream) {
#ifdef ROTVID_INT8FP8_VARIANTS
  {  // tuning build only: ROTVID_INT8FP8_VARIANT=<n>, read per call (STAGES, PINGPONG, PIPE)
    const char* env = std::getenv("ROTVID_INT8FP8_VARIANT");
    const int variant = env != nullptr ? std::atoi(env) : 0;
    if (variant == 1) return launch8_d<D, 3, 2, 1>(p, stream);
    if (variant == 2) return launch8_d<D, 3, 0, 0>(p, stream);
    if (variant == 3) return launch8_d<D, 2, 2, 1>(p, stream);
    if (variant == 4) return launch8_d<D, 3, 0, 1>(p, stream);
    if (variant == 5) return launch8_d<D, 4, 2, 1>(p, stream);
    if (variant == 6) return launch8_d<D, 3, 0, 0, 3>(p, stream);
    if (variant == 7) return launch8_d<D, 2, 0, 0, 3>(p, stream);
    if (variant == 8) return launch8_d<D, 4, 0, 0, 3>(p, stream);
    if (variant == 9) return launch8_d<D, 3, 0, 1, 3>(p, stream);
    if (variant == 10) return launch8_d<D, 3, 2, 1, 2, 128, 0>(p, stream);
    if (variant == 11) return launch8_d<D, 3, 2, 1, 2, 128, 1>(p, stream);
    // key blocks of 192 / 256 keys (sub-blocks of 64 / 128 per stage; the block max over the whole block: a
    // numerics parameter) against the same order with 128 keys (40); ptxas spills noted where it spills
    constexpr int M = D == 64 ? 1 : 0;
    if (variant == 40) return launch8_d<D, 3, 2, 0, 2, 128, M>(p, stream);
    if (variant == 41) return launch8_d<D, 3, 2, 0, 2, 192, 1>(p, stream);  // d64: 76 B spill
    if (variant == 42) return launch8_d<D, 3, 2, 1, 2, 192, 0>(p, stream);  // d64: 16 B, d128: ~1 KB spill
    if (variant == 43) return launch8_d<D, 3, 2, 0, 2, 192, 0>(p, stream);  // d64: 16 B, d128: ~1 KB spill
    if (variant == 44) return launch8_d<D, 3, 2, 0, 2, 256, 0>(p, stream);  // d64: 96 B, d128: ~1 KB spill
    if (variant == 50) return launch8_d<D, 3, 2, 1, 2, 128, M>(p, stream);  // = the default (for A/B in one build)
    // 51: head_dim 64's default before session 16 (ping-pong 2, PIPE 1, 3 stages)
    if constexpr (D == 64) {
      if (variant == 51) return launch8_d<D, 3, 2, 1, 2, 128, 1>(p, stream);
    }
  }
#endif
  // H100, int8fp8_variants.py (attention only, one run): ping-pong 2 + PIPE 1 with 3 stages at both head dims --
  // Wan2.1-1.3B 780 TOP/s (2 stages 765, 4 stages 762, no ping-pong 699-735); CogVideoX-5B 451 (plain order 427-432).
  // Three consumer warpgroups (variants 6-9) spill ~1 KB per thread at 160 registers: 422-469 / 316-351.
  // H200, session 6: scores to float without I2F (MAGIC 1) at head_dim 64 504 -> 552 TOP/s (CogVideoX-5B, two rounds);
  // at head_dim 128 within noise (848-859 vs 844-849 at Wan2.1-1.3B, 860 vs 865 at Wan 14B 720p): kept at I2F there.
  // H100, session 10 (int8fp8_blocks.py, int8fp8_block_error.py): key blocks of 192 at head_dim 64 (variant 42) run
  // CogVideoX-5B at 571 vs 553 TOP/s (+3.3%, three interleaved rounds) but cost 0.1 dB against float64 (the block max
  // is part of the numerics): not kept. At head_dim 128 blocks of 192 / 256 spill ~1 KB (or, scores without I2F, get
  // warpgroup arrives injected, C7519) and run 40% slower. 256-key blocks at 64 serialize their wgmmas (C7512).
  // H100, session 16 (int8fp8_variants.py, three rounds): at head_dim 64 PIPE 1 without ping-pong, 3 stages, runs
  // CogVideoX-5B in 6.82-6.84 ms against 7.00 with ping-pong 2 (4 stages 6.90, ping-pong 2 with 4 stages 6.99-7.03,
  // 2 stages 7.57-7.60); same numerics.
  if constexpr (D == 64) {
    return launch8_d<D, 3, 0, 1, 2, 128, 1>(p, stream);
  } else {
    return launch8_d<D, 3, 2, 1, 2, 128, 0>(p, stream);
  }
}

}  // namespace

cudaError_t launch_int8fp8_attention_wgmma(const AttnParams& p, int head_dim, cudaStream_t stream) {
  if (!wgmma_kernel_available()) return cudaErrorNotSupported;
  if (p.Nq_pad % wg::kBM != 0 || p.Nkv_pad % 128 != 0) return cudaErrorInvalidValue;
  if (head_dim == 128) return launch8_dim<128>(p, stream);
  if (head_dim == 64) return launch8_dim<64>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace rotvid
