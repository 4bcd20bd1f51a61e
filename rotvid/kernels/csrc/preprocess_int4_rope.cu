// RoPE·R inside the INT4 pre-processing: Q and K come in un-rotated, the generalized RoPE table shared by the heads
// ([N, D, 4]) is applied where they are read, and no rotated copy is written. Two launches (after one zeroing of the
// work words) replace the RoPE·R passes of Q and K and the means and row launches of preprocess_int4.cu; V's launch
// is unchanged:
//   rope_means_kernel   float64 channel sums of RoPE·R(Q) over all query rows, of RoPE·R(K) over the valid keys and
//                       of V (not rotated) over its valid tokens -- each only when smoothed -- then the means
//                       float32(sum / len), written by the last CTA of a (batch row, head set)
//   rope_rows_kernel    RoPE·R(Q) and RoPE·R(K) of each token, minus the mean, INT4 per row (K with Q smoothing's
//                       bias), kernel row layout; padding rows zero with scale (and bias) 0
// Q and K are read twice: a row can only be quantized once the means over every token are known. Each rotated value
// is rounded to the input's dtype as the RoPE·R pass stores it (rope_rows.cuh), so every output has the bits of
// launch_generalized_rope on Q and K followed by launch_token_means_f64 and launch_quant_rows_int4.
//
// A CTA takes kTokens tokens of one batch row and a set of HS heads. Thread (hl, c8) owns channels 8 c8 .. + 7 of
// head set * HS + hl (hl = threadIdx.x / TPR, c8 = threadIdx.x % TPR, TPR = D / 8), so its channel sums stay in its
// registers over the range and a row's max and bias dot are shuffles among its TPR lanes (int4_rows.cuh). The tokens
// go through a ring of kSlots slots in shared memory filled by cp.async (the loads of kSlots - 1 tokens in flight
// per CTA): each slot holds one token's coefficients, read by every head's threads (swizzled: 2 wavefronts per
// 16-lane read, where the same reads from global memory cost 16), and each thread's 16-byte chunk of the token's
// rows, so that RoPE·R reads any partner pair of a row. The head sets of one token range are neighbours in the grid:
// the table leaves HBM once per launch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cp_async.cuh"
#include "int4_common.cuh"
#include "int4_rows.cuh"
#include "rope_rows.cuh"

