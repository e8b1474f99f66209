// Which query tile (m_block, head, batch) each CTA works on, and in what order.
//
// Each scheduler owns its device parameters (`Params`, in KernelParams::sched), its host-side
// setup (`prepare`: once per shape, outside any timed region) and its grid (`grid`); the
// launcher (launch.cuh) only calls them. Every scheduler gives both roles the same sequence of
// tiles, starting with `first`. The
// consumers ask `next` at the start of each tile. The producer asks in two steps: `ticket`
// right after issuing the current tile's Q load, before any K/V load can block on a full ring
// (the dynamic scheduler's handshake), and `resolve` after the loads, so only one int, not a
// second TileCoord, stays live across them: the persistent producer runs on 40 registers and
// spilled otherwise.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "config.cuh"
#include "device_pass.cuh"
#include "errors.cuh"
#include "params.cuh"
#include "task_list.h"

namespace fa_tune {

constexpr int kSchedulerBar = 1;  // named barrier: producer warp -> consumers (dynamic only)
// The share of L2 an L2 section's K and V may fill (the dynamic scheduler's sections, the
// device-side schedule's: varlen.cuh); the rest holds Q, O and other traffic.
constexpr double kL2SectionShare = 0.6;

// What a fixed-length scheduler's host-side setup is given: the shape, the device, and the
// CTAs a persistent launch may use (whole clusters that fit at once; launch.cuh).
struct FixedShape {
  int B, H, Sq, Sk;
  int device;
  int persistent_ctas;
  int window = kNoWindow;  // a window class's call: its window (the cost model counts it)
  int pack_shift = 0;      // pack_gqa: log2 P (params.cuh, PackParams): tasks are over
                           // Sq x P rows of Hq / P virtual heads

  int rows() const { return Sq << pack_shift; }
  int heads() const { return H >> pack_shift; }
  // Query tiles of block_m rows per (batch, head), and in the whole launch.
  int m_blocks(int block_m) const { return int(((long long)rows() + block_m - 1) / block_m); }
  long long num_tiles(int block_m) const { return (long long)m_blocks(block_m) * heads() * B; }
};

// Fixed length: every tile's sequence is its batch entry's Sq query rows over Sk keys, from
// row 0. What the three fixed-length schedulers share:
struct FixedTiles {
  static constexpr bool kPacked = false;  // varlen: sequences packed along the rows
  __device__ static int seq_start(const TileCoord&) { return 0; }
  __device__ static int seq_len(const Params& p, const TileCoord&) { return p.shape.Sq; }
  __device__ static int key_start(const TileCoord&) { return 0; }
  __device__ static int key_len(const Params& p, const TileCoord&) { return p.shape.Sk; }
  __device__ static int kv_batch(const TileCoord& t) { return t.batch; }
  // GQA / MQA: query head h reads K/V head h / group.
  __device__ static int kv_head(const Params& p, const TileCoord& t) {
    return Hooks::interleave_kv_heads ? t.head % p.shape.Hkv : t.head / p.shape.group;
  }
};

// Non-persistent: one CTA per query tile, grid (m tiles, heads, batch). Within a head the
// blocks are launched longest first (the last query rows visit the most KV tiles) or in
// natural order; heads stay adjacent so a wave shares K/V in L2. head_cluster: clusters run
// along y, so a cluster's CTAs take one query tile of adjacent heads of one K/V group.
template <class Cfg>
struct GridScheduler : FixedTiles {
  static constexpr bool kPersistent = false;
  struct Params {};
  static cudaError_t prepare(const FixedShape&, Params&, int& /*ctas*/) { return cudaSuccess; }
  static dim3 grid(const ShapeInfo& shape, int /*ctas*/) {
    return dim3(shape.num_m_blocks, shape.H, shape.B);
  }
  static cudaError_t before_launch(const Params&, cudaStream_t) { return cudaSuccess; }

