// The kernel: one producer warpgroup (TMA) and block_m/64 consumer warpgroups (WGMMA +
// softmax), specialized by setmaxnreg, connected by the Q, K and V mbarrier rings.
#pragma once

#include "device_pass.cuh"
#include "params.cuh"
#include "scheduler.cuh"
#include "smem.cuh"
// The kernel's body and its pieces: the device pass only (device_pass.cuh). The host pass sees
// the kernel's declaration and parameter types above, which is all the launcher needs.
#if FA_TUNE_DEVICE_PASS
#include "sm90.cuh"

#include "epilogue.cuh"
#include "mainloop.cuh"
#include "producer.cuh"
#include "traits.cuh"
#endif

namespace fa_tune {

#if FA_TUNE_DEVICE_PASS
// The named barriers' ids, each role its own, all inside bar.sync's 16 past __syncthreads' 0
// (ptxas wraps larger ids onto smaller ones): the scheduler's, then pingpong's and the
// epilogue's, one per consumer warpgroup (at most 3).
static_assert(kSchedulerBar + 1 <= kPingpongBar && kPingpongBar + 3 <= kEpilogueBar &&
                  sm90::kBarIdBase + kEpilogueBar + 3 <= 16 && sm90::kBarIdBase + kSchedulerBar > 0,
              "named barrier ids overlap or leave bar.sync's 0..15");

template <class Cfg, class Sched>
struct Consumer {
  using T = Traits<Cfg>;
  using Element = typename T::Element;

  // q_in_regs: Q's shared memory -> the QK's A registers, one ldmatrix.x4 per 16 columns. Q's
  // tile has O's layout and the A registers the accumulator's row and column pattern, so the
  // addresses are the epilogue's stmatrix ones (o_stage.cuh).
  __device__ static void load_q_to_registers(const Element* q_smem, typename T::FragQ& q,
                                             int tid) {
    const OStage at(tid);
    const uint32_t base = uint32_t(__cvta_generic_to_shared(q_smem));
    FA_UNROLL
    for (int k = 0; k < T::kQKBlocks; ++k) {
      asm volatile("ldmatrix.sync.aligned.x4.m8n8.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(q.r[4 * k]), "=r"(q.r[4 * k + 1]), "=r"(q.r[4 * k + 2]),
                     "=r"(q.r[4 * k + 3])
                   : "r"(base + at.offset(k, T::kBlockM)));
    }
  }

