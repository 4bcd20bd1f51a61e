// The Hopper attention kernel (sm90a: wgmma, TMA, mbarriers), one CTA skeleton for every numerics. The numerics
// is a policy N in its recipe's folder (recipes/int4/csrc/hopper_int4_numerics.cuh,
// recipes/int8_fp8/csrc/hopper_int8fp8_numerics.cuh): what each stage brings besides the K^ and
// V^T tiles, the scores' conversion, scaling and block max, P's quantization and the row sums, the O update and the
// output's scaling. This file holds what does not depend on it:
//
// - the tile schedule: a 1-D grid of 128-row query tiles (query block fastest, then head, then batch); tiles from
//   p.split_from on (the last, partial wave) run as p.splits CTAs each, split `part` taking its share of the key
//   blocks (KeyBlocks::dense, MapKeyBlocks::of_row) and writing (O, m, l) partials that combine_splits_kernel
//   merges;
// - the CTA: 3 warpgroups. Warpgroups 0 and 1 are consumers of 64 query rows each; warpgroup 2 is the producer
//   (setmaxnreg gives its registers to the consumers): one thread issues TMA copies of the Q tile (once) and of
//   each key block (K^ tile, V^T tile, then the numerics' small operands) into a ring of STAGES buffers, each
//   guarded by a "full" mbarrier (transaction bytes) and an "empty" mbarrier (one arrival per consumer thread);
// - the consumers' loop: S = wgmma m64nBNk32 s8 (A = Q^, B = K^ from 128/64-byte-swizzled shared memory); the
//   numerics' softmax in registers; P.V = wgmma m64nDk32 e4m3 with A = P from registers (the accumulator layout of
//   S is the A-fragment layout once V^T keys are permuted per 32, as the kernel layouts do) and B = V^T (K-major)
//   from shared memory; the online combine with the lazy reference max (rowmath::online_combine);
// - the overlap schedule (hopper_schedule.cuh picks it): PIPE 1 issues the next block's QK^T while P.V is in
//   flight, PIPE 2 right after P.V completes (both overlap it with the O update), PIPE 0 after the O update;
//   PINGPONG 1 makes the two consumer warpgroups take turns issuing the QK^T, PINGPONG 2 issuing P.V + the next
//   QK^T (FlashAttention-3's order);
// - the epilogue: the numerics' store of O / l, or the split's partials; LSE (a template flag, only for numerics
//   whose RETURNS_LSE is true, launched when p.lse is set: the LSE = false instantiations are the kernel as it was,
//   code included -- benchmarks/kernel_ptx_diff.py) each row's log-sum-exp into p.lse too, from the same m_run and
//   l_run (rowmath::row_lse), written by the whole tile's epilogue or by the split combine.
//
// Both the producer and the consumers walk the key blocks through KeyBlocks (key_blocks.cuh) and mask keys by
// their absolute index, so a block-sparse walk replaces the dense one without touching the numerics. SPARSE (a
// template flag: the dense instantiations are the kernel as it was, code included) walks the CTA's row of the
// block map (AttnParams.map_*: query tile = map row) with MapKeyBlocks: a skipped block is never loaded (no TMA),
// multiplied or exponentiated. The sparse walk is one walk by construction: thread 0's reading of the map row
// (its split share and the number of blocks it visits) is broadcast through shared memory before any warp
// starts, only the producer reads the row's entries after that, and it hands each stage's key block to the
// consumers in shared memory (read after the stage's full barrier), so the producer and the consumers agree on
// the steps, the stages and the phases whatever the map's values (key_blocks.cuh: a map is not trusted). A tile
// whose row keeps no block before kv_len writes 0 (no V mean: l = 0 there, as the reference); a split that keeps
// none writes the partials (O 0, m -inf, l 0), which the combine weighs 0, and a row all of whose splits are empty
// is written 0 by the combine.
//
// A numerics policy N provides (the two policies are the examples; a new numerics is one such struct, its rows in
// hopper_schedule.cuh's table and an entry point like attn_hopper_int8fp8.cu):
//   D, BN                 head_dim and keys per block (the K^ / V^T tiles: s8 K^, V^T bytes the e4m3 P.V reads)
//   S_STARTS_AT_MAGIC     QK^T accumulates onto the bits of 1.5 * 2^23 (scores read as floats without an I2F)
//   small_bytes(st), STAGE_SMALL_TX   shared memory of its per-stage operands for a ring of st stages; bytes per stage
//   StageLoads(p, bh), .issue<ST>(small, s, blk, bar)   the producer thread's bulk copies of block blk's operands
//   Rows(p, bh, row_base, g)   per-thread consumer state of rows row_base + g, + 8 (the row scales, the scores)
//     .block_max<ST, PARTIAL>(sacc, smem, small_off, s, blk, kv_len, t, mblk)   scores, masking, block row max
//     .p_fragments<PARTIAL>(sacc, mblk, blk, kv_len, t, c_fac, pf, l_run)   P as e4m3 A fragments, l += c rowsum
//     .update_o<ST>(o, pacc, c_fac, smem, small_off, s, t)   O += c (P V) (times a per-block V scale, if any)
//   store_rows(p, o, l_run, row_base, g, t, b, h), split_scale(p, bh)   the epilogue, the split partials' O scale
//   RETURNS_LSE, LSE_LOG2_UNIT   whether p.lse is written, and log2 of the unit of l (l counts L p: log2 L)
// (smem + small_off + the policy's offset of stage s addresses its operands in the consumers, as one offset sum;
// small is the same region's shared address in the producer. The thread's column index t is passed, not kept in
// Rows: both forms cost the kernel its measured code generation -- benchmarks/kernel_ptx_diff.py shows it.)
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "common/attention_params.cuh"
#include "common/rowmath.cuh"
#include "common/key_blocks.cuh"
#include "hopper/sm90_ops.cuh"

