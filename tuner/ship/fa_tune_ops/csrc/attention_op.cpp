// The CUDA kernel of fa_tune::attention in C++: the launch path without the Python round trip
// (H200, 2026-12-01, ABI 2: 4.5 us above a direct ctypes launch, against 13.4 us for
// dispatcher -> Python -> ctypes; varlen 6.1 against 22.8 us).
//
// It covers the steady state only: fixed length (S_q != S_k too), calls with device metadata
// (cu_seqlens_q / cu_seqlens_k / seqused_k), a paged KV cache (block_table: its address and
// geometry only, never its values, so CUDA graph replays read the table as it is then),
// strided q, k and v whose strides TMA reads as they are. Anything else, a call it cannot vouch for, goes to the Python implementation (the op
// fa_tune::_attention_py, same schema, op.py's _cuda_impl), which has the checks, the error
// messages, the copies of layouts TMA cannot read and the one-time setup: the first call of
// each fixed-length shape (its task-list upload must not happen inside a CUDA graph capture),
// the first call with device metadata of each bucket (it also makes the device's status
// words), a pending bad-metadata status (Python raises it), sync-check mode, a tensor on
// another device than the current one, and every input the checks below do not accept. Those
// checks mirror op.py's (checks.py); what they skip depends only on the key of a call that
// passed the Python path once.
//
// Python binds it to the loaded kernel library (fa_tune_torch_bind: the C ABI's entry points,
// taken from its ctypes handle) and rebinds it when fa_tune_ops.load() changes the library.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>

#include "fa_tune.h"

namespace {

using ForwardFn = int (*)(const fa_tune_args*, cudaStream_t);
using WorkspaceFn = size_t (*)(const fa_tune_args*);
using BucketFn = int (*)(const fa_tune_args*);
using ErrorFn = const char* (*)();

// The kernel library's C ABI (include/fa_tune.h); bucket_for is absent in a single kernel.
struct Bound {
  ForwardFn forward = nullptr;
  WorkspaceFn workspace_bytes = nullptr;
  BucketFn bucket_for = nullptr;
  ErrorFn last_error = nullptr;
  int64_t head_dim = 0;
  bool causal = true;
};

// Keys of calls the Python path ran: (device, B, Hq, Hkv, S_q, S_k) fixed length; (device, -1,
// Hq, Hkv, bucket, paged) with device metadata (paged 1 with a block table: a bucket's kernel
// takes paged calls or unpaged ones, never both, and Python says which in its words); then the
// models' masks: the window (a fixed
// shape's task lists count its tiles) and which of softcap and sinks are given (the library's
// class decides whether it takes them: the Python path says so in its words).
using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int>;

std::mutex g_mu;
Bound g_lib;
std::set<Key> g_ready;
constexpr int kMaxDevices = 64;
// Per device: the status words op.py made (pinned, device-visible), null until then.
std::atomic<int32_t*> g_status[kMaxDevices];
std::atomic<bool> g_sync_check{false};
std::atomic<long long> g_calls{0};  // kernel launches from here (fa_tune_ops.stats())

constexpr int64_t kMaxElems = (int64_t(1) << 31) - 1;  // the kernel's offsets are 32-bit

using Out = std::tuple<at::Tensor, at::Tensor>;
using OptTensor = std::optional<at::Tensor>;
using Sig = Out(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool,
                std::optional<double>, const OptTensor&, const OptTensor&,
                std::optional<c10::SymInt>, std::optional<c10::SymInt>, const OptTensor&,
                int64_t, double, const OptTensor&, const OptTensor&);

Out python_path(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                std::optional<double> scale, const OptTensor& cu_q, const OptTensor& cu_k,
                std::optional<c10::SymInt> max_q, std::optional<c10::SymInt> max_k,
                const OptTensor& seqused_k, int64_t window, double softcap,
                const OptTensor& sinks, const OptTensor& block_table) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fa_tune::_attention_py", "")
                             .typed<Sig>();
  return op.call(q, k, v, causal, scale, cu_q, cu_k, std::move(max_q), std::move(max_k),
                 seqused_k, window, softcap, sinks, block_table);
}

