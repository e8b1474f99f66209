// What each of nvcc's two passes over a kernel library reads.
//
// nvcc compiles a .cu twice: the device pass (cicc, __CUDA_ARCH__ defined) makes the kernel's
// machine code; the host pass (cudafe++, then the host compiler; __CUDA_ARCH__ undefined) makes
// the launcher (launch.cuh, entry.cuh). The launcher needs the kernel's declaration and
// parameter types, the schedulers' host side and the shared-memory size, nothing of the
// kernel's body; yet parsing it (then with CuTe) was a third of a candidate's compile
// (docs/PERF.md steps 48-49). So the kernel's body and what only it uses (traits, mainloop,
// softmax, epilogue, producer, and the instruction wrappers of sm90.cuh and wgmma_atoms.cuh)
// are read in the device pass alone, FA_TUNE_DEVICE_PASS (kernel.cuh). CUDA allows that as
// long as a __global__ template's signature and template arguments are the same in both
// passes: its parameter types (params.cuh, scheduler.cuh) are read by both. The few
// instructions in the device functions of those shared headers go through the wrappers below.
#pragma once

#include <cstdint>

// -DFA_TUNE_DEVICE_PASS=1 makes the host pass read everything again, as before (a toolchain
// whose registration code names a constant not declared below can still build).
#ifndef FA_TUNE_DEVICE_PASS
#if defined(__CUDA_ARCH__)
#define FA_TUNE_DEVICE_PASS 1
#else
#define FA_TUNE_DEVICE_PASS 0
#endif
#endif

#if FA_TUNE_DEVICE_PASS
#include "sm90.cuh"
#endif

namespace fa_tune {

// This CTA's rank in its cluster.
__device__ __forceinline__ uint32_t cta_rank_in_cluster() {
#if FA_TUNE_DEVICE_PASS
  return sm90::block_rank_in_cluster();
#else
  return 0;
#endif
}

// Named barrier `id` (CUTLASS's numbering, past the barriers it reserves) of `threads` threads:
// wait for all of them, or arrive without waiting.
__device__ __forceinline__ void named_barrier_sync(uint32_t threads, uint32_t id) {
#if FA_TUNE_DEVICE_PASS
  sm90::bar_sync(threads, id);
#endif
}
__device__ __forceinline__ void named_barrier_arrive(uint32_t threads, uint32_t id) {
#if FA_TUNE_DEVICE_PASS
  sm90::bar_arrive(threads, id);
#endif
}

}  // namespace fa_tune
