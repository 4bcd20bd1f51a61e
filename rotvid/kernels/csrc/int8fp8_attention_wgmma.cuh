// The int8-fp8 recipe on Hopper's warpgroup tensor cores (sm90a: wgmma, TMA, mbarriers): INT8 Q/K per token,
// P and V in FP8 e4m3 (V one scale per channel), FP32 accumulation across key blocks. Numerics of
// rotvid.kernels.reference (recipe "int8-fp8"), per key block of BN = 128 keys (192 and 256 in tuning variants only,
// see Cfg and launch8_dim -- the block max is part of the numerics):
//   S = Q^ K^T (s8 wgmma, int32, exact; K^ with one scale ks per group of 32 keys -- the keys one thread holds),
//   m_blk = max over the row of float(S) * (sq ks) (sq = q_scale * qk_scale; the max taken on the integers),
//   P8 = e4m3(448 * exp2(float(S) sq ks - m_blk)) -- computed as ex2(x sq - (m_blk - log2 448)), so 448 is exact in
//   real arithmetic and within an ulp in float; at head_dim 64 without the I2F, see MAGIC --, pv = P8 V8 (e4m3 wgmma, a fresh FP32 accumulator per
//   block), l_blk = rowsum of the same 448 p in fp32 (the unquantized p, as the reference), then
//   O = O a + c pv, l = l a + c l_blk (lazy reference max, rowmath::online_combine), and at the end
//   out = O / l * v_scale (+ v_mean): the 448 cancels in O / l and the per-channel V scale factors out of the
//   sum over keys, so neither is applied per block (one FFMA per O element and block).
//
// The CTA skeleton is the INT4 Hopper kernel's (int4_attention_wgmma.cuh): two consumer warpgroups of 64 query
// rows, a producer warpgroup issuing TMA copies of K^ / V8^T tiles and the K scales into a ring of stages, the
// ping-pong turn between consumers (PINGPONG 2, head_dim 128) and the next QK^T issued during the O update (PIPE 1;
// attn_int8fp8_wgmma.cu picks the schedule per head_dim). V8^T keys are permuted per 32 exactly as the s8 layout
// (int4_common.cuh), so that the S accumulator layout is the e4m3 A-fragment layout.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <type_traits>

#include "int4_attention_wgmma.cuh"

