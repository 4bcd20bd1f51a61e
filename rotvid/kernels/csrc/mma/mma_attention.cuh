// The mma.sync attention kernel (sm80/86/89, and sm90 beside the wgmma kernels): one CTA skeleton, the numerics a
// policy in its recipe's folder (recipes/int4/csrc/mma_numerics_int4.cuh: the INT4-valued recipes on the s4 or s8
// instructions; recipes/int8_fp8/csrc/mma_numerics_int8fp8.cuh: s8 Q^K^T and e4m3 P.V), the schedule per numerics
// (mma_schedule.cuh, each numerics' row beside its policy).
//
// One CTA = 16*NW query rows of one (batch, head); NW warps x 16 rows, Q^ fragments in registers for the whole loop.
// Key blocks of BN keys stream through STAGES shared-memory stages (cp.async): the K^ tile, the V^T tile and the
// policy's per-block scale data. Per key block the skeleton runs
//   S = Q^ K^T             integer mma.sync (s4 m16n8k64 or s8 m16n8k32), accumulator started at N::kScoreAccInit;
//   num.block_max          the numerics: scores (keys at or past kv_len masked), the block's row max m_blk;
//   online_combine         the lazily moved reference max (rowmath): O and l rescaled, the block factor c;
//   num.p_fragments        the numerics: P, l += c rowsum(P), P's A fragments;
//   num.pv_tile            per 8 output columns (V^T B fragments loaded here): the P.V mma, O += c (P V);
// then the epilogue N::store. The blocks come from the key-block walk (key_blocks.cuh): step i visits block
// next_block(kb, i, pos) and keys are masked by absolute index, so a block list replaces the dense walk without
// touching the numerics. SPARSE (a template flag: the dense instantiations are the kernel as it was, code
// included) walks the CTA's row of the block map (AttnParams.map_*) with MapKeyBlocks, whose values it does not
// trust (key_blocks.cuh): a map row covers kMapBlock = 128 query rows and
// a CTA 16 * NW of them (64 or 128, dividing 128), so CTA mb reads map row mb * 16 * NW / 128; a skipped block is
// never loaded (no cp.async), multiplied or exponentiated. A CTA whose row keeps no block before kv_len writes 0 (no
// V mean: l = 0 there, as the reference). The kernel has no split over the keys, so no partials.
//
// A numerics policy N (a struct; see the two policy headers) provides
//   Tiles = MmaTiles<D, BN, S4, SCALE_BYTES>  operand geometry (S4: 4-bit operands) and its per-stage scale bytes;
//   kMinArch                                 the lowest __CUDA_ARCH__ of its instructions (compiled out below);
//   kScoreAccInit                            the bits the Q^K^T accumulator starts from;
//   BlockScales(p, bh), .load<NTH>(dst, blk, tid)   cp.async of key block blk's scale data into a stage;
//   N(p, bh, row_base, g)                    the per-row state (score scales, Q smoothing), after Q^ is loaded;
//   View view(scales, t)                     what this thread reads of a stage's scale data (before Q^K^T);
//   Scores                                   the block's per-thread arrays (the skeleton declares one per block);
//   block_max(sacc, view, blk, kv_len, partial, t, sc, mblk)
//   p_fragments(sacc, sc, mblk, blk, kv_len, partial, t, c_fac, l_run, pf)
//   pv_tile<LEAN>(o[j], pf, b, view, j, t, c_fac)
//   static store(p, o, l_run, row_base, g, t, b, h)
//
// Bits and instructions: the policies do the floating-point operations of the two kernels this one replaced, in the
// same order; benchmarks/kernel_ptx_diff.py --family mma compares builds of two commits. The source order below is
// part of that: the dense walk is written out (KeyBlocks{0, nblk}, the partial-block test inline) because
// KeyBlocks::dense / partial, called with block_n as an argument, change the integer code (the widening multiply of
// the block index, the loop guard, the mask predicates); O, m, l are declared before Q^ and the policies' arrays in
// N::Scores (not as locals of their functions, which the inliner hoists to the kernel's entry), which keeps the loop
// registers in the order of before (else ptxas moves registers around on some instantiations).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "common/attention_params.cuh"
#include "common/rowmath.cuh"
#include "common/key_blocks.cuh"

