// The int8-fp8 numerics of the Hopper attention kernel (hopper_attention.cuh): a numerics policy. INT8 Q/K per
// token, P and V in FP8 e4m3 (V one scale per channel), FP32 accumulation across key blocks. Numerics of
// rotvid.kernels.reference (recipe "int8-fp8"), per key block of BN = 128 keys (the block max is part of the
// numerics):
//   S = Q^ K^T (s8 wgmma, int32, exact; K^ with one scale ks per group of 32 keys -- the keys one thread holds),
//   m_blk = max over the row of float(S) * (sq ks) (sq = q_scale * qk_scale; the max taken on the integers),
//   P8 = e4m3(448 * exp2(float(S) sq ks - m_blk)) -- computed as ex2(x sq - (m_blk - log2 448)), so 448 is exact in
//   real arithmetic and within an ulp in float; with MAGIC without the I2F, see below --, pv = P8 V8 (e4m3 wgmma, a
//   fresh FP32 accumulator per block), l_blk = rowsum of the same 448 p in fp32 (the unquantized p, as the
//   reference), then O = O a + c pv, l = l a + c l_blk (lazy reference max, rowmath::online_combine), and at the end
//   out = O / l * v_scale (+ v_mean): the 448 cancels in O / l and the per-channel V scale factors out of the sum
//   over keys, so neither is applied per block (one FFMA per O element and block).
// The log-sum-exp (p.lse set; RETURNS_LSE): l = sum_j 448 2^(x_j - m) with x_j = float(S_j) sq ks the log2-domain
//   score (m the lazy reference max: any value, l is relative to it), so ln sum_j exp(sm_scale q^.k^_j) =
//   ln 2 (m + log2(l) - log2 448) -- rowmath::row_lse with LSE_LOG2_UNIT = log2 448, in the epilogue and in the
//   tail split's combine (whose merged l is relative to the splits' largest m). It is the LSE of the smoothed K^'s
//   scores: the Python side adds K smoothing's shift sm_scale q.mean(k) (rotvid/kernels/recipes/int8_fp8_ops.py).
//   With MAGIC the exponent's folded constant is rounded once per row and block: l moves by the same relative
//   ~1e-5 (log2 units) as the P levels; the LSE by as much.
// V8^T keys are permuted per 32 exactly as the s8 layout (attention_params.cuh), so that the S accumulator layout is
// the e4m3 A-fragment layout.
#pragma once
#include <cuda.h>

#include <climits>

#include "common/attention_params.cuh"
#include "common/rowmath.cuh"
#include "hopper/sm90_ops.cuh"

namespace rotvid {
namespace hopper {

// MAGIC false: I2F of the int32 score (a conversion: quarter rate). MAGIC true: the QK^T accumulator starts at
// kMagicI, whose bits as a float read 1.5 * 2^23 + S (exact for |S| < 2^22; |S| <= 127^2 * 128), and the offset is
// folded into the exponent's constant: x = (1.5 * 2^23 + S) * sq ks - (1.5 * 2^23 sq ks + m_blk - log2 448) in one
// FFMA, no conversion. The folded constant is rounded once per row and block: x moves by at most half an ulp of
// 1.5 * 2^23 sq ks (~1e-5 in log2 units at typical scales), the same for every score of the row in the block.
template <int D_, bool MAGIC>
struct Int8Fp8Numerics {
  static constexpr int D = D_;
  static constexpr bool TILE_COUNT_ROUNDED_UP = true;  // the tile decode's code form (hopper_attention.cuh)
  static constexpr int BN = 128;
  static constexpr bool S_STARTS_AT_MAGIC = MAGIC;
  static constexpr bool RETURNS_LSE = true;                      // p.lse honoured (hopper_attention.cuh)
  static constexpr float LSE_LOG2_UNIT = rowmath::kLog2Fp8Max;  // l counts 448 p

  // What each stage holds besides the K^ / V8^T tiles: the block's four K group scales. [KS0][KS1]...
  static constexpr int KS_BYTES = 16;
  static constexpr uint32_t STAGE_SMALL_TX = KS_BYTES;
  static constexpr int small_bytes(int st) { return st * KS_BYTES; }

