// INT4-valued flash attention on Hopper's warpgroup tensor cores (sm90a: wgmma, TMA, mbarriers).
//
// Same numerics as int4_attention.cuh at the same block_n (DESIGN.md §The numerics; the per-row arithmetic
// below is that kernel's): per key block of BN (64 or 128) keys
//   S = Q^ K^T (int32), x = float(S) * k_scale, m_blk = sq * max(x), p = ex2(x sq - m_blk) (with Q smoothing, SQ:
//   x = float(S) * k_scale * sq + k_bias[key], m_blk = max(x), p = ex2(x - m_blk)),
//   P^ = rint(15 p) in [0, 15] (range; the INT4 kernels' P~ = P^ - 8) | rint(7 p) (sym),
//   O = O a + c (P^ V^) v_scale, l = l a + c rowsum(P^) (O and l in units of P^; P^ V^ = P~ V^ + 8 colsum(V^)
//   exactly).
// P^ V^ runs on the e4m3 tensor cores (FP8PV 2, the default; see FP8PV below): P^ and V^ are exact in e4m3 and
// the block's sum is exact in the FP32 accumulator (checked on an H100: FP8PV 1 is bit-identical to the u8 x s8
// path, RESULTS.md), and P^ is rounded by the e4m3 conversion of ex2(x - m_blk + log2(15) - 9). Against the
// mma.sync s8 kernel the output differs only where ex2.approx of that shifted argument rounds P^ the other way
// (a few outputs in 10^4; the bound against the reference is unchanged).
//
// CTA = 3 warpgroups: warpgroups 0 and 1 are consumers of 64 query rows each (BM = 128); warpgroup 2 is
// the producer (setmaxnreg gives its registers to the consumers): one thread issues TMA copies of the Q
// tile (once) and of each key block (K^ tile, V^T tile, K scales, V parameters) into a ring of STAGES
// buffers, each guarded by a "full" mbarrier (transaction bytes) and an "empty" mbarrier (one arrival per
// consumer warp). Consumers: S = wgmma m64nBNk32 s8 (A = Q^, B = K^ from 128/64-byte-swizzled shared
// memory), softmax and P^ in registers, P^V^ = wgmma m64nDk32 e4m3 (FP8PV 2; u8.s8 in tuning variant 40) with A =
// P^ from registers (the
// accumulator layout of S is the A-fragment layout once V^T keys are permuted per 32, as the kernel layout
// already does) and B = V^T (K-major) from shared memory. Overlap options (template parameters, chosen in
// attn_wgmma.cu): PIPE 1 issues the next block's QK^T during this block's O update; PINGPONG 2 makes the
// two consumer warpgroups take turns issuing P.V + the next QK^T (FlashAttention-3's schedule).
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "int4_common.cuh"
#include "int4_rowmath.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ROTVID_WGMMA_ENABLED 1
#endif

namespace rotvid {
namespace wg {

constexpr int kBM = 128;        // query rows per CTA (two consumer warpgroups x 64)
constexpr int kConsumerWarps = 8;
constexpr int kThreads = (kConsumerWarps + 4) * 32;  // + a producer warpgroup (one thread issues the copies)
// Registers are allocated per warpgroup on sm90 (cap 168 per thread for 3 warpgroups): the producer gives
// its share to the consumers with setmaxnreg (24 x 128 + 240 x 256 <= 65536). (Three consumer warpgroups,
// BM 192 at 160 registers, spilled ~1 KB per thread even with P.V split in halves: not pursued.)
constexpr int kProducerRegs = 24;
constexpr int kConsumerRegs = 240;

template <int D, int ST, int BN>
struct Cfg {
  static constexpr int Q_BYTES = kBM * D;          // Q^ tile, rows of D bytes (s8)
  static constexpr int K_BYTES = BN * D;           // K^ tile
  static constexpr int V_BYTES = D * BN;           // V^T tile: D rows of BN key bytes
  static constexpr int KS_BYTES = BN * 4;          // k_scale of the block
  static constexpr int VP_BYTES = D * 8;           // vparams of the block
  static constexpr int STAGES = ST;
  static constexpr int STAGE_BYTES = K_BYTES + V_BYTES;
  // layout: [Q][K0 V0][K1 V1]...[KS0 VP0][KS1 VP1]...[DS0][DS1]...[barriers]
  static constexpr int TILES = Q_BYTES + STAGES * STAGE_BYTES;
  static constexpr int DS_BYTES = BN * 4;          // Q smoothing's per-key bias of the block (SQ kernels)
  static constexpr int SMALL = STAGES * (KS_BYTES + VP_BYTES) + STAGES * DS_BYTES;
  static constexpr int BARS = (2 * STAGES + 1) * 8;
  static constexpr int SMEM = 1024 + TILES + SMALL + BARS;  // +1024: the base is rounded up to 1024
  static constexpr int QK_SWIZZLE = D == 128 ? 128 : 64;    // bytes per Q/K row = swizzle span
  static constexpr int V_SWIZZLE = BN;                      // bytes per V^T row of a block
  static constexpr uint32_t TX = K_BYTES + V_BYTES + KS_BYTES + VP_BYTES;
};


// ---- PTX wrappers (mbarrier, TMA, wgmma) ----

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// The suspend-time hint lets the hardware park the waiting warp until the phase completes. (Without it the
// producer's wait loop issued ~0.7 G try-wait instructions per Wan2.1-1.3B call in Nsight Compute; the
// kernel time with the hint moved within run-to-run noise.)
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1, %2;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity), "r"(0x989680)
      : "memory");
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Shared-memory matrix descriptor of a K-major tile with rows of `swizzle` bytes (128 or 64), 8-row
// groups `8 * swizzle` bytes apart; the tile starts on a multiple of 8 * swizzle bytes.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr, int swizzle) {
  const uint64_t sbo = (uint64_t)(8 * swizzle) >> 4;
  const uint64_t mode = swizzle == 128 ? 1 : 2;
  return (uint64_t)((addr & 0x3FFFF) >> 4) | (1ull << 16) | (sbo << 32) | (mode << 62);
}