  __device__ static TileCoord first(const fa_tune::Params& p, int* /*slot*/) {
    const int x = blockIdx.x;
    const int m = Cfg::tile_order == TileOrder::LongestFirst ? p.shape.num_m_blocks - 1 - x : x;
    return {m, int(blockIdx.y), int(blockIdx.z), 0, 0, true};
  }
  __device__ static TileCoord next(const fa_tune::Params&, const TileCoord&, int* /*slot*/) {
    return {0, 0, 0, 0, 0, false};
  }
  __device__ static int ticket(const fa_tune::Params&, const TileCoord&, int* /*slot*/) {
    return 0;
  }
  __device__ static TileCoord resolve(const fa_tune::Params&, int, const TileCoord&, const int*) {
    return {0, 0, 0, 0, 0, false};
  }
};

// S_k - S_q in block_m units (rounded to nearest): the extra KV tiles' worth every causal
// task visits over a prefill's, in the static scheduler's cost model (task_list.h).
template <class T>
int kv_shift(int Sq, int Sk) {
  const int off = Sk - Sq, half = T::kBlockM / 2;
  return off >= 0 ? (off + half) / T::kBlockM : -((-off + half) / T::kBlockM);
}

// A sliding window in block_m units (rounded up), -1 without one: the cost model's cap.
template <class T>
int window_tiles(int window) {
  return window >= kNoWindow ? -1 : (window + T::kBlockM - 1) / T::kBlockM;
}

// Persistent, static: CTA i walks the host-built list tasks[offsets[i] .. offsets[i+1]).
// In clusters the lists are per cluster (its CTAs are consecutive in x): with kv_multicast a
// task is a pair of query tiles, with head_cluster a run of head_cluster query heads.
template <class Cfg>
struct StaticScheduler : FixedTiles {
  using T = Derived<Cfg>;
  static constexpr bool kPersistent = true;
  struct Params {
    const uint32_t* tasks;    // packed tasks, all CTAs' (clusters') lists concatenated
    const int* offsets;       // list i is tasks[offsets[i], offsets[i+1])
    uint32_t m_bits, h_bits;  // packing widths (task_list.h)
  };

  // The lists, dealt on the host by the cost model (task_list.h) and uploaded once.
  static cudaError_t prepare(const FixedShape& s, Params& out, int& ctas) {
    const int rows = s.rows();
    const int num_m = s.m_blocks(T::kBlockM);
    TaskLists lists;
    // Per cluster: kv_multicast pairs query tiles, head_cluster runs of heads.
    const int num_tasks_m = (num_m + T::kRowCtas - 1) / T::kRowCtas;
    // The last task's 64-row chunks in the sequence (at most kRowsPerTask / 64); its busiest
    // CTA holds ceil(/ kRowCtas) of them, so at most kConsumerWGs (wg_first_row deals a pair's
    // chunks evenly). With kWgSkip the others idle.
    const int last_chunks = (rows - (num_tasks_m - 1) * T::kRowsPerTask + 63) / 64;
    const int last_busy = T::kWgSkip ? (last_chunks + T::kRowCtas - 1) / T::kRowCtas
                                     : T::kConsumerWGs;
    // pack_gqa: the cost model's keys are rows, P to a key, so the diagonal's offset and the
    // window scale by P (a task's tiles keep their ratios; the fixed cost weighs P times less).
    const int shift = s.pack_shift;
    const int window = s.window >= kNoWindow
                           ? kNoWindow
                           : int(std::min<long long>((long long)s.window << shift, kNoWindow - 1));
    const std::string why = build_task_lists(s.B, s.heads() / T::kHeadCtas, num_tasks_m,
                                             ctas / T::kClusterSize, Cfg::fixed_cost, lists,
                                             T::kRowCtas, T::kCausal, last_busy,
                                             T::kConsumerWGs,
                                             kv_shift<T>(rows, rows + ((s.Sk - s.Sq) << shift)),
                                             window_tiles<T>(window));
    if (!why.empty()) return fail(cudaErrorInvalidValue, why);
    uint32_t* d_tasks = nullptr;
    int* d_offsets = nullptr;
    const size_t tb = lists.tasks.size() * sizeof(uint32_t);
    const size_t ob = lists.offsets.size() * sizeof(int32_t);
    cudaError_t e;
    if ((e = cudaMalloc(&d_tasks, tb)) != cudaSuccess ||
        (e = cudaMalloc(&d_offsets, ob)) != cudaSuccess ||
        (e = cudaMemcpy(d_tasks, lists.tasks.data(), tb, cudaMemcpyHostToDevice)) != cudaSuccess ||
        (e = cudaMemcpy(d_offsets, lists.offsets.data(), ob, cudaMemcpyHostToDevice)) != cudaSuccess)
      return fail_cuda(e, "uploading task lists");
    out = Params{d_tasks, d_offsets, lists.packing.m_bits, lists.packing.h_bits};
    return cudaSuccess;
  }
  static dim3 grid(const ShapeInfo&, int ctas) { return dim3(ctas); }
  static cudaError_t before_launch(const Params&, cudaStream_t) { return cudaSuccess; }

