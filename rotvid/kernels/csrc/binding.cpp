// PyTorch binding of rotvid's INT4 kernels. The Python side (rotvid/kernels/cuda_backend.py)
// validates arguments with ValueErrors; the TORCH_CHECKs here guard against misuse of the raw
// extension functions.
// (no ATen/cuda/CUDAContext.h: it includes the cuBLAS / cuSPARSE headers, which the pip-installed compiler of
// rotvid[cuda] does not bring; the SM count comes from the runtime)
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <cmath>
#include <vector>

#include "int4_common.cuh"

namespace {

void check_cuda(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "rotvid ", what, " launch failed: ", cudaGetErrorString(err));
}

struct Dims {
  int64_t B, H, N, D, sb, sh, sn;
};

Dims dims_of(const at::Tensor& x, bool bnhd) {
  TORCH_CHECK(x.dim() == 4 && x.stride(3) == 1, "expected a 4-D tensor with a contiguous last dim");
  if (bnhd) return {x.size(0), x.size(2), x.size(1), x.size(3), x.stride(0), x.stride(2), x.stride(1)};
  return {x.size(0), x.size(1), x.size(2), x.size(3), x.stride(0), x.stride(1), x.stride(2)};
}

rotvid::PreprocessParams pre_params(const at::Tensor& x, const Dims& d, int64_t n_pad) {
  rotvid::PreprocessParams p{};
  p.x = x.data_ptr();
  p.sb = d.sb;
  p.sh = d.sh;
  p.sn = d.sn;
  p.B = (int)d.B;
  p.H = (int)d.H;
  p.N = (int)d.N;
  p.N_pad = (int)n_pad;
  p.D = (int)d.D;
  p.is_bf16 = x.scalar_type() == at::kBFloat16 ? 1 : 0;
  return p;
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// RoPE·R by the generalized table over x (dims d, any layout through its strides) into out ([B, H, N, D] through
// its strides; nullptr: no output tensor, the fused Q pass of the int8-fp8 pre-processing); hadamard: the full
// rotation's Walsh-Hadamard transform after the table
rotvid::RopeTableParams rope_params(const at::Tensor& x, const Dims& d, const at::Tensor& coef,
                                    const at::Tensor& index, const at::Tensor* out, bool hadamard) {
  rotvid::RopeTableParams p{};
  p.hadamard = hadamard ? 1 : 0;
  p.x = x.data_ptr();
  p.coef = coef.data_ptr<float>();
  p.index = index.data_ptr<int>();
  p.sxb = d.sb;
  p.sxh = d.sh;
  p.sxn = d.sn;
  if (out != nullptr) {
    p.out = out->data_ptr();
    p.sob = out->stride(0);
    p.soh = out->stride(1);
    p.son = out->stride(2);
  }
  p.B = (int)d.B;
  p.H = (int)d.H;
  p.N = (int)d.N;
  p.D = (int)d.D;
  p.is_bf16 = x.scalar_type() == at::kBFloat16 ? 1 : 0;
  return p;
}

// The checks both pre-processing entry points make on q, k, v (any layout) and kv_lens; their dims.
struct QKVDims {
  Dims q, k, v;
};

QKVDims checked_qkv_dims(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const c10::optional<at::Tensor>& kv_lens, bool bnhd) {
  TORCH_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda(), "q, k, v must be CUDA tensors");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), "q, k, v: same dtype");
  TORCH_CHECK(q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16, "q: fp16 or bf16");
  const Dims dq = dims_of(q, bnhd), dk = dims_of(k, bnhd), dv = dims_of(v, bnhd);
  TORCH_CHECK(dq.D == 64 || dq.D == 128, "head_dim: 64 or 128");
  TORCH_CHECK(dk.B == dq.B && dk.H == dq.H && dk.D == dq.D, "k: batch, heads, head_dim of q");
  TORCH_CHECK(dv.B == dk.B && dv.H == dk.H && dv.N == dk.N && dv.D == dk.D, "v: shape of k");
  for (const at::Tensor* t : {&q, &k, &v}) {
    TORCH_CHECK(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0, "q, k, v: 16-byte aligned data pointers");
    TORCH_CHECK(t->stride(0) % 8 == 0 && t->stride(1) % 8 == 0 && t->stride(2) % 8 == 0,
                "q, k, v: strides must be multiples of 8 elements (16-byte aligned rows)");
  }
  if (kv_lens.has_value()) {
    TORCH_CHECK(kv_lens->is_cuda() && kv_lens->scalar_type() == at::kInt && kv_lens->numel() == dq.B &&
                    kv_lens->is_contiguous(),
                "kv_lens: contiguous int32 CUDA tensor [B]");
  }
  return {dq, dk, dv};
}

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

