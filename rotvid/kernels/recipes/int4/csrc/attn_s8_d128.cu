// Instantiations of the mma.sync attention kernel, INT4-valued numerics: s8 instruction path, head_dim 128.
#include "mma_schedule_int4.cuh"

namespace rotvid {
cudaError_t launch_attn_s8_d128(const AttnParams& p, int block_n, int p_mode, cudaStream_t stream) {
  return mma::launch_int4<128, false>(p, block_n, p_mode, stream);
}
}  // namespace rotvid