  __device__ static int list() { return int(blockIdx.x) / Derived<Cfg>::kClusterSize; }
  __device__ static TileCoord at(const KernelParams<StaticScheduler>& p, int idx) {
    if (idx >= p.sched.offsets[list() + 1]) return {0, 0, 0, idx, 0, false};
    const uint32_t t = p.sched.tasks[idx];
    const int m = int(t & ((1u << p.sched.m_bits) - 1u));
    const int h = int((t >> p.sched.m_bits) & ((1u << p.sched.h_bits) - 1u));
    const int b = int(t >> (p.sched.m_bits + p.sched.h_bits));
    // head_cluster: the list names the cluster's run of heads; each CTA takes its own.
    return {m, h * Derived<Cfg>::kHeadCtas + head_rank<Derived<Cfg>>(), b, idx, 0, true};
  }
  __device__ static TileCoord first(const KernelParams<StaticScheduler>& p, int* /*slot*/) {
    return at(p, p.sched.offsets[list()]);
  }
  __device__ static TileCoord next(const KernelParams<StaticScheduler>& p, const TileCoord& cur,
                                   int* /*slot*/) {
    return at(p, cur.idx + 1);
  }
  __device__ static int ticket(const KernelParams<StaticScheduler>&, const TileCoord& cur,
                               int* /*slot*/) {
    return cur.idx + 1;
  }
  __device__ static TileCoord resolve(const KernelParams<StaticScheduler>& p, int idx,
                                      const TileCoord&, const int*) {
    return at(p, idx);
  }
};

// Persistent, dynamic: a global counter hands out tile numbers; the producer warp takes the
// next number and publishes its tile in shared memory; consumers read it behind a named barrier.
// Two slots alternate, although the Q handoff already keeps the producer at most one tile
// ahead of the consumers' reads.
// Order: the (batch, head) pairs are cut into L2 sections of section_heads pairs whose K and V
// fit in L2 together (sized on the host); within a section tiles go heaviest first (every
// pair's last query tile, then the ones before), so the CTAs running at once share a few
// heads' K/V in L2 and the launch ends on the cheapest tiles. Without sections, 132 CTAs
// would stream 132 different heads' K/V from HBM.
template <class Cfg>
struct DynamicScheduler : FixedTiles {
  using T = Derived<Cfg>;
  using KP = KernelParams<DynamicScheduler>;
  static constexpr bool kPersistent = true;
  static constexpr uint32_t kBarThreads = 32 + Derived<Cfg>::kConsumerThreads;
  struct Params {
    int* tile_counter;  // next tile to hand out (zeroed before each launch)
    int num_tiles;      // query tiles over all heads and batches
    int section_heads;  // (batch, head) pairs per L2 section (>= 1)
  };

  // The counter, the tile count and the L2 sections: as many (batch, head) pairs as keep
  // their K and V within ~60% of L2 (the rest holds Q, O and other traffic).
  static cudaError_t prepare(const FixedShape& s, Params& out, int& ctas) {
    const long long num_tiles = s.num_tiles(T::kBlockM);
    cudaError_t e;
    if ((e = cudaMalloc(&out.tile_counter, sizeof(int))) != cudaSuccess)
      return fail_cuda(e, "allocating the tile counter");
    ctas = int(std::min<long long>(ctas, num_tiles));
    int l2_bytes = 0;
    if ((e = cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, s.device)) != cudaSuccess)
      return fail_cuda(e, "cudaDeviceGetAttribute");
    const double kv_bytes = 2.0 * s.Sk * T::kHeadDim * 2;  // K and V rows, BF16
    out.num_tiles = int(num_tiles);
    out.section_heads =
        int(std::clamp<double>(std::floor(kL2SectionShare * l2_bytes / kv_bytes), 1.0,
                               double(s.B) * s.heads()));
    return cudaSuccess;
  }
  static dim3 grid(const ShapeInfo&, int ctas) { return dim3(ctas); }
  // The counter starts where the grid's first tiles end; zeroed on the launch's stream.
  static cudaError_t before_launch(const Params& sp, cudaStream_t stream) {
    const cudaError_t e = cudaMemsetAsync(sp.tile_counter, 0, sizeof(int), stream);
    return e == cudaSuccess ? e : fail_cuda(e, "resetting the tile counter");
  }