bool ready(const Key& key) {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_ready.count(key) != 0;
}

void mark_ready(const Key& key) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_ready.insert(key);
}

// checks.py's _layout: the (batch, sequence, head) strides TMA reads t [B, S, H, D] or packed
// [rows, H, D] with (batch 0); false where the op must copy t first (Python does). A size-1
// dimension gets a dense tensor's stride: TMA never steps along it, the library checks it.
bool kernel_strides(const at::Tensor& t, int64_t out[3]) {
  const auto sz = t.sizes();
  const auto st = t.strides();
  const int n = int(t.dim());
  if (sz[n - 1] > 1 && st[n - 1] != 1) return false;
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
  out[0] = out[1] = out[2] = 0;
  int64_t dense = sz[n - 1];
  for (int d = n - 2; d >= 0; --d) {
    const int64_t s = sz[d] == 1 ? dense : st[d];
    if (s < 1 || s % 8 != 0) return false;
    out[3 - (n - 1 - d)] = s;
    dense *= sz[d];
  }
  return true;
}

// checks.py's _check_common, once the ranks are right.
bool common_ok(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
               const Bound& lib) {
  if (q.scalar_type() != at::kBFloat16 || k.scalar_type() != at::kBFloat16 ||
      v.scalar_type() != at::kBFloat16 || k.sizes() != v.sizes())
    return false;
  const int64_t hq = q.size(-2), hkv = k.size(-2);
  return q.size(-1) == lib.head_dim && k.size(-1) == lib.head_dim && hkv > 0 && hq > 0 &&
         hq % hkv == 0 && causal == lib.causal && q.numel() <= kMaxElems &&
         k.numel() <= kMaxElems && k.get_device() == q.get_device() &&
         v.get_device() == q.get_device();
}

// An int32 metadata vector of n entries, contiguous, on q's device.
bool meta_ok(const at::Tensor& t, int64_t n, const at::Tensor& q) {
  return t.dim() == 1 && t.size(0) == n && t.scalar_type() == at::kInt &&
         (n <= 1 || t.stride(0) == 1) && t.get_device() == q.get_device();
}

// A paged call's cache and table as the C ABI takes them (checks.py's Pages).
struct Pages {
  int64_t page_size = 0, num_pages = 0, max_pages = 0, table_stride = 0;
};

// checks.py's _check_paged for the table and the pages: a block table [batch, max_pages] int32
// on q's device, unit stride along its pages, rows not overlapping (one row: its stride is
// never read, so max_pages is passed, as Python does); k [num_pages, page_size, Hkv, D] with
// page_size a power of two from 8 to 4096. False: Python decides (and says why).
bool pages_ok(const at::Tensor& table, const at::Tensor& k, int64_t batch, const at::Tensor& q,
              Pages* out) {
  if (table.dim() != 2 || table.scalar_type() != at::kInt ||
      table.get_device() != q.get_device() || table.size(0) != batch || table.size(1) < 1 ||
      (table.size(1) > 1 && table.stride(1) != 1) ||
      reinterpret_cast<uintptr_t>(table.data_ptr()) % 4 != 0 || k.dim() != 4)
    return false;
  const int64_t max_pages = table.size(1), ps = k.size(1), pages = k.size(0);
  const int64_t stride = batch > 1 ? table.stride(0) : max_pages;
  if (stride < max_pages || stride > kMaxElems || max_pages > kMaxElems || pages < 1 ||
      pages > kMaxElems || ps < 8 || ps > 4096 || (ps & (ps - 1)) != 0)
    return false;
  *out = Pages{ps, pages, max_pages, stride};
  return true;
}

