// Host side of the Hopper attention kernel (hopper_attention.cuh): TMA tensor maps, the launch of numerics N at
// the schedule table's row (hopper_schedule.cuh), dense or block-sparse, with or without the LSE, and the
// split-combine pass. The device code exists only in an
// sm90a build; the entry points (attn_hopper_*.cu) report cudaErrorNotSupported elsewhere.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "hopper/hopper_attention.cuh"
#include "hopper/hopper_schedule.cuh"
#include "hopper/tma_map.cuh"

namespace rotvid {
namespace hopper {

template <class N, int STAGES, int PINGPONG, int PIPE, bool SPARSE, bool LSE>
cudaError_t launch_walk(const AttnParams& p, cudaStream_t stream) {
  using C = SmemLayout<N, STAGES>;
  constexpr int D = N::D, BN = N::BN;
  const uint64_t bh = (uint64_t)p.B * p.H;
  CUtensorMap tm_q, tm_k, tm_v;
  if (!tma::make_map(&tm_q, p.q, bh * p.Nq_pad, D, kBM, D, C::QK_SWIZZLE) ||
      !tma::make_map(&tm_k, p.k, bh * p.Nkv_pad, D, BN, D, C::QK_SWIZZLE) ||
      !tma::make_map(&tm_v, p.vt, bh * D, p.Nkv_pad, D, BN, C::V_SWIZZLE))
    return cudaErrorInvalidValue;
  auto kernel = hopper_attention_kernel<N, STAGES, PINGPONG, PIPE, SPARSE, LSE>;
  constexpr int smem = SPARSE ? C::SMEM_SPARSE : C::SMEM;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  const long long tiles = (long long)(p.Nq_pad / kBM) * p.H * p.B;
  const long long ctas = p.split_from + (tiles - p.split_from) * p.splits;
  // (the kernel treats every tile from split_from on as split: without splits, split_from must be the tile count)
  if (p.splits < 1 || p.split_from > tiles || (p.splits == 1 && p.split_from != tiles) ||
      (p.splits > 1 && p.ws == nullptr) || ctas > 0x7fffffffLL)
    return cudaErrorInvalidValue;
  kernel<<<dim3((unsigned)ctas), kThreads, smem, stream>>>(p, tm_q, tm_k, tm_v);
  if (p.splits > 1 && tiles > p.split_from) {
    const dim3 cgrid((unsigned)(tiles - p.split_from), kBM / 8);
    using Lse = std::conditional_t<LSE, N, NoLse>;  // (one shared combine per D and SPARSE without the LSE)
    combine_splits_kernel<D, SPARSE, Lse><<<cgrid, 256, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

// Numerics N at a schedule and SPARSE: with the LSE when p.lse is set (only numerics that return one; the LSE
// instantiations exist for them alone), else the kernel without it.
template <class N, int STAGES, int PINGPONG, int PIPE, bool SPARSE>
cudaError_t launch_lse_or_not(const AttnParams& p, cudaStream_t stream) {
  if (p.lse == nullptr) return launch_walk<N, STAGES, PINGPONG, PIPE, SPARSE, false>(p, stream);
  if constexpr (N::RETURNS_LSE) {
    return launch_walk<N, STAGES, PINGPONG, PIPE, SPARSE, true>(p, stream);
  } else {
    return cudaErrorInvalidValue;  // (this numerics returns no LSE)
  }
}

// Numerics N at a schedule: the dense kernel, or the block-sparse one when p carries a map (p.map_count).
template <class N, int STAGES, int PINGPONG, int PIPE>
cudaError_t launch_attention(const AttnParams& p, cudaStream_t stream) {
  if (p.map_count != nullptr) {
    if (p.map_index == nullptr || p.map_kmax < 1 || p.map_sb < 0 || p.map_sh < 0) return cudaErrorInvalidValue;
    return launch_lse_or_not<N, STAGES, PINGPONG, PIPE, true>(p, stream);
  }
  return launch_lse_or_not<N, STAGES, PINGPONG, PIPE, false>(p, stream);
}

}  // namespace hopper
}  // namespace rotvid