  // Producer (one thread): the block's K group scales into stage s, after its K^ and V8^T copies.
  struct StageLoads {
    const float* ksg;
    __device__ __forceinline__ StageLoads(const AttnParams& p, int bh)
        : ksg(p.k_scale + (size_t)bh * (p.Nkv_pad / 128) * 4) {}
    template <int ST>
    __device__ __forceinline__ void issue(uint32_t small, int s, int blk, uint32_t bar) const {
      sm90::bulk_load(small + s * KS_BYTES, ksg + (size_t)blk * 4, KS_BYTES, bar);
    }
  };

  // Consumer state of one thread: rows g, g + 8 of its warp's 16 (index r), columns 8j + 2t, 8j + 2t + 1 of
  // n-tile j (the accumulator layout). Thread t holds the keys of K group t, so one scale ks multiplies all its
  // scores: the row max is taken on the exact integers (masked keys excluded), the scores enter the exponent as
  // float(S) * (sq ks) in one FFMA.
  struct Rows {
    static constexpr int NT = BN / 8;  // score n-tiles
    float sq[2];   // q_scale * qk_scale of the rows
    float sqk[2];  // sq * this thread's K group scale, for the block in flight

    __device__ __forceinline__ Rows(const AttnParams& p, int bh, int row_base, int g) {
      // (rows past Nq_pad: scale 0. The launcher's Nq_pad % 128 == 0 leaves none, but this form is the measured
      // kernel's code: without it ptxas schedules the loop differently -- benchmarks/kernel_ptx_diff.py)
      sq[0] = row_base + g < p.Nq_pad ? p.q_scale[(size_t)bh * p.Nq_pad + row_base + g] * p.qk_scale : 0.f;
      sq[1] = row_base + g + 8 < p.Nq_pad ? p.q_scale[(size_t)bh * p.Nq_pad + row_base + g + 8] * p.qk_scale : 0.f;
    }

    // Block row maxima m_blk of key block blk in stage s; PARTIAL: keys >= kv_len masked.
    template <int ST, bool PARTIAL>
    __device__ __forceinline__ void block_max(const uint32_t (&sacc)[BN / 2], const unsigned char* smem,
                                              int small_off, int s, int blk, int kv_len, int t,
                                              float (&mblk)[2]) {
      float xmr[2] = {-INFINITY, -INFINITY};
      const float ks = reinterpret_cast<const float*>(smem + (small_off + s * KS_BYTES))[t];
      int mi[4][2];  // four independent max chains per row
#pragma unroll
      for (int i = 0; i < 4; ++i) mi[i][0] = mi[i][1] = INT_MIN;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        int a[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) a[e] = (int)sacc[4 * j + e];
        if constexpr (PARTIAL) {
          const int key = blk * BN + 8 * j + 2 * t;
          if (key >= kv_len) a[0] = a[2] = INT_MIN;
          if (key + 1 >= kv_len) a[1] = a[3] = INT_MIN;
        }
        mi[j & 3][0] = max(mi[j & 3][0], max(a[0], a[1]));
        mi[j & 3][1] = max(mi[j & 3][1], max(a[2], a[3]));
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        sqk[r] = sq[r] * ks;
        const int m = max(max(mi[0][r], mi[1][r]), max(mi[2][r], mi[3][r]));
        // (a thread whose keys are all masked offers -inf; a valid key is in every block)
        const float xm = m == INT_MIN ? -INFINITY : __int2float_rn(MAGIC ? m - kMagicI : m) * sqk[r];
        xmr[r] = fmaxf(xmr[r], xm);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float xm = xmr[r];
        xm = fmaxf(xm, __shfl_xor_sync(0xffffffffu, xm, 1));
        xm = fmaxf(xm, __shfl_xor_sync(0xffffffffu, xm, 2));
        mblk[r] = xm;
      }
    }

