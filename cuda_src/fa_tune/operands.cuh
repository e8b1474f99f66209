// The warpgroup GEMMs' operands as wgmma takes them, without CuTe's layout algebra: register
// fragments as plain arrays, and the shared-memory matrix descriptors computed directly. CuTe's
// partitions of the same operands were most of a candidate's front-end time (docs/PERF.md step
// 53); tests/data/gmma_operands_driver.cu checks these against them on the host.
//
// Accumulator of a 64 x N wgmma (S: N = block_n; O: N = head dim), N/2 floats per thread, flat
// index e = i0 + 2 i1 + 4 i2: row 16 warp + 8 i1 + lane/4, column 8 i2 + 2 (lane%4) + i0.
// A operand from registers (P, and Q with q_in_regs): per 16-column k-block kk, four 32-bit
// registers of two BF16 each, a0..a3 = (row g, columns 16kk + 2(lane%4) + {0,1}), (g + 8, same),
// (g, + 8), (g + 8, + 8), g = 16 warp + lane/4. So P's registers are S's values in S's order.
#pragma once

#include <cstdint>

namespace fa_tune {

template <int N>
struct Accum {
  static constexpr int kSize = N;
  float v[N];
  __host__ __device__ __forceinline__ float& operator()(int i) { return v[i]; }
  __host__ __device__ __forceinline__ float operator()(int i) const { return v[i]; }
};

// kRegs 32-bit registers of BF16 pairs, wgmma's A operand.
template <int kRegs>
struct Pairs {
  static constexpr int kSize = kRegs;
  uint32_t r[kRegs];
};

// wgmma's shared-memory matrix descriptor. Every operand here is TMA's 128-byte swizzle from a
// 1024-byte aligned base. Low word: start address >> 4 (bits 0-13), leading byte offset >> 4
// (bits 16-29); high word: stride byte offset >> 4 (bits 0-13), swizzle mode (bits 30-31).
struct GmmaDesc {
  uint32_t lo, hi;

  __host__ __device__ __forceinline__ constexpr uint64_t bits() const {
    return uint64_t(hi) << 32 | lo;
  }
  // The operand `units` x 16 bytes further on: only the start address moves, in 32-bit
  // arithmetic as CuTe's descriptor iterator does it.
  __host__ __device__ __forceinline__ constexpr GmmaDesc operator+(uint32_t units) const {
    return {lo + units, hi};
  }
};

constexpr uint32_t kSwizzle128 = 1u << 30;  // swizzle mode 1: 128 bytes
constexpr uint32_t kAtomBytes = 1024;       // 8 rows of 128 bytes: the swizzle's period

// K-major (Q and K: a row's 64-column block in one 128-byte line; a tile of `rows` rows keeps
// its 64-column blocks `rows` x 128 bytes apart): 8-row groups 1024 bytes apart (the stride
// byte offset); the leading byte offset is unused in this mode and set to 1 as CuTe sets it.
__host__ __device__ __forceinline__ constexpr GmmaDesc k_major_desc(uint32_t smem_addr) {
  return {uint32_t(uint16_t(smem_addr >> 4)) | 1u << 16, (kAtomBytes >> 4) | kSwizzle128};
}
// Offsets below are in the descriptor's 16-byte units.
// k-block k (16 columns) of a K-major tile of `rows` rows.
__host__ __device__ __forceinline__ constexpr uint32_t k_major_kblock(int k, int rows) {
  return uint32_t(k / 4) * rows * 8 + uint32_t(k % 4) * 2;
}

// MN-major (V read as V^T, the PV's B operand: N = head dim, K = keys, a tile of `rows` keys
// as the TMA wrote them): the head dim's 64-column blocks rows x 128 bytes apart (the leading
// byte offset; 0 with one block, as CuTe sets it), 8-key groups 1024 bytes apart.
__host__ __device__ __forceinline__ constexpr GmmaDesc mn_major_desc(uint32_t smem_addr, int rows,
                                                                     int cols) {
  const uint32_t lbo = cols > 64 ? uint32_t(rows) * 128 : 0;
  return {uint32_t(uint16_t(smem_addr >> 4)) | (lbo >> 4) << 16, (kAtomBytes >> 4) | kSwizzle128};
}
// k-block k (16 keys) of an MN-major V tile.
__host__ __device__ __forceinline__ constexpr uint32_t mn_major_kblock(int k) {
  return uint32_t(k) * 16 * 8;
}

}  // namespace fa_tune
