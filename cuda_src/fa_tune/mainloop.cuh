// The consumer mainloop of one warpgroup over one query tile: S = Q K^T, mask, online
// softmax, O += P V, walking KV tiles from the diagonal toward key 0.
//
// With intra-warpgroup overlap (FA3's two-stage pipeline):
//   prologue   QK[first] (issue_first_qk) -> mask + softmax -> P
//   steady     issue QK[n] and PV[n+1]; wait QK; softmax[n] while PV runs; wait PV
//   drain      PV[last]; the row-sum quad reduction runs while it is in flight. With
//              early_next_qk the drain also issues the next tile's first QK in the same turn,
//              so it runs on the tensor cores during this tile's epilogue.
// Without overlap each tile is QK -> softmax -> PV in sequence.
#pragma once

#include "params.cuh"
#include "softmax.cuh"
#include "traits.cuh"
#include "wgmma.cuh"

#include <type_traits>

namespace fa_tune {

template <class Cfg>
struct Mainloop {
  using T = Traits<Cfg>;
  using PP = Pingpong<T>;
  using Element = typename T::Element;
  using Softmax = OnlineSoftmax<Cfg::lazy_rescale, Cfg::tree_reduce, T::kSumInPv>;
  // A sliding window: each warpgroup computes from its own rows' first KV tile and skips the
  // task's tiles below it (skip_bottom), which the task's first rows need and its last rows
  // do not: a 64-row band sees 64 + window keys, the task's 128 or 192 rows more. With
  // intra_wg_overlap (the serial loop's last PV turn ends the task) and without early_next_qk
  // (its next QK reads the K cursor the skipped tiles still hold).
  // Not with pack_gqa, whose tasks' tiles start at their first key already.
  static constexpr bool kSkipBottom = T::kWindow && T::kOverlap && !T::kEarlyNextQk &&
                                      !T::kPackGqa && !Hooks::window_task_start;

  // Per-warpgroup state that lives across tiles: the GEMMs' operands (operands.cuh) and the
  // ring cursors.
  struct State {
    GmmaDesc q;                  // this warpgroup's Q rows (unused with q_in_regs)
    GmmaDesc k;                  // K stage 0
    GmmaDesc v;                  // V stage 0, read as V^T
    typename T::FragQ& q_regs;   // q_in_regs: Q as the QK's A registers
    typename T::FragS& s;
    typename T::FragO& o;
    typename T::FragP& p;
    PipeState& kst;
    PipeState& vst;
    float (&osum)[4];  // sum_in_pv: the row-sum columns of PV's accumulator (unused otherwise)
  };

  // S = Q K^T for the K stage at the cursor, left in flight.
  __device__ __forceinline__ static void gemm_qk(State& st) {
    const GmmaDesc k = st.k + st.kst.index * T::kKVStageUnits;
    auto k_step = [](int kb) { return k_major_kblock(kb, T::kBlockN); };
    if constexpr (Cfg::q_in_regs) {
      warpgroup_gemm<-1, typename T::AtomQK, T::kQKBlocks>(st.q_regs, k_step, k, k_step, st.s,
                                                           true);
    } else {
      auto q_step = [](int kb) { return k_major_kblock(kb, T::kBlockM); };
      warpgroup_gemm<-1, typename T::AtomQK, T::kQKBlocks>(st.q, q_step, k, k_step, st.s, true);
    }
  }

  // O (+)= P V for the V stage at the cursor, left in flight; with sum_in_pv also the row sums.
  __device__ __forceinline__ static void issue_pv(State& st, SharedStorage<T>& ss, bool zero_init) {
    const GmmaDesc v = st.v + st.vst.index * T::kKVStageUnits;
    if constexpr (T::kSumInPv) {
      warpgroup_gemm_pv_sums<T::kPVBlocks>(st.p, v, st.o, st.osum,
                                           uint32_t(__cvta_generic_to_shared(&ss.ones)), zero_init);
    } else {
      auto v_step = [](int kb) { return mn_major_kblock(kb); };
      warpgroup_gemm<-1, typename T::AtomPV, T::kPVBlocks>(st.p, v_step, v, v_step, st.o,
                                                           zero_init);
    }
  }

  // Wait until at most kPending groups are in flight; O (and the sums) may be read after.
  template <int kPending>
  __device__ __forceinline__ static void wait_pv(State& st) {
    warpgroup_wait_for<kPending>(st.o);
    if constexpr (T::kSumInPv) fence_sums(st.osum);
  }

