// Device-scheduled launches (varlen: cu_seqlens_q / cu_seqlens_k; a cache's seqused_k): the
// schedule of a batch of sequences, built from the metadata by one small CTA before the
// attention kernel, on the same stream (no host sync, so CUDA graphs can hold it).
//
// The metadata is checked here, where it is read anyway: offsets from 0, non-decreasing, within
// the tensor's rows (rows past the last are padding); lengths within max_seqlen_q /
// max_seqlen_k; seqused_k within the keys its sequence holds; a paged cache's table entries
// within its pages, and enough of them. A batch that breaks a rule gets no task (the attention
// kernel reads and writes nothing), its o and lse are filled with NaN, and the caller's status
// word says what was wrong (fa_tune.h: FA_TUNE_BAD_*). So no cu_seqlens can make the kernel
// touch memory outside its tensors, and the process's CUDA context survives.
//
// Order: sequences by their costliest query tile, most first (longest-processing-time first
// over one shared counter, at the grain of sequences). A query tile m of a sequence with s_q
// queries over s_k keys visits ceil(min((m + 1) * rows + s_k - s_q, s_k) / block_n) KV tiles
// causal, ceil(s_k / block_n) otherwise, less those left of a sliding window's start. Within a
// sequence its K/V heads are cut into L2 sections (as many as keep their keys in ~60% of L2
// together); a section's tiles go last query tile first, its heads adjacent. So the CTAs
// running at once share a few K/V heads in L2 (query heads of one K/V head read the same
// tiles), and each sequence ends on its cheapest tiles. Ordered by cost alone, 132 CTAs would
// run one query tile of every head of every sequence at once and stream all their K/V from
// HBM (docs/PERF.md step 55). Sequences of equal cost take their places in arrival order,
// which changes no result.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstddef>

#include "fa_tune.h"
#include "params.cuh"

namespace fa_tune {

constexpr int kVarlenPrepThreads = 1024;

// A static deal (clustered configs: VarlenStaticScheduler reads round r's task of cluster c at
// r * clusters + (r odd ? clusters - 1 - c : c)) leaves its CTAs ending over about a task
// (docs/PERF.md step 66: 3.8 % idle at 32/8x[2048:8192*4], the host's static lists 0.4 %). So
// after the snake the schedule kernel evens it: kSwapPasses times, the clusters sorted by load,
// the i-th heaviest paired with the i-th lightest, and in each pair up to kSwapsPerPair swaps of
// tasks, each the one that leaves the two closest among tasks at most kSwapRounds rounds apart
// (so the L2 sections' timing holds; an empty last-round slot is a task of cost 0, swapped only
// within its round). lab/varlen_deal_model.py: 3.8 % -> 0.06 % there, and 29 % -> 0.6 % at eight
// packed sequences of 1024 (there the list's per-sequence sawtooth has the snake's period);
// measured (step 67, H100): tail idle 3.8 -> 0.6 %, that row 1.1 % and the eight 13 % faster.
// A pass takes a block-wide sort and a warp a pair (within noise at a 63 us paged row), so only
// lists of kSwapMinRounds rounds whose heaviest cluster holds kSwapMinGain more than the mean
// (task_list.h's units, ~0.8 us each: step 66's task clocks) pay for it, and the costs of up to
// kSwapMaxSlots list slots wait in shared memory.
constexpr int kSwapPasses = 4, kSwapsPerPair = 4, kSwapRounds = 2;
constexpr int kSwapMinRounds = 4, kSwapMinGain = 16, kSwapMaxSlots = 16384;
constexpr int kMaxSwapClusters = 512;  // bounds the workspace's slots past the list

// What the schedule kernel reads and checks (fa_tune.h, device metadata), and where it writes
// NaN when the metadata is bad.
struct VarlenMeta {
  const int* cu_q = nullptr;      // [num_seqs + 1] or null: q per batch entry, max_q rows
  const int* cu_k = nullptr;      // [num_seqs + 1] or null: k/v per batch entry, max_k rows
  const int* seqused_k = nullptr; // [num_seqs] or null
  int total_q = 0, total_k = 0;   // rows of the packed q, k/v (with cu_q, cu_k)
  int max_q = 0, max_k = 0;       // seqlen_q, seqlen_k
  const int* block_table = nullptr;  // a paged cache's table, or null (fa_tune.h)
  int block_table_stride = 0, max_pages = 0, page_size = 0, num_pages = 0;
  int* status = nullptr;          // the caller's int32[2], or null
  void* o = nullptr;              // BF16, o_elems
  long long o_elems = 0;
  float* lse = nullptr;           // lse_elems, or null
  long long lse_elems = 0;
};

// Workspace: the tile counter (16 bytes, so the tasks stay 16-byte aligned), then the tasks.
struct VarlenPlan {
  int num_seqs = 0, heads = 0, group = 1, rows_per_tile = 0;  // group: Hq / Hkv
  int block_n = 0;
  bool causal = true;
  int window = kNoWindow;  // a window class's call: keys a row sees left of its diagonal
  int max_tiles = 0;   // query tiles of the longest sequence allowed by max_seqlen_q
  int max_cost = 1;    // KV tiles of the costliest tile: ceil(max_seqlen_k / block_n), >= 1
  long long bound = 0; // task slots: heads * the batch's query tiles at most
  // An L2 section's budget: key rows x K/V heads whose K and V fit in ~60% of L2 (set by the
  // launcher per device; the maximum: one section per sequence).
  int section_keys = INT_MAX;
  // A static deal (VarlenStaticScheduler; else a counter reads the list in order): the cost a
  // task adds beside its KV tiles (Cfg::fixed_cost, task_list.h's units), and the attention
  // grid's clusters where the launch evens its deal (0: the snake as it is).
  bool static_deal = false;
  int fixed_cost = 0, clusters = 0;

