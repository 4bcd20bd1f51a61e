// RoPE·R arithmetic of one token row, shared by the RoPE·R pass (rope_table.cu) and the int8-fp8 pre-processing
// that applies it itself (preprocess_int8fp8.cu), so that both produce the same bits:
//   y[c] = fma(c3, x[p + 1], fma(c2, x[p], fma(c0, x[e], c1 x[e + 1]))),   (c0..c3) = coef[n, c, 0..3],
// e the even channel of c's RoPE pair, p that of its partner pair (index[c] = (e, e + 1, p, p + 1)); float32, rounded
// once to the input's dtype by the caller. A thread owns 8 consecutive output channels (one 16-byte chunk) of a row.
// The full rotation adds fwht8 on the row rounded to that dtype (rotvid.rope.hadamard.fwht's bits). The online V/O
// Hadamard (the int8-fp8 pre-processing's V, hadamard_rows.cu's O; rowmath::unrotate_tile_rows and
// hopper::unrotate_warp_row, the int8-fp8 epilogue's, on other layouts) runs the same butterflies (wht8, or wht4lanes:
// the same operations on a row held by 4 lanes) with a power of two.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace rotvid {
namespace roperows {

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

// x rounded to T and read back as float (what a pass that stores T and a later one that loads it see)
template <typename T>
__device__ __forceinline__ float round_to(float x);
template <>
__device__ __forceinline__ float round_to<__half>(float x) { return __half2float(__float2half_rn(x)); }
template <>
__device__ __forceinline__ float round_to<__nv_bfloat16>(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// this thread's output channels 8 c8 + j of token n: their four coefficients and the partner pair's index (p / 2)
template <int D>
__device__ __forceinline__ void load_coefs(const float* coef, const int* index, int n, bool valid, int c8,
                                           float (&cf)[8][4], int (&partner)[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float4 f = valid ? *reinterpret_cast<const float4*>(coef + ((size_t)n * D + c8 * 8 + j) * 4)
                           : make_float4(0.f, 0.f, 0.f, 0.f);
    cf[j][0] = f.x;
    cf[j][1] = f.y;
    cf[j][2] = f.z;
    cf[j][3] = f.w;
    partner[j] = index[(c8 * 8 + j) * 4 + 2] >> 1;
  }
}

// One step of U heads of a CTA's token rows: the thread's 16-byte chunk of its row r for heads h0 .. h0 + U - 1 (zeros
// past H or for a row past N) into `own`, U loads in flight, then staged in shared memory as stage[(u ROWS + r) TPR +
// c8] so that rotate8 can read any partner pair of the row. `chunk`: the thread's chunk of head 0 (x + 2 (b sxb + n sxn
// + 8 c8) bytes), sxh the head stride in elements.
template <int D, int U, int ROWS>
__device__ __forceinline__ void load_and_stage(const char* chunk, long long sxh, int H, bool valid, int r, int c8,
                                               int h0, uint4 (&own)[U], uint4* stage) {
  constexpr int TPR = D / 8;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int h = h0 + u;
    own[u] = valid && h < H ? *reinterpret_cast<const uint4*>(chunk + 2 * (size_t)h * sxh) : make_uint4(0u, 0u, 0u, 0u);
  }
  __syncthreads();  // the previous step's rows are read
#pragma unroll
  for (int u = 0; u < U; ++u) stage[(u * ROWS + r) * TPR + c8] = own[u];
  __syncthreads();
}

// y[j] (float32, not yet rounded) of the thread's 8 channels: `own` its 16-byte input chunk (pair word i = channels
// 8 c8 + 2i, + 1), `staged` the pair words of the whole row (any partner pair)
template <typename T>
__device__ __forceinline__ void rotate8(const uint4& own, const uint32_t* staged, const float (&cf)[8][4],
                                        const int (&partner)[8], float (&y)[8]) {
  const uint32_t ow[4] = {own.x, own.y, own.z, own.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int j = 2 * i + s;
      const uint32_t pw = staged[partner[j]];
      float acc = __fmaf_rn(cf[j][0], half_of<T>(ow[i], 0), __fmul_rn(cf[j][1], half_of<T>(ow[i], 1)));
      acc = __fmaf_rn(cf[j][2], half_of<T>(pw, 0), acc);
      acc = __fmaf_rn(cf[j][3], half_of<T>(pw, 1), acc);
      y[j] = acc;
    }
  }
}

// The unnormalized Walsh-Hadamard transform of a row of D channels, held 8 per thread (channels 8 c8 + j) by the
// TPR = D / 8 consecutive lanes c8 = lane % TPR, in rotvid.rope.hadamard.fwht's order: stage s = 0, 1, ... maps
// channels i and i + 2^s (bit s of i clear) to (a + b, a - b) -- stages 0-2 inside the thread, the others (channel bit
// 3 + t = lane bit t) across lanes by shuffles. Every lane of the warp calls it (full-mask shuffles): a caller masks
// the loads of rows it does not own instead of skipping the call.
template <int D>
__device__ __forceinline__ void wht8(float (&y)[8]) {
  static_assert(D == 64 || D == 128, "wht8: head_dim 64 or 128");
  constexpr int TPR = D / 8;
#pragma unroll
  for (int h = 1; h < 8; h *= 2) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (j & h) continue;
      const float a = y[j], b = y[j + h];
      y[j] = __fadd_rn(a, b);
      y[j + h] = __fsub_rn(a, b);
    }
  }
  const int c8 = threadIdx.x % TPR;
