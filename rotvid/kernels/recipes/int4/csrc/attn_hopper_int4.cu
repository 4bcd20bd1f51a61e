// The INT4-valued recipes on the Hopper attention kernel: launch_int4_attention_wgmma (int4_entry.cuh) runs
// hopper_attention.cuh with the Int4ValuedNumerics policy at the schedule table's row.
#include "hopper_int4_numerics.cuh"
#include "hopper/hopper_launch.cuh"
#include "int4_entry.cuh"

namespace rotvid {
namespace {

template <int D, int BN, int PMODE, bool SQ>
cudaError_t launch_int4(const AttnParams& p, cudaStream_t stream) {
  constexpr hopper::Schedule s = hopper::hopper_schedule(hopper::Numerics::kInt4Valued, D, BN);
  static_assert(s.stages > 0, "no schedule row for this head_dim / block_n (hopper_schedule.cuh)");
  static_assert(!s.magic_scores, "the INT4-valued numerics converts scores by I2F");
  return hopper::launch_attention<hopper::Int4ValuedNumerics<D, BN, PMODE, SQ>, s.stages, s.pingpong, s.pipe>(p, stream);
}

// Q smoothing (p.k_bias: its per-key bias) picks the SQ kernels
template <int D, int PMODE>
cudaError_t launch_int4_bn(const AttnParams& p, int block_n, cudaStream_t stream) {
  const bool sq = p.k_bias != nullptr;
  if (block_n == 64) return sq ? launch_int4<D, 64, PMODE, true>(p, stream) : launch_int4<D, 64, PMODE, false>(p, stream);
  return sq ? launch_int4<D, 128, PMODE, true>(p, stream) : launch_int4<D, 128, PMODE, false>(p, stream);
}

}  // namespace

cudaError_t launch_int4_attention_wgmma(const AttnParams& p, int head_dim, int block_n, int p_mode,
                                        cudaStream_t stream) {
  if (!wgmma_kernel_available()) return cudaErrorNotSupported;
  if ((block_n != 64 && block_n != 128) || p.Nq_pad % hopper::kBM != 0 || p.Nkv_pad % block_n != 0)
    return cudaErrorInvalidValue;
  if (head_dim == 128)
    return p_mode == kPRange ? launch_int4_bn<128, kPRange>(p, block_n, stream)
                             : launch_int4_bn<128, kPSym>(p, block_n, stream);
  if (head_dim == 64)
    return p_mode == kPRange ? launch_int4_bn<64, kPRange>(p, block_n, stream)
                             : launch_int4_bn<64, kPSym>(p, block_n, stream);
  return cudaErrorInvalidValue;
}

}  // namespace rotvid
