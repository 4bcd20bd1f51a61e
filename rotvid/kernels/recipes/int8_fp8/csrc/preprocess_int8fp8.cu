// Fused pre-processing of the int8-fp8 recipe (Hopper default): two launches after one memset, bit-identical to
// the per-tensor kernels of preprocess_int4.cu (rows_i8_type, quant_k_groups_int8_kernel, col_absmax_kernel +
// quant_v_fp8_kernel, colsum_f64_kernel) and so to rotvid.kernels.quantize.
//   col_stats_kernel   one grid over K and V: float64 per-channel token sums of K (the smoothing mean) and the
//                      per-channel max of |v| over the valid tokens (or V's sums, then a second launch for the max
//                      of |v - mean| when V is smoothed)
//   quantize_kernel    one grid over Q, K and V tiles of 128 rows: INT8 Q per token, INT8 K per group of 32 keys
//                      per 128-key block, FP8 e4m3 V per channel written transposed and permuted (s8 layout)
// With RoPE·R applied here (launch_int8fp8_rope, before the two above; the RoPE·R pass's arithmetic, rope_rows.cuh):
//   rope_q_kernel      Q rotated and quantized per token in one pass (the quantize launch then has no Q tiles);
//                      K keeps the RoPE·R pass (rope_table.cu) into a scratch tensor that the two launches read --
//                      its smoothing sums need every token first (K's own sums in a fused K pass cost more than
//                      the statistics launch's read of K: RESULTS.md, session 11)
// With the online V/O Hadamard (V_HADAMARD, launch_int8fp8_stats / _quantize with v_hadamard): every V row is
// transformed right after its load by the butterflies of roperows::wht8 and the power of two 2^-ceil(k/2) (D = 2^k),
// rounded to V's dtype, so that the statistics and the quantization see the bits of
// rotvid.rope.hadamard.rotate_v_online; the V_HADAMARD = false instantiations are the kernels as they were. The
// rotated paths hold a V row in 4 lanes (roperows::wht4lanes: the same operations per channel, 2 shuffle stages
// instead of 3-4): lane c of the row's 4 consecutive lanes loads its chunks c, c + 4, ... (col_stats_rows4: 64 rows
// per step of 256 threads; stage_rotated_v_tile: the quantize tile's rows t / 4 and t / 4 + 64, rotated in registers
// and staged row-major as the unrotated tile). The K CTAs of a V_HADAMARD statistics launch run the unrotated code.
// Every load is a 16-byte vector (8 channels); a tile's loads are all issued before its first use.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "int8fp8_entry.cuh"
#include "common/rope_rows.cuh"

