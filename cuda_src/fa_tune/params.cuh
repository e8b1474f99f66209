// Kernel parameters (passed as a __grid_constant__, so TMA reads the maps in place) and
// the causal tile arithmetic both roles share.
#pragma once

#include <cuda.h>
#include <cstdint>

namespace fa_tune {

struct ShapeInfo {
  int B, H, S;
  int num_m_blocks;
};

struct TileCoord {
  int m_block;
  int head;
  int batch;
  int idx;   // scheduler cursor: task index (static) or tile number (dynamic)
  int turn;  // how many times `next` has been asked (the dynamic scheduler's slot parity)
  bool valid;
};

// What the persistent schedulers read (unused by the grid scheduler).
struct SchedParams {
  const uint32_t* tasks;   // static: packed tasks, all CTAs' lists concatenated
  const int* offsets;      // static: CTA i owns tasks[offsets[i], offsets[i+1])
  int* tile_counter;       // dynamic: next tile to hand out (zeroed before each launch)
  uint32_t m_bits, h_bits; // static: packing widths (task_list.h)
  int num_tiles;           // dynamic: query tiles over all heads and batches
  int section_heads;       // dynamic: (batch, head) pairs per L2 section (>= 1)
};

struct Params {
  CUtensorMap tma_q;  // boxes of (64 cols, block_m rows)
  CUtensorMap tma_k;  // boxes of (64 cols, block_n rows)
  CUtensorMap tma_v;
  CUtensorMap tma_o;  // boxes of (64 cols, 64 rows): each warpgroup stores its own rows
  float* lse;         // [B, H, S] or null
  ShapeInfo shape;
  SchedParams sched;
  float scale_log2;   // log2(e) / sqrt(head_dim)
};

// KV tiles a causal query tile visits: every key <= its last valid query row.
template <class T>
__host__ __device__ __forceinline__ int num_kv_blocks(const ShapeInfo& s, int m_block) {
  const int last_row = min((m_block + 1) * T::kBlockM, s.S);
  return (last_row + T::kBlockN - 1) / T::kBlockN;
}

// KV tiles [0, this) lie entirely at or below the tile's first query row: no mask needed.
template <class T>
__host__ __device__ __forceinline__ int num_unmasked_kv_blocks(const ShapeInfo& s, int m_block) {
  return min(num_kv_blocks<T>(s, m_block), (m_block * T::kBlockM + 1) / T::kBlockN);
}

}  // namespace fa_tune