  // packed_q: q is packed by cu_seqlens_q over total_q rows (else max_q rows per sequence).
  static VarlenPlan make(int num_seqs, int heads, int group, bool packed_q, int total_q,
                         int max_q, int max_k, int rows, int block_n, bool causal,
                         int window = kNoWindow) {
    VarlenPlan v;
    v.window = window;
    v.num_seqs = num_seqs;
    v.heads = heads;
    v.group = group;
    v.rows_per_tile = rows;
    v.block_n = block_n;
    v.causal = causal;
    v.max_tiles = (max_q + rows - 1) / rows;
    v.max_cost = max_k > 0 ? (max_k + block_n - 1) / block_n : 1;
    // sum of ceil(len / rows) <= total / rows + num_seqs, and <= num_seqs * max_tiles.
    const long long by_max = (long long)num_seqs * v.max_tiles;
    const long long by_total = packed_q ? (long long)total_q / rows + num_seqs : by_max;
    v.bound = (long long)heads * (by_total < by_max ? by_total : by_max);
    return v;
  }
  // Task slots of the workspace: an evened deal moves tasks into its last round's empty slots,
  // up to a round past the list's bound. The host's size needs no device, so it counts the
  // most clusters that deal takes.
  __host__ __device__ long long slots() const {
    return static_deal ? bound + kMaxSwapClusters : bound;
  }
  // The slots this launch reads: as before without an evened deal.
  __host__ __device__ long long read_slots() const {
    return clusters > 0 ? bound + clusters : bound;
  }
  size_t workspace_bytes() const { return 16 + size_t(slots()) * sizeof(VarlenTask); }
  // Shared memory of the schedule kernel: the tile starts (num_seqs + 1), the cost histogram
  // (max_cost + 1), the scan's warp sums (32), the flags (2) and each sequence's first task
  // (num_seqs); an evened deal adds each cluster's load and rank (8-byte keys) and each slot's
  // cost (2 bytes).
  size_t prep_smem_bytes() const {
    const size_t ints = size_t(num_seqs) * 2 + 1 + size_t(max_cost) + 1 + 32 + 2;
    if (clusters == 0) return ints * sizeof(int);
    return ints * sizeof(int) + size_t(clusters) * (sizeof(long long) + sizeof(int)) +
           size_t(read_slots()) * sizeof(unsigned short) + 2 * sizeof(long long);  // + total, max
  }
  // K/V heads (task heads: plan.group of them per K/V head) per L2 section of a sequence with
  // k_len keys, out of kv_heads.
  __host__ __device__ int section_kv_heads(int k_len, int kv_heads) const {
    const int per = section_keys / (k_len > 0 ? k_len : 1);
    return per < 1 ? 1 : per > kv_heads ? kv_heads : per;
  }
};

// One sequence's place in the tensors, and what is wrong with its metadata (FA_TUNE_BAD_*).
struct SeqSpan {
  int q_start, q_len, q_batch, k_start, k_len, kv_batch, bad;
};

__device__ __forceinline__ SeqSpan seq_span(const VarlenMeta& m, int b, int B) {
  SeqSpan s{0, m.max_q, b, 0, m.max_k, b, 0};
  if (m.cu_q != nullptr) {
    const int a = m.cu_q[b], c = m.cu_q[b + 1];
    s = {a, c - a, 0, 0, m.max_k, b, 0};
    // Rows past the last entry are padding (a CUDA graph's fixed batch, as FlashAttention
    // allows): never read or written.
    if (a < 0 || c < a || c > m.total_q || (b == 0 && a != 0))
      s.bad |= FA_TUNE_BAD_CU_SEQLENS_Q;
    else if (c - a > m.max_q)
      s.bad |= FA_TUNE_BAD_MAX_SEQLEN_Q;
  }
  bool bad_k = false;
  if (m.cu_k != nullptr) {
    const int a = m.cu_k[b], c = m.cu_k[b + 1];
    s.k_start = a;
    s.k_len = c - a;
    s.kv_batch = 0;
    bad_k = a < 0 || c < a || c > m.total_k || (b == 0 && a != 0);
    if (bad_k) s.bad |= FA_TUNE_BAD_CU_SEQLENS_K;
  }
  if (m.seqused_k != nullptr && !bad_k) {
    const int u = m.seqused_k[b];
    if (u < 0 || u > s.k_len)
      s.bad |= FA_TUNE_BAD_SEQUSED_K;
    else
      s.k_len = u;
  }
  if (!bad_k && s.k_len > m.max_k) s.bad |= FA_TUNE_BAD_MAX_SEQLEN_K;
  if (m.block_table != nullptr && s.bad == 0 &&
      (long long)m.max_pages * m.page_size < s.k_len)  // its keys need more pages than a row
    s.bad |= FA_TUNE_BAD_BLOCK_TABLE;
  return s;
}

// A paged cache: whether entry j of sequence b's table row, which its keys need, lies outside
// the pool (entries past its pages are never read, so they may hold anything).
__device__ __forceinline__ bool bad_page(const VarlenMeta& m, int b, int j, int k_len) {
  if (j * (long long)m.page_size >= k_len) return false;
  const int page = m.block_table[(long long)b * m.block_table_stride + j];
  return page < 0 || page >= m.num_pages;
}

// One past the last KV tile query tile m of a sequence visits (params.cuh's num_kv_blocks, on
// the plan): what the producer loads from (VarlenTask::kv_tiles).
__device__ __forceinline__ int tile_end(const VarlenPlan& plan, const SeqSpan& s, int m) {
  const int keys = plan.causal ? min((m + 1) * plan.rows_per_tile + s.k_len - s.q_len, s.k_len)
                               : s.k_len;
  const int c = keys > 0 ? (keys + plan.block_n - 1) / plan.block_n : 1;
  return min(c, plan.max_cost);
}

// The KV tiles it visits, the order's cost: tile_end less those left of a window's start
// (params.cuh's first_kv_block; the plan's window is kNoWindow without one).
__device__ __forceinline__ int tile_cost(const VarlenPlan& plan, const SeqSpan& s, int m) {
  const int end = tile_end(plan, s, m);
  const int key = m * plan.rows_per_tile + s.k_len - s.q_len - plan.window;
  return key > 0 ? end - min(key / plan.block_n, end - 1) : end;
}

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

// a[i] <- sum of a[k] for k < i, over n entries (exclusive prefix sum), whole block.
__device__ __forceinline__ void prefix_sum(int* a, int n, int* warp_sums) {
  const int per = (n + int(blockDim.x) - 1) / int(blockDim.x);
  const int lo = min(n, int(threadIdx.x) * per), hi = min(n, lo + per);
  int sum = 0;
  for (int i = lo; i < hi; ++i) sum += a[i];
  int run = block_exclusive_sum(sum, warp_sums);
  for (int i = lo; i < hi; ++i) {
    const int v = a[i];
    a[i] = run;
    run += v;
  }
  __syncthreads();
}

// The evened deal (kSwapPasses, above): load[c] holds cluster c's work, slot_cost[pos] each
// slot's cost (0: empty; empty slots lie in the last round only and stay there); swaps move the
// tasks themselves. A pass: the clusters sorted by load (keys distinct: the cluster's index in
// the low bits), then a warp per pair of the i-th lightest and the i-th heaviest.
__device__ __forceinline__ void even_deal(VarlenTask* tasks, long long* load, int* by_load,
                                          unsigned short* slot_cost, int G, int R) {
  constexpr int kSpan = 2 * kSwapRounds + 1;  // candidate rounds of the light cluster per task
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid % 32;
  const int warp = tid / 32, n_warps = nt / 32;
  auto pos_of = [G](int c, int r) { return r * G + ((r & 1) ? G - 1 - c : c); };
  for (int pass = 0; pass < kSwapPasses; ++pass) {
    for (int c = tid; c < G; c += nt) {
      const long long k = load[c] << 10 | c;
      int r = 0;
      for (int d = 0; d < G; ++d) r += (load[d] << 10 | d) < k;
      by_load[r] = c;
    }
    __syncthreads();
    for (int i = warp; i < G / 2; i += n_warps) {
      const int lo = by_load[i], hi = by_load[G - 1 - i];
      long long l_lo = load[lo], l_hi = load[hi];
      for (int s = 0; s < kSwapsPerPair; ++s) {
        const long long gap = l_hi - l_lo;
        unsigned best = UINT_MAX;
        for (int j = lane; j < R * kSpan; j += 32) {
          const int rh = j / kSpan, rl = rh + j % kSpan - kSwapRounds;
          if (rl < 0 || rl >= R) continue;
          const int a = slot_cost[pos_of(hi, rh)], b = slot_cost[pos_of(lo, rl)];
          const int d = a - b;
          if (a == 0 || (b == 0 && rh != rl) || d <= 0) continue;
          const long long score = llabs(gap - 2LL * d);
          if (score < gap)
            best = min(best, unsigned(min(score, (1LL << 20) - 1)) << 12 | unsigned(j));
        }
        best = __reduce_min_sync(~0u, best);
        if (best == UINT_MAX) break;
        const int j = int(best & 0xfffu), rh = j / kSpan, rl = rh + j % kSpan - kSwapRounds;
        const int ph = pos_of(hi, rh), pl = pos_of(lo, rl);
        const int d = int(slot_cost[ph]) - int(slot_cost[pl]);
        __syncwarp();  // every lane has read the costs before lane 0 swaps them
        if (lane == 0) {
          const VarlenTask th = tasks[ph], tl = tasks[pl];
          tasks[ph] = tl;
          tasks[pl] = th;
          const unsigned short ch = slot_cost[ph];
          slot_cost[ph] = slot_cost[pl];
          slot_cost[pl] = ch;
        }
        __syncwarp();
        l_hi -= d;
        l_lo += d;
      }
      if (lane == 0) {
        load[hi] = l_hi;
        load[lo] = l_lo;
      }
    }
    __syncthreads();
  }
}

}  // namespace varlen_detail

