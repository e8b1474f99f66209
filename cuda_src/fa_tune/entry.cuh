// Host launcher and the C ABI every built kernel exports (docs/ARCHITECTURE.md).
//
// Include after defining `struct Config` (the rendered knobs). The tuner, `fa-tune export`
// and `fa-tune compare` all call these functions of the same shared library.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "kernel.cuh"
#include "task_list.h"
// The varlen kernel is a second instantiation of the same pieces: built only when asked
// (FA_TUNE_VARLEN=1: exports and workload libraries), since it doubles a candidate's compile.
#ifndef FA_TUNE_VARLEN
#define FA_TUNE_VARLEN 0
#endif
#include "varlen.cuh"

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
                                int B, int H, int Hkv, int S) {
    if (B < 1 || H < 1 || Hkv < 1 || S < 1)
      return fail(cudaErrorInvalidValue, "B, Hq, Hkv and S must be positive, got B=" +
                                             std::to_string(B) + " Hq=" + std::to_string(H) +
                                             " Hkv=" + std::to_string(Hkv) + " S=" + std::to_string(S));
    if (H % Hkv != 0)
      return fail(cudaErrorInvalidValue, "Hq=" + std::to_string(H) + " must be a multiple of Hkv=" +
                                             std::to_string(Hkv));
    if (B > 65535 || H > 65535)
      return fail(cudaErrorInvalidValue, "B and H must be at most 65535 (grid limits)");
    if (cudaError_t e = check_group(H, Hkv); e != cudaSuccess) return e;
    for (const void* ptr : {q, k, v, o}) {
      if (ptr == nullptr) return fail(cudaErrorInvalidValue, "Q, K, V and O must be non-null");
      if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
        return fail(cudaErrorInvalidValue, "Q, K, V and O must be 16-byte aligned (TMA)");
    }
    // TMA global strides must stay below 2^40 bytes.
    if (double(S) * H * T::kHeadDim * 2 >= 1099511627776.0)
      return fail(cudaErrorInvalidValue, "S*H*D*2 bytes exceeds TMA's 2^40 stride limit");
    return cudaSuccess;
  }

  // head_cluster: a cluster runs head_cluster query heads of one K/V group side by side.
  static cudaError_t check_group(int H, int Hkv) {
    if ((H / Hkv) % T::kHeadCtas == 0) return cudaSuccess;
    return fail(cudaErrorInvalidValue,
                "this kernel runs head_cluster " + std::to_string(T::kHeadCtas) +
                    " query heads of one K/V head together, so Hq/Hkv must be a multiple of it; "
                    "got Hq=" + std::to_string(H) + " Hkv=" + std::to_string(Hkv) +
                    " (use a config with head_cluster 1 for this problem)");
  }

  // Per-shape scheduler state on the device, built once by prepare() and reused by every
  // launch of that shape (the timed region never includes it).
  struct Prepared {
    SchedParams sched{};
    int num_ctas = 0;
    double host_ms = 0.0;
  };
  using Key = std::tuple<int, int, int, int>;  // device, B, H, S
  static std::map<Key, Prepared>& cache() {
    static std::map<Key, Prepared> c;
    return c;
  }
  static std::mutex& cache_mutex() {
    static std::mutex m;
    return m;
  }

  static cudaError_t prepare(int B, int H, int S, const Prepared** out, double* host_ms) {
    const auto t0 = std::chrono::steady_clock::now();
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return fail(e, std::string("cudaGetDevice: ") + cudaGetErrorString(e));
    std::lock_guard<std::mutex> lock(cache_mutex());
    auto it = cache().find(Key{dev, B, H, S});
    if (it != cache().end()) {
      *out = &it->second;
      if (host_ms) *host_ms = 0.0;
      return cudaSuccess;
    }
    Prepared prep;
    const int num_m = (S + T::kBlockM - 1) / T::kBlockM;
    const long long num_tiles = (long long)num_m * H * B;
    if (num_tiles > 0x7fffffffLL) return fail(cudaErrorInvalidValue, "too many query tiles for one launch");
    if ((e = persistent_ctas<false>(dev, &prep.num_ctas)) != cudaSuccess) return e;
    if constexpr (Cfg::scheduler == Scheduler::Static) {
      TaskLists lists;
      // Per cluster: kv_multicast pairs query tiles, head_cluster runs of heads.
      const int num_tasks_m = (num_m + T::kRowCtas - 1) / T::kRowCtas;
      // The last task's 64-row chunks in the sequence (at most kRowsPerTask / 64); its busiest
      // CTA holds ceil(/ kRowCtas) of them, so at most kConsumerWGs (wg_first_row deals a
      // pair's chunks evenly). With kWgSkip the others idle.
      const int last_chunks = (S - (num_tasks_m - 1) * T::kRowsPerTask + 63) / 64;
      const int last_busy = T::kWgSkip ? (last_chunks + T::kRowCtas - 1) / T::kRowCtas
                                       : T::kConsumerWGs;
      const std::string why = build_task_lists(B, H / T::kHeadCtas, num_tasks_m,
                                               prep.num_ctas / T::kClusterSize, Cfg::fixed_cost,
                                               lists, T::kRowCtas, T::kCausal,
                                               last_busy, T::kConsumerWGs);
      if (!why.empty()) return fail(cudaErrorInvalidValue, why);
      uint32_t* d_tasks = nullptr;
      int* d_offsets = nullptr;
      const size_t tb = lists.tasks.size() * sizeof(uint32_t);
      const size_t ob = lists.offsets.size() * sizeof(int32_t);
      if ((e = cudaMalloc(&d_tasks, tb)) != cudaSuccess ||
          (e = cudaMalloc(&d_offsets, ob)) != cudaSuccess ||
          (e = cudaMemcpy(d_tasks, lists.tasks.data(), tb, cudaMemcpyHostToDevice)) != cudaSuccess ||
          (e = cudaMemcpy(d_offsets, lists.offsets.data(), ob, cudaMemcpyHostToDevice)) != cudaSuccess)
        return fail(e, std::string("uploading task lists: ") + cudaGetErrorString(e));
      prep.sched.tasks = d_tasks;
      prep.sched.offsets = d_offsets;
      prep.sched.m_bits = lists.packing.m_bits;
      prep.sched.h_bits = lists.packing.h_bits;
    } else if constexpr (Cfg::scheduler == Scheduler::Dynamic) {
      if ((e = cudaMalloc(&prep.sched.tile_counter, sizeof(int))) != cudaSuccess)
        return fail(e, std::string("allocating the tile counter: ") + cudaGetErrorString(e));
      prep.num_ctas = int(std::min<long long>(prep.num_ctas, num_tiles));
      // L2 sections: as many (batch, head) pairs as keep their K and V within ~60% of L2
      // (the rest holds Q, O and other traffic).
      int l2_bytes = 0;
      if ((e = cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, dev)) != cudaSuccess)
        return fail(e, std::string("cudaDeviceGetAttribute: ") + cudaGetErrorString(e));
      const double kv_bytes = 2.0 * S * T::kHeadDim * sizeof(typename T::Element);
      prep.sched.section_heads =
          int(std::clamp<double>(std::floor(0.6 * l2_bytes / kv_bytes), 1.0, double(B) * H));
    }
    prep.sched.num_tiles = int(num_tiles);
    prep.host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (host_ms) *host_ms = prep.host_ms;
    *out = &cache().emplace(Key{dev, B, H, S}, prep).first->second;
    return cudaSuccess;
  }

  // CTAs of a persistent launch on device `dev`: persistent_ctas (0: one per SM); in
  // clusters whole clusters only, and no more than fit at once (a persistent cluster left
  // waiting for an SM pair would run its tasks after everyone else). Cached per device.
  template <bool kVarlen>
  static cudaError_t persistent_ctas(int dev, int* out) {
    static std::mutex m;
    static std::map<int, int> cache;
    std::lock_guard<std::mutex> lock(m);
    if (auto it = cache.find(dev); it != cache.end()) {
      *out = it->second;
      return cudaSuccess;
    }
    int sms = 0;
    cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess)
      return fail(e, std::string("cudaDeviceGetAttribute: ") + cudaGetErrorString(e));
    int n = Cfg::persistent_ctas > 0 ? Cfg::persistent_ctas : sms;
    if constexpr (T::kClustered) {
      if ((e = set_attributes<kVarlen>()) != cudaSuccess) return e;
      cudaLaunchAttribute attrs[2]{};
      // The query grid must hold whole clusters in the direction launch_config puts them.
      const dim3 g = kClustersAlongX<kVarlen> ? dim3(T::kClusterSize * 64)
                                              : dim3(64, T::kClusterSize);
      const cudaLaunchConfig_t lc = launch_config<kVarlen>(g, nullptr, attrs);
      int fit = 0;
      e = cudaOccupancyMaxActiveClusters(&fit, attention_fwd_kernel<Cfg, kVarlen>, &lc);
      if (e != cudaSuccess)
        return fail(e, std::string("cudaOccupancyMaxActiveClusters: ") + cudaGetErrorString(e));
      if (fit < 1)
        return fail(cudaErrorInvalidConfiguration, "no " + std::to_string(T::kClusterSize) +
                                                       "-CTA cluster of this kernel fits the device");
      n = T::kClusterSize * std::max(1, std::min(n / T::kClusterSize, fit));
    }
    *out = cache[dev] = n;
    return cudaSuccess;
  }

  // The dynamic shared-memory attribute is per function: set once per process.
  template <bool kVarlen = false>
  static cudaError_t set_attributes() {
    static bool done = false;
    if (done) return cudaSuccess;
    cudaError_t e = cudaFuncSetAttribute(attention_fwd_kernel<Cfg, kVarlen>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes());
    if (e != cudaSuccess) return fail(e, std::string("cudaFuncSetAttribute: ") + cudaGetErrorString(e));
    done = true;
    return cudaSuccess;
  }

  // Launch geometry; clusters along x for a persistent launch (consecutive CTAs share a task
  // list), along y (heads) for the grid's; `dependent`: a programmatic dependent launch
  // (varlen, behind its schedule kernel). attrs must outlive the config.
  template <bool kVarlen>
  static constexpr bool kClustersAlongX = SchedulerFor<Cfg, kVarlen>::kPersistent;
  template <bool kVarlen>
  static cudaLaunchConfig_t launch_config(dim3 g, cudaStream_t stream, cudaLaunchAttribute* attrs,
                                          bool dependent = false) {
    cudaLaunchConfig_t lc{};
    lc.gridDim = g;
    lc.blockDim = dim3(T::kThreads);
    lc.dynamicSmemBytes = smem_bytes();
    lc.stream = stream;
    lc.attrs = attrs;
    if constexpr (T::kClustered) {
      constexpr bool kAlongX = kClustersAlongX<kVarlen>;
      cudaLaunchAttribute& a = attrs[lc.numAttrs++];
      a.id = cudaLaunchAttributeClusterDimension;
      a.val.clusterDim.x = kAlongX ? unsigned(T::kClusterSize) : 1u;
      a.val.clusterDim.y = kAlongX ? 1u : unsigned(T::kClusterSize);
      a.val.clusterDim.z = 1;
    }
    if (dependent) {
      cudaLaunchAttribute& a = attrs[lc.numAttrs++];
      a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      a.val.programmaticStreamSerializationAllowed = 1;
    }
    return lc;
  }

  static dim3 grid(const ShapeInfo& shape, const Prepared& prep) {
    if constexpr (SchedulerFor<Cfg>::kPersistent) return dim3(prep.num_ctas);
    return dim3(shape.num_m_blocks, shape.H, shape.B);
  }

  static cudaError_t forward(const void* q, const void* k, const void* v, void* o, float* lse,
                             int B, int H, int Hkv, int S, float softmax_scale,
                             cudaStream_t stream) {
    g_last_error.clear();
    if (cudaError_t e = check_args(q, k, v, o, B, H, Hkv, S); e != cudaSuccess) return e;
    if (!(softmax_scale >= 0.f) || std::isinf(softmax_scale))
      return fail(cudaErrorInvalidValue, "softmax_scale must be finite and >= 0 (0: 1/sqrt(D))");
    const Prepared* prep = nullptr;
    if (cudaError_t e = prepare(B, H, S, &prep, nullptr); e != cudaSuccess) return e;
    Params p{};
    p.shape = ShapeInfo{B, H, S, (S + T::kBlockM - 1) / T::kBlockM, Hkv, H / Hkv};
    p.sched = prep->sched;
    p.lse = lse;
    const double scale = softmax_scale > 0.f ? double(softmax_scale) : 1.0 / std::sqrt(double(T::kHeadDim));
    p.scale_log2 = float(1.4426950408889634 * scale);
    cudaError_t e;
    constexpr int D = T::kHeadDim;
    if ((e = encode_bshd_map(&p.tma_q, q, B, S, H, D, T::kQBoxRows)) != cudaSuccess ||
        (e = encode_bshd_map(&p.tma_k, k, B, S, Hkv, D, T::kKVBoxRows)) != cudaSuccess ||
        (e = encode_bshd_map(&p.tma_v, v, B, S, Hkv, D, T::kKVBoxRows)) != cudaSuccess ||
        (e = encode_bshd_map(&p.tma_o, o, B, S, H, D, 64)) != cudaSuccess)
      return fail(e, "cuTensorMapEncodeTiled failed for this shape");
    if constexpr (Cfg::scheduler == Scheduler::Dynamic) {
      // The counter starts where the grid's first tiles end; zero it on the launch's stream.
      if ((e = cudaMemsetAsync(p.sched.tile_counter, 0, sizeof(int), stream)) != cudaSuccess)
        return fail(e, std::string("resetting the tile counter: ") + cudaGetErrorString(e));
    }

    return launch<false>(p, grid(p.shape, *prep), stream);
  }

  template <bool kVarlen>
  static cudaError_t launch(const Params& p, dim3 g, cudaStream_t stream) {
    auto kernel = attention_fwd_kernel<Cfg, kVarlen>;
    cudaError_t e;
    if ((e = set_attributes<kVarlen>()) != cudaSuccess) return e;
    cudaLaunchAttribute attrs[2]{};
    const cudaLaunchConfig_t lc = launch_config<kVarlen>(g, stream, attrs, kVarlen);
    e = cudaLaunchKernelEx(&lc, kernel, p);
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess) {
      // Say what was asked of the launch, and what the compiled kernel allows.
      cudaFuncAttributes a{};
      cudaFuncGetAttributes(&a, kernel);
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "kernel launch: %s (grid %u x %u x %u, %d threads, %d B smem; kernel allows "
                    "%d threads, %d B dynamic smem, uses %d registers)",
                    cudaGetErrorString(e), g.x, g.y, g.z, T::kThreads, smem_bytes(),
                    a.maxThreadsPerBlock, a.maxDynamicSharedSizeBytes, a.numRegs);
      return fail(e, buf);
    }
    return cudaSuccess;
  }

  // -- varlen (packed sequences; varlen.cuh builds the schedule on the device)
  static constexpr bool kHasVarlen = FA_TUNE_VARLEN;

  // head_cluster: the tasks name runs of kHeadCtas heads (the cluster takes one run).
  static VarlenPlan varlen_plan(int num_seqs, int H, int Hkv, int total, int max_seqlen) {
    constexpr int c = T::kHeadCtas;
    return VarlenPlan::make(num_seqs, (H + c - 1) / c, std::max(1, H / Hkv / c), total,
                            max_seqlen, T::kRowsPerTask);
  }

  // The library's own workspace, per device, grown on demand (callers that pass none).
  static cudaError_t own_workspace(size_t bytes, cudaStream_t stream, void** out) {
    static std::map<int, std::pair<void*, size_t>> spaces;
    static std::mutex m;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return fail(e, std::string("cudaGetDevice: ") + cudaGetErrorString(e));
    std::lock_guard<std::mutex> lock(m);
    auto& ws = spaces[dev];
    if (ws.second < bytes) {
      cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
      cudaStreamIsCapturing(stream, &cap);
      if (cap != cudaStreamCaptureStatusNone)
        return fail(cudaErrorStreamCaptureUnsupported,
                    "the varlen workspace must grow (" + std::to_string(bytes) +
                        " bytes) inside a CUDA graph capture; pass a workspace, or run a batch "
                        "this large once before capturing");
      if (ws.first != nullptr) cudaFree(ws.first);
      ws = {nullptr, 0};
      if ((e = cudaMalloc(&ws.first, bytes)) != cudaSuccess)
        return fail(e, std::string("allocating the varlen workspace: ") + cudaGetErrorString(e));
      ws.second = bytes;
    }
    *out = ws.first;
    return cudaSuccess;
  }

  static cudaError_t forward_varlen(const void* q, const void* k, const void* v, void* o,
                                    float* lse, const int* cu_seqlens, int num_seqs, int total,
                                    int max_seqlen, int H, int Hkv, float softmax_scale,
                                    void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    g_last_error.clear();
    if constexpr (!kHasVarlen) {
      return fail(cudaErrorNotSupported,
                  "this library was built without the varlen kernel (built for a fixed-length "
                  "problem class; fa-tune export builds it where the config can serve varlen)");
    } else {
      if (num_seqs < 1 || total < 0 || H < 1 || Hkv < 1 || H % Hkv != 0)
        return fail(cudaErrorInvalidValue,
                    "num_seqs, Hq and Hkv must be positive, total_tokens >= 0 and Hkv must divide "
                    "Hq; got num_seqs=" + std::to_string(num_seqs) + " total_tokens=" +
                        std::to_string(total) + " Hq=" + std::to_string(H) + " Hkv=" +
                        std::to_string(Hkv));
      if (cu_seqlens == nullptr) return fail(cudaErrorInvalidValue, "cu_seqlens must be non-null");
      if (cudaError_t e = check_group(H, Hkv); e != cudaSuccess) return e;
      if (total == 0) return cudaSuccess;  // no tokens: nothing to compute or write
      if (max_seqlen < 1)
        return fail(cudaErrorInvalidValue, "max_seqlen must be >= 1 (the longest sequence)");
      if (cudaError_t e = check_args(q, k, v, o, 1, H, Hkv, total); e != cudaSuccess) return e;
      if (!(softmax_scale >= 0.f) || std::isinf(softmax_scale))
        return fail(cudaErrorInvalidValue, "softmax_scale must be finite and >= 0 (0: 1/sqrt(D))");
      const VarlenPlan plan = varlen_plan(num_seqs, H, Hkv, total, max_seqlen);
      if (plan.bound > 0x7fffffffLL)
        return fail(cudaErrorInvalidValue, "too many query tiles for one varlen launch");
      const size_t prep_smem = plan.prep_smem_bytes();
      if (prep_smem > 200 * 1024)
        return fail(cudaErrorInvalidValue,
                    "num_seqs + max_seqlen / " + std::to_string(T::kRowsPerTask) +
                        " is too large for the device-side schedule (" +
                        std::to_string(prep_smem) + " B of shared memory > 200 KiB); split the batch");
      const size_t need = plan.workspace_bytes();
      cudaError_t e;
      if (workspace == nullptr) {
        if ((e = own_workspace(need, stream, &workspace)) != cudaSuccess) return e;
      } else if (workspace_bytes < need) {
        return fail(cudaErrorInvalidValue, "the varlen workspace holds " +
                                               std::to_string(workspace_bytes) + " bytes; this batch needs " +
                                               std::to_string(need) +
                                               " (fa_tune_varlen_workspace_bytes)");
      } else if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
        return fail(cudaErrorInvalidValue, "the varlen workspace must be 16-byte aligned");
      }
      int* counter = static_cast<int*>(workspace);
      auto* tasks = reinterpret_cast<VarlenTask*>(static_cast<char*>(workspace) + 16);

      if (prep_smem > 48 * 1024) {  // above the default limit (batches of thousands only)
        if ((e = cudaFuncSetAttribute(varlen_prepare_kernel<>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      int(prep_smem))) != cudaSuccess)
          return fail(e, std::string("cudaFuncSetAttribute: ") + cudaGetErrorString(e));
      }
      varlen_prepare_kernel<><<<1, kVarlenPrepThreads, prep_smem, stream>>>(cu_seqlens, plan,
                                                                            tasks, counter);
      if ((e = cudaGetLastError()) != cudaSuccess)
        return fail(e, std::string("varlen schedule kernel: ") + cudaGetErrorString(e));

      Params p{};
      p.shape = ShapeInfo{num_seqs, H, total, 0, Hkv, H / Hkv};
      p.sched.num_tiles = int(plan.bound);
      p.sched.varlen_tasks = tasks;
      p.sched.tile_counter = counter;
      p.lse = lse;
      p.o = o;
      const double scale =
          softmax_scale > 0.f ? double(softmax_scale) : 1.0 / std::sqrt(double(T::kHeadDim));
      p.scale_log2 = float(1.4426950408889634 * scale);
      constexpr int D = T::kHeadDim;  // the pack is one batch of `total` rows
      if ((e = encode_bshd_map(&p.tma_q, q, 1, total, H, D, T::kQBoxRows)) != cudaSuccess ||
          (e = encode_bshd_map(&p.tma_k, k, 1, total, Hkv, D, T::kKVBoxRows)) != cudaSuccess ||
          (e = encode_bshd_map(&p.tma_v, v, 1, total, Hkv, D, T::kKVBoxRows)) != cudaSuccess ||
          (e = encode_bshd_map(&p.tma_o, o, 1, total, H, D, 64)) != cudaSuccess)
        return fail(e, "cuTensorMapEncodeTiled failed for this varlen batch");
      int dev = 0, ctas = 0;  // persistent, no more clusters than there are tasks
      if ((e = cudaGetDevice(&dev)) != cudaSuccess)
        return fail(e, std::string("cudaGetDevice: ") + cudaGetErrorString(e));
      if ((e = persistent_ctas<true>(dev, &ctas)) != cudaSuccess) return e;
      const long long clusters = std::min<long long>(ctas / T::kClusterSize, plan.bound);
      return launch<true>(p, dim3(unsigned(clusters * T::kClusterSize)), stream);
    }
  }
};

}  // namespace fa_tune

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