namespace rotvid {
namespace wg8 {

// NWG consumer warpgroups of 64 query rows (BM = 64 NWG) and one producer warpgroup. Two: the INT4 kernel's
// layout (240 registers per consumer thread, ping-pong possible); three: more warps per scheduler to hide the
// softmax's latencies, at 160 registers (fits without the next block's S in flight: PIPE 0).
template <int NWG>
struct Shape {
  static constexpr int BM = 64 * NWG;
  static constexpr int CONSUMER_WARPS = 4 * NWG;
  static constexpr int THREADS = 128 * (NWG + 1);
  static constexpr int PRODUCER_REGS = 24;
  static constexpr int CONSUMER_REGS = NWG == 2 ? 240 : 160;  // 24 x 128 + REGS x 128 NWG <= 65536
};

// A key block of BN = 128, 192 or 256 keys is loaded as NSUB sub-blocks of SUBN = 128 keys (the K group scales'
// block and the widest V^T row a 128-byte swizzle takes), or 64 when BN is not a multiple of 128: K sub-block i at
// K + i SUBN D, V^T sub-block i at V + i D SUBN; each sub-block lies in one 128-key group block (its 4 scales).
template <int D, int ST, int BN, int NWG = 2>
struct Cfg {
  static constexpr int SUBN = BN % 128 == 0 ? 128 : 64;
  static constexpr int NSUB = BN / SUBN;
  static constexpr int Q_BYTES = Shape<NWG>::BM * D;
  static constexpr int K_BYTES = BN * D;
  static constexpr int V_BYTES = D * BN;
  static constexpr int KS_BYTES = 16 * NSUB;  // the block's four K group scales per sub-block
  static constexpr int STAGES = ST;
  static constexpr int STAGE_BYTES = K_BYTES + V_BYTES;
  // layout: [Q][K0 V0][K1 V1]...[KS0][KS1]...[barriers]
  static constexpr int TILES = Q_BYTES + STAGES * STAGE_BYTES;
  static constexpr int SMALL = STAGES * KS_BYTES;
  static constexpr int BARS = (2 * STAGES + 1) * 8;
  static constexpr int SMEM = 1024 + TILES + SMALL + BARS;
  static constexpr int QK_SWIZZLE = D == 128 ? 128 : 64;
  static constexpr int V_SWIZZLE = SUBN;
  static constexpr uint32_t TX = K_BYTES + V_BYTES + KS_BYTES;
};

// P.V: int4_attention_wgmma.cuh's e4m3 wgmma (f32 += e4m3 x e4m3, A from registers).
using wg::wgmma_pv_e4m3;

// Scores to float. MAGIC 0: I2F of the int32 score (a conversion: quarter rate). MAGIC 1: the QK^T accumulator
// starts at kMagicI, whose bits as a float read 1.5 * 2^23 + S (exact for |S| < 2^22; |S| <= 127^2 * 128), and the
// offset is folded into the exponent's constant: x = (1.5 * 2^23 + S) * sq ks - (1.5 * 2^23 sq ks + m_blk - log2 448)
// in one FFMA, no conversion. The folded constant is rounded once per row and block: x moves by at most half an
// ulp of 1.5 * 2^23 sq ks (~1e-5 in log2 units at typical scales), the same for every score of the row in the block.
constexpr uint32_t kMagicI = 0x4B400000u;  // the bits of 12582912.0f = 1.5 * 2^23
constexpr float kMagicF = 12582912.0f;

template <int D, int BN, int STAGES, int PINGPONG, int PIPE, int NWG = 2, int MAGIC = 0>
__global__ void __launch_bounds__(Shape<NWG>::THREADS, 1)
    int8fp8_attention_wgmma_kernel(const __grid_constant__ AttnParams p, const __grid_constant__ CUtensorMap tm_q,
                                   const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v) {
#ifdef ROTVID_WGMMA_ENABLED
  static_assert(BN == 128 || BN == 192 || BN == 256, "key blocks of 128, 192 or 256 keys");
  static_assert(PIPE == 0 || PIPE == 1, "PIPE 0 or 1");
  static_assert(NWG == 2 || PINGPONG == 0, "the ping-pong turn is for two consumer warpgroups");
  using C = Cfg<D, STAGES, BN, NWG>;
  using S = Shape<NWG>;
  constexpr int kBM = S::BM;
  constexpr int kConsumerWarps = S::CONSUMER_WARPS;
  constexpr int kBN = BN;
  constexpr int ST = C::STAGES;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = wg::smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t s_q = base;
  auto s_k = [&](int s) { return base + C::Q_BYTES + s * C::STAGE_BYTES; };
  auto s_v = [&](int s) { return base + C::Q_BYTES + s * C::STAGE_BYTES + C::K_BYTES; };
  auto ks_ptr = [&](int s) { return reinterpret_cast<const float*>(smem + C::TILES + s * C::KS_BYTES); };
  constexpr int SUBN = C::SUBN;
  constexpr int NSUB = C::NSUB;
  const uint32_t bars = base + C::TILES + C::SMALL;
  auto full_bar = [&](int s) { return bars + 8 * s; };
  auto empty_bar = [&](int s) { return bars + 8 * (ST + s); };
  const uint32_t q_bar = bars + 8 * 2 * ST;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // 1-D grid: tiles below split_from run whole; each later tile (the last, partial wave) runs as p.splits CTAs,
  // split `part` taking key blocks [kb0, kb0 + nblk) -- the INT4 kernel's tail split (two consumer warpgroups only:
  // its partials and combine kernel are per 128-row tile)
  int tile = blockIdx.x, part = -1;
  if (tile >= p.split_from) {
    part = (tile - p.split_from) % p.splits;
    tile = p.split_from + (tile - p.split_from) / p.splits;
  }
  const int n_qt = (p.Nq_pad + kBM - 1) / kBM;  // (a tile may run past Nq_pad into the next head's rows: unused)
  const int mb = tile % n_qt, h = (tile / n_qt) % p.H, b = tile / (n_qt * p.H);
  const int bh = b * p.H + h;
  int kv_len = p.Nkv;
  if (p.kv_lens != nullptr) kv_len = min(p.kv_lens[b], p.Nkv);
  int nblk = (kv_len + kBN - 1) / kBN, kb0 = 0;
  if (part >= 0) {
    kb0 = (int)((long long)nblk * part / p.splits);
    nblk = (int)((long long)nblk * (part + 1) / p.splits) - kb0;
    kv_len -= kb0 * kBN;  // the consumers count keys from this split's first block
  }

  if (tid == 0) {
    for (int s = 0; s < ST; ++s) {
      wg::mbar_init(full_bar(s), 1);
      wg::mbar_init(empty_bar(s), kConsumerWarps);
    }
    wg::mbar_init(q_bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp >= kConsumerWarps) {  // ---- producer warpgroup ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(S::PRODUCER_REGS));
    if (warp == kConsumerWarps && lane == 0) {
      wg::mbar_expect_tx(q_bar, C::Q_BYTES);
      wg::tma_load_2d(s_q, &tm_q, 0, bh * p.Nq_pad + mb * kBM, q_bar);
      const float* ksg = p.k_scale + (size_t)bh * (p.Nkv_pad / 128) * 4;
      const uint32_t small = base + C::TILES;
      for (int i = 0; i < nblk; ++i) {
        const int s = i % ST;
        wg::mbar_wait(empty_bar(s), ((i / ST) & 1) ^ 1);
        wg::mbar_expect_tx(full_bar(s), C::TX);
        const int kb = kb0 + i;
#pragma unroll
        for (int hf = 0; hf < NSUB; ++hf) {
          // a sub-block past Nkv_pad (the last block of 192 / 256 keys): K rows of the next head or past the map
          // (zeros), V^T columns past the map (zeros), the first sub-block's scales again -- all of them masked keys
          const int key0 = kb * kBN + hf * SUBN;
          wg::tma_load_2d(s_k(s) + hf * SUBN * D, &tm_k, 0, bh * p.Nkv_pad + key0, full_bar(s));
          wg::tma_load_2d(s_v(s) + hf * D * SUBN, &tm_v, key0, bh * D, full_bar(s));
          const int gb = (key0 < p.Nkv_pad ? key0 : kb * kBN) / 128;  // the 128-key group block of the sub-block
          wg::bulk_load(small + s * C::KS_BYTES + 16 * hf, ksg + (size_t)gb * 4, 16, full_bar(s));
        }
      }
    }
  } else {  // ---- consumers ----

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(S::CONSUMER_REGS));
  const uint32_t utid = (uint32_t)tid;
  const int wg_i = (int)(utid >> 7), wi = (int)((utid >> 5) & 3);
  const int g = (int)((utid >> 2) & 7), t = (int)(utid & 3);
  const int row_base = mb * kBM + wg_i * 64 + wi * 16;
  float sq[2];
  // (rows past Nq_pad belong to the next head or to no head: scale 0, their output is not stored)
  sq[0] = row_base + g < p.Nq_pad ? p.q_scale[(size_t)bh * p.Nq_pad + row_base + g] * p.qk_scale : 0.f;
  sq[1] = row_base + g + 8 < p.Nq_pad ? p.q_scale[(size_t)bh * p.Nq_pad + row_base + g + 8] * p.qk_scale : 0.f;
  const uint64_t desc_q = wg::smem_desc(s_q + wg_i * 64 * D, C::QK_SWIZZLE);

  constexpr int NTS = SUBN / 8;  // score n-tiles per sub-block
  constexpr int DT = D / 8;
  constexpr int QKS = D / 32;
  constexpr int PKS = kBN / 32;
  float o[DT][4];
#pragma unroll
  for (int j = 0; j < DT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};

  uint32_t sacc[NSUB][NTS * 4];  // S of the current key block, per sub-block
  float pacc[D / 2];      // P8 V8 of the current key block
  uint32_t pf[PKS][4];    // P8 A fragments
  float sqk[NSUB][2];  // sq * this thread's K group scale (per sub-block), for the block in flight
  float mblk[2];
  float c_fac[2];

  auto issue_qk = [&](const int s) {
    if constexpr (MAGIC != 0) {
#pragma unroll
      for (int hf = 0; hf < NSUB; ++hf)
#pragma unroll
        for (int i = 0; i < NTS * 4; ++i) sacc[hf][i] = kMagicI;
    }
    wg::wgmma_fence();
#pragma unroll
    for (int hf = 0; hf < NSUB; ++hf) {
      const uint64_t desc_k = wg::smem_desc(s_k(s) + hf * SUBN * D, C::QK_SWIZZLE);
      wg::wgmma_qk<SUBN, MAGIC != 0 ? 1 : 0>(sacc[hf], desc_q, desc_k);  // scale-d 1: accumulate onto kMagicI
#pragma unroll
      for (int ks = 1; ks < QKS; ++ks) wg::wgmma_qk<SUBN, 1>(sacc[hf], desc_q + 2 * ks, desc_k + 2 * ks);
    }
    wg::wgmma_commit();
  };
  auto issue_pv = [&](const int s) {
    constexpr int SKS = SUBN / 32;  // k-steps of P.V per sub-block
    wg::wgmma_fence();
#pragma unroll
    for (int k = 0; k < PKS; ++k) {
      const uint64_t desc_v = wg::smem_desc(s_v(s) + (k / SKS) * D * SUBN, C::V_SWIZZLE) + 2 * (k % SKS);
      if (k == 0) {
        wgmma_pv_e4m3<D, 0>(pacc, pf[0], desc_v);
      } else {
        wgmma_pv_e4m3<D, 1>(pacc, pf[k], desc_v);
      }
    }
    wg::wgmma_commit();
  };
  auto turn_wait = [&]() {
    if constexpr (PINGPONG != 0) asm volatile("bar.sync %0, 256;\n" ::"r"(1 + wg_i) : "memory");
  };
  auto turn_pass = [&](bool last) {
    if constexpr (PINGPONG != 0) {
      if (!(last && wg_i == 1)) asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - wg_i) : "memory");
    }
  };
  if (PINGPONG != 0 && wg_i == 1 && nblk > 0) asm volatile("bar.arrive 1, 256;\n" ::: "memory");