namespace rotvid {
namespace hopper {

constexpr int kBM = 128;        // query rows per CTA (two consumer warpgroups x 64)
constexpr int kConsumerWarps = 8;
constexpr int kThreads = (kConsumerWarps + 4) * 32;  // + a producer warpgroup (one thread issues the copies)
// Registers are allocated per warpgroup on sm90 (cap 168 per thread for 3 warpgroups): the producer gives
// its share to the consumers with setmaxnreg (24 x 128 + 240 x 256 <= 65536). (Three consumer warpgroups,
// BM 192 at 160 registers, spilled ~1 KB per thread: not pursued.)
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;
// How the consumers hand a stage back to the producer (the "empty" barrier's arrivals). 1 (shipped): every consumer
// thread arrives (256 arrivals), so each thread's own reads of the stage's small operands (ld.shared) are released by
// its own arrival -- the only hand-off compute-sanitizer's racecheck follows to the producer's next bulk copy into
// the stage. 0: each warp's lane 0 after __syncwarp (8 arrivals) and 2: thread 0 of each warpgroup after a named
// barrier of its 128 threads (2 arrivals) order the same reads under the memory model, but racecheck reports every
// refill of a stage as a WAR hazard under them (77,625 on the sanitize calls, H200); the int8-fp8 kernel's time is
// the same under 0, 1 and 2 (within 1%). An experiment's switch (-DROTVID_HOPPER_RELEASE=n):
// benchmarks/race_study.sh.
#ifndef ROTVID_HOPPER_RELEASE
#define ROTVID_HOPPER_RELEASE 1
#endif
constexpr int kRelease = ROTVID_HOPPER_RELEASE;
constexpr int kEmptyArrivals = kRelease == 1 ? kConsumerWarps * 32 : kRelease == 2 ? 2 : kConsumerWarps;

// Dynamic shared memory of numerics N with a ring of ST stages:
// [Q][K0 V0][K1 V1]...[the numerics' small operands of all stages][barriers], the base rounded up to 1024.
template <class N, int ST>
struct SmemLayout {
  static constexpr int Q_BYTES = kBM * N::D;       // Q^ tile, rows of D bytes (s8)
  static constexpr int K_BYTES = N::BN * N::D;     // K^ tile
  static constexpr int V_BYTES = N::D * N::BN;     // V^T tile: D rows of BN key bytes
  static constexpr int STAGE_BYTES = K_BYTES + V_BYTES;
  static constexpr int TILES = Q_BYTES + ST * STAGE_BYTES;
  static constexpr int SMALL = N::small_bytes(ST);
  static constexpr int BARS = (2 * ST + 1) * 8;
  static constexpr int SMEM = 1024 + TILES + SMALL + BARS;  // +1024: the base is rounded up to 1024
  // SPARSE: + the key block each stage holds (an int per stage after the barriers), written by the producer, and
  // the CTA's walk (first, end, count: MapKeyBlocks) as thread 0 found it
  static constexpr int SMEM_SPARSE = SMEM + ST * 4 + 3 * 4;
  static constexpr int QK_SWIZZLE = N::D == 128 ? 128 : 64;  // bytes per Q/K row = swizzle span
  static constexpr int V_SWIZZLE = N::BN;                    // bytes per V^T row of a block
  static constexpr uint32_t TX = K_BYTES + V_BYTES + N::STAGE_SMALL_TX;  // bytes one stage's copies bring
};

// The CTA's key-block walk: the dense one, or (SPARSE) its row of the block map.
template <bool SPARSE, int BN>
__device__ __forceinline__ auto key_walk(const AttnParams& p, int b, int h, int mb, int kv_len, int part) {
  if constexpr (SPARSE) {
    const int row = b * p.map_sb + h * p.map_sh + mb;
    return MapKeyBlocks<BN>::of_row(p.map_index + (size_t)row * p.map_kmax, __ldg(p.map_count + row), p.map_kmax,
                                    kv_len, p.Nkv, part, p.splits);
  } else {
    return KeyBlocks::dense(kv_len, BN, part, p.splits);
  }
}

template <class N, int STAGES, int PINGPONG, int PIPE, bool SPARSE, bool LSE = false>
__global__ void __launch_bounds__(kThreads, 1)
    hopper_attention_kernel(const __grid_constant__ AttnParams p, const __grid_constant__ CUtensorMap tm_q,
                            const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v) {
#ifdef ROTVID_WGMMA_ENABLED
  using namespace sm90;
  static_assert(PINGPONG >= 0 && PINGPONG <= 2, "PINGPONG 0 (none), 1 (turn around QK^T) or 2 (around P.V + QK^T)");
  static_assert(PIPE >= 0 && PIPE <= 2, "PIPE 0, 1 or 2");
  static_assert(!LSE || N::RETURNS_LSE, "LSE: a numerics that returns the log-sum-exp");
  constexpr int D = N::D;
  constexpr int kBN = N::BN;
  constexpr int ST = STAGES;
  using C = SmemLayout<N, ST>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t s_q = base;
  auto s_k = [&](int s) { return base + C::Q_BYTES + s * C::STAGE_BYTES; };
  auto s_v = [&](int s) { return base + C::Q_BYTES + s * C::STAGE_BYTES + C::K_BYTES; };
  const uint32_t bars = base + C::TILES + C::SMALL;
  auto full_bar = [&](int s) { return bars + 8 * s; };
  auto empty_bar = [&](int s) { return bars + 8 * (ST + s); };
  const uint32_t q_bar = bars + 8 * 2 * ST;
  // SPARSE: stage s's key block, as the producer's walk found it (the consumers read it after the stage's full
  // barrier, so they never read the map in their loop: one walk, the producer's, decides which blocks come)
  int* const stage_blk = reinterpret_cast<int*>(smem + C::TILES + C::SMALL + C::BARS);
  int* const walk_share = stage_blk + ST;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // the tile schedule: tiles below split_from run whole (part -1); each later tile runs as p.splits CTAs
  int tile = blockIdx.x, part = -1;
  if (tile >= p.split_from) {
    part = (tile - p.split_from) % p.splits;
    tile = p.split_from + (tile - p.split_from) / p.splits;
  }
  // (Nq_pad is a multiple of kBM, so both forms give the same count; each numerics keeps the form its kernel was tuned
  // in: the other one reorders ~200 SASS instructions of the int4 kernels, and of the int8-fp8 one at head_dim 64,
  // which then ran 3.4% slower, CogVideoX-5B, H200)
  const int n_qt = N::TILE_COUNT_ROUNDED_UP ? (p.Nq_pad + kBM - 1) / kBM : p.Nq_pad / kBM;
  const int mb = tile % n_qt, h = (tile / n_qt) % p.H, b = tile / (n_qt * p.H);
  const int bh = b * p.H + h;
  int kv_len = p.Nkv;
  if (p.kv_lens != nullptr) kv_len = min(p.kv_lens[b], p.Nkv);
  auto kb = key_walk<SPARSE, kBN>(p, b, h, mb, kv_len, part);

  if (tid == 0) {
    for (int s = 0; s < ST; ++s) {
      mbar_init(full_bar(s), 1);
      mbar_init(empty_bar(s), kEmptyArrivals);
    }
    mbar_init(q_bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    if constexpr (SPARSE) {  // thread 0's reading of the map row is the CTA's walk
      walk_share[0] = kb.first;
      walk_share[1] = kb.end;
      walk_share[2] = kb.count;
    }
  }
  __syncthreads();
  if constexpr (SPARSE) {  // every warp takes it: the producer and the consumers run one walk by construction
    kb.first = walk_share[0];
    kb.end = walk_share[1];
    kb.count = walk_share[2];
  }

  if (warp >= kConsumerWarps) {  // ---- producer warpgroup ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    if (warp == kConsumerWarps && lane == 0) {
      mbar_expect_tx(q_bar, C::Q_BYTES);
      tma_load_2d(s_q, &tm_q, 0, bh * p.Nq_pad + mb * kBM, q_bar);
      const typename N::StageLoads loads(p, bh);
      const uint32_t small = base + C::TILES;
      int pos = kb.first;  // the walk's cursor (SPARSE; the dense walk's block(i) needs none)
      for (int i = 0; i < kb.count; ++i) {
        const int s = i % ST, blk = next_block(kb, i, pos);
        mbar_wait(empty_bar(s), ((i / ST) & 1) ^ 1);
        if constexpr (SPARSE) stage_blk[s] = blk;  // (released to the consumers by the arrive below)
        mbar_expect_tx(full_bar(s), C::TX);
        tma_load_2d(s_k(s), &tm_k, 0, bh * p.Nkv_pad + blk * kBN, full_bar(s));
        tma_load_2d(s_v(s), &tm_v, blk * kBN, bh * D, full_bar(s));
        loads.template issue<ST>(small, s, blk, full_bar(s));
      }
    }
  } else {  // ---- consumers (one branch of the if/else, so setmaxnreg applies) ----

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
  // (indices from the unsigned thread index: the measured kernel's code; the signed warp / lane forms compile
  // to different SASS, and this kernel's speed moves with its code generation -- RESULTS.md)
  const uint32_t utid = (uint32_t)tid;
  const int wg = (int)(utid >> 7), wi = (int)((utid >> 5) & 3);
  const int g = (int)((utid >> 2) & 7), t = (int)(utid & 3);
  const int row_base = mb * kBM + wg * 64 + wi * 16;
  typename N::Rows rows(p, bh, row_base, g);  // the numerics' state of this thread's rows g, g + 8
  const uint64_t desc_q = smem_desc(s_q + wg * 64 * D, C::QK_SWIZZLE);

  constexpr int DT = D / 8;     // output n-tiles
  constexpr int QKS = D / 32;   // k-steps of QK^T
  constexpr int PKS = kBN / 32; // k-steps of P.V
  float o[DT][4];
#pragma unroll
  for (int j = 0; j < DT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};

  uint32_t sacc[kBN / 2];  // S of the current key block
  float pacc[D / 2];       // P V of the current key block
  uint32_t pf[PKS][4];     // P A fragments of the current key block
  float c_fac[2];          // block factors c of the current key block

  // S = Q^ K^T of the block in stage s (committed as one wgmma group, not waited for)
  auto issue_qk = [&](const int s) {
    if constexpr (N::S_STARTS_AT_MAGIC) {  // the numerics reads the scores as floats (1.5 * 2^23 + S)
#pragma unroll
      for (int i = 0; i < kBN / 2; ++i) sacc[i] = (uint32_t)kMagicI;
    }
    wgmma_fence();
    const uint64_t desc_k = smem_desc(s_k(s), C::QK_SWIZZLE);
    wgmma_qk<kBN, N::S_STARTS_AT_MAGIC ? 1 : 0>(sacc, desc_q, desc_k);  // scale-d 0: starts at zero
#pragma unroll
    for (int ks = 1; ks < QKS; ++ks) wgmma_qk<kBN, 1>(sacc, desc_q + 2 * ks, desc_k + 2 * ks);
    wgmma_commit();
  };

  // P.V of the block in stage s (one wgmma group)
  auto issue_pv = [&](const int s) {
    const uint64_t desc_v = smem_desc(s_v(s), C::V_SWIZZLE);
    wgmma_fence();
    wgmma_pv_e4m3<D, 0>(pacc, pf[0], desc_v);  // scale-d 0: a fresh sum per block
#pragma unroll
    for (int k = 1; k < PKS; ++k) wgmma_pv_e4m3<D, 1>(pacc, pf[k], desc_v + 2 * k);
    wgmma_commit();
  };

  // PINGPONG: the two warpgroups take turns issuing matrix products (named barriers 1 + wg), so that one
  // warpgroup's softmax runs while the other's products occupy the tensor cores.
  auto turn_wait = [&]() {
    if constexpr (PINGPONG != 0) asm volatile("bar.sync %0, 256;\n" ::"r"(1 + wg) : "memory");
  };
  auto turn_pass = [&](bool last) {
    if constexpr (PINGPONG != 0) {
      if (!(last && wg == 1)) asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - wg) : "memory");
    }
  };
  if (PINGPONG != 0 && wg == 1 && kb.count > 0) asm volatile("bar.arrive 1, 256;\n" ::: "memory");  // warpgroup 0 first

