// The int8-fp8 recipe on the Hopper attention kernel: launch_int8fp8_attention_wgmma (int8fp8_entry.cuh) runs
// hopper_attention.cuh with the Int8Fp8Numerics policy at the schedule table's row (Int8Fp8VoNumerics when the output
// is un-rotated in the epilogue).
#include "common/rope_rows.cuh"
#include "hopper_int8fp8_numerics.cuh"
#include "hopper/hopper_launch.cuh"
#include "int8fp8_entry.cuh"

namespace rotvid {
namespace {

// the epilogue's power of two is the O side's of the online V/O Hadamard (rope_rows.cuh), at both head dims
static_assert(rowmath::kVoScaleOut == roperows::kVoScaleO<64> && rowmath::kVoScaleOut == roperows::kVoScaleO<128>,
              "rowmath::kVoScaleOut: the O side's power of two");

template <int D>
cudaError_t launch_int8fp8(const AttnParams& p, cudaStream_t stream) {
  constexpr hopper::Schedule s = hopper::hopper_schedule(hopper::Numerics::kInt8Fp8, D, 128);
  static_assert(s.stages > 0, "no schedule row for this head_dim (hopper_schedule.cuh)");
  if (p.o_hadamard) {  // the output un-rotated in the epilogue (attention_params.cuh)
    using Vo = hopper::Int8Fp8VoNumerics<D, s.magic_scores>;
    return hopper::launch_attention<Vo, s.stages, s.pingpong, s.pipe>(p, stream);
  }
  return hopper::launch_attention<hopper::Int8Fp8Numerics<D, s.magic_scores>, s.stages, s.pingpong, s.pipe>(p, stream);
}

}  // namespace

cudaError_t launch_int8fp8_attention_wgmma(const AttnParams& p, int head_dim, cudaStream_t stream) {
  if (!wgmma_kernel_available()) return cudaErrorNotSupported;
  if (p.Nq_pad % hopper::kBM != 0 || p.Nkv_pad % 128 != 0) return cudaErrorInvalidValue;
  if (head_dim == 128) return launch_int8fp8<128>(p, stream);
  if (head_dim == 64) return launch_int8fp8<64>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace rotvid
