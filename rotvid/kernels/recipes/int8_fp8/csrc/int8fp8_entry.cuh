// The int8-fp8 recipe's entry points, what its binding (binding_int8fp8.cpp) calls: the pre-processing
// (preprocess_int8fp8.cu, RoPE·R inside it included) and the attention launchers (attn_hopper_int8fp8.cu: the Hopper
// kernel; attn_int8fp8_mma.cu: the mma.sync kernel). The parameter structs: csrc/common/attention_params.cuh.
#pragma once
#include <cuda_runtime.h>

#include "common/attention_params.cuh"

namespace rotvid {

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
// operands are those of V' = rotate_v_online(v, D); the attention launch with AttnParams.o_hadamard turns its output
// back in the epilogue.
cudaError_t launch_int8fp8_stats(const Int8Fp8PreParams& p, bool v_hadamard, cudaStream_t stream);
cudaError_t launch_int8fp8_quantize(const Int8Fp8PreParams& p, bool v_hadamard, cudaStream_t stream);
// Attention on those operands: AttnParams with k_scale = the K group scales [BH, Nkv_pad / 128, 4], vt = V8^T
// bytes, vparams = v_scale [BH, D], block_n 128. Every launcher (wgmma and mma.sync, INT4 ones too) runs the
// block-sparse kernel when p.map_count is set (AttnParams.map_*).
cudaError_t launch_int8fp8_attention_wgmma(const AttnParams& p, int head_dim, cudaStream_t stream);
// The same numerics on mma.sync (s8 for Q^K^T, e4m3 for P.V; mma_numerics_int8fp8.cuh), same operands;
// cudaErrorNotSupported where the build has no e4m3 mma.sync (below sm89).
cudaError_t launch_int8fp8_attention_mma(const AttnParams& p, int head_dim, cudaStream_t stream);

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

}  // namespace rotvid