namespace rotvid {
namespace prerope {

using cpasync::copy16_zfill;
using roperows::round_to;
using roperows::to_f32;

constexpr int kMaxThreads = 256;
constexpr int kTokens = 128;  // tokens per CTA (both launches)
constexpr int kSlots = 6;     // ring slots: a CTA has the loads of up to kSlots - 1 tokens in flight

// The head sets of H heads: as few as the CTA size allows, of balanced size HS; threads = HS * TPR in whole warps
struct HeadSets {
  int sets, hs, threads;
};
__host__ __device__ inline HeadSets head_sets(int H, int D) {
  const int tpr = D / 8, max_hs = kMaxThreads / tpr;
  HeadSets s{};
  s.sets = H > 0 ? (H + max_hs - 1) / max_hs : 1;
  s.hs = H > 0 ? (H + s.sets - 1) / s.sets : 1;
  s.threads = (s.hs * tpr + 31) / 32 * 32;
  return s;
}

// One ring slot (dynamic shared memory) holds one token: its D coefficient quadruples (16 bytes each, channel c at
// coef_slot(c)), then the staged 16-byte chunks of each of the launch's TENSORS rows, [TENSORS][threads].
__host__ __device__ constexpr int slot_bytes(int d, int tensors, int threads) { return d * 16 + tensors * threads * 16; }

// channel c's coefficients in the slot: within each run of 8 channels XOR-swizzled by the run index, so that the
// lanes reading channel 8 c8 + j for c8 = 0 .. TPR - 1 (one j) hit 8 distinct 16-byte bank groups
__device__ __forceinline__ int coef_slot(int c) { return (c & ~7) | ((c ^ (c >> 3)) & 7); }

// the four coefficients of channels 8 c8 + j from a slot
__device__ __forceinline__ void read_coef8(const unsigned char* slot, int c8, float (&cf)[8][4]) {
  const float4* cs = reinterpret_cast<const float4*>(slot);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float4 f = cs[coef_slot(c8 * 8 + j)];
    cf[j][0] = f.x;
    cf[j][1] = f.y;
    cf[j][2] = f.z;
    cf[j][3] = f.w;
  }
}

// token n's coefficients into a slot (zeros for a padding token), by the CTA's threads together
template <int D>
__device__ __forceinline__ void issue_coefs(unsigned char* slot, const float* coef, int n, bool token) {
  float4* cs = reinterpret_cast<float4*>(slot);
  for (int c = threadIdx.x; c < D; c += blockDim.x)
    copy16_zfill(cs + coef_slot(c), token ? coef + ((size_t)n * D + c) * 4 : coef, token ? 16 : 0);
}

// this thread's 16-byte chunk of row (b, h, n) of x into `dst` (zeros where !in)
__device__ __forceinline__ void issue_chunk(uint4* dst, const PreprocessParams& x, int b, int h, int n, int c8,
                                            bool in) {
  const char* src = static_cast<const char*>(x.x);
  if (in) src += 2 * ((size_t)b * x.sb + (size_t)h * x.sh + (size_t)n * x.sn + c8 * 8);
  copy16_zfill(dst, src, in ? 16 : 0);
}

// RoPE·R of the thread's 8 channels of one row (`row`: the row's pair words, staged), as the RoPE·R pass stores them:
// rounded to T (HADAMARD: then the Walsh-Hadamard transform of the rounded row, rounded again); zeros where !live.
// Every lane calls it (the transform's shuffles).
template <typename T, int D, bool HADAMARD>
__device__ __forceinline__ void rope_row8(const uint4& own, const uint32_t* row, const float (&cf)[8][4],
                                          const int (&partner)[8], bool live, float (&y)[8]) {
  roperows::rotate8<T>(own, row, cf, partner, y);
#pragma unroll
  for (int j = 0; j < 8; ++j) y[j] = live ? round_to<T>(y[j]) : 0.f;
  if (HADAMARD) {
    roperows::fwht8<D>(y);
#pragma unroll
    for (int j = 0; j < 8; ++j) y[j] = round_to<T>(y[j]);
  }
}

// The CTA's place: blockIdx.x = (range * B + b) * sets + set
struct Place {
  int b, range, set, hl, c8, h;
  bool head;  // the thread has a head (threads past HS, or heads past H, compute zeros and store nothing)
};
template <int D>
__device__ __forceinline__ Place place_of(int B, int H) {
  const HeadSets s = head_sets(H, D);
  Place at;
  at.set = blockIdx.x % s.sets;
  const int rb = blockIdx.x / s.sets;
  at.b = rb % B;
  at.range = rb / B;
  at.hl = threadIdx.x / (D / 8);
  at.c8 = threadIdx.x % (D / 8);
  at.h = at.set * s.hs + at.hl;
  at.head = at.hl < s.hs && at.h < H;
  return at;
}

template <int D>
__device__ __forceinline__ void load_partners(const int* index, int c8, int (&partner)[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) partner[j] = index[(c8 * 8 + j) * 4 + 2] >> 1;
}

// The ring over a CTA's `count` tokens: issue(i) queues token i's copies into slot i % kSlots; consume(i, slot)
// runs once every thread's copies of token i have landed. One __syncthreads per token; the slot a new token takes
// is the one every thread finished with at the previous token.
template <typename Issue, typename Consume>
__device__ __forceinline__ void run_ring(int count, unsigned char* ring, int slot_size, Issue issue, Consume consume) {
#pragma unroll 1
  for (int i = 0; i < kSlots - 1; ++i) {
    if (i < count) issue(i, ring + i * slot_size);
    cpasync::commit();  // (empty groups too: the count of groups in flight stays uniform)
  }
#pragma unroll 1
  for (int i = 0; i < count; ++i) {
    cpasync::wait_pending<kSlots - 2>();  // this thread's copies of token i have landed
    __syncthreads();                     // ... every thread's; and token i - 1's slot is free
    const int next = i + kSlots - 1;
    if (next < count) issue(next, ring + (next % kSlots) * slot_size);
    cpasync::commit();
    consume(i, ring + (i % kSlots) * slot_size);
  }
}

// grid (ranges * B * sets) with ranges = max(1, ceil(N / kTokens)), head_sets(H, D).threads threads, ring of
// kSlots slot_bytes(D, 3, threads) in dynamic shared memory.
template <typename T, int D, bool HADAMARD>
__global__ void __launch_bounds__(kMaxThreads, 2) rope_means_kernel(const __grid_constant__ Int4RopeParams p) {
  constexpr int TPR = D / 8;
  extern __shared__ __align__(16) unsigned char ring[];
  const int threads = blockDim.x;
  const Place at = place_of<D>(p.q.B, p.q.H);
  const int N = p.q.N;
  const int klen = p.k.kv_lens != nullptr ? min(p.k.kv_lens[at.b], N) : N;  // K's and V's valid tokens
  const int ranges = N > 0 ? (N + kTokens - 1) / kTokens : 1;
  const int start = at.range * kTokens, end = min(start + kTokens, N);
  const bool do_q = p.q_sum != nullptr, do_k = p.k_sum != nullptr, do_v = p.v_sum != nullptr;
  int partner[8];
  load_partners<D>(p.index, at.c8, partner);
  double aq[8], ak[8], av[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) aq[j] = ak[j] = av[j] = 0.0;
  auto issue = [&](int i, unsigned char* slot) {  // masked keys load zeros: their rotation adds +0
    const int n = start + i;
    issue_coefs<D>(slot, p.coef, n, true);
    uint4* xs = reinterpret_cast<uint4*>(slot + D * 16) + threadIdx.x;
    const bool key = at.head && n < klen;
    if (do_q) issue_chunk(xs, p.q, at.b, at.h, n, at.c8, at.head);
    if (do_k) issue_chunk(xs + threads, p.k, at.b, at.h, n, at.c8, key);
    if (do_v) issue_chunk(xs + 2 * threads, p.v, at.b, at.h, n, at.c8, key);
  };
  auto consume = [&](int, const unsigned char* slot) {
    float cf[8][4];
    read_coef8(slot, at.c8, cf);
    const uint4* xs = reinterpret_cast<const uint4*>(slot + D * 16);
    float y[8];
    if (do_q) {
      rope_row8<T, D, HADAMARD>(xs[threadIdx.x], reinterpret_cast<const uint32_t*>(xs + at.hl * TPR), cf, partner,
                                true, y);
#pragma unroll
      for (int j = 0; j < 8; ++j) aq[j] += (double)y[j];  // exact in float64: the order does not matter
    }
    if (do_k) {
      const uint4* ks = xs + threads;
      rope_row8<T, D, HADAMARD>(ks[threadIdx.x], reinterpret_cast<const uint32_t*>(ks + at.hl * TPR), cf, partner,
                                true, y);
#pragma unroll
      for (int j = 0; j < 8; ++j) ak[j] += (double)y[j];
    }
    if (do_v) {
      const uint4 own = xs[2 * threads + threadIdx.x];
      const T* e = reinterpret_cast<const T*>(&own);
#pragma unroll
      for (int j = 0; j < 8; ++j) av[j] += (double)to_f32<T>(e[j]);
    }
  };
  run_ring(max(end - start, 0), ring, slot_bytes(D, 3, threads), issue, consume);
  const size_t at_bh = ((size_t)at.b * p.q.H + at.h) * D + at.c8 * 8;
  if (at.head) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (do_q && start < end) atomicAdd(p.q_sum + at_bh + j, aq[j]);
      if (do_k && start < klen) atomicAdd(p.k_sum + at_bh + j, ak[j]);
      if (do_v && start < klen) atomicAdd(p.v_sum + at_bh + j, av[j]);
    }
  }
  __threadfence();  // this CTA's sums are visible device-wide before it counts itself done
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) {
    const HeadSets s = head_sets(p.q.H, D);
    last = atomicAdd(p.done + (size_t)at.b * p.q.H + at.set * s.hs, 1u) == (unsigned)ranges - 1;
    __threadfence();  // (acquire side: the other CTAs' sums are read after their counts)
  }
  __syncthreads();
  if (last && at.head) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {  // (from L2, where the atomics landed)
      if (do_q) p.q_mean_out[at_bh + j] = __double2float_rn(__ldcg(p.q_sum + at_bh + j) / (double)N);
      if (do_k) p.k_mean_out[at_bh + j] = __double2float_rn(__ldcg(p.k_sum + at_bh + j) / (double)klen);
      if (do_v) p.v_mean_out[at_bh + j] = __double2float_rn(__ldcg(p.v_sum + at_bh + j) / (double)klen);
    }
  }
}

