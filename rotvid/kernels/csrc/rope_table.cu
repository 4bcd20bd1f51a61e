// RoPE·R through the generalized RoPE table (rotvid.rope.fused_table), one memory-bound pass:
//   out[b, h, n, c] = c0 x[e] + c1 x[e + 1] + c2 x[p] + c3 x[p + 1],   (c0..c3) = coef[n, c, 0..3],
// e = the even channel of c's RoPE pair (index[c] = (e, e + 1, p, p + 1), the table's structure), p = the even channel
// of its partner pair. Computed in float32 as fma(c0, x0, c1 x1), then fma(c2, x2, .), fma(c3, x3, .), rounded once to
// the input's dtype: the order in which the Triton kernel (rotvid/kernels/rope_triton.py) and the compiled PyTorch
// form contract their products (found by benchmarks/device/rope_arith_probe.py on an H100: no other order of the
// six tried gives their bits), so the three give the same bits.
//
// The table is shared by the heads ([N, D, 4] float32, 16 bytes per channel and token against 2 bytes of x): a CTA
// owns ROWS tokens of one batch row, keeps their coefficients in registers (32 per thread) and walks the heads, U at
// a time: each thread loads its 16-byte chunk of U rows (U loads in flight), the rows go through shared memory so
// that each output channel reads its partner pair (any pairing: interleaved, half, learned), and every output chunk
// leaves as one 16-byte store. So x is read once, out written once, the table read once per batch row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "int4_common.cuh"

namespace rotvid {
namespace rope {

constexpr int kThreads = 256;
constexpr int kHeadsPerStep = 4;  // U: rows of this many heads in flight per thread

template <typename T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b);
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// element j of a pair word (two 16-bit values, j = 0 the low one)
template <typename T>
__device__ __forceinline__ float half_of(uint32_t w, int j) {
  const T* e = reinterpret_cast<const T*>(&w);
  return to_f32<T>(e[j]);
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) generalized_rope_kernel(const __grid_constant__ RopeTableParams p) {
  constexpr int TPR = D / 8;               // threads per token row (16 bytes each)
  constexpr int ROWS = kThreads / TPR;     // tokens per CTA
  constexpr int U = kHeadsPerStep;
  __shared__ __align__(16) uint4 rows[U][ROWS][TPR];
  const int b = blockIdx.y;
  const int r = threadIdx.x / TPR, c8 = threadIdx.x % TPR;
  const int n = blockIdx.x * ROWS + r;
  const bool valid = n < p.N;

  float cf[8][4];  // this thread's output channels 8 c8 + j, their four coefficients at token n
  int partner[8];  // the partner pair's even channel, as a pair index (p / 2) into the staged row
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float4 f = valid ? *reinterpret_cast<const float4*>(p.coef + ((size_t)n * D + c8 * 8 + j) * 4)
                           : make_float4(0.f, 0.f, 0.f, 0.f);
    cf[j][0] = f.x;
    cf[j][1] = f.y;
    cf[j][2] = f.z;
    cf[j][3] = f.w;
    partner[j] = p.index[(c8 * 8 + j) * 4 + 2] >> 1;
  }

  const char* xb = static_cast<const char*>(p.x) + 2 * ((size_t)b * p.sxb + (size_t)n * p.sxn + c8 * 8);
  char* ob = static_cast<char*>(p.out) + 2 * ((size_t)b * p.sob + (size_t)n * p.son + c8 * 8);
  for (int h0 = 0; h0 < p.H; h0 += U) {
    uint4 own[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int h = h0 + u;
      own[u] = valid && h < p.H ? *reinterpret_cast<const uint4*>(xb + 2 * (size_t)h * p.sxh)
                                : make_uint4(0u, 0u, 0u, 0u);
    }
    __syncthreads();  // the previous step's rows are read
#pragma unroll
    for (int u = 0; u < U; ++u) rows[u][r][c8] = own[u];
    __syncthreads();
    const uint32_t* staged = reinterpret_cast<const uint32_t*>(&rows[0][r][0]);  // pair words of row r, head u = 0
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int h = h0 + u;
      if (!valid || h >= p.H) continue;
      const uint32_t ow[4] = {own[u].x, own[u].y, own[u].z, own[u].w};
      uint32_t res[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // output pair i: channels 8 c8 + 2i, + 1 (own RoPE pair = pair word i)
        float y[2];
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          const int j = 2 * i + s;
          const uint32_t pw = staged[(size_t)u * ROWS * (D / 2) + partner[j]];
          float acc = __fmaf_rn(cf[j][0], half_of<T>(ow[i], 0), __fmul_rn(cf[j][1], half_of<T>(ow[i], 1)));
          acc = __fmaf_rn(cf[j][2], half_of<T>(pw, 0), acc);
          acc = __fmaf_rn(cf[j][3], half_of<T>(pw, 1), acc);
          y[s] = acc;
        }
        res[i] = pack2<T>(y[0], y[1]);
      }
      *reinterpret_cast<uint4*>(ob + 2 * (size_t)h * p.soh) = make_uint4(res[0], res[1], res[2], res[3]);
    }
  }
}

template <typename T>
cudaError_t launch_typed(const RopeTableParams& p, cudaStream_t stream) {
  const int tpr = p.D / 8, rows = kThreads / tpr;
  const dim3 grid((unsigned)((p.N + rows - 1) / rows), (unsigned)p.B);
  if (p.N <= 0 || p.B <= 0 || p.H <= 0) return cudaSuccess;
  if (p.D == 128) {
    generalized_rope_kernel<T, 128><<<grid, kThreads, 0, stream>>>(p);
  } else if (p.D == 64) {
    generalized_rope_kernel<T, 64><<<grid, kThreads, 0, stream>>>(p);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace rope

cudaError_t launch_generalized_rope(const RopeTableParams& p, cudaStream_t stream) {
  return p.is_bf16 ? rope::launch_typed<__nv_bfloat16>(p, stream) : rope::launch_typed<__half>(p, stream);
}

}  // namespace rotvid
