// The per-row arithmetic shared by the mma.sync and wgmma INT4 attention kernels (so that both compute
// the same output bits). Register layout of one thread: rows g and g+8 of its warp's 16-row slice
// (index r = 0, 1), columns 8j + 2t and 8j + 2t + 1 of n-tile j (the mma accumulator layout).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/attention_params.cuh"

namespace rotvid {
namespace rowmath {

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// log2(448): 448 p = exp2(x - (m - log2 448)) forms the FP8 e4m3 levels of p in one ex2 (int8-fp8 recipe).
constexpr float kLog2Fp8Max = 8.807354922057604f;
constexpr float kLn2 = 0.6931471805599453f;

// The natural-log LSE of a row from the online softmax's state: the scores x are in the log2 domain (x = S sq ks,
// sq = q_scale * sm_scale * log2 e) and l = sum_j L 2^(x_j - m) in units of 1/L (log2_unit = log2 L), whatever the
// lazily moved reference m is, so sum_j exp(sm_scale q.k_j) = sum_j 2^(x_j) = (l / L) 2^m and
//   lse = ln 2 * (m + log2(l) - log2 L);   -inf where l = 0 (a row that attended no key).
// (log2f, not ex2.approx's inverse: one call per row.)
__device__ __forceinline__ float row_lse(float m, float l, float log2_unit) {
  return l > 0.f ? (m + log2f(l) - log2_unit) * kLn2 : -INFINITY;
}

// Four floats -> four e4m3 bytes (round to nearest even, saturating at 448): byte i = e4m3(fi). sm89+ (cvt e4m3x2).
__device__ __forceinline__ uint32_t pack_e4m3x4(float f0, float f1, float f2, float f3) {
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(f1), "f"(f0));  // f0 in the low byte
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(f3), "f"(f2));
  uint32_t w;
  asm("mov.b32 %0, {%1, %2};\n" : "=r"(w) : "h"(lo), "h"(hi));
  return w;
}

// Low bytes of four words -> one word (byte i = low byte of wi).
__device__ __forceinline__ uint32_t pack_low_bytes(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  uint32_t lo = __byte_perm(w0, w1, 0x0040);
  uint32_t hi = __byte_perm(w2, w3, 0x0040);
  return __byte_perm(lo, hi, 0x5410);
}

// Row maxima of the block's scores x (NT n-tiles) across the 4 threads of a row: four independent chains
// (max is exact in any order), then the quad shuffles.
template <int NT>
__device__ __forceinline__ void block_row_max(const float (&x)[NT][4], float (&xmax)[2]) {
  float xm[4][2];
#pragma unroll
  for (int i = 0; i < 4; ++i) xm[i][0] = xm[i][1] = -INFINITY;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    xm[j & 3][0] = fmaxf(xm[j & 3][0], fmaxf(x[j][0], x[j][1]));
    xm[j & 3][1] = fmaxf(xm[j & 3][1], fmaxf(x[j][2], x[j][3]));
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    xmax[r] = fmaxf(fmaxf(xm[0][r], xm[1][r]), fmaxf(xm[2][r], xm[3][r]));
    xmax[r] = fmaxf(xmax[r], __shfl_xor_sync(0xffffffffu, xmax[r], 1));
    xmax[r] = fmaxf(xmax[r], __shfl_xor_sync(0xffffffffu, xmax[r], 2));
  }
}

// Online combine with a lazily moved reference max m_run (FA4-style): O and l are rescaled only when a
// block max exceeds m_run by more than 2^8, so c = exp2(m_blk - m_run) <= 256. Exact in real arithmetic
// (the factor cancels in O / l); P depends on m_blk only. Returns the block factors c in c_fac.
template <int DT>
__device__ __forceinline__ void online_combine(const float (&mblk)[2], float (&m_run)[2], float (&l_run)[2],
                                               float (&o)[DT][4], float (&c_fac)[2]) {
  if (__any_sync(0xffffffffu, (mblk[0] > m_run[0] + 8.f) || (mblk[1] > m_run[1] + 8.f))) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m_run[r], mblk[r]);
      const float a = ex2(m_run[r] - m_new);
      m_run[r] = m_new;
      l_run[r] *= a;
#pragma unroll
      for (int j = 0; j < DT; ++j) {
        o[j][2 * r] *= a;
        o[j][2 * r + 1] *= a;
      }
    }
  }
  c_fac[0] = ex2(mblk[0] - m_run[0]);
  c_fac[1] = ex2(mblk[1] - m_run[1]);
}

// l = l + c * rowsum(P^) of the block (this thread's share, an exact integer): l and O are both kept in units
// of P^ (the 1/15 or 1/7 of the P levels cancels in O / l), and normalizing by the quantized row sum makes the
// output a convex combination of the dequantized V rows.
__device__ __forceinline__ void add_row_counts(const uint32_t (&p_sum)[2], const float (&c_fac)[2], float (&l_run)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) l_run[r] = fmaf(c_fac[r], __uint2float_rn(p_sum[r]), l_run[r]);
}

