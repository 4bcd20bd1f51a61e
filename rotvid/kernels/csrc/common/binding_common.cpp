// The binding of the kernels the recipes share: the online V/O Hadamard pass (hadamard_rows.cu;
// rotvid/kernels/hadamard_op.py) and the RoPE·R pass (rope_table.cu; rotvid/kernels/rope_op.py).
#include <cmath>

#include "common/binding.h"

namespace {

using namespace rotvid::ext;

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

ROTVID_BINDINGS(common, m) {
  m.def("hadamard_rows", &hadamard_rows,
        "one side of the online V/O Hadamard over the last dim (64 or 128): every row T(wht(row) 2^-exponent), "
        "one pass",
        py::arg("x"), py::arg("exponent"));
  m.def("generalized_rope", &generalized_rope,
        "RoPE·R by the generalized table shared by the heads (one pass; hadamard: then the Walsh-Hadamard transform)",
        py::arg("x"), py::arg("coef"), py::arg("index"), py::arg("out") = py::none(), py::arg("hadamard") = false);
}
