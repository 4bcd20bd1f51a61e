// Per-token INT4 quantization of one row chunk, shared by the INT4 pre-processing's row kernel (preprocess_int4.cu)
// and the one that applies RoPE·R first (preprocess_int4_rope.cu), so that both produce the same bits. A row of D
// channels is held 8 per thread by TPR = D / 8 consecutive lanes (c8 = lane % TPR); every lane of the warp calls the
// shuffles (full mask).
#pragma once
#include <cstdint>

namespace rotvid {
namespace int4rows {

template <int QMAX = 7>
__device__ __forceinline__ int quant7(float x, float inv) {
  int v = __float2int_rn(x * inv);
  return max(-QMAX, min(QMAX, v));
}

// sum over the TPR consecutive lanes holding one row (xor butterfly) / max over them
template <int TPR>
__device__ __forceinline__ float row_sum(float a) {
#pragma unroll
  for (int o = TPR / 2; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
  return a;
}
template <int TPR>
__device__ __forceinline__ float row_max(float a) {
#pragma unroll
  for (int o = TPR / 2; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  return a;
}

// Q smoothing's ΔS of one row, q_mean . k_s in float32, summed in a fixed order (the bias's bits): the D channels as
// 32 runs of D / 32 (fmaf chains), the runs added by the xor butterfly over 32 run indices, highest distance first.
// A thread holds G = 8 / (D / 32) runs: distances G .. 16 cross threads (lane distance / G), 1 .. G / 2 are its own.
template <int D>
__device__ __forceinline__ float row_dot(const float (&qm)[8], const float (&v)[8]) {
  constexpr int RUN = D / 32, G = 8 / RUN;
  float s[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    s[g] = 0.f;
#pragma unroll
    for (int i = g * RUN; i < (g + 1) * RUN; ++i) s[g] = fmaf(qm[i], v[i], s[g]);
    s[g] = row_sum<D / 8>(s[g]);
  }
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) {
#pragma unroll
    for (int g = 0; g < o; ++g) s[g] = s[g] + s[g + o];  // run g's partner at distance o is g ^ o = g + o
  }
  return s[0];
}

// The levels qv of the thread's 8 values v (already centred, zero on a dead row) on the symmetric grid of QMAX per
// row, and the row's scale amax / QMAX (0 and zero levels for an all-zero row).
template <int D, int QMAX>
__device__ __forceinline__ float quant_row8(const float (&v)[8], int (&qv)[8]) {
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
  amax = row_max<D / 8>(amax);
#pragma unroll
  for (int j = 0; j < 8; ++j) qv[j] = 0;
  if (amax == 0.f) return 0.f;
  const float inv = __fdiv_rn((float)QMAX, amax);
#pragma unroll
  for (int j = 0; j < 8; ++j) qv[j] = quant7<QMAX>(v[j], inv);
  return __fdiv_rn(amax, (float)QMAX);
}

// The thread's 8 levels into the kernel row layout at `row_out` (the row's first byte): s8 one byte each (8 bytes at
// 8 c8), s4 two per byte, element 2c in the low nibble of byte c (4 bytes at 4 c8)
template <bool S4>
__device__ __forceinline__ void store_row8(int8_t* row_out, int c8, const int (&qv)[8]) {
  if constexpr (!S4) {
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j / 4] |= (uint32_t)(qv[j] & 0xFF) << (8 * (j % 4));
    *reinterpret_cast<uint2*>(row_out + c8 * 8) = make_uint2(w[0], w[1]);
  } else {
    uint32_t w = 0u;
#pragma unroll
    for (int j = 0; j < 8; ++j) w |= (uint32_t)(qv[j] & 0xF) << (4 * j);
    *reinterpret_cast<uint32_t*>(row_out + c8 * 4) = w;
  }
}

}  // namespace int4rows
}  // namespace rotvid