namespace rotvid {
namespace pre8 {

constexpr int kThreads = 256;
constexpr int kTileRows = 128;      // rows (tokens) of one quantize tile: the padding of Q and K/V
constexpr int kStatsTokens = 1024;  // tokens per statistics CTA

using roperows::to_f32;

template <typename T>
__device__ __forceinline__ void unpack8(const uint4& raw, float (&f)[8]) {
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = to_f32<T>(e[i]);
}

// element j (compile-time after unrolling) of a 16-byte chunk as float: converted where used, so the raw chunks of
// a whole tile stay in registers at 2 bytes per value
template <typename T>
__device__ __forceinline__ float elem(const uint4& raw, int j) {
  return to_f32<T>(reinterpret_cast<const T*>(&raw)[j]);
}

__device__ __forceinline__ int valid_len(const PreprocessParams& x, int b) {
  return x.kv_lens != nullptr ? min(x.kv_lens[b], x.N) : x.N;
}

__device__ __forceinline__ const uint4* row_ptr(const PreprocessParams& x, int b, int h, int n, int c8) {
  return reinterpret_cast<const uint4*>(static_cast<const char*>(x.x) +
                                        2 * ((size_t)b * x.sb + (size_t)h * x.sh + (size_t)n * x.sn + c8 * 8));
}

__device__ __forceinline__ int int8_rn_clamped(float x, float inv) {
  return max(-127, min(127, __float2int_rn(x * inv)));
}

// bytes j = int8(f(j)) of 8 values, f(j) the quantized level of element j
template <typename F>
__device__ __forceinline__ uint2 pack_int8x8(F f) {
  uint32_t w[2] = {0u, 0u};
#pragma unroll
  for (int j = 0; j < 8; ++j) w[j / 4] |= (uint32_t)(f(j) & 0xFF) << (8 * (j % 4));
  return make_uint2(w[0], w[1]);
}

// byte i = e4m3(fi), round to nearest even, saturating (as preprocess_int4.cu)
__device__ __forceinline__ uint32_t e4m3x4(float f0, float f1, float f2, float f3) {
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(f0, f1), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(f2, f3), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}

// V_HADAMARD: a V row held by 4 lanes (roperows::wht4lanes' layout: lane c = lane % 4 holds the chunks c + 4 i, i <
// D / 32, y[8 i + e] = channel 8 (c + 4 i) + e), loaded by the 4 consecutive lanes of the row
constexpr int kV4Lanes = 4;

// y[8 i + e] = element e of chunk i, the row's loaded chunks as float
template <typename T, int NCH>
__device__ __forceinline__ void unpack_chunks(const uint4 (&raw)[NCH], float (&y)[8 * NCH]) {
#pragma unroll
  for (int i = 0; i < NCH; ++i) {
#pragma unroll
    for (int e = 0; e < 8; ++e) y[8 * i + e] = elem<T>(raw[i], e);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Statistics: per-channel reductions over the valid tokens of one (batch, head), split over CTAs of kStatsTokens.

struct ColStatsTask {
  PreprocessParams x;        // tensor, strides, B, H, N, D, kv_lens
  double* sum;               // non-null: sum[bh, d] += float64 token sums
  unsigned int* amax_bits;   // else: atomicMax of max |x - mean| as float bits (non-negative floats order as bits)
  const double* mean_sum;    // max mode: mean = float32(mean_sum / len), nullptr: 0
  float* mean_out;           // max mode with mean_sum: the first CTA of each (b, h) writes the mean (or nullptr)
  int ctas_per_bh;           // 0: no work for this task
};

struct ColStatsParams {
  ColStatsTask task[2];  // V, when there is V, is task[1] (stats_typed): the one V_HADAMARD rotates
};

// V_HADAMARD, a CTA of task[1]: the statistics of col_stats_kernel on the rotated rows, each row held by 4 lanes in
// roperows::wht4lanes' layout -- thread t owns row t / 4 of each step of 64 rows and the chunks t % 4 + 4 i, i.e. the
// D / 4 channels 8 (t % 4 + 4 i) + e. Every lane runs the same number of row steps (rows past `end` load as zeros and
// stay zeros through the transform: +0 adds nothing, the max skips them). Each value is rotated exactly as
// roperows::vo_hadamard8 rotates it (wht4lanes: the same operations per channel), and sums of float64 of floats are
// exact (the order does not matter) as maxima are order-free, so the results are those of the rows-of-8-lanes layout.
// The 8 rows of a warp are then folded by shuffles down to KEEP = 256 / D, i.e. 8 KEEP = RSTEP rows of the kernel's
// `part` (its size), which the tail reduces as the kernel's does.
template <typename T, int D>
__device__ __forceinline__ void col_stats_rows4(const ColStatsTask& task, int bh, int b, int h, int len, int split,
                                                int start, int end, double (*part)[D + 1]) {
  constexpr int NCH = D / 32;                // 16-byte chunks per lane of a row
  constexpr int V = D / kV4Lanes;            // channels per lane
  constexpr int RSTEP = kThreads / kV4Lanes; // rows per step
  constexpr int U = 4 / NCH;                 // steps whose loads are in flight together: 4 chunks per lane
  constexpr int KEEP = 256 / D;              // rows per warp left for `part`: 8 warps x KEEP = its 2048 / D rows
  __shared__ float s_mu[D];
  const PreprocessParams& x = task.x;
  const int c = threadIdx.x % kV4Lanes, r0 = threadIdx.x / kV4Lanes;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const bool sum_mode = task.sum != nullptr;
  auto channel = [&](int j) { return 8 * (c + 4 * (j / 8)) + j % 8; };  // of y[j]
  // rows n0 + u RSTEP + r0 of the step at n0 (zeros past `end`) into raw[u], U steps' loads in flight
  auto load = [&](int n0, uint4 (&raw)[U][NCH]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int m = n0 + u * RSTEP + r0;
#pragma unroll
      for (int i = 0; i < NCH; ++i)
        raw[u][i] = m < end ? *row_ptr(x, b, h, m, c + 4 * i) : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  // y = T(wht(y) 2^-ceil(k/2)) read back as float (roperows::vo_hadamard8's bits, channel by channel)
  auto rotate = [&](float (&y)[V]) {
    roperows::wht4lanes<D>(y);
#pragma unroll
    for (int j = 0; j < V; ++j) y[j] = roperows::round_to<T>(__fmul_rn(y[j], roperows::kVoScaleV<D>));
  };
  if (sum_mode) {
    double acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) acc[j] = 0.0;
    for (int n0 = start; n0 < end; n0 += U * RSTEP) {  // (the same trip count for every lane)
      uint4 raw[U][NCH];
      load(n0, raw);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float f[V];
        unpack_chunks<T, NCH>(raw[u], f);
        rotate(f);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] += (double)f[j];  // exact in float64: the order does not matter
      }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
#pragma unroll
      for (int o = 16; o >= 4 * KEEP; o /= 2) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);  // row ^ (o / 4)
    }
    if (lane / 4 < KEEP) {
#pragma unroll
      for (int j = 0; j < V; ++j) part[warp * KEEP + lane / 4][channel(j)] = acc[j];
    }
  } else {
    if (threadIdx.x < D)
      s_mu[threadIdx.x] = task.mean_sum != nullptr
                              ? __double2float_rn(task.mean_sum[(size_t)bh * D + threadIdx.x] / (double)len)
                              : 0.f;
    __syncthreads();
    float mu[V], acc[V];
#pragma unroll
    for (int j = 0; j < V; ++j) {
      mu[j] = s_mu[channel(j)];
      acc[j] = 0.f;
    }
    for (int n0 = start; n0 < end; n0 += U * RSTEP) {
      uint4 raw[U][NCH];
      load(n0, raw);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float f[V];  // every lane transforms (the shuffles), only the valid rows count
        unpack_chunks<T, NCH>(raw[u], f);
        rotate(f);
        if (n0 + u * RSTEP + r0 < end) {
#pragma unroll
          for (int j = 0; j < V; ++j) acc[j] = fmaxf(acc[j], fabsf(f[j] - mu[j]));
        }
      }
    }
#pragma unroll
    for (int j = 0; j < V; ++j) {
#pragma unroll
      for (int o = 16; o >= 4 * KEEP; o /= 2) acc[j] = fmaxf(acc[j], __shfl_xor_sync(0xffffffffu, acc[j], o));
    }
    if (lane / 4 < KEEP) {
#pragma unroll
      for (int j = 0; j < V; ++j) part[warp * KEEP + lane / 4][channel(j)] = (double)acc[j];  // (exact round trip)
    }
  }
  __syncthreads();
  constexpr int PROWS = 8 * KEEP;
  if (threadIdx.x < D) {
    const size_t at = (size_t)bh * D + threadIdx.x;
    if (start < end) {
      if (sum_mode) {
        double tot = 0.0;
        for (int r = 0; r < PROWS; ++r) tot += part[r][threadIdx.x];
        atomicAdd(task.sum + at, tot);
      } else {
        float m = 0.f;
        for (int r = 0; r < PROWS; ++r) m = fmaxf(m, (float)part[r][threadIdx.x]);
        atomicMax(task.amax_bits + at, __float_as_uint(m));
      }
    }
    if (!sum_mode && split == 0 && task.mean_sum != nullptr && task.mean_out != nullptr)
      task.mean_out[at] = __double2float_rn(task.mean_sum[at] / (double)len);
  }
}