// One CTA of kVarlenPrepThreads. A template, so only a build with the varlen kernel compiles
// it, and the bucket kernels of a workload library share one copy. Writes tasks[0, bound): the
// tiles in order, then m_block -1 past the last; zeroes the tile counter the attention kernel's
// CTAs take numbers from.
template <int kThreads = kVarlenPrepThreads>
__global__ void __launch_bounds__(kThreads, 1)
    varlen_prepare_kernel(VarlenMeta meta, VarlenPlan plan, VarlenTask* tasks, int* counter) {
  using namespace varlen_detail;
  extern __shared__ long long prep_smem[];  // 8-byte aligned: an evened deal's loads first
  // The attention kernel may launch now (PDL): its prologue overlaps this kernel, and it waits
  // (griddepcontrol.wait) for all of this kernel's writes before reading them.
  asm volatile("griddepcontrol.launch_dependents;");
  const int B = plan.num_seqs, H = plan.heads, C = plan.max_cost, G = plan.clusters;
  long long* load = prep_smem;    // [G + 2]: an evened deal's work per cluster, total, most
  // [B + 1]: each sequence's first tile, then the total
  int* tstart = reinterpret_cast<int*>(load + (G > 0 ? G + 2 : 0));
  int* at_cost = tstart + B + 1;  // [C + 1]: tiles per cost, then each cost's next position
  int* warp_sums = at_cost + C + 1;  // [32]
  int* flags = warp_sums + 32;    // [2]: FA_TUNE_BAD_* bits, the first bad sequence
  int* seq_base = flags + 2;      // [B]: each sequence's first task
  int* by_load = seq_base + B;    // [G]: clusters, least work first
  auto* slot_cost = reinterpret_cast<unsigned short*>(by_load + G);  // [read_slots]: 0 empty
  const int tid = threadIdx.x, nt = blockDim.x;

  if (tid == 0) {
    *counter = 0;
    flags[0] = 0;
    flags[1] = INT_MAX;
  }
  for (int i = tid; i <= C; i += nt) at_cost[i] = 0;
  for (int i = tid; G > 0 && i <= G + 1; i += nt) load[i] = 0;
  __syncthreads();
  // 1. Check every sequence; count its query tiles.
  for (int b = tid; b < B; b += nt) {
    const SeqSpan s = seq_span(meta, b, B);
    if (s.bad != 0) {
      atomicOr(&flags[0], s.bad);
      atomicMin(&flags[1], b);
    }
    tstart[b] = s.bad != 0 ? 0 : (s.q_len + plan.rows_per_tile - 1) / plan.rows_per_tile;
  }
  // A paged cache's table entries, all threads over all rows (a sequence may have hundreds).
  if (meta.block_table != nullptr) {
    for (long long i = tid; i < (long long)B * meta.max_pages; i += nt) {
      const int b = int(i / meta.max_pages), j = int(i % meta.max_pages);
      const SeqSpan s = seq_span(meta, b, B);
      if (s.bad == 0 && bad_page(meta, b, j, s.k_len)) {
        atomicOr(&flags[0], FA_TUNE_BAD_BLOCK_TABLE);
        atomicMin(&flags[1], b);
      }
    }
  }
  if (tid == 0) tstart[B] = 0;
  __syncthreads();
  if (flags[0] != 0) {  // bad metadata: no task, NaN outputs, and say why
    if (tid == 0 && meta.status != nullptr) {
      if (meta.status[0] == 0) meta.status[1] = flags[1];
      meta.status[0] |= flags[0];
    }
    for (long long t = tid; t < plan.read_slots(); t += nt)
      tasks[t] = VarlenTask{-1, 0, 0, 0, 0, 0, 0, 0};
    const uint4 nan8 = make_uint4(0x7FC07FC0u, 0x7FC07FC0u, 0x7FC07FC0u, 0x7FC07FC0u);
    for (long long i = tid; i < meta.o_elems / 8; i += nt) static_cast<uint4*>(meta.o)[i] = nan8;
    if (meta.lse != nullptr)
      for (long long i = tid; i < meta.lse_elems; i += nt) meta.lse[i] = __int_as_float(0x7FC00000);
    return;
  }
  prefix_sum(tstart, B + 1, warp_sums);  // tstart[b] = tiles before sequence b; [B] = all
  const int num_tiles = tstart[B];
  // The sequence of tile i: the last b with tstart[b] <= i (sequences without tiles repeat a
  // start; the search lands on the one that has tile i).
  auto tile_at = [&](int i, int& m) {
    int lo = 0, hi = B - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (tstart[mid] <= i) lo = mid; else hi = mid - 1;
    }
    m = i - tstart[lo];
    return lo;
  };
  // 2. Sequences by their costliest tile (the last: causal tiles cost more as m grows; the
  // others' all about the same): a histogram of their tasks, then each sequence's first task.
  // seq_base[b] holds the sequence's cost until it is turned into its first task.
  for (int b = tid; b < B; b += nt) {
    const int tiles = tstart[b + 1] - tstart[b];
    if (tiles > 0) {
      seq_base[b] = tile_cost(plan, seq_span(meta, b, B), tiles - 1);
      atomicAdd(&at_cost[seq_base[b]], tiles * H);
    }
  }
  __syncthreads();
  suffix_sum(at_cost, C + 1, warp_sums);  // at_cost[c] = tasks of sequences costing more than c
  for (int b = tid; b < B; b += nt) {
    const int tiles = tstart[b + 1] - tstart[b];
    if (tiles > 0) seq_base[b] = atomicAdd(&at_cost[seq_base[b]], tiles * H);
  }
  __syncthreads();
  // 3. Each tile's tasks in its sequence's range: its L2 section's heads [h0, h0 + hn), in
  // which the tile's rank (last tile first) picks a run of hn adjacent heads.
  const int kv_heads = (H + plan.group - 1) / plan.group;
  for (int i = tid; i < num_tiles; i += nt) {
    int m;
    const int b = tile_at(i, m);
    const SeqSpan s = seq_span(meta, b, B);
    const int tiles = tstart[b + 1] - tstart[b], rank = tiles - 1 - m;
    const int per = plan.section_kv_heads(s.k_len, kv_heads) * plan.group;  // heads per section
    const int end = tile_end(plan, s, m);  // = params.cuh's num_kv_blocks for the task
    // An evened deal's cost: task_list.h's units (each KV tile once per consumer warpgroup).
    const int cost = G > 0 ? 2 * tile_cost(plan, s, m) + plan.fixed_cost : 0;
    for (int h = 0; h < H; ++h) {
      const int h0 = h / per * per, hn = min(H - h0, per);
      const long long pos = seq_base[b] + (long long)h0 * tiles + (long long)rank * hn + (h - h0);
      tasks[pos] = VarlenTask{m, h | (h / plan.group) << 16, s.q_start, s.q_len,
                              s.k_start, s.k_len, s.q_batch | s.kv_batch << 16, end};
      if (G > 0) {  // its cluster: the snake's column of round pos / G
        const int r = int(pos / G), j = int(pos % G);
        slot_cost[pos] = (unsigned short)min(cost, 0xffff);
        atomicAdd(reinterpret_cast<unsigned long long*>(&load[(r & 1) ? G - 1 - j : j]),
                  (unsigned long long)cost);
      }
    }
    if (G > 0)
      atomicAdd(reinterpret_cast<unsigned long long*>(&load[G]), (unsigned long long)cost * H);
  }
  const long long N = (long long)num_tiles * H;
  for (long long t = N + tid; t < plan.read_slots(); t += nt) {
    tasks[t] = VarlenTask{-1, 0, 0, 0, 0, 0, 0, 0};
    if (G > 0) slot_cost[t] = 0;
  }
  if (G == 0) return;
  __syncthreads();
  // 4. An evened deal (kSwapPasses: varlen_detail::even_deal), where it pays.
  for (int c = tid; c < G; c += nt)
    atomicMax(reinterpret_cast<unsigned long long*>(&load[G + 1]), (unsigned long long)load[c]);
  __syncthreads();
  const long long R = (N + G - 1) / G;
  if (R >= kSwapMinRounds && load[G + 1] - load[G] / G >= kSwapMinGain &&
      R * (2 * kSwapRounds + 1) <= 4096)
    even_deal(tasks, load, by_load, slot_cost, G, int(R));
}

}  // namespace fa_tune
