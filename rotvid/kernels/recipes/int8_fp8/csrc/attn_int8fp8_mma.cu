// Host side of the int8-fp8 numerics on the mma.sync kernel (mma_numerics_int8fp8.cuh, its schedule row in
// mma_schedule_int8fp8.cuh).
// The device code exists in sm89+ builds (Ada, and Hopper where it runs beside the wgmma kernel); elsewhere the
// launch reports cudaErrorNotSupported.
#include "mma_schedule_int8fp8.cuh"
#include "int8fp8_entry.cuh"

namespace rotvid {

cudaError_t launch_int8fp8_attention_mma(const AttnParams& p, int head_dim, cudaStream_t stream) {
  if (p.Nq_pad % kBlockM != 0 || p.Nkv_pad % mma::kInt8Fp8BlockN != 0) return cudaErrorInvalidValue;
  if (p.o_hadamard) {  // the output un-rotated in the epilogue (attention_params.cuh)
    if (head_dim == 128) return mma::launch_mma<mma::Int8Fp8VoNumerics<128>>(p, stream);
    if (head_dim == 64) return mma::launch_mma<mma::Int8Fp8VoNumerics<64>>(p, stream);
    return cudaErrorInvalidValue;
  }
  if (head_dim == 128) return mma::launch_mma<mma::Int8Fp8Numerics<128>>(p, stream);
  if (head_dim == 64) return mma::launch_mma<mma::Int8Fp8Numerics<64>>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace rotvid
