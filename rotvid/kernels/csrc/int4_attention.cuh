// INT4 flash attention on mma.sync (numerics: rotvid/kernels/reference.py, its bit-level twin).
//
// One CTA = 16*NW query rows of one (batch, head); NW warps x 16 rows (NW = 4 by default). Key blocks of BN keys are
// double- or triple-buffered in shared memory with cp.async (launch_one picks the configuration). Per key block:
//   S = Q^ K^T        int32, mma.sync s8 m16n8k32 (S4=false) or s4 m16n8k64 (S4=true),
//                     accumulator initialised with MAGIC_I so that float(acc) is one FADD
//   x = float(S) * k_scale;  m_blk = q_scale*qk_scale * max(x);  p = ex2(x*sq - m_blk)
//                     (Q smoothing, p.k_bias: x = float(S) * k_scale * sq + k_bias[key], m_blk = max(x),
//                     p = ex2(x - m_blk))
//   P~ = rint(15 p) - 8 (range) | rint(7 p) (sym), packed straight from the accumulator
//   PV = P~ V^ + 8 colsum       int32 (colsum folded in the accumulator init, or with LEAN in the exact
//                               bias of the float conversion), then
//   O = O*a + c*float(PV)*v_scale,  l = l*a + c*sum(P^) (both in units of P^ = P~ + 8 | P~)
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdlib>

#include "int4_common.cuh"
#include "int4_rowmath.cuh"

#ifndef ROTVID_NW4_MINB
#define ROTVID_NW4_MINB 3
#endif

