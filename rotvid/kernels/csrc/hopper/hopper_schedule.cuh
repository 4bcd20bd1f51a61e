// The Hopper attention kernel's schedule per (numerics, head_dim, block_n): one table (hopper_attention.cuh says
// what STAGES, PINGPONG and PIPE do). A tuning build overrides them in every row at compile time with
// -DROTVID_HOPPER_STAGES=n, -DROTVID_HOPPER_PINGPONG=n, -DROTVID_HOPPER_PIPE=n (each alone or together;
// benchmarks/kernel_variants.py builds one extension per setting); a release build reads no environment.
#pragma once

namespace rotvid {
namespace hopper {

enum class Numerics { kInt4Valued, kInt8Fp8 };

struct Schedule {
  int stages;         // ring of K^ / V^T stages
  int pingpong;       // 0: none; 1: turns around the QK^T issue; 2: around P.V + the next QK^T
  int pipe;           // 0: next QK^T after the O update; 1: while P.V is in flight; 2: right after P.V completes
  bool magic_scores;  // int8-fp8: scores read as floats through the 1.5 * 2^23 accumulator start, no I2F (a
                      // numerics choice: the exponent's constant rounds once per row and block; not overridden)
};

struct ScheduleRow {
  Numerics numerics;
  int head_dim;
  int block_n;
  Schedule schedule;
};

// Measured with benchmarks/kernel_variants.py (attention only; the schedules give identical output bits).
constexpr ScheduleRow kScheduleTable[] = {
    // INT4 head_dim 128: the next QK^T during the O update (605 -> 630 TOP/s at Wan2.1-1.3B 480p), 3 stages; the two
    // consumer warpgroups take turns issuing the QK^T (ping-pong 1: 668 -> 722 TOP/s at Wan2.1-1.3B, 674 -> 724 at
    // Wan 14B 720p against ping-pong 2, the better one with the u8 x s8 P.V of before).
    {Numerics::kInt4Valued, 128, 128, {3, 1, 1, false}},
    // INT4 head_dim 64: no ping-pong (it lost 4-16% at CogVideoX-5B), the next QK^T during the O update with 4
    // stages (Q/K/V smoothed: 9.36 -> 8.57 ms against the plain order with 3 stages; 2, 3, 5 stages and PIPE 2 between).
    {Numerics::kInt4Valued, 64, 128, {4, 0, 1, false}},
    // INT4 block_n 64 (the slower option: 480 vs 623 TOP/s at 128 when it was added): 2 stages, PIPE 1.
    {Numerics::kInt4Valued, 128, 64, {2, 0, 1, false}},
    {Numerics::kInt4Valued, 64, 64, {2, 0, 1, false}},
    // int8-fp8 head_dim 128: ping-pong 2 + PIPE 1, 3 stages (H100, Wan2.1-1.3B: 780 TOP/s; 2 stages 765, 4 stages
    // 762, no ping-pong 699-735); scores by I2F (without it within noise on an H200: 848-859 vs 844-849 TOP/s).
    {Numerics::kInt8Fp8, 128, 128, {3, 2, 1, false}},
    // int8-fp8 head_dim 64: PIPE 1 without ping-pong, 3 stages (H100, CogVideoX-5B: 6.82-6.84 ms against 7.00 with
    // ping-pong 2; 4 stages 6.90, 2 stages 7.57); scores without I2F (H200: 504 -> 552 TOP/s).
    {Numerics::kInt8Fp8, 64, 128, {3, 0, 1, true}},
};

// The table's row for (numerics, head_dim, block_n); stages 0 where there is none (the launcher static_asserts).
constexpr Schedule hopper_schedule(Numerics numerics, int head_dim, int block_n) {
  Schedule s{0, 0, 0, false};
  for (const ScheduleRow& row : kScheduleTable) {
    if (row.numerics == numerics && row.head_dim == head_dim && row.block_n == block_n) s = row.schedule;
  }
  if (s.stages == 0) return s;
#ifdef ROTVID_HOPPER_STAGES
  s.stages = ROTVID_HOPPER_STAGES;
#endif
#ifdef ROTVID_HOPPER_PINGPONG
  s.pingpong = ROTVID_HOPPER_PINGPONG;
#endif
#ifdef ROTVID_HOPPER_PIPE
  s.pipe = ROTVID_HOPPER_PIPE;
#endif
  return s;
}

}  // namespace hopper
}  // namespace rotvid
