// The producer: one thread of the producer warpgroup issues every TMA load.
#pragma once

#include "params.cuh"
#include "tma.cuh"
#include "traits.cuh"

namespace fa_tune {

template <class Cfg, class Sched>
struct Producer {
  using T = Traits<Cfg>;

  // Runs on the whole producer warp (the dynamic scheduler's named barrier counts warps);
  // one elected lane issues the TMA copies and waits on the rings.
  __device__ static void run(const Params& p, SharedStorage<T>& ss) {
    const bool leader = (threadIdx.x & 31) == 0;
    PipeState qst, kst, vst;
    TileCoord t = Sched::first(p, ss.tile_slot);
    while (t.valid) {
      const int h = t.head, b = t.batch;
      if (leader) {
        uint64_t* bar = ss.q_ring.acquire(qst, T::kQBytes);
        for (int c = 0; c < 2; ++c)
          tma_load_4d<Cfg::hint_q>(&p.tma_q, bar, ss.q + c * T::kBlockM * kBoxCols,
                                   c * kBoxCols,
                                   t.m_block * T::kBlockM, h, b);
      }
      qst.advance<1>();
      // Ask for the next tile before any K/V load can block on a full ring (consumers ask at
      // the start of each tile and must not wait on loads they have yet to release); decode
      // it after the loads (scheduler.cuh: ticket / resolve).
      const int ticket = Sched::ticket(p, t, ss.tile_slot);
      if (leader) load_kv(p, ss, t, kst, vst);
      t = Sched::resolve(p, ticket, t);
    }
  }

  // One K or V tile n into the ring's next stage: two 64-column boxes on one full barrier.
  template <CacheHint kHint, int kStages>
  __device__ static void load_tile(const CUtensorMap* map, StageRing<kStages>& ring, PipeState& st,
                                   typename T::Element* base, int n, int h, int b) {
    uint64_t* bar = ring.acquire(st, T::kKVTileBytes);
    auto* dst = base + st.index * T::kBlockN * kHeadDim;
    for (int c = 0; c < 2; ++c)
      tma_load_4d<kHint>(map, bar, dst + c * T::kBlockN * kBoxCols, c * kBoxCols,
                         n * T::kBlockN, h, b);
    st.template advance<kStages>();
  }

  __device__ static void load_kv(const Params& p, SharedStorage<T>& ss, const TileCoord& t,
                                 PipeState& kst, PipeState& vst) {
    const int h = t.head, b = t.batch;
    const int n_blocks = num_kv_blocks<T>(p.shape, t.m_block);
    auto load_k = [&](int n) {
      load_tile<Cfg::hint_k>(&p.tma_k, ss.k_ring, kst, ss.k, n, h, b);
    };
    auto load_v = [&](int n) {
      load_tile<Cfg::hint_v>(&p.tma_v, ss.v_ring, vst, ss.v, n, h, b);
    };
    // Issue in the order the consumers need the tiles (diagonal first, toward key 0), so
    // a small ring never holds a tile the consumers cannot reach yet.
    if constexpr (T::kOverlap) {  // consumers: K[n], then (K[n-1], V[n]) pairs, then V[0]
      load_k(n_blocks - 1);
      for (int n = n_blocks - 2; n >= 0; --n) {
        load_k(n);
        load_v(n + 1);
      }
      load_v(0);
    } else {
      for (int n = n_blocks - 1; n >= 0; --n) {
        load_k(n);
        load_v(n);
      }
    }
  }
};

}  // namespace fa_tune
