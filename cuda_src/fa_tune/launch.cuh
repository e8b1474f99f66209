// The host side of one kernel config: argument checks, TMA maps, the per-shape cache of the
// scheduler's one-time setup (each scheduler's own prepare, scheduler.cuh), the device-side
// schedule of varlen launches, and the launch itself. entry.cuh exports it as the C ABI of
// fa_tune.h.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "errors.cuh"
#include "fa_tune.h"
#include "kernel.cuh"
#include "smem.cuh"
#include "tma_map.cuh"
// The varlen kernel is a second instantiation of the same pieces: built only when asked
// (FA_TUNE_VARLEN=1: exports and workload libraries), since it adds ~13 % to a
// candidate's compile (docs/PERF.md step 48).
#ifndef FA_TUNE_VARLEN
#define FA_TUNE_VARLEN 0
#endif
#include "varlen.cuh"

namespace fa_tune {

// A BSHD tensor as TMA reads it: rows x heads per batch entry, element strides (batch, row,
// head), the head dim contiguous. Packed (varlen) tensors are one entry of all their rows.
struct TensorView {
  const void* ptr;
  int batch, rows, heads;
  long long stride[3];
};

// The TMA map of a view, read in boxes of 64 head-dim columns by `box_rows` rows.
inline cudaError_t encode_view(CUtensorMap* map, const TensorView& t, int D, int box_rows) {
  return encode_bshd_map(map, t.ptr, t.batch, t.rows, t.heads, D, box_rows, t.stride);
}

// One int per device, computed on first use (thread-safe): what a launch reads from the
// device's attributes, which never change in a process.
class PerDevice {
 public:
  template <class Compute>
  cudaError_t get(int dev, int* out, Compute&& compute) {
    std::lock_guard<std::mutex> lock(m_);
    if (auto it = values_.find(dev); it != values_.end()) {
      *out = it->second;
      return cudaSuccess;
    }
    const cudaError_t e = compute(dev, out);
    if (e == cudaSuccess) values_.emplace(dev, *out);
    return e;
  }

 private:
  std::mutex m_;
  std::map<int, int> values_;
};

template <class Cfg>
struct Launcher {
  using T = Derived<Cfg>;  // not Traits: device pass only (device_pass.cuh)
  using Sched = SchedulerFor<Cfg, false>;          // fixed length: the config's scheduler
  using VarlenSched = SchedulerFor<Cfg, true>;     // device-scheduled calls
  static constexpr bool kHasVarlen = FA_TUNE_VARLEN;
  static constexpr int smem_bytes() { return fa_tune::smem_bytes<Cfg>(); }
  // An SM's 228 KB less 1 KB per resident CTA (config.py: smem_limit).
  static_assert(smem_bytes() <= 233472 / T::kCtasPerSm - 1024,
                "ctas_per_sm CTAs of this config do not fit one SM's shared memory");

  // The call's window as the kernel reads it: keys a row sees left of its diagonal (kNoWindow:
  // none, or a library without windows).
  static int window_of(const fa_tune_args& a) {
    return T::kWindow && a.window > 0 ? a.window - 1 : kNoWindow;
  }

  // Whether the call carries device metadata (and so runs on the device-side schedule).
  static bool device_scheduled(const fa_tune_args& a) {
    return a.cu_seqlens_q != nullptr || a.cu_seqlens_k != nullptr || a.seqused_k != nullptr ||
           a.block_table != nullptr;
  }