// grid (sum over tasks of ctas_per_bh * B * H), 256 threads; consecutive CTAs walk one (b, h) token range; thread t
// holds chunk t % TPR of the rows t / TPR + RSTEP s. V_HADAMARD: the CTAs of task[1] rotate their rows (the online V/O
// Hadamard) in col_stats_rows4's layout instead; those of task[0] (K) run the code below, as V_HADAMARD = false.
template <typename T, int D, bool V_HADAMARD>
__global__ void __launch_bounds__(kThreads) col_stats_kernel(const __grid_constant__ ColStatsParams p) {
  constexpr int TPR = D / 8;               // threads per row (16 bytes each)
  constexpr int RSTEP = kThreads / TPR;    // rows per step
  constexpr int U = 4;                     // steps whose loads are in flight together
  __shared__ double part[RSTEP][D + 1];
  int idx = blockIdx.x;
  const int t0_ctas = p.task[0].ctas_per_bh * p.task[0].x.B * p.task[0].x.H;
  const ColStatsTask& task = idx < t0_ctas ? p.task[0] : p.task[1];
  const bool rotate = V_HADAMARD && idx >= t0_ctas;  // (the same for the whole CTA)
  if (idx >= t0_ctas) idx -= t0_ctas;
  const PreprocessParams& x = task.x;
  const int bh = idx / task.ctas_per_bh, split = idx % task.ctas_per_bh;
  const int b = bh / x.H, h = bh % x.H;
  const int len = valid_len(x, b);
  const int start = split * kStatsTokens, end = min(start + kStatsTokens, len);
  if constexpr (V_HADAMARD) {
    if (rotate) {  // (the whole CTA)
      col_stats_rows4<T, D>(task, bh, b, h, len, split, start, end, part);
      return;
    }
  }
  const int c8 = threadIdx.x % TPR, r0 = threadIdx.x / TPR;
  const bool sum_mode = task.sum != nullptr;
  if (sum_mode) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int n = start + r0; n < end; n += U * RSTEP) {
      uint4 raw[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int m = n + u * RSTEP;
        raw[u] = m < end ? *row_ptr(x, b, h, m, c8) : make_uint4(0u, 0u, 0u, 0u);  // +0 adds nothing
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float f[8];
        unpack8<T>(raw[u], f);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += (double)f[i];  // exact in float64: the order does not matter
      }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) part[r0][c8 * 8 + i] = acc[i];
  } else {
    float mu[8], acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      mu[i] = task.mean_sum != nullptr
                  ? __double2float_rn(task.mean_sum[(size_t)bh * D + c8 * 8 + i] / (double)len)
                  : 0.f;
      acc[i] = 0.f;
    }
    for (int n = start + r0; n < end; n += U * RSTEP) {
      uint4 raw[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int m = n + u * RSTEP;
        raw[u] = m < end ? *row_ptr(x, b, h, m, c8) : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (n + u * RSTEP < end) {
          float f[8];
          unpack8<T>(raw[u], f);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[i] = fmaxf(acc[i], fabsf(f[i] - mu[i]));
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) part[r0][c8 * 8 + i] = (double)acc[i];  // (exact round trip)
  }
  __syncthreads();
  if (threadIdx.x < D) {
    const size_t at = (size_t)bh * D + threadIdx.x;
    if (start < end) {
      if (sum_mode) {
        double tot = 0.0;
        for (int r = 0; r < RSTEP; ++r) tot += part[r][threadIdx.x];
        atomicAdd(task.sum + at, tot);
      } else {
        float m = 0.f;
        for (int r = 0; r < RSTEP; ++r) m = fmaxf(m, (float)part[r][threadIdx.x]);
        atomicMax(task.amax_bits + at, __float_as_uint(m));
      }
    }
    if (!sum_mode && split == 0 && task.mean_sum != nullptr && task.mean_out != nullptr)
      task.mean_out[at] = __double2float_rn(task.mean_sum[at] / (double)len);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Quantize: tiles of 128 rows of one (batch, head); 256 threads. In the Q and K tiles thread t holds channels
// 8 * (t % TPR) .. + 7 of the rows t / TPR + RPP * i (i < PASSES), all loaded up front (32 KB per CTA at D = 128).

template <int D>
struct RowTile {
  static constexpr int TPR = D / 8;
  static constexpr int RPP = kThreads / TPR;
  static constexpr int PASSES = kTileRows / RPP;
};

// max over the TPR consecutive lanes holding one row
template <int TPR>
__device__ __forceinline__ float row_max(float a) {
#pragma unroll
  for (int o = TPR / 2; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  return a;
}

// INT8 per token (as quant_rows_kernel<T, D, false, 127>): scale = amax / 127, q = clamp(rn(x * (127 / amax)));
// rows >= N are zero with scale 0.
template <typename T, int D>
__device__ __forceinline__ void quantize_q_tile(const PreprocessParams& x, int tile) {
  using RT = RowTile<D>;
  const int tiles_per_bh = x.N_pad / kTileRows;
  const int bh = tile / tiles_per_bh, n0 = (tile % tiles_per_bh) * kTileRows;
  const int b = bh / x.H, h = bh % x.H;
  const int c8 = threadIdx.x % RT::TPR, s = threadIdx.x / RT::TPR;
  uint4 raw[RT::PASSES];
#pragma unroll
  for (int i = 0; i < RT::PASSES; ++i) {
    const int n = n0 + s + i * RT::RPP;
    raw[i] = n < x.N ? *row_ptr(x, b, h, n, c8) : make_uint4(0u, 0u, 0u, 0u);
  }
#pragma unroll
  for (int i = 0; i < RT::PASSES; ++i) {
    const int n = n0 + s + i * RT::RPP;
    float amax = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(elem<T>(raw[i], j)));
    amax = row_max<RT::TPR>(amax);
    uint2 bytes = make_uint2(0u, 0u);
    float scale = 0.f;
    if (amax != 0.f) {
      const float inv = __fdiv_rn(127.0f, amax);
      bytes = pack_int8x8([&](int j) { return int8_rn_clamped(elem<T>(raw[i], j), inv); });
      scale = __fdiv_rn(amax, 127.0f);
    }
    const size_t row = (size_t)bh * x.N_pad + n;
    *reinterpret_cast<uint2*>(x.out + row * D + c8 * 8) = bytes;
    if (c8 == 0) x.scale[row] = scale;
  }
}

// INT8 K per group of 32 keys per 128-key block (as quant_k_groups_int8_kernel): group of key j = (j mod 8) / 2;
// every row a thread holds is in the group ((t / TPR) mod 8) / 2 since RPP is a multiple of 8. x - mean with
// mean = float32(k_sum / len) (no mean when k_sum is null); the group amax over the valid keys (< len); masked
// keys take their group's scale (clamped), rows >= N are zero. scale [BH, N_pad / 128, 4] = amax / 127 (0 if 0).
template <typename T, int D>
__device__ __forceinline__ void quantize_k_tile(const PreprocessParams& x, const double* k_sum, int tile,
                                                unsigned char* smem, float* s_mean, float* s_slot) {
  using RT = RowTile<D>;
  static_assert(RT::RPP % 8 == 0, "a thread's rows share one key group");
  const int tiles_per_bh = x.N_pad / kTileRows;
  const int bh = tile / tiles_per_bh, kb = tile % tiles_per_bh, n0 = kb * kTileRows;
  const int b = bh / x.H, h = bh % x.H;
  const int len = valid_len(x, b);
  const int c8 = threadIdx.x % RT::TPR, s = threadIdx.x / RT::TPR;
  uint4 raw[RT::PASSES];
#pragma unroll
  for (int i = 0; i < RT::PASSES; ++i) {
    const int n = n0 + s + i * RT::RPP;
    raw[i] = n < x.N ? *row_ptr(x, b, h, n, c8) : make_uint4(0u, 0u, 0u, 0u);
  }
  if (threadIdx.x < D)
    s_mean[threadIdx.x] =
        k_sum != nullptr ? __double2float_rn(k_sum[(size_t)bh * D + threadIdx.x] / (double)len) : 0.f;
  __syncthreads();
  float mu[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) mu[j] = s_mean[c8 * 8 + j];
  // x - mean of element j of a row's chunk, 0 on rows >= N
  auto centred = [&](const uint4& r, int i, int j) { return n0 + s + i * RT::RPP < x.N ? elem<T>(r, j) - mu[j] : 0.f; };
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < RT::PASSES; ++i) {
    if (n0 + s + i * RT::RPP < len) {
#pragma unroll
      for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(centred(raw[i], i, j)));
    }
  }
  // the raw chunks wait in shared memory (own slots) while the group scales are formed: 64 fewer live registers
  uint4* parked = reinterpret_cast<uint4*>(smem);
#pragma unroll
  for (int i = 0; i < RT::PASSES; ++i) parked[i * kThreads + threadIdx.x] = raw[i];
  amax = row_max<RT::TPR>(amax);
  if (c8 == 0) s_slot[s] = amax;
  __syncthreads();
  if (threadIdx.x < 4) {
    const int g = threadIdx.x;
    float a = 0.f;
    for (int r = 2 * g; r < RT::RPP; r += 8) a = fmaxf(a, fmaxf(s_slot[r], s_slot[r + 1]));
    s_slot[RT::RPP + g] = a == 0.f ? 0.f : __fdiv_rn(127.0f, a);
    x.scale[((size_t)bh * tiles_per_bh + kb) * 4 + g] = a == 0.f ? 0.f : __fdiv_rn(a, 127.0f);
  }
  __syncthreads();
  const float inv = s_slot[RT::RPP + ((s & 7) >> 1)];
  int8_t* out = x.out + ((size_t)bh * x.N_pad + n0 + s) * D + c8 * 8;
#pragma unroll
  for (int i = 0; i < RT::PASSES; ++i) {
    const uint4 r = parked[i * kThreads + threadIdx.x];
    *reinterpret_cast<uint2*>(out + (size_t)i * RT::RPP * D) =
        pack_int8x8([&](int j) { return int8_rn_clamped(centred(r, i, j), inv); });
  }
}