// grid (ceil(max(Nq_pad, Nkv_pad) / kTokens) * B * sets), head_sets(H, D).threads threads, ring of kSlots
// slot_bytes(D, 2, threads). The rows of Q and K as quant_rows (preprocess_int4.cu): v = RoPE·R(x) - mean, 0 on
// rows >= N; INT4 per row; K's bias qk_scale * (q_mean . v) with Q smoothing.
template <typename T, int D, bool HADAMARD, bool S4>
__global__ void __launch_bounds__(kMaxThreads, 2) rope_rows_kernel(const __grid_constant__ Int4RopeParams p) {
  constexpr int TPR = D / 8, DB = S4 ? D / 2 : D;
  extern __shared__ __align__(16) unsigned char ring[];
  const int threads = blockDim.x;
  const Place at = place_of<D>(p.q.B, p.q.H);
  const int N = p.q.N, n_pad = max(p.q.N_pad, p.k.N_pad);
  const int start = at.range * kTokens, end = min(start + kTokens, n_pad);
  const size_t bh = (size_t)at.b * p.q.H + at.h;
  int partner[8];
  load_partners<D>(p.index, at.c8, partner);
  float mq[8], mk[8], qm[8];  // this thread's channels of Q's and K's means and (Q smoothing) of q_mean
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const size_t c = bh * D + at.c8 * 8 + j;
    mq[j] = at.head && p.q.mean != nullptr ? p.q.mean[c] : 0.f;
    mk[j] = at.head && p.k.mean != nullptr ? p.k.mean[c] : 0.f;
    qm[j] = at.head && p.k.bias != nullptr ? p.k.q_mean[c] : 0.f;
  }
  auto issue = [&](int i, unsigned char* slot) {
    const int n = start + i;
    const bool in = at.head && n < N;
    issue_coefs<D>(slot, p.coef, n, n < N);
    uint4* xs = reinterpret_cast<uint4*>(slot + D * 16) + threadIdx.x;
    issue_chunk(xs, p.q, at.b, at.h, n, at.c8, in);
    issue_chunk(xs + threads, p.k, at.b, at.h, n, at.c8, in);
  };
  auto consume = [&](int i, const unsigned char* slot) {
    const int n = start + i;
    const bool live = n < N;
    float cf[8][4];
    read_coef8(slot, at.c8, cf);
    const uint4* qs = reinterpret_cast<const uint4*>(slot + D * 16);
    const uint4* ks = qs + threads;
    float y[8];
    int qv[8];
    // Q
    rope_row8<T, D, HADAMARD>(qs[threadIdx.x], reinterpret_cast<const uint32_t*>(qs + at.hl * TPR), cf, partner,
                              live, y);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (p.q.mean != nullptr) y[j] = y[j] - mq[j];
      if (!live) y[j] = 0.f;
    }
    float scale = int4rows::quant_row8<D, 7>(y, qv);
    if (at.head && n < p.q.N_pad) {
      const size_t r = bh * p.q.N_pad + n;
      int4rows::store_row8<S4>(p.q.out + r * DB, at.c8, qv);
      if (at.c8 == 0) p.q.scale[r] = scale;
    }
    // K
    rope_row8<T, D, HADAMARD>(ks[threadIdx.x], reinterpret_cast<const uint32_t*>(ks + at.hl * TPR), cf, partner,
                              live, y);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (p.k.mean != nullptr) y[j] = y[j] - mk[j];
      if (!live) y[j] = 0.f;
    }
    float dot = 0.f;
    if (p.k.bias != nullptr) dot = int4rows::row_dot<D>(qm, y);
    scale = int4rows::quant_row8<D, 7>(y, qv);
    if (at.head && n < p.k.N_pad) {
      const size_t r = bh * p.k.N_pad + n;
      int4rows::store_row8<S4>(p.k.out + r * DB, at.c8, qv);
      if (at.c8 == 0) {
        p.k.scale[r] = scale;
        if (p.k.bias != nullptr) p.k.bias[r] = (live ? dot : 0.f) * p.k.qk_scale;
      }
    }
  };
  run_ring(max(end - start, 0), ring, slot_bytes(D, 2, threads), issue, consume);
}