  // The numerics' softmax of block blk (stage s): block max, online combine, P fragments and l; then the P.V
  // wgmma group (committed, not waited for). PARTIAL: the block holds keys at or past kv_len.
  const int kv_mask = kb.mask_len(kv_len, kBN);  // keys >= kv_mask of the walk are masked
  auto softmax_issue_pv = [&](const int blk, const int s, auto partial_tag) {
    constexpr bool PARTIAL = decltype(partial_tag)::value;
    float mblk[2];  // block row maxima, in the exponent's units
    rows.template block_max<ST, PARTIAL>(sacc, smem, C::TILES, s, blk, kv_mask, t, mblk);
    rowmath::online_combine(mblk, m_run, l_run, o, c_fac);
    rows.template p_fragments<PARTIAL>(sacc, mblk, blk, kv_mask, t, c_fac, pf, l_run);
    if constexpr (PINGPONG == 2) turn_wait();
    issue_pv(s);
  };

  // O = O a + c (the block's P V, scaled as the numerics says), then the stage goes back to the producer
  auto update_o = [&](const int s) {
    rows.template update_o<ST>(o, pacc, c_fac, smem, C::TILES, s, t);
    if constexpr (kRelease == 1) {
      mbar_arrive(empty_bar(s));
    } else if constexpr (kRelease == 2) {
      asm volatile("bar.sync %0, 128;\n" ::"r"(3 + wg) : "memory");
      if ((utid & 127) == 0) mbar_arrive(empty_bar(s));
    } else {
      __syncwarp();
      if ((utid & 31) == 0) mbar_arrive(empty_bar(s));
    }
  };

