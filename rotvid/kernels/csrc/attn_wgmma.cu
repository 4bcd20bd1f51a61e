// Host side of the Hopper kernel (int4_attention_wgmma.cuh): TMA tensor maps and the launch.
// The device code exists only in an sm90a build; elsewhere the launcher reports cudaErrorNotSupported.
#include "int4_attention_wgmma.cuh"

namespace rotvid {
namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_fn() {
  static EncodeTiled fn = []() -> EncodeTiled {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess)
      return nullptr;
    return reinterpret_cast<EncodeTiled>(ptr);
  }();
  return fn;
}

// 2-D map of an int8 matrix [rows, cols] (row stride `cols` bytes), box [box_rows, box_cols].
bool make_map(CUtensorMap* map, const void* data, uint64_t rows, uint64_t cols, uint32_t box_rows, uint32_t box_cols,
              int swizzle_bytes) {
  EncodeTiled fn = encode_fn();
  if (fn == nullptr) return false;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {cols};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t elem[2] = {1, 1};
  const CUtensorMapSwizzle sw = swizzle_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
  return fn(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(data), dims, strides, box, elem,
            CU_TENSOR_MAP_INTERLEAVE_NONE, sw, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <int D, int PMODE>
cudaError_t launch_d(const Int4AttnParams& p, cudaStream_t stream) {
  using C = wg::Cfg<D>;
  const uint64_t bh = (uint64_t)p.B * p.H;
  CUtensorMap tm_q, tm_k, tm_v;
  if (!make_map(&tm_q, p.q, bh * p.Nq_pad, D, wg::kBM, D, C::QK_SWIZZLE) ||
      !make_map(&tm_k, p.k, bh * p.Nkv_pad, D, wg::kBN, D, C::QK_SWIZZLE) ||
      !make_map(&tm_v, p.vt, bh * D, p.Nkv_pad, D, wg::kBN, 128))
    return cudaErrorInvalidValue;
  auto kernel = wg::int4_attention_wgmma_kernel<D, PMODE>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM);
  if (err != cudaSuccess) return err;
  dim3 grid(p.Nq_pad / wg::kBM, p.H, p.B);
  kernel<<<grid, wg::kThreads, C::SMEM, stream>>>(p, tm_q, tm_k, tm_v);
  return cudaGetLastError();
}

}  // namespace

bool wgmma_kernel_available() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
    return false;
  return major == 9 && encode_fn() != nullptr;
}

cudaError_t launch_int4_attention_wgmma(const Int4AttnParams& p, int head_dim, int p_mode, cudaStream_t stream) {
  if (!wgmma_kernel_available()) return cudaErrorNotSupported;
  if (p.Nq_pad % wg::kBM != 0 || p.Nkv_pad % wg::kBN != 0) return cudaErrorInvalidValue;
  if (head_dim == 128) return p_mode == kPRange ? launch_d<128, kPRange>(p, stream) : launch_d<128, kPSym>(p, stream);
  if (head_dim == 64) return p_mode == kPRange ? launch_d<64, kPRange>(p, stream) : launch_d<64, kPSym>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace rotvid