namespace rotvid {
namespace mma {

// The oldest architecture the extension is built for: a numerics whose kMinArch is above it is compiled out below
// its kMinArch, and its launcher checks the kernel's binary version.
constexpr int kBaseArch = 800;

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

// s32 += s4 x s4 (m16n8k64, S4) or s8 x s8 (m16n8k32)
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

// Shared-memory geometry of one stage: [K^ tile BN x KSTR][V^T tile D x VSTR][SCALE_BYTES of the policy's scales].
// S4: two operand values per byte (Q^, K^ rows of D/2 bytes, V^T rows of BN/2 bytes per block).
template <int D_, int BN_, bool S4_, int SCALE_BYTES>
struct MmaTiles {
  static constexpr int D = D_;
  static constexpr int BN = BN_;
  static constexpr bool S4 = S4_;
  static constexpr int DB = S4 ? D / 2 : D;      // bytes per Q/K row
  static constexpr int VB = S4 ? BN / 2 : BN;    // bytes per V^T row per key block
  static constexpr int VROW_DIV = S4 ? 2 : 1;    // global V^T row: Nkv_pad / VROW_DIV bytes
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
  static constexpr int STAGE = K_BYTES + V_BYTES + SCALE_BYTES;
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

// The block-sparse walk of CTA mb (BM query rows, BM dividing the map's 128: map row mb * BM / 128).
template <int BM, int BN>
__device__ __forceinline__ MapKeyBlocks<BN> mma_map_walk(const AttnParams& p, int b, int h, int mb, int kv_len) {
  static_assert(kMapBlock % BM == 0, "a CTA's query rows lie in one row of the block map");
  const int row = b * p.map_sb + h * p.map_sh + mb / (kMapBlock / BM);
  return MapKeyBlocks<BN>::of_row(p.map_index + (size_t)row * p.map_kmax, __ldg(p.map_count + row), p.map_kmax,
                                  kv_len, p.Nkv, -1, 1);
}

// The CTA (schedule parameters from mma_schedule.cuh; every choice computes the same output bits):
//   STAGES 2: cp.async double buffer, two barriers per key block; 3: triple buffer, one barrier.
//   LEAN: per-thread load addresses computed once (the loop only adds the block offset), and the policy's P.V
//         accumulator may start at a constant (N::pv_tile<LEAN>).
//   SPARSE: the walk is the CTA's row of the block map (a CTA whose row keeps nothing writes 0 and returns).
template <class N, int NW, int MINB, int STAGES, bool LEAN, bool SPARSE>
__device__ __forceinline__ void mma_attention_cta(const AttnParams& p) {
  static_assert(STAGES == 2 || STAGES == 3, "2 or 3 pipeline stages");
  using T = typename N::Tiles;
  constexpr int D = T::D, BN = T::BN;
  constexpr int NTH = NW * 32;  // threads; BM = 16 * NW query rows
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int mb = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int bh = b * p.H + h;
  int kv_len = p.Nkv;
  if (p.kv_lens != nullptr) kv_len = min(p.kv_lens[b], p.Nkv);
  // (the dense walk assigned in place: returned from a helper function, it changed the int8-fp8 kernels' code)
  std::conditional_t<SPARSE, MapKeyBlocks<BN>, KeyBlocks> kb;
  if constexpr (SPARSE) {
    kb = mma_map_walk<16 * NW, BN>(p, b, h, mb, kv_len);
    if (kb.count == 0) {  // the map keeps no key of this tile: 0, without the V mean (every warp of the CTA alike)
      rowmath::store_zero_rows<D>(p, mb * (16 * NW) + warp * 16, g, t, b, h);
      return;
    }
  } else {
    kb = KeyBlocks{0, (kv_len + BN - 1) / BN};  // = KeyBlocks::dense(kv_len, BN, 0, 1): no tail split here
  }

  const int8_t* kg = p.k + (size_t)bh * p.Nkv_pad * T::DB;
  const size_t vrow = (size_t)p.Nkv_pad / T::VROW_DIV;
  const int8_t* vg = p.vt + (size_t)bh * D * vrow;
  const typename N::BlockScales scales(p, bh);
  const uint32_t sbase = smem_u32(smem);

  // LEAN addressing: chunk c = tid + i*NTH of the K tile sits at global byte c*16 of the block and at
  // smem row c / KCH; of the V^T tile at row c / VCH (global stride vrow), column c % VCH.
  static_assert(NTH % T::KCH == 0 && NTH % T::VCH == 0, "whole rows per thread group");
  const int8_t* k_thr = kg + tid * 16;
  const int8_t* v_thr = vg + (size_t)(tid / T::VCH) * vrow + (tid % T::VCH) * 16;
  const uint32_t kdst_thr = (tid / T::KCH) * T::KSTR + (tid % T::KCH) * 16;
  const uint32_t vdst_thr = T::K_BYTES + (tid / T::VCH) * T::VSTR + (tid % T::VCH) * 16;
  const size_t vstep = (size_t)(NTH / T::VCH) * vrow;

  auto load_stage_lean = [&](int stage, int blk) {
    const uint32_t so = sbase + stage * T::STAGE;
    const int8_t* ksrc = k_thr + (size_t)blk * (BN * T::DB);
#pragma unroll
    for (int i = 0; i < (BN * T::KCH + NTH - 1) / NTH; ++i) {
      if ((BN * T::KCH) % NTH == 0 || tid + i * NTH < BN * T::KCH)
        cp_async16(so + kdst_thr + i * (NTH / T::KCH) * T::KSTR, ksrc + i * NTH * 16);
    }
    const int8_t* vsrc = v_thr + (size_t)blk * T::VB;
#pragma unroll
    for (int i = 0; i < (D * T::VCH + NTH - 1) / NTH; ++i) {
      if ((D * T::VCH) % NTH == 0 || tid + i * NTH < D * T::VCH)
        cp_async16(so + vdst_thr + i * (NTH / T::VCH) * T::VSTR, vsrc + i * vstep);
    }
    scales.template load<NTH>(so + T::K_BYTES + T::V_BYTES, blk, tid);
  };

  auto load_stage = [&](int stage, int blk) {
    if constexpr (LEAN) {
      load_stage_lean(stage, blk);
      return;
    }
    const uint32_t sk = sbase + stage * T::STAGE;
    const uint32_t sv = sk + T::K_BYTES;
    const int8_t* ksrc = kg + (size_t)blk * BN * T::DB;
#pragma unroll
    for (int i = 0; i < (BN * T::KCH + NTH - 1) / NTH; ++i) {
      const int c = tid + i * NTH;
      if ((BN * T::KCH) % NTH == 0 || c < BN * T::KCH) {
        const int r = c / T::KCH, cc = c % T::KCH;
        cp_async16(sk + r * T::KSTR + cc * 16, ksrc + r * T::DB + cc * 16);
      }
    }
    const int8_t* vsrc = vg + (size_t)blk * T::VB;
#pragma unroll
    for (int i = 0; i < (D * T::VCH + NTH - 1) / NTH; ++i) {
      const int c = tid + i * NTH;
      if ((D * T::VCH) % NTH == 0 || c < D * T::VCH) {
        const int r = c / T::VCH, cc = c % T::VCH;
        cp_async16(sv + r * T::VSTR + cc * 16, vsrc + r * vrow + cc * 16);
      }
    }
    scales.template load<NTH>(sv + T::V_BYTES, blk, tid);
  };

  // the walk's cursors (SPARSE; the dense walk's block(i) needs none): the loads and the steps each read the walk's
  // blocks in order
  int pos_load = kb.first, pos_step = kb.first;
  load_stage(0, next_block(kb, 0, pos_load));  // (the walk is not empty: kv_len >= 1, rotvid.kernels.dispatch checks
                                               // kv_lens; SPARSE returned above)
  cp_async_commit();
  if constexpr (STAGES == 3) {
    if (kb.count > 1) load_stage(1, next_block(kb, 1, pos_load));
    cp_async_commit();
  }

  // the running output (in the policy's units), reference max and row sum of rows g, g + 8
  float o[T::DT][4];
#pragma unroll
  for (int j = 0; j < T::DT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};
  // Q^ fragments (registers for the whole loop), then the policy's per-row state
  const int row_base = mb * (16 * NW) + warp * 16;
  uint32_t qf[T::QKS][4];
  {
    const int8_t* qg = p.q + ((size_t)bh * p.Nq_pad + row_base) * T::DB;
#pragma unroll
    for (int s = 0; s < T::QKS; ++s) {
      qf[s][0] = *reinterpret_cast<const uint32_t*>(qg + g * T::DB + 32 * s + 4 * t);
      qf[s][1] = *reinterpret_cast<const uint32_t*>(qg + (g + 8) * T::DB + 32 * s + 4 * t);
      qf[s][2] = *reinterpret_cast<const uint32_t*>(qg + g * T::DB + 32 * s + 16 + 4 * t);
      qf[s][3] = *reinterpret_cast<const uint32_t*>(qg + (g + 8) * T::DB + 32 * s + 16 + 4 * t);
    }
  }
  const N num(p, bh, row_base, g);

  int stage = 0;  // i % STAGES
  for (int i = 0; i < kb.count; ++i) {
    const int blk = next_block(kb, i, pos_step);
    if constexpr (STAGES == 2) {
      if (i + 1 < kb.count) {
        load_stage(stage ^ 1, next_block(kb, i + 1, pos_load));
        cp_async_commit();
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();
    } else {
      // groups in flight: walk steps i and i+1 (possibly empty); wait for i. After the barrier every
      // warp is done with step i-1, whose buffer ((i+2) % 3) takes step i+2.
      cp_async_wait<1>();
      __syncthreads();
      if (i + 2 < kb.count) load_stage(stage == 0 ? 2 : stage - 1, next_block(kb, i + 2, pos_load));
      cp_async_commit();
    }

    const uint32_t sk = sbase + stage * T::STAGE;
    const uint32_t sv = sk + T::K_BYTES;
    const typename N::View view =
        num.view(reinterpret_cast<const float*>(smem + stage * T::STAGE + T::K_BYTES + T::V_BYTES), t);

    // ---- S = Q^ K^T (int32) ----
    uint32_t sacc[T::NT][4];
#pragma unroll
    for (int j = 0; j < T::NT; ++j) sacc[j][0] = sacc[j][1] = sacc[j][2] = sacc[j][3] = N::kScoreAccInit;
    constexpr int JG = T::KCH >= 4 ? 1 : 2;
#pragma unroll
    for (int j0 = 0; j0 < T::NT; j0 += JG) {
      uint32_t bf[JG * T::KCH];
      load_b_frags<T::KCH, T::KSTR, JG>(bf, sk, 8 * j0, lane);
#pragma unroll
      for (int jj = 0; jj < JG; ++jj)
#pragma unroll
        for (int s = 0; s < T::QKS; ++s)
          mma_int<T::S4>(sacc[j0 + jj], qf[s], bf[jj * T::KCH + 2 * s], bf[jj * T::KCH + 2 * s + 1]);
    }

    // ---- the numerics: scores (keys past kv_len masked) and the block's row max ----
    const bool partial = (blk + 1) * BN > kv_len;  // = KeyBlocks::partial(blk, BN, kv_len)
    typename N::Scores sc;
    float mblk[2];
    num.block_max(sacc, view, blk, kv_len, partial, t, sc, mblk);
    // ---- online softmax: the lazily moved reference max, O and l rescaled, the block's factor c ----
    float c_fac[2];
    rowmath::online_combine(mblk, m_run, l_run, o, c_fac);
    // ---- the numerics: P's A fragments, l += c rowsum(P) ----
    uint32_t pf[T::PKS][4];
    num.p_fragments(sacc, sc, mblk, blk, kv_len, partial, t, c_fac, l_run, pf);

    // ---- O += c (P V) per 8 output columns ----
    constexpr int VJG = T::VCH >= 4 ? 1 : 2;
#pragma unroll
    for (int j0 = 0; j0 < T::DT; j0 += VJG) {
      uint32_t bf[VJG * T::VCH];
      load_b_frags<T::VCH, T::VSTR, VJG>(bf, sv, 8 * j0, lane);
#pragma unroll
      for (int jj = 0; jj < VJG; ++jj)
        num.template pv_tile<LEAN>(o[j0 + jj], pf, bf + jj * T::VCH, view, j0 + jj, t, c_fac);
    }
    if constexpr (STAGES == 2) __syncthreads();  // every warp is done with this stage before it takes step i + 2
    stage = stage + 1 == STAGES ? 0 : stage + 1;
  }

  N::store(p, o, l_run, row_base, g, t, b, h);
}

// The one mma.sync attention kernel. A numerics whose instructions need a newer GPU than the build's is an empty
// kernel there (its launcher reports cudaErrorNotSupported).
template <class N, int NW, int MINB, int STAGES, bool LEAN, bool SPARSE>
__global__ void __launch_bounds__(NW * 32, MINB) mma_attention_kernel(const AttnParams p) {
#ifdef __CUDA_ARCH__
  if constexpr (__CUDA_ARCH__ >= N::kMinArch) mma_attention_cta<N, NW, MINB, STAGES, LEAN, SPARSE>(p);
#endif
}

template <class N, int NW, int MINB, int STAGES, bool LEAN, bool SPARSE>
cudaError_t launch_mma_walk(const AttnParams& p, cudaStream_t stream) {
  constexpr int smem = STAGES * N::Tiles::STAGE;
  auto kernel = mma_attention_kernel<N, NW, MINB, STAGES, LEAN, SPARSE>;
  cudaError_t err;
  if constexpr (N::kMinArch > kBaseArch) {
    cudaFuncAttributes attr{};
    err = cudaFuncGetAttributes(&attr, kernel);
    if (err != cudaSuccess) return err;
    if (attr.binaryVersion * 10 < N::kMinArch) return cudaErrorNotSupported;  // built for an older GPU
  }
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  dim3 grid(p.Nq_pad / (16 * NW), p.H, p.B);
  kernel<<<grid, NW * 32, smem, stream>>>(p);
  return cudaGetLastError();
}

// The kernel at a schedule: dense, or block-sparse when p carries a map (p.map_count).
template <class N, int NW, int MINB, int STAGES, bool LEAN>
cudaError_t launch_mma_attention(const AttnParams& p, cudaStream_t stream) {
  if (p.map_count != nullptr) {
    if (p.map_index == nullptr || p.map_kmax < 1 || p.map_sb < 0 || p.map_sh < 0) return cudaErrorInvalidValue;
    return launch_mma_walk<N, NW, MINB, STAGES, LEAN, true>(p, stream);
  }
  return launch_mma_walk<N, NW, MINB, STAGES, LEAN, false>(p, stream);
}

}  // namespace mma
}  // namespace rotvid
