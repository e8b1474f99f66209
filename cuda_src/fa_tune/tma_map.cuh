// The host side of TMA: a BSHD tensor's map, encoded through the driver entry point (which
// avoids linking libcuda). Kept out of tma.cuh (the device side) because the launcher's host
// pass reads none of the kernel's body (device_pass.cuh).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

namespace fa_tune {

// A TMA box spans 64 BF16 head-dim columns: 128 bytes, the span of the 128-byte swizzle.
// A D-wide row is D / 64 boxes (Derived::kDBoxes).
constexpr int kBoxCols = 64;

// A BSHD BF16 tensor [B, S, H, D] viewed as 4-D (d, s, h, b), read in boxes of
// 64 head-dim elements (128 bytes, the 128-byte swizzle's span) by `rows` sequence rows.
// stride: element strides of b, s and h (any order in memory: TMA takes each dimension's
// stride on its own); the head dim is contiguous. A dimension of size 1 is never stepped, so
// its stride is set to a legal value whatever the caller's.
inline cudaError_t encode_bshd_map(CUtensorMap* map, const void* base, int B, int S, int H,
                                   int D, int rows, const long long (&stride)[3]) {
  using EncodeFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  static EncodeFn encode = nullptr;
  if (encode == nullptr) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                     cudaEnableDefault, &q);
    if (e != cudaSuccess) return e;
    if (q != cudaDriverEntryPointSuccess || fn == nullptr) return cudaErrorNotSupported;
    encode = reinterpret_cast<EncodeFn>(fn);
  }
  auto bytes = [](long long elems, int size) { return cuuint64_t(size == 1 ? 16 : elems * 2); };
  const cuuint64_t dims[4] = {cuuint64_t(D), cuuint64_t(S), cuuint64_t(H), cuuint64_t(B)};
  const cuuint64_t strides[3] = {bytes(stride[1], S), bytes(stride[2], H), bytes(stride[0], B)};
  const cuuint32_t box[4] = {cuuint32_t(kBoxCols), cuuint32_t(rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims,
                      strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace fa_tune
