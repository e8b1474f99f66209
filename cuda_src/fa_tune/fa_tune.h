// fa-tune kernel library: the C ABI. The one definition every side includes or mirrors: the
// kernel's entry points (entry.cuh), the workload dispatcher (tuner/dispatch.py), the torch op's
// C++ launch path (fa_tune_ops/csrc/attention_op.cpp) and the Python bindings (fa_tune_ops/abi.py
// mirrors the struct; tests/test_abi.py compiles this header and checks the mirror field by
// field). Exports ship it as include/fa_tune.h.
//
// Calls are asynchronous on `stream`; every int result is 0 on success, else a cudaError_t value,
// and fa_tune_last_error() says why in one line.
#ifndef FA_TUNE_H_
#define FA_TUNE_H_

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

// 5: a paged KV cache (block_table, page_size, num_pages). 4: the models' masks (window,
// softcap, sinks). 3: one argument struct (strides, S_q !=
// S_k, cu_seqlens_q/k, seqused_k, a metadata status). 2: positional arguments with Hkv and the
// softmax scale. 1: B, H, S only.
#define FA_TUNE_ABI_VERSION 5

#ifndef FA_TUNE_API
#define FA_TUNE_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

// One attention call. Q, K, V are BF16 device pointers, 16-byte aligned, the head dim
// contiguous; their batch, sequence and head strides are in elements and must be multiples of 8
// (16 bytes: TMA; the caller copies otherwise). O is written dense; lse is FP32, natural log.
//
// Fixed length (no cu_seqlens, no seqused_k): q [batch, seqlen_q, heads_q, D], k and v
// [batch, seqlen_k, heads_kv, D]; o [batch, seqlen_q, heads_q, D]; lse [batch, heads_q, seqlen_q].
//
// Device metadata (any of cu_seqlens_q, cu_seqlens_k, seqused_k; int32 ON THE DEVICE): the
// schedule is built on the device (no host sync), and `batch` is the number of sequences.
//   cu_seqlens_q [batch + 1]: sequence b's queries are rows cu_seqlens_q[b] .. [b + 1] of a
//     packed q [total_q, heads_q, D] (o alike, lse [heads_q, total_q]); 0 = cu_seqlens_q[0] <=
//     ... <= cu_seqlens_q[batch] = total_q. NULL: q is fixed length as above.
//   cu_seqlens_k [batch + 1]: the same for k and v [total_k, heads_kv, D]. NULL: k and v are
//     [batch, seqlen_k, heads_kv, D] (a preallocated cache of seqlen_k rows per sequence).
//   seqused_k [batch]: sequence b attends to its first seqused_k[b] keys (a cache's filled
//     length, FA's cache_seqlens); NULL: all of them.
//   seqlen_q / seqlen_k then bound every sequence's length (FA3's max_seqlen_q / max_seqlen_k).
//   Metadata that breaks these rules is caught on the device before any load: nothing is read
//   or written out of bounds, o and lse are filled with NaN, and *status (when not NULL) gets
//   FA_TUNE_BAD_* bits in status[0] and the first bad sequence in status[1].
//
// Masks: causal is aligned bottom-right (FlashAttention's rule): query i of a sequence with
// s_q queries and s_k keys sees keys 0 .. i + s_k - s_q; a row that sees no key gets O = 0 and
// lse = -inf. Non-causal: every key.
//
// The models' masks (each needs a library built for it: fa_tune_problem_class() says which):
//   window >= 1: a sliding window of that many keys: query i sees no key below
//     i + s_k - s_q - window + 1 (transformers' sliding_window; FA's window_size[0] + 1), causal
//     or not; 0: none (so a zeroed struct has none). A window library runs both.
//   softcap > 0: scores s (softmax scale included) become softcap * tanh(s / softcap) before the
//     softmax (Gemma-2); 0: none. A softcap library needs one > 0, any other library 0.
//   sinks: float32 [heads_q] on the device, one logit per query head joining each of its rows'
//     softmax denominators (exp(sink)) with no value (gpt-oss); lse includes it. NULL: none.
//
// A paged KV cache (block_table not NULL; a library built for it: "paged" in
// fa_tune_problem_class()): k and v are [num_pages, page_size, heads_kv, D] (k_stride[0] /
// v_stride[0] the page stride) and sequence b's key j is row j % page_size of page
// block_table[b * block_table_stride + j / page_size] (vLLM's and FA3's page_table). A call
// with a block table is device-scheduled: seqused_k gives each sequence's key count (NULL:
// seqlen_k each), q is fixed length or packed by cu_seqlens_q, and cu_seqlens_k must be NULL.
// page_size is a power of two from 8 to 4096. Table entries a sequence's keys need (the first
// ceil(keys / page_size) of its row, at most max_pages) must lie in 0 .. num_pages - 1; others
// are never read. Rows of a sequence's last page past its keys must hold finite values (they
// are read, and masked). A table that breaks these rules is caught on the device as bad
// metadata is (FA_TUNE_BAD_BLOCK_TABLE).
typedef struct fa_tune_args {
  int32_t abi_version;   // FA_TUNE_ABI_VERSION
  int32_t struct_bytes;  // sizeof(fa_tune_args)
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;                   // or NULL
  int64_t q_stride[3];          // batch (ignored with cu_seqlens_q), sequence, head
  int64_t k_stride[3];          // batch (ignored with cu_seqlens_k), sequence, head
  int64_t v_stride[3];
  int32_t batch;                // B, or the number of sequences
  int32_t heads_q;              // Hq, a multiple of heads_kv
  int32_t heads_kv;             // Hkv
  int32_t head_dim;             // D: the library's own (checked)
  int32_t seqlen_q;             // fixed: S_q; device metadata: max_seqlen_q
  int32_t seqlen_k;             // fixed: S_k; device metadata: max_seqlen_k (a cache's rows)
  int32_t total_q;              // with cu_seqlens_q: rows of q; else ignored
  int32_t total_k;              // with cu_seqlens_k: rows of k and v; else ignored
  const int32_t* cu_seqlens_q;  // or NULL
  const int32_t* cu_seqlens_k;  // or NULL
  const int32_t* seqused_k;     // or NULL
  float softmax_scale;          // 0: 1/sqrt(D)
  int32_t causal;               // the library's own mask (checked)
  void* workspace;              // device metadata: fa_tune_workspace_bytes() bytes, or NULL
  size_t workspace_bytes;       //   (NULL: the library's own, grown outside graph captures)
  int32_t* status;              // device-visible int32[2] (e.g. pinned host memory), or NULL
  int32_t window;               // sliding window in keys; 0: none
  float softcap;                // 0: none
  const float* sinks;           // or NULL
  const int32_t* block_table;   // [batch, block_table_stride] int32 on the device, or NULL
  int32_t block_table_stride;   // elements between two sequences' rows of the table
  int32_t max_pages;            // entries per row a sequence may use (its row's length)
  int32_t page_size;            // rows per page
  int32_t num_pages;            // pages in k and v
} fa_tune_args;