  // Everything a call must satisfy before any CUDA work, in one line each.
  static cudaError_t check_args(const fa_tune_args* ap) {
    if (ap == nullptr) return fail(cudaErrorInvalidValue, "args must be non-null");
    const fa_tune_args& a = *ap;
    if (a.abi_version != FA_TUNE_ABI_VERSION || a.struct_bytes != int(sizeof(fa_tune_args)))
      return fail(cudaErrorInvalidValue,
                  "args of C ABI " + str(a.abi_version) + " (" + str(a.struct_bytes) +
                      " bytes); this library speaks ABI " + str(FA_TUNE_ABI_VERSION) + " (" +
                      str(sizeof(fa_tune_args)) + " bytes): rebuild the caller against its fa_tune.h");
    if (a.head_dim != T::kHeadDim)
      return fail(cudaErrorInvalidValue, "head_dim " + str(a.head_dim) +
                                             ": this library is built for head dim " + str(T::kHeadDim));
    if ((a.causal != 0) != T::kCausal)
      return fail(cudaErrorInvalidValue, std::string("causal=") + (a.causal ? "true" : "false") +
                                             ": this library is built " +
                                             (T::kCausal ? "causal" : "non-causal") + " only");
    const int B = a.batch, H = a.heads_q, Hkv = a.heads_kv;
    if (B < 1 || H < 1 || Hkv < 1)
      return fail(cudaErrorInvalidValue, "batch, heads_q and heads_kv must be positive, got B=" +
                                             str(B) + " Hq=" + str(H) + " Hkv=" + str(Hkv));
    if (H % Hkv != 0)
      return fail(cudaErrorInvalidValue, "Hq=" + str(H) + " must be a multiple of Hkv=" + str(Hkv));
    if (B > 65535 || H > 65535)
      return fail(cudaErrorInvalidValue, "batch and Hq must be at most 65535 (grid limits)");
    if (cudaError_t e = check_group(H, Hkv); e != cudaSuccess) return e;
    const void* ptrs[4] = {a.q, a.k, a.v, a.o};
    for (const void* ptr : ptrs) {
      if (ptr == nullptr) return fail(cudaErrorInvalidValue, "q, k, v and o must be non-null");
      if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
        return fail(cudaErrorInvalidValue, "q, k, v and o must be 16-byte aligned (TMA)");
    }
    const char* names[3] = {"q", "k", "v"};
    const int64_t* strides[3] = {a.q_stride, a.k_stride, a.v_stride};
    const char* dims[3] = {"batch", "sequence", "head"};
    for (int t = 0; t < 3; ++t) {
      for (int d = 0; d < 3; ++d) {
        // A batch stride is unused by a packed tensor and a single batch entry: any value (a
        // paged cache's k and v: it is the page stride, used with more than one page).
        const bool paged = t > 0 && a.block_table != nullptr;
        if (d == 0 && (paged ? a.num_pages == 1
                             : B == 1 || (t == 0 ? a.cu_seqlens_q : a.cu_seqlens_k) != nullptr))
          continue;
        const long long s = strides[t][d];
        if (s < 1 || s % 8 != 0 || s >= (1LL << 39))
          return fail(cudaErrorInvalidValue,
                      std::string(names[t]) + "'s " + dims[d] + " stride " + str(s) +
                          " (elements) must be a positive multiple of 8 below 2^39 (TMA reads "
                          "16-byte aligned rows); copy the tensor to make it so");
      }
    }
    if (!(a.softmax_scale >= 0.f) || std::isinf(a.softmax_scale))
      return fail(cudaErrorInvalidValue, "softmax_scale must be finite and >= 0 (0: 1/sqrt(D))");
    if (cudaError_t e = check_masks(a); e != cudaSuccess) return e;
    return check_pages(a);
  }

