// The INT4-valued numerics on the mma.sync skeleton (mma_attention.cuh); bit-level twin: rotvid/kernels/reference.py.
// Operands INT4-valued: on the s4 instructions (S4, m16n8k64, two values per byte) or on the s8 ones (m16n8k32).
// Per key block of BN keys (64 or 128; the block max is part of the numerics):
//   S = Q^ K^T        int32, accumulator initialised with MAGIC_I so that float(acc) is one FADD
//   x = float(S) * k_scale;  m_blk = q_scale*qk_scale * max(x);  p = ex2(x*sq - m_blk)
//                     (Q smoothing, p.k_bias: x = float(S) * k_scale * sq + k_bias[key], m_blk = max(x),
//                     p = ex2(x - m_blk))
//   P~ = rint(15 p) - 8 (range) | rint(7 p) (sym), packed straight from the accumulator
//   PV = P~ V^ + 8 colsum       int32 (colsum folded in the accumulator init, or with LEAN in the exact
//                               bias of the float conversion), then
//   O = O*a + c*float(PV)*v_scale,  l = l*a + c*sum(P^) (both in units of P^ = P~ + 8 | P~)
#pragma once
#include "int4_entry.cuh"
#include "common/rowmath.cuh"
#include "mma/mma_attention.cuh"

namespace rotvid {
namespace mma {

template <int D, int BN, bool S4, int PMODE>
struct Int4Numerics {
  // Stage scale data: k_scale of the BN keys, then vparams (v_scale, colsum bits) of the D channels.
  static constexpr int KS_BYTES = BN * 4;
  static constexpr int VP_BYTES = D * 8;
  using Tiles = MmaTiles<D, BN, S4, KS_BYTES + VP_BYTES>;
  using T = Tiles;
  static constexpr int kMinArch = kBaseArch;
  static constexpr uint32_t kScoreAccInit = kMagicI;

  // k_scale [BH, Nkv_pad] and vparams [BH, Nkv_pad / BN, D, 2] of one (batch, head)
  struct BlockScales {
    const float* ksg;
    const float* vpg;
    __device__ __forceinline__ BlockScales(const AttnParams& p, int bh)
        : ksg(p.k_scale + (size_t)bh * p.Nkv_pad), vpg(p.vparams + (size_t)bh * (p.Nkv_pad / BN) * D * 2) {}
    template <int NTH>
    __device__ __forceinline__ void load(uint32_t dst, int blk, int tid) const {
      static_assert(BN / 4 <= NTH - D / 2, "scale loaders overlap");
      const uint32_t svp = dst + KS_BYTES;
      if (tid < BN / 4) cp_async16(dst + tid * 16, ksg + (size_t)blk * BN + tid * 4);
      if (tid >= NTH - D / 2) {
        const int c = tid - (NTH - D / 2);
        cp_async16(svp + c * 16, vpg + ((size_t)blk * D + c * 2) * 2);
      }
    }
  };

  // A stage's scales as this thread reads them: k_scale of the keys, vparams of the channels.
  struct View {
    const float* sks;
    const float* svp;
  };

  float sq[2];        // q_scale * qk_scale of rows g, g + 8
  const float* dsg;   // Q smoothing's per-key bias (log2 domain) of this (batch, head), or nullptr
  float sx[2];        // the row multiplier of the max and the exponent: sq, or 1 with the bias

  __device__ __forceinline__ Int4Numerics(const AttnParams& p, int bh, int row_base, int g) {
    sq[0] = p.q_scale[(size_t)bh * p.Nq_pad + row_base + g] * p.qk_scale;
    sq[1] = p.q_scale[(size_t)bh * p.Nq_pad + row_base + g + 8] * p.qk_scale;
    // Q smoothing (p.k_bias, the ΔS of the per-head Q mean per key, log2 domain): the scores become x sq + bias, so
    // the row max and the exponent take them with a unit multiplier (fmaf(x, 1, -m) == x - m exactly)
    dsg = p.k_bias != nullptr ? p.k_bias + (size_t)bh * p.Nkv_pad : nullptr;
    sx[0] = dsg != nullptr ? 1.f : sq[0];
    sx[1] = dsg != nullptr ? 1.f : sq[1];
  }

