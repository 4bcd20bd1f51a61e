// The INT4 recipes' entry points (int4, int4-sym-p), what their binding (binding_int4.cpp) calls: the attention
// launchers (attn_dispatch.cu: the mma.sync kernel; attn_hopper_int4.cu: the Hopper kernel) and the pre-processing
// (preprocess_int4.cu). The parameter structs and the kernel layout: csrc/common/attention_params.cuh.
#pragma once
#include <cuda_runtime.h>

#include "common/attention_params.cuh"

namespace rotvid {

enum PMode : int { kPRange = 0, kPSym = 1 };

// Launchers (return cudaError_t of the launch).
cudaError_t launch_int4_attention(const AttnParams& p, int head_dim, int block_n, bool s4, int p_mode,
                                  cudaStream_t stream);
// Hopper kernel (wgmma, TMA; block_n 64 or 128, s8 layout); cudaErrorNotSupported off sm90 or without the
// driver's tensor-map entry point.
cudaError_t launch_int4_attention_wgmma(const AttnParams& p, int head_dim, int block_n, int p_mode,
                                        cudaStream_t stream);

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

}  // namespace rotvid