// The wgmma kernels' tail split (wgmma_split_plan): sets p.split_from / p.splits (no split: every tile whole) and,
// when it splits, p.ws to the partials' buffer it returns (kept alive by the caller until the launches are queued;
// the allocator is stream-ordered).
at::Tensor plan_tail_split(rotvid::AttnParams& p, bool split, int64_t block_n, int64_t head_dim,
                           const at::TensorOptions& opts) {
  int split_from = (p.Nq_pad / rotvid::kBlockM) * p.H * p.B, splits = 1;
  if (split) {
    int sms = 0;
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, c10::cuda::current_device()),
               "multiprocessor count");
    splits = rotvid::wgmma_split_plan(p.B, p.H, p.Nq_pad, p.Nkv, (int)block_n, sms, &split_from);
  }
  at::Tensor ws;
  if (splits > 1) {
    ws = at::empty({rotvid::wgmma_split_ws_floats(p.B, p.H, p.Nq_pad, (int)head_dim, split_from, splits)},
                   opts.dtype(at::kFloat));
    p.ws = ws.data_ptr<float>();
  }
  p.split_from = split_from;
  p.splits = splits;
  return ws;
}

// The block map of a call (rotvid/kernels/sparsity/block_map.py) into p: map_index int32 [B', H', Tq, Kmax] and
// map_count int32 [B', H', Tq] on q_hat's device, B' in {1, B}, H' in {1, H}, Tq = Nq_pad / 128, 1 <= Kmax <=
// ceil(n_kv / 128) (values -- indices ascending in [0, Tk), counts in [0, Kmax] -- are the caller's: BlockMap.check).
// Both absent: p stays dense.
void set_block_map(rotvid::AttnParams& p, const c10::optional<at::Tensor>& map_index,
                   const c10::optional<at::Tensor>& map_count, const at::Tensor& q_hat) {
  TORCH_CHECK(map_index.has_value() == map_count.has_value(), "block_map: map_index and map_count go together");
  if (!map_index.has_value()) return;
  const at::Tensor &idx = *map_index, &cnt = *map_count;
  for (const at::Tensor* t : {&idx, &cnt})
    TORCH_CHECK(t->is_cuda() && t->device() == q_hat.device() && t->scalar_type() == at::kInt && t->is_contiguous(),
                "block_map: contiguous int32 tensors on the operands' device");
  const int64_t tq = p.Nq_pad / rotvid::kBlockM, tk = (p.Nkv + 127) / 128;
  TORCH_CHECK(idx.dim() == 4 && cnt.dim() == 3 && idx.size(0) == cnt.size(0) && idx.size(1) == cnt.size(1) &&
                  idx.size(2) == cnt.size(2),
              "block_map: map_index [B', H', Tq, Kmax] and map_count [B', H', Tq]");
  TORCH_CHECK((cnt.size(0) == 1 || cnt.size(0) == p.B) && (cnt.size(1) == 1 || cnt.size(1) == p.H),
              "block_map: batch and head dimensions 1 or the call's B and H");
  TORCH_CHECK(cnt.size(2) == tq, "block_map: Tq = ceil(n_q / 128) query tiles");
  TORCH_CHECK(idx.size(3) >= 1 && idx.size(3) <= tk, "block_map: 1 <= Kmax <= ceil(n_kv / 128)");
  TORCH_CHECK(idx.numel() < (int64_t{1} << 31), "block_map: fewer than 2^31 index entries");
  p.map_index = idx.data_ptr<int>();
  p.map_count = cnt.data_ptr<int>();
  p.map_sh = cnt.size(1) == 1 ? 0 : (int)tq;
  p.map_sb = cnt.size(0) == 1 ? 0 : (int)(cnt.size(1) * tq);
  p.map_kmax = (int)idx.size(3);
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
  const bool has_vmean = v_mean.numel() > 0;
  if (has_vmean)
    TORCH_CHECK(v_mean.numel() == B * H * D && v_mean.is_contiguous() && v_mean.scalar_type() == at::kFloat,
                "v_mean: fp32 [B,H,D]");
  if (kv_lens.has_value())
    TORCH_CHECK(kv_lens->is_cuda() && kv_lens->scalar_type() == at::kInt && kv_lens->numel() == B &&
                    kv_lens->is_contiguous(), "kv_lens: contiguous int32 CUDA tensor [B]");
  auto opts = q_hat.options().dtype(out_bf16 ? at::kBFloat16 : at::kHalf);
  at::Tensor out;
  if (out_opt.has_value()) {  // caller-provided output (tests poison it to check every element is written)
    out = *out_opt;
    const auto want = bnhd ? std::vector<int64_t>{B, n_q, H, D} : std::vector<int64_t>{B, H, n_q, D};
    TORCH_CHECK(out.is_cuda() && out.sizes() == at::IntArrayRef(want) && out.scalar_type() == opts.dtype().toScalarType() &&
                    out.stride(3) == 1 && out.stride(0) % 2 == 0 && out.stride(1) % 2 == 0 && out.stride(2) % 2 == 0,
                "out: shape/dtype/strides of the attention output");
  } else {
    out = bnhd ? at::empty({B, n_q, H, D}, opts) : at::empty({B, H, n_q, D}, opts);
  }
  rotvid::AttnParams p{};
  p.q = q_hat.data_ptr<int8_t>();
  p.k = k_hat.data_ptr<int8_t>();
  p.vt = static_cast<const int8_t*>(vt.data_ptr());
  p.q_scale = q_scale.data_ptr<float>();
  p.k_scale = k_scale.data_ptr<float>();
  p.vparams = vparams.data_ptr<float>();
  p.kv_lens = kv_lens.has_value() ? kv_lens->data_ptr<int>() : nullptr;
  p.v_mean = has_vmean ? v_mean.data_ptr<float>() : nullptr;
  p.k_bias = has_bias ? k_bias.data_ptr<float>() : nullptr;
  p.out = out.data_ptr();
  p.out_sb = out.stride(0);
  p.out_sh = bnhd ? out.stride(2) : out.stride(1);
  p.out_sn = bnhd ? out.stride(1) : out.stride(2);
  p.B = (int)B;
  p.H = (int)H;
  p.Nq = (int)n_q;
  p.Nq_pad = (int)nq_pad;
  p.Nkv = (int)n_kv;
  p.Nkv_pad = (int)nkv_pad;
  p.qk_scale = (float)qk_scale;  // float32(sm_scale * log2(e)), computed by the caller in double
  p.out_bf16 = out_bf16 ? 1 : 0;
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

// The int8-fp8 recipe (sm89 / sm90): INT8 Q per token, INT8 K per group of 32 keys per 128-key block (K smoothed by its
// token mean when asked), per-channel FP8 e4m3 V over the valid tokens (V smoothed when asked). Returns {q_hat,
// q_scale, k_hat, k_scale [B,H,Nkv_pad/128,4], vt (e4m3 bytes as int8, [B,H,D,Nkv_pad]), v_scale fp32 [B,H,D],
// v_mean}; Nkv_pad a multiple of 128.
// With rope_coef / rope_index (the generalized RoPE table shared by the heads, float32 [N, D, 4] and int32 [D, 4], Nq ==
// Nkv == N): Q and K are RoPE·R-rotated here, with the bits of generalized_rope followed by this function -- Q
// rotated and quantized in one pass, K by generalized_rope into a scratch tensor the statistics and quantize read.
// rope_hadamard: the table is the full rotation's (then the Walsh-Hadamard transform, as generalized_rope's).
// v_hadamard: V's side of the online V/O Hadamard applied to V's rows as they are read (the operands of
// rotvid.rope.hadamard.rotate_v_online(v, D), bit for bit; the attention output is then O', which hadamard_rows with
// exponent floor(log2(D) / 2) turns back).
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
                             const c10::optional<at::Tensor>& lse_opt) {
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
  const bool has_vmean = v_mean.numel() > 0;
  if (has_vmean)
    TORCH_CHECK(v_mean.numel() == B * H * D && v_mean.is_contiguous() && v_mean.scalar_type() == at::kFloat,
                "v_mean: fp32 [B,H,D]");
  if (kv_lens.has_value())
    TORCH_CHECK(kv_lens->is_cuda() && kv_lens->scalar_type() == at::kInt && kv_lens->numel() == B &&
                    kv_lens->is_contiguous(), "kv_lens: contiguous int32 CUDA tensor [B]");
  if (!mma)
    TORCH_CHECK(rotvid::wgmma_kernel_available(),
                "the int8-fp8 wgmma kernel needs an sm90 GPU and the driver's cuTensorMapEncodeTiled");
  auto opts = q_hat.options().dtype(out_bf16 ? at::kBFloat16 : at::kHalf);
  at::Tensor out;
  if (out_opt.has_value()) {
    out = *out_opt;
    const auto want = bnhd ? std::vector<int64_t>{B, n_q, H, D} : std::vector<int64_t>{B, H, n_q, D};
    TORCH_CHECK(out.is_cuda() && out.sizes() == at::IntArrayRef(want) && out.scalar_type() == opts.dtype().toScalarType() &&
                    out.stride(3) == 1 && out.stride(0) % 2 == 0 && out.stride(1) % 2 == 0 && out.stride(2) % 2 == 0,
                "out: shape/dtype/strides of the attention output");
  } else {
    out = bnhd ? at::empty({B, n_q, H, D}, opts) : at::empty({B, H, n_q, D}, opts);
  }
  rotvid::AttnParams p{};
  p.q = q_hat.data_ptr<int8_t>();
  p.k = k_hat.data_ptr<int8_t>();
  p.vt = vt.data_ptr<int8_t>();
  p.q_scale = q_scale.data_ptr<float>();
  p.k_scale = k_scale.data_ptr<float>();
  p.vparams = v_scale.data_ptr<float>();
  p.kv_lens = kv_lens.has_value() ? kv_lens->data_ptr<int>() : nullptr;
  p.v_mean = has_vmean ? v_mean.data_ptr<float>() : nullptr;
  p.out = out.data_ptr();
  p.out_sb = out.stride(0);
  p.out_sh = bnhd ? out.stride(2) : out.stride(1);
  p.out_sn = bnhd ? out.stride(1) : out.stride(2);
  p.B = (int)B;
  p.H = (int)H;
  p.Nq = (int)n_q;
  p.Nq_pad = (int)nq_pad;
  p.Nkv = (int)n_kv;
  p.Nkv_pad = (int)nkv_pad;
  p.qk_scale = (float)qk_scale;
  p.out_bf16 = out_bf16 ? 1 : 0;
  set_block_map(p, map_index, map_count, q_hat);
  if (lse_opt.has_value()) {  // each row's log-sum-exp (int4_common.cuh: AttnParams.lse), the wgmma kernel only
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

// One side of the online V/O Hadamard over the last dim of x (rotvid.rope.hadamard's rotate_v_online /
// unrotate_o_online with block = D): a new tensor of x's shape and strides whose every row is T(wht(row) 2^-exponent), one pass
// (hadamard_rows.cu). x: fp16 / bf16 CUDA, D 64 or 128, dense with unit stride on D (any order of the other dims:
// its rows lie back to back, and empty_like keeps that order), 16-byte aligned.
at::Tensor hadamard_rows(const at::Tensor& x, int64_t exponent) {
  TORCH_CHECK(x.is_cuda() && x.dim() >= 1 && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf),
              "x: fp16 / bf16 CUDA tensor");
  const int64_t D = x.size(-1);
  TORCH_CHECK(D == 64 || D == 128, "x: last dim 64 or 128");
  TORCH_CHECK(x.stride(-1) == 1 && x.is_non_overlapping_and_dense(),
              "x: dense with unit stride on the last dim (rows back to back)");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0, "x: 16-byte aligned data pointer");
  TORCH_CHECK(exponent >= 0 && exponent <= 64, "exponent: 0 .. 64 (a power of two 2^-exponent)");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty_like(x);  // (x's strides: the same order of rows)
  rotvid::HadamardRowsParams p{};
  p.x = x.data_ptr();
  p.out = out.data_ptr();
  p.rows = x.numel() / D;
  p.scale = std::ldexp(1.0f, -(int)exponent);  // exact
  p.D = (int)D;
  p.is_bf16 = x.scalar_type() == at::kBFloat16 ? 1 : 0;
  check_cuda(rotvid::launch_hadamard_rows(p, c10::cuda::getCurrentCUDAStream()), "hadamard_rows");
  return out;
}

