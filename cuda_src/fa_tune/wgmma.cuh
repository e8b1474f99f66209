// Warpgroup MMA issue on operands.cuh's fragments and descriptors, and the named barriers that
// order warpgroups (pingpong).
#pragma once

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>
#include <utility>
#if FA_TUNE_EXTENDED_MMA
#include <cute/arch/mma_sm90_gmma_ext.hpp>
#endif

#include "config.cuh"
#include "operands.cuh"

namespace fa_tune {

namespace gmma = cute::SM90::GMMA;

// Registers an in-flight wgmma reads or writes: the compiler must not move their uses across
// the issue or the wait.
template <int N>
__device__ __forceinline__ void fence_operand(Accum<N>& c) {
  CUTE_UNROLL
  for (int i = 0; i < N; ++i) cute::warpgroup_fence_operand(c.v[i]);
}
template <int N>
__device__ __forceinline__ void fence_operand(Pairs<N>& a) {
  CUTE_UNROLL
  for (int i = 0; i < N; ++i) cute::warpgroup_fence_operand(a.r[i]);
}

// One wgmma of an atom: A from shared memory (a descriptor) or from four registers.
template <class Atom, int N, size_t... I>
__device__ __forceinline__ void wgmma(uint64_t a, uint64_t b, Accum<N>& c, gmma::ScaleOut scale,
                                      std::index_sequence<I...>) {
  Atom::fma(a, b, c.v[I]..., scale);
}
template <class Atom, int N, size_t... I>
__device__ __forceinline__ void wgmma(const uint32_t* a, uint64_t b, Accum<N>& c,
                                      gmma::ScaleOut scale, std::index_sequence<I...>) {
  Atom::fma(a[0], a[1], a[2], a[3], b, c.v[I]..., scale);
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
  cute::warpgroup_arrive();
  gmma::ScaleOut scale = zero_init ? gmma::ScaleOut::Zero : gmma::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < kKBlocks; ++k) {
    if constexpr (kARegs) {
      wgmma<Atom>(a.r + 4 * k, (b + b_step(k)).bits(), c, scale, std::make_index_sequence<N>{});
    } else {
      wgmma<Atom>((a + a_step(k)).bits(), (b + b_step(k)).bits(), c, scale,
                  std::make_index_sequence<N>{});
    }
    scale = gmma::ScaleOut::One;
  }
  cute::warpgroup_commit_batch();
  if constexpr (kWait >= 0) {
    cute::warpgroup_wait<kWait>();
  }
  fence_operand(c);
  if constexpr (kARegs) fence_operand(a);
}

#if FA_TUNE_EXTENDED_MMA  // the 64 x 72 atom is an extended one (build.py sets it for sum_in_pv)
// sum_in_pv's PV, one commit group left in flight: O (+)= P V and, as output columns 64..71,
// the row sums (+)= P x ones, one 64 x 72 wgmma per 16-key k-block. V's descriptor (one
// 64-column block at D 64) gets its leading byte offset, the stride to the operand's next
// 64-column block, pointed at the ones block. Every column of that block is the whole row
// sum of P as BF16, the very weights PV multiplies, so each thread holds its rows' sums.
template <int N, size_t... I>
__device__ __forceinline__ void pv_sums_kblock(const uint32_t* a, uint64_t desc, Accum<N>& c,
                                               float (&sums)[4], gmma::ScaleOut scale,
                                               std::index_sequence<I...>) {
  using Atom = gmma::MMA_64x72x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::MN>;
  Atom::fma(a[0], a[1], a[2], a[3], desc, c.v[I]..., sums[0], sums[1], sums[2], sums[3], scale);
}

__device__ __forceinline__ void fence_sums(float (&sums)[4]) {
  CUTE_UNROLL
  for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(sums[i])::"memory");
}

// v: the V stage's descriptor (k-block 0); kKBlocks 16-key k-blocks.
template <int kKBlocks, int NP, int N>
__device__ __forceinline__ void warpgroup_gemm_pv_sums(Pairs<NP>& a, GmmaDesc v, Accum<N>& c,
                                                       float (&sums)[4], uint32_t ones_addr,
                                                       bool zero_init) {
  static_assert(N == 32, "sum_in_pv: a 64 x 64 O fragment (head dim 64)");
  fence_operand(a);
  fence_operand(c);
  fence_sums(sums);
  cute::warpgroup_arrive();
  // The leading byte offset (14 bits at 16 of the low word, 16-byte units) is set once per
  // call; each k-block's descriptor is k-block 0's plus a compile-time step.
  const uint32_t lo0 = v.lo;
  const uint32_t lbo = ((ones_addr >> 4) - (lo0 & 0x3FFFu)) & 0x3FFFu;
  const uint32_t lo = (lo0 & ~(0x3FFFu << 16)) | (lbo << 16);
  CUTE_UNROLL
  for (int k = 0; k < kKBlocks; ++k) {
    // the k-block's ones sit as far past it as V's
    const GmmaDesc d{lo + mn_major_kblock(k), v.hi};
    pv_sums_kblock(a.r + 4 * k, d.bits(), c, sums,
                   zero_init && k == 0 ? gmma::ScaleOut::Zero : gmma::ScaleOut::One,
                   std::make_index_sequence<32>{});
  }
  cute::warpgroup_commit_batch();
  fence_operand(c);
  fence_sums(sums);
  fence_operand(a);
}
#endif

template <int kPending, int N>
__device__ __forceinline__ void warpgroup_wait_for(Accum<N>& c) {
  cute::warpgroup_wait<kPending>();
  fence_operand(c);
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
