// Second minimal reproducer for the synccheck finding of docs/PERF.md, step 22: the ring of
// remote_arrive.cu, now with data. Each CTA's producer arms its full barrier with the whole
// tile's bytes, then copies its half of the tile from global memory into BOTH CTAs' shared
// memory with one multicast bulk copy (cp.async.bulk ... .multicast::cluster), which signals
// complete_tx on the barrier at the same offset in each CTA, as our TMA multicast does. The
// peer's half can therefore land before this CTA's producer has armed the phase. Consumers
// check the data, then arrive on the empty barrier of both CTAs; a local Q-like ring sits
// beside it. Mode 0 multicasts; mode 1 has each CTA copy both halves itself (no peer writes).
//   nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I<cutlass>/include multicast_arrive.cu
#include <cstdio>
#include <cstdlib>
#include <cute/arch/cluster_sm90.hpp>
#include <cutlass/arch/barrier.h>

constexpr int kWarps = 8, kRounds = 64, kHalf = 8192, kTile = 2 * kHalf;  // bytes

__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, int bytes, uint64_t* bar,
                                         uint16_t mask, bool multicast) {
  const uint32_t d = uint32_t(__cvta_generic_to_shared(dst));
  const uint32_t b = uint32_t(__cvta_generic_to_shared(bar));
  if (multicast)
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1], %2, [%3], %4;" ::"r"(d), "l"(src), "r"(bytes), "r"(b), "h"(mask) : "memory");
  else
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];" ::"r"(d), "l"(src), "r"(bytes), "r"(b) : "memory");
}

__global__ void __cluster_dims__(2, 1, 1) ring_kernel(const int* src, int* out, int mode) {
  __shared__ alignas(128) int tile[kTile / 4];
  __shared__ uint64_t kv_full, kv_empty, q_full, q_empty;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rank = int(cute::block_rank_in_cluster());
  if (threadIdx.x == 0) {
    cutlass::arch::ClusterBarrier::init(&kv_full, 1);
    cutlass::arch::ClusterBarrier::init(&kv_empty, kWarps * 2);
    cutlass::arch::ClusterBarrier::init(&q_full, 1);
    cutlass::arch::ClusterBarrier::init(&q_empty, kWarps);
  }
  cutlass::arch::fence_barrier_init();
  cute::cluster_sync();
  uint32_t phase = 0;
  int bad = 0;
  if (warp == kWarps) {
    if (lane == 0) {
      for (int r = 0; r < kRounds; ++r, phase ^= 1u) {
        cutlass::arch::ClusterBarrier::wait(&q_empty, phase ^ 1u);
        cutlass::arch::ClusterBarrier::arrive(&q_full);
        cutlass::arch::ClusterBarrier::wait(&kv_empty, phase ^ 1u);
        cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&kv_full, kTile);
        const int* round_src = src + r * (kTile / 4);
        if (mode == 0) {
          bulk_g2s(tile + rank * (kHalf / 4), round_src + rank * (kHalf / 4), kHalf, &kv_full,
                   0x3, true);
        } else {
          for (int h = 0; h < 2; ++h)
            bulk_g2s(tile + h * (kHalf / 4), round_src + h * (kHalf / 4), kHalf, &kv_full, 0, false);
        }
      }
      cutlass::arch::ClusterBarrier::wait(&kv_empty, phase ^ 1u);  // drain
    }
  } else {
    for (int r = 0; r < kRounds; ++r, phase ^= 1u) {
      cutlass::arch::ClusterBarrier::wait(&q_full, phase);
      if (lane == 0) cutlass::arch::ClusterBarrier::arrive(&q_empty);
      cutlass::arch::ClusterBarrier::wait(&kv_full, phase);
      for (int i = threadIdx.x; i < kTile / 4; i += kWarps * 32)
        bad += tile[i] != r * (kTile / 4) + i;
      __syncwarp();
      const uint32_t lead = lane == 0;
      for (uint32_t cta = 0; cta < 2; ++cta)
        cutlass::arch::ClusterBarrier::arrive(&kv_empty, cta, lead);
    }
  }
  if (bad) atomicAdd(out + 4, bad);
  cute::cluster_sync();
  if (threadIdx.x == 0) out[blockIdx.x] = kRounds;
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? std::atoi(argv[1]) : 0;
  const int n = kRounds * kTile / 4;
  int* h = static_cast<int*>(std::malloc(n * sizeof(int)));
  for (int i = 0; i < n; ++i) h[i] = i;
  int *src = nullptr, *out = nullptr;
  cudaMalloc(&src, n * sizeof(int));
  cudaMalloc(&out, 5 * sizeof(int));
  cudaMemcpy(src, h, n * sizeof(int), cudaMemcpyHostToDevice);
  cudaMemset(out, 0, 5 * sizeof(int));
  ring_kernel<<<4, (kWarps + 1) * 32>>>(src, out, mode);
  cudaError_t e = cudaDeviceSynchronize();
  int r[5] = {};
  cudaMemcpy(r, out, sizeof r, cudaMemcpyDeviceToHost);
  std::printf("mode %d %s: rounds %d %d %d %d, bad words %d\n", mode, cudaGetErrorString(e), r[0],
              r[1], r[2], r[3], r[4]);
  return e != cudaSuccess || r[4] != 0;
}
