// The wgmma atoms, register fragments and shared-memory plan of one config. Operand layouts
// are operands.cuh's.
#pragma once

#include <cuda_bf16.h>

#include "config.cuh"
#include "operands.cuh"
#include "pipeline.cuh"
#include "wgmma_atoms.cuh"

namespace fa_tune {

// The QK wgmma, 64 x block_n x 16, both operands K-major (head dim contiguous): Q from shared
// memory at every KV tile (SS), or (q_in_regs) from registers loaded once per query tile (RS),
// which halves QK's shared-memory operand reads (K is still read from shared memory).
template <int N, bool kRegsA>
using QKAtom = Wgmma<N, kRegsA, false>;

// O += P V, 64 x head dim x 16: P from registers (no shared-memory round trip), V read
// MN-major (V^T) from the rows TMA wrote.
template <int D>
using PVAtom = Wgmma<D, true, true>;

template <class Cfg>
struct Traits : Derived<Cfg> {
  using D = Derived<Cfg>;
  using Element = __nv_bfloat16;
  static constexpr int kBlockM = D::kBlockM;
  static constexpr int kBlockN = D::kBlockN;
  static constexpr int kHeadDim = D::kHeadDim;

  // One 64-row atom per consumer warpgroup; each warpgroup owns 64 query rows.
  using AtomQK = QKAtom<kBlockN, Cfg::q_in_regs>;
  using AtomPV = PVAtom<kHeadDim>;
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
  __nv_bfloat16 v[kElems];
};
struct NoOnes {};

// The launcher sizes shared memory by smem.cuh's mirror of this (host pass); keep both alike.
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
