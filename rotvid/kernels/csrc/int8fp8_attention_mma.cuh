// The int8-fp8 recipe on mma.sync (sm89 Ada and later; the e4m3 mma.sync and cvt need sm89): the Hopper kernel's
// numerics (int8fp8_attention_wgmma.cuh) on the skeleton of the INT4 mma.sync kernel's s8 path (int4_attention.cuh).
// Numerics of rotvid.kernels.reference (recipe "int8-fp8"), per key block of BN = 128 keys:
//   S = Q^ K^T            int32, s8 mma.sync m16n8k32 (exact);
//   m_blk = max over the row of float(S) * (sq ks)   sq = q_scale * qk_scale; ks the K group scale of the key:
//                         thread t of a quad holds columns 8j + 2t, 8j + 2t + 1 of the m16n8 accumulator, the keys of
//                         K group t ((key mod 8) / 2), so one ks per thread and block; the max is taken on the integers;
//   448 p = ex2(float(S) (sq ks) - (m_blk - log2 448)),  P8 = e4m3(448 p) packed straight from the accumulator: with
//                         V8^T keys permuted per 32 as the s8 layout (int4_common.cuh), the m16n8 accumulator layout is
//                         the m16n8k32 A-fragment layout (the same for s8 and e4m3);
//   pv = P8 V8            e4m3 mma.sync m16n8k32, a fresh fp32 accumulator per block;
//   l_blk = rowsum(448 p) of the unquantized p; O = O a + c pv, l = l a + c l_blk (rowmath::online_combine);
//   out = O / l * v_scale (+ v_mean)   (448 cancels in O / l; the per-channel V scale factors out of the key sum).
// The per-thread arithmetic is the Hopper kernel's, in the same order, so both differ only by the tensor cores'
// fp32 summation order inside a block's P8 V8.
//
// One CTA = 16 NW query rows of one (batch, head), NW warps x 16 rows; K^ / V8^T tiles and the four K group scales
// of a key block double-buffered in shared memory with cp.async.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>

#include "int4_attention.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define ROTVID_MMA_E4M3_ENABLED 1
#endif

