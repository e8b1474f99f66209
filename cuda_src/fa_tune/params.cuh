// Kernel parameters (passed as a __grid_constant__, so TMA reads the maps in place): the
// producer's, the epilogue's, and what every piece reads; the scheduler's own are in
// scheduler.cuh (KernelParams). And the causal tile arithmetic both roles share.
#pragma once

#include <cuda.h>
#include <cstdint>

#include "device_pass.cuh"

namespace fa_tune {

struct ShapeInfo {
  int B, H;          // H: query heads; device-scheduled (varlen): B sequences
  int Sq, Sk;        // query and key rows per batch entry of the tensors (packed: all tokens)
  int num_m_blocks;  // fixed length: ceil(Sq / block_m)
  int Hkv;           // K/V heads (H for MHA, 1 for MQA)
  int group;         // H / Hkv: query heads per K/V head; query head h reads K/V head h / group
};

struct TileCoord {
  int m_block;
  int head;
  int batch;
  int idx;   // scheduler cursor: task index (static) or tile number (dynamic)
  int turn;  // how many times `next` has been asked (the dynamic scheduler's slot parity)
  bool valid;
  // Device-scheduled launches only (the schedulers' seq_* / key_* / kv_* read them): the
  // tile's sequence: its first query row and query count, its first key row and key count, the
  // K/V head and the K/V batch coordinate (packed tensors: 0; a per-sequence cache: the
  // sequence).
  int start = 0;
  int len = 0;
  int k_start = 0;
  int k_len = 0;
  int kv_head = 0;
  int kv_batch = 0;
  int kv_tiles = 0;  // KV tiles the task visits (the schedule computed it: one value for the
                     // 24-register producer to hold instead of two lengths)
};

// One query tile of a device-scheduled launch, as the schedule stores it (varlen.cuh): 32
// bytes, two 16-byte loads. The K/V head comes precomputed, so the producer (24-40 registers)
// does no integer division per tile.
struct VarlenTask {
  int m_block;   // < 0: past the last tile
  int heads;     // query head | K/V head << 16
  int start;     // first query row (cu_seqlens_q[sequence], or 0 in its own batch entry)
  int len;       // query rows
  int k_start;   // first key row (cu_seqlens_k[sequence], or 0)
  int k_len;     // keys it attends to (seqused_k, or the cu_seqlens_k difference)
  int batches;   // batch coordinate of q and o | that of k and v << 16 (0 when packed)
  int kv_tiles;  // KV tiles the task visits (num_kv_blocks)
};

// The producer's: q, k and v as the caller laid them out.
struct LoadParams {
  CUtensorMap tma_q;  // boxes of (64 cols, block_m rows)
  CUtensorMap tma_k;  // boxes of (64 cols, block_n rows)
  CUtensorMap tma_v;
};

// The epilogue's: O (dense) and the LSE.
struct StoreParams {
  CUtensorMap tma_o;  // boxes of (64 cols, 64 rows): each warpgroup stores its own rows
  float* lse;         // [B, H, Sq] or null; packed [H, total query tokens]
  void* o;            // varlen: a tile that ends past its sequence is stored without TMA
};

// The models' masks (issue 36), read only by a kernel whose problem class has them.
struct MaskParams {
  int window;          // Derived::kWindow: keys a row sees left of its diagonal (kNoWindow: all)
  float softcap_pre;   // kSoftcap: softmax scale / cap; scores become tanh(s x this), and
                       // scale_log2 is cap x log2(e)
  const float* sinks;  // kSinks: [H] one logit per query head (natural log), or null: none
};
// A paged KV cache (issue 37), read only by a paged class's device-scheduled kernel: sequence
// b's key j is row j & (page_size - 1) of page table[b * stride + (j >> shift)].
struct PageParams {
  const int* table;  // the block table
  int stride;        // entries between two sequences' rows
  int shift;         // log2(page_size)
  int box_rows;      // rows per TMA box: min(page_size, Derived::kPageBoxRowsMax)
  int num_pages;     // a page index past the pool: TMA reads its rows as zeros
};

// One task's row of the block table, as the producer's leader lane reads it.
struct PageRow {
  const int* pages;  // the sequence's table row
  int count;         // pages its keys fill: entries past them are never read (a tile past the
                     // last one reads zeros)
  int shift;
  int oob;

