// Which query tile (m_block, head, batch) each CTA works on, and in what order.
#pragma once

#include "config.cuh"

namespace fa_tune {

struct TileCoord {
  int m_block;
  int head;
  int batch;
  bool valid;
};

struct ShapeInfo {
  int B, H, S;
  int num_m_blocks;
};

// Non-persistent: one CTA per query tile, grid (m tiles, heads, batch). Within a head the
// blocks are launched longest first (the diagonal tile of the last query rows has the most
// KV tiles) or in natural order; heads stay adjacent so a wave shares K/V in L2.
template <class Cfg>
struct GridScheduler {
  static dim3 grid(const ShapeInfo& s) { return dim3(s.num_m_blocks, s.H, s.B); }
  __device__ static TileCoord first(const ShapeInfo& s, int* /*slot*/) {
    const int x = blockIdx.x;
    const int m = Cfg::tile_order == TileOrder::LongestFirst ? s.num_m_blocks - 1 - x : x;
    return {m, int(blockIdx.y), int(blockIdx.z), true};
  }
  __device__ static TileCoord next(const ShapeInfo&, const TileCoord&, int* /*slot*/) {
    return {0, 0, 0, false};
  }
};

}  // namespace fa_tune
