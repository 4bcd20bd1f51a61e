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
//
// HADAMARD (the full rotation, whose table is RoPE's alone): the rotated row is rounded to the input's dtype (what the
// RoPE pass would store) and goes through the Walsh-Hadamard transform in registers (roperows::fwht8: three stages in
// the thread, log2(D / 8) by shuffles among the row's lanes) before the store; rows past N compute zeros and skip the
// store, so every lane takes part in the shuffles.
#include <cstdint>

#include "common/attention_params.cuh"
#include "common/rope_rows.cuh"

namespace rotvid {
namespace rope {

using roperows::pack2;

constexpr int kThreads = 256;
constexpr int kHeadsPerStep = 4;  // U: rows of this many heads in flight per thread

template <typename T, int D, bool HADAMARD>
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
  roperows::load_coefs<D>(p.coef, p.index, n, valid, c8, cf, partner);

  const char* xb = static_cast<const char*>(p.x) + 2 * ((size_t)b * p.sxb + (size_t)n * p.sxn + c8 * 8);
  char* ob = static_cast<char*>(p.out) + 2 * ((size_t)b * p.sob + (size_t)n * p.son + c8 * 8);
  for (int h0 = 0; h0 < p.H; h0 += U) {
    uint4 own[U];
    roperows::load_and_stage<D, U, ROWS>(xb, p.sxh, p.H, valid, r, c8, h0, own, &rows[0][0][0]);
    const uint32_t* staged = reinterpret_cast<const uint32_t*>(&rows[0][r][0]);  // pair words of row r, head u = 0
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int h = h0 + u;
      if (h >= p.H) continue;  // (the same for the whole CTA)
      float y[8];
      roperows::rotate8<T>(own[u], staged + (size_t)u * ROWS * (D / 2), cf, partner, y);
      if (HADAMARD) {
#pragma unroll
        for (int j = 0; j < 8; ++j) y[j] = roperows::round_to<T>(y[j]);
        roperows::fwht8<D>(y);
      }
      if (!valid) continue;
      uint32_t res[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) res[i] = pack2<T>(y[2 * i], y[2 * i + 1]);
      *reinterpret_cast<uint4*>(ob + 2 * (size_t)h * p.soh) = make_uint4(res[0], res[1], res[2], res[3]);
    }
  }
}

template <typename T, int D>
void launch_dim(const RopeTableParams& p, dim3 grid, cudaStream_t stream) {
  if (p.hadamard)
    generalized_rope_kernel<T, D, true><<<grid, kThreads, 0, stream>>>(p);
  else
    generalized_rope_kernel<T, D, false><<<grid, kThreads, 0, stream>>>(p);
}

template <typename T>
cudaError_t launch_typed(const RopeTableParams& p, cudaStream_t stream) {
  const int tpr = p.D / 8, rows = kThreads / tpr;
  const dim3 grid((unsigned)((p.N + rows - 1) / rows), (unsigned)p.B);
  if (p.N <= 0 || p.B <= 0 || p.H <= 0) return cudaSuccess;
  if (p.D == 128) {
    launch_dim<T, 128>(p, grid, stream);
  } else if (p.D == 64) {
    launch_dim<T, 64>(p, grid, stream);
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