    // 448 p as e4m3 A fragments (rows g / g+8 in the accumulator's key order), and l = l + c rowsum(448 p) (fp32,
    // the unquantized p).
    template <bool PARTIAL>
    __device__ __forceinline__ void p_fragments(const uint32_t (&sacc)[BN / 2], const float (&mblk)[2], int blk,
                                                int kv_len, int t, const float (&c_fac)[2],
                                                uint32_t (&pf)[BN / 32][4], float (&l_run)[2]) {
      float mshift[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mshift[r] = mblk[r] - rowmath::kLog2Fp8Max;
        if constexpr (MAGIC) mshift[r] = fmaf(kMagicF, sqk[r], mshift[r]);
      }
      float ls[2][2] = {{0.f, 0.f}, {0.f, 0.f}};  // two partial sums per row
#pragma unroll
      for (int k = 0; k < BN / 32; ++k) {
        float pe[4][4];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const int j = 4 * k + jj;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e >> 1;
            const uint32_t raw = sacc[4 * j + e];
            const float sf = MAGIC ? __uint_as_float(raw) : __int2float_rn((int)raw);
            float v = rowmath::ex2(fmaf(sf, sqk[r], -mshift[r]));
            if constexpr (PARTIAL) {
              const int key = blk * BN + 8 * j + 2 * t + (e & 1);
              if (key >= kv_len) v = 0.f;
            }
            pe[jj][e] = v;
            ls[r][jj & 1] += v;
          }
        }
        auto& f = pf[k];
        f[0] = rowmath::pack_e4m3x4(pe[0][0], pe[0][1], pe[1][0], pe[1][1]);
        f[1] = rowmath::pack_e4m3x4(pe[0][2], pe[0][3], pe[1][2], pe[1][3]);
        f[2] = rowmath::pack_e4m3x4(pe[2][0], pe[2][1], pe[3][0], pe[3][1]);
        f[3] = rowmath::pack_e4m3x4(pe[2][2], pe[2][3], pe[3][2], pe[3][3]);
      }
      l_run[0] = fmaf(c_fac[0], ls[0][0] + ls[0][1], l_run[0]);
      l_run[1] = fmaf(c_fac[1], ls[1][0] + ls[1][1], l_run[1]);
    }

    // O = O + c pv (the V scale is applied once, in the epilogue)
    template <int ST>
    __device__ __forceinline__ void update_o(float (&o)[D / 8][4], const float (&pacc)[D / 2],
                                             const float (&c_fac)[2], const unsigned char*, int, int,
                                             int) const {
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        o[j][0] = fmaf(c_fac[0], pacc[4 * j + 0], o[j][0]);
        o[j][1] = fmaf(c_fac[0], pacc[4 * j + 1], o[j][1]);
        o[j][2] = fmaf(c_fac[1], pacc[4 * j + 2], o[j][2]);
        o[j][3] = fmaf(c_fac[1], pacc[4 * j + 3], o[j][3]);
      }
    }
  };

  // Epilogue: out = O / l * v_scale (+ v_mean), v_scale per channel in p.vparams [BH, D]; a split's partials take
  // O * v_scale.
  __device__ __forceinline__ static void store_rows(const AttnParams& p, float (&o)[D / 8][4], float (&l_run)[2],
                                                    int row_base, int g, int t, int b, int h) {
    rowmath::store_rows_channel_scaled<D>(p, o, l_run, row_base, g, t, b, h);
  }
  __device__ __forceinline__ static const float* split_scale(const AttnParams& p, int bh) {
    return p.vparams + (size_t)bh * D;
  }
};

// The same numerics with the online V/O Hadamard's inverse in the epilogue (AttnParams.o_hadamard: V rotated by the
// pre-processing): each output row leaves un-rotated (rowmath::store_rows_channel_scaled_unrotated; the split's rows
// are un-rotated by the combine). A type of its own, so that Int8Fp8Numerics' kernels stay instruction for
// instruction as they were.
template <int D_, bool MAGIC>
struct Int8Fp8VoNumerics : Int8Fp8Numerics<D_, MAGIC> {
  static constexpr int D = D_;
  __device__ __forceinline__ static void store_rows(const AttnParams& p, float (&o)[D / 8][4], float (&l_run)[2],
                                                    int row_base, int g, int t, int b, int h) {
    rowmath::store_rows_channel_scaled_unrotated<D>(p, o, l_run, row_base, g, t, b, h);
  }
};

}  // namespace hopper
}  // namespace rotvid