  __device__ __forceinline__ int page_of(int key) const {
    const int j = key >> shift;
    return j < count ? __ldg(pages + j) : oob;
  }
};

// pack_gqa (config.cuh, kPackGqa): log2 of P, the query heads a tile's rows interleave (0:
// none), read only by a packing kernel's fixed-length launch. There ShapeInfo counts virtual
// heads (H: Hq / P, group: (Hq / Hkv) / P) and rows (num_m_blocks: of Sq x P rows); row r of
// virtual head vh is query head vh x P + (r & (P - 1)) at position r >> shift.
struct PackParams {
  int shift;
};

// Whether a kernel packs its rows: pack_gqa's fixed-length kernel (Sched::kPacked: the
// device-scheduled one, which runs unpacked).
template <class T, class Sched>
constexpr bool kPackRows = T::kPackGqa && !Sched::kPacked;

// The query head of row `row` of virtual head `head` (PackParams); with head = batch x H +
// virtual head, its [B, Hq] index.
template <class I>
__host__ __device__ __forceinline__ I packed_head(I head, int row, int shift) {
  return (head << shift) + I(row & ((1 << shift) - 1));
}

// A window library called without a window: wide enough that no key falls left of it, small
// enough that row + off - kNoWindow cannot overflow.
constexpr int kNoWindow = 1 << 30;

struct Params {
  LoadParams load;
  StoreParams store;
  ShapeInfo shape;
  float scale_log2;   // log2(e) x softmax scale (softcap: log2(e) x cap)
};

// The kernel's parameters: the above, its scheduler's own (scheduler.cuh: Sched::Params), and
// the models' masks, the pages and pack_gqa's rows last, so a kernel without them reads every other parameter
// where it did before them (and compiles to the same SASS).
template <class Sched>
struct KernelParams : Params {
  typename Sched::Params sched;
  MaskParams mask;
  PageParams page;
  PackParams pack;
};

// The key tiles of a query tile. Causal masks are aligned bottom-right (FlashAttention's rule):
// in a sequence of Sq queries over Sk keys, query row r sees keys 0 .. r + off with off = Sk - Sq
// (0 for a prefill, > 0 for queries over a cached prefix).

// KV tiles that query rows below row_end visit: causal, every key <= the last row's diagonal;
// otherwise every key. At least one: a sequence with no key to see still runs one fully masked
// tile (its rows get O = 0, lse -inf), so every path through the mainloop has a first tile.
template <class T>
__host__ __device__ __forceinline__ int kv_blocks_below(int Sk, int off, int row_end) {
  const int keys = T::kCausal ? min(row_end + off, Sk) : Sk;
  return keys > 0 ? (keys + T::kBlockN - 1) / T::kBlockN : 1;
}

// KV tiles the producer loads for a task (a query tile, or with kv_multicast a pair of them):
// [0, this), or with a sliding window [first_kv_block, this).
template <class T>
__host__ __device__ __forceinline__ int num_kv_blocks(int Sk, int off, int m_block) {
  return kv_blocks_below<T>(Sk, off, (m_block + 1) * T::kRowsPerTask);
}

// Sliding window: the first KV tile that query rows from row_begin on can see (row r sees keys
// from r + off - window); 0 without a window class. Never past the task's last tile `end`.
template <class T>
__host__ __device__ __forceinline__ int first_kv_block(int off, int row_begin, int window,
                                                       int end) {
  if constexpr (!T::kWindow) return 0;
  const int key = row_begin + off - window;
  return key > 0 ? min(key / T::kBlockN, end - 1) : 0;
}

// The key tiles one task visits: [lo, n), tile i's first key base + i x block_n.
struct TaskKeys {
  int base;  // pack_gqa: the task's first key (its first row's window edge); else 0
  int lo;    // a sliding window's first tile (unpacked; packed tiles start at base)
  int n;
};

// kPack (pack_gqa's fixed-length kernel): the task's rows are the positions
// [m_block x block_m, (m_block + 1) x block_m) >> shift, its tiles start at the first key its
// first position sees, so a band of block_m / P + window keys takes as few tiles as it can
// (a tile boundary on a multiple of block_n would add one for most tasks: docs/PERF.md step
// 75). Otherwise tiles sit on multiples of block_n from the window's first.
template <class T, bool kPack>
__host__ __device__ __forceinline__ TaskKeys task_keys(int Sk, int off, int m_block, int window,
                                                       int shift) {
  if constexpr (kPack) {
    const int p0 = (m_block * T::kBlockM) >> shift, p1 = ((m_block + 1) * T::kBlockM) >> shift;
    const int last = T::kCausal ? min(p1 - 1 + off, Sk - 1) : Sk - 1;
    const int first = T::kWindow ? max(0, min(p0 + off - window, last)) : 0;
    return {first, 0, max(last - first, 0) / T::kBlockN + 1};
  } else {
    const int n = num_kv_blocks<T>(Sk, off, m_block);
    return {0, first_kv_block<T>(off, m_block * T::kRowsPerTask, window, n), n};
  }
}

// KV tiles [this, n) of those a warpgroup visits have keys no row of it (positions up to
// last_pos: first_row + 63 unpacked) finds left of its window: below it they need the
// window's mask. base: TaskKeys::base.
template <class T>
__host__ __device__ __forceinline__ int first_unmasked_kv_block(int last_pos, int off,
                                                                int window, int base) {
  if constexpr (!T::kWindow) return 0;
  const int key = last_pos + off - window - base;
  return key > 0 ? (key + T::kBlockN - 1) / T::kBlockN : 0;
}

// A cluster's CTAs are ranked row rank fastest (kv_multicast: which rows of the pair, below),
// then head rank (head_cluster: which query head of the cluster's run it takes).
template <class T>
__device__ __forceinline__ int row_rank() {
  if constexpr (T::kMulticast) return int(cta_rank_in_cluster()) % T::kRowCtas;
  return 0;
}
template <class T>
__device__ __forceinline__ int head_rank() {
  if constexpr (T::kHeadCtas > 1) return int(cta_rank_in_cluster()) / T::kRowCtas;
  return 0;
}

// First query row of warpgroup wg's 64 in task m_block, on the CTA of row rank `rank` (0
// without kv_multicast). With kv_multicast the task's R x W 64-row chunks (R row CTAs, W
// warpgroups each) are dealt as a snake, warpgroup w of rank r taking chunk w R + r for even w
// and w R + R - 1 - r for odd w: every CTA then holds chunks from each band of the task and the
// causal work evens out (W 2: CTA 0 chunks {0, 3}, CTA 1 {1, 2}; W 3: {0, 3, 4} and {1, 2, 5}).
template <class T>
__host__ __device__ __forceinline__ int wg_first_row(int m_block, int wg, int rank) {
  if constexpr (T::kMulticast) {
    constexpr int R = T::kRowCtas;
    const int chunk = wg * R + ((wg & 1) ? R - 1 - rank : rank);
    return m_block * T::kRowsPerTask + 64 * chunk;
  } else {
    return m_block * T::kBlockM + wg * 64;
  }
}

// KV tiles [0, this) of the n a warpgroup visits need no mask: causal, those entirely at or
// below its first query position's diagonal (first_pos: its first row unpacked); otherwise
// those entirely below the key end Sk. base: TaskKeys::base.
template <class T>
__host__ __device__ __forceinline__ int num_unmasked_kv_blocks(int first_pos, int n, int Sk,
                                                               int off, int base) {
  if constexpr (!T::kCausal) return min(n, (Sk - base) / T::kBlockN);
  return max(0, min(n, (first_pos + off + 1 - base) / T::kBlockN));
}

}  // namespace fa_tune