#pragma unroll
  for (int m = 1; m < TPR; m *= 2) {
    const bool upper = (c8 & m) != 0;  // this lane holds the b's of the stage
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float other = __shfl_xor_sync(0xffffffffu, y[j], m);
      y[j] = upper ? __fsub_rn(other, y[j]) : __fadd_rn(y[j], other);
    }
  }
}

// The same transform with 4 lanes per row, for callers that want fewer shuffle stages (2 instead of wht8's 4 at
// D = 128, 3 at 64): the row is held by the 4 consecutive lanes 4 r .. 4 r + 3, lane c = lane % 4 holding the
// 16-byte chunks c + 4 i (i < D / 32) as y[8 i + e] = channel 8 (c + 4 i) + e. Channel bits 0-2 are e (inside the
// thread), bits 3-4 are c (across the 4 lanes, shuffles xor 1 and 2), bits 5-6 are i (inside the thread again). The
// stages run in wht8's order s = 0, 1, ... and every stage computes, for each pair of channels (a the one with bit s
// clear, b its partner), __fadd_rn(a, b) into a's channel and __fsub_rn(a, b) into b's -- wht8's operations with
// wht8's operands (across the lanes as one fma by +-1: fma(-1, b, a) and fma(1, a, b) round a - b and a + b once,
// the same bits, one instruction instead of an add, a subtract and a select). By induction over s each channel holds
// after stage s the bits it holds in wht8 after stage s: only which thread holds it differs, so the result (and
// anything computed per channel from it) is wht8's bit for bit. Every lane of the warp calls it (full-mask shuffles).
template <int D>
__device__ __forceinline__ void wht4lanes(float (&y)[D / 4]) {
  static_assert(D == 64 || D == 128, "wht4lanes: head_dim 64 or 128");
  constexpr int V = D / 4;  // values per lane
  // stages 0-2: channel bits 0-2 = bits 0-2 of the index into y
#pragma unroll
  for (int h = 1; h < 8; h *= 2) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (j & h) continue;
      const float a = y[j], b = y[j + h];
      y[j] = __fadd_rn(a, b);
      y[j + h] = __fsub_rn(a, b);
    }
  }
  // stages 3-4: channel bits 3-4 = lane bits 0-1
  const int c = threadIdx.x % 4;
#pragma unroll
  for (int m = 1; m < 4; m *= 2) {
    const float sign = (c & m) != 0 ? -1.f : 1.f;  // -1: this lane holds the b's of the stage (a - b = fma(-1, b, a))
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float other = __shfl_xor_sync(0xffffffffu, y[j], m);
      y[j] = __fmaf_rn(sign, y[j], other);
    }
  }
  // stages 5 (and 6 at D = 128): channel bits 5-6 = bits 3-4 of the index into y
#pragma unroll
  for (int h = 8; h < V; h *= 2) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (j & h) continue;
      const float a = y[j], b = y[j + h];
      y[j] = __fadd_rn(a, b);
      y[j + h] = __fsub_rn(a, b);
    }
  }
}

// The normalized transform (the full rotation's; rotvid.rope.hadamard.fwht): wht8, then one multiply by D^-1/2
// rounded to float32.
template <int D>
__device__ __forceinline__ void fwht8(float (&y)[8]) {
  wht8<D>(y);
  constexpr float kScale = D == 64 ? 0.125f : 0.08838834764831845f;  // D^-1/2 rounded to float32
#pragma unroll
  for (int j = 0; j < 8; ++j) y[j] = __fmul_rn(y[j], kScale);
}

// The online V/O Hadamard with block = D (rotvid.rope.hadamard.rotate_v_online / unrotate_o_online): wht8, then the
// exact power of two 2^-ceil(k/2) for V (kVoScaleV) or 2^-floor(k/2) for O (kVoScaleO), D = 2^k, so that the pair is
// the identity; the caller rounds once to the tensor's dtype (vo_hadamard8, vo_hadamard_chunk).
template <int D>
constexpr float kVoScaleV = D == 64 ? 0.125f : 0.0625f;
template <int D>
constexpr float kVoScaleO = 0.125f;

// y = T(wht(y) * scale) read back as float (what the torch path rounds to and a later pass would load)
template <typename T, int D>
__device__ __forceinline__ void vo_hadamard8(float (&y)[8], float scale) {
  wht8<D>(y);
#pragma unroll
  for (int j = 0; j < 8; ++j) y[j] = round_to<T>(__fmul_rn(y[j], scale));
}

// The same on the thread's 16-byte chunk of 8 T values: T(wht(x) * scale), packed back (one rounding, in the pack)
template <typename T, int D>
__device__ __forceinline__ uint4 vo_hadamard_chunk(const uint4& raw, float scale) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  float y[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    y[2 * i] = half_of<T>(w[i], 0);
    y[2 * i + 1] = half_of<T>(w[i], 1);
  }
  wht8<D>(y);
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) o[i] = pack2<T>(__fmul_rn(y[2 * i], scale), __fmul_rn(y[2 * i + 1], scale));
  return make_uint4(o[0], o[1], o[2], o[3]);
}

}  // namespace roperows
}  // namespace rotvid
