// The mma.sync attention kernel's schedule per numerics: warps per CTA, CTAs per SM for the register budget,
// pipeline stages and the lean addressing (mma_attention.cuh), in one table; launch_mma<N> launches N with its row.
// A new numerics adds its policy header below and one schedule_of overload. The choices hold on every architecture
// the kernel is built for (sm80/86/89/90a). A tuning build overrides fields of every row at build time
// (ROTVID_EXT_CUDA_FLAGS="-DROTVID_MMA_STAGES=3 -DROTVID_MMA_LEAN=1", also ROTVID_MMA_NW, ROTVID_MMA_MINB); the
// kernels read no environment.
#pragma once
#include "mma_attention.cuh"
#include "mma_numerics_int4.cuh"
#include "mma_numerics_int8fp8.cuh"

namespace rotvid {
namespace mma {

struct MmaSchedule {
  int nw;      // warps per CTA (16 query rows each)
  int minb;    // CTAs per SM (__launch_bounds__: the register budget)
  int stages;  // cp.async stages: 2 or 3
  bool lean;   // per-thread load addresses hoisted, constant P.V accumulator start
};

// INT4-valued numerics. Profiled on H100 (Nsight Compute, Wan2.1-1.3B shape; RESULTS.md): the kernel is latency-bound
// (3 warps per scheduler, issue slots 55% busy, stalls mostly on fixed-latency dependencies and on shared-memory
// loads), not bound by tensor pipe (26%), shared memory (60%) or L2 (47%). The s8 path at block_n 64 (attention only,
// same H100 session, identical output bits): head_dim 128 lean + 3 stages (one barrier per key block), 3 CTAs/SM:
// +5-6% over 2 stages without lean; head_dim 64 lean + 2 stages, 4 CTAs/SM (128 registers): +11-12%. 8 warps per CTA
// (BM 128): 1 CTA/SM at 255 registers was slower (279 TOP/s), 2 CTAs/SM at 128 registers +2-4% (below lean + 3
// stages). Block_n 128 and the s4 path keep the first kernel's schedule (4 warps, 3 CTAs/SM, 2 stages).
template <int D, int BN, bool S4, int PMODE>
constexpr MmaSchedule schedule_of(const Int4Numerics<D, BN, S4, PMODE>*) {
  if (!S4 && BN == 64) return D == 64 ? MmaSchedule{4, 4, 2, true} : MmaSchedule{4, 3, 3, true};
  return MmaSchedule{4, 3, 2, false};
}

// int8-fp8 (not measured on an Ada GPU). Ada has 100 KB of shared memory per SM: head_dim 64 (38 KB per CTA,
// 2 stages) fits two CTAs of 4 warps; head_dim 128 (72 KB) one CTA, so it runs 8 warps (BM 128) sharing the tiles.
template <int D>
constexpr MmaSchedule schedule_of(const Int8Fp8Numerics<D>*) {
  return D == 128 ? MmaSchedule{8, 1, 2, false} : MmaSchedule{4, 2, 2, false};
}

// N's row of the table; a tuning build may override any field for every numerics (-DROTVID_MMA_NW=8 ...).
template <class N>
constexpr MmaSchedule mma_schedule() {
  MmaSchedule s = schedule_of(static_cast<const N*>(nullptr));
#ifdef ROTVID_MMA_NW
  s.nw = ROTVID_MMA_NW;
#endif
#ifdef ROTVID_MMA_MINB
  s.minb = ROTVID_MMA_MINB;
#endif
#ifdef ROTVID_MMA_STAGES
  s.stages = ROTVID_MMA_STAGES;
#endif
#ifdef ROTVID_MMA_LEAN
  s.lean = ROTVID_MMA_LEAN != 0;
#endif
  return s;
}

template <class N>
cudaError_t launch_mma(const AttnParams& p, cudaStream_t stream) {
  constexpr MmaSchedule s = mma_schedule<N>();
  static_assert((16 * s.nw) <= kBlockM && kBlockM % (16 * s.nw) == 0, "CTA rows divide the query padding");
  return launch_mma_attention<N, s.nw, s.minb, s.stages, s.lean>(p, stream);
}

// The INT4-valued numerics of one instruction path and head_dim at the run's block_n (64, 128) and P mode.
template <int D, bool S4>
cudaError_t launch_int4(const AttnParams& p, int block_n, int p_mode, cudaStream_t stream) {
  if (block_n == 64) {
    return p_mode == kPRange ? launch_mma<Int4Numerics<D, 64, S4, kPRange>>(p, stream)
                             : launch_mma<Int4Numerics<D, 64, S4, kPSym>>(p, stream);
  }
  if (block_n == 128) {
    return p_mode == kPRange ? launch_mma<Int4Numerics<D, 128, S4, kPRange>>(p, stream)
                             : launch_mma<Int4Numerics<D, 128, S4, kPSym>>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace mma
}  // namespace rotvid
