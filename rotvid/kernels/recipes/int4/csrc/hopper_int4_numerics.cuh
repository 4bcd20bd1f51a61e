// The INT4-valued numerics of the Hopper attention kernel (hopper_attention.cuh): a numerics policy.
//
// Same numerics as the mma.sync kernel's INT4 policy (mma_numerics_int4.cuh)
// at the same block_n (DESIGN.md §The numerics; the per-row arithmetic is that
// kernel's, rowmath): per key block of BN (64 or 128) keys
//   S = Q^ K^T (int32), x = float(S) * k_scale, m_blk = sq * max(x), p = ex2(x sq - m_blk) (with Q smoothing, SQ:
//   x = float(S) * k_scale * sq + k_bias[key], m_blk = max(x), p = ex2(x - m_blk)),
//   P^ = rint(15 p) in [0, 15] (range; the INT4 kernels' P~ = P^ - 8) | rint(7 p) (sym),
//   O = O a + c (P^ V^) v_scale, l = l a + c rowsum(P^) (O and l in units of P^; P^ V^ = P~ V^ + 8 colsum(V^)
//   exactly, so no column-sum term is needed).
// P^ V^ runs on the e4m3 tensor cores: the byte k of P^ (0..15) read as e4m3 is k 2^-9 (subnormals and the first
// binade are evenly spaced at 2^-9), and V^ arrives in sign-magnitude bytes (|v| | sign << 7), which read as e4m3
// are v 2^-9; every product is an integer times 2^-18 and the block's sum (|P^ V^| <= 15 * 7 * BN < 2^14) is exact
// in the FP32 accumulator (checked on an H100: bit-identical to the u8 x s8 product, RESULTS.md). The 2^18 goes
// into c. P^ 2^-9 = e4m3(ex2(x - m_blk + log2(15) - 9)): the factor folded into the exponent, the rounding done by
// the e4m3 conversion (round to nearest even on the 2^-9 grid = rint). Against the mma.sync s8 kernel the output
// differs only where ex2.approx of that shifted argument rounds P^ the other way (a few outputs in 10^4; the
// bound against the reference is unchanged).
#pragma once
#include <cuda.h>

#include "int4_entry.cuh"
#include "common/rowmath.cuh"
#include "hopper/sm90_ops.cuh"

namespace rotvid {
namespace hopper {

// PMODE: kPRange (P^ = rint(15 p)) or kPSym (rint(7 p)). SQ: Q smoothing -- scores x sq + k_bias[key] (p.k_bias,
// the ΔS of the per-head Q mean, log2 domain), the row max and the exponent taken on those sums; otherwise the
// product by sq is folded into the exponent's FFMA.
template <int D_, int BN_, int PMODE, bool SQ>
struct Int4ValuedNumerics {
  static constexpr bool RETURNS_LSE = false;  // p.lse not written (the INT4 kernels return no LSE yet)
  static constexpr float LSE_LOG2_UNIT = 0.f;
  static constexpr int D = D_;
  static constexpr bool TILE_COUNT_ROUNDED_UP = false;  // the tile decode's code form (hopper_attention.cuh)
  static constexpr int BN = BN_;
  static_assert(BN == 64 || BN == 128, "key blocks of 64 or 128");
  static constexpr bool S_STARTS_AT_MAGIC = false;  // scores converted by I2F

  // What each stage holds besides the K^ / V^T tiles. A ring of st stages: [KS0 VP0][KS1 VP1]...[DS0][DS1]...
  static constexpr int KS_BYTES = BN * 4;  // k_scale of the block's keys
  static constexpr int VP_BYTES = D * 8;   // vparams of the block: (v_scale, column-sum bits) per channel
  static constexpr int DS_BYTES = BN * 4;  // Q smoothing's k_bias of the block's keys (reserved without SQ too)
  static constexpr uint32_t STAGE_SMALL_TX = KS_BYTES + VP_BYTES + (SQ ? DS_BYTES : 0);
  static constexpr int small_bytes(int st) { return st * (KS_BYTES + VP_BYTES) + st * DS_BYTES; }

