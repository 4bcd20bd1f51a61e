// One side of the online V/O Hadamard as one memory-bound pass over a tensor's rows (launch_hadamard_rows,
// attention_params.cuh): each row of D = 64 or 128 fp16 / bf16 values is read once, transformed in registers by
// roperows::wht8 (rotvid.rope.hadamard.fwht's butterflies, stages 3+ by shuffles), multiplied by an exact power of two
// and written once, rounded to its dtype: the bits of rotvid.rope.hadamard.unrotate_o_online (scale kVoScaleO) or
// rotate_v_online (kVoScaleV). Its use: both sides around a CUDA kernel that does not rotate V itself (the INT4
// recipes; rotvid.kernels.hadamard_op), and the int8-fp8 call's output at head_dim 64.
// Thread t holds the 16-byte chunk t % TPR of rows t / TPR + RSTEP u (u < U) of its CTA's U * RSTEP rows: each load
// instruction of a CTA reads RSTEP consecutive rows (4 KB), all U loads in flight before the first transform.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/attention_params.cuh"
#include "common/rope_rows.cuh"

namespace rotvid {
namespace hrows {

constexpr int kThreads = 256;
constexpr int kSteps = 4;  // rows per thread (U): loads in flight together

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) hadamard_rows_kernel(const __grid_constant__ HadamardRowsParams p) {
  constexpr int TPR = D / 8;             // threads per row
  constexpr int RSTEP = kThreads / TPR;  // rows per step
  const int c8 = threadIdx.x % TPR;
  const long long row0 = (long long)blockIdx.x * (kSteps * RSTEP) + threadIdx.x / TPR;
  const uint4* in = static_cast<const uint4*>(p.x);
  uint4* out = static_cast<uint4*>(p.out);
  uint4 raw[kSteps];
#pragma unroll
  for (int u = 0; u < kSteps; ++u) {  // rows past the end load as zeros: every lane reaches the shuffles
    const long long r = row0 + (long long)u * RSTEP;
    raw[u] = r < p.rows ? in[r * TPR + c8] : make_uint4(0u, 0u, 0u, 0u);
  }
#pragma unroll
  for (int u = 0; u < kSteps; ++u) {
    const uint4 y = roperows::vo_hadamard_chunk<T, D>(raw[u], p.scale);
    const long long r = row0 + (long long)u * RSTEP;
    if (r < p.rows) out[r * TPR + c8] = y;
  }
}

template <typename T, int D>
cudaError_t launch_typed(const HadamardRowsParams& p, cudaStream_t stream) {
  constexpr long long kRowsPerCta = (long long)kSteps * (kThreads / (D / 8));
  const long long ctas = (p.rows + kRowsPerCta - 1) / kRowsPerCta;
  if (ctas > 0x7fffffffLL) return cudaErrorInvalidValue;
  if (ctas > 0) hadamard_rows_kernel<T, D><<<(unsigned)ctas, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_type(const HadamardRowsParams& p, cudaStream_t stream) {
  if (p.D == 64) return launch_typed<T, 64>(p, stream);
  if (p.D == 128) return launch_typed<T, 128>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace hrows

cudaError_t launch_hadamard_rows(const HadamardRowsParams& p, cudaStream_t stream) {
  if (p.rows < 0) return cudaErrorInvalidValue;
  return p.is_bf16 ? hrows::launch_type<__nv_bfloat16>(p, stream) : hrows::launch_type<__half>(p, stream);
}

}  // namespace rotvid