// The args every call fills alike: pointers, strides (batch, sequence, head), heads, lengths.
fa_tune_args base_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                       const at::Tensor& out, const at::Tensor& lse, float scale,
                       const Bound& lib, const int64_t (&strides)[3][3], int64_t batch,
                       int64_t seqlen_q, int64_t seqlen_k) {
  fa_tune_args a{};
  std::copy(strides[0], strides[0] + 3, a.q_stride);
  std::copy(strides[1], strides[1] + 3, a.k_stride);
  std::copy(strides[2], strides[2] + 3, a.v_stride);
  a.batch = int32_t(batch);
  a.seqlen_q = int32_t(seqlen_q);
  a.seqlen_k = int32_t(seqlen_k);
  a.abi_version = FA_TUNE_ABI_VERSION;
  a.struct_bytes = int32_t(sizeof(fa_tune_args));
  a.q = q.data_ptr();
  a.k = k.data_ptr();
  a.v = v.data_ptr();
  a.o = out.data_ptr();
  a.lse = lse.data_ptr<float>();
  a.heads_q = int32_t(q.size(-2));
  a.heads_kv = int32_t(k.size(-2));
  a.head_dim = int32_t(lib.head_dim);
  a.softmax_scale = scale;
  a.causal = lib.causal ? 1 : 0;
  return a;
}

[[noreturn]] void launch_failed(int rc, const Bound& lib) {
  TORCH_CHECK(false, "fa_tune::attention: fa_tune_forward failed with CUDA error ", rc, ": ",
              lib.last_error ? lib.last_error() : "");
}

Out launch(fa_tune_args& a, at::Tensor out, at::Tensor lse, const Bound& lib, int dev) {
  const int rc = lib.forward(&a, c10::cuda::getCurrentCUDAStream(c10::DeviceIndex(dev)).stream());
  if (rc != 0) launch_failed(rc, lib);
  g_calls.fetch_add(1, std::memory_order_relaxed);
  return {std::move(out), std::move(lse)};
}

