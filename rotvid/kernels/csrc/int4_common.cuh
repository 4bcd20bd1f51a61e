// Shared definitions of rotvid's INT4 attention kernels (no torch headers: nvcc-only).
//
// Kernel-side layouts ("kernel layout", produced by preprocess_int4.cu or packed from the
// reference's quantized tensors by rotvid/kernels/cuda_backend.py). BH = batch*heads, rows
// padded with zeros: Nq_pad = ceil(Nq / BM) * BM, Nkv_pad = ceil(Nkv / BN) * BN.
//   q      int8 [BH, Nq_pad, DB]   DB = D (s8 path) or D/2 (s4 path: two values per byte,
//                                  element 2c in the low nibble of byte c)
//   k      int8 [BH, Nkv_pad, DB]
//   vt     int8 [BH, D, VROW]      V-hat transposed (K-major for the tensor cores);
//                                  VROW = Nkv_pad (s8) or Nkv_pad/2 (s4); within each chunk of
//                                  CHK = 32 (s8) or 64 (s4) key positions the keys are permuted
//                                  by vt_key_of_position() so that the P fragment produced by
//                                  the QK^T accumulator feeds the P.V mma without shuffles
//   q_scale, k_scale  fp32 [BH, Nq_pad], [BH, Nkv_pad]   (zero on padded rows)
//   vparams fp32 [BH, Nkv_pad/BN, D, 2]: (v_scale (O and l are kept in units of P^, so the P levels'
//                                  1/15 or 1/7 cancels), bits of int32 (MAGIC_I + 8*colsum) or MAGIC_I)
//   v_mean fp32 [BH, D] (optional, added to the output)
#pragma once
#include <cstdint>
#include <cuda_runtime.h>