  mbar_wait(q_bar, 0);
  if (kb.count > 0) {
    mbar_wait(full_bar(0), 0);
    if constexpr (PINGPONG == 1) turn_wait();
    issue_qk(0);
    if constexpr (PINGPONG == 1) turn_pass(kb.count == 1);
  }
  for (int i = 0; i < kb.count; ++i) {
    // the key block as the key mask counts it (KeyBlocks::mask_block; SPARSE: the block the producer put in stage
    // s, whose index only the key mask reads here)
    int blk = 0;
    if constexpr (!SPARSE) blk = kb.mask_block(i);
    const int s = i % ST;
    const int s1 = (i + 1) % ST;
    const bool has_next = i + 1 < kb.count;
    wgmma_wait<0>();  // S of the walk's i-th block
    bool masked;
    if constexpr (SPARSE) {
      blk = stage_blk[s];  // (stage s's full barrier was waited for: before the loop, or as s1 one step back)
      masked = kb.partial(blk);
    } else {
      masked = KeyBlocks::partial(blk, kBN, kv_mask);
    }
    if (masked) {
      softmax_issue_pv(blk, s, std::true_type{});
    } else {
      softmax_issue_pv(blk, s, std::false_type{});
    }
    if (PIPE == 1 && has_next) {
      mbar_wait(full_bar(s1), ((i + 1) / ST) & 1);
      if constexpr (PINGPONG == 1) turn_wait();
      issue_qk(s1);
      if constexpr (PINGPONG == 1) turn_pass(i + 2 == kb.count);
      if constexpr (PINGPONG == 2) turn_pass(false);
      wgmma_wait<1>();
    } else {
      if constexpr (PINGPONG == 2) turn_pass(!has_next);
      wgmma_wait<0>();
      if (PIPE == 2 && has_next) {
        mbar_wait(full_bar(s1), ((i + 1) / ST) & 1);
        if constexpr (PINGPONG == 1) turn_wait();
        issue_qk(s1);
        if constexpr (PINGPONG == 1) turn_pass(i + 2 == kb.count);
      }
    }
    update_o(s);
    if (PIPE == 0 && has_next) {
      mbar_wait(full_bar(s1), ((i + 1) / ST) & 1);
      if constexpr (PINGPONG == 1) turn_wait();
      issue_qk(s1);
      if constexpr (PINGPONG == 1) turn_pass(i + 2 == kb.count);
    }
  }