// Output columns d, d+1 of one row (element offset `off`): y (+ v_mean) as an fp16 / bf16 pair.
__device__ __forceinline__ void store_pair(const AttnParams& p, size_t off, int d, float y0, float y1,
                                           const float* vm) {
  if (vm != nullptr) {
    y0 += vm[d];
    y1 += vm[d + 1];
  }
  if (p.out_bf16) {
    *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p.out) + off + d) = __floats2bfloat162_rn(y0, y1);
  } else {
    *reinterpret_cast<__half2*>(static_cast<__half*>(p.out) + off + d) = __floats2half2_rn(y0, y1);
  }
}

// Epilogue: O / l (+ v_mean) for rows row0 + g (+ 8), written as fp16 / bf16 pairs (rows >= Nq skipped).
template <int D>
__device__ __forceinline__ void store_rows(const AttnParams& p, float (&o)[D / 8][4], float (&l_run)[2], int row0,
                                           int g, int t, int b, int h) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  const float* vm = p.v_mean != nullptr ? p.v_mean + ((size_t)b * p.H + h) * D : nullptr;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + g + 8 * r;
    if (row >= p.Nq) continue;
    const size_t off = (size_t)b * p.out_sb + (size_t)h * p.out_sh + (size_t)row * p.out_sn;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      store_pair(p, off, 8 * j + 2 * t, o[j][2 * r] / l_run[r], o[j][2 * r + 1] / l_run[r], vm);
    }
  }
}

// The LSE of rows row0 + g (+ 8) into p.lse [B, H, Nq] (row_lse; l_run already summed over the row's 4 threads, as
// the store_rows* epilogues leave it), one thread per row; rows >= Nq skipped.
__device__ __forceinline__ void store_lse_rows(const AttnParams& p, const float (&m_run)[2], const float (&l_run)[2],
                                               int row0, int g, int t, int b, int h, float log2_unit) {
  if (t != 0) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + g + 8 * r;
    if (row >= p.Nq) continue;
    p.lse[((size_t)b * p.H + h) * p.Nq + row] = row_lse(m_run[r], l_run[r], log2_unit);
  }
}

// Epilogue of a tile that attends to no key (a block map keeps none of its blocks before kv_len): 0 for rows
// row0 + g (+ 8), without the V mean (l = 0 there; the reference's empty rows); rows >= Nq skipped.
template <int D>
__device__ __forceinline__ void store_zero_rows(const AttnParams& p, int row0, int g, int t, int b, int h) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + g + 8 * r;
    if (row >= p.Nq) continue;
    const size_t off = (size_t)b * p.out_sb + (size_t)h * p.out_sh + (size_t)row * p.out_sn;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) store_pair(p, off, 8 * j + 2 * t, 0.f, 0.f, nullptr);
  }
}

// The online V/O Hadamard's inverse (AttnParams.o_hadamard) on the rows of an accumulator-layout tile: y[j][2r + e] is
// column 8j + 2t + e of the thread's row r (t = lane % 4: the mma / wgmma accumulator fragment, whose row is shared by
// the 4 lanes of a quad). The butterflies of rotvid.rope.hadamard.fwht in its order -- stage s maps columns i and i +
// 2^s (bit s of i clear) to (a + b, a - b) -- with column bit 0 in the thread (e), bits 1-2 across the quad (shuffles
// xor 1, 2; one fma by +-1 per value: the lane holding b computes -b + a, rounded once like a - b) and bits 3.. in the
// thread (j). The exact power of two kVoScaleOut (2^-3 = 2^-floor(k/2) for D = 2^k, 64 or 128: with the
// pre-processing's 2^-ceil(k/2) on V the pair is the identity) is the caller's, applied to the inputs: scaling by a
// power of two commutes with every rounding here (normal floats), so the result has the bits of transform-then-scale
// without a multiply per value. Every lane calls it (full-mask shuffles), rows past Nq too.
constexpr float kVoScaleOut = 0.125f;

template <int D>
__device__ __forceinline__ void unrotate_tile_rows(float (&y)[D / 8][4], int t) {
  static_assert(D == 64 || D == 128, "the online V/O Hadamard: head_dim 64 or 128");
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {  // stage 0: the thread's column pairs
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float a = y[j][2 * r], b = y[j][2 * r + 1];
      y[j][2 * r] = __fadd_rn(a, b);
      y[j][2 * r + 1] = __fsub_rn(a, b);
    }
  }