  __device__ __forceinline__ View view(const float* scales, int) const { return View{scales, scales + BN}; }

  // The block's per-thread arrays, declared by the skeleton (where an array is declared decides the order of the
  // compiler's registers, and so the instructions: kernel_ptx_diff.py --family mma): the scores as floats (k_scale,
  // Q smoothing's bias, masked keys -inf) from block_max to p_fragments, and the P words there.
  struct Scores {
    float x[T::NT][4];
    uint32_t pw[T::NT][4];  // float bits; low byte / nibble = P~
  };

  // Scores, key mask, the block's row max m_blk (log2 domain, times sq)
  __device__ __forceinline__ void block_max(const uint32_t (&sacc)[T::NT][4], const View& v, int blk, int kv_len,
                                            bool partial, int t, Scores& sc, float (&mblk)[2]) const {
    float (&x)[T::NT][4] = sc.x;
#pragma unroll
    for (int j = 0; j < T::NT; ++j) {
      const float2 ks = *reinterpret_cast<const float2*>(v.sks + 8 * j + 2 * t);
      x[j][0] = (__uint_as_float(sacc[j][0]) - kMagicF) * ks.x;
      x[j][1] = (__uint_as_float(sacc[j][1]) - kMagicF) * ks.y;
      x[j][2] = (__uint_as_float(sacc[j][2]) - kMagicF) * ks.x;
      x[j][3] = (__uint_as_float(sacc[j][3]) - kMagicF) * ks.y;
    }
    if (dsg != nullptr) {
#pragma unroll
      for (int j = 0; j < T::NT; ++j) {
        const float2 ds = __ldg(reinterpret_cast<const float2*>(dsg + blk * BN + 8 * j + 2 * t));
        x[j][0] = fmaf(x[j][0], sq[0], ds.x);
        x[j][1] = fmaf(x[j][1], sq[0], ds.y);
        x[j][2] = fmaf(x[j][2], sq[1], ds.x);
        x[j][3] = fmaf(x[j][3], sq[1], ds.y);
      }
    }
    if (partial) {
#pragma unroll
      for (int j = 0; j < T::NT; ++j) {
        const int key = blk * BN + 8 * j + 2 * t;
        if (key >= kv_len) x[j][0] = x[j][2] = -INFINITY;
        if (key + 1 >= kv_len) x[j][1] = x[j][3] = -INFINITY;
      }
    }
    float xmax[2];
    rowmath::block_row_max(x, xmax);
    mblk[0] = sx[0] * xmax[0];
    mblk[1] = sx[1] * xmax[1];
  }

  // The P levels and their row counts (l += c rowsum(P^)), P~'s A fragments
  __device__ __forceinline__ void p_fragments(const uint32_t (&)[T::NT][4], Scores& sc, const float (&mblk)[2],
                                              int blk, int kv_len, bool partial, int t, const float (&c_fac)[2],
                                              float (&l_run)[2], uint32_t (&pf)[T::PKS][4]) const {
    const float (&x)[T::NT][4] = sc.x;
    uint32_t (&pw)[T::NT][4] = sc.pw;
    // row sums of P^ = P~ (+ 8): the words MAGIC_I + P~ summed as integers (mod 2^32), the MAGIC_I terms removed
    // after the loop -- exact, so equal to the wgmma kernel's byte sums
    uint32_t p_sum[2] = {0u, 0u};
    constexpr float kPMul = PMODE == kPRange ? 15.f : 7.f;
    constexpr float kPAdd = PMODE == kPRange ? kMagicF - 8.f : kMagicF;
#pragma unroll
    for (int j = 0; j < T::NT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        float pe = rowmath::ex2(fmaf(x[j][e], sx[r], -mblk[r]));
        if (partial) {
          const int key = blk * BN + 8 * j + 2 * t + (e & 1);
          if (key >= kv_len) pe = 0.f;
        }
        pw[j][e] = __float_as_uint(fmaf(pe, kPMul, kPAdd));
        p_sum[r] += pw[j][e];
      }
    }
    {
      constexpr uint32_t kTerms = 2 * T::NT;  // words per row and thread in this block
      constexpr uint32_t kOffset = (uint32_t)kMagicI * kTerms - (PMODE == kPRange ? 8u * kTerms : 0u);
      p_sum[0] -= kOffset;
      p_sum[1] -= kOffset;
    }
    rowmath::add_row_counts(p_sum, c_fac, l_run);

