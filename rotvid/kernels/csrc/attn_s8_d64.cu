// Instantiations of the INT4 attention kernel: s8 instruction path, head_dim 64.
#include "int4_attention.cuh"

namespace rotvid {
cudaError_t launch_attn_s8_d64(const AttnParams& p, int block_n, int p_mode, cudaStream_t stream) {
  return attn::launch_for_dim<64, false>(p, block_n, p_mode, stream);
}
}  // namespace rotvid