  // Producer (one thread): the block's k_scale, vparams (and k_bias) into stage s, after its K^ and V^T copies.
  struct StageLoads {
    const AttnParams& p;
    const int bh;
    const float* ksg;  // this head's k_scale and vparams (k_bias is addressed per block, as the kernel measured)
    const float* vpg;
    __device__ __forceinline__ StageLoads(const AttnParams& p_, int bh_)
        : p(p_), bh(bh_),
          ksg(p_.k_scale + (size_t)bh_ * p_.Nkv_pad),
          vpg(p_.vparams + (size_t)bh_ * (p_.Nkv_pad / BN) * D * 2) {}
    template <int ST>
    __device__ __forceinline__ void issue(uint32_t small, int s, int blk, uint32_t bar) const {
      const uint32_t sm = small + s * (KS_BYTES + VP_BYTES);
      sm90::bulk_load(sm, ksg + (size_t)blk * BN, KS_BYTES, bar);
      sm90::bulk_load(sm + KS_BYTES, vpg + (size_t)blk * D * 2, VP_BYTES, bar);
      if constexpr (SQ) {
        const float* dsg = p.k_bias + (size_t)bh * p.Nkv_pad + (size_t)blk * BN;
        sm90::bulk_load(small + ST * (KS_BYTES + VP_BYTES) + s * DS_BYTES, dsg, DS_BYTES, bar);
      }
    }
  };

  // Consumer state of one thread: rows g, g + 8 of its warp's 16 (index r), columns 8j + 2t, 8j + 2t + 1 of
  // n-tile j (the accumulator layout).
  struct Rows {
    static constexpr int NT = BN / 8;  // score n-tiles
    // P^ levels (as e4m3: P^ 2^-9); kShift = log2(kPMul) - 9 moves them into the exponent
    static constexpr float kShift = PMODE == kPRange ? -5.0931094f : -6.1926451f;  // log2(15) - 9, log2(7) - 9
    float sq[2];       // q_scale * qk_scale of the rows
    float x[NT][4];    // scores of the block in the log2 domain (before the row scale sq; SQ: after it, + k_bias)

    __device__ __forceinline__ Rows(const AttnParams& p, int bh, int row_base, int g) {
      sq[0] = p.q_scale[(size_t)bh * p.Nq_pad + row_base + g] * p.qk_scale;
      sq[1] = p.q_scale[(size_t)bh * p.Nq_pad + row_base + g + 8] * p.qk_scale;
    }

    // The stage's operands: smem + small_off is the small region of the ring (one offset sum: the address
    // arithmetic of the kernel as measured)
    __device__ __forceinline__ static const float* ks_ptr(const unsigned char* smem, int small_off, int s) {
      return reinterpret_cast<const float*>(smem + (small_off + s * (KS_BYTES + VP_BYTES)));
    }
    __device__ __forceinline__ static const float* vp_ptr(const unsigned char* smem, int small_off, int s) {
      return reinterpret_cast<const float*>(smem + (small_off + s * (KS_BYTES + VP_BYTES) + KS_BYTES));
    }
    template <int ST>
    __device__ __forceinline__ static const float* ds_ptr(const unsigned char* smem, int small_off, int s) {
      return reinterpret_cast<const float*>(smem + (small_off + ST * (KS_BYTES + VP_BYTES) + s * DS_BYTES));
    }

    // Scores x and the block row maxima m_blk (times sq) of key block blk in stage s; PARTIAL: keys >= kv_len
    // masked.
    template <int ST, bool PARTIAL>
    __device__ __forceinline__ void block_max(const uint32_t (&sacc)[BN / 2], const unsigned char* smem,
                                              int small_off, int s, int blk, int kv_len, int t,
                                              float (&mblk)[2]) {
      const float* sks = ks_ptr(smem, small_off, s);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const float2 ksc = *reinterpret_cast<const float2*>(sks + 8 * j + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          x[j][e] = __int2float_rn((int)sacc[4 * j + e]) * ((e & 1) ? ksc.y : ksc.x);  // exact int -> float
        }
        if constexpr (SQ) {
          const float2 dsc = *reinterpret_cast<const float2*>(ds_ptr<ST>(smem, small_off, s) + 8 * j + 2 * t);
#pragma unroll
          for (int e = 0; e < 4; ++e) x[j][e] = fmaf(x[j][e], sq[e >> 1], (e & 1) ? dsc.y : dsc.x);
        }
      }
      if constexpr (PARTIAL) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const int key = blk * BN + 8 * j + 2 * t;
          if (key >= kv_len) x[j][0] = x[j][2] = -INFINITY;
          if (key + 1 >= kv_len) x[j][1] = x[j][3] = -INFINITY;
        }
      }
      float xmax[2];
      rowmath::block_row_max(x, xmax);
      mblk[0] = SQ ? xmax[0] : sq[0] * xmax[0];
      mblk[1] = SQ ? xmax[1] : sq[1] * xmax[1];
    }