  if (part < 0) {
    if constexpr (SPARSE) {
      if (kb.count == 0) {  // the map keeps no key of this tile: 0, without the V mean
        rowmath::store_zero_rows<D>(p, row_base, g, t, b, h);
      } else {
        N::store_rows(p, o, l_run, row_base, g, t, b, h);
      }
    } else {
      N::store_rows(p, o, l_run, row_base, g, t, b, h);
    }
    if constexpr (LSE) {  // (after store_rows, which sums l_run over the row's 4 threads; an empty tile: l_run 0, -inf)
      rowmath::store_lse_rows(p, m_run, l_run, row_base, g, t, b, h, N::LSE_LOG2_UNIT);
    }
  } else {  // partials of this split: O (relative to m_run; times the numerics' split scale), m_run, l per row
    float* w = p.ws + ((size_t)(tile - p.split_from) * p.splits + part) * kBM * (D + 2);
    rowmath::store_split_partials<D>(w, o, m_run, l_run, row_base - mb * kBM + g, t, N::split_scale(p, bh));
  }
  }  // consumers
#endif  // ROTVID_WGMMA_ENABLED
}

// The split combine's LSE policy when the launch writes none (every numerics then shares one combine per head_dim and
// SPARSE, as before the LSE).
struct NoLse {
  static constexpr bool RETURNS_LSE = false;
  static constexpr float LSE_LOG2_UNIT = 0.f;
};

