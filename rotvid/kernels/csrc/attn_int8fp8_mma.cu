// Host side of the int8-fp8 mma.sync kernel (int8fp8_attention_mma.cuh). The device code exists in sm89+ builds
// (Ada, and Hopper where it runs beside the wgmma kernel); elsewhere the launcher reports cudaErrorNotSupported.
#include "int8fp8_attention_mma.cuh"

namespace rotvid {
namespace {

// NW warps of 16 query rows per CTA; MINB CTAs per SM for the register budget. Ada has 100 KB of shared memory
// per SM: head_dim 64 (38 KB per CTA, 2 stages) fits two CTAs of 4 warps; head_dim 128 (72 KB) one CTA, so it
// runs 8 warps (BM 128) sharing the tiles. Not measured on an Ada GPU.
template <int D, int NW, int MINB>
cudaError_t launch8_mma(const AttnParams& p, cudaStream_t stream) {
  using C = mma8::Cfg<D>;
  auto kernel = mma8::int8fp8_attention_mma_kernel<D, NW, MINB>;
  cudaFuncAttributes attr{};
  cudaError_t err = cudaFuncGetAttributes(&attr, kernel);
  if (err != cudaSuccess) return err;
  if (attr.binaryVersion < 89) return cudaErrorNotSupported;  // built for a GPU without e4m3 mma.sync
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
  if (err != cudaSuccess) return err;
  dim3 grid(p.Nq_pad / (16 * NW), p.H, p.B);
  kernel<<<grid, NW * 32, C::SMEM, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_int8fp8_attention_mma(const AttnParams& p, int head_dim, cudaStream_t stream) {
  if (p.Nq_pad % kBlockM != 0 || p.Nkv_pad % mma8::kBN != 0) return cudaErrorInvalidValue;
  if (head_dim == 128) return launch8_mma<128, 8, 1>(p, stream);
  if (head_dim == 64) return launch8_mma<64, 4, 2>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace rotvid
