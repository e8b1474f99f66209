/* A host-only stand-in for a built kernel .so: the fa-tune C ABI (version 4, fa_tune.h, compiled
 * with a stub cuda_runtime.h that only declares cudaStream_t) without CUDA, so the ctypes
 * binding in tuner/kernel/runtime.py can be tested on machines without a GPU. Every call records its
 * argument struct and stream (fake_last_args / fake_last_stream). Built with
 * -DFAKE_WRITE_LSE="true"|"false", optionally -DFAKE_CAUSAL="false" (default "true") and
 * -DFAKE_VARLEN=0|1 (default 1: the varlen kernel compiled in; 0: calls with device metadata
 * fail with 801, as a library built without it), -DFAKE_MASKS='",\"window\":true"' (the models'
 * masks its problem class names; default none).
 *   forward: batch == 0 -> cudaErrorInvalidValue (1) "batch must be positive"; a call with
 *     device metadata whose total_q is 13 "finds bad metadata": status[0] = 1 | 8 (bad
 *     cu_seqlens_q, a query length above max_seqlen_q), status[1] = 2 (the first bad sequence).
 *   prepare: seqlen_q not a multiple of 128 -> 1; else host_ms = 0.25 * batch + heads_q.
 *   workspace_bytes: 0 without device metadata; else batch * 1000 + heads_q * 100 + seqlen_q. */
#include <stddef.h>
#include <string.h>

#include "fa_tune.h"

#ifndef FAKE_CAUSAL
#define FAKE_CAUSAL "true"
#endif
#ifndef FAKE_VARLEN
#define FAKE_VARLEN 1
#endif
#ifndef FAKE_MASKS
#define FAKE_MASKS ""
#endif
#if FAKE_VARLEN
#define FAKE_VARLEN_JSON "true"
#else
#define FAKE_VARLEN_JSON "false"
#endif

static const char* g_err = "";
static fa_tune_args g_last;
static void* g_stream;

static int device_metadata(const fa_tune_args* a) {
    return a->cu_seqlens_q != NULL || a->cu_seqlens_k != NULL || a->seqused_k != NULL;
}

int fa_tune_abi_version(void) { return FA_TUNE_ABI_VERSION; }

int fa_tune_forward(const fa_tune_args* args, cudaStream_t stream) {
    memcpy(&g_last, args, sizeof g_last);
    g_stream = (void*)stream;
    if (args->batch == 0) { g_err = "batch must be positive"; return 1; }
    if (device_metadata(args) && !FAKE_VARLEN) {
        g_err = "built without the varlen kernel (fake)";
        return 801;
    }
    if (device_metadata(args) && args->total_q == 13 && args->status != NULL) {
        args->status[0] = FA_TUNE_BAD_CU_SEQLENS_Q | FA_TUNE_BAD_MAX_SEQLEN_Q;
        args->status[1] = 2;
    }
    g_err = "";
    return 0;
}

int fa_tune_prepare(const fa_tune_args* args, double* host_ms) {
    memcpy(&g_last, args, sizeof g_last);
    if (args->seqlen_q % 128) { g_err = "S must be a multiple of 128"; return 1; }
    *host_ms = 0.25 * args->batch + args->heads_q;
    return 0;
}

size_t fa_tune_workspace_bytes(const fa_tune_args* args) {
    if (!device_metadata(args)) return 0;
    return (size_t)args->batch * 1000 + (size_t)args->heads_q * 100 + (size_t)args->seqlen_q;
}

const char* fa_tune_last_error(void) { return g_err; }
const char* fa_tune_config_json(void) { return "{\"block_m\":128,\"write_lse\":" FAKE_WRITE_LSE "}"; }
const char* fa_tune_problem_class(void) {
    return "{\"head_dim\":128,\"causal\":" FAKE_CAUSAL ",\"varlen\":" FAKE_VARLEN_JSON FAKE_MASKS "}";
}
int fa_tune_smem_bytes(void) { return 123456; }

const fa_tune_args* fake_last_args(void) { return &g_last; }
void* fake_last_stream(void) { return g_stream; }