// The C ABI's version: 2 adds Hkv (GQA/MQA) and the softmax scale (docs/ARCHITECTURE.md).
FA_TUNE_API int FA_TUNE_FN(abi_version)(void) { return 2; }

// Q, O: [B, S, Hq, D]; K, V: [B, S, Hkv, D] (BF16, contiguous); lse: [B, Hq, S] FP32 or NULL.
// softmax_scale 0 means 1/sqrt(D). Causal or not and D are compiled in (the config).
FA_TUNE_API int FA_TUNE_FN(forward)(const void* q, const void* k, const void* v, void* o,
                                    float* lse, int B, int Hq, int Hkv, int S,
                                    float softmax_scale, cudaStream_t stream) {
  return int(fa_tune::Launcher<Config>::forward(q, k, v, o, lse, B, Hq, Hkv, S, softmax_scale,
                                                stream));
}

// One-time setup for a shape: the static scheduler's task lists (built and uploaded), the
// dynamic scheduler's counter. *host_ms: time spent (0 when already prepared). forward()
// prepares on first use too, so calling this only moves the cost out of the first launch.
FA_TUNE_API int FA_TUNE_FN(prepare)(int B, int H, int Hkv, int S, cudaStream_t /*stream*/,
                                    double* host_ms) {
  using L = fa_tune::Launcher<Config>;
  fa_tune::g_last_error.clear();
  if (host_ms != nullptr) *host_ms = 0.0;
  if (B < 1 || H < 1 || Hkv < 1 || S < 1 || H % Hkv != 0)
    return int(fa_tune::fail(cudaErrorInvalidValue,
                             "B, Hq, Hkv and S must be positive and Hkv must divide Hq"));
  if (cudaError_t e = L::check_group(H, Hkv); e != cudaSuccess) return int(e);
  const L::Prepared* prep = nullptr;
  return int(L::prepare(B, H, S, &prep, host_ms));
}