  // A paged KV cache's arguments (fa_tune.h); the table's entries are checked on the device.
  static cudaError_t check_pages(const fa_tune_args& a) {
    if (a.block_table == nullptr) {
      if (T::kPaged && device_scheduled(a))
        return fail(cudaErrorInvalidValue,
                    "this library's device-scheduled kernel reads a paged KV cache: pass "
                    "block_table (or use a library built without pages for cu_seqlens_k / "
                    "seqused_k calls)");
      return cudaSuccess;
    }
    if (!T::kPaged)
      return fail(cudaErrorInvalidValue, "block_table given: this library is built without a "
                                         "paged KV cache (build one for a :p problem class)");
    if (a.cu_seqlens_k != nullptr)
      return fail(cudaErrorInvalidValue, "cu_seqlens_k and block_table together: a paged "
                                         "cache's key counts are seqused_k");
    const int ps = a.page_size;
    if (ps < 8 || ps > 4096 || (ps & (ps - 1)) != 0)
      return fail(cudaErrorInvalidValue, "page_size " + str(ps) +
                                             " must be a power of two from 8 to 4096 rows");
    if (a.num_pages < 1 || a.max_pages < 1 || a.block_table_stride < a.max_pages)
      return fail(cudaErrorInvalidValue,
                  "num_pages (" + str(a.num_pages) + ") and max_pages (" + str(a.max_pages) +
                      ") must be positive, and block_table_stride (" +
                      str(a.block_table_stride) + ") at least max_pages");
    if ((long long)a.max_pages * ps < a.seqlen_k)
      return fail(cudaErrorInvalidValue,
                  "seqlen_k " + str(a.seqlen_k) + " is more keys than max_pages x page_size = " +
                      str((long long)a.max_pages * ps) + " (the table's row holds)");
    if (reinterpret_cast<uintptr_t>(a.block_table) % 4 != 0)
      return fail(cudaErrorInvalidValue, "block_table must be 4-byte aligned int32");
    return cudaSuccess;
  }

  // Rows per TMA box of a paged cache (PageParams::box_rows).
  static int page_box_rows(const fa_tune_args& a) {
    return std::min(a.page_size, T::kPageBoxRowsMax);
  }

  // The models' masks against what the library is built for (fa_tune.h).
  static cudaError_t check_masks(const fa_tune_args& a) {
    if (a.window < 0 || a.window > kNoWindow)
      return fail(cudaErrorInvalidValue, "window " + str(a.window) +
                                             " must be a number of keys from 1 to 2^30, or 0 for "
                                             "no window");
    if (a.window > 0 && !T::kWindow)
      return fail(cudaErrorInvalidValue, "window " + str(a.window) +
                                             ": this library is built without sliding windows "
                                             "(build one for a :w problem class)");
    if (!(a.softcap >= 0.f) || std::isinf(a.softcap))
      return fail(cudaErrorInvalidValue, "softcap must be finite and >= 0 (0: none)");
    if ((a.softcap > 0.f) != T::kSoftcap)
      return fail(cudaErrorInvalidValue,
                  T::kSoftcap ? "softcap 0: this library is built for softcapped scores; pass "
                                "the model's cap (> 0)"
                              : "softcap " + std::to_string(a.softcap) +
                                    ": this library is built without softcapping (build one for "
                                    "a :cap problem class)");
    if (a.sinks != nullptr && !T::kSinks)
      return fail(cudaErrorInvalidValue, "sinks given: this library is built without attention "
                                         "sinks (build one for a :sinks problem class)");
    if (reinterpret_cast<uintptr_t>(a.sinks) % 4 != 0)
      return fail(cudaErrorInvalidValue, "sinks must be 4-byte aligned float32");
    return cudaSuccess;
  }

  // The kernel's scale and mask parameters of a call (checked).
  template <class KP>
  static void set_scores(KP& p, const fa_tune_args& a) {
    constexpr double kLog2e = 1.4426950408889634;
    const double scale =
        a.softmax_scale > 0.f ? double(a.softmax_scale) : 1.0 / std::sqrt(double(T::kHeadDim));
    p.scale_log2 = float(kLog2e * scale);
    p.mask.window = window_of(a);
    p.mask.softcap_pre = 0.f;
    p.mask.sinks = a.sinks;
    if (T::kSoftcap) {  // tanh(s x scale / cap), then exp2 of cap x log2(e) x that
      p.mask.softcap_pre = float(scale / double(a.softcap));
      p.scale_log2 = float(kLog2e * double(a.softcap));
    }
  }

