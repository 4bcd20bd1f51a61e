// The int8-fp8 recipe's binding: preprocess_int8fp8 and attention_int8fp8 on the extension module, called by
// rotvid/kernels/recipes/int8_fp8/ops.py (custom ops rotvid::int8fp8_preprocess, rotvid::int8fp8_attention and
// rotvid::int8fp8_attention_lse).
#include "common/binding.h"
#include "int8fp8_entry.cuh"

namespace {

using namespace rotvid::ext;

// The int8-fp8 recipe (sm89 / sm90): INT8 Q per token, INT8 K per group of 32 keys per 128-key block (K smoothed by its
// token mean when asked), per-channel FP8 e4m3 V over the valid tokens (V smoothed when asked). Returns {q_hat,
// q_scale, k_hat, k_scale [B,H,Nkv_pad/128,4], vt (e4m3 bytes as int8, [B,H,D,Nkv_pad]), v_scale fp32 [B,H,D],
// v_mean}; Nkv_pad a multiple of 128.
// With rope_coef / rope_index (the generalized RoPE table shared by the heads, float32 [N, D, 4] and int32 [D, 4], Nq ==
// Nkv == N): Q and K are RoPE·R-rotated here, with the bits of generalized_rope followed by this function -- Q
// rotated and quantized in one pass, K by generalized_rope into a scratch tensor the statistics and quantize read.
// rope_hadamard: the table is the full rotation's (then the Walsh-Hadamard transform, as generalized_rope's).
// v_hadamard: V's side of the online V/O Hadamard applied to V's rows as they are read (the operands of
// rotvid.rope.hadamard.rotate_v_online(v, D), bit for bit; attention_int8fp8 with o_hadamard then turns the output
// back in its epilogue).
std::vector<at::Tensor> preprocess_int8fp8(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const c10::optional<at::Tensor>& kv_lens, bool bnhd, bool smooth_k,
                                           bool smooth_v, const c10::optional<at::Tensor>& rope_coef,
                                           const c10::optional<at::Tensor>& rope_index, bool rope_hadamard,
                                           bool v_hadamard) {
  const QKVDims d = checked_qkv_dims(q, k, v, kv_lens, bnhd);  // (before the guard: CUDA inputs checked first)
  const Dims &dq = d.q, &dk = d.k, &dv = d.v;
  const c10::cuda::CUDAGuard guard(q.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t D = dq.D;
  const int64_t nq_pad = round_up(dq.N, rotvid::kBlockM), nkv_pad = round_up(dk.N, 128);
  auto i8 = q.options().dtype(at::kChar);
  auto f32 = q.options().dtype(at::kFloat);
  auto q_hat = at::empty({dq.B, dq.H, nq_pad, D}, i8);
  auto q_scale = at::empty({dq.B, dq.H, nq_pad}, f32);
  auto k_hat = at::empty({dk.B, dk.H, nkv_pad, D}, i8);
  auto k_scale = at::empty({dk.B, dk.H, nkv_pad / 128, 4}, f32);  // per group of 32 keys per block
  auto vt = at::empty({dv.B, dv.H, D, nkv_pad}, i8);
  auto v_scale = at::empty({dv.B, dv.H, D}, f32);
  const int* lens = kv_lens.has_value() ? kv_lens->data_ptr<int>() : nullptr;
  at::Tensor v_mean = at::empty({0}, f32);
  // ONE zeroed work space {K sums f64 [BH*D], V sums f64 [BH*D] (smooth_v only), V amax bits u32
  // [BH*D]}, the statistics launch over K and V (a second one for V's centred max when smooth_v), then one
  // quantize launch over the Q, K and V tiles.
  const int64_t bhd = dk.B * dk.H * D;
  auto work = at::zeros({bhd * (smooth_v ? 2 : 1) + (bhd + 1) / 2}, q.options().dtype(at::kDouble));
  double* w = work.data_ptr<double>();
  rotvid::Int8Fp8PreParams p{};
  p.q = pre_params(q, dq, nq_pad);
  p.q.out = q_hat.data_ptr<int8_t>();
  p.q.scale = q_scale.data_ptr<float>();
  p.k = pre_params(k, dk, nkv_pad);
  p.k.kv_lens = lens;
  p.k.out = k_hat.data_ptr<int8_t>();
  p.k.scale = k_scale.data_ptr<float>();
  p.v = pre_params(v, dv, nkv_pad);
  p.v.kv_lens = lens;
  p.v.out = vt.data_ptr<int8_t>();
  p.k_sum = smooth_k ? w : nullptr;
  p.v_sum = smooth_v ? w + bhd : nullptr;
  p.v_amax_bits = reinterpret_cast<unsigned int*>(w + bhd * (smooth_v ? 2 : 1));
  if (smooth_v) {
    v_mean = at::empty({dv.B, dv.H, D}, f32);
    p.v_mean = v_mean.data_ptr<float>();
  }
  p.v_scale = v_scale.data_ptr<float>();
  at::Tensor k_rot;
  if (rope_coef.has_value() || rope_index.has_value()) {
    TORCH_CHECK(rope_coef.has_value() && rope_index.has_value(), "rope_coef and rope_index go together");
    const at::Tensor &coef = *rope_coef, &index = *rope_index;
    TORCH_CHECK(D == 64 || D == 128, "RoPE·R in the pre-processing: head_dim 64 or 128");
    TORCH_CHECK(dq.N == dk.N, "RoPE·R in the pre-processing: as many queries as keys (self-attention)");
    TORCH_CHECK(coef.is_cuda() && coef.scalar_type() == at::kFloat && coef.is_contiguous() &&
                    coef.sizes() == at::IntArrayRef({dq.N, D, 4}), "rope_coef: contiguous float32 CUDA [N, D, 4]");
    TORCH_CHECK(index.is_cuda() && index.scalar_type() == at::kInt && index.is_contiguous() &&
                    index.sizes() == at::IntArrayRef({D, 4}), "rope_index: contiguous int32 CUDA [D, 4]");
    for (const at::Tensor* x : {&q, &k})
      TORCH_CHECK(x->stride(0) % 8 == 0 && x->stride(1) % 8 == 0 && x->stride(2) % 8 == 0 &&
                      reinterpret_cast<uintptr_t>(x->data_ptr()) % 16 == 0,
                  "q, k: 16-byte aligned rows for RoPE·R in the pre-processing");
    k_rot = at::empty({dk.B, dk.H, dk.N, D}, k.options());
    rotvid::RopePreParams r{};
    r.q = rope_params(q, dq, coef, index, nullptr, rope_hadamard);
    r.q_out = q_hat.data_ptr<int8_t>();
    r.q_scale = q_scale.data_ptr<float>();
    r.nq_pad = (int)nq_pad;
    check_cuda(rotvid::launch_int8fp8_rope(r, stream), "int8fp8_rope");
    const rotvid::RopeTableParams rk = rope_params(k, dk, coef, index, &k_rot, rope_hadamard);
    check_cuda(rotvid::launch_generalized_rope(rk, stream), "generalized_rope");
    p.k = pre_params(k_rot, Dims{dk.B, dk.H, dk.N, D, k_rot.stride(0), k_rot.stride(1), k_rot.stride(2)}, nkv_pad);
    p.k.kv_lens = lens;
    p.k.out = k_hat.data_ptr<int8_t>();
    p.k.scale = k_scale.data_ptr<float>();
    p.q_done = 1;
  }
  check_cuda(rotvid::launch_int8fp8_stats(p, v_hadamard, stream), "int8fp8_stats");
  check_cuda(rotvid::launch_int8fp8_quantize(p, v_hadamard, stream), "int8fp8_quantize");
  return {q_hat, q_scale, k_hat, k_scale, vt, v_scale, v_mean};
}

at::Tensor attention_int8fp8(const at::Tensor& q_hat, const at::Tensor& q_scale, const at::Tensor& k_hat,
                             const at::Tensor& k_scale, const at::Tensor& vt, const at::Tensor& v_scale,
                             const at::Tensor& v_mean, const c10::optional<at::Tensor>& kv_lens, int64_t n_q,
                             int64_t n_kv, int64_t head_dim, double qk_scale, bool out_bf16, bool bnhd,
                             const c10::optional<at::Tensor>& out_opt, bool mma, bool split_tail,
                             const c10::optional<at::Tensor>& map_index, const c10::optional<at::Tensor>& map_count,
                             const c10::optional<at::Tensor>& lse_opt, bool o_hadamard) {
  TORCH_CHECK(q_hat.is_cuda() && q_hat.dim() == 4 && q_hat.scalar_type() == at::kChar, "q_hat: int8 CUDA [B,H,Nq_pad,D]");
  TORCH_CHECK(head_dim == 64 || head_dim == 128, "head_dim: 64 or 128");
  const c10::cuda::CUDAGuard guard(q_hat.device());
  const int64_t B = q_hat.size(0), H = q_hat.size(1), D = head_dim;
  const int64_t nq_pad = round_up(n_q, rotvid::kBlockM), nkv_pad = round_up(n_kv, 128);
  TORCH_CHECK(q_hat.sizes() == at::IntArrayRef({B, H, nq_pad, D}) && q_hat.is_contiguous(), "q_hat: shape/layout");
  TORCH_CHECK(q_scale.sizes() == at::IntArrayRef({B, H, nq_pad}) && q_scale.is_contiguous() &&
                  q_scale.scalar_type() == at::kFloat, "q_scale: shape/dtype");
  TORCH_CHECK(k_hat.sizes() == at::IntArrayRef({B, H, nkv_pad, D}) && k_hat.is_contiguous() &&
                  k_hat.scalar_type() == at::kChar, "k_hat: shape/dtype");
  TORCH_CHECK(k_scale.sizes() == at::IntArrayRef({B, H, nkv_pad / 128, 4}) && k_scale.is_contiguous() &&
                  k_scale.scalar_type() == at::kFloat, "k_scale: fp32 [B,H,Nkv_pad/128,4] (group scales)");
  TORCH_CHECK(vt.sizes() == at::IntArrayRef({B, H, D, nkv_pad}) && vt.is_contiguous() && vt.scalar_type() == at::kChar,
              "vt: shape/dtype");
  TORCH_CHECK(v_scale.sizes() == at::IntArrayRef({B, H, D}) && v_scale.is_contiguous() &&
                  v_scale.scalar_type() == at::kFloat, "v_scale: fp32 [B,H,D]");
  const bool has_vmean = checked_v_mean_and_kv_lens(v_mean, kv_lens, B, H, D);
  if (!mma)
    TORCH_CHECK(rotvid::wgmma_kernel_available(),
                "the int8-fp8 wgmma kernel needs an sm90 GPU and the driver's cuTensorMapEncodeTiled");
  at::Tensor out = attention_output(q_hat, out_opt, n_q, D, out_bf16, bnhd);
  rotvid::AttnParams p = attn_params(q_hat, q_scale, k_hat, k_scale, vt, v_scale, kv_lens, has_vmean ? &v_mean : nullptr,
                                     out, bnhd, n_q, nq_pad, n_kv, nkv_pad, qk_scale, out_bf16);
  set_block_map(p, map_index, map_count, q_hat);
  p.o_hadamard = o_hadamard ? 1 : 0;  // the output un-rotated in the epilogue (attention_params.cuh)
  if (lse_opt.has_value()) {  // each row's log-sum-exp (attention_params.cuh: AttnParams.lse), the wgmma kernel only
    const at::Tensor& lse = *lse_opt;
    TORCH_CHECK(!mma, "lse: the int8-fp8 mma.sync kernel returns no log-sum-exp (the sm90 wgmma kernel does)");
    TORCH_CHECK(lse.is_cuda() && lse.device() == q_hat.device() && lse.scalar_type() == at::kFloat &&
                    lse.is_contiguous() && lse.sizes() == at::IntArrayRef({B, H, n_q}),
                "lse: contiguous fp32 CUDA [B, H, n_q] on the operands' device");
    p.lse = lse.data_ptr<float>();
  }
  const at::Tensor ws = plan_tail_split(p, split_tail && !mma, 128, D, q_hat.options());  // (wgmma path only)
  if (n_q > 0 && mma) {
    const cudaError_t err = rotvid::launch_int8fp8_attention_mma(p, (int)D, c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err != cudaErrorNotSupported, "the int8-fp8 mma.sync kernel needs an sm89+ GPU (e4m3 mma.sync)");
    check_cuda(err, "int8fp8_attention_mma");
  } else if (n_q > 0) {
    check_cuda(rotvid::launch_int8fp8_attention_wgmma(p, (int)D, c10::cuda::getCurrentCUDAStream()),
               "int8fp8_attention_wgmma");
  }
  return out;
}

}  // namespace

ROTVID_BINDINGS(int8fp8, m) {
  m.def("preprocess_int8fp8", &preprocess_int8fp8, "int8-fp8 pre-processing (INT8 Q/K per token, FP8 V per channel)");
  m.def("attention_int8fp8", &attention_int8fp8,
        "int8-fp8 attention on quantized inputs (mma=false: the sm90 wgmma kernel; true: the sm89+ mma.sync kernel; "
        "map_index / map_count: a block map, both kernels; lse: fp32 [B, H, n_q] written with each row's "
        "log-sum-exp, the wgmma kernel only; o_hadamard: the online V/O Hadamard's inverse on the output, both "
        "kernels)");
}