// wgmma.mma_async wrappers, operand lists written out: S = Q^ K^T is s32 += s8 x s8 (A and B from shared
// memory); P.V is s32 += u8 x s8 (FP8PV 0) or f32 += e4m3 x e4m3 (below) with A = P^ from registers (see the
// kernel's comment on P^).
template <int SCALE_D>
__device__ __forceinline__ void wgmma_ss_m64n128k32(uint32_t (&d)[64], uint64_t da, uint64_t db) {
  if constexpr (SCALE_D == 0) {  // D = A B: write-only accumulators (no false dependence on old values)
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, 0;\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]), "=r"(d[4]), "=r"(d[5]), "=r"(d[6]), "=r"(d[7]), "=r"(d[8]), "=r"(d[9]), "=r"(d[10]), "=r"(d[11]), "=r"(d[12]), "=r"(d[13]), "=r"(d[14]), "=r"(d[15]), "=r"(d[16]), "=r"(d[17]), "=r"(d[18]), "=r"(d[19]), "=r"(d[20]), "=r"(d[21]), "=r"(d[22]), "=r"(d[23]), "=r"(d[24]), "=r"(d[25]), "=r"(d[26]), "=r"(d[27]), "=r"(d[28]), "=r"(d[29]), "=r"(d[30]), "=r"(d[31]), "=r"(d[32]), "=r"(d[33]), "=r"(d[34]), "=r"(d[35]), "=r"(d[36]), "=r"(d[37]), "=r"(d[38]), "=r"(d[39]), "=r"(d[40]), "=r"(d[41]), "=r"(d[42]), "=r"(d[43]), "=r"(d[44]), "=r"(d[45]), "=r"(d[46]), "=r"(d[47]), "=r"(d[48]), "=r"(d[49]), "=r"(d[50]), "=r"(d[51]), "=r"(d[52]), "=r"(d[53]), "=r"(d[54]), "=r"(d[55]), "=r"(d[56]), "=r"(d[57]), "=r"(d[58]), "=r"(d[59]), "=r"(d[60]), "=r"(d[61]), "=r"(d[62]), "=r"(d[63])
        : "l"(da), "l"(db)
        : "memory");
  } else {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, 1;\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
        : "l"(da), "l"(db)
        : "memory");
  }
}

template <int SCALE_D>
__device__ __forceinline__ void wgmma_ss_m64n64k32(uint32_t (&d)[32], uint64_t da, uint64_t db) {
  if constexpr (SCALE_D == 0) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, 0;\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]), "=r"(d[4]), "=r"(d[5]), "=r"(d[6]), "=r"(d[7]), "=r"(d[8]), "=r"(d[9]), "=r"(d[10]), "=r"(d[11]), "=r"(d[12]), "=r"(d[13]), "=r"(d[14]), "=r"(d[15]), "=r"(d[16]), "=r"(d[17]), "=r"(d[18]), "=r"(d[19]), "=r"(d[20]), "=r"(d[21]), "=r"(d[22]), "=r"(d[23]), "=r"(d[24]), "=r"(d[25]), "=r"(d[26]), "=r"(d[27]), "=r"(d[28]), "=r"(d[29]), "=r"(d[30]), "=r"(d[31])
        : "l"(da), "l"(db)
        : "memory");
  } else {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, 1;\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
        : "l"(da), "l"(db)
        : "memory");
  }
}