// V_HADAMARD: the 128 x D V tile rotated (T(wht(v) 2^-ceil(k/2)), roperows::vo_hadamard_chunk's bits) and staged
// row-major at `in` (chunk c of row r at r D / 8 + c, quantize_v_tile's layout). Thread t loads the chunks t % 4 + 4 i
// of the rows t / 4 and t / 4 + 64, 4 lanes per row in roperows::wht4lanes' layout (keys >= len load as zeros and
// stay zeros), all loads issued before the first row's transform so that the second row's are in flight meanwhile.
// Each channel is rotated by the operations vo_hadamard_chunk applies to it (wht4lanes), then multiplied and packed
// (one rounding) as there. An odd row's lanes store their chunks in the order i ^ 1, so that the 8 lanes of a quarter
// warp (two rows) write distinct banks.
template <typename T, int D>
__device__ __forceinline__ void stage_rotated_v_tile(const PreprocessParams& x, int b, int h, int n0, int len,
                                                     uint4* in) {
  constexpr int CPR = D / 8;                       // 16-byte chunks per row
  constexpr int NCH = D / 32;                      // of them per lane
  constexpr int RPP = kThreads / kV4Lanes;         // rows per pass
  constexpr int PASSES = kTileRows / RPP;
  static_assert(RPP % 2 == 0, "a thread's rows have one parity");
  const int c = threadIdx.x % kV4Lanes, r = threadIdx.x / kV4Lanes;
  uint4 raw[PASSES][NCH];
#pragma unroll
  for (int p = 0; p < PASSES; ++p) {
    const int key = n0 + r + p * RPP;
#pragma unroll
    for (int i = 0; i < NCH; ++i)
      raw[p][i] = key < len ? *row_ptr(x, b, h, key, c + 4 * i) : make_uint4(0u, 0u, 0u, 0u);
  }
  const bool odd = (r & 1) != 0;
#pragma unroll
  for (int p = 0; p < PASSES; ++p) {
    float y[D / kV4Lanes];
    unpack_chunks<T, NCH>(raw[p], y);
    roperows::wht4lanes<D>(y);
    constexpr float kScale = roperows::kVoScaleV<D>;
    uint4 o[NCH];
#pragma unroll
    for (int i = 0; i < NCH; ++i) {
      uint32_t w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k)
        w[k] = roperows::pack2<T>(__fmul_rn(y[8 * i + 2 * k], kScale), __fmul_rn(y[8 * i + 2 * k + 1], kScale));
      o[i] = make_uint4(w[0], w[1], w[2], w[3]);
    }
    uint4* row = in + (size_t)(r + p * RPP) * CPR + c;
#pragma unroll
    for (int i = 0; i < NCH; ++i) row[4 * (i ^ (int)odd)] = odd ? o[i ^ 1] : o[i];
  }
}

