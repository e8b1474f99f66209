// The producer: one thread of the producer warpgroup issues every TMA load.
#pragma once

#include "params.cuh"
#include "tma.cuh"
#include "traits.cuh"

namespace fa_tune {

template <class Cfg, class Sched>
struct Producer {
  using T = Traits<Cfg>;
  // A paged class's device-scheduled kernel reads K and V through the block table.
  static constexpr bool kPaged = T::kPaged && Sched::kPacked;
  // pack_gqa's fixed-length kernel: Q through the 5-D view, tiles from the task's first key.
  static constexpr bool kPack = kPackRows<T, Sched>;

  // Runs on the whole producer warp: the loop, the ring waits and the scheduler run on every
  // lane, so its state is warp-uniform (uniform registers: the persistent loop fits in few
  // vector registers); one elected lane arms the barriers and issues the TMA copies.
  __device__ static void run(const KernelParams<Sched>& p, SharedStorage<T>& ss) {
    const bool leader = sm90::elect_one_sync();
    const int rank = T::kClustered ? int(sm90::block_rank_in_cluster()) : 0;
    const int rows_rank = row_rank<T>();  // kv_multicast: this CTA's rows of the pair
    PipeState qst, kst, vst;
    TileCoord t = Sched::first(p, ss.tile_slot);
    [[maybe_unused]] bool first_task = true;  // a lab bound's Q loaded once (hooks.cuh)
    while (t.valid) {
      const int h = t.head, b = t.batch, start = Sched::seq_start(t);
      // Q: D / 64 column boxes of block_m rows, or with kv_multicast one pair of boxes per
      // warpgroup (its 64 rows sit apart in the pair: params.cuh, wg_first_row).
      const bool load_q = !Hooks::q_load_once || first_task;
      if constexpr (Hooks::q_load_once) first_task = false;
      uint64_t* bar = ss.q_ring.acquire(qst, load_q ? T::kQBytes : 0, leader);
      if constexpr (kPack) {
        // block_m rows: P heads x block_m / P positions (params.cuh, PackParams).
        if (leader && load_q) {
          for (int c = 0; c < T::kDBoxes; ++c)
            tma_load_5d<Cfg::hint_q>(&p.load.tma_q, bar, ss.q + c * T::kBlockM * kBoxCols,
                                     c * kBoxCols, 0, (t.m_block * T::kBlockM) >> p.pack.shift,
                                     h, b);
        }
      } else if (leader && load_q) {
        constexpr int kQBoxes = T::kBlockM / T::kQBoxRows;
        for (int r = 0; r < kQBoxes; ++r) {
          const int row = wg_first_row<T>(t.m_block, r, rows_rank);  // no multicast: r = 0, the tile's first row
          for (int c = 0; c < T::kDBoxes; ++c)
            tma_load_4d<Cfg::hint_q>(&p.load.tma_q, bar,
                                     ss.q + (c * T::kBlockM + r * T::kQBoxRows) * kBoxCols,
                                     c * kBoxCols, start + row, h, b);
        }
      }
      qst.advance<1>();
      // Ask for the next tile before any K/V load can block on a full ring (consumers ask at
      // the start of each tile and must not wait on loads they have yet to release); decode
      // it after the loads (scheduler.cuh: ticket / resolve).
      const int ticket = Sched::ticket(p, t, ss.tile_slot);
      load_kv(p, ss, t, kst, vst, rank, leader);
      t = Sched::resolve(p, ticket, t, ss.tile_slot);
    }
    if constexpr (T::kClustered) {
      ss.k_ring.drain(kst);
      ss.v_ring.drain(vst);
    }
  }