  // block max and online combine. Thread t holds the keys of K group t (columns 8j + 2t, 8j + 2t + 1), so one
  // scale ks multiplies all its scores: the row max is taken on the exact integers (masked keys excluded), the
  // scores enter the exponent as float(S) * (sq ks) in one FFMA.
  auto scores_max = [&](const int kb, const int s, auto partial_tag) {
    constexpr bool PARTIAL = decltype(partial_tag)::value;
    float xmr[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int hf = 0; hf < NSUB; ++hf) {
      const float ks = ks_ptr(s)[4 * hf + t];
      int mi[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) mi[i][0] = mi[i][1] = INT_MIN;
#pragma unroll
      for (int j = 0; j < NTS; ++j) {
        int a[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) a[e] = (int)sacc[hf][4 * j + e];
        if constexpr (PARTIAL) {
          const int key = kb * kBN + hf * SUBN + 8 * j + 2 * t;
          if (key >= kv_len) a[0] = a[2] = INT_MIN;
          if (key + 1 >= kv_len) a[1] = a[3] = INT_MIN;
        }
        mi[j & 3][0] = max(mi[j & 3][0], max(a[0], a[1]));
        mi[j & 3][1] = max(mi[j & 3][1], max(a[2], a[3]));
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        sqk[hf][r] = sq[r] * ks;
        const int m = max(max(mi[0][r], mi[1][r]), max(mi[2][r], mi[3][r]));
        // (a thread whose keys are all masked offers -inf; a valid key is in every block)
        const float xm = m == INT_MIN ? -INFINITY : __int2float_rn(MAGIC != 0 ? m - (int)kMagicI : m) * sqk[hf][r];
        xmr[r] = fmaxf(xmr[r], xm);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float xm = xmr[r];
      xm = fmaxf(xm, __shfl_xor_sync(0xffffffffu, xm, 1));
      xm = fmaxf(xm, __shfl_xor_sync(0xffffffffu, xm, 2));
      mblk[r] = xm;
    }
    rowmath::online_combine(mblk, m_run, l_run, o, c_fac);
  };
  // 448 p, its row sums and the e4m3 A fragments
  auto exps_pack = [&](const int kb, auto partial_tag) {
    constexpr bool PARTIAL = decltype(partial_tag)::value;
    float mshift[NSUB][2];
#pragma unroll
    for (int hf = 0; hf < NSUB; ++hf) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mshift[hf][r] = mblk[r] - rowmath::kLog2Fp8Max;
        if constexpr (MAGIC != 0) mshift[hf][r] = fmaf(kMagicF, sqk[hf][r], mshift[hf][r]);
      }
    }
    float ls[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
    for (int k = 0; k < PKS; ++k) {
      float pe[4][4];
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int j = 4 * k + jj;
        const int hf = j / NTS, jl = j % NTS;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          const uint32_t raw = sacc[hf][4 * jl + e];
          const float sf = MAGIC != 0 ? __uint_as_float(raw) : __int2float_rn((int)raw);
          float v = rowmath::ex2(fmaf(sf, sqk[hf][r], -mshift[hf][r]));
          if constexpr (PARTIAL) {
            const int key = kb * kBN + 8 * j + 2 * t + (e & 1);
            if (key >= kv_len) v = 0.f;
          }
          pe[jj][e] = v;
          ls[r][jj & 1] += v;
        }
      }
      auto& f = pf[k];
      f[0] = rowmath::pack_e4m3x4(pe[0][0], pe[0][1], pe[1][0], pe[1][1]);  // rows g / g+8, the accumulator's key order
      f[1] = rowmath::pack_e4m3x4(pe[0][2], pe[0][3], pe[1][2], pe[1][3]);
      f[2] = rowmath::pack_e4m3x4(pe[2][0], pe[2][1], pe[3][0], pe[3][1]);
      f[3] = rowmath::pack_e4m3x4(pe[2][2], pe[2][3], pe[3][2], pe[3][3]);
    }
    l_run[0] = fmaf(c_fac[0], ls[0][0] + ls[0][1], l_run[0]);
    l_run[1] = fmaf(c_fac[1], ls[1][0] + ls[1][1], l_run[1]);
  };
  auto softmax_issue_pv = [&](const int kb, const int s, auto partial_tag) {
    scores_max(kb, s, partial_tag);
    exps_pack(kb, partial_tag);
    if constexpr (PINGPONG == 2) turn_wait();
    issue_pv(s);
  };
  // O = O + c pv (O was rescaled by a in online_combine), then the stage goes back to the producer
  auto update_o = [&](const int s) {
#pragma unroll
    for (int j = 0; j < DT; ++j) {
      o[j][0] = fmaf(c_fac[0], pacc[4 * j + 0], o[j][0]);
      o[j][1] = fmaf(c_fac[0], pacc[4 * j + 1], o[j][1]);
      o[j][2] = fmaf(c_fac[1], pacc[4 * j + 2], o[j][2]);
      o[j][3] = fmaf(c_fac[1], pacc[4 * j + 3], o[j][3]);
    }
    __syncwarp();
    if ((utid & 31) == 0) wg::mbar_arrive(empty_bar(s));
  };

  wg::mbar_wait(q_bar, 0);
  if (nblk > 0) {
    wg::mbar_wait(full_bar(0), 0);
    if constexpr (PINGPONG == 1) turn_wait();
    issue_qk(0);
    if constexpr (PINGPONG == 1) turn_pass(nblk == 1);
  }
  for (int kb = 0; kb < nblk; ++kb) {
    const int s = kb % ST;
    const int s1 = (kb + 1) % ST;
    const bool has_next = kb + 1 < nblk;
    wg::wgmma_wait<0>();  // S of block kb
    if ((kb + 1) * kBN > kv_len) {
      softmax_issue_pv(kb, s, std::true_type{});
    } else {
      softmax_issue_pv(kb, s, std::false_type{});
    }
    if (PIPE == 1 && has_next) {
      wg::mbar_wait(full_bar(s1), ((kb + 1) / ST) & 1);
      if constexpr (PINGPONG == 1) turn_wait();
      issue_qk(s1);
      if constexpr (PINGPONG == 1) turn_pass(kb + 2 == nblk);
      if constexpr (PINGPONG == 2) turn_pass(false);
      wg::wgmma_wait<1>();
    } else {
      if constexpr (PINGPONG == 2) turn_pass(!has_next);
      wg::wgmma_wait<0>();
    }
    update_o(s);
    if (PIPE == 0 && has_next) {
      wg::mbar_wait(full_bar(s1), ((kb + 1) / ST) & 1);
      if constexpr (PINGPONG == 1) turn_wait();
      issue_qk(s1);
      if constexpr (PINGPONG == 1) turn_pass(kb + 2 == nblk);
    }
  }

  if (part < 0) {
    rowmath::store_rows_channel_scaled<D>(p, o, l_run, row_base, g, t, b, h);  // O / l * v_scale (+ v_mean)
  } else if constexpr (NWG == 2) {  // partials of this split: O * v_scale (relative to m_run), m_run, l per row
    float* w = p.ws + ((size_t)(tile - p.split_from) * p.splits + part) * kBM * (D + 2);
    rowmath::store_split_partials<D>(w, o, m_run, l_run, row_base - mb * kBM + g, t, p.vparams + (size_t)bh * D);
  }
  }  // consumers
#endif  // ROTVID_WGMMA_ENABLED
}

}  // namespace wg8
}  // namespace rotvid