// FP8 e4m3 V per channel (as quant_v_fp8_kernel): byte = e4m3(rn((v - mean) / scale)), scale = amax / 448 (1 where
// amax is 0), masked and padded keys 0; written to V^T [BH, D, N_pad] with keys permuted per 32. The 128 x D input
// tile is staged in shared memory (coalesced 16-byte loads); thread t builds channel d = t % D at the positions
// (t / D) * D / 2 .. + D / 2 - 1 of the block; the V^T tile (16-byte chunk c of row d at c ^ (d % 8)) goes back
// through the same shared memory and leaves as 128-byte rows. V_HADAMARD: the tile is rotated (the online V/O
// Hadamard) in registers and staged rotated at the same places (stage_rotated_v_tile).
template <typename T, int D, bool V_HADAMARD>
__device__ __forceinline__ void quantize_v_tile(const PreprocessParams& x, const float* v_mean,
                                                const unsigned int* amax_bits, float* v_scale, int tile,
                                                unsigned char* smem) {
  constexpr int CPR = D / 8;                        // 16-byte chunks per input row
  constexpr int LOADS = kTileRows * CPR / kThreads;  // per thread
  constexpr int PPT = kTileRows * D / kThreads;      // V^T positions per thread (= D / 2)
  constexpr int CHT = PPT / 16;                      // 16-byte output chunks per thread
  static_assert(PPT % 32 == 0, "a thread's positions are whole 32-key chunks");
  const int tiles_per_bh = x.N_pad / kTileRows;
  const int bh = tile / tiles_per_bh, kb = tile % tiles_per_bh, n0 = kb * kTileRows;
  const int b = bh / x.H, h = bh % x.H;
  const int len = valid_len(x, b);
  T* in = reinterpret_cast<T*>(smem);
  if constexpr (V_HADAMARD) {
    stage_rotated_v_tile<T, D>(x, b, h, n0, len, reinterpret_cast<uint4*>(in));
  } else {
    uint4 raw[LOADS];
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
      const int c = threadIdx.x + i * kThreads;
      const int key = n0 + c / CPR;
      raw[i] = key < len ? *row_ptr(x, b, h, key, c % CPR) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int i = 0; i < LOADS; ++i) reinterpret_cast<uint4*>(in)[threadIdx.x + i * kThreads] = raw[i];
  }
  const int d = threadIdx.x % D, part = threadIdx.x / D;
  const float mu = v_mean != nullptr ? v_mean[(size_t)bh * D + d] : 0.f;
  const float amax = __uint_as_float(amax_bits[(size_t)bh * D + d]);
  const float scale = amax == 0.f ? 1.f : __fdiv_rn(amax, 448.f);
  if (kb == 0 && part == 0) v_scale[(size_t)bh * D + d] = scale;
  __syncthreads();
  const int p0 = part * PPT;
  auto value = [&](int local) {  // local position (compile-time after unrolling) -> quantized input
    const int j = p0 + vt_key_of_position(local, 32);
    return n0 + j < len ? __fdiv_rn(to_f32<T>(in[j * D + d]) - mu, scale) : 0.f;
  };
  uint4 row[CHT];