  // Rescale O's rows (and, with sum_in_pv, their sums: they share O's reference max).
  __device__ __forceinline__ static void scale_o(State& st, const float (&f)[2]) {
    scale_rows(st.o, f);
    if constexpr (T::kSumInPv) {
      FA_UNROLL
      for (int e = 0; e < 4; ++e) st.osum[e] *= f[e / 2];
    }
  }

  // What one warpgroup's run over one query tile is told (the consumer computes it per tile).
  struct TileArgs {
    int n_blocks;      // KV tiles [0, this) this warpgroup visits, the last first (a window
                       // starts at n_lo)
    int n_unmasked;    // how many of them (from key 0) need no mask
    int n_skip;        // kWgSkip: the V stages of the task's skipped KV tiles that skip_top left
                       // to skip_top_v (overlap: here, once the first softmax is done)
    int diag0;         // the last key this thread's first row sees: its query position plus
                       // the bottom-right offset (the causal mask)
    int row_step;      // how many more its second row sees (8; pack_gqa: 8 / P)
    int key_base;      // tile n's first key is key_base + n x block_n (TaskKeys::base)
    int key_end;       // the sequence's keys (the non-causal mask)
    float scale_log2;  // log2(e) x softmax scale
    int wg;            // the warpgroup (its pingpong turns)
    bool last_tile;    // the CTA's last tile: the pingpong's last turn
    // The models' masks (issue 36), read only by a class that has them:
    int n_lo;          // window: the first KV tile visited (tiles [n_lo, n_blocks))
    int n_skip_lo;     // kSkipBottom: the task's tiles below n_lo, loaded for other warpgroups
    int n_unmasked_lo; // window: tiles below this need the window's mask
    int window;        // window: keys a row sees left of its diagonal
    float softcap_pre; // softcap: softmax scale / cap
    float sink_log2;   // sinks: the row's sink logit x log2(e) (-inf: none)
  };

  // The mask of a masked tile n: the class's where the tile reaches the diagonal (or the key
  // end), and with a window its left edge where the tile reaches that. A window task's tiles
  // are mostly one or the other (gpt-oss's 128 keys in three 48-key tiles: the first at the
  // edge, the last at the diagonal), so each compare runs only where it can cut; the tests are
  // the same for the whole warpgroup.
  template <class Frag>
  __device__ __forceinline__ static void mask_tile(Frag& s, const TileArgs& a, int n) {
    // Without pack_gqa both are constants (8 and 0), folded into the compares.
    const int row_step = T::kPackGqa ? a.row_step : 8;
    const int col0 = (T::kPackGqa ? a.key_base : 0) + n * T::kBlockN;
    if constexpr (T::kWindow) {
      constexpr bool kBoth = Hooks::window_both_masks;
      if (kBoth || n >= a.n_unmasked)
        apply_mask<T::kCausal>(s, a.diag0, row_step, col0, a.key_end);
      if (kBoth || n < a.n_unmasked_lo) apply_window_edge(s, a.diag0, row_step, col0, a.window);
    } else {
      apply_mask<T::kCausal>(s, a.diag0, row_step, col0, a.key_end);
    }
  }

  // A finished QK's scores, before any mask: softcapped where the class says so.
  template <class Frag>
  __device__ __forceinline__ static void cap_scores(Frag& s, const TileArgs& a) {
    if constexpr (T::kSoftcap)
      apply_softcap<Cfg::softcap_tanh == SoftcapTanh::Approx>(s, a.softcap_pre);
  }

  // The row sums' last step (sinks: the sink's term joins them).
  __device__ __forceinline__ static void finalize(Softmax& sm, const TileArgs& a,
                                                  float (&inv_sum)[2]) {
    if constexpr (T::kSinks) {
      sm.finalize(inv_sum, a.sink_log2, a.scale_log2);
    } else {
      sm.finalize(inv_sum);
    }
  }

  // After the last PV completed: 1 / row sum per row (sum_in_pv reads them from PV's output).
  __device__ __forceinline__ static void finalize_sums(State& st, Softmax& sm, const TileArgs& a,
                                                       float (&inv_sum)[2]) {
    if constexpr (T::kSumInPv && T::kSinks) {
      sm.finalize(st.osum, inv_sum, a.sink_log2, a.scale_log2);
    } else if constexpr (T::kSumInPv) {
      sm.finalize(st.osum, inv_sum);
    }
  }

