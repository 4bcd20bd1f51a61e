// cp.async (sm80+) helpers of the pre-processing kernels: 16 bytes global -> shared without a register, in groups.
#pragma once
#include <cstdint>

namespace rotvid {
namespace cpasync {

// 16 bytes global -> shared, the last 16 - size of them zero (size 0: zeros, src not read)
__device__ __forceinline__ void copy16_zfill(void* dst, const void* src, int size) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
               "l"(src), "r"(size)
               : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// until at most N of this thread's committed groups are in flight
template <int N>
__device__ __forceinline__ void wait_pending() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

}  // namespace cpasync
}  // namespace rotvid