// The online V/O Hadamard's inverse on one row held by a warp, EPL consecutive columns per lane (column lane * EPL +
// i): rotvid.rope.hadamard.fwht's butterflies in its order -- the low column bits in the thread, the others across the
// lanes (shuffles xor 1 .. 16) -- then rowmath::kVoScaleOut (what rowmath::unrotate_tile_rows and its caller,
// which folds the scale into 1 / l, give, on the split combine's layout).
template <int EPL>
__device__ __forceinline__ void unrotate_warp_row(float (&y)[EPL], int lane) {
#pragma unroll
  for (int hi = 1; hi < EPL; hi *= 2) {
#pragma unroll
    for (int i = 0; i < EPL; ++i) {
      if (i & hi) continue;
      const float a = y[i], b = y[i + hi];
      y[i] = __fadd_rn(a, b);
      y[i + hi] = __fsub_rn(a, b);
    }
  }
#pragma unroll
  for (int m = 1; m < 32; m *= 2) {
    const bool upper = (lane & m) != 0;
#pragma unroll
    for (int i = 0; i < EPL; ++i) {
      const float other = __shfl_xor_sync(0xffffffffu, y[i], m);
      y[i] = upper ? __fsub_rn(other, y[i]) : __fadd_rn(y[i], other);
    }
  }
#pragma unroll
  for (int i = 0; i < EPL; ++i) y[i] = __fmul_rn(y[i], rowmath::kVoScaleOut);
}

