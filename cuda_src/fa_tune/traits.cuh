// The wgmma atoms, register fragments and shared-memory plan of one config. Operand layouts
// are operands.cuh's.
#pragma once

#include "config.cuh"
#include <cute/arch/mma_sm90_gmma.hpp>
#if FA_TUNE_EXTENDED_MMA
// Only the dense extended atoms: CuTe's own switch (CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED) also
// parses the sparse ones and widens its op selectors, 36.0 s per block_n 112 build against
// 26.4 s this way (nvcc 13.0, one build on an idle 2-core machine, 2026-11-29).
#include <cute/arch/mma_sm90_gmma_ext.hpp>
#endif
#include <cutlass/numeric_types.h>

#include "operands.cuh"
#include "pipeline.cuh"

namespace fa_tune {

// The QK wgmma atom, 64 x block_n x 16, both operands K-major (head dim contiguous): Q from
// shared memory at every KV tile (SS), or (q_in_regs) from registers loaded once per query
// tile (RS), which halves QK's shared-memory operand reads (K is still read from shared
// memory). Named directly: these are the atoms CuTe's op selector picks for each block_n.
template <int N, bool kRegsA>
struct QKAtom;
#define FA_TUNE_QK_ATOM(N)                                                                       \
  template <>                                                                                    \
  struct QKAtom<N, false> {                                                                      \
    using type = cute::SM90::GMMA::MMA_64x##N##x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K,    \
                                                                  cute::SM90::GMMA::Major::K>;   \
  };                                                                                             \
  template <>                                                                                    \
  struct QKAtom<N, true> {                                                                       \
    using type = cute::SM90::GMMA::MMA_64x##N##x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K,    \
                                                                  cute::SM90::GMMA::Major::K>;   \
  };
FA_TUNE_QK_ATOM(64)
FA_TUNE_QK_ATOM(96)
FA_TUNE_QK_ATOM(128)
FA_TUNE_QK_ATOM(192)
#if FA_TUNE_EXTENDED_MMA
FA_TUNE_QK_ATOM(80)
FA_TUNE_QK_ATOM(112)
FA_TUNE_QK_ATOM(144)
FA_TUNE_QK_ATOM(160)
FA_TUNE_QK_ATOM(176)
#endif
#undef FA_TUNE_QK_ATOM

// O += P V, 64 x head dim x 16: P from registers (no shared-memory round trip), V read
// MN-major (V^T) from the rows TMA wrote.
template <int D>
struct PVAtom;
#define FA_TUNE_PV_ATOM(D)                                                                       \
  template <>                                                                                    \
  struct PVAtom<D> {                                                                             \
    using type = cute::SM90::GMMA::MMA_64x##D##x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K,    \
                                                                  cute::SM90::GMMA::Major::MN>;  \
  };
FA_TUNE_PV_ATOM(64)
FA_TUNE_PV_ATOM(128)
FA_TUNE_PV_ATOM(256)
#undef FA_TUNE_PV_ATOM

template <class Cfg>
struct Traits : Derived<Cfg> {
  using D = Derived<Cfg>;
  using Element = cutlass::bfloat16_t;
  static constexpr int kBlockM = D::kBlockM;
  static constexpr int kBlockN = D::kBlockN;
  static constexpr int kHeadDim = D::kHeadDim;

  // One 64-row atom per consumer warpgroup; each warpgroup owns 64 query rows.
  using AtomQK = typename QKAtom<kBlockN, Cfg::q_in_regs>::type;
  using AtomPV = typename PVAtom<kHeadDim>::type;
  using FragS = Accum<kBlockN / 2>;   // S = Q K^T, this thread's scores
  using FragO = Accum<kHeadDim / 2>;  // O
  using FragP = Pairs<kBlockN / 4>;   // P as BF16: the PV's A operand
  using FragQ = Pairs<kHeadDim / 4>;  // q_in_regs: Q as the QK's A operand
  static constexpr int kQKBlocks = kHeadDim / 16;  // k-blocks of each GEMM
  static constexpr int kPVBlocks = kBlockN / 16;
  static constexpr uint32_t kKVStageUnits = uint32_t(kBlockN) * kHeadDim / 8;  // 16-byte units
};

// sum_in_pv's B operand columns 64..71: block_n key rows of ones, one 64-column swizzle atom
// wide like a V stage (all ones, so the swizzle does not matter), written once per CTA.
template <int kElems>
struct alignas(1024) OnesTile {
  cutlass::bfloat16_t v[kElems];
};
struct NoOnes {};

// The launcher sizes shared memory by smem.cuh's mirror of this (without CuTe); keep both alike.
template <class T>
struct SharedStorage {
  alignas(1024) typename T::Element q[T::kBlockM * T::kHeadDim];
  alignas(1024) typename T::Element k[T::kKStages * T::kBlockN * T::kHeadDim];
  alignas(1024) typename T::Element v[T::kVStages * T::kBlockN * T::kHeadDim];
  alignas(1024) typename T::Element o[T::kOElems];
  StageRing<1> q_ring;
  StageRing<T::kKStages, T::kClusterSize> k_ring;
  StageRing<T::kVStages, T::kClusterSize> v_ring;
  // Dynamic scheduler: the producer publishes the next tile number here (two alternating
  // slots); varlen: the next tile's task (two 32-byte VarlenTasks).
  alignas(16) int tile_slot[16];
  std::conditional_t<T::kSumInPv, OnesTile<T::kBlockN * 64>, NoOnes> ones;
};

}  // namespace fa_tune
