// Warpgroup MMA issue on operands.cuh's fragments and descriptors, and the named barriers that
// order warpgroups (pingpong).
#pragma once

#include <type_traits>

#include "config.cuh"
#include "operands.cuh"
#include "sm90.cuh"
#include "wgmma_atoms.cuh"

namespace fa_tune {

// Registers an in-flight wgmma reads or writes: the compiler must not move their uses across
// the issue or the wait.
template <int N>
__device__ __forceinline__ void fence_operand(Accum<N>& c) {
  FA_UNROLL
  for (int i = 0; i < N; ++i) sm90::fence_reg(c.v[i]);
}
template <int N>
__device__ __forceinline__ void fence_operand(Pairs<N>& a) {
  FA_UNROLL
  for (int i = 0; i < N; ++i) sm90::fence_reg(a.r[i]);
}

// Issue one warpgroup GEMM C (+)= A B over kKBlocks k-blocks of 16 as one commit group. A: a
// K-major descriptor (`a`, stepped by a_step(k)) or registers (four per k-block); B: a
// descriptor stepped by b_step(k). kWait >= 0 waits for all but kWait groups; -1 returns with
// the group in flight (the caller waits).
template <int kWait, class Atom, int kKBlocks, class A, class AStep, class BStep, int N>
__device__ __forceinline__ void warpgroup_gemm(A& a, AStep a_step, GmmaDesc b, BStep b_step,
                                               Accum<N>& c, bool zero_init) {
  constexpr bool kARegs = !std::is_same_v<A, GmmaDesc>;
  if constexpr (kARegs) fence_operand(a);
  fence_operand(c);
  sm90::wgmma_fence();
  int scale = zero_init ? 0 : 1;  // 0: the first k-block overwrites C
  FA_UNROLL
  for (int k = 0; k < kKBlocks; ++k) {
    if constexpr (kARegs) {
      Atom::fma(a.r + 4 * k, (b + b_step(k)).bits(), c.v, scale);
    } else {
      Atom::fma((a + a_step(k)).bits(), (b + b_step(k)).bits(), c.v, scale);
    }
    scale = 1;
  }
  sm90::wgmma_commit();
  if constexpr (kWait >= 0) {
    sm90::wgmma_wait<kWait>();
  }
  fence_operand(c);
  if constexpr (kARegs) fence_operand(a);
}

__device__ __forceinline__ void fence_sums(float (&sums)[4]) {
  FA_UNROLL
  for (int i = 0; i < 4; ++i) sm90::fence_reg(sums[i]);
}

// sum_in_pv's PV, one commit group left in flight: O (+)= P V and, as output columns 64..71,
// the row sums (+)= P x ones, one 64 x 72 wgmma per 16-key k-block. V's descriptor (one
// 64-column block at D 64) gets its leading byte offset, the stride to the operand's next
// 64-column block, pointed at the ones block. Every column of that block is the whole row
// sum of P as BF16, the very weights PV multiplies, so each thread holds its rows' sums.
// v: the V stage's descriptor (k-block 0); kKBlocks 16-key k-blocks.
template <int kKBlocks, int NP, int N>
__device__ __forceinline__ void warpgroup_gemm_pv_sums(Pairs<NP>& a, GmmaDesc v, Accum<N>& c,
                                                       float (&sums)[4], uint32_t ones_addr,
                                                       bool zero_init) {
  static_assert(N == 32, "sum_in_pv: a 64 x 64 O fragment (head dim 64)");
  fence_operand(a);
  fence_operand(c);
  fence_sums(sums);
  sm90::wgmma_fence();
  // The leading byte offset (14 bits at 16 of the low word, 16-byte units) is set once per
  // call; each k-block's descriptor is k-block 0's plus a compile-time step.
  const uint32_t lo0 = v.lo;
  const uint32_t lbo = ((ones_addr >> 4) - (lo0 & 0x3FFFu)) & 0x3FFFu;
  const uint32_t lo = (lo0 & ~(0x3FFFu << 16)) | (lbo << 16);
  FA_UNROLL
  for (int k = 0; k < kKBlocks; ++k) {
    // the k-block's ones sit as far past it as V's
    const GmmaDesc d{lo + mn_major_kblock(k), v.hi};
    wgmma_rs_n72_tb(a.r + 4 * k, d.bits(), c.v, sums, zero_init && k == 0 ? 0 : 1);
  }
  sm90::wgmma_commit();
  fence_operand(c);
  fence_sums(sums);
  fence_operand(a);
}

template <int kPending, int N>
__device__ __forceinline__ void warpgroup_wait_for(Accum<N>& c) {
  sm90::wgmma_wait<kPending>();
  fence_operand(c);
}

// Named-barrier ids (sm90.cuh adds kBarIdBase = 8, so the instruction's ids are 9..15, all
// within bar.sync's 16 and clear of __syncthreads' 0): the scheduler's 1 (scheduler.cuh),
// pingpong's kPingpongBar + wg, the epilogue's kEpilogueBar + wg (each consumer warpgroup
// stores its own 64 rows); at most 3 consumer warpgroups.
constexpr int kPingpongBar = 2;
constexpr int kEpilogueBar = 5;

// Pingpong: consumer warpgroups take turns issuing their GEMMs, so one warpgroup's softmax
// runs while another's GEMMs hold the tensor cores. Warpgroup w waits on barrier w, issues,
// then signals barrier w+1 (mod count). Each barrier counts the waiter's 128 threads plus the
// signaller's 128.
template <class D>
struct Pingpong {
  static constexpr int kWGs = D::kConsumerWGs;
  static constexpr uint32_t kCount = 2 * kWarpgroupThreads;
  __device__ static void start(int wg) {
    if constexpr (D::kPingpong) {
      if (wg == kWGs - 1) sm90::bar_arrive(kCount, kPingpongBar);
    }
  }
  __device__ static void wait_turn(int wg) {
    if constexpr (D::kPingpong) sm90::bar_sync(kCount, kPingpongBar + wg);
  }
  // The very last turn of the last warpgroup signals no one, leaving every barrier balanced.
  __device__ static void pass_turn(int wg, bool last) {
    if constexpr (D::kPingpong) {
      if (!(last && wg == kWGs - 1))
        sm90::bar_arrive(kCount, kPingpongBar + (wg + 1) % kWGs);
    }
  }
};

}  // namespace fa_tune
