// TMA (bulk tensor copy) for BSHD tiles, with the L2 cache hint as a compile-time knob; the
// device side (the maps are encoded on the host: tma_map.cuh).
//
// CuTe's SM90_TMA_LOAD always emits `.L2::cache_hint` and its TMA store never does; the
// cache-hint knobs need both forms (and a store with a hint), so the four instructions are
// written here.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "config.cuh"
#include "tma_map.cuh"

namespace fa_tune {

template <CacheHint H>
__device__ constexpr uint64_t cache_policy() {
  // Encoded L2 cache policies (createpolicy's 64-bit form), the values CUTLASS uses for its
  // TMA cache hints.
  if constexpr (H == CacheHint::EvictFirst) return 0x12F0000000000000ull;
  if constexpr (H == CacheHint::EvictLast) return 0x14F0000000000000ull;
  return 0x1000000000000000ull;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Load one box at (d, s, h, b) into shared memory; completion adds bytes to `mbar`.
template <CacheHint H>
__device__ __forceinline__ void tma_load_4d(const CUtensorMap* map, uint64_t* mbar, void* dst,
                                            int d, int s, int h, int b) {
  if constexpr (H == CacheHint::None) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5, %6}], [%2];"
        :
        : "r"(smem_u32(dst)), "l"(map), "r"(smem_u32(mbar)), "r"(d), "r"(s), "r"(h), "r"(b)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%3, %4, %5, %6}], [%2], %7;"
        :
        : "r"(smem_u32(dst)), "l"(map), "r"(smem_u32(mbar)), "r"(d), "r"(s), "r"(h), "r"(b),
          "l"(cache_policy<H>())
        : "memory");
  }
}

// Load one box at (d, s, h, b) into the same shared-memory offset of every CTA in cta_mask
// (of this cluster); each destination's barrier at mbar's offset receives the bytes.
template <CacheHint H>
__device__ __forceinline__ void tma_load_4d_multicast(const CUtensorMap* map, uint64_t* mbar,
                                                      void* dst, uint16_t cta_mask, int d, int s,
                                                      int h, int b) {
  if constexpr (H == CacheHint::None) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ".multicast::cluster [%0], [%1, {%4, %5, %6, %7}], [%2], %3;"
        :
        : "r"(smem_u32(dst)), "l"(map), "r"(smem_u32(mbar)), "h"(cta_mask), "r"(d), "r"(s),
          "r"(h), "r"(b)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ".multicast::cluster.L2::cache_hint [%0], [%1, {%4, %5, %6, %7}], [%2], %3, %8;"
        :
        : "r"(smem_u32(dst)), "l"(map), "r"(smem_u32(mbar)), "h"(cta_mask), "r"(d), "r"(s),
          "r"(h), "r"(b), "l"(cache_policy<H>())
        : "memory");
  }
}

// Store one box from shared memory to (d, s, h, b); rows past the tensor's end are clipped.
template <CacheHint H>
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* src,
                                             int d, int s, int h, int b) {
  if constexpr (H == CacheHint::None) {
    asm volatile(
        "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];"
        :
        : "l"(map), "r"(smem_u32(src)), "r"(d), "r"(s), "r"(h), "r"(b)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group.L2::cache_hint"
        " [%0, {%2, %3, %4, %5}], [%1], %6;"
        :
        : "l"(map), "r"(smem_u32(src)), "r"(d), "r"(s), "r"(h), "r"(b), "l"(cache_policy<H>())
        : "memory");
  }
}

// pack_gqa's Q and O (params.cuh, PackParams): one box at (d, g, s, vh, b) of the 5-D view
// whose rows are the P query heads g of virtual head vh at each position s.
template <CacheHint H>
__device__ __forceinline__ void tma_load_5d(const CUtensorMap* map, uint64_t* mbar, void* dst,
                                            int d, int g, int s, int h, int b) {
  if constexpr (H == CacheHint::None) {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];"
        :
        : "r"(smem_u32(dst)), "l"(map), "r"(smem_u32(mbar)), "r"(d), "r"(g), "r"(s), "r"(h),
          "r"(b)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%3, %4, %5, %6, %7}], [%2], %8;"
        :
        : "r"(smem_u32(dst)), "l"(map), "r"(smem_u32(mbar)), "r"(d), "r"(g), "r"(s), "r"(h),
          "r"(b), "l"(cache_policy<H>())
        : "memory");
  }
}

template <CacheHint H>
__device__ __forceinline__ void tma_store_5d(const CUtensorMap* map, const void* src, int d,
                                             int g, int s, int h, int b) {
  if constexpr (H == CacheHint::None) {
    asm volatile(
        "cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];"
        :
        : "l"(map), "r"(smem_u32(src)), "r"(d), "r"(g), "r"(s), "r"(h), "r"(b)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.5d.global.shared::cta.bulk_group.L2::cache_hint"
        " [%0, {%2, %3, %4, %5, %6}], [%1], %7;"
        :
        : "l"(map), "r"(smem_u32(src)), "r"(d), "r"(g), "r"(s), "r"(h), "r"(b),
          "l"(cache_policy<H>())
        : "memory");
  }
}

__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;"); }
// Waits until the stores have finished READING shared memory (enough to reuse or exit).
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}
__device__ __forceinline__ void prefetch_tma_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}
// Generic-proxy smem writes (the O tile) must be visible to the TMA engine (async proxy).
__device__ __forceinline__ void fence_view_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

}  // namespace fa_tune
