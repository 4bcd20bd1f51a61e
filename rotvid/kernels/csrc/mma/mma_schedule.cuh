// The mma.sync attention kernel's schedule per numerics: warps per CTA, CTAs per SM for the register budget,
// pipeline stages and the lean addressing (mma_attention.cuh); launch_mma<N> launches N with its row. Each numerics
// gives its row as a schedule_of overload beside its policy, in its recipe's folder (found by argument-dependent
// lookup: recipes/int4/csrc/mma_schedule_int4.cuh, recipes/int8_fp8/csrc/mma_schedule_int8fp8.cuh). The choices hold
// on every architecture the kernel is built for (sm80/86/89/90a). A tuning build overrides fields of every row at
// build time (ROTVID_EXT_CUDA_FLAGS="-DROTVID_MMA_STAGES=3 -DROTVID_MMA_LEAN=1", also ROTVID_MMA_NW, ROTVID_MMA_MINB);
// the kernels read no environment.
#pragma once
#include "mma/mma_attention.cuh"

namespace rotvid {
namespace mma {

struct MmaSchedule {
  int nw;      // warps per CTA (16 query rows each)
  int minb;    // CTAs per SM (__launch_bounds__: the register budget)
  int stages;  // cp.async stages: 2 or 3
  bool lean;   // per-thread load addresses hoisted, constant P.V accumulator start
};

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

}  // namespace mma
}  // namespace rotvid
