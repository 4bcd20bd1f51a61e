// The INT4-valued numerics on the mma.sync attention kernel (csrc/mma/): its row of the schedule table
// (csrc/mma/mma_schedule.cuh) and the launch of one instruction path and head_dim (attn_s4_d64.cu ...).
#pragma once
#include "mma_numerics_int4.cuh"
#include "mma/mma_schedule.cuh"

namespace rotvid {
namespace mma {

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
