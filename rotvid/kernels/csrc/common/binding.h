// What the binding files of rotvid's CUDA extension share (host C++ with torch's headers): the registration of each
// file's functions into the one extension module, and the checks and parameter structs their entry points build.
//
// The extension is one Python module (common/extension.cpp). Each binding file -- every recipe's, in its folder
// (rotvid/kernels/recipes/<name>/csrc/binding_<name>.cpp), and the shared kernels' (common/binding_common.cpp) --
// binds its own functions:
//
//   ROTVID_BINDINGS(int8fp8, m) { m.def("attention_int8fp8", &attention_int8fp8, "..."); }
//
// The block registers itself when the extension's library is loaded (a static initializer, before Python initializes
// the module), and the module runs every registered block: no shared file names a recipe's functions. The Python side
// (the recipes' ops.py, rope_op.py, hadamard_op.py) calls them by name on the loaded module and validates arguments
// with ValueErrors; the TORCH_CHECKs here and in the binding files guard against misuse of the raw extension functions.
// (no ATen/cuda/CUDAContext.h: it includes the cuBLAS / cuSPARSE headers, which the pip-installed compiler of
// rotvid[cuda] does not bring; the SM count comes from the runtime)
#pragma once
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <cstdint>
#include <vector>

#include "common/attention_params.cuh"