bool same_shapes(const Int4RopeParams& p) {
  const PreprocessParams &q = p.q, &k = p.k, &v = p.v;
  return q.B == k.B && q.H == k.H && q.D == k.D && q.N == k.N && q.is_bf16 == k.is_bf16 && v.B == q.B &&
         v.H == q.H && v.D == q.D && v.N == q.N && v.is_bf16 == q.is_bf16 && (q.D == 64 || q.D == 128) &&
         p.coef != nullptr && p.index != nullptr;
}

// the kernel's dynamic shared memory, raised past the 48 KB default on its first launch
template <typename Kernel>
cudaError_t launch_ring(Kernel kernel, long long ctas, int threads, int smem, cudaStream_t stream,
                        const Int4RopeParams& p) {
  if (ctas <= 0) return cudaSuccess;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  kernel<<<(unsigned)ctas, threads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int D>
cudaError_t means_typed(const Int4RopeParams& p, cudaStream_t stream) {
  const HeadSets s = head_sets(p.q.H, D);
  const long long ranges = p.q.N > 0 ? (p.q.N + kTokens - 1) / kTokens : 1;
  const long long ctas = p.q.H > 0 ? ranges * p.q.B * s.sets : 0;
  const int smem = kSlots * slot_bytes(D, 3, s.threads);
  return p.hadamard ? launch_ring(rope_means_kernel<T, D, true>, ctas, s.threads, smem, stream, p)
                    : launch_ring(rope_means_kernel<T, D, false>, ctas, s.threads, smem, stream, p);
}

template <typename T, int D, bool S4>
cudaError_t rows_typed(const Int4RopeParams& p, cudaStream_t stream) {
  const HeadSets s = head_sets(p.q.H, D);
  const int n_pad = p.q.N_pad > p.k.N_pad ? p.q.N_pad : p.k.N_pad;
  const long long ctas = p.q.H > 0 ? (long long)((n_pad + kTokens - 1) / kTokens) * p.q.B * s.sets : 0;
  const int smem = kSlots * slot_bytes(D, 2, s.threads);
  return p.hadamard ? launch_ring(rope_rows_kernel<T, D, true, S4>, ctas, s.threads, smem, stream, p)
                    : launch_ring(rope_rows_kernel<T, D, false, S4>, ctas, s.threads, smem, stream, p);
}

template <typename T>
cudaError_t means_type(const Int4RopeParams& p, cudaStream_t stream) {
  return p.q.D == 128 ? means_typed<T, 128>(p, stream) : means_typed<T, 64>(p, stream);
}

template <typename T>
cudaError_t rows_type(const Int4RopeParams& p, bool s4, cudaStream_t stream) {
  if (p.q.D == 128) return s4 ? rows_typed<T, 128, true>(p, stream) : rows_typed<T, 128, false>(p, stream);
  return s4 ? rows_typed<T, 64, true>(p, stream) : rows_typed<T, 64, false>(p, stream);
}

}  // namespace prerope

cudaError_t launch_int4_rope_means(const Int4RopeParams& p, cudaStream_t stream) {
  if (!prerope::same_shapes(p) || p.done == nullptr) return cudaErrorInvalidValue;
  if (p.q_sum == nullptr && p.k_sum == nullptr && p.v_sum == nullptr) return cudaSuccess;
  return p.q.is_bf16 ? prerope::means_type<__nv_bfloat16>(p, stream) : prerope::means_type<__half>(p, stream);
}

cudaError_t launch_int4_rope_rows(const Int4RopeParams& p, bool s4, cudaStream_t stream) {
  if (!prerope::same_shapes(p)) return cudaErrorInvalidValue;
  return p.q.is_bf16 ? prerope::rows_type<__nv_bfloat16>(p, s4, stream)
                     : prerope::rows_type<__half>(p, s4, stream);
}

}  // namespace rotvid