  // One K or V tile n (rows from `row`) into the ring's next stage, on one full barrier: D / 64
  // column boxes, each of kKVRowSlices row slices. In a cluster this CTA loads only its share
  // of the pieces and TMA multicasts them into every CTA; each CTA's barrier waits for the
  // whole tile (every CTA's share).
  template <CacheHint kHint, class Ring>
  __device__ static void load_tile(const CUtensorMap* map, Ring& ring, PipeState& st,
                                   typename T::Element* base, int n, int row, int h, int b,
                                   int rank, bool leader, const PageRow& pages,
                                   int page_box_rows) {
    const bool load = Hooks::kv_load_every == 1 || n % Hooks::kv_load_every == 0;
    uint64_t* bar = ring.acquire(st, load ? T::kKVTileBytes : 0, leader);
    auto* dst = base + st.index * T::kBlockN * T::kHeadDim;
    constexpr int kSlices = T::kKVRowSlices, kMine = T::kDBoxes * kSlices / T::kClusterSize;
    if constexpr (kPaged) {
      // Boxes of page_box_rows rows (a power of two dividing the slice and the page), each from
      // its page. Every lane looks up one box's page at once (pages hold 8+ rows, so a tile has
      // at most 32 boxes) and the leader takes them by shuffle. Looked up by the leader box
      // after box, each TMA copy waited on its own table load: 16 a K tile at pages of 16,
      // D 128, where this is 9 % faster (docs/PERF.md step 85).
      static_assert(T::kBlockN / 8 <= 32, "a lane per box of 8 rows");
      if (load) {  // the same for every lane: the whole warp shuffles
        const int lane = int(lane_id()), box_shift = __ffs(page_box_rows) - 1;
        const int mine = pages.page_of(row + (lane << box_shift));  // past the tile: unused
        for (int i = rank * kMine; i < (rank + 1) * kMine; ++i) {
          const int c = i / kSlices, r = (i % kSlices) * T::kKVBoxRows;
          auto* to = dst + (c * T::kBlockN + r) * kBoxCols;
          for (int s = 0; s < T::kKVBoxRows; s += page_box_rows) {
            const int key = row + r + s;
            const int page = __shfl_sync(0xffffffffu, mine, (r + s) >> box_shift);
            const int in_page = key & ((1 << pages.shift) - 1);
            if (!leader) continue;
            if constexpr (T::kClustered) {
              tma_load_4d_multicast<kHint>(map, bar, to + s * kBoxCols,
                                           uint16_t((1u << T::kClusterSize) - 1u), c * kBoxCols,
                                           in_page, h, page);
            } else {
              tma_load_4d<kHint>(map, bar, to + s * kBoxCols, c * kBoxCols, in_page, h, page);
            }
          }
        }
      }
    } else if (load && leader) {
      for (int i = rank * kMine; i < (rank + 1) * kMine; ++i) {
        const int c = i / kSlices, r = (i % kSlices) * T::kKVBoxRows;
        auto* to = dst + (c * T::kBlockN + r) * kBoxCols;
        if constexpr (T::kClustered) {
          tma_load_4d_multicast<kHint>(map, bar, to, uint16_t((1u << T::kClusterSize) - 1u),
                                       c * kBoxCols, row + r, h, b);
        } else {
          tma_load_4d<kHint>(map, bar, to, c * kBoxCols, row + r, h, b);
        }
      }
    }
    st.template advance<Ring::kStages>();
  }

  __device__ static void load_kv(const KernelParams<Sched>& p, SharedStorage<T>& ss, const TileCoord& t,
                                 PipeState& kst, PipeState& vst, int rank, bool leader) {
    // GQA / MQA: the K/V head it reads; a per-sequence cache: the sequence's batch entry.
    const int h = Sched::kv_head(p, t), b = Sched::kv_batch(t);
    // Varlen: a tile past its sequence's keys also holds the next sequence's first keys; the
    // causal mask hides them from the sequence's rows (the non-causal mask ends at its keys).
    // The task's tiles [n_lo, n_blocks), from key `base` (params.cuh, task_keys).
    int n_blocks, n_lo = 0, base = 0;
    if constexpr (kPack) {
      const int Sk = Sched::key_len(p, t);
      const TaskKeys keys = task_keys<T, true>(Sk, Sk - Sched::seq_len(p, t), t.m_block,
                                               p.mask.window, p.pack.shift);
      n_blocks = keys.n;
      base = keys.base;
    } else {
      // task_keys' unpacked arm, written out: through task_keys ptxas scheduled the grid
      // presets' kernels differently (docs/PERF.md step 76), and varlen reads the schedule's.
      if constexpr (Sched::kPacked) {
        n_blocks = t.kv_tiles;  // the device-side schedule's count (varlen.cuh, tile_end)
      } else {
        const int Sk = Sched::key_len(p, t);
        n_blocks = num_kv_blocks<T>(Sk, Sk - Sched::seq_len(p, t), t.m_block);
      }
      // A sliding window's first tile (its class only: without one the loops below run to 0).
      if constexpr (T::kWindow) {
        const int S = Sched::seq_len(p, t), Sk = Sched::key_len(p, t);
        n_lo = first_kv_block<T>(Sk - S, t.m_block * T::kRowsPerTask, p.mask.window, n_blocks);
      }
    }
    const int start = Sched::key_start(t) + base;
    // A paged cache: the task's sequence's table row (the batch coordinate is its index);
    // unused otherwise, and compiled out.
    PageRow pages{};
    int page_box_rows = 0;
    if constexpr (kPaged) {
      const int keys = Sched::key_len(p, t);
      pages = PageRow{p.page.table + (long long)b * p.page.stride,
                      (keys + (1 << p.page.shift) - 1) >> p.page.shift, p.page.shift,
                      p.page.num_pages};
      page_box_rows = p.page.box_rows;
    }
    auto load_k = [&](int n) {
      load_tile<Cfg::hint_k>(&p.load.tma_k, ss.k_ring, kst, ss.k, n, start + n * T::kBlockN, h, b,
                             rank, leader, pages, page_box_rows);
    };
    auto load_v = [&](int n) {
      load_tile<Cfg::hint_v>(&p.load.tma_v, ss.v_ring, vst, ss.v, n, start + n * T::kBlockN, h, b,
                             rank, leader, pages, page_box_rows);
    };
    // Issue in the order the consumers need the tiles (diagonal first, toward key 0), so
    // a small ring never holds a tile the consumers cannot reach yet.
    if constexpr (T::kOverlap) {  // consumers: K[n], then (K[n-1], V[n]) pairs, then V[lo]
      load_k(n_blocks - 1);
      for (int n = n_blocks - 2; n >= n_lo; --n) {
        load_k(n);
        load_v(n + 1);
      }
      load_v(n_lo);
    } else {
      for (int n = n_blocks - 1; n >= n_lo; --n) {
        load_k(n);
        load_v(n);
      }
    }
  }
};

}  // namespace fa_tune