namespace rotvid {
namespace ext {

// One binding file's block of m.def calls, under the name given to ROTVID_BINDINGS.
using BindFn = void (*)(pybind11::module_&);
struct Binding {
  const char* name;
  BindFn bind;
};

// Every block registered so far, in registration order (one list for the whole library: an inline function's static).
inline std::vector<Binding>& bindings() {
  static std::vector<Binding> all;
  return all;
}

struct RegisterBindings {
  RegisterBindings(const char* name, BindFn bind) { bindings().push_back({name, bind}); }
};

inline void check_cuda(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "rotvid ", what, " launch failed: ", cudaGetErrorString(err));
}

struct Dims {
  int64_t B, H, N, D, sb, sh, sn;
};

inline Dims dims_of(const at::Tensor& x, bool bnhd) {
  TORCH_CHECK(x.dim() == 4 && x.stride(3) == 1, "expected a 4-D tensor with a contiguous last dim");
  if (bnhd) return {x.size(0), x.size(2), x.size(1), x.size(3), x.stride(0), x.stride(2), x.stride(1)};
  return {x.size(0), x.size(1), x.size(2), x.size(3), x.stride(0), x.stride(1), x.stride(2)};
}

inline rotvid::PreprocessParams pre_params(const at::Tensor& x, const Dims& d, int64_t n_pad) {
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

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// RoPE·R by the generalized table over x (dims d, any layout through its strides) into out ([B, H, N, D] through
// its strides; nullptr: no output tensor, the fused Q pass of the int8-fp8 pre-processing); hadamard: the full
// rotation's Walsh-Hadamard transform after the table
inline rotvid::RopeTableParams rope_params(const at::Tensor& x, const Dims& d, const at::Tensor& coef,
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

inline QKVDims checked_qkv_dims(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
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

// The wgmma kernels' tail split (wgmma_split_plan): sets p.split_from / p.splits (no split: every tile whole) and,
// when it splits, p.ws to the partials' buffer it returns (kept alive by the caller until the launches are queued;
// the allocator is stream-ordered).
inline at::Tensor plan_tail_split(rotvid::AttnParams& p, bool split, int64_t block_n, int64_t head_dim,
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
inline void set_block_map(rotvid::AttnParams& p, const c10::optional<at::Tensor>& map_index,
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

// v_mean (fp32 [B, H, D], or empty: V not smoothed) and kv_lens (contiguous int32 [B], or none), as every attention
// entry point takes them; whether V was smoothed.
inline bool checked_v_mean_and_kv_lens(const at::Tensor& v_mean, const c10::optional<at::Tensor>& kv_lens, int64_t B,
                                       int64_t H, int64_t D) {
  const bool has_vmean = v_mean.numel() > 0;
  if (has_vmean)
    TORCH_CHECK(v_mean.numel() == B * H * D && v_mean.is_contiguous() && v_mean.scalar_type() == at::kFloat,
                "v_mean: fp32 [B,H,D]");
  if (kv_lens.has_value())
    TORCH_CHECK(kv_lens->is_cuda() && kv_lens->scalar_type() == at::kInt && kv_lens->numel() == B &&
                    kv_lens->is_contiguous(), "kv_lens: contiguous int32 CUDA tensor [B]");
  return has_vmean;
}

// The attention output of a call on q_hat [B, H, Nq_pad, DB]: [B, n_q, H, D] (bnhd) or [B, H, n_q, D] in bf16 or fp16,
// new, or the caller's out_opt checked (tests poison it to check every element is written).
inline at::Tensor attention_output(const at::Tensor& q_hat, const c10::optional<at::Tensor>& out_opt, int64_t n_q,
                                   int64_t D, bool out_bf16, bool bnhd) {
  const int64_t B = q_hat.size(0), H = q_hat.size(1);
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
  return out;
}

// The AttnParams every attention entry point fills alike: the operands (q_hat, k_hat int8; vt's bytes, int8 or
// uint8; the recipe's scales and V parameters fp32), kv_lens, V's mean (nullptr: V not smoothed), the output and its
// strides, the sizes and the score scale; the rest (k_bias, the block map, the LSE, the tail split) zero.
inline rotvid::AttnParams attn_params(const at::Tensor& q_hat, const at::Tensor& q_scale, const at::Tensor& k_hat,
                                      const at::Tensor& k_scale, const at::Tensor& vt, const at::Tensor& vparams,
                                      const c10::optional<at::Tensor>& kv_lens, const at::Tensor* v_mean,
                                      const at::Tensor& out, bool bnhd, int64_t n_q, int64_t nq_pad, int64_t n_kv,
                                      int64_t nkv_pad, double qk_scale, bool out_bf16) {
  rotvid::AttnParams p{};
  p.q = q_hat.data_ptr<int8_t>();
  p.k = k_hat.data_ptr<int8_t>();
  p.vt = static_cast<const int8_t*>(vt.data_ptr());
  p.q_scale = q_scale.data_ptr<float>();
  p.k_scale = k_scale.data_ptr<float>();
  p.vparams = vparams.data_ptr<float>();
  p.kv_lens = kv_lens.has_value() ? kv_lens->data_ptr<int>() : nullptr;
  p.v_mean = v_mean != nullptr ? v_mean->data_ptr<float>() : nullptr;
  p.out = out.data_ptr();
  p.out_sb = out.stride(0);
  p.out_sh = bnhd ? out.stride(2) : out.stride(1);
  p.out_sn = bnhd ? out.stride(1) : out.stride(2);
  p.B = (int)q_hat.size(0);
  p.H = (int)q_hat.size(1);
  p.Nq = (int)n_q;
  p.Nq_pad = (int)nq_pad;
  p.Nkv = (int)n_kv;
  p.Nkv_pad = (int)nkv_pad;
  p.qk_scale = (float)qk_scale;  // float32(sm_scale * log2(e)), computed by the caller in double
  p.out_bf16 = out_bf16 ? 1 : 0;
  return p;
}

}  // namespace ext
}  // namespace rotvid

// ROTVID_BINDINGS(NAME, M) { M.def(...); ... }: this file's functions, bound into the extension module (NAME: a
// name for the block, unique in the extension).
#define ROTVID_BINDINGS(NAME, M)                                                                                  \
  static void rotvid_bind_##NAME(pybind11::module_& M);                                                           \
  static const ::rotvid::ext::RegisterBindings rotvid_bindings_##NAME(#NAME, &rotvid_bind_##NAME);                \
  static void rotvid_bind_##NAME(pybind11::module_& M)
