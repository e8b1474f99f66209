// Warpgroup MMA issue and the named barriers that order warpgroups (pingpong).
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>

#include "config.cuh"

namespace fa_tune {

// Issue one warpgroup GEMM C (+)= A B over all k-blocks as one commit group. kWait >= 0
// waits for all but kWait groups; -1 returns with the group in flight (the caller waits).
template <int kWait, class Mma, class TA, class TB, class TC>
__device__ __forceinline__ void warpgroup_gemm(Mma& mma, TA& a, const TB& b, TC& c, bool zero_init) {
  // A from registers (P for PV) must be fenced too; smem operands are descriptors.
  constexpr bool kARegs = cute::is_same_v<typename TA::value_type, cutlass::bfloat16_t>;
  if constexpr (kARegs) cute::warpgroup_fence_operand(a);
  cute::warpgroup_fence_operand(c);
  cute::warpgroup_arrive();
  mma.accumulate_ = zero_init ? cute::GMMA::ScaleOut::Zero : cute::GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < cute::size<2>(a); ++k) {
    cute::gemm(mma, a(cute::_, cute::_, k), b(cute::_, cute::_, k), c);
    mma.accumulate_ = cute::GMMA::ScaleOut::One;
  }
  cute::warpgroup_commit_batch();
  if constexpr (kWait >= 0) {
    cute::warpgroup_wait<kWait>();
  }
  cute::warpgroup_fence_operand(c);
  if constexpr (kARegs) cute::warpgroup_fence_operand(a);
}

template <int kPending, class TC>
__device__ __forceinline__ void warpgroup_wait_for(TC& c) {
  cute::warpgroup_wait<kPending>();
  cute::warpgroup_fence_operand(c);
}

// Named-barrier ids: 0 is __syncthreads; pingpong uses kPingpongBar + wg, the epilogue
// kEpilogueBar + wg (each consumer warpgroup stores its own 64 rows).
constexpr int kPingpongBar = 2;
constexpr int kEpilogueBar = 8;

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
      if (wg == kWGs - 1) cutlass::arch::NamedBarrier::arrive(kCount, kPingpongBar);
    }
  }
  __device__ static void wait_turn(int wg) {
    if constexpr (D::kPingpong) cutlass::arch::NamedBarrier::sync(kCount, kPingpongBar + wg);
  }
  // The very last turn of the last warpgroup signals no one, leaving every barrier balanced.
  __device__ static void pass_turn(int wg, bool last) {
    if constexpr (D::kPingpong) {
      if (!(last && wg == kWGs - 1))
        cutlass::arch::NamedBarrier::arrive(kCount, kPingpongBar + (wg + 1) % kWGs);
    }
  }
};

}  // namespace fa_tune
