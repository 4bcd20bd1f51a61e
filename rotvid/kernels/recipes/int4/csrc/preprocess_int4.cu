// Pre-processing of the INT4 recipes (memory-bound), bit-identical to rotvid.kernels.quantize. Three launches (two
// when nothing is smoothed), the first after one zeroing of its work words:
//   colsum_f64        one grid over every smoothed tensor among Q (all rows), K and V (valid tokens): float64 sums
//                     of each channel, then the smoothing mean float32(sum / len)
//   quant_rows_int4   one grid over the rows of Q and K: per-token INT4 (after subtracting the mean; K's rows with
//                     Q smoothing's per-key bias q_mean . k_s), kernel row layout
//   quant_v_int4      per-group INT4 of V (per key block of BN tokens and channel), written
//                     transposed and permuted (attention_params.cuh), plus v_scale and colsums; the bytes in
//                     two's complement (s8), nibbles (s4) or sign-magnitude (the Hopper kernel's e4m3 P.V:
//                     |v| | sign << 7 reads as the e4m3 value v 2^-9)
// (the int8-fp8 recipe's pre-processing is preprocess_int8fp8.cu)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "int4_entry.cuh"
#include "common/rowmath.cuh"
#include "common/rope_rows.cuh"

namespace rotvid {
namespace pre {

using roperows::to_f32;
using rowmath::pack_low_bytes;  // byte i = the low byte of the i-th int

// 16 bytes global -> shared by cp.async (sm80+), the last 16 - size of them zero
__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, int size) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
               "l"(src), "r"(size)
               : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// bytes v in [-7, 7] (two's complement) -> |v| | sign << 7 each: a negative byte's ~v + 1 is -v, with no carry out
__device__ __forceinline__ uint32_t sign_magnitude_bytes(uint32_t w) {
  const uint32_t sign = w & 0x80808080u, neg = sign >> 7;
  return ((w ^ (neg * 0xFFu)) + neg) | sign;
}

template <int QMAX = 7>
__device__ __forceinline__ int quant7(float x, float inv) {
  int v = __float2int_rn(x * inv);
  return max(-QMAX, min(QMAX, v));
}

constexpr int kColsumTokens = 1024;  // tokens per CTA (256, or one wave sized from the SM count: no faster)
constexpr int kColsumSteps = 4;      // row steps whose 16-byte loads are in flight together

// CTAs of one (batch, head) of x: its N tokens in ranges of kColsumTokens (one for N = 0: the mean 0 / 0 is written)
__host__ __device__ __forceinline__ int colsum_splits(const PreprocessParams& x) {
  return x.N > kColsumTokens ? (x.N + kColsumTokens - 1) / kColsumTokens : 1;
}

// grid (sum over the tasks of splits * B * H), 256 threads: task t takes the next splits * B * H CTAs, consecutive
// CTAs walk one (batch, head)'s tokens. sum[bh, d] += sum over this CTA's valid tokens; each thread loads 16 bytes
// (8 channels) of a row, kColsumSteps rows at once; float64 sums of fp16/bf16 values are exact here, so the order
// does not matter. The last CTA of a (batch, head) to finish (counter done[bh]) writes mean = float32(sum / len).
// (4 CTAs per SM, <= 64 registers: the kColsumSteps loads are issued together; at the compiler's own 48 registers
// it issued two at a time)
template <typename T, int D>
__global__ void __launch_bounds__(256, 4) colsum_f64_kernel(const __grid_constant__ TokenMeanParams p) {
  constexpr int TPR = D / 8;          // threads per row
  constexpr int RSTEP = 256 / TPR;    // rows per step
  constexpr int U = kColsumSteps;
  __shared__ double part[RSTEP][D + 1];
  int t = 0, idx = blockIdx.x;
  for (; t + 1 < p.tasks; ++t) {
    const int ctas = colsum_splits(p.task[t].x) * p.task[t].x.B * p.task[t].x.H;
    if (idx < ctas) break;
    idx -= ctas;
  }
  const TokenMeanTask& task = p.task[t];
  const PreprocessParams& x = task.x;
  const int splits = colsum_splits(x);
  const int bh = idx / splits, split = idx % splits, b = bh / x.H, h = bh % x.H;
  int len = x.N;
  if (x.kv_lens != nullptr) len = min(x.kv_lens[b], x.N);
  const int start = split * kColsumTokens;
  const int end = min(start + kColsumTokens, len);
  const int c8 = threadIdx.x % TPR, r0 = threadIdx.x / TPR;
  const T* xr = static_cast<const T*>(x.x) + (size_t)b * x.sb + (size_t)h * x.sh + c8 * 8;
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int n = start + r0; n < end; n += U * RSTEP) {
    uint4 raw[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int m = n + u * RSTEP;  // rows past the range load +0, which adds nothing
      raw[u] = m < end ? *reinterpret_cast<const uint4*>(xr + (size_t)m * x.sn) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const T* e = reinterpret_cast<const T*>(&raw[u]);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] += (double)to_f32<T>(e[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) part[r0][c8 * 8 + i] = acc[i];
  __syncthreads();
  if (threadIdx.x < D && start < end) {
    double tot = 0.0;
    for (int r = 0; r < RSTEP; ++r) tot += part[r][threadIdx.x];
    atomicAdd(task.sum + (size_t)bh * D + threadIdx.x, tot);
  }
  __threadfence();  // this CTA's sums are visible device-wide before it counts itself done
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) {
    last = atomicAdd(task.done + bh, 1u) == (unsigned)splits - 1;
    __threadfence();  // (acquire side: the other CTAs' sums are read after their counts)
  }
  __syncthreads();
  if (last && threadIdx.x < D) {
    const double tot = __ldcg(task.sum + (size_t)bh * D + threadIdx.x);  // (from L2, where the atomics landed)
    task.mean[(size_t)bh * D + threadIdx.x] = __double2float_rn(tot / (double)len);
  }
}

// Q's and K's rows: CTAs of kRowThreads threads over kRowPasses * RPP consecutive rows of one (batch, head); thread
// t holds channels 8 * (t % TPR) .. + 7 (one 16-byte load) of the rows t / TPR + RPP * i, i < kRowPasses, all
// loaded before the first is used; a row's max (and bias dot) by shuffles among its TPR lanes.
constexpr int kRowThreads = 256;
constexpr int kRowPasses = 4;

template <int D>
struct RowSplit {
  static constexpr int TPR = D / 8;                // threads per row
  static constexpr int RPP = kRowThreads / TPR;    // rows per pass
  static constexpr int ROWS = RPP * kRowPasses;    // rows per CTA
};

// sum over the TPR consecutive lanes holding one row (xor butterfly) / max over them
template <int TPR>
__device__ __forceinline__ float row_sum(float a) {
#pragma unroll
  for (int o = TPR / 2; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
  return a;
}
template <int TPR>
__device__ __forceinline__ float row_max(float a) {
#pragma unroll
  for (int o = TPR / 2; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  return a;
}

// Q smoothing's ΔS of one row, q_mean . k_s in float32, summed in a fixed order (the bias's bits): the D channels as
// 32 runs of D / 32 (fmaf chains), the runs added by the xor butterfly over 32 run indices, highest distance first.
// A thread holds G = 8 / (D / 32) runs: distances G .. 16 cross threads (lane distance / G), 1 .. G / 2 are its own.
template <int D>
__device__ __forceinline__ float row_dot(const float (&qm)[8], const float (&v)[8]) {
  constexpr int RUN = D / 32, G = 8 / RUN;
  float s[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    s[g] = 0.f;
#pragma unroll
    for (int i = g * RUN; i < (g + 1) * RUN; ++i) s[g] = fmaf(qm[i], v[i], s[g]);
    s[g] = row_sum<D / 8>(s[g]);
  }
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) {
#pragma unroll
    for (int g = 0; g < o; ++g) s[g] = s[g] + s[g + o];  // run g's partner at distance o is g ^ o = g + o
  }
  return s[0];
}

// Rows of one (batch, head) of p (blockIdx.y), cta the CTA's index among p's ceil(N_pad / ROWS). Rows N .. N_pad - 1
// are zero with scale 0 (and bias 0). QMAX: the symmetric grid (7: INT4 values; 127 would be INT8 rows, s8 only).
template <typename T, int D, bool S4, int QMAX>
__device__ __forceinline__ void quant_rows(const PreprocessParams& p, int cta) {
  static_assert(QMAX == 7 || !S4, "INT8 rows take the s8 layout");
  using RS = RowSplit<D>;
  constexpr int DB = S4 ? D / 2 : D;
  const int c8 = threadIdx.x % RS::TPR;
  const int bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
  const int n0 = cta * RS::ROWS + threadIdx.x / RS::TPR;
  const T* xb = static_cast<const T*>(p.x) + (size_t)b * p.sb + (size_t)h * p.sh + c8 * 8;
  uint4 raw[kRowPasses];
#pragma unroll
  for (int i = 0; i < kRowPasses; ++i) {
    const int n = n0 + i * RS::RPP;
    raw[i] = n < p.N ? *reinterpret_cast<const uint4*>(xb + (size_t)n * p.sn) : make_uint4(0u, 0u, 0u, 0u);
  }
  // the means in shared memory, read again in each pass: 16 fewer registers than holding them
  __shared__ __align__(16) float s_mu[D], s_qm[D];
  if (threadIdx.x < D) {
    s_mu[threadIdx.x] = p.mean != nullptr ? p.mean[(size_t)bh * D + threadIdx.x] : 0.f;
    s_qm[threadIdx.x] = p.bias != nullptr ? p.q_mean[(size_t)bh * D + threadIdx.x] : 0.f;
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kRowPasses; ++i) {
    const int n = n0 + i * RS::RPP;
    const bool live = n < p.N;  // (every lane runs the shuffles; only the stores stop at N_pad)
    const T* e = reinterpret_cast<const T*>(&raw[i]);
    float v[8], mu[8], qm[8];
    *reinterpret_cast<float4*>(mu) = reinterpret_cast<const float4*>(s_mu)[2 * c8];
    *reinterpret_cast<float4*>(mu + 4) = reinterpret_cast<const float4*>(s_mu)[2 * c8 + 1];
    *reinterpret_cast<float4*>(qm) = reinterpret_cast<const float4*>(s_qm)[2 * c8];
    *reinterpret_cast<float4*>(qm + 4) = reinterpret_cast<const float4*>(s_qm)[2 * c8 + 1];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      v[j] = to_f32<T>(e[j]);
      if (p.mean != nullptr) v[j] = v[j] - mu[j];
      if (!live) v[j] = 0.f;
    }
    float dot = 0.f;
    if (p.bias != nullptr) dot = row_dot<D>(qm, v);
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
    amax = row_max<RS::TPR>(amax);
    int qv[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float scale = 0.f;
    if (amax != 0.f) {
      const float inv = __fdiv_rn((float)QMAX, amax);
#pragma unroll
      for (int j = 0; j < 8; ++j) qv[j] = quant7<QMAX>(v[j], inv);
      scale = __fdiv_rn(amax, (float)QMAX);
    }
    if (n >= p.N_pad) continue;
    const size_t row = (size_t)bh * p.N_pad + n;
    if constexpr (!S4) {
      uint32_t w[2] = {0u, 0u};
#pragma unroll
      for (int j = 0; j < 8; ++j) w[j / 4] |= (uint32_t)(qv[j] & 0xFF) << (8 * (j % 4));
      *reinterpret_cast<uint2*>(p.out + row * DB + c8 * 8) = make_uint2(w[0], w[1]);
    } else {
      uint32_t w = 0u;  // element 2c in the low nibble of byte c
#pragma unroll
      for (int j = 0; j < 8; ++j) w |= (uint32_t)(qv[j] & 0xF) << (4 * j);
      *reinterpret_cast<uint32_t*>(p.out + row * DB + c8 * 4) = w;
    }
    if (c8 == 0) {
      p.scale[row] = scale;
      if (p.bias != nullptr) p.bias[row] = (live ? dot : 0.f) * p.qk_scale;
    }
  }
}

// The rows of Q and of K in one grid: CTAs x < q_ctas take Q's rows, the others K's.
struct QuantRowsParams {
  PreprocessParams q, k;
  int q_ctas;
};

// grid (q_ctas + K's CTAs, B * H). Each tensor's rows through its own copy of quant_rows (constant offsets into
// the parameters, as two launches had). (4 CTAs per SM: 64 KB of loads in flight; at 48 registers for 5 it spills)
template <typename T, int D, bool S4, int QMAX = 7>
__global__ void __launch_bounds__(kRowThreads, 4) quant_rows_kernel(const __grid_constant__ QuantRowsParams p) {
  if ((int)blockIdx.x < p.q_ctas)
    quant_rows<T, D, S4, QMAX>(p.q, blockIdx.x);
  else
    quant_rows<T, D, S4, QMAX>(p.k, blockIdx.x - p.q_ctas);
}

// V's key blocks: P threads per channel (up to 256 threads, each with whole 16-byte chunks of its V^T row)
template <int D, int BN, bool S4>
struct VSplit {
  static constexpr int VB = S4 ? BN / 2 : BN;  // V^T bytes of one channel and block
  static constexpr int P = 256 / D < VB / 16 ? 256 / D : VB / 16;
  static constexpr int THREADS = P * D;
};

// grid (nblk, BH), VSplit::THREADS threads: thread t takes channel d = t % D of key block blockIdx.x at the V^T
// positions part * PPT .. + PPT - 1 (part = t / D, PPT = BN / P); the block's max |v - mean| and the column sum of
// channel d combine the P parts through shared memory (a max and an integer sum: the same in any order).
// (6 CTAs per SM: as many as the H100's shared memory holds at D = BN = 128)
template <typename T, int D, int BN, bool S4, int PMODE, bool SIGNMAG = false>
__global__ void __launch_bounds__(VSplit<D, BN, S4>::THREADS, 6) quant_v_kernel(const PreprocessParams p) {
  using VS = VSplit<D, BN, S4>;
  constexpr int CHK = S4 ? 64 : 32;
  constexpr int VB = VS::VB, P = VS::P, NT = VS::THREADS, PPT = BN / P;
  static_assert(PPT % (CHK / 2) == 0, "a part is whole half-chunks of CHK keys: the permutation stays inside it");
  const int kb = blockIdx.x, bh = blockIdx.y, b = bh / p.H, h = bh % p.H;
  const int d = threadIdx.x % D, part = threadIdx.x / D, p0 = part * PPT;
  int len = p.N;
  if (p.kv_lens != nullptr) len = min(p.kv_lens[b], p.N);
  // Stage the BN x D tile in shared memory with coalesced 16-byte copies, all in flight at once and through no
  // registers (rows must be 16-byte aligned: checked by the binding; keys >= len are zero), then each thread reads
  // its part of column d.
  __shared__ __align__(16) T tile[BN * D];
  __shared__ float part_amax[P][D];
  const T* xb = static_cast<const T*>(p.x) + (size_t)b * p.sb + (size_t)h * p.sh;
  constexpr int CPR = D / 8;  // 16-byte chunks per row
  static_assert(BN * CPR % NT == 0, "whole copies per thread");
#pragma unroll
  for (int i = 0; i < BN * CPR / NT; ++i) {
    const int c = threadIdx.x + i * NT;
    const int j = c / CPR, c8 = c % CPR;
    const int key = kb * BN + j;
    const bool in = key < len;
    cp_async16_zfill(tile + j * D + c8 * 8, in ? xb + (size_t)key * p.sn + c8 * 8 : xb, in ? 16 : 0);
  }
  const float mu = p.mean != nullptr ? p.mean[(size_t)bh * D + d] : 0.f;
  cp_async_wait_all();
  __syncthreads();
  // Two passes over the part's keys (no per-key register arrays: BN = 128 spilled): the max, then (after the
  // parts' maxima meet) quantize straight into the permuted V^T bytes while summing the column. Both passes come in
  // two copies: FULL for a part with every key below len (no per-value test), and one that reads 0 from key nv on.
  const T* col = tile + p0 * D + d;       // this part's keys of column d
  const int nv = len - kb * BN - p0;      // how many of them are below len
  auto value = [&](int j, auto full) {
    return decltype(full)::value || j < nv ? to_f32<T>(col[j * D]) - mu : 0.f;
  };
  auto part_max = [&](auto full) {
    float m = 0.f;
#pragma unroll 16
    for (int j = 0; j < PPT; ++j) m = fmaxf(m, fabsf(value(j, full)));
    return m;
  };
  float amax = nv >= PPT ? part_max(std::true_type{}) : part_max(std::false_type{});
  part_amax[part][d] = amax;
  __syncthreads();
#pragma unroll
  for (int k = 0; k < P; ++k) amax = fmaxf(amax, part_amax[k][d]);
  const float inv = amax == 0.f ? 0.f : __fdiv_rn(7.0f, amax);
  const float scale = amax == 0.f ? 0.f : __fdiv_rn(amax, 7.0f);
  // The part of row d of the V^T tile is built in registers, then goes to shared memory (over the input tile, once
  // every thread has read its column; 16-byte chunk c at c ^ (d % CH)), and the tile leaves with coalesced stores
  // (CH threads per 16*CH-byte row). One shared buffer: more CTAs per SM.
  constexpr int CH = VB / 16, CHT = CH / P;  // chunks per V^T row / per thread
  static_assert(D * CH * 16 + P * D * (int)sizeof(int) <= BN * D * (int)sizeof(T),
                "the V^T tile and the parts' column sums fit in the input tile's space");
  uint32_t row[4 * CHT];  // words of the part's V^T bytes
  int colsum = 0;
  auto quantize = [&](auto full) {
    // local position -> quantized value; the part starts at a multiple of CHK / 2: its key is p0 + the local key
    auto q_at = [&](int pos) { return quant7(value(vt_key_of_position(pos, CHK), full), inv); };
#pragma unroll
    for (int w = 0; w < 4 * CHT; ++w) {
      if constexpr (!S4) {  // bytes 4w .. 4w + 3 = positions 4w ..
        const int q0 = q_at(4 * w), q1 = q_at(4 * w + 1), q2 = q_at(4 * w + 2), q3 = q_at(4 * w + 3);
        colsum += q0 + q1 + q2 + q3;
        row[w] = SIGNMAG ? sign_magnitude_bytes(pack_low_bytes(q0, q1, q2, q3)) : pack_low_bytes(q0, q1, q2, q3);
      } else {  // byte 4w + i = positions 8w + 2i (low nibble) and 8w + 2i + 1 (high nibble)
        int q[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) q[i] = q_at(8 * w + i);
#pragma unroll
        for (int i = 0; i < 8; ++i) colsum += q[i];
        const uint32_t lo = pack_low_bytes(q[0], q[2], q[4], q[6]), hi = pack_low_bytes(q[1], q[3], q[5], q[7]);
        row[w] = (lo & 0x0F0F0F0Fu) | ((hi << 4) & 0xF0F0F0F0u);
      }
    }
  };
#pragma unroll
  for (int w = 0; w < 4 * CHT; ++w) row[w] = 0u;
  if (amax != 0.f) {  // (else zero bytes and sum 0: one branch for the column, not one per value)
    if (nv >= PPT)
      quantize(std::true_type{});
    else
      quantize(std::false_type{});
  }
  __syncthreads();  // every column read: the input tile's space takes the V^T tile and the parts' sums
  uint4* vt_tile = reinterpret_cast<uint4*>(tile);
  int* part_sum = reinterpret_cast<int*>(vt_tile + D * CH);
#pragma unroll
  for (int c = 0; c < CHT; ++c) {
    const int cg = part * CHT + c;
    vt_tile[d * CH + (cg ^ (d % CH))] = make_uint4(row[4 * c], row[4 * c + 1], row[4 * c + 2], row[4 * c + 3]);
  }
  part_sum[part * D + d] = colsum;
  __syncthreads();
  const size_t vrow = S4 ? (size_t)p.N_pad / 2 : (size_t)p.N_pad;
  int8_t* vt_out = p.out + (size_t)bh * D * vrow + (size_t)kb * VB;
#pragma unroll
  for (int i = threadIdx.x; i < D * CH; i += NT) {
    const int r = i / CH, c = i % CH;
    *reinterpret_cast<uint4*>(vt_out + (size_t)r * vrow + c * 16) = vt_tile[r * CH + (c ^ (r % CH))];
  }
  if (part == 0) {
#pragma unroll
    for (int k = 1; k < P; ++k) colsum += part_sum[k * D + d];
    const int nblk = p.N_pad / BN;
    float* vp = p.scale + (((size_t)bh * nblk + kb) * D + d) * 2;
    vp[0] = scale;  // the P levels' 1/15 (1/7) cancels in O / l: both are kept in units of P^
    vp[1] = __int_as_float(kMagicI + (PMODE == kPRange ? 8 * colsum : 0));
  }
}

template <typename T>
cudaError_t colsum_typed(const TokenMeanParams& p, cudaStream_t stream) {
  long long ctas = 0;
  for (int t = 0; t < p.tasks; ++t) ctas += (long long)colsum_splits(p.task[t].x) * p.task[t].x.B * p.task[t].x.H;
  if (ctas > 0) {
    if (p.task[0].x.D == 128)
      colsum_f64_kernel<T, 128><<<(unsigned)ctas, 256, 0, stream>>>(p);
    else
      colsum_f64_kernel<T, 64><<<(unsigned)ctas, 256, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

template <typename T, int D, bool S4>
cudaError_t rows_typed(const PreprocessParams& q, const PreprocessParams& k, cudaStream_t stream) {
  constexpr int ROWS = RowSplit<D>::ROWS;
  const QuantRowsParams p{q, k, (q.N_pad + ROWS - 1) / ROWS};
  const int ctas = p.q_ctas + (k.N_pad + ROWS - 1) / ROWS;
  if (ctas > 0 && q.B * q.H > 0) quant_rows_kernel<T, D, S4><<<dim3(ctas, q.B * q.H), kRowThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int D, int BN, int VFMT>
cudaError_t v_typed(const PreprocessParams& p, int p_mode, cudaStream_t stream) {
  constexpr bool S4 = VFMT == kVNibbles, SIGNMAG = VFMT == kVSignMagnitude;
  constexpr int threads = VSplit<D, BN, S4>::THREADS;
  dim3 grid(p.N_pad / BN, p.B * p.H);
  if (p_mode == kPRange)
    quant_v_kernel<T, D, BN, S4, kPRange, SIGNMAG><<<grid, threads, 0, stream>>>(p);
  else
    quant_v_kernel<T, D, BN, S4, kPSym, SIGNMAG><<<grid, threads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int D, int BN>
cudaError_t v_fmt(const PreprocessParams& p, int v_format, int p_mode, cudaStream_t stream) {
  if (v_format == kVTwosComplement) return v_typed<T, D, BN, kVTwosComplement>(p, p_mode, stream);
  if (v_format == kVNibbles) return v_typed<T, D, BN, kVNibbles>(p, p_mode, stream);
  if (v_format == kVSignMagnitude) return v_typed<T, D, BN, kVSignMagnitude>(p, p_mode, stream);
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t v_type(const PreprocessParams& p, int block_n, int v_format, int p_mode, cudaStream_t stream) {
  if (p.D == 64 && block_n == 64) return v_fmt<T, 64, 64>(p, v_format, p_mode, stream);
  if (p.D == 64 && block_n == 128) return v_fmt<T, 64, 128>(p, v_format, p_mode, stream);
  if (p.D == 128 && block_n == 64) return v_fmt<T, 128, 64>(p, v_format, p_mode, stream);
  if (p.D == 128 && block_n == 128) return v_fmt<T, 128, 128>(p, v_format, p_mode, stream);
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t rows_type(const PreprocessParams& q, const PreprocessParams& k, bool s4, cudaStream_t stream) {
  if (q.D == 64) return s4 ? rows_typed<T, 64, true>(q, k, stream) : rows_typed<T, 64, false>(q, k, stream);
  if (q.D == 128) return s4 ? rows_typed<T, 128, true>(q, k, stream) : rows_typed<T, 128, false>(q, k, stream);
  return cudaErrorInvalidValue;
}

}  // namespace pre

cudaError_t launch_token_means_f64(const TokenMeanParams& p, cudaStream_t stream) {
  if (p.tasks < 1 || p.tasks > 3) return cudaErrorInvalidValue;
  const PreprocessParams& x0 = p.task[0].x;
  for (int t = 0; t < p.tasks; ++t) {
    const PreprocessParams& x = p.task[t].x;
    if (x.D != x0.D || x.is_bf16 != x0.is_bf16 || (x.D != 64 && x.D != 128)) return cudaErrorInvalidValue;
  }
  return x0.is_bf16 ? pre::colsum_typed<__nv_bfloat16>(p, stream) : pre::colsum_typed<__half>(p, stream);
}

cudaError_t launch_quant_rows_int4(const PreprocessParams& q, const PreprocessParams& k, bool s4,
                                   cudaStream_t stream) {
  if (k.D != q.D || k.is_bf16 != q.is_bf16 || k.B != q.B || k.H != q.H) return cudaErrorInvalidValue;
  return q.is_bf16 ? pre::rows_type<__nv_bfloat16>(q, k, s4, stream) : pre::rows_type<__half>(q, k, s4, stream);
}

cudaError_t launch_quant_v_int4(const PreprocessParams& p, int block_n, int v_format, int p_mode, cudaStream_t stream) {
  return p.is_bf16 ? pre::v_type<__nv_bfloat16>(p, block_n, v_format, p_mode, stream)
                   : pre::v_type<__half>(p, block_n, v_format, p_mode, stream);
}

}  // namespace rotvid
