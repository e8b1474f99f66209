/* A host-only stand-in for a built kernel .so: the fa-tune C ABI (version 2) without CUDA, so
 * the ctypes binding in tuner/runtime.py can be tested on machines without a GPU. forward()
 * fails with cudaErrorInvalidValue (1) when B == 0, otherwise records its arguments. Built with
 * -DFAKE_WRITE_LSE="true"|"false" and optionally -DFAKE_CAUSAL="false" (default "true") and
 * -DFAKE_VARLEN=0|1|2: 0 a library from before varlen (no varlen functions), 1 (default) the
 * varlen kernel compiled in (forward_varlen fails with 1 when num_seqs == 0, otherwise records
 * its arguments), 2 the functions without the kernel (a kv_multicast build: 801). */
#include <stddef.h>

#ifndef FAKE_CAUSAL
#define FAKE_CAUSAL "true"
#endif
#ifndef FAKE_VARLEN
#define FAKE_VARLEN 1
#endif
#if FAKE_VARLEN == 1
#define FAKE_VARLEN_JSON ",\"varlen\":true"
#elif FAKE_VARLEN == 2
#define FAKE_VARLEN_JSON ",\"varlen\":false"
#else
#define FAKE_VARLEN_JSON ""
#endif

static const char* g_err = "";
static long long g_last[11];

int fa_tune_abi_version(void) { return 2; }
int fa_tune_forward(const void* q, const void* k, const void* v, void* o, float* lse, int B,
                    int Hq, int Hkv, int S, float softmax_scale, void* stream) {
    if (B == 0) { g_err = "B must be positive"; return 1; }
    g_last[0] = (long long)(size_t)q; g_last[1] = (long long)(size_t)k;
    g_last[2] = (long long)(size_t)v; g_last[3] = (long long)(size_t)o;
    g_last[4] = (long long)(size_t)lse; g_last[5] = B; g_last[6] = Hq; g_last[7] = S;
    g_last[8] = (long long)(size_t)stream; g_last[9] = Hkv;
    g_last[10] = (long long)(softmax_scale * 1000.0f);
    g_err = "";
    return 0;
}
int fa_tune_prepare(int B, int Hq, int Hkv, int S, void* stream, double* host_ms) {
    (void)stream; (void)Hkv;
    if (S % 128) { g_err = "S must be a multiple of 128"; return 1; }
    *host_ms = 0.25 * B + Hq + S * 0.0;
    return 0;
}
const char* fa_tune_last_error(void) { return g_err; }
const char* fa_tune_config_json(void) { return "{\"block_m\":128,\"write_lse\":" FAKE_WRITE_LSE "}"; }
const char* fa_tune_problem_class(void) {
    return "{\"head_dim\":128,\"causal\":" FAKE_CAUSAL FAKE_VARLEN_JSON "}";
}
int fa_tune_smem_bytes(void) { return 123456; }
long long fake_last(int i) { return g_last[i]; }

#if FAKE_VARLEN != 0
static long long g_varlen[15];
int fa_tune_forward_varlen(const void* q, const void* k, const void* v, void* o, float* lse,
                           const int* cu_seqlens, int num_seqs, int total_tokens, int max_seqlen,
                           int Hq, int Hkv, float softmax_scale, void* workspace,
                           size_t workspace_bytes, void* stream) {
    if (FAKE_VARLEN == 2) { g_err = "built without the varlen kernel (fake)"; return 801; }
    if (num_seqs == 0) { g_err = "num_seqs must be positive"; return 1; }
    const void* ptrs[] = {q, k, v, o, lse, cu_seqlens, workspace, stream};
    for (int i = 0; i < 8; ++i) g_varlen[i] = (long long)(size_t)ptrs[i];
    g_varlen[8] = num_seqs; g_varlen[9] = total_tokens; g_varlen[10] = max_seqlen;
    g_varlen[11] = Hq; g_varlen[12] = Hkv; g_varlen[13] = (long long)(softmax_scale * 1000.0f);
    g_varlen[14] = (long long)workspace_bytes;
    g_err = "";
    return 0;
}
size_t fa_tune_varlen_workspace_bytes(int num_seqs, int Hq, int total_tokens, int max_seqlen) {
    if (num_seqs < 1 || Hq < 1 || total_tokens < 1 || max_seqlen < 1) return 0;
    return (size_t)num_seqs * 1000 + (size_t)Hq * 100 + (size_t)max_seqlen;
}
long long fake_varlen(int i) { return g_varlen[i]; }
#endif
