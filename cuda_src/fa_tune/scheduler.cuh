// Which query tile (m_block, head, batch) each CTA works on, and in what order.
//
// Every scheduler gives both roles the same sequence of tiles, starting with `first`. The
// consumers ask `next` at the start of each tile. The producer asks in two steps: `ticket`
// right after issuing the current tile's Q load, before any K/V load can block on a full ring
// (the dynamic scheduler's handshake), and `resolve` after the loads, so only one int, not a
// second TileCoord, stays live across them: the persistent producer runs on 40 registers and
// spilled otherwise.
#pragma once

#include <type_traits>

#include <cutlass/arch/barrier.h>

#include "config.cuh"
#include "params.cuh"

namespace fa_tune {

constexpr int kSchedulerBar = 12;  // named barrier: producer warp -> consumers (dynamic only)

// Fixed length: every tile's sequence is its batch entry's Sq query rows over Sk keys, from
// row 0. What the three fixed-length schedulers share:
struct FixedTiles {
  static constexpr bool kPacked = false;  // varlen: sequences packed along the rows
  __device__ static int seq_start(const TileCoord&) { return 0; }
  __device__ static int seq_len(const Params& p, const TileCoord&) { return p.shape.Sq; }
  __device__ static int key_start(const TileCoord&) { return 0; }
  __device__ static int key_len(const Params& p, const TileCoord&) { return p.shape.Sk; }
  __device__ static int kv_batch(const TileCoord& t) { return t.batch; }
  // GQA / MQA: query head h reads K/V head h / group. TEST ONLY: planted bug 8 (config.cuh)
  // interleaves instead (h % Hkv), the same head for MHA and MQA, another one for GQA.
  __device__ static int kv_head(const Params& p, const TileCoord& t) {
    return kPlantBug == 8 ? t.head % p.shape.Hkv : t.head / p.shape.group;
  }
};

// Non-persistent: one CTA per query tile, grid (m tiles, heads, batch). Within a head the
// blocks are launched longest first (the last query rows visit the most KV tiles) or in
// natural order; heads stay adjacent so a wave shares K/V in L2. head_cluster: clusters run
// along y, so a cluster's CTAs take one query tile of adjacent heads of one K/V group.
template <class Cfg>
struct GridScheduler : FixedTiles {
  static constexpr bool kPersistent = false;
  __device__ static TileCoord first(const Params& p, int* /*slot*/) {
    const int x = blockIdx.x;
    const int m = Cfg::tile_order == TileOrder::LongestFirst ? p.shape.num_m_blocks - 1 - x : x;
    return {m, int(blockIdx.y), int(blockIdx.z), 0, 0, true};
  }
  __device__ static TileCoord next(const Params&, const TileCoord&, int* /*slot*/) {
    return {0, 0, 0, 0, 0, false};
  }
  __device__ static int ticket(const Params&, const TileCoord&, int* /*slot*/) { return 0; }
  __device__ static TileCoord resolve(const Params&, int, const TileCoord&, const int*) {
    return {0, 0, 0, 0, 0, false};
  }
};

// Persistent, static: CTA i walks the host-built list tasks[offsets[i] .. offsets[i+1]).
// In clusters the lists are per cluster (its CTAs are consecutive in x): with kv_multicast a
// task is a pair of query tiles, with head_cluster a run of head_cluster query heads.
template <class Cfg>
struct StaticScheduler : FixedTiles {
  static constexpr bool kPersistent = true;
  __device__ static int list() { return int(blockIdx.x) / Derived<Cfg>::kClusterSize; }
  __device__ static TileCoord at(const Params& p, int idx) {
    if (idx >= p.sched.offsets[list() + 1]) return {0, 0, 0, idx, 0, false};
    const uint32_t t = p.sched.tasks[idx];
    const int m = int(t & ((1u << p.sched.m_bits) - 1u));
    const int h = int((t >> p.sched.m_bits) & ((1u << p.sched.h_bits) - 1u));
    const int b = int(t >> (p.sched.m_bits + p.sched.h_bits));
    // head_cluster: the list names the cluster's run of heads; each CTA takes its own.
    return {m, h * Derived<Cfg>::kHeadCtas + head_rank<Derived<Cfg>>(), b, idx, 0, true};
  }
  __device__ static TileCoord first(const Params& p, int* /*slot*/) {
    return at(p, p.sched.offsets[list()]);
  }
  __device__ static TileCoord next(const Params& p, const TileCoord& cur, int* /*slot*/) {
    return at(p, cur.idx + 1);
  }
  __device__ static int ticket(const Params&, const TileCoord& cur, int* /*slot*/) {
    return cur.idx + 1;
  }
  __device__ static TileCoord resolve(const Params& p, int idx, const TileCoord&, const int*) {
    return at(p, idx);
  }
};

// Persistent, dynamic: a global counter hands out tile numbers; the producer warp takes the
// next number and publishes it in shared memory; consumers read it behind a named barrier.
// Two slots alternate, although the Q handoff already keeps the producer at most one tile
// ahead of the consumers' reads.
// Order: the (batch, head) pairs are cut into L2 sections of section_heads pairs whose K and V
// fit in L2 together (sized on the host); within a section tiles go heaviest first (every
// pair's last query tile, then the ones before), so the CTAs running at once share a few
// heads' K/V in L2 and the launch ends on the cheapest tiles. Without sections, 132 CTAs
// would stream 132 different heads' K/V from HBM.
template <class Cfg>
struct DynamicScheduler : FixedTiles {
  static constexpr bool kPersistent = true;
  static constexpr uint32_t kBarThreads = 32 + Derived<Cfg>::kConsumerThreads;
  __device__ static TileCoord decode(const Params& p, int t, int turn) {
    if (t >= p.sched.num_tiles) return {0, 0, 0, t, turn, false};
    const int num_m = p.shape.num_m_blocks;
    const int group = p.sched.section_heads;
    const int section = t / (group * num_m);
    const int r = t - section * group * num_m;
    const int heads_here = min(group, p.shape.H * p.shape.B - section * group);  // last: fewer
    const int m = num_m - 1 - r / heads_here;
    const int bh = section * group + r % heads_here;
    return {m, bh % p.shape.H, bh / p.shape.H, t, turn, true};
  }
  __device__ static TileCoord first(const Params& p, int* /*slot*/) {
    return decode(p, int(blockIdx.x), 0);
  }
  // Consumers (every consumer thread): read the number the producer published.
  __device__ static TileCoord next(const Params& p, const TileCoord& cur, int* slot) {
    cutlass::arch::NamedBarrier::sync(kBarThreads, kSchedulerBar);
    return decode(p, slot[cur.turn & 1], cur.turn + 1);
  }
  // Producer warp (all 32 lanes): take the next number and publish it to the consumers.
  __device__ static int ticket(const Params& p, const TileCoord& cur, int* slot) {
    int t;
    if ((threadIdx.x & 31) == 0) {
      t = atomicAdd(p.sched.tile_counter, 1) + int(gridDim.x);
      slot[cur.turn & 1] = t;
    }
    __syncwarp();
    cutlass::arch::NamedBarrier::arrive(kBarThreads, kSchedulerBar);
    return __shfl_sync(0xffffffffu, t, 0);
  }
  __device__ static TileCoord resolve(const Params& p, int t, const TileCoord& cur, const int*) {
    return decode(p, t, cur.turn + 1);
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
  __device__ static int seq_start(const TileCoord& t) { return t.start; }
  __device__ static int seq_len(const Params&, const TileCoord& t) { return t.len; }
  __device__ static int key_start(const TileCoord& t) { return t.k_start; }
  __device__ static int key_len(const Params&, const TileCoord& t) { return t.k_len; }
  __device__ static int kv_batch(const TileCoord& t) { return t.kv_batch; }
  __device__ static int kv_head(const Params&, const TileCoord& t) { return t.kv_head; }
  __device__ static TileCoord from_task(const VarlenTask& w, int t, int turn) {
    return {w.m_block, w.heads & 0xffff, w.batches & 0xffff, t, turn, w.m_block >= 0, w.start,
            w.len, w.k_start, w.k_len, w.heads >> 16, w.batches >> 16, w.kv_tiles};
  }
  __device__ static VarlenTask task(const Params& p, int t) {
    if (t >= p.sched.num_tiles) return {-1, 0, 0, 0, 0, 0, 0, 0};
    return p.sched.varlen_tasks[t];
  }
};

// Varlen, dynamic: a global counter hands out list positions. The producer warp takes a
// number, reads its task and publishes the task itself in shared memory (one 32-byte slot), so
// the consumers read no global memory for it.
template <class Cfg>
struct VarlenScheduler : VarlenTiles {
  static constexpr uint32_t kBarThreads = 32 + Derived<Cfg>::kConsumerThreads;
  __device__ static TileCoord first(const Params& p, int* /*slot*/) {
    return from_task(task(p, int(blockIdx.x)), int(blockIdx.x), 0);
  }
  // Consumers (every consumer thread): read the task the producer published.
  __device__ static TileCoord next(const Params&, const TileCoord& cur, int* slot) {
    cutlass::arch::NamedBarrier::sync(kBarThreads, kSchedulerBar);
    const VarlenTask w = reinterpret_cast<const VarlenTask*>(slot)[cur.turn & 1];
    return from_task(w, 0, cur.turn + 1);
  }
  // Producer warp (all 32 lanes): take the next number, publish its task to the consumers.
  __device__ static int ticket(const Params& p, const TileCoord& cur, int* slot) {
    int t;
    if ((threadIdx.x & 31) == 0) {
      t = atomicAdd(p.sched.tile_counter, 1) + int(gridDim.x);
      reinterpret_cast<VarlenTask*>(slot)[cur.turn & 1] = task(p, t);
    }
    __syncwarp();
    cutlass::arch::NamedBarrier::arrive(kBarThreads, kSchedulerBar);
    return __shfl_sync(0xffffffffu, t, 0);
  }
  // The producer reads back what its lane 0 published (the consumers never write the slot).
  __device__ static TileCoord resolve(const Params&, int t, const TileCoord& cur,
                                      const int* slot) {
    return from_task(reinterpret_cast<const VarlenTask*>(slot)[cur.turn & 1], t, cur.turn + 1);
  }
};

// Varlen in clusters: every CTA of a cluster must take the same task with no handshake,
// so the list is dealt statically. In round r cluster c takes position r*G + c, or r*G + G-1-c
// in odd rounds (G clusters): a snake over the longest-first list, so the falling costs even
// out across clusters instead of favouring the last ones every round.
template <class Cfg>
struct VarlenStaticScheduler : VarlenTiles {
  // head_cluster: the tasks name runs of heads (varlen_plan); each CTA takes its own head.
  __device__ static TileCoord at(const Params& p, int r) {
    constexpr int kCtas = Derived<Cfg>::kClusterSize;
    const int G = int(gridDim.x) / kCtas, c = int(blockIdx.x) / kCtas;
    TileCoord t = from_task(task(p, r * G + ((r & 1) ? G - 1 - c : c)), r, 0);
    t.head = t.head * Derived<Cfg>::kHeadCtas + head_rank<Derived<Cfg>>();
    return t;
  }
  __device__ static TileCoord first(const Params& p, int* /*slot*/) { return at(p, 0); }
  __device__ static TileCoord next(const Params& p, const TileCoord& cur, int* /*slot*/) {
    return at(p, cur.idx + 1);
  }
  __device__ static int ticket(const Params&, const TileCoord& cur, int* /*slot*/) {
    return cur.idx + 1;
  }
  __device__ static TileCoord resolve(const Params& p, int r, const TileCoord&, const int*) {
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