Out attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                   std::optional<double> scale, const OptTensor& cu_q, const OptTensor& cu_k,
                   std::optional<c10::SymInt> max_q, std::optional<c10::SymInt> max_k,
                   const OptTensor& seqused_k, int64_t window, double softcap,
                   const OptTensor& sinks, const OptTensor& block_table) {
  auto slow = [&]() {
    return python_path(q, k, v, causal, scale, cu_q, cu_k, max_q, max_k, seqused_k, window,
                       softcap, sinks, block_table);
  };
  Bound lib;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    lib = g_lib;
  }
  const int dev = q.get_device();
  const auto ranked = [](const at::Tensor& t) { return t.dim() == 3 || t.dim() == 4; };
  if (!ranked(q) || !ranked(k) || !ranked(v)) return slow();
  if (lib.forward == nullptr || dev < 0 || dev >= kMaxDevices ||
      dev != c10::cuda::current_device() || (scale && !(*scale > 0 && std::isfinite(*scale))) ||
      !common_ok(q, k, v, causal, lib))
    return slow();
  int32_t* status = g_status[dev].load(std::memory_order_acquire);
  if (status != nullptr && status[0] != 0) return slow();  // an earlier bad batch: Python raises
  const float scale_arg = scale ? float(*scale) : 0.f;
  int64_t st[3][3];  // q, k, v: (batch, sequence, head) element strides
  if (!kernel_strides(q, st[0]) || !kernel_strides(k, st[1]) || !kernel_strides(v, st[2]))
    return slow();
  // The models' masks: values the Python path would refuse go there for its words.
  if (window < 0 || window > (int64_t(1) << 30) || !(softcap >= 0 && std::isfinite(softcap)))
    return slow();
  if (sinks.has_value() &&
      (sinks->dim() != 1 || sinks->size(0) != q.size(-2) || sinks->scalar_type() != at::kFloat ||
       (sinks->size(0) > 1 && sinks->stride(0) != 1) || sinks->get_device() != q.get_device()))
    return slow();
  const int mask_kinds = (softcap > 0 ? 1 : 0) | (sinks.has_value() ? 2 : 0);
  auto set_masks = [&](fa_tune_args& a) {
    a.window = int32_t(window);
    a.softcap = float(softcap);
    a.sinks = sinks.has_value() ? sinks->data_ptr<float>() : nullptr;
  };

  const bool paged = block_table.has_value();
  if (!cu_q.has_value() && !cu_k.has_value() && !seqused_k.has_value() && !paged) {  // fixed
    if (max_q.has_value() || max_k.has_value() || q.dim() != 4 || k.dim() != 4) return slow();
    const int64_t B = q.size(0), Sq = q.size(1), Hq = q.size(2), Hkv = k.size(2),
                  Sk = k.size(1);
    if (B < 1 || Sq < 1 || Sk < 1 || k.size(0) != B || (causal && Sq > Sk)) return slow();
    const Key key{dev, B, Hq, Hkv, Sq, Sk, window, mask_kinds};
    if (!ready(key)) {  // the shape's first call: the Python path does its one-time setup
      Out r = slow();
      mark_ready(key);
      return r;
    }
    at::Tensor out = at::empty(q.sizes(), q.options());
    at::Tensor lse = at::empty({B, Hq, Sq}, q.options().dtype(at::kFloat));
    fa_tune_args a = base_args(q, k, v, out, lse, scale_arg, lib, st, B, Sq, Sk);
    set_masks(a);
    return launch(a, std::move(out), std::move(lse), lib, dev);
  }

  // Device metadata: checks.py's _check_scheduled (and _check_paged with a block table).
  if (g_sync_check.load(std::memory_order_relaxed) || lib.workspace_bytes == nullptr ||
      (paged && cu_k.has_value()))
    return slow();
  const bool packed_q = cu_q.has_value(), packed_k = cu_k.has_value();
  if (q.dim() != (packed_q ? 3 : 4) || k.dim() != (packed_k ? 3 : 4)) return slow();
  const std::optional<int64_t> mq = max_q ? max_q->maybe_as_int() : std::nullopt;
  const std::optional<int64_t> mk = max_k ? max_k->maybe_as_int() : std::nullopt;
  if ((max_q && !mq) || (max_k && !mk)) return slow();  // symbolic: Python decides
  int64_t batch, seqlen_q, seqlen_k, total_q = 0, total_k = 0;
  if (packed_q) {
    if (!mq || cu_q->dim() != 1 || cu_q->size(0) < 2) return slow();
    batch = cu_q->size(0) - 1;
    total_q = q.size(0);
    seqlen_q = *mq;
    if (!meta_ok(*cu_q, batch + 1, q) || total_q < 1) return slow();
  } else {
    batch = q.size(0);
    seqlen_q = q.size(1);
    if ((mq && *mq != seqlen_q) || batch < 1 || seqlen_q < 1) return slow();
  }
  Pages pg;
  if (paged) {  // k and v [num_pages, page_size, Hkv, D]; keys: seqused_k, max_pages x ps
    if (!pages_ok(*block_table, k, batch, q, &pg)) return slow();
    const int64_t cap = pg.max_pages * pg.page_size;
    if ((mk && *mk > cap) || (!mk && cap > kMaxElems)) return slow();
    seqlen_k = mk ? *mk : cap;
  } else if (packed_k) {
    if (!mk || !meta_ok(*cu_k, batch + 1, q)) return slow();
    total_k = k.size(0);
    seqlen_k = *mk;
  } else {
    if (k.size(0) != batch || (mk && *mk > k.size(1))) return slow();
    seqlen_k = mk ? *mk : k.size(1);
  }
  if (seqused_k.has_value() && !meta_ok(*seqused_k, batch, q)) return slow();
  if (seqlen_q < 1 || seqlen_k < 1 || seqlen_q > kMaxElems || seqlen_k > kMaxElems ||
      k.numel() < 1)
    return slow();
  const int64_t Hq = q.size(-2), Hkv = k.size(-2);
  at::Tensor out = at::empty(q.sizes(), q.options());
  at::Tensor lse = packed_q ? at::empty({Hq, total_q}, q.options().dtype(at::kFloat))
                            : at::empty({batch, Hq, seqlen_q}, q.options().dtype(at::kFloat));
  fa_tune_args a = base_args(q, k, v, out, lse, scale_arg, lib, st, batch, seqlen_q, seqlen_k);
  a.total_q = int32_t(total_q);
  a.total_k = int32_t(total_k);
  a.cu_seqlens_q = packed_q ? cu_q->data_ptr<int32_t>() : nullptr;
  a.cu_seqlens_k = packed_k ? cu_k->data_ptr<int32_t>() : nullptr;
  a.seqused_k = seqused_k.has_value() ? seqused_k->data_ptr<int32_t>() : nullptr;
  a.status = status;
  set_masks(a);
  if (paged) {  // the table's address: the kernel reads its entries at run time
    a.block_table = block_table->data_ptr<int32_t>();
    a.block_table_stride = int32_t(pg.table_stride);
    a.max_pages = int32_t(pg.max_pages);
    a.page_size = int32_t(pg.page_size);
    a.num_pages = int32_t(pg.num_pages);
  }
  const int bucket = lib.bucket_for ? lib.bucket_for(&a) : 0;
  const Key key{dev, -1, Hq, Hkv, bucket, paged ? 1 : 0, window, mask_kinds};
  const size_t nbytes = bucket < 0 ? 0 : lib.workspace_bytes(&a);
  // The bucket's first such call, or a refusal: Python (which also allocates the device's
  // status words on its first call with metadata, so the key is marked then too).
  if (status == nullptr || nbytes == 0 || !ready(key)) {
    Out r = slow();
    mark_ready(key);
    return r;
  }
  // Freed on return: the caching allocator reuses it in stream order (graphs: their pool).
  at::Tensor ws = at::empty({int64_t(nbytes)}, q.options().dtype(at::kByte));
  a.workspace = ws.data_ptr();
  a.workspace_bytes = nbytes;
  return launch(a, std::move(out), std::move(lse), lib, dev);
}

}  // namespace

