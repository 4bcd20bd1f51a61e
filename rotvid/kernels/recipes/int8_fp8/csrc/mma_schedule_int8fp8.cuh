// The int8-fp8 numerics on the mma.sync attention kernel (csrc/mma/): its row of the schedule table
// (csrc/mma/mma_schedule.cuh).
#pragma once
#include "mma_numerics_int8fp8.cuh"
#include "mma/mma_schedule.cuh"

namespace rotvid {
namespace mma {

// int8-fp8 (not measured on an Ada GPU). Ada has 100 KB of shared memory per SM: head_dim 64 (38 KB per CTA,
// 2 stages) fits two CTAs of 4 warps; head_dim 128 (72 KB) one CTA, so it runs 8 warps (BM 128) sharing the tiles.
template <int D>
constexpr MmaSchedule schedule_of(const Int8Fp8Numerics<D>*) {
  return D == 128 ? MmaSchedule{8, 1, 2, false} : MmaSchedule{4, 2, 2, false};
}

}  // namespace mma
}  // namespace rotvid
