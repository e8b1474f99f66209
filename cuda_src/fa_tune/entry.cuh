// The C ABI of fa_tune.h, exported by every built kernel library (docs/ARCHITECTURE.md).
//
// Include after defining `struct Config` (the rendered knobs). The tuner, `fa-tune export`
// and `fa-tune compare` all call these functions of the same shared library.
#pragma once

#include "launch.cuh"

// The only symbols a kernel library exports (it is built with -fvisibility=hidden).
#define FA_TUNE_API __attribute__((visibility("default")))
// The C ABI's names are FA_TUNE_API_PREFIX + name, fa_tune_ unless the build says otherwise:
// a workload library (`fa-tune export --workload`) links several kernels into one .so, each
// under its own prefix, behind a dispatcher that exports the fa_tune_ names.
#ifndef FA_TUNE_API_PREFIX
#define FA_TUNE_API_PREFIX fa_tune_
#endif
#define FA_TUNE_CAT_(a, b) a##b
#define FA_TUNE_CAT(a, b) FA_TUNE_CAT_(a, b)
#define FA_TUNE_FN(name) FA_TUNE_CAT(FA_TUNE_API_PREFIX, name)

extern "C" {

FA_TUNE_API int FA_TUNE_FN(abi_version)(void) { return FA_TUNE_ABI_VERSION; }

FA_TUNE_API int FA_TUNE_FN(forward)(const fa_tune_args* args, cudaStream_t stream) {
  return int(fa_tune::Launcher<Config>::forward(args, stream));
}

FA_TUNE_API int FA_TUNE_FN(prepare)(const fa_tune_args* args, double* host_ms) {
  return int(fa_tune::Launcher<Config>::prepare(args, host_ms));
}

FA_TUNE_API size_t FA_TUNE_FN(workspace_bytes)(const fa_tune_args* args) {
  return fa_tune::Launcher<Config>::workspace_bytes(args);
}

FA_TUNE_API const char* FA_TUNE_FN(last_error)(void) { return fa_tune::g_last_error.c_str(); }

FA_TUNE_API const char* FA_TUNE_FN(config_json)(void) { return Config::json; }

// The problem class compiled in (D and the mask; varlen: device metadata is served; the models'
// masks); Hq, Hkv, the lengths, the window, the cap and the sinks are run-time arguments.
FA_TUNE_API const char* FA_TUNE_FN(problem_class)(void) {
  using D = fa_tune::Derived<Config>;
  static const std::string json =
      "{\"head_dim\":" + std::to_string(D::kHeadDim) + ",\"causal\":" +
      (D::kCausal ? "true" : "false") + ",\"varlen\":" +
      (fa_tune::Launcher<Config>::kHasVarlen ? "true" : "false") + ",\"window\":" +
      (D::kWindow ? "true" : "false") + ",\"softcap\":" + (D::kSoftcap ? "true" : "false") +
      ",\"sinks\":" + (D::kSinks ? "true" : "false") + ",\"paged\":" +
      (D::kPaged ? "true" : "false") + "}";
  return json.c_str();
}

FA_TUNE_API int FA_TUNE_FN(smem_bytes)(void) { return fa_tune::Launcher<Config>::smem_bytes(); }

}  // extern "C"