template <int SCALE_D>
__device__ __forceinline__ void wgmma_rs_m64n128k32(uint32_t (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (SCALE_D == 0) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.u8.s8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 0;\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]), "=r"(d[4]), "=r"(d[5]), "=r"(d[6]), "=r"(d[7]), "=r"(d[8]), "=r"(d[9]), "=r"(d[10]), "=r"(d[11]), "=r"(d[12]), "=r"(d[13]), "=r"(d[14]), "=r"(d[15]), "=r"(d[16]), "=r"(d[17]), "=r"(d[18]), "=r"(d[19]), "=r"(d[20]), "=r"(d[21]), "=r"(d[22]), "=r"(d[23]), "=r"(d[24]), "=r"(d[25]), "=r"(d[26]), "=r"(d[27]), "=r"(d[28]), "=r"(d[29]), "=r"(d[30]), "=r"(d[31]), "=r"(d[32]), "=r"(d[33]), "=r"(d[34]), "=r"(d[35]), "=r"(d[36]), "=r"(d[37]), "=r"(d[38]), "=r"(d[39]), "=r"(d[40]), "=r"(d[41]), "=r"(d[42]), "=r"(d[43]), "=r"(d[44]), "=r"(d[45]), "=r"(d[46]), "=r"(d[47]), "=r"(d[48]), "=r"(d[49]), "=r"(d[50]), "=r"(d[51]), "=r"(d[52]), "=r"(d[53]), "=r"(d[54]), "=r"(d[55]), "=r"(d[56]), "=r"(d[57]), "=r"(d[58]), "=r"(d[59]), "=r"(d[60]), "=r"(d[61]), "=r"(d[62]), "=r"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db)
        : "memory");
  } else {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.u8.s8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 1;\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db)
        : "memory");
  }
}

template <int SCALE_D>
__device__ __forceinline__ void wgmma_rs_m64n64k32(uint32_t (&d)[32], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (SCALE_D == 0) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k32.s32.u8.s8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 0;\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]), "=r"(d[4]), "=r"(d[5]), "=r"(d[6]), "=r"(d[7]), "=r"(d[8]), "=r"(d[9]), "=r"(d[10]), "=r"(d[11]), "=r"(d[12]), "=r"(d[13]), "=r"(d[14]), "=r"(d[15]), "=r"(d[16]), "=r"(d[17]), "=r"(d[18]), "=r"(d[19]), "=r"(d[20]), "=r"(d[21]), "=r"(d[22]), "=r"(d[23]), "=r"(d[24]), "=r"(d[25]), "=r"(d[26]), "=r"(d[27]), "=r"(d[28]), "=r"(d[29]), "=r"(d[30]), "=r"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db)
        : "memory");
  } else {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k32.s32.u8.s8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1;\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db)
        : "memory");
  }
}

// P.V in e4m3: f32 += e4m3 x e4m3, A from registers, B = V^T (K-major) from shared memory (the int8-fp8 kernel's
// P8 V8, and the FP8PV variants of this kernel).
template <int SCALE_D>
__device__ __forceinline__ void wgmma_rs_e4m3_m64n128k32(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (SCALE_D == 0) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 0, 1, 1;\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]), "=f"(d[32]), "=f"(d[33]), "=f"(d[34]), "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]), "=f"(d[40]), "=f"(d[41]), "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]), "=f"(d[48]), "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]), "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]), "=f"(d[62]), "=f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db)
        : "memory");
  } else {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db)
        : "memory");
  }
}

template <int SCALE_D>
__device__ __forceinline__ void wgmma_rs_e4m3_m64n64k32(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (SCALE_D == 0) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 0, 1, 1;\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db)
        : "memory");
  } else {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db)
        : "memory");
  }
}

using rowmath::ex2;
using rowmath::pack_e4m3x4;
using rowmath::pack_low_bytes;

template <int BN, int SCALE_D>
__device__ __forceinline__ void wgmma_qk(uint32_t (&acc)[BN / 2], uint64_t da, uint64_t db) {
  if constexpr (BN == 128) {
    wgmma_ss_m64n128k32<SCALE_D>(acc, da, db);
  } else {
    wgmma_ss_m64n64k32<SCALE_D>(acc, da, db);
  }
}

