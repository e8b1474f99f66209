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

// cuTensorMapEncodeTiled through the driver entry point: a BF16 tensor of `rank` dims (the
// first contiguous), read in boxes with the 128-byte swizzle.
inline cudaError_t encode_bf16_map(CUtensorMap* map, const void* base, int rank,
                                   const cuuint64_t* dims, const cuuint64_t* strides,
                                   const cuuint32_t* box) {
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
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, cuuint32_t(rank),
                      const_cast<void*>(base), dims, strides, box, elem_strides,
                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// A dimension's byte stride; one of size 1 is never stepped, so it gets a legal value whatever
// the caller's.
inline cuuint64_t stride_bytes(long long elems, long long size) {
  return cuuint64_t(size == 1 ? 16 : elems * 2);
}

// A BSHD BF16 tensor [B, S, H, D] viewed as 4-D (d, s, h, b), read in boxes of
// 64 head-dim elements (128 bytes, the 128-byte swizzle's span) by `rows` sequence rows.
// stride: element strides of b, s and h (any order in memory: TMA takes each dimension's
// stride on its own); the head dim is contiguous.
inline cudaError_t encode_bshd_map(CUtensorMap* map, const void* base, int B, int S, int H,
                                   int D, int rows, const long long (&stride)[3]) {
  const cuuint64_t dims[4] = {cuuint64_t(D), cuuint64_t(S), cuuint64_t(H), cuuint64_t(B)};
  const cuuint64_t strides[3] = {stride_bytes(stride[1], S), stride_bytes(stride[2], H),
                                 stride_bytes(stride[0], B)};
  const cuuint32_t box[4] = {cuuint32_t(kBoxCols), cuuint32_t(rows), 1, 1};
  return encode_bf16_map(map, base, 4, dims, strides, box);
}

// pack_gqa (params.cuh, PackParams): the same tensor as 5-D (d, g, s, vh, b), query head
// h = vh x P + g, read in boxes of 64 columns x P heads x rows / P positions, which land in
// shared memory as `rows` swizzled 128-byte rows, row = position x P + head: the tile a
// 4-D box of `rows` rows makes, so the GEMMs read it unchanged.
inline cudaError_t encode_packed_map(CUtensorMap* map, const void* base, int B, int S, int H,
                                     int P, int D, int rows, const long long (&stride)[3]) {
  const cuuint64_t dims[5] = {cuuint64_t(D), cuuint64_t(P), cuuint64_t(S), cuuint64_t(H / P),
                              cuuint64_t(B)};
  const cuuint64_t strides[4] = {stride_bytes(stride[2], P), stride_bytes(stride[1], S),
                                 stride_bytes(stride[2] * P, H / P),
                                 stride_bytes(stride[0], B)};
  const cuuint32_t box[5] = {cuuint32_t(kBoxCols), cuuint32_t(P), cuuint32_t(rows / P), 1, 1};
  return encode_bf16_map(map, base, 5, dims, strides, box);
}

}  // namespace fa_tune