  // head_cluster: a cluster runs head_cluster query heads of one K/V group side by side.
  static cudaError_t check_group(int H, int Hkv) {
    if ((H / Hkv) % T::kHeadCtas == 0) return cudaSuccess;
    return fail(cudaErrorInvalidValue,
                "this kernel runs head_cluster " + str(T::kHeadCtas) +
                    " query heads of one K/V head together, so Hq/Hkv must be a multiple of it; "
                    "got Hq=" + str(H) + " Hkv=" + str(Hkv) +
                    " (use a config with head_cluster 1 for this problem)");
  }

  // pack_gqa's fixed-length launch: log2 P, P the largest power of two up to 8 dividing
  // Hq / Hkv (params.cuh, PackParams); 0 for every other launch.
  static int pack_shift(const fa_tune_args& a) {
    if (!T::kPackGqa) return 0;
    const int group = a.heads_q / a.heads_kv;
    int shift = 0;
    while (shift < 3 && (group >> shift) % 2 == 0) ++shift;
    return shift;
  }

  // The four TMA maps of a call: q, k, v as the caller laid them out, o dense; pack >= 0:
  // q and o through pack_gqa's 5-D view of 2^pack heads a row group (tma_map.cuh).
  static cudaError_t encode_maps(Params& p, const fa_tune_args& a, int qb, int q_rows, int kb,
                                 int k_rows, int pack = -1) {
    LoadParams& l = p.load;
    constexpr int D = T::kHeadDim;
    const int H = a.heads_q, Hkv = a.heads_kv;
    const long long o_row = (long long)H * D;
    const TensorView q{a.q, qb, q_rows, H, {a.q_stride[0], a.q_stride[1], a.q_stride[2]}};
    // A paged cache: one "batch entry" per page, of page_size rows, in boxes within a page.
    const bool paged = a.block_table != nullptr;
    if (paged) {
      kb = a.num_pages;
      k_rows = a.page_size;
    }
    const int kv_box = paged ? page_box_rows(a) : T::kKVBoxRows;
    const TensorView k{a.k, kb, k_rows, Hkv, {a.k_stride[0], a.k_stride[1], a.k_stride[2]}};
    const TensorView v{a.v, kb, k_rows, Hkv, {a.v_stride[0], a.v_stride[1], a.v_stride[2]}};
    const TensorView o{a.o, qb, q_rows, H, {q_rows * o_row, o_row, D}};
    cudaError_t e;
    if (pack >= 0) {
      const int P = 1 << pack;
      e = encode_packed_map(&l.tma_q, q.ptr, qb, q_rows, H, P, D, T::kBlockM, q.stride);
      if (e == cudaSuccess)
        e = encode_packed_map(&p.store.tma_o, o.ptr, qb, q_rows, H, P, D, 64, o.stride);
    } else {
      e = encode_view(&l.tma_q, q, D, T::kQBoxRows);
      if (e == cudaSuccess) e = encode_view(&p.store.tma_o, o, D, 64);
    }
    if (e != cudaSuccess || (e = encode_view(&l.tma_k, k, D, kv_box)) != cudaSuccess ||
        (e = encode_view(&l.tma_v, v, D, kv_box)) != cudaSuccess)
      return fail(e, "cuTensorMapEncodeTiled refused these tensors (q rows " + str(q_rows) +
                         ", k rows " + str(k_rows) + ")");
    return cudaSuccess;
  }

  // Per-shape scheduler state on the device, built once by prepare() and reused by every
  // launch of that shape (the timed region never includes it).
  struct Prepared {
    typename Sched::Params sched{};
    int num_ctas = 0;
    double host_ms = 0.0;
  };
  using Key = std::tuple<int, int, int, int, int, int, int>;  // device, B, H, Sq, Sk, window, pack
  static std::map<Key, Prepared>& cache() {
    static std::map<Key, Prepared> c;
    return c;
  }
  static std::mutex& cache_mutex() {
    static std::mutex m;
    return m;
  }

