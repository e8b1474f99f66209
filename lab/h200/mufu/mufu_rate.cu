// MUFU.EX2 throughput per SM per clock on this GPU, f32 against the 16-bit forms (docs/PERF.md
// step 39): does ex2 on bf16x2 / f16x2 pairs cost one MUFU slot or two? One block of 1024
// threads per SM, 8 independent chains x = 2^-x per thread (bounded, no overflow), timed with
// clock64 between two __syncthreads. Build: nvcc -arch=sm_90a -O3 -o mufu_rate mufu_rate.cu
#include "bench.cuh"

constexpr int kIters = 4096, kChains = 8, kThreads = 1024;

template <int Kind>
__device__ __forceinline__ unsigned step(unsigned x) {
  unsigned y;
  if constexpr (Kind == 0) {  // f32
    asm volatile("{.reg .f32 t; neg.f32 t, %1; ex2.approx.ftz.f32 %0, t;}" : "=r"(y) : "r"(x));
  } else if constexpr (Kind == 1) {  // f16, one per instruction
    asm volatile("{.reg .b16 h, t; mov.b32 {h, t}, %1; neg.f16 h, h; ex2.approx.f16 h, h;"
                 " mov.b32 %0, {h, t};}" : "=r"(y) : "r"(x));
  } else if constexpr (Kind == 2) {  // f16x2
    asm volatile("{.reg .b32 t; neg.f16x2 t, %1; ex2.approx.f16x2 %0, t;}" : "=r"(y) : "r"(x));
  } else {  // bf16x2
    asm volatile("{.reg .b32 t; neg.bf16x2 t, %1; ex2.approx.ftz.bf16x2 %0, t;}" : "=r"(y) : "r"(x));
  }
  return y;
}

template <int Kind>
__global__ void rate(unsigned* sink, long long* cycles) {
  unsigned v[kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) v[c] = 0x3c003c00u + threadIdx.x + c;  // 1.0 (f16) pairs
  if constexpr (Kind == 0) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) v[c] = __float_as_uint(1.0f + 1e-3f * (threadIdx.x + c));
  }
  __syncthreads();
  long long t0 = clock64();
  for (int i = 0; i < kIters; ++i) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) v[c] = step<Kind>(v[c]);
  }
  __syncthreads();
  long long t1 = clock64();
  unsigned s = 0;
#pragma unroll
  for (int c = 0; c < kChains; ++c) s ^= v[c];
  sink[blockIdx.x * kThreads + threadIdx.x] = s;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <int Kind>
void run(const char* name, int elems_per_op, const Bench& b) {
  const long long worst = b.worst_cycles([&] { rate<Kind><<<b.sms, kThreads>>>(b.sink, b.cyc); });
  const double instr = double(kThreads) * kIters * kChains;
  printf("%-8s  %6.2f instructions/clk/SM  %6.2f exp2/clk/SM  (%lld cycles)\n", name,
         instr / worst, instr * elems_per_op / worst, worst);
}

int main() {
  const Bench b(kThreads);
  run<0>("f32", 1, b);
  run<1>("f16", 1, b);
  run<2>("f16x2", 2, b);
  run<3>("bf16x2", 2, b);
  return Bench::finish();
}