  // A window's tiles from `top` down to n_lo: masked at the diagonal (from n_unmasked up) and
  // at the window's edge (below n_unmasked_lo), unmasked between. One call site per kind of
  // step: with a third, NVVM left the step a function of its own, and ptxas then serializes
  // every wgmma around the call (C7519) and spills.
  template <class Step>
  __device__ __forceinline__ static void walk_window(Step& step, int top, int n_unmasked,
                                                     int n_unmasked_lo, int n_lo) {
    for (int n = top; n >= n_lo; --n) {
      if (n >= n_unmasked || n < n_unmasked_lo) {
        step(std::true_type{}, n);
      } else {
        step(std::false_type{}, n);
      }
    }
  }

  // Runs every KV tile of one query tile; returns with the last PV complete, O unnormalized
  // in st.o, every K/V stage released and inv_sum = 1 / row sum. `release_q` is called once
  // the last QK has read Q. With overlap the tile's first QK must already be in flight
  // (issue_first_qk, or the previous tile's drain). `issue_next` is called in the drain's turn,
  // right after the last PV is issued; with early_next_qk it issues one more QK, which is
  // still in flight on return.
  template <class ReleaseQ, class IssueNext>
  __device__ __forceinline__ static void run(State& st, SharedStorage<T>& ss, Softmax& sm,
                                             const TileArgs& a, ReleaseQ&& release_q,
                                             IssueNext&& issue_next, float (&inv_sum)[2]) {
    if constexpr (T::kOverlap) {
      overlapped(st, ss, sm, a, release_q, issue_next, inv_sum);
    } else {
      serial(st, ss, sm, a, release_q, inv_sum);
    }
  }

  // Skip the task's top n_skip KV tiles: release their K stages (and, without overlap, their V
  // stages) once loaded, and take the pingpong turns their GEMMs would have taken, so every
  // warpgroup takes as many turns per task as its partner and the alternation holds. eager_v
  // (overlap): release each skipped V stage here too, as soon as the producer's order (V[n + 1]
  // after K[n]) has sent it, all but the last, which is left to skip_top_v; so any number of
  // tiles can be skipped with one V stage (an idle warpgroup skips all but one).
  __device__ __forceinline__ static void skip_top(State& st, SharedStorage<T>& ss, int wg, int n_skip,
                                                  bool eager_v = false) {
    for (int i = 0; i < n_skip; ++i) {
      release_unread(ss.k_ring, st.kst);
      if constexpr (T::kOverlap) {
        if (eager_v && i > 0) release_unread(ss.v_ring, st.vst);
      }
      PP::wait_turn(wg);
      PP::pass_turn(wg, false);
      if constexpr (!T::kOverlap) {
        release_unread(ss.v_ring, st.vst);
        PP::wait_turn(wg);
        PP::pass_turn(wg, false);
      }
    }
  }

  // kSkipBottom: hand back the task's n_skip tiles below this warpgroup's first, once the last
  // PV is done, each tile's K and V stage in turn as the producer sends them (K[n - 1] before
  // V[n]), then the tile's pingpong turn: no wait here depends on a turn the partner has yet
  // to take, and the turns per task stay equal. The task's last turn signals no one.
  template <class St>
  __device__ __forceinline__ static void skip_bottom(St& st, SharedStorage<T>& ss, int wg,
                                                     int n_skip, bool last_tile) {
    for (int i = 0; i < n_skip; ++i) {
      release_unread(ss.k_ring, st.kst);
      release_unread(ss.v_ring, st.vst);
      PP::wait_turn(wg);
      PP::pass_turn(wg, last_tile && i == n_skip - 1);
    }
  }

  // With overlap the producer sends V[n + 1] after K[n], so the skipped V stages come after
  // this warpgroup's first K: released after its first softmax, before its first PV waits.
  __device__ __forceinline__ static void skip_top_v(State& st, SharedStorage<T>& ss, int n_skip) {
    for (int i = 0; i < n_skip; ++i) release_unread(ss.v_ring, st.vst);
  }

  // Hand back the stage at the cursor without reading it. It waits for the load first, so the
  // release counts toward the phase the stage was loaded for, not an earlier one.
  template <class Ring>
  __device__ __forceinline__ static void release_unread(Ring& ring, PipeState& cursor) {
    ring.wait_full(cursor);
    ring.release(cursor);
    cursor.template advance<Ring::kStages>();
  }

  // The first (diagonal) QK of a tile, in its own pingpong turn; Q must have landed.
  __device__ __forceinline__ static void issue_first_qk(State& st, SharedStorage<T>& ss, int wg) {
    PP::wait_turn(wg);
    if constexpr (Hooks::qk_before_k_wait) {
      issue_qk_unchecked(st);
      ss.k_ring.wait_full(st.kst);
    } else {
      issue_qk(st, ss);
    }
    PP::pass_turn(wg, false);
  }

