// Which pipe does the softmax's FP32 -> BF16x2 pack (F2FP) use, and what does the softmax's
// instruction mix sustain per SM? (docs/PERF.md step 41.) One block of 1024 threads per SM,
// kChains independent chains per op kind, timed with clock64 between two __syncthreads.
// If F2FP shares MUFU's XU pipe, ex2 + F2FP at 2:1 runs at 16 XU ops per clock in all
// (ex2 10.7); if not, ex2 keeps its 16 beside it. PRMT (pack the two high halves: BF16 by
// truncation) is the ALU alternative. Build: nvcc -arch=sm_90a -O3 -o pipe_mix pipe_mix.cu
#include "bench.cuh"

constexpr int kIters = 2048, kChains = 8, kThreads = 1024;

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm volatile("{.reg .f32 t; neg.f32 t, %1; ex2.approx.ftz.f32 %0, t;}" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ unsigned f2fp(unsigned a, unsigned b) {
  unsigned y;
  asm volatile("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(y) : "f"(__uint_as_float(a)), "f"(__uint_as_float(b)));
  return y;
}
__device__ __forceinline__ unsigned prmt(unsigned a, unsigned b) {
  unsigned y;
  asm volatile("prmt.b32 %0, %1, %2, 0x7632;" : "=r"(y) : "r"(a), "r"(b));
  return y;
}
__device__ __forceinline__ float fmx(float a, float b) {
  float y;
  asm volatile("max.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b));
  return y;
}
__device__ __forceinline__ float ffma(float a, float b) {
  float y;
  asm volatile("fma.rn.f32 %0, %1, %2, %1;" : "=f"(y) : "f"(a), "f"(b));
  return y;
}

// Mix: E ex2, C f2fp, P prmt, M max, F fma per iteration and chain.
template <int E, int C, int P, int M, int F>
__global__ void mix(unsigned* sink, long long* cycles) {
  float e[kChains], m[kChains], f[kChains];
  unsigned c[kChains], p[kChains];
#pragma unroll
  for (int k = 0; k < kChains; ++k) {
    e[k] = 1.0f + 1e-3f * (threadIdx.x + k);
    m[k] = e[k]; f[k] = 0.5f * e[k];
    c[k] = p[k] = __float_as_uint(e[k]);
  }
  __syncthreads();
  long long t0 = clock64();
  for (int i = 0; i < kIters; ++i) {
#pragma unroll
    for (int k = 0; k < kChains; ++k) {
#pragma unroll
      for (int j = 0; j < E; ++j) e[k] = ex2(e[k]);
#pragma unroll
      for (int j = 0; j < C; ++j) c[k] = f2fp(c[k], c[k] ^ j);
#pragma unroll
      for (int j = 0; j < P; ++j) p[k] = prmt(p[k], p[k] + j);
#pragma unroll
      for (int j = 0; j < M; ++j) m[k] = fmx(m[k], f[k]);
#pragma unroll
      for (int j = 0; j < F; ++j) f[k] = ffma(f[k], 0.999f);
    }
  }
  __syncthreads();
  long long t1 = clock64();
  unsigned s = 0;
#pragma unroll
  for (int k = 0; k < kChains; ++k)
    s ^= __float_as_uint(e[k]) ^ c[k] ^ p[k] ^ __float_as_uint(m[k]) ^ __float_as_uint(f[k]);
  sink[blockIdx.x * kThreads + threadIdx.x] = s;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <int E, int C, int P, int M, int F>
void run(const char* name, const Bench& b) {
  const long long worst = b.worst_cycles([&] { mix<E, C, P, M, F><<<b.sms, kThreads>>>(b.sink, b.cyc); });
  const double per = double(kThreads) * kIters * kChains / worst;  // per op kind, per clk/SM
  printf("%-26s ex2 %5.2f  f2fp %5.2f  prmt %5.2f  max %5.2f  fma %5.2f  /clk/SM  (%lld cycles)\n",
         name, per * E, per * C, per * P, per * M, per * F, worst);
}

int main() {
  const Bench b(kThreads);
  run<2, 0, 0, 0, 0>("ex2", b);
  run<0, 1, 0, 0, 0>("f2fp", b);
  run<0, 0, 1, 0, 0>("prmt", b);
  run<0, 0, 0, 1, 0>("max", b);
  run<0, 0, 0, 0, 1>("fma", b);
  run<2, 1, 0, 0, 0>("ex2 2 : f2fp 1", b);
  run<2, 0, 1, 0, 0>("ex2 2 : prmt 1", b);
  run<2, 0, 0, 2, 0>("ex2 2 : max 2", b);
  run<2, 1, 0, 2, 2>("softmax 2:1 f2fp:2 max:2 fma", b);
  run<2, 0, 1, 2, 2>("softmax, prmt pack", b);
  return Bench::finish();
}
