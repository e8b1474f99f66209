/* A host-only stand-in for a built kernel .so: the fa-tune C ABI without CUDA, so the ctypes
 * binding in tuner/runtime.py can be tested on machines without a GPU. forward() fails with
 * cudaErrorInvalidValue (1) when B == 0, otherwise records its arguments. */
#include <stddef.h>

static const char* g_err = "";
static long long g_last[9];

int fa_tune_forward(const void* q, const void* k, const void* v, void* o, float* lse, int B,
                    int H, int S, void* stream) {
    if (B == 0) { g_err = "B must be positive"; return 1; }
    g_last[0] = (long long)(size_t)q; g_last[1] = (long long)(size_t)k;
    g_last[2] = (long long)(size_t)v; g_last[3] = (long long)(size_t)o;
    g_last[4] = (long long)(size_t)lse; g_last[5] = B; g_last[6] = H; g_last[7] = S;
    g_last[8] = (long long)(size_t)stream;
    g_err = "";
    return 0;
}
int fa_tune_prepare(int B, int H, int S, void* stream, double* host_ms) {
    (void)stream;
    if (S % 128) { g_err = "S must be a multiple of 128"; return 1; }
    *host_ms = 0.25 * B + H + S * 0.0;
    return 0;
}
const char* fa_tune_last_error(void) { return g_err; }
const char* fa_tune_config_json(void) { return "{\"block_m\":128,\"write_lse\":" FAKE_WRITE_LSE "}"; }
int fa_tune_smem_bytes(void) { return 123456; }
long long fake_last(int i) { return g_last[i]; }
