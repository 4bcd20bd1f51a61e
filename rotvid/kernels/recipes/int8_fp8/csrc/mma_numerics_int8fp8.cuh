// The int8-fp8 numerics on the mma.sync skeleton (mma_attention.cuh; sm89 Ada and later: the e4m3 mma.sync and cvt
// need sm89): the Hopper kernel's numerics (hopper_int8fp8_numerics.cuh) on the s8 operand geometry.
// Numerics of rotvid.kernels.reference (recipe "int8-fp8"), per key block of BN = 128 keys:
//   S = Q^ K^T            int32, s8 mma.sync m16n8k32 (exact);
//   m_blk = max over the row of float(S) * (sq ks)   sq = q_scale * qk_scale; ks the K group scale of the key:
//                         thread t of a quad holds columns 8j + 2t, 8j + 2t + 1 of the m16n8 accumulator, the keys of
//                         K group t ((key mod 8) / 2), so one ks per thread and block; the max is taken on the integers;
//   448 p = ex2(float(S) (sq ks) - (m_blk - log2 448)),  P8 = e4m3(448 p) packed straight from the accumulator: with
//                         V8^T keys permuted per 32 as the s8 layout (attention_params.cuh), the m16n8 accumulator
//                         layout is the m16n8k32 A-fragment layout (the same for s8 and e4m3);
//   pv = P8 V8            e4m3 mma.sync m16n8k32, a fresh fp32 accumulator per block;
//   l_blk = rowsum(448 p) of the unquantized p; O = O a + c pv, l = l a + c l_blk (rowmath::online_combine);
//   out = O / l * v_scale (+ v_mean)   (448 cancels in O / l; the per-channel V scale factors out of the key sum).
// The per-thread arithmetic is the Hopper kernel's, in the same order, so both differ only by the tensor cores'
// fp32 summation order inside a block's P8 V8.
#pragma once
#include <climits>

#include "common/rowmath.cuh"
#include "mma/mma_attention.cuh"

namespace rotvid {
namespace mma {

// f32 += e4m3 x e4m3 (m16n8k32): A (P8) and B (V8^T) fragments in the s8 mma's register layout.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// keys per block (INT8FP8_BLOCK_N: the block max and the K groups are part of the numerics)
constexpr int kInt8Fp8BlockN = 128;

template <int D>
struct Int8Fp8Numerics {
  static constexpr int BN = kInt8Fp8BlockN;
  using Tiles = MmaTiles<D, BN, false, 16>;  // stage scale data: the block's four K group scales
  using T = Tiles;
  static constexpr int kMinArch = 890;
  static constexpr uint32_t kScoreAccInit = 0u;

  // K group scales [BH, Nkv_pad / BN, 4] of one (batch, head)
  struct BlockScales {
    const float* ksg;
    __device__ __forceinline__ BlockScales(const AttnParams& p, int bh)
        : ksg(p.k_scale + (size_t)bh * (p.Nkv_pad / BN) * 4) {}
    template <int NTH>
    __device__ __forceinline__ void load(uint32_t dst, int blk, int tid) const {
      if (tid == 0) cp_async16(dst, ksg + (size_t)blk * 4);
    }
  };

  // A stage's scales as this thread reads them: the group scale of its keys (group t)
  struct View {
    float ks;
  };

  float sq[2];  // q_scale * qk_scale of rows g, g + 8

  __device__ __forceinline__ Int8Fp8Numerics(const AttnParams& p, int bh, int row_base, int g) {
    sq[0] = p.q_scale[(size_t)bh * p.Nq_pad + row_base + g] * p.qk_scale;
    sq[1] = p.q_scale[(size_t)bh * p.Nq_pad + row_base + g + 8] * p.qk_scale;
  }

  __device__ __forceinline__ View view(const float* scales, int t) const { return View{scales[t]}; }

  // The block's per-thread arrays, declared by the skeleton (where an array is declared decides the order of the
  // compiler's registers: kernel_ptx_diff.py --family mma): sq ks of rows g, g + 8 from block_max to p_fragments,
  // the scores of one n-tile as integers (block_max), 448 p of one k-step (p_fragments).
  struct Scores {
    float sqk[2];
    int a[4];
    float pe[4][4];
  };

  // The block's row max on the integers (masked keys excluded), times sq ks
  __device__ __forceinline__ void block_max(const uint32_t (&sacc)[T::NT][4], const View& v, int blk, int kv_len,
                                            bool partial, int t, Scores& sc, float (&mblk)[2]) const {
    int mi[4][2];
#pragma unroll
    for (int i = 0; i < 4; ++i) mi[i][0] = mi[i][1] = INT_MIN;
#pragma unroll
    for (int j = 0; j < T::NT; ++j) {
      int (&a)[4] = sc.a;
#pragma unroll
      for (int e = 0; e < 4; ++e) a[e] = (int)sacc[j][e];
      if (partial) {
        const int key = blk * BN + 8 * j + 2 * t;
        if (key >= kv_len) a[0] = a[2] = INT_MIN;
        if (key + 1 >= kv_len) a[1] = a[3] = INT_MIN;
      }
      mi[j & 3][0] = max(mi[j & 3][0], max(a[0], a[1]));
      mi[j & 3][1] = max(mi[j & 3][1], max(a[2], a[3]));
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sc.sqk[r] = sq[r] * v.ks;
      const int m = max(max(mi[0][r], mi[1][r]), max(mi[2][r], mi[3][r]));
      // (a thread whose keys are all masked offers -inf; a valid key is in every block)
      float xm = m == INT_MIN ? -INFINITY : __int2float_rn(m) * sc.sqk[r];
      xm = fmaxf(xm, __shfl_xor_sync(0xffffffffu, xm, 1));
      xm = fmaxf(xm, __shfl_xor_sync(0xffffffffu, xm, 2));
      mblk[r] = xm;
    }
  }