  __device__ static void run(const KernelParams<Sched>& p, SharedStorage<T>& ss, int wg) {
    using ML = Mainloop<Cfg>;
    const int tid = threadIdx.x - kWarpgroupThreads;  // index among consumer threads
    // Q's shared-memory descriptors depend only on the warpgroup. With three consumer
    // warpgroups (160 registers each) they are computed from the warp-uniform wg, not tid, so
    // ptxas keeps them in uniform registers: else their 8 per-thread registers push it to
    // borrow P's for the row max, which then waits for the PV still reading P (D 64:
    // docs/PERF.md step 40). At 240 registers it is not needed, and at D 256 one clustered
    // config spilled with it.
    // With one warpgroup the descriptor is a constant.
    constexpr bool kUniformQ = T::kConsumerWGs >= 3 && !Hooks::q_slice_by_tid;
    const int q_wg = T::kConsumerWGs == 1 ? 0 : kUniformQ ? wg : tid / kWarpgroupThreads;
    const auto smem = [](const void* ptr) { return uint32_t(__cvta_generic_to_shared(ptr)); };
    typename T::FragQ q_regs;
    typename T::FragS s;
    typename T::FragO o;
    typename T::FragP p_regs;
    PipeState kst, vst, qst;
    float osum[4] = {0.f, 0.f, 0.f, 0.f};  // sum_in_pv's row-sum columns
    typename ML::State st{k_major_desc(smem(ss.q) + q_wg * 64 * 128),
                          k_major_desc(smem(ss.k)),
                          mn_major_desc(smem(ss.v), T::kBlockN, T::kHeadDim),
                          q_regs, s, o, p_regs, kst, vst, osum};

    const int lane = tid % 32, warp_in_wg = (tid / 32) % 4;
    const int rank = row_rank<T>();  // kv_multicast: this CTA's rows of the pair
    constexpr bool kEarlyQ = Cfg::q_release == QRelease::AfterLastQk;
    constexpr bool kEarlyNext = T::kEarlyNextQk;
    // pack_gqa: a row's position is row >> shift (fixed-length launches only).
    constexpr bool kPack = kPackRows<T, Sched>;
    const int shift = kPack ? p.pack.shift : 0;
    // Wait for the Q at cursor q; with q_in_regs copy it to registers (its shared memory is
    // then read for the last time, so after_last_qk may hand it back at once).
    auto take_q = [&](const PipeState& q, bool release_now) {
      ss.q_ring.wait_full(q);
      if constexpr (Cfg::q_in_regs) {
        load_q_to_registers(ss.q, q_regs, tid);
        if constexpr (kEarlyQ) {
          __syncwarp();
          if (release_now) ss.q_ring.release(q);
        }
      }
    };
    TileCoord t = Sched::first(p, ss.tile_slot);
    if (!t.valid) return;  // a CTA with no work must not leave a pingpong arrival
    Pingpong<T>::start(wg);
    // early_next_qk: every tile starts with its first QK in flight, issued by the previous
    // tile's drain (the first tile's here). The wgmma state is then the same on every path
    // through the loop; a path-dependent one makes ptxas serialize every wgmma (C7514).
    if constexpr (kEarlyNext) {
      take_q(qst, false);
      ML::issue_first_qk(st, ss, wg);
    }
    [[maybe_unused]] int done = 0;  // tasks this CTA ran (a lab build's task clocks only)
    [[maybe_unused]] const bool stamps = Hooks::task_clocks && tid == 0;  // wg 0's first thread
    while (t.valid) {
      if constexpr (Hooks::task_clocks) {
        if (stamps) Hooks::task_begin(done++, t.m_block, t.head, t.batch);
      }
      const TileCoord next = Sched::next(p, t, ss.tile_slot);
      const int first_row = wg_first_row<T>(t.m_block, wg, rank);
      const int row0 = first_row + warp_in_wg * 16 + lane / 4;
      // Without kWgSkip every warpgroup visits all of the task's KV tiles (the masked ones
      // included); with it, a warpgroup whose rows end lower skips the task's top tiles.
      const int S = Sched::seq_len(p, t);   // the tile's sequence (varlen: one of the pack)
      const int Sk = Sched::key_len(p, t);  // its keys; the causal diagonal is shifted by off
      const int off = Sk - S;
      // The task's tiles; a sliding window's first is where the producer loads from (each
      // warpgroup computes from its own, n_lo_wg below, and masks its own rows' window edge).
      const TaskKeys keys = task_keys<T, kPack>(Sk, off, t.m_block, p.mask.window, shift);
      const int n_task = keys.n, n_lo = keys.lo;
      // kWgSkip: a warpgroup with no row in the sequence (the last task of one whose length
      // no task divides) skips all but its last KV tile (its epilogue stores nothing), so the
      // busy ones get the tensor cores to themselves; it releases the skipped V stages eagerly.
      const bool idle = T::kWgSkip && first_row >= S;
      const int n_blocks =
          !T::kWgSkip ? n_task : idle ? n_lo + 1 : kv_blocks_below<T>(Sk, off, first_row + 64);
      const int n_skip = n_task - n_blocks;
      const int n_skip_v = idle ? min(n_skip, 1) : n_skip;  // V stages left to skip_top_v
      // kSkipBottom: this warpgroup's own first tile (its rows' window start), at most its last.
      const int n_lo_wg = ML::kSkipBottom && !idle
                              ? max(n_lo, first_kv_block<T>(off, first_row, p.mask.window, n_blocks))
                              : n_lo;
      if constexpr (kEarlyNext) {
        // Q copied to registers is handed back only now, after next(): the dynamic scheduler
        // relies on the producer's next Q load (and so its next ticket) waiting for this.
        if constexpr (kEarlyQ && Cfg::q_in_regs) ss.q_ring.release(qst);
      } else {
        take_q(qst, true);
        if constexpr (T::kWgSkip) ML::skip_top(st, ss, wg, n_skip, idle);
        if constexpr (T::kOverlap) ML::issue_first_qk(st, ss, wg);
      }
      auto release_q = [&] {
        if constexpr (kEarlyQ && !Cfg::q_in_regs) ss.q_ring.release(qst);
      };
      // early_next_qk: the next tile's first QK, behind this tile's last PV, so it runs during
      // this tile's epilogue. Past the last tile it is a throwaway QK on stale shared memory
      // (nothing is loaded any more), which keeps the wgmma pipeline shape unconditional.
      auto issue_next = [&] {
        if constexpr (kEarlyNext) {
          if (next.valid) {
            PipeState qn = qst;
            qn.advance<1>();
            take_q(qn, false);
            ML::issue_qk(st, ss);
          } else {
            ML::issue_qk_unchecked(st);
          }
        }
      };
      typename ML::Softmax sm;
      float inv_sum[2];
      // The causal mask compares keys with the row's position + off (its diagonal key); both
      // of a thread's rows have one query head (pack_gqa: P divides their distance, 8).
      float sink_log2 = -INFINITY;
      if constexpr (T::kSinks) {
        const int head = kPack ? packed_head(t.head, row0, shift) : t.head;
        if (p.mask.sinks != nullptr) sink_log2 = p.mask.sinks[head] * Hooks::sink_log2e;
      }
      const int first_pos = first_row >> shift, last_pos = (first_row + 63) >> shift;
      const typename ML::TileArgs args{
          n_blocks, num_unmasked_kv_blocks<T>(first_pos, n_blocks, Sk, off, keys.base), n_skip_v,
          (row0 >> shift) + off, 8 >> shift, keys.base, Sk, p.scale_log2, wg, !next.valid,
          n_lo_wg, n_lo_wg - n_lo,
          first_unmasked_kv_block<T>(last_pos, off, p.mask.window, keys.base), p.mask.window,
          p.mask.softcap_pre, sink_log2};
      ML::run(st, ss, sm, args, release_q, issue_next, inv_sum);
      Epilogue<Cfg, Sched>::run(p, ss, o, sm, inv_sum, t, first_row, row0, wg, tid);
      if constexpr (Cfg::q_release == QRelease::AtEnd) ss.q_ring.release(qst);
      qst.advance<1>();
      t = next;
    }
    if constexpr (kEarlyNext) sm90::wgmma_wait<0>();  // the throwaway QK
    Epilogue<Cfg, Sched>::drain(tid);
    if constexpr (Hooks::task_clocks) {
      if (stamps) Hooks::cta_end(done);
    }
  }
};

// The register split of setmaxnreg: the config's. The varlen kernel always runs the persistent
// producer loop, which needs 24 registers since it runs warp-uniform (56 with one consumer
// warpgroup above D 64; config.py, persistent_producer_regs). A config made for the grid
// scheduler may give it fewer, so there the producer takes what it needs from the consumers
// (which may then spill: config.check_varlen says so before compiling).
template <class Cfg, bool kVarlen>
struct RegSplit {
  using D = Derived<Cfg>;
  // Without intra_wg_overlap its loop holds both rings' cursors at once beside the 32-byte task
  // and spilled one int at 24 (H200 build, 2026-12-04): 32 there.
  static constexpr int kMinProducer =
      D::kConsumerWGs == 1 && D::kHeadDim > 64 ? 56 : D::kOverlap ? 24 : 32;
  static constexpr int kProducer =
      kVarlen && Cfg::producer_regs < kMinProducer ? kMinProducer : Cfg::producer_regs;
  static constexpr int kSpare = (D::kLaunchRegs / kWarpgroupThreads - kProducer) / D::kConsumerWGs / 8 * 8;
  static constexpr int kConsumer = Cfg::consumer_regs < kSpare ? Cfg::consumer_regs : kSpare;
};
#endif  // FA_TUNE_DEVICE_PASS

// kVarlen: packed sequences (cu_seqlens) on the varlen scheduler; the same pieces otherwise.
template <class Cfg, bool kVarlen = false>
__global__ void __launch_bounds__(Derived<Cfg>::kThreads, Derived<Cfg>::kCtasPerSm)
    attention_fwd_kernel(const __grid_constant__ KernelParams<SchedulerFor<Cfg, kVarlen>> p) {
#if FA_TUNE_DEVICE_PASS
  using T = Traits<Cfg>;
  using Sched = SchedulerFor<Cfg, kVarlen>;
  static_assert(sizeof(SharedStorage<T>) == smem_bytes<Cfg>(),
                "smem.cuh's SmemLayout must mirror SharedStorage: the launcher sizes shared "
                "memory by it");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  auto& ss = *reinterpret_cast<SharedStorage<T>*>(smem_raw);
  const int warp = __shfl_sync(0xffffffffu, int(threadIdx.x) / 32, 0);

  if constexpr (T::kSumInPv) {
    // The block of ones sum_in_pv's PV reads, written once; the fence makes these generic
    // stores visible to wgmma (the async proxy) past the barrier below.
    constexpr int kWords = T::kBlockN * 64 / 8;  // 16-byte words of 8 BF16 ones
    auto* ones = reinterpret_cast<uint4*>(ss.ones.v);
    for (int i = threadIdx.x; i < kWords; i += T::kThreads)
      ones[i] = make_uint4(0x3F803F80u, 0x3F803F80u, 0x3F803F80u, 0x3F803F80u);
    sm90::fence_view_async_shared();
  }
  if (threadIdx.x == 0) {
    ss.q_ring.init(T::kConsumerWarps);
    ss.k_ring.init(T::kConsumerWarps);
    ss.v_ring.init(T::kConsumerWarps);
    prefetch_tma_map(&p.load.tma_q);
    prefetch_tma_map(&p.load.tma_k);
    prefetch_tma_map(&p.load.tma_v);
    prefetch_tma_map(&p.store.tma_o);
  }
  sm90::fence_barrier_init();
  if constexpr (T::kClustered) {
    sm90::cluster_sync();  // the peer's barriers must exist before any multicast or remote arrival
  } else {
    __syncthreads();
  }
  // Varlen runs behind the schedule kernel as a programmatic dependent launch: the prologue
  // above overlapped it; the task list and the tile counter are read only past this wait.
  if constexpr (kVarlen) asm volatile("griddepcontrol.wait;" ::: "memory");

  // Each role is one branch, as setmaxnreg requires.
  if (warp < 4) {
    sm90::setmaxnreg_dec<RegSplit<Cfg, kVarlen>::kProducer>();
    if (warp == 0) Producer<Cfg, Sched>::run(p, ss);
  } else {
    sm90::setmaxnreg_inc<RegSplit<Cfg, kVarlen>::kConsumer>();
    Consumer<Cfg, Sched>::run(p, ss, warp / 4 - 1);
  }
#endif  // FA_TUNE_DEVICE_PASS
}

}  // namespace fa_tune