namespace rotvid {

// 1.5 * 2^23: float(MAGIC_I + n) == MAGIC_F + n exactly for |n| < 2^22.
constexpr int kMagicI = 0x4B400000;
constexpr float kMagicF = 12582912.0f;

// Padding granularity of the query rows (a multiple of every CTA's 16 * warps rows).
constexpr int kBlockM = 128;

enum PMode : int { kPRange = 0, kPSym = 1 };

struct AttnParams {
  const int8_t* q;
  const int8_t* k;
  const int8_t* vt;
  const float* q_scale;
  const float* k_scale;
  const float* vparams;
  const int* kv_lens;   // [B] int32 or nullptr
  const float* v_mean;  // [BH, D] or nullptr
  const float* k_bias;  // [BH, Nkv_pad] Q smoothing's ΔS in the log2 domain (qk_scale mean(q).k_s), or nullptr
  void* out;            // [B, H, Nq, D] addressed through the strides below (elements)
  long long out_sb, out_sh, out_sn;
  int B, H, Nq, Nq_pad, Nkv, Nkv_pad;
  float qk_scale;       // float32(sm_scale * log2(e))
  int out_bf16;         // 0: fp16 out, 1: bf16 out
  // wgmma kernel only -- the last, partial wave of query tiles split over the keys: tiles >= split_from run as
  // `splits` CTAs each (a share of the key blocks), which write (O, m, l) partials to ws for a combine kernel.
  int split_from;       // number of tiles run whole (= all tiles when splits == 1)
  int splits;           // 1: no split
  float* ws;            // [(tiles - split_from) * splits, kBlockM, D + 2] fp32 partials, or nullptr
  // Block-sparse attention (the sparse instantiations of the Hopper and mma.sync kernels; map_count nullptr: every
  // key block): query tile mb (128 rows) of (b, h) visits the key blocks of 128 keys listed in
  // map_index[r * map_kmax ..] (ascending in a valid map), with r = b * map_sb + h * map_sh + mb and map_count[r] of
  // them (rotvid/kernels/sparsity/block_map.py); a CTA of fewer rows reads the row of the tile that holds them. The
  // values are not trusted: counts clamped to [0, map_kmax], entries outside the map or past kv_len skipped
  // (MapKeyBlocks, key_blocks.cuh).
  // (These fields end the struct within the 192 bytes before the kernel's 64-byte-aligned tensor-map parameters,
  // so the dense kernels' parameter offsets, and their code, stay as they were: benchmarks/kernel_ptx_diff.py.)
  const int* map_index; // [B', H', Tq, Kmax] int32 (B' in {1, B}, H' in {1, H}, Tq = Nq_pad / 128), or nullptr
  const int* map_count; // [B', H', Tq] int32, or nullptr
  int map_sb, map_sh;   // rows of the map per batch / per head (0: one map row for every batch / head)
  int map_kmax;         // Kmax
  // The log-sum-exp of each row (ring attention merges partial results by it): [B, H, Nq] fp32, natural log, of the
  // scores the kernel computed (rotvid/kernels/reference.py: ln 2 (m + log2(l / L))), written only when set, by
  // the numerics that return it (N::RETURNS_LSE: the int8-fp8 Hopper kernel, launched as its LSE instantiation;
  // set for another numerics: cudaErrorInvalidValue); nullptr: the kernels as they were. (The last 8 bytes before
  // the tensor maps: sizeof(AttnParams) is 192 with it.)
  float* lse;
};
static_assert(sizeof(AttnParams) <= 192, "AttnParams: the Hopper kernel's tensor maps follow at offset 192");

// Key offset (inside its chunk of CHK positions) stored at position p of the V^T layout.
__host__ __device__ constexpr int vt_key_of_position(int p, int chk) {
  return (p - p % chk) + ((p % chk) / (chk / 2)) * (chk / 2) + 8 * (((p % (chk / 2)) % (chk / 8)) >> 1) +
         2 * ((p % (chk / 2)) / (chk / 8)) + (((p % (chk / 2)) % (chk / 8)) & 1);
}

// Launchers (return cudaError_t of the launch).
cudaError_t launch_int4_attention(const AttnParams& p, int head_dim, int block_n, bool s4, int p_mode,
                                  cudaStream_t stream);
// Hopper kernel (wgmma, TMA; block_n 64 or 128, s8 layout); cudaErrorNotSupported off sm90 or without the
// driver's tensor-map entry point.
cudaError_t launch_int4_attention_wgmma(const AttnParams& p, int head_dim, int block_n, int p_mode,
                                        cudaStream_t stream);
bool wgmma_kernel_available();
// The wgmma kernel's tail split for these sizes on `num_sms` SMs: returns the number of splits (1: none) and sets
// *split_from; ws needs wgmma_split_ws_floats(...) floats.
int wgmma_split_plan(int B, int H, int Nq_pad, int Nkv, int block_n, int num_sms, int* split_from);
long long wgmma_split_ws_floats(int B, int H, int Nq_pad, int head_dim, int split_from, int splits);

struct PreprocessParams {
  const void* x;          // fp16 / bf16 input, [B, H, N, D] through strides (elements)
  long long sb, sh, sn;
  int B, H, N, N_pad, D;
  const int* kv_lens;     // [B] or nullptr (for K/V; Q passes nullptr)
  const float* mean;      // [BH, D] the smoothing mean (launch_token_means_f64), or nullptr
  int8_t* out;            // row quant: [BH, N_pad, DB]; V: [BH, D, VROW]
  float* scale;           // row quant: [BH, N_pad]; V: vparams [BH, nblk, D, 2]
  int is_bf16;
  // K rows with Q smoothing (INT4 recipes): bias[bh, n] = qk_scale * (q_mean . k_s[n]) for every row n < N_pad
  // (0 on the padding rows), k_s the smoothed row the quantizer sees; both nullptr otherwise.
  const float* q_mean;    // [BH, D] (launch_token_means_f64 over all query rows)
  float* bias;            // [BH, N_pad]
  float qk_scale;
};

// The smoothing means of up to three tensors (same B, H, D and dtype) in one launch: task t writes mean[bh, d] =
// float32(sum_f64 / len) over the valid tokens of x (len = min(kv_lens[b], N), or N where x.kv_lens is nullptr);
// its sum [BH, D] float64 and done [BH] uint32 counters zero on entry.
struct TokenMeanTask {
  PreprocessParams x;
  double* sum;
  unsigned int* done;
  float* mean;            // [BH, D]
};
struct TokenMeanParams {
  TokenMeanTask task[3];
  int tasks;              // task[0 .. tasks - 1]
};
cudaError_t launch_token_means_f64(const TokenMeanParams& p, cudaStream_t stream);
// The rows of Q and of K (same B, H, D and dtype) in one launch; a tensor with N_pad = 0 has none.
cudaError_t launch_quant_rows_int4(const PreprocessParams& q, const PreprocessParams& k, bool s4, cudaStream_t stream);
// V^T bytes: two's complement (the s8 mma.sync kernel), two values per byte (s4), or sign-magnitude |v| | sign << 7
// (the Hopper kernel, whose P.V reads them as the e4m3 values v 2^-9)
enum VFormat { kVTwosComplement = 0, kVNibbles = 1, kVSignMagnitude = 2 };
cudaError_t launch_quant_v_int4(const PreprocessParams& p, int block_n, int v_format, int p_mode, cudaStream_t stream);

// The int8-fp8 pre-processing (preprocess_int8fp8.cu; sm89 / sm90 kernels share its operands), equal to the reference
// quantizers byte for byte: launch_int8fp8_stats (one launch over K and V; a second one when V is smoothed) after ONE
// zeroing of the work words, then launch_int8fp8_quantize (one launch over the Q, K and V tiles of 128 rows).
struct Int8Fp8PreParams {
  PreprocessParams q;          // q.out = q_hat [BH, Nq_pad, D], q.scale = q_scale [BH, Nq_pad]; Nq_pad % 128 == 0
  PreprocessParams k;          // k.out = k_hat [BH, Nkv_pad, D], k.scale = group scales [BH, Nkv_pad / 128, 4]
  PreprocessParams v;          // v.out = V8^T [BH, D, Nkv_pad]; k.kv_lens == v.kv_lens, k.N_pad == v.N_pad
  double* k_sum;               // [BH, D] zeroed float64 (K smoothed: mean = float32(k_sum / len)) or nullptr
  double* v_sum;               // [BH, D] zeroed float64 (V smoothed) or nullptr
  unsigned int* v_amax_bits;   // [BH, D] zeroed
  float* v_mean;               // [BH, D] written when V is smoothed (v_sum), else nullptr
  float* v_scale;              // [BH, D] = amax / 448, 1 where amax is 0
  int q_done;                  // Q^ and its scales already written (launch_int8fp8_rope): no Q tiles
};
// v_hadamard (both launches alike, head_dim 64 or 128): V's rows rotated after their load by the online V/O
// Hadamard's V side (roperows::vo_hadamard8 with kVoScaleV: rotvid.rope.hadamard.rotate_v_online's bits), so that the
// operands are those of V' = rotate_v_online(v, D) and the attention output is O' (hadamard_rows undoes it).
cudaError_t launch_int8fp8_stats(const Int8Fp8PreParams& p, bool v_hadamard, cudaStream_t stream);
cudaError_t launch_int8fp8_quantize(const Int8Fp8PreParams& p, bool v_hadamard, cudaStream_t stream);
// Attention on those operands: AttnParams with k_scale = the K group scales [BH, Nkv_pad / 128, 4], vt = V8^T
// bytes, vparams = v_scale [BH, D], block_n 128. Every launcher (wgmma and mma.sync, INT4 ones too) runs the
// block-sparse kernel when p.map_count is set (AttnParams.map_*).
cudaError_t launch_int8fp8_attention_wgmma(const AttnParams& p, int head_dim, cudaStream_t stream);
// The same numerics on mma.sync (s8 for Q^K^T, e4m3 for P.V; mma_numerics_int8fp8.cuh), same operands;
// cudaErrorNotSupported where the build has no e4m3 mma.sync (below sm89).
cudaError_t launch_int8fp8_attention_mma(const AttnParams& p, int head_dim, cudaStream_t stream);

// RoPE·R by the generalized table shared by the heads (rope_table.cu): x, out [B, H, N, D] (strides in elements,
// unit stride on D, 16-byte aligned rows), coef float32 [N, D, 4], index int32 [D, 4]; D 64 or 128. hadamard: then
// the normalized Walsh-Hadamard transform over D (the full rotation; roperows::fwht8).
struct RopeTableParams {
  const void* x;
  void* out;
  const float* coef;
  const int* index;
  long long sxb, sxh, sxn, sob, soh, son;
  int B, H, N, D;
  int is_bf16;
  int hadamard;
};
cudaError_t launch_generalized_rope(const RopeTableParams& p, cudaStream_t stream);

// RoPE·R inside the int8-fp8 pre-processing (preprocess_int8fp8.cu): Q rotated and quantized in one pass (INT8 per
// token, Q^ and q_scale as the quantize launch writes them, padding rows zero), the same bits as
// launch_generalized_rope followed by the pre-processing. Before launch_int8fp8_stats / _quantize with q_done set
// (K goes through launch_generalized_rope into a scratch tensor that Int8Fp8PreParams.k reads).
struct RopePreParams {
  RopeTableParams q;   // q.x = Q [B, H, Nq, D] through strides, q.coef / q.index the table; q.out unused
  int8_t* q_out;       // [BH, nq_pad, D]
  float* q_scale;      // [BH, nq_pad]
  int nq_pad;
};
cudaError_t launch_int8fp8_rope(const RopePreParams& p, cudaStream_t stream);

// One side of the online V/O Hadamard over the rows of a tensor (hadamard_rows.cu): out row r = T(wht(x row r) *
// scale) for the `rows` rows of D contiguous fp16 / bf16 values (roperows::wht8's butterflies, one rounding; scale an
// exact power of two: kVoScaleO undoes the int8-fp8 pre-processing's V rotation), one read and one write of each row.
// x and out 16-byte aligned, rows back to back (a dense tensor with unit stride on D, any order of its other dims);
// out == x allowed (each row is read before it is written, by the same threads). D 64 or 128.
struct HadamardRowsParams {
  const void* x;
  void* out;
  long long rows;
  float scale;
  int D;
  int is_bf16;
};
cudaError_t launch_hadamard_rows(const HadamardRowsParams& p, cudaStream_t stream);

}  // namespace rotvid