// The tail split's second pass: one warp per row of a split tile merges the splits' (O, m, l) -- weights exp2(m_s - max
// m) -- and writes O / l (+ v_mean) like store_rows (un-rotated with p.o_hadamard), and (L: the kernel's numerics when
// the launch writes the LSE, NoLse otherwise) the row's LSE into p.lse from the merged l and max m. Grid (split tiles,
// kBM / 8), 256 threads. SPARSE: a row whose splits all kept no key (every m -inf) is written 0, without the V mean
// (LSE -inf).
template <int D, bool SPARSE, class L = NoLse>
__global__ void __launch_bounds__(256) combine_splits_kernel(const AttnParams p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int tile = p.split_from + blockIdx.x;
  const int n_qt = p.Nq_pad / kBM;
  const int mb = tile % n_qt, h = (tile / n_qt) % p.H, b = tile / (n_qt * p.H);
  const int r = blockIdx.y * 8 + warp, row = mb * kBM + r;
  if (row >= p.Nq) return;
  const float* w = p.ws + (size_t)blockIdx.x * p.splits * kBM * (D + 2) + (size_t)r * (D + 2);
  const size_t split_stride = (size_t)kBM * (D + 2);
  float m_max = -INFINITY;
  for (int s = 0; s < p.splits; ++s) m_max = fmaxf(m_max, w[s * split_stride + D]);
  constexpr int EPL = D / 32;  // columns per lane
  if constexpr (SPARSE) {
    if (m_max == -INFINITY) {
      const size_t off = (size_t)b * p.out_sb + (size_t)h * p.out_sh + (size_t)row * p.out_sn;
#pragma unroll
      for (int i = 0; i < EPL; i += 2) rowmath::store_pair(p, off, lane * EPL + i, 0.f, 0.f, nullptr);
      if constexpr (L::RETURNS_LSE) {
        if (lane == 0) p.lse[((size_t)b * p.H + h) * p.Nq + row] = -INFINITY;
      }
      return;
    }
  }
  float acc[EPL], l = 0.f;
#pragma unroll
  for (int i = 0; i < EPL; ++i) acc[i] = 0.f;
  for (int s = 0; s < p.splits; ++s) {
    const float* ws = w + s * split_stride;
    const float f = exp2f(ws[D] - m_max);
    l = fmaf(f, ws[D + 1], l);
#pragma unroll
    for (int i = 0; i < EPL; ++i) acc[i] = fmaf(f, ws[lane * EPL + i], acc[i]);
  }
  const float* vm = p.v_mean != nullptr ? p.v_mean + ((size_t)b * p.H + h) * D : nullptr;
  const size_t off = (size_t)b * p.out_sb + (size_t)h * p.out_sh + (size_t)row * p.out_sn;
  if (p.o_hadamard) {  // the row un-rotated (AttnParams.o_hadamard; the warp's one row: uniform)
    float y[EPL];
#pragma unroll
    for (int i = 0; i < EPL; ++i) y[i] = vm != nullptr ? acc[i] / l + vm[lane * EPL + i] : acc[i] / l;
    unrotate_warp_row<EPL>(y, lane);
#pragma unroll
    for (int i = 0; i < EPL; i += 2) rowmath::store_pair(p, off, lane * EPL + i, y[i], y[i + 1], nullptr);
  } else {
#pragma unroll
    for (int i = 0; i < EPL; i += 2) rowmath::store_pair(p, off, lane * EPL + i, acc[i] / l, acc[i + 1] / l, vm);
  }
  if constexpr (L::RETURNS_LSE) {
    if (lane == 0) p.lse[((size_t)b * p.H + h) * p.Nq + row] = rowmath::row_lse(m_max, l, L::LSE_LOG2_UNIT);
  }
}

}  // namespace hopper
}  // namespace rotvid
