// Host launcher and the C ABI every built kernel exports (docs/ARCHITECTURE.md).
//
// Include after defining `struct Config` (the rendered knobs). The tuner, `fa-tune export`
// and `fa-tune compare` all call these functions of the same shared library.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

#include "kernel.cuh"

namespace fa_tune {

inline thread_local std::string g_last_error;

inline cudaError_t fail(cudaError_t code, const std::string& msg) {
  g_last_error = msg;
  return code;
}

template <class Cfg>
struct Launcher {
  using T = Traits<Cfg>;
  static constexpr int smem_bytes() { return int(sizeof(SharedStorage<T>)); }

  static cudaError_t check_args(const void* q, const void* k, const void* v, const void* o,
                                int B, int H, int S) {
    if (B < 1 || H < 1 || S < 1)
      return fail(cudaErrorInvalidValue, "B, H and S must be positive, got B=" + std::to_string(B) +
                                             " H=" + std::to_string(H) + " S=" + std::to_string(S));
    if (B > 65535 || H > 65535)
      return fail(cudaErrorInvalidValue, "B and H must be at most 65535 (grid limits)");
    for (const void* ptr : {q, k, v, o}) {
      if (ptr == nullptr) return fail(cudaErrorInvalidValue, "Q, K, V and O must be non-null");
      if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
        return fail(cudaErrorInvalidValue, "Q, K, V and O must be 16-byte aligned (TMA)");
    }
    // TMA global strides must stay below 2^40 bytes.
    if (double(S) * H * kHeadDim * 2 >= 1099511627776.0)
      return fail(cudaErrorInvalidValue, "S*H*128*2 bytes exceeds TMA's 2^40 stride limit");
    return cudaSuccess;
  }

  static cudaError_t forward(const void* q, const void* k, const void* v, void* o, float* lse,
                             int B, int H, int S, cudaStream_t stream) {
    g_last_error.clear();
    if (cudaError_t e = check_args(q, k, v, o, B, H, S); e != cudaSuccess) return e;
    Params p{};
    p.shape = ShapeInfo{B, H, S, (S + T::kBlockM - 1) / T::kBlockM};
    p.lse = lse;
    p.scale_log2 = float(1.4426950408889634 / std::sqrt(double(kHeadDim)));
    cudaError_t e;
    if ((e = encode_bshd_map(&p.tma_q, q, B, S, H, T::kBlockM)) != cudaSuccess ||
        (e = encode_bshd_map(&p.tma_k, k, B, S, H, T::kBlockN)) != cudaSuccess ||
        (e = encode_bshd_map(&p.tma_v, v, B, S, H, T::kBlockN)) != cudaSuccess ||
        (e = encode_bshd_map(&p.tma_o, o, B, S, H, 64)) != cudaSuccess)
      return fail(e, "cuTensorMapEncodeTiled failed for this shape");

    auto kernel = attention_fwd_kernel<Cfg>;
    static bool attr_set = false;  // the attribute is per function, set once per process
    if (!attr_set) {
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes());
      if (e != cudaSuccess) return fail(e, std::string("cudaFuncSetAttribute: ") + cudaGetErrorString(e));
      attr_set = true;
    }
    const dim3 grid = SchedulerFor<Cfg>::grid(p.shape);
    kernel<<<grid, T::kThreads, smem_bytes(), stream>>>(p);
    e = cudaGetLastError();
    if (e != cudaSuccess) {
      // Say what was asked of the launch, and what the compiled kernel allows.
      cudaFuncAttributes a{};
      cudaFuncGetAttributes(&a, kernel);
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "kernel launch: %s (grid %u x %u x %u, %d threads, %d B smem; kernel allows "
                    "%d threads, %d B dynamic smem, uses %d registers)",
                    cudaGetErrorString(e), grid.x, grid.y, grid.z, T::kThreads, smem_bytes(),
                    a.maxThreadsPerBlock, a.maxDynamicSharedSizeBytes, a.numRegs);
      return fail(e, buf);
    }
    return cudaSuccess;
  }
};

}  // namespace fa_tune

// The only symbols a kernel library exports (it is built with -fvisibility=hidden).
#define FA_TUNE_API __attribute__((visibility("default")))

extern "C" {

FA_TUNE_API int fa_tune_forward(const void* q, const void* k, const void* v, void* o, float* lse, int B,
                    int H, int S, cudaStream_t stream) {
  return int(fa_tune::Launcher<Config>::forward(q, k, v, o, lse, B, H, S, stream));
}

// The grid scheduler needs no per-shape setup; persistent schedulers build task lists here.
FA_TUNE_API int fa_tune_prepare(int B, int H, int S, cudaStream_t /*stream*/, double* host_ms) {
  if (host_ms != nullptr) *host_ms = 0.0;
  if (B < 1 || H < 1 || S < 1)
    return int(fa_tune::fail(cudaErrorInvalidValue, "B, H and S must be positive"));
  return 0;
}

FA_TUNE_API const char* fa_tune_last_error(void) { return fa_tune::g_last_error.c_str(); }

FA_TUNE_API const char* fa_tune_config_json(void) { return Config::json; }

FA_TUNE_API int fa_tune_smem_bytes(void) { return fa_tune::Launcher<Config>::smem_bytes(); }

}  // extern "C"