#pragma unroll
  for (int m = 1; m < 4; m *= 2) {  // stages 1-2: across the quad
    const float sign = (t & m) != 0 ? -1.f : 1.f;  // -1: this lane holds the b's of the stage (a - b = fma(-1, b, a))
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float other = __shfl_xor_sync(0xffffffffu, y[j][e], m);
        y[j][e] = __fmaf_rn(sign, y[j][e], other);
      }
    }
  }
#pragma unroll
  for (int hj = 1; hj < D / 8; hj *= 2) {  // stages 3..: across the thread's n-tiles
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      if (j & hj) continue;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float a = y[j][e], b = y[j + hj][e];
        y[j][e] = __fadd_rn(a, b);
        y[j + hj][e] = __fsub_rn(a, b);
      }
    }
  }
}

// Epilogue of the int8-fp8 kernels: out = O / l * v_scale (+ v_mean) for rows row0 + g (+ 8), v_scale per channel in
// p.vparams [BH, D] (it factors out of the sum over keys, so it is applied once here); rows >= Nq skipped.
template <int D>
__device__ __forceinline__ void store_rows_channel_scaled(const AttnParams& p, const float (&o)[D / 8][4],
                                                          float (&l_run)[2], int row0, int g, int t, int b, int h) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  const size_t bh = (size_t)b * p.H + h;
  const float* vs = p.vparams + bh * D;
  const float* vm = p.v_mean != nullptr ? p.v_mean + bh * D : nullptr;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + g + 8 * r;
    if (row >= p.Nq) continue;
    const float inv_l = 1.f / l_run[r];
    const size_t off = (size_t)b * p.out_sb + (size_t)h * p.out_sh + (size_t)row * p.out_sn;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int d = 8 * j + 2 * t;
      const float2 sc = *reinterpret_cast<const float2*>(vs + d);
      store_pair(p, off, d, o[j][2 * r] * inv_l * sc.x, o[j][2 * r + 1] * inv_l * sc.y, vm);
    }
  }
}

// The same rows un-rotated (the online V/O Hadamard's inverse, AttnParams.o_hadamard): unrotate_tile_rows on the
// float32 values O / l * v_scale (+ v_mean), kVoScaleOut folded into 1 / l and v_mean, then one rounding; rows >= Nq
// skipped (after the transform, which every lane runs).
template <int D>
__device__ __forceinline__ void store_rows_channel_scaled_unrotated(const AttnParams& p, const float (&o)[D / 8][4],
                                                                    float (&l_run)[2], int row0, int g, int t, int b,
                                                                    int h) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
  }
  const size_t bh = (size_t)b * p.H + h;
  const float* vs = p.vparams + bh * D;
  const float* vm = p.v_mean != nullptr ? p.v_mean + bh * D : nullptr;
  float y[D / 8][4];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float inv_l = __fmul_rn(1.f / l_run[r], kVoScaleOut);  // unrotate_tile_rows' scale, once per row
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int d = 8 * j + 2 * t;
      const float2 sc = *reinterpret_cast<const float2*>(vs + d);
      float y0 = o[j][2 * r] * inv_l * sc.x, y1 = o[j][2 * r + 1] * inv_l * sc.y;
      if (vm != nullptr) {
        y0 += vm[d] * kVoScaleOut;
        y1 += vm[d + 1] * kVoScaleOut;
      }
      y[j][2 * r] = y0;
      y[j][2 * r + 1] = y1;
    }
  }
  unrotate_tile_rows<D>(y, t);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + g + 8 * r;
    if (row >= p.Nq) continue;
    const size_t off = (size_t)b * p.out_sb + (size_t)h * p.out_sh + (size_t)row * p.out_sn;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) store_pair(p, off, 8 * j + 2 * t, y[j][2 * r], y[j][2 * r + 1], nullptr);
  }
}

// The tail split's partials of one thread's rows (row_in_tile: row g of its warp's slice within the 128-row tile):
// O (times the per-channel vs when given: the int8-fp8 kernel's V scale) relative to m_run, then m_run and the
// quad-summed l, at ws[row][0..D+1] (hopper::combine_splits_kernel merges them).
template <int D>
__device__ __forceinline__ void store_split_partials(float* w, const float (&o)[D / 8][4], const float (&m_run)[2],
                                                     float (&l_run)[2], int row_in_tile, int t, const float* vs) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
    l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    float* wr = w + (size_t)(row_in_tile + 8 * r) * (D + 2);
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const int d = 8 * j + 2 * t;
      const float2 sc = vs != nullptr ? *reinterpret_cast<const float2*>(vs + d) : make_float2(1.f, 1.f);
      *reinterpret_cast<float2*>(wr + d) = make_float2(o[j][2 * r] * sc.x, o[j][2 * r + 1] * sc.y);
    }
    if (t == 0) *reinterpret_cast<float2*>(wr + D) = make_float2(m_run[r], l_run[r]);
  }
}

}  // namespace rowmath
}  // namespace rotvid
