"""A workload library without kernels, for fast CPU tests: the real generated dispatcher
(tuner.ship.dispatcher_cpp.dispatcher_source, including cuda_src/fa_tune/fa_tune.h as an export
includes include/fa_tune.h) linked with stub buckets that take the C ABI argument struct and
record it instead of launching. Builds in seconds (no kernel template); needs nvcc.

The stubs: buckets 0 and 1 serve device metadata (cu_seqlens_q/k, seqused_k), buckets 2 and 3
were "built without the varlen kernel" (their problem_class says so, and they refuse such a call
with 801 as the real kernel does). A call with seqlen_q == 777 fails with the bucket's own
message; one with seqlen_q == 666 and a status pointer writes FA_TUNE_BAD_CU_SEQLENS_K (2) and
sequence 5 there, as the kernel does for bad metadata (the stub writes from the host: give it
host memory, e.g. pinned); one with seqlen_q == 555 and a status pointer writes
FA_TUNE_BAD_BLOCK_TABLE (32) and sequence 1. ``STUB_B3_ABI`` (a -D define) makes bucket 3 speak
another ABI; ``STUB_PAGED=1`` makes every bucket's class paged (a block table makes a call
device-scheduled, as in the kernel; the stubs do not refuse unpaged ones: the op's checks do).
"""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

from tuner import _paths
from tuner.kernel import toolchain
from tuner.ship import dispatch, dispatcher_cpp

# A two-bucket workload (Llama-3-8B's heads) the dispatch and export tests share.
TWO = {
    "name": "two",
    "attention": {"Hq": 32, "Hkv": 8, "head_dim": 128, "causal": True},
    "buckets": [{"name": "short", "max_s": 2048}, {"name": "long", "max_s": None}],
    "traffic": {"shapes": [{"B": 1, "S": 1024}, {"B": 1, "S": 8192, "weight": 2}]},
}

HEADER_DIR = _paths.cuda_src_dir() / "fa_tune"

STUB_BUCKETS = r"""
#include <cuda_runtime.h>
#include <stddef.h>
#include "fa_tune.h"
#define API extern "C" __attribute__((visibility("default")))
#ifndef STUB_B3_ABI
#define STUB_B3_ABI FA_TUNE_ABI_VERSION
#endif
#if STUB_PAGED
#define STUB_PAGED_JSON ",\"paged\":true"
#else
#define STUB_PAGED_JSON ""
#endif
static int g_bucket = -1, g_calls = 0, g_prepares = 0;
static fa_tune_args g_args;
static cudaStream_t g_stream = nullptr;
static const char* g_err = "";
static bool scheduled(const fa_tune_args* a) {
  return a->cu_seqlens_q || a->cu_seqlens_k || a->seqused_k || a->block_table;
}
#define STUB(i, VARLEN, ABI)                                                                    \
  API int fa_tune_b##i##_abi_version(void) { return ABI; }                                      \
  API int fa_tune_b##i##_forward(const fa_tune_args* a, cudaStream_t s) {                       \
    g_bucket = i; g_calls++; g_args = *a; g_stream = s;                                         \
    if (scheduled(a) && !VARLEN) { g_err = "built without the varlen kernel (stub)"; return 801; } \
    if (a->seqlen_q == 777) { g_err = "stub says no"; return 1; }                               \
    if (a->seqlen_q == 666 && a->status) { a->status[0] = 2; a->status[1] = 5; }                \
    if (a->seqlen_q == 555 && a->status) { a->status[0] = 32; a->status[1] = 1; }               \
    return 0;                                                                                   \
  }                                                                                             \
  API int fa_tune_b##i##_prepare(const fa_tune_args* a, double* ms) {                           \
    if (ms) *ms = 0.5;                                                                          \
    g_bucket = i; g_prepares++; g_args = *a; return 0;                                          \
  }                                                                                             \
  API size_t fa_tune_b##i##_workspace_bytes(const fa_tune_args* a) {                            \
    return scheduled(a) && VARLEN && a->batch > 0 ? size_t(1000 * (i + 1) + a->batch) : 0;      \
  }                                                                                             \
  API const char* fa_tune_b##i##_last_error(void) { return g_err; }                             \
  API const char* fa_tune_b##i##_config_json(void) { return "{}"; }                             \
  API const char* fa_tune_b##i##_problem_class(void) {                                          \
    return VARLEN ? "{\"head_dim\":128,\"causal\":true,\"varlen\": true" STUB_PAGED_JSON "}"    \
                  : "{\"head_dim\":128,\"causal\":true,\"varlen\":false" STUB_PAGED_JSON "}";   \
  }                                                                                             \
  API int fa_tune_b##i##_smem_bytes(void) { return 1000 * (i + 1); }
STUB(0, 1, FA_TUNE_ABI_VERSION)
STUB(1, 1, FA_TUNE_ABI_VERSION)
STUB(2, 0, FA_TUNE_ABI_VERSION)
STUB(3, 0, STUB_B3_ABI)
API int stub_last_bucket(void) { return g_bucket; }
API int stub_calls(void) { return g_calls; }
API int stub_prepares(void) { return g_prepares; }
API const fa_tune_args* stub_last_args(void) { return &g_args; }
API void* stub_last_stream(void) { return (void*)g_stream; }
"""


def build_stub_library(table: dispatch.DispatchTable, folder: Path,
                       defines: tuple[str, ...] = ()) -> Path:
    """folder/libfa_tune_fwd.so: table's dispatcher over at most 4 stub buckets (``defines``:
    extra -D flags for the stubs, e.g. 'STUB_B3_ABI=2')."""
    assert len(table.entries) <= 4
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dispatch.cu").write_text(dispatcher_cpp.dispatcher_source(table))
    (folder / "stub.cu").write_text(STUB_BUCKETS)
    nvcc = str(toolchain.find_nvcc())
    so = folder / "libfa_tune_fwd.so"
    for src in ("dispatch.cu", "stub.cu"):
        r = subprocess.run([nvcc, "-std=c++17", "-O1", "-Xcompiler", "-fPIC", "-Xcompiler",
                            "-fvisibility=hidden", f"-I{HEADER_DIR}",
                            *[f"-D{d}" for d in defines], "-c", "-o",
                            str(folder / f"{src}.o"), str(folder / src)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
    subprocess.run([nvcc, "-shared", "-o", str(so), str(folder / "dispatch.cu.o"),
                    str(folder / "stub.cu.o")], check=True, capture_output=True, text=True)
    return so


def last_args(lib: ctypes.CDLL) -> object:
    """A copy of the args struct the stub buckets last received
    (tuner.ship.fa_tune_ops.abi.Args)."""
    from tuner.kernel.runtime import abi

    fn = lib.stub_last_args
    fn.restype = ctypes.POINTER(abi.Args)
    got = abi.Args()
    ctypes.memmove(ctypes.byref(got), fn(), ctypes.sizeof(got))
    return got