  // Tile number t as (m_block, head, batch, t); m_block -1 past the last tile. Three integer
  // divisions by run-time values: the producer's lane 0 does them once per tile and publishes
  // the result, so the consumers' chain between two tasks holds none (they were 12 % of its
  // samples at 3-tile tasks: docs/PERF.md step 65).
  __device__ static int4 decode(const KP& p, int t) {
    if (t >= p.sched.num_tiles) return make_int4(-1, 0, 0, t);
    const int num_m = p.shape.num_m_blocks;
    const int group = p.sched.section_heads;
    const int section = t / (group * num_m);
    const int r = t - section * group * num_m;
    const int heads_here = min(group, p.shape.H * p.shape.B - section * group);  // last: fewer
    const int m = num_m - 1 - r / heads_here;
    const int bh = section * group + r % heads_here;
    return make_int4(m, bh % p.shape.H, bh / p.shape.H, t);
  }
  __device__ static TileCoord coord(const int4& w, int turn) {
    return {w.x, w.y, w.z, w.w, turn, w.x >= 0};
  }
  __device__ static TileCoord first(const KP& p, int* /*slot*/) {
    return coord(decode(p, int(blockIdx.x)), 0);
  }
  // Consumers (every consumer thread): read the tile the producer published.
  __device__ static TileCoord next(const KP&, const TileCoord& cur, int* slot) {
    named_barrier_sync(kBarThreads, kSchedulerBar);
    return coord(reinterpret_cast<const int4*>(slot)[cur.turn & 1], cur.turn + 1);
  }
  // Producer warp (all 32 lanes): take the next number, publish its tile to the consumers.
  __device__ static int ticket(const KP& p, const TileCoord& cur, int* slot) {
    int t;
    if ((threadIdx.x & 31) == 0) {
      t = atomicAdd(p.sched.tile_counter, 1) + int(gridDim.x);
      reinterpret_cast<int4*>(slot)[cur.turn & 1] = decode(p, t);
    }
    __syncwarp();
    named_barrier_arrive(kBarThreads, kSchedulerBar);
    return __shfl_sync(0xffffffffu, t, 0);
  }
  // The producer reads back what its lane 0 published (the consumers never write the slot).
  __device__ static TileCoord resolve(const KP&, int, const TileCoord& cur, const int* slot) {
    return coord(reinterpret_cast<const int4*>(slot)[cur.turn & 1], cur.turn + 1);
  }
};

// Device-scheduled (varlen, cu_seqlens / seqused_k): the tiles of every sequence, in the order
// a small kernel wrote them on the device (varlen.cuh: the most KV tiles first across all
// sequences; with kv_multicast a task is a pair of query tiles). Tile coordinates are
// sequence-local; the task places them in the tensors (packed: batch 0 and the rows from the
// sequence's start; a per-sequence cache: its batch entry). What both schedulers share:
struct VarlenTiles {
  static constexpr bool kPersistent = true;
  static constexpr bool kPacked = true;
  // The launcher fills these from the call's workspace (launch.cuh, forward_scheduled), where
  // the schedule kernel (varlen.cuh) writes the task list and zeroes the counter.
  struct Params {
    const VarlenTask* tasks;  // the tiles in order, built on the device
    int* tile_counter;        // the dynamic one's next list position
    int num_tiles;            // a bound on the list's length (past the end: m_block < 0)
  };
  // Persistent, and no more clusters than there are tasks.
  static dim3 grid(int ctas, int cluster_size, long long bound) {
    return dim3(unsigned(std::min<long long>(ctas / cluster_size, bound) * cluster_size));
  }
  __device__ static int seq_start(const TileCoord& t) { return t.start; }
  __device__ static int seq_len(const fa_tune::Params&, const TileCoord& t) { return t.len; }
  __device__ static int key_start(const TileCoord& t) { return t.k_start; }
  __device__ static int key_len(const fa_tune::Params&, const TileCoord& t) { return t.k_len; }
  __device__ static int kv_batch(const TileCoord& t) { return t.kv_batch; }
  __device__ static int kv_head(const fa_tune::Params&, const TileCoord& t) { return t.kv_head; }
  __device__ static TileCoord from_task(const VarlenTask& w, int t, int turn) {
    return {w.m_block, w.heads & 0xffff, w.batches & 0xffff, t, turn, w.m_block >= 0, w.start,
            w.len, w.k_start, w.k_len, w.heads >> 16, w.batches >> 16, w.kv_tiles};
  }
  template <class KP>
  __device__ static VarlenTask task(const KP& p, int t) {
    if (t >= p.sched.num_tiles) return {-1, 0, 0, 0, 0, 0, 0, 0};
    return p.sched.tasks[t];
  }
};

