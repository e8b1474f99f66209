// Full/empty mbarrier rings between the TMA producer and the consumer warpgroups.
//
// A stage is readable once its full barrier's phase completes (TMA transaction bytes), and
// reusable once every consumer warp has arrived on its empty barrier. Cursors carry the
// stage index and the phase parity; wrapping flips the parity, so a wait cannot be satisfied
// by an earlier use of the same slot. Cursors are never reset between tiles.
//
// With K/V multicast (kCtas = 2) both CTAs' TMA copies write into every stage of both CTAs, so
// a stage is reusable only once the consumers of both CTAs are done with it: each consumer
// warp arrives on the empty barrier of every CTA of the cluster, and the full barrier (armed
// with the whole tile's bytes by its own producer) completes when both halves have landed.
#pragma once

#include "sm90.cuh"

namespace fa_tune {

// The lane in the warp, as a pure value: the compiler may compute it once and keep it, as it
// does threadIdx.x.
__device__ __forceinline__ uint32_t lane_id() {
  uint32_t lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane;
}

struct PipeState {
  int index = 0;
  uint32_t phase = 0;
  template <int Stages>
  __device__ __forceinline__ void advance() {
    if (++index == Stages) {
      index = 0;
      phase ^= 1u;
    }
  }
};

template <int Stages, int kCtas = 1>
struct StageRing {
  static constexpr int kStages = Stages;
  uint64_t full[Stages];
  uint64_t empty[Stages];

  // consumer_arrivals: consumer warps per CTA.
  __device__ void init(int consumer_arrivals) {
    for (int s = 0; s < Stages; ++s) {
      sm90::mbar_init(&full[s], 1);
      sm90::mbar_init(&empty[s], consumer_arrivals * kCtas);
    }
  }
  // Producer (the whole warp, so its loop state stays warp-uniform): wait until the slot is
  // free (the first pass over the ring never blocks); the elected lane announces how many
  // bytes TMA will deliver into it.
  __device__ __forceinline__ uint64_t* acquire(const PipeState& st, uint32_t bytes,
                                               bool elected) {
    sm90::mbar_wait(&empty[st.index], st.phase ^ 1u);
    if (elected)
      sm90::mbar_arrive_expect_tx(&full[st.index], bytes);
    return &full[st.index];
  }
  __device__ __forceinline__ void wait_full(const PipeState& st) {
    sm90::mbar_wait(&full[st.index], st.phase);
  }
  // Consumers: one arrival per warp (on every CTA's barrier), made after a wgmma wait proved
  // the reads finished. `gate` is always true; computed late, it holds the arrive back until
  // then (softmax.cuh, after_value).
  __device__ __forceinline__ void release(const PipeState& st, bool gate = true) {
    if constexpr (kCtas == 1) {
      if (lane_id() == 0 && gate) sm90::mbar_arrive(&empty[st.index]);
    } else {
      const uint32_t lead = lane_id() == 0 && gate;
      for (uint32_t cta = 0; cta < kCtas; ++cta)
        sm90::mbar_arrive_cluster(&empty[st.index], cta, lead);
    }
  }
  // Producer, before it exits: wait until the consumers of every CTA have released every
  // stage, so no remote arrival or multicast write can reach a CTA that has exited.
  __device__ __forceinline__ void drain(PipeState st) {
    for (int s = 0; s < Stages; ++s) {
      sm90::mbar_wait(&empty[st.index], st.phase ^ 1u);
      st.template advance<Stages>();
    }
  }
};

}  // namespace fa_tune
