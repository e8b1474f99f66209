// Forces real ptxas spills and static shared memory so the parser sees every field.
template <int N>
__global__ void __launch_bounds__(128) spill_kernel(float* out, const float* in) {
  __shared__ float buf[1024];
  float acc[N];
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] = in[threadIdx.x * N + i];
  buf[threadIdx.x] = acc[0];
  __syncthreads();
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = acc[i] * acc[(i + j) % N] + buf[(i * 7 + j) % 1024];
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i) s += acc[i];
  out[threadIdx.x] = s;
}
template __global__ void spill_kernel<64>(float*, const float*);

extern "C" __global__ void small_kernel(float* o) { o[threadIdx.x] = 1.0f; }