// The schema is op.py's (torch.library DEF in Python); this adds the CUDA kernel only.
TORCH_LIBRARY_IMPL(fa_tune, CUDA, m) { m.impl("attention", &attention_cuda); }

extern "C" {

// The C ABI this extension was compiled against (native.py refuses a library of another).
__attribute__((visibility("default"))) int fa_tune_torch_abi_version(void) {
  return FA_TUNE_ABI_VERSION;
}

// Bind (or rebind) to a loaded kernel library: its C ABI's entry points (null where absent)
// and its problem class. Forgets which shapes ran: the new library's setup is its own.
__attribute__((visibility("default"))) int fa_tune_torch_bind(void* forward,
                                                               void* workspace_bytes,
                                                               void* bucket_for, void* last_error,
                                                               int head_dim, int causal) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_lib = Bound{reinterpret_cast<ForwardFn>(forward),
                reinterpret_cast<WorkspaceFn>(workspace_bytes),
                reinterpret_cast<BucketFn>(bucket_for),
                reinterpret_cast<ErrorFn>(last_error),
                head_dim,
                causal != 0};
  g_ready.clear();
  return 0;
}

// The status words of device `dev` (pinned host memory op.py keeps alive for the process).
__attribute__((visibility("default"))) int fa_tune_torch_set_status(int dev, void* words) {
  if (dev < 0 || dev >= kMaxDevices) return 1;
  g_status[dev].store(static_cast<int32_t*>(words), std::memory_order_release);
  return 0;
}

// Sync-check mode: every call with device metadata takes the Python path, which waits for it.
__attribute__((visibility("default"))) void fa_tune_torch_set_sync_check(int on) {
  g_sync_check.store(on != 0);
}

__attribute__((visibility("default"))) long long fa_tune_torch_calls(void) {
  return g_calls.load();
}

__attribute__((visibility("default"))) void fa_tune_torch_reset_calls(void) { g_calls.store(0); }

}  // extern "C"
