// Warpgroup MMA issue and the named barriers that order warpgroups (pingpong).
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <utility>
#if FA_TUNE_EXTENDED_MMA
#include <cute/arch/mma_sm90_gmma_ext.hpp>
#endif

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

#if FA_TUNE_EXTENDED_MMA  // the 64 x 72 atom is an extended one (build.py sets it for sum_in_pv)
// sum_in_pv's PV, one commit group left in flight: O (+)= P V and, as output columns 64..71,
// the row sums (+)= P x ones, one 64 x 72 wgmma per 16-key k-block. V's descriptor is CuTe's
// (one 64-column atom at D 64); its leading byte offset, the stride to the operand's next
// 64-column atom, is pointed at the ones block. Every column of that block is the whole row
// sum of P as BF16, the very weights PV multiplies, so each thread holds its rows' sums.
template <class TC, size_t... I>
__device__ __forceinline__ void pv_sums_kblock(const uint32_t* a, uint64_t desc, TC& c,
                                               float (&sums)[4], cute::GMMA::ScaleOut scale,
                                               std::index_sequence<I...>) {
  using Atom = cute::SM90::GMMA::MMA_64x72x16_F32BF16BF16_RS<cute::GMMA::Major::K,
                                                             cute::GMMA::Major::MN>;
  Atom::fma(a[0], a[1], a[2], a[3], desc, c(I)..., sums[0], sums[1], sums[2], sums[3], scale);
}

__device__ __forceinline__ void fence_sums(float (&sums)[4]) {
  CUTE_UNROLL
  for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(sums[i])::"memory");
}

template <class TA, class TB, class TC>
__device__ __forceinline__ void warpgroup_gemm_pv_sums(TA& a, const TB& b, TC& c, float (&sums)[4],
                                                       uint32_t ones_addr, bool zero_init) {
  using namespace cute;
  static_assert(decltype(size(c))::value == 32, "sum_in_pv: a 64 x 64 O fragment (head dim 64)");
  warpgroup_fence_operand(a);
  warpgroup_fence_operand(c);
  fence_sums(sums);
  warpgroup_arrive();
  const uint32_t* pa = reinterpret_cast<const uint32_t*>(raw_pointer_cast(a.data()));
  // Low word: start address (14 bits at 0) and leading byte offset (14 bits at 16), in 16-byte
  // units. The offset is set once per call; each k-block's descriptor is CuTe's k-block 0 plus
  // a compile-time step (so the patch costs no per-k-block bit fiddling).
  const GmmaDescriptor d0 = b(_0{}, _0{}, 0);
  const uint32_t lo0 = d0.reg32_[0];
  const uint32_t lbo = ((ones_addr >> 4) - (lo0 & 0x3FFFu)) & 0x3FFFu;
  const uint32_t lo = (lo0 & ~(0x3FFFu << 16)) | (lbo << 16);
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    const GmmaDescriptor dk = b(_0{}, _0{}, k);
    GmmaDescriptor d = d0;
    d.reg32_[0] = lo + (dk.reg32_[0] - lo0);  // the k-block's ones sit as far past it as V's
    pv_sums_kblock(pa + 4 * k, d.desc_, c, sums,
                   zero_init && k == 0 ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One,
                   std::make_index_sequence<32>{});
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
  fence_sums(sums);
  warpgroup_fence_operand(a);
}
#endif

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