// Varlen, dynamic: a global counter hands out list positions. The producer warp takes a
// number, reads its task and publishes the task itself in shared memory (one 32-byte slot), so
// the consumers read no global memory for it.
template <class Cfg>
struct VarlenScheduler : VarlenTiles {
  using KP = KernelParams<VarlenScheduler>;
  static constexpr uint32_t kBarThreads = 32 + Derived<Cfg>::kConsumerThreads;
  __device__ static TileCoord first(const KP& p, int* /*slot*/) {
    return from_task(task(p, int(blockIdx.x)), int(blockIdx.x), 0);
  }
  // Consumers (every consumer thread): read the task the producer published.
  __device__ static TileCoord next(const KP&, const TileCoord& cur, int* slot) {
    named_barrier_sync(kBarThreads, kSchedulerBar);
    const VarlenTask w = reinterpret_cast<const VarlenTask*>(slot)[cur.turn & 1];
    return from_task(w, 0, cur.turn + 1);
  }
  // Producer warp (all 32 lanes): take the next number, publish its task to the consumers.
  __device__ static int ticket(const KP& p, const TileCoord& cur, int* slot) {
    int t;
    if ((threadIdx.x & 31) == 0) {
      t = atomicAdd(p.sched.tile_counter, 1) + int(gridDim.x);
      reinterpret_cast<VarlenTask*>(slot)[cur.turn & 1] = task(p, t);
    }
    __syncwarp();
    named_barrier_arrive(kBarThreads, kSchedulerBar);
    return __shfl_sync(0xffffffffu, t, 0);
  }
  // The producer reads back what its lane 0 published (the consumers never write the slot).
  __device__ static TileCoord resolve(const KP&, int t, const TileCoord& cur, const int* slot) {
    return from_task(reinterpret_cast<const VarlenTask*>(slot)[cur.turn & 1], t, cur.turn + 1);
  }
};

// Varlen in clusters: every CTA of a cluster must take the same task with no handshake,
// so the list is dealt statically. In round r cluster c takes position r*G + c, or r*G + G-1-c
// in odd rounds (G clusters): a snake over the longest-first list, so the falling costs even
// out across clusters instead of favouring the last ones every round.
template <class Cfg>
struct VarlenStaticScheduler : VarlenTiles {
  using KP = KernelParams<VarlenStaticScheduler>;
  // head_cluster: the tasks name runs of heads (varlen_plan); each CTA takes its own head.
  __device__ static TileCoord at(const KP& p, int r) {
    constexpr int kCtas = Derived<Cfg>::kClusterSize;
    const int G = int(gridDim.x) / kCtas, c = int(blockIdx.x) / kCtas;
    TileCoord t = from_task(task(p, r * G + ((r & 1) ? G - 1 - c : c)), r, 0);
    t.head = t.head * Derived<Cfg>::kHeadCtas + head_rank<Derived<Cfg>>();
    return t;
  }
  __device__ static TileCoord first(const KP& p, int* /*slot*/) { return at(p, 0); }
  __device__ static TileCoord next(const KP& p, const TileCoord& cur, int* /*slot*/) {
    return at(p, cur.idx + 1);
  }
  __device__ static int ticket(const KP&, const TileCoord& cur, int* /*slot*/) {
    return cur.idx + 1;
  }
  __device__ static TileCoord resolve(const KP& p, int r, const TileCoord&, const int*) {
    return at(p, r);
  }
};

// kVarlen: the packed-sequence kernel, always on a varlen scheduler (the config's scheduler
// knob picks the fixed-length one; clusters, whose CTAs share tasks, the static one).
template <class Cfg, bool kVarlen = false>
using SchedulerFor = std::conditional_t<
    kVarlen,
    std::conditional_t<Derived<Cfg>::kClustered, VarlenStaticScheduler<Cfg>, VarlenScheduler<Cfg>>,
    std::conditional_t<
        Cfg::scheduler == Scheduler::Static, StaticScheduler<Cfg>,
        std::conditional_t<Cfg::scheduler == Scheduler::Dynamic, DynamicScheduler<Cfg>,
                           GridScheduler<Cfg>>>>;

}  // namespace fa_tune