  // A QK on whatever the K stage at the cursor holds, left in flight (within the caller's
  // turn). Alone it is early_next_qk's throwaway past the last tile, when no load can be in
  // flight; issue_qk waits for the stage first.
  __device__ __forceinline__ static void issue_qk_unchecked(State& st) { gemm_qk(st); }

  // QK of the K stage at the ring cursor, once its load has landed.
  __device__ __forceinline__ static void issue_qk(State& st, SharedStorage<T>& ss) {
    ss.k_ring.wait_full(st.kst);
    issue_qk_unchecked(st);
  }

  __device__ __forceinline__ static void release_k(State& st, SharedStorage<T>& ss,
                                                   bool gate = true) {
    ss.k_ring.release(st.kst, gate);
  }

  template <class ReleaseQ, class IssueNext>
  __device__ __forceinline__ static void overlapped(State& st, SharedStorage<T>& ss, Softmax& sm,
                                                    const TileArgs& a, ReleaseQ& release_q,
                                                    IssueNext& issue_next, float (&inv_sum)[2]) {
    const int n_blocks = a.n_blocks, n_unmasked = a.n_unmasked, wg = a.wg;
    const float scale_log2 = a.scale_log2;
    float rescale[2];
    float pending_rescale[2] = {1.f, 1.f};  // rescale_o = before_pv: applied before the next PV
    bool pending = false;                     // ... and whether any row of the warp needs it
    PipeState v_prev;                        // v_release = deferred: the stage PV[n+1] read

    // Prologue: the diagonal tile's QK is in flight (issue_first_qk or the last drain).
    const int n_lo = T::kWindow ? a.n_lo : 0;
    int n = n_blocks - 1;
    warpgroup_wait_for<0>(st.s);
    if (n_blocks - n_lo == 1) release_q();
    if constexpr (Cfg::k_release != KRelease::AfterSoftmax) release_k(st, ss);  // no PV in flight
    cap_scores(st.s, a);
    mask_tile(st.s, a, n);
    sm.template update<true>(st.s, scale_log2, rescale);
    if constexpr (Cfg::k_release == KRelease::AfterSoftmax) release_k(st, ss);
    st.kst.template advance<T::kKStages>();
    pack_p(st.s, st.p);
    if constexpr (T::kWgSkip) skip_top_v(st, ss, a.n_skip);

    bool first_pv = true;
    auto step = [&](auto mask_tag, int n) {
      constexpr bool kMask = decltype(mask_tag)::value;
      ss.k_ring.wait_full(st.kst);
      PP::wait_turn(wg);
      gemm_qk(st);
      if constexpr (T::kRescaleBeforePv) {
        if (!first_pv && pending) scale_o(st, pending_rescale);
      }
      ss.v_ring.wait_full(st.vst);
      issue_pv(st, ss, first_pv);
      PP::pass_turn(wg, false);
      warpgroup_wait_for<1>(st.s);  // QK[n] done, PV[n+1] may still run
      if (n == n_lo) release_q();
      if constexpr (Cfg::k_release == KRelease::AfterQk) release_k(st, ss);
      cap_scores(st.s, a);
      if constexpr (kMask) mask_tile(st.s, a, n);
      // after_max: the K release is gated by the row maxima and row 0's exp2s (update's
      // at_max), and ptxas keeps the PV wait below that arrive in program order: the wait then
      // follows the max instead of being hoisted into it (docs/PERF.md steps 40, 53, 57).
      // Where PV is short (D 64) the early wait of after_qk lets P's packing overlap instead.
      bool needed;
      if constexpr (Cfg::k_release == KRelease::AfterMax) {
        needed = sm.template update<false>(st.s, scale_log2, rescale,
                                           [&](bool gate) { release_k(st, ss, gate); });
      } else {
        needed = sm.template update<false>(st.s, scale_log2, rescale);
      }
      if constexpr (Cfg::k_release == KRelease::AfterSoftmax) release_k(st, ss);
      st.kst.template advance<T::kKStages>();
      wait_pv<0>(st);  // PV[n+1] done: V stage and P registers are free
      release_v(st, ss, v_prev, first_pv);
      if constexpr (T::kRescaleBeforePv) {
        pending_rescale[0] = rescale[0];
        pending_rescale[1] = rescale[1];
        pending = needed;
      } else if (needed) {
        scale_o(st, rescale);
      }
      pack_p(st.s, st.p);
      first_pv = false;
    };
    if constexpr (T::kWindow) {
      walk_window(step, n_blocks - 2, n_unmasked, a.n_unmasked_lo, n_lo);
    } else {
      for (n = n_blocks - 2; n >= n_unmasked; --n) step(std::true_type{}, n);
      for (; n >= 0; --n) step(std::false_type{}, n);
    }

    // Drain: the last PV.
    ss.v_ring.wait_full(st.vst);
    PP::wait_turn(wg);
    if constexpr (T::kRescaleBeforePv) {
      if (!first_pv && pending) scale_o(st, pending_rescale);
    }
    issue_pv(st, ss, first_pv);
    issue_next();  // early_next_qk: the next tile's first QK, behind this PV
    PP::pass_turn(wg, a.last_tile && (!kSkipBottom || a.n_skip_lo == 0));
    if constexpr (!T::kSumInPv) finalize(sm, a, inv_sum);  // hides under the last PV
    // The PV (the older group) is done; an early next QK may still run.
    wait_pv<T::kEarlyNextQk ? 1 : 0>(st);
    finalize_sums(st, sm, a, inv_sum);
    finish_v(st, ss, v_prev, !first_pv);
    if constexpr (kSkipBottom) skip_bottom(st, ss, wg, a.n_skip_lo, a.last_tile);
  }

