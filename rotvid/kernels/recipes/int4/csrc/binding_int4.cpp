// The INT4 recipes' binding (int4, int4-sym-p): preprocess_int4 and attention_int4 on the extension module, called by
// rotvid/kernels/recipes/int4/ops.py (custom ops rotvid::int4_preprocess and rotvid::int4_attention).
#include "common/binding.h"
#include "int4_entry.cuh"

namespace {

using namespace rotvid::ext;

std::vector<at::Tensor> preprocess_int4(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const c10::optional<at::Tensor>& kv_lens, bool bnhd, int64_t block_n,
                                        bool smooth_k, bool smooth_v, bool s4, int64_t p_mode, bool smooth_q,
                                        double qk_scale, bool wgmma) {
  TORCH_CHECK(!(s4 && wgmma), "s4 / wgmma: one V^T format");
  TORCH_CHECK(block_n == 64 || block_n == 128, "block_n: 64 or 128");
  const QKVDims d = checked_qkv_dims(q, k, v, kv_lens, bnhd);  // (before the guard: CUDA inputs checked first)
  const Dims &dq = d.q, &dk = d.k, &dv = d.v;
  const c10::cuda::CUDAGuard guard(q.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t D = dq.D, DB = s4 ? D / 2 : D;
  const int64_t nq_pad = round_up(dq.N, rotvid::kBlockM), nkv_pad = round_up(dk.N, block_n);
  auto i8 = q.options().dtype(at::kChar);
  auto f32 = q.options().dtype(at::kFloat);

  auto q_hat = at::empty({dq.B, dq.H, nq_pad, DB}, i8);
  auto q_scale = at::empty({dq.B, dq.H, nq_pad}, f32);
  auto k_hat = at::empty({dk.B, dk.H, nkv_pad, DB}, i8);
  auto k_scale = at::empty({dk.B, dk.H, nkv_pad}, f32);
  // V^T: int8 (two's complement, or s4 nibbles), or uint8 sign-magnitude bytes for the wgmma kernel's e4m3 P.V
  auto vt = at::empty({dv.B, dv.H, D, s4 ? nkv_pad / 2 : nkv_pad}, wgmma ? q.options().dtype(at::kByte) : i8);
  auto vparams = at::empty({dv.B, dv.H, nkv_pad / block_n, D, 2}, f32);
  const int* lens = kv_lens.has_value() ? kv_lens->data_ptr<int>() : nullptr;
  auto pq = pre_params(q, dq, nq_pad), pk = pre_params(k, dk, nkv_pad), pv = pre_params(v, dv, nkv_pad);
  pk.kv_lens = lens;
  pv.kv_lens = lens;
  // Smoothing means (Q smoothing: one per head over all query rows, its ΔS entering the scores as a bias per key;
  // K and V over their valid tokens): ONE zeroed work space {float64 sums [BH, D] of each smoothed tensor, then
  // their uint32 counters [BH]} and ONE launch over them
  at::Tensor q_mean, k_mean, v_mean = at::empty({0}, f32), k_bias = at::empty({0}, f32);
  const int64_t bh = dq.B * dq.H, n_means = (smooth_q ? 1 : 0) + (smooth_k ? 1 : 0) + (smooth_v ? 1 : 0);
  if (n_means > 0) {
    auto work = at::zeros({n_means * bh * D + (n_means * bh + 1) / 2}, q.options().dtype(at::kDouble));
    double* sums = work.data_ptr<double>();
    auto* done = reinterpret_cast<unsigned int*>(sums + n_means * bh * D);
    rotvid::TokenMeanParams mp{};
    auto add_mean = [&](rotvid::PreprocessParams& p, at::Tensor& mean) {
      mean = at::empty({dq.B, dq.H, D}, f32);
      p.mean = mean.data_ptr<float>();
      rotvid::TokenMeanTask& t = mp.task[mp.tasks];
      t.x = p;
      t.sum = sums + mp.tasks * bh * D;
      t.done = done + mp.tasks * bh;
      t.mean = mean.data_ptr<float>();
      ++mp.tasks;
    };
    if (smooth_q) add_mean(pq, q_mean);
    if (smooth_k) add_mean(pk, k_mean);
    if (smooth_v) add_mean(pv, v_mean);
    check_cuda(rotvid::launch_token_means_f64(mp, stream), "token_means_f64");
  }
  // Q's and K's rows in one launch
  pq.out = q_hat.data_ptr<int8_t>();
  pq.scale = q_scale.data_ptr<float>();
  if (smooth_q) {
    k_bias = at::empty({dk.B, dk.H, nkv_pad}, f32);
    pk.q_mean = q_mean.data_ptr<float>();
    pk.bias = k_bias.data_ptr<float>();
    pk.qk_scale = (float)qk_scale;
  }
  pk.out = k_hat.data_ptr<int8_t>();
  pk.scale = k_scale.data_ptr<float>();
  check_cuda(rotvid::launch_quant_rows_int4(pq, pk, s4, stream), "quant_rows_int4");
  pv.out = static_cast<int8_t*>(vt.data_ptr());
  pv.scale = vparams.data_ptr<float>();
  const int v_format = s4 ? rotvid::kVNibbles : wgmma ? rotvid::kVSignMagnitude : rotvid::kVTwosComplement;
  check_cuda(rotvid::launch_quant_v_int4(pv, (int)block_n, v_format, (int)p_mode, stream), "quant_v_int4");
  return {q_hat, q_scale, k_hat, k_scale, vt, vparams, v_mean, k_bias};
}

at::Tensor attention_int4(const at::Tensor& q_hat, const at::Tensor& q_scale, const at::Tensor& k_hat,
                          const at::Tensor& k_scale, const at::Tensor& vt, const at::Tensor& vparams,
                          const at::Tensor& v_mean, const c10::optional<at::Tensor>& kv_lens, int64_t n_q,
                          int64_t n_kv, int64_t head_dim, int64_t block_n, bool s4, bool wgmma, int64_t p_mode,
                          double qk_scale,
                          bool out_bf16, bool bnhd, const c10::optional<at::Tensor>& out_opt, bool split_tail,
                          const at::Tensor& k_bias, const c10::optional<at::Tensor>& map_index,
                          const c10::optional<at::Tensor>& map_count) {
  TORCH_CHECK(q_hat.is_cuda() && q_hat.dim() == 4 && q_hat.scalar_type() == at::kChar, "q_hat: int8 CUDA [B,H,Nq_pad,DB]");
  TORCH_CHECK(head_dim == 64 || head_dim == 128, "head_dim: 64 or 128");
  TORCH_CHECK(block_n == 64 || block_n == 128, "block_n: 64 or 128");
  const c10::cuda::CUDAGuard guard(q_hat.device());
  const int64_t B = q_hat.size(0), H = q_hat.size(1), D = head_dim, DB = s4 ? D / 2 : D;
  const int64_t nq_pad = round_up(n_q, rotvid::kBlockM), nkv_pad = round_up(n_kv, block_n);
  TORCH_CHECK(q_hat.sizes() == at::IntArrayRef({B, H, nq_pad, DB}) && q_hat.is_contiguous(), "q_hat: shape/layout");
  TORCH_CHECK(q_scale.sizes() == at::IntArrayRef({B, H, nq_pad}) && q_scale.is_contiguous() &&
                  q_scale.scalar_type() == at::kFloat, "q_scale: shape/dtype");
  TORCH_CHECK(k_hat.sizes() == at::IntArrayRef({B, H, nkv_pad, DB}) && k_hat.is_contiguous() &&
                  k_hat.scalar_type() == at::kChar, "k_hat: shape/dtype");
  TORCH_CHECK(k_scale.sizes() == at::IntArrayRef({B, H, nkv_pad}) && k_scale.is_contiguous() &&
                  k_scale.scalar_type() == at::kFloat, "k_scale: shape/dtype");
  TORCH_CHECK(vt.sizes() == at::IntArrayRef({B, H, D, s4 ? nkv_pad / 2 : nkv_pad}) && vt.is_contiguous(), "vt: shape");
  TORCH_CHECK(vt.scalar_type() == (wgmma ? at::kByte : at::kChar),
              wgmma ? "vt: the wgmma kernel takes uint8 sign-magnitude V^T bytes (pre-processing with path 'wgmma')"
                    : "vt: the mma.sync kernels take int8 V^T bytes (pre-processing with path 's8' / 's4')");
  TORCH_CHECK(vparams.sizes() == at::IntArrayRef({B, H, nkv_pad / block_n, D, 2}) && vparams.is_contiguous() &&
                  vparams.scalar_type() == at::kFloat, "vparams: shape/dtype");
  const bool has_bias = k_bias.numel() > 0;
  if (has_bias)
    TORCH_CHECK(k_bias.sizes() == at::IntArrayRef({B, H, nkv_pad}) && k_bias.is_contiguous() &&
                    k_bias.scalar_type() == at::kFloat && k_bias.is_cuda(), "k_bias: fp32 [B,H,Nkv_pad] or empty");
  const bool has_vmean = checked_v_mean_and_kv_lens(v_mean, kv_lens, B, H, D);
  at::Tensor out = attention_output(q_hat, out_opt, n_q, D, out_bf16, bnhd);
  rotvid::AttnParams p = attn_params(q_hat, q_scale, k_hat, k_scale, vt, vparams, kv_lens, has_vmean ? &v_mean : nullptr,
                                     out, bnhd, n_q, nq_pad, n_kv, nkv_pad, qk_scale, out_bf16);
  p.k_bias = has_bias ? k_bias.data_ptr<float>() : nullptr;
  set_block_map(p, map_index, map_count, q_hat);
  if (n_q > 0 && wgmma) {
    TORCH_CHECK(!s4, "the wgmma kernel takes the s8 layout");
    TORCH_CHECK(rotvid::wgmma_kernel_available(),
                "the wgmma kernel needs an sm90 GPU and the driver's cuTensorMapEncodeTiled");
    const at::Tensor ws = plan_tail_split(p, split_tail, block_n, D, q_hat.options());
    check_cuda(rotvid::launch_int4_attention_wgmma(p, (int)D, (int)block_n, (int)p_mode,
                                                   c10::cuda::getCurrentCUDAStream()),
               "int4_attention_wgmma");
  } else if (n_q > 0) {
    check_cuda(rotvid::launch_int4_attention(p, (int)D, (int)block_n, s4, (int)p_mode,
                                             c10::cuda::getCurrentCUDAStream()),
               "int4_attention");
  }
  return out;
}

}  // namespace

ROTVID_BINDINGS(int4, m) {
  m.def("preprocess_int4", &preprocess_int4, "INT4 pre-processing (smoothing, quantization, V^T layout)");
  m.def("attention_int4", &attention_int4,
        "INT4 attention on quantized inputs (map_index / map_count: a block map, every kernel)");
}