    // ---- P~ A fragments ----
#pragma unroll
    for (int s = 0; s < T::PKS; ++s) {
      if constexpr (!S4) {  // 32 positions = n-tiles 4s..4s+3
        pf[s][0] = rowmath::pack_low_bytes(pw[4 * s][0], pw[4 * s][1], pw[4 * s + 1][0], pw[4 * s + 1][1]);
        pf[s][1] = rowmath::pack_low_bytes(pw[4 * s][2], pw[4 * s][3], pw[4 * s + 1][2], pw[4 * s + 1][3]);
        pf[s][2] = rowmath::pack_low_bytes(pw[4 * s + 2][0], pw[4 * s + 2][1], pw[4 * s + 3][0], pw[4 * s + 3][1]);
        pf[s][3] = rowmath::pack_low_bytes(pw[4 * s + 2][2], pw[4 * s + 2][3], pw[4 * s + 3][2], pw[4 * s + 3][3]);
      } else {  // 64 positions = n-tiles 8s..8s+7; nibble i <- tile i/2, element i&1
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int j0 = 8 * s + 4 * (q >> 1);
          const int e0 = 2 * (q & 1);  // row g (0) or g+8 (2)
          uint32_t ev = rowmath::pack_low_bytes(pw[j0][e0], pw[j0 + 1][e0], pw[j0 + 2][e0], pw[j0 + 3][e0]);
          uint32_t od =
              rowmath::pack_low_bytes(pw[j0][e0 + 1], pw[j0 + 1][e0 + 1], pw[j0 + 2][e0 + 1], pw[j0 + 3][e0 + 1]);
          // q: 0 -> a0 (row g, first half), 1 -> a1 (row g+8), 2 -> a2, 3 -> a3
          pf[s][(q & 1) | ((q >> 1) << 1)] = (ev & 0x0F0F0F0Fu) | ((od & 0x0F0F0F0Fu) << 4);
        }
      }
    }
  }

  // O columns 8j.. : O = O*a + c * (P~ V^ + 8 colsum) * v_scale (O already rescaled by a); b: the V^T B fragments.
  template <bool LEAN>
  __device__ __forceinline__ void pv_tile(float (&oj)[4], const uint32_t (&pf)[T::PKS][4], const uint32_t* b,
                                          const View& v, int j, int t, const float (&c_fac)[2]) const {
    const float4 vp = *reinterpret_cast<const float4*>(v.svp + 2 * (8 * j + 2 * t));
    uint32_t acc[4];
    float bias0 = kMagicF, bias1 = kMagicF;
    if constexpr (LEAN) {  // the accumulator starts at MAGIC_I; the colsum term enters the exact bias
      acc[0] = acc[1] = acc[2] = acc[3] = kMagicI;
      bias0 = 2.f * kMagicF - vp.y;  // = MAGIC_F - 8 colsum (exact)
      bias1 = 2.f * kMagicF - vp.w;
    } else {
      acc[0] = acc[2] = __float_as_uint(vp.y);
      acc[1] = acc[3] = __float_as_uint(vp.w);
    }
#pragma unroll
    for (int s = 0; s < T::PKS; ++s) mma_int<S4>(acc, pf[s], b[2 * s], b[2 * s + 1]);
    oj[0] = fmaf(c_fac[0] * (__uint_as_float(acc[0]) - bias0), vp.x, oj[0]);
    oj[1] = fmaf(c_fac[0] * (__uint_as_float(acc[1]) - bias1), vp.z, oj[1]);
    oj[2] = fmaf(c_fac[1] * (__uint_as_float(acc[2]) - bias0), vp.x, oj[2]);
    oj[3] = fmaf(c_fac[1] * (__uint_as_float(acc[3]) - bias1), vp.z, oj[3]);
  }

  // O / l (+ v_mean)
  __device__ __forceinline__ static void store(const AttnParams& p, float (&o)[T::DT][4], float (&l_run)[2],
                                               int row_base, int g, int t, int b, int h) {
    rowmath::store_rows<D>(p, o, l_run, row_base, g, t, b, h);
  }
};

}  // namespace mma
}  // namespace rotvid
