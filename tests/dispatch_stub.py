"""A workload library without kernels, for fast CPU tests: the real generated dispatcher
(tuner.dispatch.dispatcher_source) linked with stub buckets that record their calls instead of
launching (fixed-length and varlen; STUB_BUCKETS says which buckets serve varlen). Builds in
seconds (no kernel template); needs nvcc."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tuner import build as build_mod
from tuner import dispatch

# A two-bucket workload (Llama-3-8B's heads) the dispatch and export tests share.
TWO = {
    "name": "two",
    "attention": {"Hq": 32, "Hkv": 8, "head_dim": 128, "causal": True},
    "buckets": [{"name": "short", "max_s": 2048}, {"name": "long", "max_s": None}],
    "traffic": {"shapes": [{"B": 1, "S": 1024}, {"B": 1, "S": 8192, "weight": 2}]},
}

STUB_BUCKETS = r"""
#include <cuda_runtime.h>
#include <stddef.h>
#define API extern "C" __attribute__((visibility("default")))
// Each stub bucket records the call; S == 777 fails, to test error forwarding. Buckets 0 and 1
// serve varlen (num_seqs == 0 fails); bucket 2 is an object from before varlen (no varlen
// functions: the dispatcher's weak references are null); bucket 3 has them without the kernel
// (a kv_multicast build: 801).
static int g_bucket = -1, g_calls = 0, g_prepares = 0, g_S = 0;
static const char* g_err = "";
static long long g_varlen[15];
#define STUB(i, VARLEN)                                                                         \
  API int fa_tune_b##i##_forward(const void*, const void*, const void*, void*, float*, int, int, \
                                 int, int S, float, cudaStream_t) {                             \
    g_bucket = i; g_calls++; g_S = S; g_err = "stub says no"; return S == 777 ? 1 : 0;          \
  }                                                                                             \
  API int fa_tune_b##i##_prepare(int, int, int, int, cudaStream_t, double* ms) {                \
    if (ms) *ms = 0.5; g_bucket = i; g_prepares++; return 0;                                    \
  }                                                                                             \
  API const char* fa_tune_b##i##_last_error(void) { return g_err; }                             \
  API const char* fa_tune_b##i##_problem_class(void) {                                          \
    return VARLEN ? "{\"head_dim\":128,\"causal\":true,\"varlen\": true}"                       \
                  : "{\"head_dim\":128,\"causal\":true,\"varlen\":false}";                      \
  }                                                                                             \
  API int fa_tune_b##i##_smem_bytes(void) { return 1000 * (i + 1); }
#define STUB_VARLEN(i, VARLEN)                                                                  \
  API int fa_tune_b##i##_forward_varlen(const void* q, const void* k, const void* v, void* o,   \
      float* lse, const int* cu, int num_seqs, int total, int max_seqlen, int Hq, int Hkv,      \
      float scale, void* ws, size_t ws_bytes, cudaStream_t stream) {                            \
    g_bucket = i; g_calls++;                                                                    \
    if (!VARLEN) { g_err = "built without the varlen kernel (stub)"; return 801; }              \
    if (num_seqs == 0) { g_err = "num_seqs must be positive"; return 1; }                       \
    const void* ptrs[] = {q, k, v, o, lse, cu, ws, stream};                                     \
    for (int j = 0; j < 8; ++j) g_varlen[j] = (long long)(size_t)ptrs[j];                       \
    g_varlen[8] = num_seqs; g_varlen[9] = total; g_varlen[10] = max_seqlen;                     \
    g_varlen[11] = Hq; g_varlen[12] = Hkv; g_varlen[13] = (long long)(scale * 1000.0f);         \
    g_varlen[14] = (long long)ws_bytes;                                                         \
    return 0;                                                                                   \
  }                                                                                             \
  API size_t fa_tune_b##i##_varlen_workspace_bytes(int num_seqs, int, int, int) {               \
    return num_seqs < 1 ? 0 : size_t(1000 * (i + 1) + num_seqs);                                \
  }
STUB(0, 1)
STUB_VARLEN(0, 1)
STUB(1, 1)
STUB_VARLEN(1, 1)
STUB(2, 0)
STUB(3, 0)
STUB_VARLEN(3, 0)
API int stub_last_bucket(void) { return g_bucket; }
API int stub_calls(void) { return g_calls; }
API int stub_prepares(void) { return g_prepares; }
API long long stub_varlen(int j) { return g_varlen[j]; }
"""


def build_stub_library(table: dispatch.DispatchTable, folder: Path) -> Path:
    """folder/libfa_tune_fwd.so: table's dispatcher over at most 4 stub buckets."""
    assert len(table.entries) <= 4
    folder.mkdir(parents=True, exist_ok=True)
    (folder / dispatch.HEADER_NAME).write_text(dispatch.HEADER)
    (folder / "dispatch.cu").write_text(dispatch.dispatcher_source(table))
    (folder / "stub.cu").write_text(STUB_BUCKETS)
    nvcc = str(build_mod.find_nvcc())
    so = folder / "libfa_tune_fwd.so"
    for src in ("dispatch.cu", "stub.cu"):
        subprocess.run([nvcc, "-std=c++17", "-O1", "-Xcompiler", "-fPIC", "-Xcompiler",
                        "-fvisibility=hidden", f"-I{folder}", "-c", "-o",
                        str(folder / f"{src}.o"), str(folder / src)],
                       check=True, capture_output=True, text=True)
    subprocess.run([nvcc, "-shared", "-o", str(so), str(folder / "dispatch.cu.o"),
                    str(folder / "stub.cu.o")], check=True, capture_output=True, text=True)
    return so
