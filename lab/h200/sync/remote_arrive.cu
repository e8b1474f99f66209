// Minimal reproducer for compute-sanitizer synccheck on our K/V ring's protocol with 2-CTA
// clusters (docs/PERF.md, step 19): one "producer" thread per CTA waits on the empty barrier
// and arrives on the full one; every consumer warp waits on full and arrives on the empty
// barrier of both CTAs (a remote arrival for the other one), as StageRing<1, 2> does, beside a
// local ring as our Q ring. No TMA, no data: if synccheck reports "Missing wait" here, it
// flags the protocol itself.
//   nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I<cutlass>/include remote_arrive.cu
#include <cstdio>
#include <cute/arch/cluster_sm90.hpp>
#include <cutlass/arch/barrier.h>

constexpr int kWarps = 8, kRounds = 64;  // consumer warps; warp 8 is the producer

// kv: consumers arrive on the empty barrier of both CTAs (StageRing<1, 2>);
// q: a local ring beside it (StageRing<1, 1>), consumers arrive on their own CTA's only.
__global__ void __cluster_dims__(2, 1, 1) ring_kernel(int* out) {
  __shared__ uint64_t kv_full, kv_empty, q_full, q_empty;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    cutlass::arch::ClusterBarrier::init(&kv_full, 1);
    cutlass::arch::ClusterBarrier::init(&kv_empty, kWarps * 2);
    cutlass::arch::ClusterBarrier::init(&q_full, 1);
    cutlass::arch::ClusterBarrier::init(&q_empty, kWarps);
  }
  cutlass::arch::fence_barrier_init();
  cute::cluster_sync();
  uint32_t phase = 0;
  if (warp == kWarps) {
    if (lane == 0) {
      for (int r = 0; r < kRounds; ++r, phase ^= 1u) {
        cutlass::arch::ClusterBarrier::wait(&q_empty, phase ^ 1u);
        cutlass::arch::ClusterBarrier::arrive(&q_full);
        cutlass::arch::ClusterBarrier::wait(&kv_empty, phase ^ 1u);
        cutlass::arch::ClusterBarrier::arrive(&kv_full);
      }
      cutlass::arch::ClusterBarrier::wait(&kv_empty, phase ^ 1u);  // drain
    }
  } else {
    for (int r = 0; r < kRounds; ++r, phase ^= 1u) {
      cutlass::arch::ClusterBarrier::wait(&q_full, phase);
      if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&q_empty);
      cutlass::arch::ClusterBarrier::wait(&kv_full, phase);
      const uint32_t lead = lane == 0;
      for (uint32_t cta = 0; cta < 2; ++cta)
        cutlass::arch::ClusterBarrier::arrive(&kv_empty, cta, lead);
    }
  }
  cute::cluster_sync();
  if (threadIdx.x == 0) out[blockIdx.x] = kRounds;
}

int main() {
  int* out = nullptr;
  cudaMalloc(&out, 4 * sizeof(int));
  ring_kernel<<<4, (kWarps + 1) * 32>>>(out);
  cudaError_t e = cudaDeviceSynchronize();
  int h[4] = {};
  cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
  std::printf("%s: %d %d %d %d\n", cudaGetErrorString(e), h[0], h[1], h[2], h[3]);
  return e != cudaSuccess;
}