  static cudaError_t prepare(int B, int H, int Sq, int Sk, int window, int pack,
                             const Prepared** out, double* host_ms) {
    const auto t0 = std::chrono::steady_clock::now();
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return fail_cuda(e, "cudaGetDevice");
    std::lock_guard<std::mutex> lock(cache_mutex());
    const Key key{dev, B, H, Sq, Sk, window, pack};
    auto it = cache().find(key);
    if (it != cache().end()) {
      *out = &it->second;
      if (host_ms) *host_ms = 0.0;
      return cudaSuccess;
    }
    Prepared prep;
    FixedShape shape{B, H, Sq, Sk, dev, 0, window, pack};
    if (shape.num_tiles(T::kBlockM) > 0x7fffffffLL)
      return fail(cudaErrorInvalidValue, "too many query tiles for one launch");
    if ((e = persistent_ctas<false>(dev, &prep.num_ctas)) != cudaSuccess) return e;
    shape.persistent_ctas = prep.num_ctas;
    if ((e = Sched::prepare(shape, prep.sched, prep.num_ctas)) != cudaSuccess)
      return e;
    prep.host_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (host_ms) *host_ms = prep.host_ms;
    *out = &cache().emplace(key, prep).first->second;
    return cudaSuccess;
  }

  // The one-time setup of a fixed-length call (fa_tune_prepare); device-scheduled calls need
  // none.
  static cudaError_t prepare(const fa_tune_args* a, double* host_ms) {
    g_last_error.clear();
    if (host_ms != nullptr) *host_ms = 0.0;
    if (cudaError_t e = check_args(a); e != cudaSuccess) return e;
    if (device_scheduled(*a)) return cudaSuccess;
    if (cudaError_t e = check_fixed(*a); e != cudaSuccess) return e;
    const Prepared* prep = nullptr;
    return prepare(a->batch, a->heads_q, a->seqlen_q, a->seqlen_k, window_of(*a),
                   pack_shift(*a), &prep, host_ms);
  }

