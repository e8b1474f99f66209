// Where the epilogue's stmatrix.x4 puts one warpgroup's O accumulator in the swizzled O tile
// (epilogue.cuh, Epilogue::stage_o), and where q_in_regs's ldmatrix.x4 reads Q's A registers
// from the Q tile (same layout; kernel.cuh). Plain C++, so a host test checks both against
// CuTe's tiled copies (tests/data/operands_driver.cu).
//   Accumulator (the PV wgmma's C layout): thread (warp w, lane l) of a warpgroup holds rows
//   16w + l/4 (+8), columns 8j + 2(l%4) (+1); BF16 pair u = 2j (+1 for the row + 8), so pairs
//   4k..4k+3 are the four 8 x 8 matrices of columns 16k..16k+15 in stmatrix's order (rows 0-7,
//   rows 8-15, then the same 8 columns on), and lane l gives the address of row l%8 of
//   matrix l/8.
//   O and Q tiles: 64-column atoms of block_m rows x 128 bytes, each row's 16-byte
//   chunks XOR-ed with row % 8 (TMA's SWIZZLE_128B, from a 1024-byte aligned base).
#pragma once

namespace fa_tune {

struct OStage {
  int row_bytes;  // the lane's row (tid counts the CTA's consumer threads)
  int chunk;      // its 16-byte chunk at k = 0, swizzled by the row

  __host__ __device__ constexpr explicit OStage(int tid)
      : row_bytes(((tid / 32) * 16 + (tid % 32 / 8 % 2) * 8 + tid % 8) * 128),
        chunk((tid % 32 / 16) ^ (tid % 8)) {}

  // Byte offset of the lane's address for columns 16k..16k+15: atom k/4, chunk 2(k%4) (+1 for
  // matrices 2-3). The chunk's bits are disjoint from 2(k%4)'s, so XOR-ing the constant after
  // the row's swizzle is the same as before it.
  __host__ __device__ constexpr int offset(int k, int block_m) const {
    return row_bytes + (k / 4) * block_m * 128 + ((chunk ^ (2 * (k % 4))) << 4);
  }

  // Byte offset of (row, col) in the tile, col a multiple of 8 (a whole 16-byte chunk).
  __host__ __device__ static constexpr int tile_byte(int row, int col, int block_m) {
    return (col / 64) * block_m * 128 + row * 128 + (((col % 64 / 8) ^ (row % 8)) << 4);
  }
};

}  // namespace fa_tune
