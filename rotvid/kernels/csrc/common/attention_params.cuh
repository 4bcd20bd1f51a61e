// The parameter structs of rotvid's kernels and the host functions the recipes share (no torch headers: nvcc-only):
// AttnParams, what every attention kernel reads (the Hopper and mma.sync skeletons, csrc/hopper/ and csrc/mma/);
// PreprocessParams, one tensor of a pre-processing; the Hopper kernel's host functions (hopper/attn_hopper.cu); the
// RoPE·R pass (rope_table.cu) and the online V/O Hadamard pass (hadamard_rows.cu). Each recipe declares its own entry
// points in its folder (rotvid/kernels/recipes/<name>/csrc/*_entry.cuh).
//
// Kernel-side layouts ("kernel layout", the INT4 recipes' as written here, produced by their pre-processing or packed
// from the reference's quantized tensors by rotvid/kernels/recipes/int4/ops.py; the int8-fp8 recipe's differences:
// recipes/int8_fp8/csrc/int8fp8_entry.cuh). BH = batch*heads, rows padded with zeros: Nq_pad = ceil(Nq / BM) * BM,
// Nkv_pad = ceil(Nkv / BN) * BN.
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
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>

namespace rotvid {

// 1.5 * 2^23: float(MAGIC_I + n) == MAGIC_F + n exactly for |n| < 2^22.
constexpr int kMagicI = 0x4B400000;
constexpr float kMagicF = 12582912.0f;

// Padding granularity of the query rows (a multiple of every CTA's 16 * warps rows).
constexpr int kBlockM = 128;

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
  // The online V/O Hadamard's inverse on the output (the int8-fp8 kernels, V rotated by their pre-processing): 1 =
  // each output row leaves as T(wht(y) * 2^-3) -- y the row in float32 (O / l * v_scale + v_mean), wht the
  // butterflies of rotvid.rope.hadamard.fwht over the D columns, one rounding -- by the epilogue
  // (rowmath::store_rows_channel_scaled_unrotated, the Int8Fp8VoNumerics kernels) or the split combine; 0: the
  // kernels as they were. (In the 4 bytes of padding before lse: no offset moves.)
  int o_hadamard;
  // The log-sum-exp of each row (ring attention merges partial results by it): [B, H, Nq] fp32, natural log, of the
  // scores the kernel computed (rotvid/kernels/reference.py: ln 2 (m + log2(l / L))), written only when set, by
  // the numerics that return it (N::RETURNS_LSE: the int8-fp8 Hopper kernel, launched as its LSE instantiation;
  // set for another numerics: cudaErrorInvalidValue); nullptr: the kernels as they were. (The last 8 bytes before
  // the tensor maps: sizeof(AttnParams) is 192 with it.)
  float* lse;
};
static_assert(sizeof(AttnParams) <= 192, "AttnParams: the Hopper kernel's tensor maps follow at offset 192");
static_assert(offsetof(AttnParams, lse) == 184, "AttnParams: o_hadamard fills the padding before lse");

// Key offset (inside its chunk of CHK positions) stored at position p of the V^T layout.
__host__ __device__ constexpr int vt_key_of_position(int p, int chk) {
  return (p - p % chk) + ((p % chk) / (chk / 2)) * (chk / 2) + 8 * (((p % (chk / 2)) % (chk / 8)) >> 1) +
         2 * ((p % (chk / 2)) / (chk / 8)) + (((p % (chk / 2)) % (chk / 8)) & 1);
}

// The Hopper attention kernel's host functions (hopper/attn_hopper.cu): whether it can run on the current device
// (sm90 and the driver's tensor-map entry point), and its tail split.
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
