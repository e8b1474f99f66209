// The Hopper instructions the kernel uses besides TMA (tma.cuh) and wgmma (wgmma_atoms.cuh):
// mbarriers, named barriers, the wgmma fence / commit / wait, setmaxnreg and cluster queries,
// each one inline PTX. Written here rather than included from CUTLASS, whose headers were over
// half of a candidate's front-end time once the layout algebra was gone (docs/PERF.md step 57).
#pragma once

#include <cstdint>

namespace fa_tune {
namespace sm90 {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// --- mbarriers (64-bit, in shared memory) ---
__device__ __forceinline__ void mbar_init(const uint64_t* bar, uint32_t arrivals) {
  asm volatile("{\n\tmbarrier.init.shared::cta.b64 [%1], %0; \n}"
               :
               : "r"(arrivals), "r"(smem_addr(bar)));
}

// Spin until the phase with parity `phase` has completed (try_wait suspends in between).
__device__ __forceinline__ void mbar_wait(const uint64_t* bar, uint32_t phase) {
  asm volatile(
      "{\n\t"
      ".reg .pred       P1; \n\t"
      "LAB_WAIT: \n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1, %2; \n\t"
      "@P1 bra DONE; \n\t"
      "bra     LAB_WAIT; \n\t"
      "DONE: \n\t"
      "}"
      :
      : "r"(smem_addr(bar)), "r"(phase), "r"(0x989680u));
}

__device__ __forceinline__ void mbar_arrive(const uint64_t* bar) {
  asm volatile("{\n\tmbarrier.arrive.shared::cta.b64 _, [%0];\n\t}" : : "r"(smem_addr(bar)));
}

// Arrive on the barrier at the same shared-memory offset in cluster CTA `cta`, if `pred`.
__device__ __forceinline__ void mbar_arrive_cluster(const uint64_t* bar, uint32_t cta,
                                                    uint32_t pred) {
  if (pred) {
    asm volatile(
        "{\n\t"
        ".reg .b32 remAddr32;\n\t"
        "mapa.shared::cluster.u32  remAddr32, %0, %1;\n\t"
        "mbarrier.arrive.shared::cluster.b64  _, [remAddr32];\n\t"
        "}"
        :
        : "r"(smem_addr(bar)), "r"(cta));
  }
}

// Arrive and expect `bytes` more of transactions (TMA's complete_tx) in this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(const uint64_t* bar, uint32_t bytes) {
  asm volatile("{\n\tmbarrier.arrive.expect_tx.shared::cta.b64 _, [%1], %0; \n\t}"
               :
               : "r"(bytes), "r"(smem_addr(bar)));
}

// Barrier inits visible to the cluster (and to TMA) before anyone arrives on them.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("{\n\tfence.mbarrier_init.release.cluster; \n}" ::);
}

// Generic-proxy writes to shared memory visible to the async proxy (TMA stores, wgmma).
__device__ __forceinline__ void fence_view_async_shared() {
  asm volatile("{\n\tfence.proxy.async.shared::cta; \n}" ::);
}

// --- named barriers ---
// Ids as CUTLASS's NamedBarrier numbers them: the instruction's id is id + 8, past the 8 ids
// CUTLASS reserves, so the kernel's ids run 0..7 (bar.sync has 16; wgmma.cuh lists them).
constexpr uint32_t kBarIdBase = 8;
__device__ __forceinline__ void bar_sync(uint32_t threads, uint32_t id) {
  asm volatile("bar.sync %0, %1;" : : "r"(id + kBarIdBase), "r"(threads));
}
__device__ __forceinline__ void bar_arrive(uint32_t threads, uint32_t id) {
  asm volatile("bar.arrive %0, %1;" : : "r"(id + kBarIdBase), "r"(threads));
}

// --- wgmma's ordering ---
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Wait until at most N committed groups are in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// A register an in-flight wgmma reads or writes: its uses may not move across this point.
__device__ __forceinline__ void fence_reg(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_reg(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

// --- registers and clusters ---
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" : : "n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" : : "n"(kRegs));
}

__device__ __forceinline__ uint32_t block_rank_in_cluster() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank) :);
  return rank;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.aligned;\n" : :);
  asm volatile("barrier.cluster.wait.aligned;\n" : :);
}

// 1 in one elected lane of the warp, 0 in the others.
__device__ __forceinline__ uint32_t elect_one_sync() {
  uint32_t pred = 0, lane = 0;
  asm volatile(
      "{\n"
      ".reg .b32 %%rx;\n"
      ".reg .pred %%px;\n"
      "     elect.sync %%rx|%%px, %2;\n"
      "@%%px mov.s32 %1, 1;\n"
      "     mov.s32 %0, %%rx;\n"
      "}\n"
      : "+r"(lane), "+r"(pred)
      : "r"(0xFFFFFFFFu));
  return pred;
}

}  // namespace sm90
}  // namespace fa_tune