  // CTAs of a persistent launch on device `dev`: persistent_ctas (0: ctas_per_sm per SM); in
  // clusters whole clusters only, and no more than fit at once (a persistent cluster left
  // waiting for an SM pair would run its tasks after everyone else). Cached per device.
  template <bool kVarlen>
  static cudaError_t persistent_ctas(int dev, int* out) {
    static PerDevice cache;
    return cache.get(dev, out,
                     [](int d, int* n) { return count_persistent_ctas<kVarlen>(d, n); });
  }
  template <bool kVarlen>
  static cudaError_t count_persistent_ctas(int dev, int* out) {
    int sms = 0;
    cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess)
      return fail_cuda(e, "cudaDeviceGetAttribute");
    int n = Cfg::persistent_ctas > 0 ? Cfg::persistent_ctas : sms * T::kCtasPerSm;
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
        return fail_cuda(e, "cudaOccupancyMaxActiveClusters");
      if (fit < 1)
        return fail(cudaErrorInvalidConfiguration, "no " + std::to_string(T::kClusterSize) +
                                                       "-CTA cluster of this kernel fits the device");
      n = T::kClusterSize * std::max(1, std::min(n / T::kClusterSize, fit));
    }
    *out = n;
    return cudaSuccess;
  }

  // The dynamic shared-memory attribute is per function: set once per process.
  template <bool kVarlen = false>
  static cudaError_t set_attributes() {
    static bool done = false;
    if (done) return cudaSuccess;
    cudaError_t e = cudaFuncSetAttribute(attention_fwd_kernel<Cfg, kVarlen>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes());
    if (e != cudaSuccess) return fail_cuda(e, "cudaFuncSetAttribute");
    if constexpr (T::kCtasPerSm > 1) {
      // The whole carveout to shared memory, so that ctas_per_sm CTAs fit on an SM at once.
      e = cudaFuncSetAttribute(attention_fwd_kernel<Cfg, kVarlen>,
                               cudaFuncAttributePreferredSharedMemoryCarveout,
                               int(cudaSharedmemCarveoutMaxShared));
      if (e != cudaSuccess) return fail_cuda(e, "cudaFuncSetAttribute");
    }
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

  static cudaError_t check_fixed(const fa_tune_args& a) {
    if (a.seqlen_q < 1 || a.seqlen_k < 1)
      return fail(cudaErrorInvalidValue, "seqlen_q and seqlen_k must be positive, got " +
                                             str(a.seqlen_q) + " and " + str(a.seqlen_k));
    // pack_gqa counts rows of P heads a position, and keys in rows in the static cost model.
    if (T::kPackGqa &&
        ((long long)std::max(a.seqlen_q, a.seqlen_k) << pack_shift(a)) > (1LL << 30))
      return fail(cudaErrorInvalidValue,
                  "seqlen_q " + str(a.seqlen_q) + " and seqlen_k " + str(a.seqlen_k) + " x " +
                      str(1 << pack_shift(a)) + " packed query heads must stay within 2^30 "
                      "rows; use a config with pack_gqa false");
    return cudaSuccess;
  }

  static cudaError_t forward(const fa_tune_args* ap, cudaStream_t stream) {
    g_last_error.clear();
    if (cudaError_t e = check_args(ap); e != cudaSuccess) return e;
    const fa_tune_args& a = *ap;
    if (device_scheduled(a)) return forward_scheduled(a, stream);
    if (cudaError_t e = check_fixed(a); e != cudaSuccess) return e;
    const int B = a.batch, H = a.heads_q, Sq = a.seqlen_q, Sk = a.seqlen_k;
    const int pack = pack_shift(a);
    const Prepared* prep = nullptr;
    if (cudaError_t e = prepare(B, H, Sq, Sk, window_of(a), pack, &prep, nullptr);
        e != cudaSuccess)
      return e;
    KernelParams<Sched> p{};
    // pack_gqa: the tiles' rows and heads are virtual (params.cuh, PackParams).
    const FixedShape fs{B, H, Sq, Sk, 0, 0, window_of(a), pack};
    p.shape = ShapeInfo{B, fs.heads(), Sq, Sk, fs.m_blocks(T::kBlockM),
                        a.heads_kv, (H / a.heads_kv) >> pack};
    p.pack.shift = pack;
    p.sched = prep->sched;
    p.store.lse = a.lse;
    set_scores(p, a);
    cudaError_t e;
    if ((e = encode_maps(p, a, B, Sq, B, Sk, T::kPackGqa ? pack : -1)) != cudaSuccess) return e;
    if ((e = Sched::before_launch(p.sched, stream)) != cudaSuccess) return e;
    return launch<false>(p, Sched::grid(p.shape, prep->num_ctas), stream);
  }

  template <bool kVarlen>
  static cudaError_t launch(const KernelParams<SchedulerFor<Cfg, kVarlen>>& p, dim3 g,
                            cudaStream_t stream) {
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

  // -- device-scheduled calls (varlen.cuh builds the schedule on the device)

  // The schedule's L2 section budget on device `dev` (VarlenPlan::section_keys): key rows x
  // K/V heads whose K and V fill kL2SectionShare of L2, as the fixed-length dynamic
  // scheduler's sections. Cached per device.
  static cudaError_t section_keys(int dev, int* out) {
    static PerDevice cache;
    return cache.get(dev, out, [](int dev, int* out) {
      int l2 = 0;
      const cudaError_t e = cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev);
      if (e != cudaSuccess) return fail_cuda(e, "cudaDeviceGetAttribute");
      // A key row of one K/V head: K and V, D BF16 values each.
      const long long keys = (long long)(kL2SectionShare * l2) / (4LL * T::kHeadDim);
      *out = int(std::max(1LL, std::min<long long>(keys, INT_MAX)));
      return cudaSuccess;
    });
  }

  // head_cluster: the tasks name runs of kHeadCtas heads (the cluster takes one run).
  static VarlenPlan plan_of(const fa_tune_args& a) {
    constexpr int c = T::kHeadCtas;
    return VarlenPlan::make(a.batch, (a.heads_q + c - 1) / c,
                            std::max(1, a.heads_q / a.heads_kv / c), a.cu_seqlens_q != nullptr,
                            a.total_q, a.seqlen_q, a.seqlen_k, T::kRowsPerTask, T::kBlockN,
                            T::kCausal, window_of(a));
  }

  // The rows of q and of k/v per batch entry of a device-scheduled call (packed: all of them).
  static int q_rows(const fa_tune_args& a) { return a.cu_seqlens_q ? a.total_q : a.seqlen_q; }
  static int k_rows(const fa_tune_args& a) { return a.cu_seqlens_k ? a.total_k : a.seqlen_k; }

  // The host-side checks of a device-scheduled call (the metadata's values are the device's).
  static cudaError_t check_scheduled(const fa_tune_args& a, VarlenPlan* plan) {
    if constexpr (!kHasVarlen) {
      return fail(cudaErrorNotSupported,
                  "this library was built without the varlen kernel, which serves cu_seqlens "
                  "and seqused_k (fa-tune export builds it where the config can serve varlen)");
    }
    if (a.cu_seqlens_q != nullptr && a.total_q < 0)
      return fail(cudaErrorInvalidValue, "total_q must be >= 0, got " + str(a.total_q));
    if (a.seqlen_q < 1 || a.seqlen_k < 1)
      return fail(cudaErrorInvalidValue,
                  "seqlen_q and seqlen_k (max_seqlen_q / max_seqlen_k; a cache's rows) must be "
                  "positive, got " + str(a.seqlen_q) + " and " + str(a.seqlen_k));
    if (k_rows(a) < 1)
      return fail(cudaErrorInvalidValue, "k and v have no rows (total_k " + str(a.total_k) + ")");
    *plan = plan_of(a);
    plan->static_deal = T::kClustered;  // VarlenStaticScheduler: the list is dealt to clusters
    plan->fixed_cost = Cfg::fixed_cost;
    if (plan->slots() > 0x7fffffffLL)
      return fail(cudaErrorInvalidValue, "too many query tiles for one launch");
    if (plan->prep_smem_bytes() > 200 * 1024)
      return fail(cudaErrorInvalidValue,
                  "batch + max_seqlen_k / " + str(T::kBlockN) +
                      " is too large for the device-side schedule (" + str(plan->prep_smem_bytes()) +
                      " B of shared memory > 200 KiB); split the batch");
    return cudaSuccess;
  }

  static size_t workspace_bytes(const fa_tune_args* ap) {
    g_last_error.clear();  // a 0 then says why only when this call refused the arguments
    if (check_args(ap) != cudaSuccess || !device_scheduled(*ap)) return 0;
    VarlenPlan plan;
    if (check_scheduled(*ap, &plan) != cudaSuccess) return 0;
    return plan.workspace_bytes();
  }

  // The library's own workspace, per device, grown on demand (callers that pass none).
  static cudaError_t own_workspace(size_t bytes, cudaStream_t stream, void** out) {
    static std::map<int, std::pair<void*, size_t>> spaces;
    static std::mutex m;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return fail_cuda(e, "cudaGetDevice");
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
        return fail_cuda(e, "allocating the varlen workspace");
      ws.second = bytes;
    }
    *out = ws.first;
    return cudaSuccess;
  }

  static cudaError_t forward_scheduled(const fa_tune_args& a, cudaStream_t stream) {
    VarlenPlan plan;
    if (cudaError_t e = check_scheduled(a, &plan); e != cudaSuccess) return e;
    if constexpr (kHasVarlen) {
      if (q_rows(a) == 0) return cudaSuccess;  // no query: nothing to compute or write
      const size_t need = plan.workspace_bytes();
      void* workspace = a.workspace;
      cudaError_t e;
      if (workspace == nullptr) {
        if ((e = own_workspace(need, stream, &workspace)) != cudaSuccess) return e;
      } else if (a.workspace_bytes < need) {
        return fail(cudaErrorInvalidValue, "the workspace holds " + str(a.workspace_bytes) +
                                               " bytes; this call needs " + str(need) +
                                               " (fa_tune_workspace_bytes)");
      } else if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0) {
        return fail(cudaErrorInvalidValue, "the workspace must be 16-byte aligned");
      }
      int* counter = static_cast<int*>(workspace);
      auto* tasks = reinterpret_cast<VarlenTask*>(static_cast<char*>(workspace) + 16);
      int dev = 0, ctas = 0;
      if ((e = cudaGetDevice(&dev)) != cudaSuccess) return fail_cuda(e, "cudaGetDevice");
      if ((e = section_keys(dev, &plan.section_keys)) != cudaSuccess) return e;
      if ((e = persistent_ctas<true>(dev, &ctas)) != cudaSuccess) return e;
      if (plan.static_deal) {  // the grid's clusters (VarlenTiles::grid), where the deal is evened
        const long long g = std::min<long long>(ctas / T::kClusterSize, plan.bound);
        // Lists of too few rounds keep the snake and the schedule kernel exactly as they were;
        // the slots' costs must fit the schedule kernel's shared memory.
        const bool even = g <= kMaxSwapClusters && (plan.bound + g - 1) / g >= kSwapMinRounds &&
                          plan.bound + g <= kSwapMaxSlots;
        plan.clusters = even ? int(g) : 0;
        if (plan.prep_smem_bytes() > 200 * 1024) plan.clusters = 0;
      }

      const int qb = a.cu_seqlens_q ? 1 : a.batch, kb = a.cu_seqlens_k ? 1 : a.batch;
      VarlenMeta meta;
      meta.cu_q = a.cu_seqlens_q;
      meta.cu_k = a.cu_seqlens_k;
      meta.seqused_k = a.seqused_k;
      meta.total_q = a.total_q;
      meta.total_k = a.total_k;
      meta.max_q = a.seqlen_q;
      meta.max_k = a.seqlen_k;
      meta.block_table = a.block_table;
      meta.block_table_stride = a.block_table_stride;
      meta.max_pages = a.max_pages;
      meta.page_size = a.page_size;
      meta.num_pages = a.num_pages;
      meta.status = a.status;
      meta.o = a.o;
      meta.lse = a.lse;
      meta.lse_elems = (long long)qb * q_rows(a) * a.heads_q;
      meta.o_elems = meta.lse_elems * T::kHeadDim;
      const size_t prep_smem = plan.prep_smem_bytes();
      if (prep_smem > 48 * 1024) {  // above the default limit (batches of thousands only)
        if ((e = cudaFuncSetAttribute(varlen_prepare_kernel<>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      int(prep_smem))) != cudaSuccess)
          return fail_cuda(e, "cudaFuncSetAttribute");
      }
      varlen_prepare_kernel<><<<1, kVarlenPrepThreads, prep_smem, stream>>>(meta, plan, tasks,
                                                                            counter);
      if ((e = cudaGetLastError()) != cudaSuccess)
        return fail_cuda(e, "device-side schedule kernel");

      KernelParams<VarlenSched> p{};
      p.shape = ShapeInfo{a.batch, a.heads_q, q_rows(a), k_rows(a), 0, a.heads_kv,
                          a.heads_q / a.heads_kv};
      p.sched = typename VarlenSched::Params{tasks, counter, int(plan.read_slots())};
      p.store.lse = a.lse;
      p.store.o = a.o;
      set_scores(p, a);
      if (a.block_table != nullptr) {
        int shift = 0;
        while ((1 << shift) < a.page_size) ++shift;
        p.page = PageParams{a.block_table, a.block_table_stride, shift, page_box_rows(a),
                            a.num_pages};
      }
      if ((e = encode_maps(p, a, qb, q_rows(a), kb, k_rows(a))) != cudaSuccess) return e;
      return launch<true>(p, VarlenSched::grid(ctas, T::kClusterSize, plan.bound), stream);
    }
    return cudaSuccess;
  }
};

}  // namespace fa_tune
