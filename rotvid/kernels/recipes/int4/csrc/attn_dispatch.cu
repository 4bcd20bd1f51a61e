// Picks the instantiation of the mma.sync attention kernel with INT4-valued numerics (instruction path, head_dim).
#include "int4_entry.cuh"

namespace rotvid {
cudaError_t launch_attn_s8_d64(const AttnParams& p, int block_n, int p_mode, cudaStream_t stream);
cudaError_t launch_attn_s8_d128(const AttnParams& p, int block_n, int p_mode, cudaStream_t stream);
cudaError_t launch_attn_s4_d64(const AttnParams& p, int block_n, int p_mode, cudaStream_t stream);
cudaError_t launch_attn_s4_d128(const AttnParams& p, int block_n, int p_mode, cudaStream_t stream);

cudaError_t launch_int4_attention(const AttnParams& p, int head_dim, int block_n, bool s4, int p_mode,
                                  cudaStream_t stream) {
  if (head_dim == 64) return s4 ? launch_attn_s4_d64(p, block_n, p_mode, stream) : launch_attn_s8_d64(p, block_n, p_mode, stream);
  if (head_dim == 128) return s4 ? launch_attn_s4_d128(p, block_n, p_mode, stream) : launch_attn_s8_d128(p, block_n, p_mode, stream);
  return cudaErrorInvalidValue;
}
}  // namespace rotvid
