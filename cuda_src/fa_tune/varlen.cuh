// Varlen: the device-side schedule of a packed batch, built from cu_seqlens by one small CTA
// before the attention kernel, on the same stream (no host sync, so CUDA graphs can hold it).
//
// Order: longest work first across all sequences. A causal query tile m of any sequence visits
// m + 1 KV tiles, so tiles are taken by level m, from the highest down; a level holds tile m of
// every sequence with more than m tiles, longest sequence first, its heads adjacent (query
// heads sharing a K/V head read the same tiles, at the same time, from L2). Non-causal, every
// tile of a sequence costs its length: the same order still puts the long sequences first.
//
// With the sequences sorted by tile count (n_0 >= n_1 >= ...), level m is exactly the first
// above(m) = #{b : n_b > m} of them, so tile t is found by a binary search over the level starts
// and one lookup in the sorted order: a counting sort and two scans, all in shared memory.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "params.cuh"

namespace fa_tune {

constexpr int kVarlenPrepThreads = 1024;

// Workspace: the tile counter (16 bytes, so the tasks stay 16-byte aligned), then the tasks.
struct VarlenPlan {
  int num_seqs = 0, heads = 0, group = 1, rows_per_tile = 0;  // group: Hq / Hkv
  int max_tiles = 0;   // tiles of the longest sequence allowed by max_seqlen
  long long bound = 0; // tiles of the batch at most: heads * (total / rows + num_seqs)

  static VarlenPlan make(int num_seqs, int heads, int group, int total, int max_seqlen,
                         int rows) {
    VarlenPlan v;
    v.num_seqs = num_seqs;
    v.heads = heads;
    v.group = group;
    v.rows_per_tile = rows;
    v.max_tiles = (max_seqlen + rows - 1) / rows;
    // sum of ceil(len / rows) <= total / rows + num_seqs, and <= num_seqs * max_tiles.
    const long long by_total = (long long)total / rows + num_seqs;
    const long long by_max = (long long)num_seqs * v.max_tiles;
    v.bound = (long long)heads * (by_total < by_max ? by_total : by_max);
    return v;
  }
  size_t workspace_bytes() const { return 16 + size_t(bound) * sizeof(VarlenTask); }
  // Shared memory of the prep kernel: tile-count histogram and level table (max_tiles + 1
  // each) and the sorted order (num_seqs).
  size_t prep_smem_bytes() const {
    return (2 * size_t(max_tiles + 1) + size_t(num_seqs) + 32) * sizeof(int);
  }
};

namespace varlen_detail {

// Exclusive prefix sum of one int per thread over the whole block; `warp_sums` holds 32 ints.
__device__ __forceinline__ int block_exclusive_sum(int x, int* warp_sums) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int incl = x;
  for (int d = 1; d < 32; d *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += y;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int n_warps = blockDim.x / 32;
    int w = lane < n_warps ? warp_sums[lane] : 0;
    for (int d = 1; d < 32; d *= 2) {
      const int y = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d) w += y;
    }
    warp_sums[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  const int before = warp == 0 ? 0 : warp_sums[warp - 1];
  __syncthreads();  // warp_sums is reused by the next call
  return before + incl - x;
}

// a[i] <- sum of a[k] for k > i, over n entries (exclusive suffix sum), whole block.
__device__ __forceinline__ void suffix_sum(int* a, int n, int* warp_sums) {
  const int per = (n + int(blockDim.x) - 1) / int(blockDim.x);
  // Thread 0 owns the top chunk, so the block's prefix order is the suffix order.
  const int hi = n - int(threadIdx.x) * per, lo = hi - per > 0 ? hi - per : 0;
  int sum = 0;
  for (int i = lo; i < hi; ++i) sum += a[i];
  int run = block_exclusive_sum(sum, warp_sums);
  for (int i = hi - 1; i >= lo; --i) {
    const int v = a[i];
    a[i] = run;
    run += v;
  }
  __syncthreads();
}

}  // namespace varlen_detail

// One CTA of kVarlenPrepThreads. A template, so only a build with the varlen kernel compiles
// it, and the bucket kernels of a workload library share one copy. Writes tasks[0, bound): the tiles in order, then m_block -1
// past the last; zeroes the tile counter the attention kernel's CTAs take numbers from.
// A length above max_seqlen is cut to it (the caller's promise, as FA3's max_seqlen).
template <int kThreads = kVarlenPrepThreads>
__global__ void __launch_bounds__(kThreads, 1)
    varlen_prepare_kernel(const int* cu_seqlens, VarlenPlan plan, VarlenTask* tasks,
                          int* counter) {
  using namespace varlen_detail;
  extern __shared__ int prep_smem[];
  // The attention kernel may launch now (PDL): its prologue overlaps this kernel, and it waits
  // (griddepcontrol.wait) for all of this kernel's writes before reading them.
  asm volatile("griddepcontrol.launch_dependents;");
  const int M = plan.max_tiles, B = plan.num_seqs, H = plan.heads;
  int* hist = prep_smem;       // [M + 1]: sequences with n tiles; later the placement cursors
  int* level = hist + M + 1;   // [M + 1]: above(m), then the first tile of level m
  int* order = level + M + 1;  // [B]: sequences by tile count, most first
  int* warp_sums = order + B;  // [32]
  const int tid = threadIdx.x, nt = blockDim.x;
  auto tiles_of = [&](int b) {
    const int len = max(0, cu_seqlens[b + 1] - cu_seqlens[b]);
    return min(M, (len + plan.rows_per_tile - 1) / plan.rows_per_tile);
  };

  for (int i = tid; i <= M; i += nt) hist[i] = 0;
  if (tid == 0) *counter = 0;
  __syncthreads();
  for (int b = tid; b < B; b += nt) atomicAdd(&hist[tiles_of(b)], 1);
  __syncthreads();
  for (int i = tid; i <= M; i += nt) level[i] = hist[i];
  __syncthreads();
  suffix_sum(level, M + 1, warp_sums);  // level[m] = #{b : n_b > m} = above(m)
  // Counting sort: sequence b goes after every longer one, its place among equals by arrival
  // (which one comes first does not change any result).
  for (int i = tid; i <= M; i += nt) hist[i] = 0;
  __syncthreads();
  for (int b = tid; b < B; b += nt) {
    const int n = tiles_of(b);
    if (n > 0) order[level[n] + atomicAdd(&hist[n], 1)] = b;
  }
  __syncthreads();
  // Level m holds H * above(m) tiles; level starts from the top: level[m] <- H * sum_{m' > m}.
  for (int i = tid; i <= M; i += nt) level[i] = i < M ? H * level[i] : 0;
  __syncthreads();
  const int level0 = level[0];  // H * above(0): tile 0 of every sequence that has one
  __syncthreads();
  suffix_sum(level, M, warp_sums);
  const int num_tiles = level[0] + level0;  // level 0 comes last

  for (long long t = tid; t < plan.bound; t += nt) {
    VarlenTask w{-1, 0, 0, 0};
    if (t < num_tiles) {
      // Level starts fall as m rises; t's level is the lowest m with level[m] <= t.
      int lo = 0, hi = M - 1;
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (level[mid] <= t) hi = mid; else lo = mid + 1;
      }
      const int i = int(t) - level[lo];
      const int b = order[i / H], h = i % H;
      w = {lo, h | (h / plan.group) << 16, cu_seqlens[b], cu_seqlens[b + 1] - cu_seqlens[b]};
    }
    tasks[t] = w;
  }
}

}  // namespace fa_tune