  // 448 p = ex2(S sq ks - (m_blk - log2 448)), l += c rowsum(448 p) (unquantized), the P8 A fragments
  __device__ __forceinline__ void p_fragments(const uint32_t (&sacc)[T::NT][4], Scores& sc,
                                              const float (&mblk)[2], int blk, int kv_len, bool partial, int t,
                                              const float (&c_fac)[2], float (&l_run)[2],
                                              uint32_t (&pf)[T::PKS][4]) const {
    const float (&sqk)[2] = sc.sqk;
    const float mshift[2] = {mblk[0] - rowmath::kLog2Fp8Max, mblk[1] - rowmath::kLog2Fp8Max};
    float ls[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
    for (int s = 0; s < T::PKS; ++s) {
      float (&pe)[4][4] = sc.pe;  // n-tiles 4s..4s+3 = the 32 key positions of k-step s
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int j = 4 * s + jj;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          float x = rowmath::ex2(fmaf(__int2float_rn((int)sacc[j][e]), sqk[r], -mshift[r]));
          if (partial) {
            const int key = blk * BN + 8 * j + 2 * t + (e & 1);
            if (key >= kv_len) x = 0.f;
          }
          pe[jj][e] = x;
          ls[r][jj & 1] += x;
        }
      }
      // A fragment of m16n8k32: a0 row g, k 4t..4t+3 = columns (2t, 2t+1) of n-tiles 4s, 4s+1; a1 row g+8;
      // a2 / a3 the same from n-tiles 4s+2, 4s+3 (k 16+4t..); V8^T stores those keys at those k positions
      pf[s][0] = rowmath::pack_e4m3x4(pe[0][0], pe[0][1], pe[1][0], pe[1][1]);
      pf[s][1] = rowmath::pack_e4m3x4(pe[0][2], pe[0][3], pe[1][2], pe[1][3]);
      pf[s][2] = rowmath::pack_e4m3x4(pe[2][0], pe[2][1], pe[3][0], pe[3][1]);
      pf[s][3] = rowmath::pack_e4m3x4(pe[2][2], pe[2][3], pe[3][2], pe[3][3]);
    }
    l_run[0] = fmaf(c_fac[0], ls[0][0] + ls[0][1], l_run[0]);
    l_run[1] = fmaf(c_fac[1], ls[1][0] + ls[1][1], l_run[1]);
  }

  // O columns 8j.. : O = O a + c (P8 V8) (O already rescaled by a); b: the V8^T B fragments. (LEAN changes nothing.)
  template <bool LEAN>
  __device__ __forceinline__ void pv_tile(float (&oj)[4], const uint32_t (&pf)[T::PKS][4], const uint32_t* b,
                                          const View&, int, int, const float (&c_fac)[2]) const {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int s = 0; s < T::PKS; ++s) mma_e4m3(acc, pf[s], b[2 * s], b[2 * s + 1]);
    oj[0] = fmaf(c_fac[0], acc[0], oj[0]);
    oj[1] = fmaf(c_fac[0], acc[1], oj[1]);
    oj[2] = fmaf(c_fac[1], acc[2], oj[2]);
    oj[3] = fmaf(c_fac[1], acc[3], oj[3]);
  }

  // O / l * v_scale (+ v_mean), v_scale per channel in p.vparams [BH, D]
  __device__ __forceinline__ static void store(const AttnParams& p, float (&o)[T::DT][4], float (&l_run)[2],
                                               int row_base, int g, int t, int b, int h) {
    rowmath::store_rows_channel_scaled<D>(p, o, l_run, row_base, g, t, b, h);
  }
};

// The same numerics with the online V/O Hadamard's inverse in the epilogue (AttnParams.o_hadamard): the rows leave
// un-rotated (rowmath::store_rows_channel_scaled_unrotated); a type of its own, so Int8Fp8Numerics' kernels stay as
// they were.
template <int D>
struct Int8Fp8VoNumerics : Int8Fp8Numerics<D> {
  using Int8Fp8Numerics<D>::Int8Fp8Numerics;
  using T = typename Int8Fp8Numerics<D>::T;
  __device__ __forceinline__ static void store(const AttnParams& p, float (&o)[T::DT][4], float (&l_run)[2],
                                               int row_base, int g, int t, int b, int h) {
    rowmath::store_rows_channel_scaled_unrotated<D>(p, o, l_run, row_base, g, t, b, h);
  }
};

}  // namespace mma
}  // namespace rotvid