  template <class ReleaseQ>
  __device__ __forceinline__ static void serial(State& st, SharedStorage<T>& ss, Softmax& sm,
                                                const TileArgs& a, ReleaseQ& release_q,
                                                float (&inv_sum)[2]) {
    const int n_blocks = a.n_blocks, n_unmasked = a.n_unmasked, wg = a.wg;
    const float scale_log2 = a.scale_log2;
    const bool last_tile = a.last_tile;
    const int n_lo = T::kWindow ? a.n_lo : 0;
    PipeState v_prev;
    bool first = true;
    auto step = [&](auto mask_tag, int n) {
      constexpr bool kMask = decltype(mask_tag)::value;
      float rescale[2];
      ss.k_ring.wait_full(st.kst);
      PP::wait_turn(wg);
      gemm_qk(st);
      PP::pass_turn(wg, false);
      warpgroup_wait_for<0>(st.s);
      if (n == n_lo) release_q();
      if constexpr (Cfg::k_release == KRelease::AfterQk) release_k(st, ss);
      cap_scores(st.s, a);
      if constexpr (kMask) mask_tile(st.s, a, n);
      if (first) {
        sm.template update<true>(st.s, scale_log2, rescale);
      } else if (sm.template update<false>(st.s, scale_log2, rescale)) {
        scale_o(st, rescale);
      }
      if constexpr (Cfg::k_release == KRelease::AfterSoftmax) release_k(st, ss);
      st.kst.template advance<T::kKStages>();
      pack_p(st.s, st.p);
      ss.v_ring.wait_full(st.vst);
      PP::wait_turn(wg);
      issue_pv(st, ss, first);
      PP::pass_turn(wg, last_tile && n == n_lo);
      if (n != n_lo) {  // the last PV is drained by the epilogue, overlapped with finalize()
        wait_pv<0>(st);
        release_v(st, ss, v_prev, first);
      }
      first = false;
    };
    if constexpr (T::kWindow) {
      walk_window(step, n_blocks - 1, n_unmasked, a.n_unmasked_lo, n_lo);
    } else {
      int n = n_blocks - 1;
      for (; n >= n_unmasked; --n) step(std::true_type{}, n);
      for (; n >= 0; --n) step(std::false_type{}, n);
    }
    if constexpr (!T::kSumInPv) finalize(sm, a, inv_sum);  // hides under the last PV
    wait_pv<0>(st);
    finalize_sums(st, sm, a, inv_sum);
    finish_v(st, ss, v_prev, n_blocks - n_lo > 1);
  }

  // Release the V stage the just-finished PV read (after_pv), or the one before it
  // (deferred: the producer refills it one PV later).
  __device__ __forceinline__ static void release_v(State& st, SharedStorage<T>& ss, PipeState& v_prev, bool first_pv) {
    if constexpr (Cfg::v_release == VRelease::AfterPv) {
      ss.v_ring.release(st.vst);
    } else {
      if (!first_pv) ss.v_ring.release(v_prev);
      v_prev = st.vst;
    }
    st.vst.template advance<T::kVStages>();
  }

  // After the last PV of a tile completes: free the remaining V stage(s).
  __device__ __forceinline__ static void finish_v(State& st, SharedStorage<T>& ss, PipeState& v_prev, bool had_prev) {
    if constexpr (Cfg::v_release == VRelease::Deferred) {
      if (had_prev) ss.v_ring.release(v_prev);
    }
    ss.v_ring.release(st.vst);
    st.vst.template advance<T::kVStages>();
  }
};

}  // namespace fa_tune