// status[0] bits: what was wrong with a call's device metadata.
#define FA_TUNE_BAD_CU_SEQLENS_Q 1  // not from 0, non-decreasing, within total_q
#define FA_TUNE_BAD_CU_SEQLENS_K 2  // not from 0, non-decreasing, within total_k
#define FA_TUNE_BAD_SEQUSED_K 4     // negative, or more keys than the sequence holds
#define FA_TUNE_BAD_MAX_SEQLEN_Q 8  // a query length above seqlen_q
#define FA_TUNE_BAD_MAX_SEQLEN_K 16 // a key length above seqlen_k
#define FA_TUNE_BAD_BLOCK_TABLE 32  // an entry a sequence's keys need outside 0 .. num_pages - 1
                                    // (a row too short for seqlen_k is refused on the host)

FA_TUNE_API int fa_tune_abi_version(void);  // FA_TUNE_ABI_VERSION
FA_TUNE_API int fa_tune_forward(const fa_tune_args* args, cudaStream_t stream);
// One-time host setup of a fixed-length shape (the static scheduler's task lists: a cudaMalloc
// and a synchronous upload); forward() does it on first use, so call it before capturing a
// CUDA graph. A call with device metadata needs none (returns 0).
FA_TUNE_API int fa_tune_prepare(const fa_tune_args* args, double* host_ms);
// Workspace bytes a call with device metadata needs (host only); 0 for a fixed-length call,
// for invalid arguments, or where no kernel serves it (forward then says why).
FA_TUNE_API size_t fa_tune_workspace_bytes(const fa_tune_args* args);
FA_TUNE_API const char* fa_tune_last_error(void);   // this thread's last error
FA_TUNE_API const char* fa_tune_config_json(void);  // the config(s) compiled in
// {"head_dim":D,"causal":bool,"varlen":bool,"window":bool,"softcap":bool,"sinks":bool,
// "paged":bool}: varlen = device metadata is served; window, softcap, sinks: the models' masks
// it is built for; paged: its device-scheduled calls read a paged KV cache (and only those).
FA_TUNE_API const char* fa_tune_problem_class(void);
FA_TUNE_API int fa_tune_smem_bytes(void);  // dynamic shared memory per CTA (the largest)

// A workload library's dispatcher adds these: how many buckets, which serves a call (-1: none;
// host only), and its dispatch table (dispatch.json, compact).
FA_TUNE_API int fa_tune_bucket_count(void);
FA_TUNE_API int fa_tune_bucket_for(const fa_tune_args* args);
FA_TUNE_API const char* fa_tune_dispatch_json(void);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // FA_TUNE_H_