    // P^ of the block as e4m3 A fragments (rows g / g+8, 32 keys per k-step), and l = l + c rowsum(P^): the row
    // sums are exact integers (byte sums of the fragments, dp4a), so the output bits equal the mma.sync kernel's.
    template <bool PARTIAL>
    __device__ __forceinline__ void p_fragments(const uint32_t (&)[BN / 2], const float (&mblk)[2], int blk,
                                                int kv_len, int t, const float (&c_fac)[2],
                                                uint32_t (&pf)[BN / 32][4], float (&l_run)[2]) {
      uint32_t p_sum[2] = {0u, 0u};
      const float mexp[2] = {mblk[0] - kShift, mblk[1] - kShift};  // so that ex2 gives kPMul 2^-9 p
#pragma unroll
      for (int k = 0; k < BN / 32; ++k) {
        float pe[4][4];  // kPMul 2^-9 p of n-tiles 4k..4k+3
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const int j = 4 * k + jj;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e >> 1;
            pe[jj][e] = rowmath::ex2(SQ ? x[j][e] - mexp[r] : fmaf(x[j][e], sq[r], -mexp[r]));
            if constexpr (PARTIAL) {
              const int key = blk * BN + 8 * j + 2 * t + (e & 1);
              if (key >= kv_len) pe[jj][e] = 0.f;
            }
          }
        }
        auto& f = pf[k];  // each byte the e4m3 code of P^ 2^-9, rounded by the conversion
        f[0] = rowmath::pack_e4m3x4(pe[0][0], pe[0][1], pe[1][0], pe[1][1]);
        f[1] = rowmath::pack_e4m3x4(pe[0][2], pe[0][3], pe[1][2], pe[1][3]);
        f[2] = rowmath::pack_e4m3x4(pe[2][0], pe[2][1], pe[3][0], pe[3][1]);
        f[3] = rowmath::pack_e4m3x4(pe[2][2], pe[2][3], pe[3][2], pe[3][3]);
        p_sum[0] = __dp4a(f[0], 0x01010101u, __dp4a(f[2], 0x01010101u, p_sum[0]));  // row g
        p_sum[1] = __dp4a(f[1], 0x01010101u, __dp4a(f[3], 0x01010101u, p_sum[1]));  // row g + 8
      }
      rowmath::add_row_counts(p_sum, c_fac, l_run);
    }

    // O = O + c (P^ V^) v_scale: the accumulator holds P^ V^ 2^-18, so (c 2^18) (P^ V^ 2^-18) is c P^ V^ exactly
    template <int ST>
    __device__ __forceinline__ void update_o(float (&o)[D / 8][4], const float (&pacc)[D / 2],
                                             const float (&c_fac)[2], const unsigned char* smem, int small_off,
                                             int s, int t) const {
      const float* svp = vp_ptr(smem, small_off, s);
      const float cf0 = c_fac[0] * 262144.f;
      const float cf1 = c_fac[1] * 262144.f;
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        // v_scale of columns 8j+2t and 8j+2t+1 (vparams interleaves them with column-sum bits not needed here; a
        // 16-byte load of both pairs compiles to two 4-byte loads all the same)
        float2 vp;
        vp.x = svp[2 * (8 * j + 2 * t)];
        vp.y = svp[2 * (8 * j + 2 * t) + 2];
        o[j][0] = fmaf(cf0 * pacc[4 * j + 0], vp.x, o[j][0]);
        o[j][1] = fmaf(cf0 * pacc[4 * j + 1], vp.y, o[j][1]);
        o[j][2] = fmaf(cf1 * pacc[4 * j + 2], vp.x, o[j][2]);
        o[j][3] = fmaf(cf1 * pacc[4 * j + 3], vp.y, o[j][3]);
      }
    }
  };

  // Epilogue: out = O / l (+ v_mean) (v_scale is already in O); a split's partials take O as it is.
  __device__ __forceinline__ static void store_rows(const AttnParams& p, float (&o)[D / 8][4], float (&l_run)[2],
                                                    int row_base, int g, int t, int b, int h) {
    rowmath::store_rows<D>(p, o, l_run, row_base, g, t, b, h);
  }
  __device__ __forceinline__ static const float* split_scale(const AttnParams&, int) { return nullptr; }
};

}  // namespace hopper
}  // namespace rotvid