template <int D, int SCALE_D>
__device__ __forceinline__ void wgmma_pv(uint32_t (&acc)[D / 2], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (D == 128) {
    wgmma_rs_m64n128k32<SCALE_D>(acc, a, db);
  } else {
    wgmma_rs_m64n64k32<SCALE_D>(acc, a, db);
  }
}

template <int D, int SCALE_D>
__device__ __forceinline__ void wgmma_pv_e4m3(float (&acc)[D / 2], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (D == 128) {
    wgmma_rs_e4m3_m64n128k32<SCALE_D>(acc, a, db);
  } else {
    wgmma_rs_e4m3_m64n64k32<SCALE_D>(acc, a, db);
  }
}

// FP8PV (issue 12's first lever; 2 is the default, 0 and 1 tuning variants 40 / 41): P^ V^ on the e4m3 tensor cores. The byte k of P^ (0..15) read as
// e4m3 is k 2^-9 (subnormals and the first binade are evenly spaced at 2^-9), and V^ arrives in sign-magnitude
// bytes (|v| | sign << 7), which read as e4m3 are v 2^-9; every product is an integer times 2^-18 and the block's
// sum (|P^ V^| <= 15 * 7 * BN < 2^14) is exact if the FP32 accumulation is. The 2^18 goes into c. FP8PV 0: the
// u8 x s8 product of two's-complement V^ bytes (the kernel before, 4-22% slower on an H100). FP8PV 1: P^
// bytes as the u8 path forms them (bit-identical to it if the accumulation is exact); FP8PV 2: P^ 2^-9 =
// e4m3(ex2(x - m_blk + log2(15) - 9)), the factor folded into the exponent and the rounding done by the e4m3
// conversion (round to nearest even on the 2^-9 grid = rint), so P^ can differ from the u8 path's at the rare
// scores where ex2.approx of the shifted argument rounds across a half.
// SQ: Q smoothing -- scores x sq + k_bias[key] (p.k_bias, the ΔS of the per-head Q mean, log2 domain), the row max
// and the exponent taken on those sums; otherwise the product by sq is folded into the exponent's FFMA as before.
template <int D, int BN, int PMODE, int STAGES, int PINGPONG, int PIPE, bool SQ = false, int FP8PV = 2>
__global__ void __launch_bounds__(kThreads, 1)
    int4_attention_wgmma_kernel(const __grid_constant__ AttnParams p, const __grid_constant__ CUtensorMap tm_q,
                                const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v) {
#ifdef ROTVID_WGMMA_ENABLED
  static_assert(BN == 64 || BN == 128, "key blocks of 64 or 128");
  static_assert(PIPE != 3 || BN == 64, "two S buffers fit in registers only at BN = 64");
  using C = Cfg<D, STAGES, BN>;
  constexpr int kBN = BN;
  constexpr int ST = C::STAGES;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);
  const uint32_t s_q = base;
  auto s_k = [&](int s) { return base + C::Q_BYTES + s * C::STAGE_BYTES; };
  auto s_v = [&](int s) { return base + C::Q_BYTES + s * C::STAGE_BYTES + C::K_BYTES; };
  const int small_off = C::TILES;
  auto ks_ptr = [&](int s) { return reinterpret_cast<const float*>(smem + small_off + s * (C::KS_BYTES + C::VP_BYTES)); };
  auto vp_ptr = [&](int s) {
    return reinterpret_cast<const float*>(smem + small_off + s * (C::KS_BYTES + C::VP_BYTES) + C::KS_BYTES);
  };
  const int ds_off = small_off + ST * (C::KS_BYTES + C::VP_BYTES);
  auto ds_ptr = [&](int s) { return reinterpret_cast<const float*>(smem + ds_off + s * C::DS_BYTES); };
  const uint32_t bars = base + C::TILES + C::SMALL;
  auto full_bar = [&](int s) { return bars + 8 * s; };
  auto empty_bar = [&](int s) { return bars + 8 * (ST + s); };
  const uint32_t q_bar = bars + 8 * 2 * ST;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // 1-D grid: tiles (query block fastest, then head, then batch) below split_from run whole; each later tile runs
  // as p.splits CTAs, split `part` taking key blocks [kb0, kb0 + nblk) of its row block
  int tile = blockIdx.x, part = -1;
  if (tile >= p.split_from) {
    part = (tile - p.split_from) % p.splits;
    tile = p.split_from + (tile - p.split_from) / p.splits;
  }
  const int n_qt = p.Nq_pad / kBM;
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
      mbar_init(full_bar(s), 1);
      mbar_init(empty_bar(s), kConsumerWarps);
    }
    mbar_init(q_bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp >= kConsumerWarps) {  // ---- producer warpgroup ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    if (warp == kConsumerWarps && lane == 0) {
      mbar_expect_tx(q_bar, C::Q_BYTES);
      tma_load_2d(s_q, &tm_q, 0, bh * p.Nq_pad + mb * kBM, q_bar);
      const float* ksg = p.k_scale + (size_t)bh * p.Nkv_pad;
      const float* vpg = p.vparams + (size_t)bh * (p.Nkv_pad / kBN) * D * 2;
      const uint32_t small = base + C::TILES;
      for (int i = 0; i < nblk; ++i) {
        const int s = i % ST, kb = kb0 + i;
        mbar_wait(empty_bar(s), ((i / ST) & 1) ^ 1);
        mbar_expect_tx(full_bar(s), C::TX + (SQ ? C::DS_BYTES : 0));
        tma_load_2d(s_k(s), &tm_k, 0, bh * p.Nkv_pad + kb * kBN, full_bar(s));
        tma_load_2d(s_v(s), &tm_v, kb * kBN, bh * D, full_bar(s));
        const uint32_t sm = small + s * (C::KS_BYTES + C::VP_BYTES);
        bulk_load(sm, ksg + (size_t)kb * kBN, C::KS_BYTES, full_bar(s));
        bulk_load(sm + C::KS_BYTES, vpg + (size_t)kb * D * 2, C::VP_BYTES, full_bar(s));
        if constexpr (SQ) {
          bulk_load(base + ds_off + s * C::DS_BYTES, p.k_bias + (size_t)bh * p.Nkv_pad + (size_t)kb * kBN, C::DS_BYTES,
                    full_bar(s));
        }
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
  float sq[2];
  sq[0] = p.q_scale[(size_t)bh * p.Nq_pad + row_base + g] * p.qk_scale;
  sq[1] = p.q_scale[(size_t)bh * p.Nq_pad + row_base + g + 8] * p.qk_scale;
  const uint64_t desc_q = smem_desc(s_q + wg * 64 * D, C::QK_SWIZZLE);

  constexpr int NT = kBN / 8;   // score n-tiles
  constexpr int DT = D / 8;     // output n-tiles
  constexpr int QKS = D / 32;   // k-steps of QK^T
  constexpr int PKS = kBN / 32; // k-steps of P.V
  float o[DT][4];
#pragma unroll
  for (int j = 0; j < DT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};
  // P^ = rint(15 p) in [0, 15] (range) or rint(7 p) (sym), an unsigned byte (as e4m3: P^ 2^-9): the product
  // P^ V^ equals the INT4 kernels' P~ V^ + 8 colsum(V^) with P~ = P^ - 8 in [-8, 7], so no column-sum term is
  // needed here.
  constexpr float kPMul = PMODE == kPRange ? 15.f : 7.f;
  constexpr float kPAdd = kMagicF;

  // S of the current key block, and with PIPE 3 of the next one (indexed by compile-time constants only)
  uint32_t sbuf[PIPE == 3 ? 2 : 1][NT * 4];
  std::conditional_t<FP8PV != 0, float, uint32_t> pacc[D / 2];  // P^ V^ of the current key block
  uint32_t pf[kBN / 32][4];    // P^ A fragments of the current key block
  float x[NT][4];              // scores of the block in the log2 domain (before the row scale sq)
  float mblk[2];               // block row maxima (times sq)
  float c_fac[2];               // block factors c of the current key block

  // S = Q^ K^T of the block in stage s (committed as one wgmma group, not waited for)
  using B0 = std::integral_constant<int, 0>;
  using B1 = std::integral_constant<int, 1>;
  auto issue_qk_into = [&](auto buf_tag, const int s) {
    auto& sacc = sbuf[decltype(buf_tag)::value];
    const uint64_t desc_k = smem_desc(s_k(s), C::QK_SWIZZLE);
    wgmma_fence();
    wgmma_qk<BN, 0>(sacc, desc_q, desc_k);  // scale-d 0: the accumulator starts at zero
#pragma unroll
    for (int ks = 1; ks < QKS; ++ks) wgmma_qk<BN, 1>(sacc, desc_q + 2 * ks, desc_k + 2 * ks);
    wgmma_commit();
  };
  auto issue_qk = [&](const int s) { issue_qk_into(B0{}, s); };

  // P.V of the block in stage s (one wgmma group)
  auto issue_pv = [&](const int s) {
    const uint64_t desc_v = smem_desc(s_v(s), C::V_SWIZZLE);
    wgmma_fence();
    if constexpr (FP8PV != 0) {
      wgmma_pv_e4m3<D, 0>(pacc, pf[0], desc_v);
#pragma unroll
      for (int k = 1; k < PKS; ++k) wgmma_pv_e4m3<D, 1>(pacc, pf[k], desc_v + 2 * k);
    } else {
      wgmma_pv<D, 0>(pacc, pf[0], desc_v);  // scale-d 0: starts at zero
#pragma unroll
      for (int k = 1; k < PKS; ++k) wgmma_pv<D, 1>(pacc, pf[k], desc_v + 2 * k);
    }
    wgmma_commit();
  };

  // PINGPONG: the two warpgroups take turns issuing matrix products (named barriers 1 + wg), so that one
  // warpgroup's softmax runs while the other's products occupy the tensor cores. 1: the turn covers the
  // QK^T issue; 2: it covers the P.V issue and the next block's QK^T (FlashAttention-3's order).
  auto turn_wait = [&]() {
    if constexpr (PINGPONG != 0) asm volatile("bar.sync %0, 256;\n" ::"r"(1 + wg) : "memory");
  };
  auto turn_pass = [&](bool last) {
    if constexpr (PINGPONG != 0) {
      if (!(last && wg == 1)) asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - wg) : "memory");
    }
  };
  if (PINGPONG != 0 && wg == 1 && nblk > 0) asm volatile("bar.arrive 1, 256;\n" ::: "memory");  // warpgroup 0 goes first

  // The softmax of a block (the mma.sync kernel's arithmetic) in two parts. First: scores x, block max, online
  // combine, c factors. PARTIAL: the last block of a row with masked keys.
  auto scores_max = [&](auto buf_tag, const int kb, const int s, auto partial_tag) {
    constexpr bool PARTIAL = decltype(partial_tag)::value;
    const auto& sacc = sbuf[decltype(buf_tag)::value];
    const float* sks = ks_ptr(s);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const float2 ksc = *reinterpret_cast<const float2*>(sks + 8 * j + 2 * t);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        x[j][e] = __int2float_rn((int)sacc[4 * j + e]) * ((e & 1) ? ksc.y : ksc.x);  // exact int -> float
      }
      if constexpr (SQ) {
        const float2 dsc = *reinterpret_cast<const float2*>(ds_ptr(s) + 8 * j + 2 * t);
#pragma unroll
        for (int e = 0; e < 4; ++e) x[j][e] = fmaf(x[j][e], sq[e >> 1], (e & 1) ? dsc.y : dsc.x);
      }
    }
    if constexpr (PARTIAL) {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int key = kb * kBN + 8 * j + 2 * t;
        if (key >= kv_len) x[j][0] = x[j][2] = -INFINITY;
        if (key + 1 >= kv_len) x[j][1] = x[j][3] = -INFINITY;
      }
    }
    float xmax[2];
    rowmath::block_row_max(x, xmax);
    mblk[0] = SQ ? xmax[0] : sq[0] * xmax[0];
    mblk[1] = SQ ? xmax[1] : sq[1] * xmax[1];
    rowmath::online_combine(mblk, m_run, l_run, o, c_fac);
  };
  // Second: exponentials, P^ fragments, l.
  auto exps_pack = [&](const int kb, auto partial_tag) {
    constexpr bool PARTIAL = decltype(partial_tag)::value;
    // row sums of P^ (exact integers: byte sums of the A fragments, dp4a), so the output bits equal the mma.sync
    // kernel's
    uint32_t p_sum[2] = {0u, 0u};

    // FP8PV 2: the row maxima shifted by -(log2(kPMul) - 9), so that ex2 gives kPMul 2^-9 p
    float mexp[2] = {mblk[0], mblk[1]};
    if constexpr (FP8PV == 2) {
      constexpr float kShift = PMODE == kPRange ? -5.0931094f : -6.1926451f;  // log2(15) - 9, log2(7) - 9
      mexp[0] = mblk[0] - kShift;
      mexp[1] = mblk[1] - kShift;
    }
    auto make_pf = [&](const int k) {
      float pe[4][4];  // exponentials of n-tiles 4k..4k+3 (FP8PV 2: already times kPMul 2^-9)
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int j = 4 * k + jj;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          pe[jj][e] = ex2(SQ ? x[j][e] - mexp[r] : fmaf(x[j][e], sq[r], -mexp[r]));
          if constexpr (PARTIAL) {
            const int key = kb * kBN + 8 * j + 2 * t + (e & 1);
            if (key >= kv_len) pe[jj][e] = 0.f;
          }
        }
      }
      // A fragment: rows g / g+8, 32 keys; each byte is P^ (FP8PV 2: the e4m3 code of P^ 2^-9, rounded by the
      // conversion; otherwise the low byte of the float bits of kPMul p + kPAdd)
      auto pack4 = [&](int a, int b, int c, int d) {
        const float p0 = pe[a >> 2][a & 3], p1 = pe[b >> 2][b & 3], p2 = pe[c >> 2][c & 3], p3 = pe[d >> 2][d & 3];
        if constexpr (FP8PV == 2) {
          return pack_e4m3x4(p0, p1, p2, p3);
        } else {
          return pack_low_bytes(__float_as_uint(fmaf(p0, kPMul, kPAdd)), __float_as_uint(fmaf(p1, kPMul, kPAdd)),
                                __float_as_uint(fmaf(p2, kPMul, kPAdd)), __float_as_uint(fmaf(p3, kPMul, kPAdd)));
        }
      };
      auto& f = pf[k];
      f[0] = pack4(0, 1, 4, 5);      // pe[0][0], pe[0][1], pe[1][0], pe[1][1]
      f[1] = pack4(2, 3, 6, 7);      // pe[0][2], pe[0][3], pe[1][2], pe[1][3]
      f[2] = pack4(8, 9, 12, 13);    // pe[2][0], pe[2][1], pe[3][0], pe[3][1]
      f[3] = pack4(10, 11, 14, 15);  // pe[2][2], pe[2][3], pe[3][2], pe[3][3]
      p_sum[0] = __dp4a(f[0], 0x01010101u, __dp4a(f[2], 0x01010101u, p_sum[0]));  // row g
      p_sum[1] = __dp4a(f[1], 0x01010101u, __dp4a(f[3], 0x01010101u, p_sum[1]));  // row g + 8
    };
