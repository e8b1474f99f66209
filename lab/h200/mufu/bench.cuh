// The harness of this folder's per-SM rate probes: one block of kThreads per SM, each kernel
// times its loop with clock64 between two __syncthreads and writes its cycles per block; the
// slowest SM's count is the one reported (the rate every SM sustains).
#pragma once
#include <cstdio>
#include <cuda_runtime.h>

struct Bench {
  int sms = 0;
  unsigned* sink = nullptr;  // kernels store their chains' result here, so nothing is dead code
  long long* cyc = nullptr;

  explicit Bench(int threads) {
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaMalloc(&sink, size_t(sms) * threads * sizeof(unsigned));
    cudaMalloc(&cyc, sms * sizeof(long long));
  }
  // Runs launch() twice (the first warms up) and returns the slowest block's cycles.
  template <class Launch>
  long long worst_cycles(Launch launch) const {
    launch();
    launch();
    cudaDeviceSynchronize();
    static long long h[1024];
    cudaMemcpy(h, cyc, sms * sizeof(long long), cudaMemcpyDeviceToHost);
    long long worst = 0;
    for (int i = 0; i < sms; ++i) worst = h[i] > worst ? h[i] : worst;
    return worst;
  }
  // "ok" or the first CUDA error; the exit status.
  static int finish() {
    cudaError_t e = cudaGetLastError();
    printf("%s\n", e == cudaSuccess ? "ok" : cudaGetErrorString(e));
    return e != cudaSuccess;
  }
};