namespace rotvid {
namespace attn {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3,
                                            uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

template <bool S4>
__device__ __forceinline__ void mma_int(uint32_t (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (S4) {
    asm("mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

using rowmath::ex2;
using rowmath::pack_low_bytes;

template <int D, int BN, bool S4>
struct Cfg {
  static constexpr int DB = S4 ? D / 2 : D;      // bytes per Q/K row
  static constexpr int VB = S4 ? BN / 2 : BN;    // bytes per V^T row per key block
  static constexpr int KSTR = DB + 16;           // padded smem strides (conflict-free ldmatrix)
  static constexpr int VSTR = VB + 16;
  static constexpr int NT = BN / 8;              // score n-tiles per warp
  static constexpr int QKS = DB / 32;            // k-steps of QK^T (32 bytes each)
  static constexpr int PKS = VB / 32;            // k-steps of P.V
  static constexpr int DT = D / 8;               // output n-tiles
  static constexpr int KCH = DB / 16;            // 16-byte chunks per K row
  static constexpr int VCH = VB / 16;            // 16-byte chunks per V^T row (per block)
  static constexpr int K_BYTES = BN * KSTR;
  static constexpr int V_BYTES = D * VSTR;
  static constexpr int KS_BYTES = BN * 4;
  static constexpr int VP_BYTES = D * 8;
  static constexpr int STAGE = K_BYTES + V_BYTES + KS_BYTES + VP_BYTES;
  static constexpr int SMEM = 2 * STAGE;
  static_assert(KCH % 2 == 0 && VCH % 2 == 0, "k-steps need pairs of chunks");
  static_assert((KCH >= 4 && KCH % 4 == 0) || KCH == 2, "ldmatrix grouping");
  static_assert((VCH >= 4 && VCH % 4 == 0) || VCH == 2, "ldmatrix grouping");
};

// Load B fragments for NTILE consecutive 8-row tiles starting at row0 of a smem matrix with CH
// 16-byte chunks per row; frag[j*CH + c] = chunk c of tile j (as the mma B register layout).
template <int CH, int STR, int NTILE>
__device__ __forceinline__ void load_b_frags(uint32_t (&frag)[NTILE * CH], uint32_t base, int row0, int lane) {
  static_assert((NTILE * CH) % 4 == 0, "groups of 4 matrices");
#pragma unroll
  for (int x = 0; x < NTILE * CH / 4; ++x) {
    int row, col;
    if constexpr (CH >= 4) {
      row = row0 + 8 * ((4 * x) / CH) + (lane & 7);
      col = (4 * x) % CH + (lane >> 3);
    } else {  // CH == 2: one ldmatrix.x4 covers two tiles
      row = row0 + 8 * (2 * x + (lane >> 4)) + (lane & 7);
      col = (lane >> 3) & 1;
    }
    ldmatrix_x4(frag[4 * x], frag[4 * x + 1], frag[4 * x + 2], frag[4 * x + 3], base + row * STR + col * 16);
  }
}

// Kernel variants (template parameters, all with the same per-row arithmetic, so the same output bits):
//   STAGES 2: cp.async double buffer, two barriers per key block; 3: triple buffer, one barrier.
//   LEAN: per-thread load addresses computed once (the loop only adds the block offset), and the
//         P.V accumulator starts at the constant MAGIC_I (no register copies of the colsum term);
//         the colsum term enters as bias = 2*MAGIC_F - float_bits(MAGIC_I + 8 colsum) = MAGIC_F - 8 colsum,
//         so float(acc) - bias == float(pv_int) exactly (all integers below 2^24).
template <int D, int BN, bool S4, int PMODE, int NW, int MINB, int STAGES = 2, bool LEAN = false>
__global__ void __launch_bounds__(NW * 32, MINB) int4_attention_kernel(const AttnParams p) {
  static_assert(STAGES == 2 || STAGES == 3, "2 or 3 pipeline stages");
  using C = Cfg<D, BN, S4>;
  constexpr int NTH = NW * 32;  // threads; BM = 16 * NW query rows
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int mb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int bh = b * p.H + h;
  int kv_len = p.Nkv;
  if (p.kv_lens != nullptr) kv_len = min(p.kv_lens[b], p.Nkv);
  const int nblk = (kv_len + BN - 1) / BN;

  const int8_t* kg = p.k + (size_t)bh * p.Nkv_pad * C::DB;
  constexpr int VROW_DIV = S4 ? 2 : 1;
  const size_t vrow = (size_t)p.Nkv_pad / VROW_DIV;
  const int8_t* vg = p.vt + (size_t)bh * D * vrow;
  const float* ksg = p.k_scale + (size_t)bh * p.Nkv_pad;
  const float* vpg = p.vparams + (size_t)bh * (p.Nkv_pad / BN) * D * 2;
  const uint32_t sbase = smem_u32(smem);

  // LEAN addressing: chunk c = tid + i*NTH of the K tile sits at global byte c*16 of the block and at
  // smem row c / KCH; of the V^T tile at row c / VCH (global stride vrow), column c % VCH.
  static_assert(NTH % C::KCH == 0 && NTH % C::VCH == 0, "whole rows per thread group");
  const int8_t* k_thr = kg + tid * 16;
  const int8_t* v_thr = vg + (size_t)(tid / C::VCH) * vrow + (tid % C::VCH) * 16;
  const uint32_t kdst_thr = (tid / C::KCH) * C::KSTR + (tid % C::KCH) * 16;
  const uint32_t vdst_thr = C::K_BYTES + (tid / C::VCH) * C::VSTR + (tid % C::VCH) * 16;
  const size_t vstep = (size_t)(NTH / C::VCH) * vrow;

  auto load_stage_lean = [&](int stage, int kb) {
    const uint32_t so = sbase + stage * C::STAGE;
    const int8_t* ksrc = k_thr + (size_t)kb * (BN * C::DB);
#pragma unroll
    for (int i = 0; i < (BN * C::KCH + NTH - 1) / NTH; ++i) {
      if ((BN * C::KCH) % NTH == 0 || tid + i * NTH < BN * C::KCH)
        cp_async16(so + kdst_thr + i * (NTH / C::KCH) * C::KSTR, ksrc + i * NTH * 16);
    }
    const int8_t* vsrc = v_thr + (size_t)kb * C::VB;
#pragma unroll
    for (int i = 0; i < (D * C::VCH + NTH - 1) / NTH; ++i) {
      if ((D * C::VCH) % NTH == 0 || tid + i * NTH < D * C::VCH)
        cp_async16(so + vdst_thr + i * (NTH / C::VCH) * C::VSTR, vsrc + i * vstep);
    }
    const uint32_t sks = so + C::K_BYTES + C::V_BYTES;
    const uint32_t svp = sks + C::KS_BYTES;
    if (tid < BN / 4) cp_async16(sks + tid * 16, ksg + (size_t)kb * BN + tid * 4);
    if (tid >= NTH - D / 2) {
      const int c = tid - (NTH - D / 2);
      cp_async16(svp + c * 16, vpg + ((size_t)kb * D + c * 2) * 2);
    }
  };

  auto load_stage = [&](int stage, int kb) {
    if constexpr (LEAN) {
      load_stage_lean(stage, kb);
      return;
    }
    const uint32_t sk = sbase + stage * C::STAGE;
    const uint32_t sv = sk + C::K_BYTES;
    const uint32_t sks = sv + C::V_BYTES;
    const uint32_t svp = sks + C::KS_BYTES;
    const int8_t* ksrc = kg + (size_t)kb * BN * C::DB;
#pragma unroll
    for (int i = 0; i < (BN * C::KCH + NTH - 1) / NTH; ++i) {
      const int c = tid + i * NTH;
      if ((BN * C::KCH) % NTH == 0 || c < BN * C::KCH) {
        const int r = c / C::KCH, cc = c % C::KCH;
        cp_async16(sk + r * C::KSTR + cc * 16, ksrc + r * C::DB + cc * 16);
      }
    }
    const int8_t* vsrc = vg + (size_t)kb * C::VB;
#pragma unroll
    for (int i = 0; i < (D * C::VCH + NTH - 1) / NTH; ++i) {
      const int c = tid + i * NTH;
      if ((D * C::VCH) % NTH == 0 || c < D * C::VCH) {
        const int r = c / C::VCH, cc = c % C::VCH;
        cp_async16(sv + r * C::VSTR + cc * 16, vsrc + r * vrow + cc * 16);
      }
    }
    if (tid < BN / 4) cp_async16(sks + tid * 16, ksg + (size_t)kb * BN + tid * 4);
    static_assert(BN / 4 <= NTH - D / 2, "scale loaders overlap");
    if (tid >= NTH - D / 2) {
      const int c = tid - (NTH - D / 2);
      cp_async16(svp + c * 16, vpg + ((size_t)kb * D + c * 2) * 2);
    }
  };

  load_stage(0, 0);
  cp_async_commit();
  if constexpr (STAGES == 3) {
    if (nblk > 1) load_stage(1, 1);
    cp_async_commit();
  }

  // Q fragments (registers for the whole loop) and per-row score scales.
  const int row_base = mb * (16 * NW) + warp * 16;
  uint32_t qf[C::QKS][4];
  {
    const int8_t* qg = p.q + ((size_t)bh * p.Nq_pad + row_base) * C::DB;
#pragma unroll
    for (int s = 0; s < C::QKS; ++s) {
      qf[s][0] = *reinterpret_cast<const uint32_t*>(qg + g * C::DB + 32 * s + 4 * t);
      qf[s][1] = *reinterpret_cast<const uint32_t*>(qg + (g + 8) * C::DB + 32 * s + 4 * t);
      qf[s][2] = *reinterpret_cast<const uint32_t*>(qg + g * C::DB + 32 * s + 16 + 4 * t);
      qf[s][3] = *reinterpret_cast<const uint32_t*>(qg + (g + 8) * C::DB + 32 * s + 16 + 4 * t);
    }
  }
  float sq[2];
  sq[0] = p.q_scale[(size_t)bh * p.Nq_pad + row_base + g] * p.qk_scale;
  sq[1] = p.q_scale[(size_t)bh * p.Nq_pad + row_base + g + 8] * p.qk_scale;
  // Q smoothing (p.k_bias, the ΔS of the per-head Q mean per key, log2 domain): the scores become x sq + bias, so
  // the row max and the exponent take them with a unit multiplier (fmaf(x, 1, -m) == x - m exactly)
  const float* dsg = p.k_bias != nullptr ? p.k_bias + (size_t)bh * p.Nkv_pad : nullptr;
  float sx[2] = {dsg != nullptr ? 1.f : sq[0], dsg != nullptr ? 1.f : sq[1]};

  float o[C::DT][4];
#pragma unroll
  for (int j = 0; j < C::DT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};

  int stage = 0;  // kb % STAGES
  for (int kb = 0; kb < nblk; ++kb) {
    if constexpr (STAGES == 2) {
      if (kb + 1 < nblk) {
        load_stage(stage ^ 1, kb + 1);
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
    } else {
      // groups in flight: blocks kb and kb+1 (possibly empty); wait for kb. After the barrier every
      // warp is done with block kb-1, whose buffer ((kb+2) % 3) takes block kb+2.
      cp_async_wait<1>();
      __syncthreads();
      if (kb + 2 < nblk) load_stage(stage == 0 ? 2 : stage - 1, kb + 2);
      cp_async_commit();
    }

    const uint32_t sk = sbase + stage * C::STAGE;
    const uint32_t sv = sk + C::K_BYTES;
    const float* sks = reinterpret_cast<const float*>(smem + stage * C::STAGE + C::K_BYTES + C::V_BYTES);
    const float* svp = sks + BN;

    // ---- S = Q^ K^T (int32 + MAGIC) ----
    uint32_t sacc[C::NT][4];
#pragma unroll
    for (int j = 0; j < C::NT; ++j) sacc[j][0] = sacc[j][1] = sacc[j][2] = sacc[j][3] = kMagicI;
    constexpr int JG = C::KCH >= 4 ? 1 : 2;
#pragma unroll
    for (int j0 = 0; j0 < C::NT; j0 += JG) {
      uint32_t bf[JG * C::KCH];
      load_b_frags<C::KCH, C::KSTR, JG>(bf, sk, 8 * j0, lane);
#pragma unroll
      for (int jj = 0; jj < JG; ++jj)
#pragma unroll
        for (int s = 0; s < C::QKS; ++s)
          mma_int<S4>(sacc[j0 + jj], qf[s], bf[jj * C::KCH + 2 * s], bf[jj * C::KCH + 2 * s + 1]);
    }

    // ---- scores, block max, exponentials ----
    float x[C::NT][4];
    const bool partial = (kb + 1) * BN > kv_len;
#pragma unroll
    for (int j = 0; j < C::NT; ++j) {
      const float2 ks = *reinterpret_cast<const float2*>(sks + 8 * j + 2 * t);
      x[j][0] = (__uint_as_float(sacc[j][0]) - kMagicF) * ks.x;
      x[j][1] = (__uint_as_float(sacc[j][1]) - kMagicF) * ks.y;
      x[j][2] = (__uint_as_float(sacc[j][2]) - kMagicF) * ks.x;
      x[j][3] = (__uint_as_float(sacc[j][3]) - kMagicF) * ks.y;
    }
    if (dsg != nullptr) {
#pragma unroll
      for (int j = 0; j < C::NT; ++j) {
        const float2 ds = __ldg(reinterpret_cast<const float2*>(dsg + kb * BN + 8 * j + 2 * t));
        x[j][0] = fmaf(x[j][0], sq[0], ds.x);
        x[j][1] = fmaf(x[j][1], sq[0], ds.y);
        x[j][2] = fmaf(x[j][2], sq[1], ds.x);
        x[j][3] = fmaf(x[j][3], sq[1], ds.y);
      }
    }
    if (partial) {
#pragma unroll
      for (int j = 0; j < C::NT; ++j) {
        const int key = kb * BN + 8 * j + 2 * t;
        if (key >= kv_len) x[j][0] = x[j][2] = -INFINITY;
        if (key + 1 >= kv_len) x[j][1] = x[j][3] = -INFINITY;
      }
    }
    float xmax[2];
    rowmath::block_row_max(x, xmax);
    // online combine with a lazily moved reference max (rowmath::online_combine)
    float mblk[2], c_fac[2];
    mblk[0] = sx[0] * xmax[0];
    mblk[1] = sx[1] * xmax[1];
    rowmath::online_combine(mblk, m_run, l_run, o, c_fac);
    // row sums of P^ = P~ (+ 8): the words MAGIC_I + P~ summed as integers (mod 2^32), the MAGIC_I terms removed
    // after the loop -- exact, so equal to the wgmma kernel's byte sums
    uint32_t p_sum[2] = {0u, 0u};
    constexpr float kPMul = PMODE == kPRange ? 15.f : 7.f;
    constexpr float kPAdd = PMODE == kPRange ? kMagicF - 8.f : kMagicF;
    uint32_t pw[C::NT][4];  // float bits; low byte / nibble = P~
#pragma unroll
    for (int j = 0; j < C::NT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        float pe = ex2(fmaf(x[j][e], sx[r], -mblk[r]));
        if (partial) {
          const int key = kb * BN + 8 * j + 2 * t + (e & 1);
          if (key >= kv_len) pe = 0.f;
        }
        pw[j][e] = __float_as_uint(fmaf(pe, kPMul, kPAdd));
        p_sum[r] += pw[j][e];
      }
    }
    {
      constexpr uint32_t kTerms = 2 * C::NT;  // words per row and thread in this block
      constexpr uint32_t kOffset = (uint32_t)kMagicI * kTerms - (PMODE == kPRange ? 8u * kTerms : 0u);
      p_sum[0] -= kOffset;
      p_sum[1] -= kOffset;
    }
    rowmath::add_row_counts(p_sum, c_fac, l_run);

    // ---- P~ A fragments ----
    uint32_t pf[C::PKS][4];
#pragma unroll
    for (int s = 0; s < C::PKS; ++s) {
      if constexpr (!S4) {  // 32 positions = n-tiles 4s..4s+3
        pf[s][0] = pack_low_bytes(pw[4 * s][0], pw[4 * s][1], pw[4 * s + 1][0], pw[4 * s + 1][1]);
        pf[s][1] = pack_low_bytes(pw[4 * s][2], pw[4 * s][3], pw[4 * s + 1][2], pw[4 * s + 1][3]);
        pf[s][2] = pack_low_bytes(pw[4 * s + 2][0], pw[4 * s + 2][1], pw[4 * s + 3][0], pw[4 * s + 3][1]);
        pf[s][3] = pack_low_bytes(pw[4 * s + 2][2], pw[4 * s + 2][3], pw[4 * s + 3][2], pw[4 * s + 3][3]);
      } else {  // 64 positions = n-tiles 8s..8s+7; nibble i <- tile i/2, element i&1
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int j0 = 8 * s + 4 * (q >> 1);
          const int e0 = 2 * (q & 1);  // row g (0) or g+8 (2)
          uint32_t ev = pack_low_bytes(pw[j0][e0], pw[j0 + 1][e0], pw[j0 + 2][e0], pw[j0 + 3][e0]);
          uint32_t od = pack_low_bytes(pw[j0][e0 + 1], pw[j0 + 1][e0 + 1], pw[j0 + 2][e0 + 1], pw[j0 + 3][e0 + 1]);
          // q: 0 -> a0 (row g, first half), 1 -> a1 (row g+8), 2 -> a2, 3 -> a3
          pf[s][(q & 1) | ((q >> 1) << 1)] = (ev & 0x0F0F0F0Fu) | ((od & 0x0F0F0F0Fu) << 4);
        }
      }
    }

    // ---- O = O*a + c * (P~ V^ + 8 colsum) * v_scale ----
    constexpr int VJG = C::VCH >= 4 ? 1 : 2;
#pragma unroll
    for (int j0 = 0; j0 < C::DT; j0 += VJG) {
      uint32_t bf[VJG * C::VCH];
      load_b_frags<C::VCH, C::VSTR, VJG>(bf, sv, 8 * j0, lane);
#pragma unroll
      for (int jj = 0; jj < VJG; ++jj) {
        const int j = j0 + jj;
        const float4 vp = *reinterpret_cast<const float4*>(svp + 2 * (8 * j + 2 * t));
        uint32_t acc[4];
        float bias0 = kMagicF, bias1 = kMagicF;
        if constexpr (LEAN) {
          acc[0] = acc[1] = acc[2] = acc[3] = kMagicI;
          bias0 = 2.f * kMagicF - vp.y;  // = MAGIC_F - 8 colsum (exact)
          bias1 = 2.f * kMagicF - vp.w;
        } else {
          acc[0] = acc[2] = __float_as_uint(vp.y);
          acc[1] = acc[3] = __float_as_uint(vp.w);
        }
#pragma unroll
        for (int s = 0; s < C::PKS; ++s)
          mma_int<S4>(acc, pf[s], bf[jj * C::VCH + 2 * s], bf[jj * C::VCH + 2 * s + 1]);
        o[j][0] = fmaf(c_fac[0] * (__uint_as_float(acc[0]) - bias0), vp.x, o[j][0]);
        o[j][1] = fmaf(c_fac[0] * (__uint_as_float(acc[1]) - bias1), vp.z, o[j][1]);
        o[j][2] = fmaf(c_fac[1] * (__uint_as_float(acc[2]) - bias0), vp.x, o[j][2]);
        o[j][3] = fmaf(c_fac[1] * (__uint_as_float(acc[3]) - bias1), vp.z, o[j][3]);
      }
    }
    if constexpr (STAGES == 2) __syncthreads();
    stage = stage + 1 == STAGES ? 0 : stage + 1;
  }

  rowmath::store_rows<D>(p, o, l_run, row_base, g, t, b, h);
}

template <int D, int BN, bool S4, int PMODE, int NW, int MINB, int STAGES, bool LEAN>
cudaError_t launch_nw(const AttnParams& p, cudaStream_t stream) {
  using C = Cfg<D, BN, S4>;
  constexpr int smem = STAGES * C::STAGE;
  auto kernel = int4_attention_kernel<D, BN, S4, PMODE, NW, MINB, STAGES, LEAN>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  dim3 grid(p.Nq_pad / (16 * NW), p.H, p.B);
  kernel<<<grid, NW * 32, smem, stream>>>(p);
  return cudaGetLastError();
}

// Launch configuration. Profiled on H100 (Nsight Compute, Wan2.1-1.3B shape; RESULTS.md): the kernel is
// latency-bound (3 warps per scheduler, issue slots 55% busy, stalls mostly on fixed-latency dependencies
// and on shared-memory loads), not bound by tensor pipe (26%), shared memory (60%) or L2 (47%).
// Defaults on the s8 path at block_n 64 (attention only, same H100 session, identical output bits):
//   head_dim 128: LEAN + 3 stages (one barrier per key block), 3 CTAs/SM: +5-6% over the first kernel;
//   head_dim 64:  LEAN + 2 stages, 4 CTAs/SM (128 registers):                +11-12%.
// Other paths (block_n 128, the s4 path) keep the first kernel's configuration. 8 warps per CTA (BM 128):
// 1 CTA/SM at 255 registers was slower (279 TOP/s), 2 CTAs/SM at 128 registers +2-4% (below LEAN+3 stages).
// Tuning aid: building with -DROTVID_ATTN_VARIANTS (ROTVID_EXT_CUDA_FLAGS at build time) adds the
// variants below for the s8 path at block_n 64, picked at run time by ROTVID_ATTN_VARIANT=<n>.
template <int D, int BN, bool S4, int PMODE>
cudaError_t launch_one(const AttnParams& p, cudaStream_t stream) {
  constexpr bool kTuned = !S4 && BN == 64;
  constexpr int kMinBlocks = kTuned && D == 64 ? 4 : ROTVID_NW4_MINB;
  constexpr int kStages = kTuned && D == 128 ? 3 : 2;
#ifdef ROTVID_ATTN_VARIANTS
  if constexpr (kTuned) {
    const char* env = std::getenv("ROTVID_ATTN_VARIANT");  // read per call: a tuning build only
    const int variant = env != nullptr ? std::atoi(env) : 0;
    switch (variant) {
      case 1: return launch_nw<D, BN, S4, PMODE, 4, 3, 2, false>(p, stream);  // the first kernel
      case 2: return launch_nw<D, BN, S4, PMODE, 4, 3, 2, true>(p, stream);   // lean, 2 stages
      case 3: return launch_nw<D, BN, S4, PMODE, 4, 3, 3, true>(p, stream);   // lean, 3 stages
      case 4: return launch_nw<D, BN, S4, PMODE, 8, 2, 3, true>(p, stream);   // BM 128, 2 CTAs/SM
      case 5: return launch_nw<D, BN, S4, PMODE, 4, 4, 2, true>(p, stream);   // 4 CTAs/SM
      case 6:
        if constexpr (D == 64) return launch_nw<D, BN, S4, PMODE, 4, 5, 2, true>(p, stream);  // 5 CTAs/SM
        break;
      default: break;
    }
  }
#endif
  return launch_nw<D, BN, S4, PMODE, 4, kMinBlocks, kStages, kTuned>(p, stream);
}

template <int D, bool S4>
cudaError_t launch_for_dim(const AttnParams& p, int block_n, int p_mode, cudaStream_t stream) {
  if (block_n == 64) {
    return p_mode == kPRange ? launch_one<D, 64, S4, kPRange>(p, stream) : launch_one<D, 64, S4, kPSym>(p, stream);
  }
  if (block_n == 128) {
    return p_mode == kPRange ? launch_one<D, 128, S4, kPRange>(p, stream) : launch_one<D, 128, S4, kPSym>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace attn
}  // namespace rotvid