#pragma unroll
    for (int k = 0; k < PKS; ++k) make_pf(k);
    rowmath::add_row_counts(p_sum, c_fac, l_run);
  };

  // Both parts and the P.V wgmma group of the block (committed, not waited for)
  auto softmax_issue_pv_from = [&](auto buf_tag, const int kb, const int s, auto partial_tag) {
    scores_max(buf_tag, kb, s, partial_tag);
    exps_pack(kb, partial_tag);
    if constexpr (PINGPONG == 2) turn_wait();
    issue_pv(s);
  };
  auto softmax_issue_pv = [&](const int kb, const int s, auto partial_tag) { softmax_issue_pv_from(B0{}, kb, s, partial_tag); };

  // O = O a + c (P^ V^) v_scale (P^ V^ == P~ V^ + 8 colsum exactly), then the stage goes back to the producer
  auto update_o = [&](const int s) {
    const float* svp = vp_ptr(s);
    // FP8PV: the accumulator holds P^ V^ 2^-18; (c 2^18) (P^ V^ 2^-18) is c P^ V^ exactly
    const float cf0 = FP8PV != 0 ? c_fac[0] * 262144.f : c_fac[0];
    const float cf1 = FP8PV != 0 ? c_fac[1] * 262144.f : c_fac[1];
#pragma unroll
    for (int j = 0; j < DT; ++j) {
      // v_scale of columns 8j+2t and 8j+2t+1 (vparams interleaves them with column-sum bits this kernel does not
      // need; a 16-byte load of both pairs compiles to two 4-byte loads all the same)
      float2 vp;
      vp.x = svp[2 * (8 * j + 2 * t)];
      vp.y = svp[2 * (8 * j + 2 * t) + 2];
      float u[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (FP8PV != 0) {
          u[e] = pacc[4 * j + e];
        } else {
          u[e] = __int2float_rn((int)pacc[4 * j + e]);  // exact (|P^ V^| < 2^24)
        }
      }
      o[j][0] = fmaf(cf0 * u[0], vp.x, o[j][0]);
      o[j][1] = fmaf(cf0 * u[1], vp.y, o[j][1]);
      o[j][2] = fmaf(cf1 * u[2], vp.x, o[j][2]);
      o[j][3] = fmaf(cf1 * u[3], vp.y, o[j][3]);
    }
    __syncwarp();
    if ((utid & 31) == 0) mbar_arrive(empty_bar(s));
  };

  mbar_wait(q_bar, 0);
  if constexpr (PIPE == 3) {
    // Two S buffers: QK^T of block kb+1 runs on the tensor cores during the softmax of block kb.
    auto step = [&](const int kb, auto cur_tag) {
      constexpr int CUR = decltype(cur_tag)::value;
      const int s = kb % ST;
      if (kb + 1 < nblk) {
        const int s1 = (kb + 1) % ST;
        mbar_wait(full_bar(s1), ((kb + 1) / ST) & 1);
        issue_qk_into(std::integral_constant<int, CUR ^ 1>{}, s1);
        wgmma_wait<1>();  // S of block kb (the older group)
      } else {
        wgmma_wait<0>();
      }
      if ((kb + 1) * kBN > kv_len) {
        softmax_issue_pv_from(cur_tag, kb, s, std::true_type{});
      } else {
        softmax_issue_pv_from(cur_tag, kb, s, std::false_type{});
      }
      wgmma_wait<0>();
      update_o(s);
    };
    if (nblk > 0) {
      mbar_wait(full_bar(0), 0);
      issue_qk_into(B0{}, 0);
    }
    for (int kb = 0; kb < nblk; kb += 2) {
      step(kb, B0{});
      if (kb + 1 < nblk) step(kb + 1, B1{});
    }
  } else {
  if (nblk > 0) {
    mbar_wait(full_bar(0), 0);
    if constexpr (PINGPONG == 1) turn_wait();
    issue_qk(0);
    if constexpr (PINGPONG == 1) turn_pass(nblk == 1);
  }
  for (int kb = 0; kb < nblk; ++kb) {
    const int s = kb % ST;
    const int s1 = (kb + 1) % ST;
    const bool has_next = kb + 1 < nblk;
    wgmma_wait<0>();  // S of block kb
    if ((kb + 1) * kBN > kv_len) {
      softmax_issue_pv(kb, s, std::true_type{});
    } else {
      softmax_issue_pv(kb, s, std::false_type{});
    }
    // PIPE 1: S of the next block is issued while P.V is in flight; PIPE 2: right after P.V completes (its P~
    // registers are free then); both overlap the next QK^T with this block's O update.
    if (PIPE == 1 && has_next) {
      mbar_wait(full_bar(s1), ((kb + 1) / ST) & 1);
      if constexpr (PINGPONG == 1) turn_wait();
      issue_qk(s1);
      if constexpr (PINGPONG == 1) turn_pass(kb + 2 == nblk);
      if constexpr (PINGPONG == 2) turn_pass(false);
      wgmma_wait<1>();
    } else {
      if constexpr (PINGPONG == 2) turn_pass(!has_next);
      wgmma_wait<0>();
      if (PIPE == 2 && has_next) {
        mbar_wait(full_bar(s1), ((kb + 1) / ST) & 1);
        if constexpr (PINGPONG == 1) turn_wait();
        issue_qk(s1);
        if constexpr (PINGPONG == 1) turn_pass(kb + 2 == nblk);
      }
    }
    update_o(s);
    if (PIPE == 0 && has_next) {
      mbar_wait(full_bar(s1), ((kb + 1) / ST) & 1);
      if constexpr (PINGPONG == 1) turn_wait();
      issue_qk(s1);
      if constexpr (PINGPONG == 1) turn_pass(kb + 2 == nblk);
    }
  }

  }
  if (part < 0) {
    rowmath::store_rows<D>(p, o, l_run, row_base, g, t, b, h);
  } else {  // partials of this split: O (relative to m_run), m_run, l per row of the tile
    float* w = p.ws + ((size_t)(tile - p.split_from) * p.splits + part) * kBM * (D + 2);
    rowmath::store_split_partials<D>(w, o, m_run, l_run, row_base - mb * kBM + g, t, nullptr);
  }
  }  // consumers
#endif  // ROTVID_WGMMA_ENABLED
}

// The tail split's second pass: one warp per row of a split tile merges the splits' (O, m, l) -- weights
// exp2(m_s - max m) -- and writes O / l (+ v_mean) like store_rows. Grid (split tiles, kBM / 8), 256 threads.
template <int D>
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
#pragma unroll
  for (int i = 0; i < EPL; i += 2) rowmath::store_pair(p, off, lane * EPL + i, acc[i] / l, acc[i + 1] / l, vm);
}

}  // namespace wg
}  // namespace rotvid
