// CuTe types for one config: the two warpgroup MMAs, the swizzled shared-memory layouts,
// and the shared-memory plan.
#pragma once

#include "config.cuh"
#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/arch/mma_sm90.hpp>
#if FA_TUNE_EXTENDED_MMA
// Only the dense extended atoms: CuTe's own switch (CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED) also
// parses the sparse ones and widens its op selectors, 36.0 s per block_n 112 build against
// 26.4 s this way (nvcc 13.0, one build on an idle 2-core machine, 2026-11-29).
#include <cute/arch/mma_sm90_gmma_ext.hpp>
#include <cute/atom/mma_traits_sm90_gmma_ext.hpp>
#endif
#include <cutlass/numeric_types.h>

#include "pipeline.cuh"

namespace fa_tune {

using namespace cute;

// The QK wgmma atom, 64 x block_n x 16 (SS, or RS with q_in_regs), named directly: CuTe's op
// selectors reach the extended block_n only under its own switch (above). These are the atoms
// the selector picks for every block_n of the space.
template <int N, bool kRegsA>
struct QKAtom;
#define FA_TUNE_QK_ATOM(N)                                                                  \
  template <>                                                                               \
  struct QKAtom<N, false> {                                                                 \
    using type = SM90::GMMA::MMA_64x##N##x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>; \
  };                                                                                        \
  template <>                                                                               \
  struct QKAtom<N, true> {                                                                  \
    using type = SM90::GMMA::MMA_64x##N##x16_F32BF16BF16_RS<GMMA::Major::K, GMMA::Major::K>; \
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

template <class Cfg>
struct Traits : Derived<Cfg> {
  using D = Derived<Cfg>;
  using Element = cutlass::bfloat16_t;
  static constexpr int kBlockM = D::kBlockM;
  static constexpr int kBlockN = D::kBlockN;
  static constexpr int kHeadDim = D::kHeadDim;

  // One 64-row MMA atom per consumer warpgroup; each warpgroup owns 64 query rows.
  using AtomLayout = Layout<Shape<Int<D::kConsumerWGs>, _1, _1>>;
  // S = Q K^T, both K-major (head dim contiguous). Q from shared memory at every KV tile, or
  // (q_in_regs) from registers loaded once per query tile, which halves QK's shared-memory
  // operand reads (K is still read from shared memory).
  using MmaQK =
      decltype(make_tiled_mma(typename QKAtom<kBlockN, Cfg::q_in_regs>::type{}, AtomLayout{}));
  // O += P V: P from registers (no smem round trip), V read MN-major through a transposed view.
  using MmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockN>>,
                           GMMA::Major::K, GMMA::Major::MN>(),
      AtomLayout{}));

  // 128-byte swizzle, K-major: the layout TMA's SWIZZLE_128B writes for 64-element boxes.
  using SmemAtom = GMMA::Layout_K_SW128_Atom<Element>;
  using SmemLayoutQ = decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutK =
      decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<D::kKStages>>{}));
  using SmemLayoutV =
      decltype(tile_to_shape(SmemAtom{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<D::kVStages>>{}));
  // V^T as (head dim, keys, stage): same bytes, modes reordered for the MN-major B operand.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutV{}, make_ordered_layout(Shape<Int<kHeadDim>, Int<kBlockN>, Int<D::kVStages>>{},
                                         Step<_2, _1, _3>{})));
  using SmemLayoutO = SmemLayoutQ;

  // Register fragment of P as the A operand of the PV MMA: the S accumulator's values in
  // the same order, regrouped 8 per 16-key k-block (see softmax.cuh for the layout).
  using LayoutP = Layout<Shape<Shape<_2, _2, _2>, _1, Int<kBlockN / 16>>>;
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