namespace rotvid {
namespace mma8 {

constexpr int kBN = 128;  // keys per block (INT8FP8_BLOCK_N: the block max and the K groups are part of the numerics)

template <int D>
struct Cfg {
  static constexpr int KSTR = D + 16;    // padded smem strides (conflict-free ldmatrix)
  static constexpr int VSTR = kBN + 16;
  static constexpr int NT = kBN / 8;     // score n-tiles per warp
  static constexpr int QKS = D / 32;     // k-steps of QK^T (32 bytes each)
  static constexpr int PKS = kBN / 32;   // k-steps of P.V
  static constexpr int DT = D / 8;       // output n-tiles
  static constexpr int KCH = D / 16;     // 16-byte chunks per K row
  static constexpr int VCH = kBN / 16;   // 16-byte chunks per V^T row (per block)
  static constexpr int K_BYTES = kBN * KSTR;
  static constexpr int V_BYTES = D * VSTR;
  static constexpr int KS_BYTES = 16;    // the block's four K group scales
  static constexpr int STAGE = K_BYTES + V_BYTES + KS_BYTES;
  static constexpr int SMEM = 2 * STAGE;
  static_assert(KCH % 4 == 0 && VCH % 4 == 0, "whole ldmatrix.x4 groups per 8-row tile");
};

// f32 += e4m3 x e4m3 (m16n8k32): A (P8) and B (V8^T) fragments in the s8 mma's register layout.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int D, int NW, int MINB>
__global__ void __launch_bounds__(NW * 32, MINB) int8fp8_attention_mma_kernel(const AttnParams p) {
#ifdef ROTVID_MMA_E4M3_ENABLED
  using C = Cfg<D>;
  constexpr int NTH = NW * 32;  // threads; BM = 16 * NW query rows
  static_assert((kBN * C::KCH) % NTH == 0 && (D * C::VCH) % NTH == 0, "whole tiles per thread group");
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int mb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int bh = b * p.H + h;
  int kv_len = p.Nkv;
  if (p.kv_lens != nullptr) kv_len = min(p.kv_lens[b], p.Nkv);
  const int nblk = (kv_len + kBN - 1) / kBN;

  const int8_t* kg = p.k + (size_t)bh * p.Nkv_pad * D;
  const int8_t* vg = p.vt + (size_t)bh * D * p.Nkv_pad;
  const float* ksg = p.k_scale + (size_t)bh * (p.Nkv_pad / kBN) * 4;
  const uint32_t sbase = attn::smem_u32(smem);

  // stage layout: [K^ tile kBN x KSTR][V8^T tile D x VSTR][4 K group scales]
  auto load_stage = [&](int stage, int kb) {
    const uint32_t sk = sbase + stage * C::STAGE;
    const uint32_t sv = sk + C::K_BYTES;
    const int8_t* ksrc = kg + (size_t)kb * kBN * D;
#pragma unroll
    for (int i = 0; i < kBN * C::KCH / NTH; ++i) {
      const int c = tid + i * NTH;
      const int r = c / C::KCH, cc = c % C::KCH;
      attn::cp_async16(sk + r * C::KSTR + cc * 16, ksrc + r * D + cc * 16);
    }
    const int8_t* vsrc = vg + (size_t)kb * kBN;
#pragma unroll
    for (int i = 0; i < D * C::VCH / NTH; ++i) {
      const int c = tid + i * NTH;
      const int r = c / C::VCH, cc = c % C::VCH;
      attn::cp_async16(sv + r * C::VSTR + cc * 16, vsrc + (size_t)r * p.Nkv_pad + cc * 16);
    }
    if (tid == 0) attn::cp_async16(sv + C::V_BYTES, ksg + (size_t)kb * 4);
  };

  if (nblk > 0) load_stage(0, 0);
  attn::cp_async_commit();

  // Q fragments (registers for the whole loop) and per-row score scales sq = q_scale * qk_scale
  const int row_base = mb * (16 * NW) + warp * 16;
  uint32_t qf[C::QKS][4];
  {
    const int8_t* qg = p.q + ((size_t)bh * p.Nq_pad + row_base) * D;
#pragma unroll
    for (int s = 0; s < C::QKS; ++s) {
      qf[s][0] = *reinterpret_cast<const uint32_t*>(qg + g * D + 32 * s + 4 * t);
      qf[s][1] = *reinterpret_cast<const uint32_t*>(qg + (g + 8) * D + 32 * s + 4 * t);
      qf[s][2] = *reinterpret_cast<const uint32_t*>(qg + g * D + 32 * s + 16 + 4 * t);
      qf[s][3] = *reinterpret_cast<const uint32_t*>(qg + (g + 8) * D + 32 * s + 16 + 4 * t);
    }
  }
  float sq[2];
  sq[0] = p.q_scale[(size_t)bh * p.Nq_pad + row_base + g] * p.qk_scale;
  sq[1] = p.q_scale[(size_t)bh * p.Nq_pad + row_base + g + 8] * p.qk_scale;

  float o[C::DT][4];
#pragma unroll
  for (int j = 0; j < C::DT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};

  int stage = 0;
  for (int kb = 0; kb < nblk; ++kb) {
    if (kb + 1 < nblk) {
      load_stage(stage ^ 1, kb + 1);
      attn::cp_async_commit();
      attn::cp_async_wait<1>();
    } else {
      attn::cp_async_wait<0>();
    }
    __syncthreads();

    const uint32_t sk = sbase + stage * C::STAGE;
    const uint32_t sv = sk + C::K_BYTES;
    const float ks = reinterpret_cast<const float*>(smem + stage * C::STAGE + C::K_BYTES + C::V_BYTES)[t];

    // ---- S = Q^ K^T (int32, exact) ----
    uint32_t sacc[C::NT][4];
#pragma unroll
    for (int j = 0; j < C::NT; ++j) {
      sacc[j][0] = sacc[j][1] = sacc[j][2] = sacc[j][3] = 0u;
      uint32_t bf[C::KCH];
      attn::load_b_frags<C::KCH, C::KSTR, 1>(bf, sk, 8 * j, lane);
#pragma unroll
      for (int s = 0; s < C::QKS; ++s) attn::mma_int<false>(sacc[j], qf[s], bf[2 * s], bf[2 * s + 1]);
    }

    // ---- block max on the integers (masked keys excluded), online combine ----
    const bool partial = (kb + 1) * kBN > kv_len;
    float sqk[2], mblk[2], c_fac[2];
    {
      int mi[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) mi[i][0] = mi[i][1] = INT_MIN;
#pragma unroll
      for (int j = 0; j < C::NT; ++j) {
        int a[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) a[e] = (int)sacc[j][e];
        if (partial) {
          const int key = kb * kBN + 8 * j + 2 * t;
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
        float xm = m == INT_MIN ? -INFINITY : __int2float_rn(m) * sqk[r];
        xm = fmaxf(xm, __shfl_xor_sync(0xffffffffu, xm, 1));
        xm = fmaxf(xm, __shfl_xor_sync(0xffffffffu, xm, 2));
        mblk[r] = xm;
      }
    }
    rowmath::online_combine(mblk, m_run, l_run, o, c_fac);

    // ---- 448 p, its row sums (unquantized), the P8 A fragments ----
    uint32_t pf[C::PKS][4];
    {
      const float mshift[2] = {mblk[0] - rowmath::kLog2Fp8Max, mblk[1] - rowmath::kLog2Fp8Max};
      float ls[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
      for (int s = 0; s < C::PKS; ++s) {
        float pe[4][4];  // n-tiles 4s..4s+3 = the 32 key positions of k-step s
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
          const int j = 4 * s + jj;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e >> 1;
            float v = rowmath::ex2(fmaf(__int2float_rn((int)sacc[j][e]), sqk[r], -mshift[r]));
            if (partial) {
              const int key = kb * kBN + 8 * j + 2 * t + (e & 1);
              if (key >= kv_len) v = 0.f;
            }
            pe[jj][e] = v;
            ls[r][jj & 1] += v;
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

    // ---- O = O a + c (P8 V8) (O was rescaled by a in online_combine) ----
#pragma unroll
    for (int j = 0; j < C::DT; ++j) {
      uint32_t bf[C::VCH];
      attn::load_b_frags<C::VCH, C::VSTR, 1>(bf, sv, 8 * j, lane);
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int s = 0; s < C::PKS; ++s) mma_e4m3(acc, pf[s], bf[2 * s], bf[2 * s + 1]);
      o[j][0] = fmaf(c_fac[0], acc[0], o[j][0]);
      o[j][1] = fmaf(c_fac[0], acc[1], o[j][1]);
      o[j][2] = fmaf(c_fac[1], acc[2], o[j][2]);
      o[j][3] = fmaf(c_fac[1], acc[3], o[j][3]);
    }
    __syncthreads();  // every warp is done with this stage before it takes block kb + 2
    stage ^= 1;
  }

  rowmath::store_rows_channel_scaled<D>(p, o, l_run, row_base, g, t, b, h);
#endif  // ROTVID_MMA_E4M3_ENABLED
}

}  // namespace mma8
}  // namespace rotvid