#pragma unroll
  for (int c = 0; c < CHT; ++c) {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int pos = 16 * c + 4 * k;
      w[k] = e4m3x4(value(pos), value(pos + 1), value(pos + 2), value(pos + 3));
    }
    row[c] = make_uint4(w[0], w[1], w[2], w[3]);
  }
  __syncthreads();  // every column read: the input tile's space takes the V^T tile
  constexpr int OCH = kTileRows / 16;  // 16-byte chunks per V^T row of the tile (8)
  uint4* vt_tile = reinterpret_cast<uint4*>(smem);
#pragma unroll
  for (int c = 0; c < CHT; ++c) {
    const int cg = part * CHT + c;
    vt_tile[d * OCH + (cg ^ (d % OCH))] = row[c];
  }
  __syncthreads();
  int8_t* vt_out = x.out + (size_t)bh * D * x.N_pad + (size_t)n0;
#pragma unroll
  for (int i = threadIdx.x; i < D * OCH; i += kThreads) {
    const int r = i / OCH, c = i % OCH;
    *reinterpret_cast<uint4*>(vt_out + (size_t)r * x.N_pad + c * 16) = vt_tile[r * OCH + (c ^ (r % OCH))];
  }
}

// grid (2 * kv_tiles + q_tiles): K and V tiles alternate (V's divisions overlap K's memory traffic), then Q.
// V_HADAMARD: V rotated (quantize_v_tile).
template <typename T, int D, bool V_HADAMARD>
__global__ void __launch_bounds__(kThreads, 4) quantize_kernel(const __grid_constant__ Int8Fp8PreParams p) {
  __shared__ __align__(16) unsigned char smem[kTileRows * D * sizeof(T)];
  __shared__ float s_mean[D];
  __shared__ float s_slot[RowTile<D>::RPP + 4];
  const int kv_tiles = p.k.B * p.k.H * (p.k.N_pad / kTileRows);
  const int idx = blockIdx.x;
  if (idx < 2 * kv_tiles) {
    if (idx & 1)
      quantize_v_tile<T, D, V_HADAMARD>(p.v, p.v_mean, p.v_amax_bits, p.v_scale, idx >> 1, smem);
    else
      quantize_k_tile<T, D>(p.k, p.k_sum, idx >> 1, smem, s_mean, s_slot);
  } else {
    quantize_q_tile<T, D>(p.q, idx - 2 * kv_tiles);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// RoPE·R inside the pre-processing. A CTA owns ROWS tokens of one batch row and keeps their coefficients in
// registers while it walks the heads, U at a time, as generalized_rope_kernel (rope_table.cu) does; each rotated
// value is rounded to T exactly as that kernel stores it, so what follows sees the RoPE·R pass's bits.

constexpr int kRopeHeadsPerStep = 4;

template <int D>
struct RopeRows {
  static constexpr int TPR = D / 8;              // threads per token row
  static constexpr int ROWS = kThreads / TPR;    // tokens per chunk
  static constexpr int U = kRopeHeadsPerStep;
};

// Q: RoPE·R (HADAMARD: then the Walsh-Hadamard transform on the rounded row, as generalized_rope_kernel), then INT8
// per token exactly as quantize_q_tile (rows Nq .. nq_pad - 1 zero with scale 0). grid (nq_pad / ROWS, B).
template <typename T, int D, bool HADAMARD>
__global__ void __launch_bounds__(kThreads) rope_q_kernel(const __grid_constant__ RopePreParams p) {
  using RR = RopeRows<D>;
  __shared__ __align__(16) uint4 stage[RR::U * RR::ROWS * RR::TPR];
  const RopeTableParams& x = p.q;
  const int b = blockIdx.y;
  const int r = threadIdx.x / RR::TPR, c8 = threadIdx.x % RR::TPR;
  const int n = blockIdx.x * RR::ROWS + r;
  const bool valid = n < x.N;
  float cf[8][4];
  int partner[8];
  roperows::load_coefs<D>(x.coef, x.index, n, valid, c8, cf, partner);
  const char* xb = static_cast<const char*>(x.x) + 2 * ((size_t)b * x.sxb + (size_t)n * x.sxn + c8 * 8);
  const uint32_t* staged = reinterpret_cast<const uint32_t*>(stage + r * RR::TPR);  // row r of head u = 0
  for (int h0 = 0; h0 < x.H; h0 += RR::U) {
    uint4 own[RR::U];
    roperows::load_and_stage<D, RR::U, RR::ROWS>(xb, x.sxh, x.H, valid, r, c8, h0, own, stage);
#pragma unroll
    for (int u = 0; u < RR::U; ++u) {
      const int h = h0 + u;
      if (h >= x.H) continue;  // (the same for the whole CTA: the shuffles below see every lane)
      float y[8];
      roperows::rotate8<T>(own[u], staged + (size_t)u * RR::ROWS * (D / 2), cf, partner, y);
#pragma unroll
      for (int j = 0; j < 8; ++j) y[j] = valid ? roperows::round_to<T>(y[j]) : 0.f;
      if (HADAMARD) {
        roperows::fwht8<D>(y);
#pragma unroll
        for (int j = 0; j < 8; ++j) y[j] = roperows::round_to<T>(y[j]);
      }
      float amax = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(y[j]));
      amax = row_max<RR::TPR>(amax);
      uint2 bytes = make_uint2(0u, 0u);
      float scale = 0.f;
      if (amax != 0.f) {
        const float inv = __fdiv_rn(127.0f, amax);
        bytes = pack_int8x8([&](int j) { return int8_rn_clamped(y[j], inv); });
        scale = __fdiv_rn(amax, 127.0f);
      }
      const size_t row = ((size_t)b * x.H + h) * p.nq_pad + n;
      *reinterpret_cast<uint2*>(p.q_out + row * D + c8 * 8) = bytes;
      if (c8 == 0) p.q_scale[row] = scale;
    }
  }
}

template <typename T, int D>
cudaError_t rope_typed(const RopePreParams& p, cudaStream_t stream) {
  using RR = RopeRows<D>;
  if (p.q.D != D || p.nq_pad % RR::ROWS != 0) return cudaErrorInvalidValue;
  if (p.q.B > 0 && p.q.H > 0 && p.nq_pad > 0) {
    const dim3 grid((unsigned)(p.nq_pad / RR::ROWS), (unsigned)p.q.B);
    if (p.q.hadamard)
      rope_q_kernel<T, D, true><<<grid, kThreads, 0, stream>>>(p);
    else
      rope_q_kernel<T, D, false><<<grid, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t rope_type(const RopePreParams& p, cudaStream_t stream) {
  if (p.q.D == 64) return rope_typed<T, 64>(p, stream);
  if (p.q.D == 128) return rope_typed<T, 128>(p, stream);
  return cudaErrorInvalidValue;
}

int stats_ctas_per_bh(int n) { return n > 0 ? (n + kStatsTokens - 1) / kStatsTokens : 1; }

template <typename T, int D>
cudaError_t stats_typed(const Int8Fp8PreParams& p, bool v_hadamard, cudaStream_t stream) {
  auto launch = [&](const ColStatsParams& sp) {
    long long ctas = 0;
    for (const ColStatsTask& t : sp.task) ctas += (long long)t.ctas_per_bh * t.x.B * t.x.H;
    if (ctas > 0) {
      if (v_hadamard)
        col_stats_kernel<T, D, true><<<(unsigned)ctas, kThreads, 0, stream>>>(sp);
      else
        col_stats_kernel<T, D, false><<<(unsigned)ctas, kThreads, 0, stream>>>(sp);
    }
    return cudaGetLastError();
  };
  ColStatsParams sp{};
  // launch 1: K sums (smooth_k), and V's max |v| (no V smoothing) or V's sums (V smoothed)
  sp.task[0].x = p.k;
  sp.task[0].sum = p.k_sum;
  sp.task[0].ctas_per_bh = p.k_sum != nullptr ? stats_ctas_per_bh(p.k.N) : 0;
  sp.task[1].x = p.v;
  sp.task[1].ctas_per_bh = stats_ctas_per_bh(p.v.N);
  if (p.v_sum != nullptr)
    sp.task[1].sum = p.v_sum;
  else
    sp.task[1].amax_bits = p.v_amax_bits;
  cudaError_t err = launch(sp);
  if (err != cudaSuccess || p.v_sum == nullptr) return err;
  // launch 2 (V smoothed): max |v - mean| with mean = float32(v_sum / len), and v_mean written out (V as task[1],
  // task[0] empty: the task V_HADAMARD rotates)
  ColStatsParams sv{};
  sv.task[1].x = p.v;
  sv.task[1].amax_bits = p.v_amax_bits;
  sv.task[1].mean_sum = p.v_sum;
  sv.task[1].mean_out = p.v_mean;
  sv.task[1].ctas_per_bh = stats_ctas_per_bh(p.v.N);
  return launch(sv);
}

template <typename T, int D>
cudaError_t quantize_typed(const Int8Fp8PreParams& p, bool v_hadamard, cudaStream_t stream) {
  if (p.q.N_pad % kTileRows != 0 || p.k.N_pad % kTileRows != 0 || p.v.N_pad != p.k.N_pad)
    return cudaErrorInvalidValue;
  const long long kv_tiles = (long long)p.k.B * p.k.H * (p.k.N_pad / kTileRows);
  const long long q_tiles = (long long)p.q.B * p.q.H * (p.q.N_pad / kTileRows);
  const long long ctas = 2 * kv_tiles + (p.q_done ? 0 : q_tiles);
  if (ctas > 0) {
    if (v_hadamard)
      quantize_kernel<T, D, true><<<(unsigned)ctas, kThreads, 0, stream>>>(p);
    else
      quantize_kernel<T, D, false><<<(unsigned)ctas, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t stats_type(const Int8Fp8PreParams& p, bool v_hadamard, cudaStream_t stream) {
  if (p.k.D == 64) return stats_typed<T, 64>(p, v_hadamard, stream);
  if (p.k.D == 128) return stats_typed<T, 128>(p, v_hadamard, stream);
  return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t quantize_type(const Int8Fp8PreParams& p, bool v_hadamard, cudaStream_t stream) {
  if (p.k.D == 64) return quantize_typed<T, 64>(p, v_hadamard, stream);
  if (p.k.D == 128) return quantize_typed<T, 128>(p, v_hadamard, stream);
  return cudaErrorInvalidValue;
}

}  // namespace pre8

cudaError_t launch_int8fp8_stats(const Int8Fp8PreParams& p, bool v_hadamard, cudaStream_t stream) {
  return p.k.is_bf16 ? pre8::stats_type<__nv_bfloat16>(p, v_hadamard, stream)
                     : pre8::stats_type<__half>(p, v_hadamard, stream);
}

cudaError_t launch_int8fp8_rope(const RopePreParams& p, cudaStream_t stream) {
  return p.q.is_bf16 ? pre8::rope_type<__nv_bfloat16>(p, stream) : pre8::rope_type<__half>(p, stream);
}

cudaError_t launch_int8fp8_quantize(const Int8Fp8PreParams& p, bool v_hadamard, cudaStream_t stream) {
  return p.k.is_bf16 ? pre8::quantize_type<__nv_bfloat16>(p, v_hadamard, stream)
                     : pre8::quantize_type<__half>(p, v_hadamard, stream);
}

}  // namespace rotvid