// Varlen (packed) prefill: Q, O [total_tokens, Hq, D]; K, V [total_tokens, Hkv, D]; int32
// cu_seqlens [num_seqs + 1] on the device; lse [Hq, total_tokens] or NULL; causal or not per
// sequence as compiled. workspace: fa_tune_varlen_workspace_bytes() bytes of device memory, or
// NULL for the library's own (grown with cudaMalloc: not inside a graph capture; one stream at
// a time). No host sync: a small kernel builds the schedule from cu_seqlens on the stream.
FA_TUNE_API int FA_TUNE_FN(forward_varlen)(const void* q, const void* k, const void* v, void* o,
                                           float* lse, const int* cu_seqlens, int num_seqs,
                                           int total_tokens, int max_seqlen, int Hq, int Hkv,
                                           float softmax_scale, void* workspace,
                                           size_t workspace_bytes, cudaStream_t stream) {
  return int(fa_tune::Launcher<Config>::forward_varlen(
      q, k, v, o, lse, cu_seqlens, num_seqs, total_tokens, max_seqlen, Hq, Hkv, softmax_scale,
      workspace, workspace_bytes, stream));
}

// Bytes of workspace a varlen call needs (host only); 0 for invalid arguments or a library
// without the varlen kernel.
FA_TUNE_API size_t FA_TUNE_FN(varlen_workspace_bytes)(int num_seqs, int Hq, int total_tokens,
                                                      int max_seqlen) {
  using L = fa_tune::Launcher<Config>;
  if (!L::kHasVarlen || num_seqs < 1 || Hq < 1 || total_tokens < 0 || max_seqlen < 0) return 0;
  return L::varlen_plan(num_seqs, Hq, Hq, total_tokens, max_seqlen).workspace_bytes();  // no Hkv in it
}

FA_TUNE_API const char* FA_TUNE_FN(last_error)(void) { return fa_tune::g_last_error.c_str(); }

FA_TUNE_API const char* FA_TUNE_FN(config_json)(void) { return Config::json; }

// The problem class compiled in (D and the mask); Hq and Hkv are run-time arguments.
FA_TUNE_API const char* FA_TUNE_FN(problem_class)(void) {
  using D = fa_tune::Derived<Config>;
  static const std::string json =
      "{\"head_dim\":" + std::to_string(D::kHeadDim) + ",\"causal\":" +
      (D::kCausal ? "true" : "false") + ",\"varlen\":" +
      (fa_tune::Launcher<Config>::kHasVarlen ? "true" : "false") + "}";
  return json.c_str();
}

FA_TUNE_API int FA_TUNE_FN(smem_bytes)(void) { return fa_tune::Launcher<Config>::smem_bytes(); }

}  // extern "C"