at::Tensor generalized_rope(const at::Tensor& x, const at::Tensor& coef, const at::Tensor& index,
                            const c10::optional<at::Tensor>& out_opt, bool hadamard) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 4 && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf),
              "x: fp16 / bf16 CUDA [B,H,N,D]");
  const int64_t B = x.size(0), H = x.size(1), N = x.size(2), D = x.size(3);
  TORCH_CHECK(D == 64 || D == 128, "x: head_dim 64 or 128");
  TORCH_CHECK(x.stride(3) == 1 && x.stride(0) % 8 == 0 && x.stride(1) % 8 == 0 && x.stride(2) % 8 == 0 &&
                  reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0,
              "x: unit stride on D and 16-byte aligned rows");
  TORCH_CHECK(coef.is_cuda() && coef.scalar_type() == at::kFloat && coef.is_contiguous() &&
                  coef.sizes() == at::IntArrayRef({N, D, 4}), "coef: contiguous float32 CUDA [N, D, 4]");
  TORCH_CHECK(index.is_cuda() && index.scalar_type() == at::kInt && index.is_contiguous() &&
                  index.sizes() == at::IntArrayRef({D, 4}), "index: contiguous int32 CUDA [D, 4]");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out;
  if (out_opt.has_value()) {
    out = *out_opt;
    TORCH_CHECK(out.is_cuda() && out.scalar_type() == x.scalar_type() && out.sizes() == x.sizes() &&
                    out.stride(3) == 1 && out.stride(0) % 8 == 0 && out.stride(1) % 8 == 0 && out.stride(2) % 8 == 0 &&
                    reinterpret_cast<uintptr_t>(out.data_ptr()) % 16 == 0,
                "out: x's shape and dtype, unit stride on D, 16-byte aligned rows");
  } else {
    out = at::empty({B, H, N, D}, x.options());
  }
  rotvid::RopeTableParams p = rope_params(x, dims_of(x, false), coef, index, &out, hadamard);
  check_cuda(rotvid::launch_generalized_rope(p, c10::cuda::getCurrentCUDAStream()), "generalized_rope");
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("preprocess_int4", &preprocess_int4, "INT4 pre-processing (smoothing, quantization, V^T layout)");
  m.def("attention_int4", &attention_int4,
        "INT4 attention on quantized inputs (map_index / map_count: a block map, every kernel)");
  m.def("preprocess_int8fp8", &preprocess_int8fp8, "int8-fp8 pre-processing (INT8 Q/K per token, FP8 V per channel)");
  m.def("attention_int8fp8", &attention_int8fp8,
        "int8-fp8 attention on quantized inputs (mma=false: the sm90 wgmma kernel; true: the sm89+ mma.sync kernel; "
        "map_index / map_count: a block map, both kernels; lse: fp32 [B, H, n_q] written with each row's "
        "log-sum-exp, the wgmma kernel only)");
  m.def("hadamard_rows", &hadamard_rows,
        "one side of the online V/O Hadamard over the last dim (64 or 128): every row T(wht(row) 2^-exponent), "
        "one pass",
        py::arg("x"), py::arg("exponent"));
  m.def("generalized_rope", &generalized_rope,
        "RoPE·R by the generalized table shared by the heads (one pass; hadamard: then the Walsh-Hadamard transform)",
        py::arg("x"), py::arg("coef"), py::arg("index"), py::arg("out") = py::none(), py::arg("hadamard") = false);
}
