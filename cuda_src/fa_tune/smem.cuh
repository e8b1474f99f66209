// A CTA's dynamic shared memory in bytes, for the launcher: the size of SharedStorage
// (traits.cuh), whose members this mirrors in the same order with plain types (BF16 as
// uint16_t, a StageRing<N> as its 2N mbarrier words), since the launcher's host pass reads
// none of the kernel's body (device_pass.cuh). The kernel asserts that both sizes agree.
#pragma once

#include <cstdint>
#include <type_traits>

#include "config.cuh"

namespace fa_tune {

template <class D>
struct SmemLayout {
  template <int kElems>
  struct alignas(1024) Ones {
    uint16_t v[kElems];
  };
  struct NoOnes {};
  alignas(1024) uint16_t q[D::kBlockM * D::kHeadDim];
  alignas(1024) uint16_t k[D::kKStages * D::kBlockN * D::kHeadDim];
  alignas(1024) uint16_t v[D::kVStages * D::kBlockN * D::kHeadDim];
  alignas(1024) uint16_t o[D::kOElems];
  uint64_t q_ring[2], k_ring[2 * D::kKStages], v_ring[2 * D::kVStages];
  alignas(16) int tile_slot[16];
  std::conditional_t<D::kSumInPv, Ones<D::kBlockN * 64>, NoOnes> ones;
};

template <class Cfg>
constexpr int smem_bytes() {
  return int(sizeof(SmemLayout<Derived<Cfg>>));
}

}  // namespace fa_tune
