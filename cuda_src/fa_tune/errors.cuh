// Host side: how a failing call says what went wrong. Every host function that can fail
// returns a cudaError_t and leaves one sentence in the calling thread's last error
// (fa_tune_last_error, fa_tune.h).
#pragma once

#include <cuda_runtime.h>

#include <string>

namespace fa_tune {

inline thread_local std::string g_last_error;

inline cudaError_t fail(cudaError_t code, const std::string& msg) {
  g_last_error = msg;
  return code;
}

inline std::string str(long long x) { return std::to_string(x); }

// A CUDA runtime call's error as one sentence: "what: cudaErrorText".
inline cudaError_t fail_cuda(cudaError_t code, const char* what) {
  return fail(code, std::string(what) + ": " + cudaGetErrorString(code));
}

}  // namespace fa_tune
