"""A workload library without kernels, for fast CPU tests: the real generated dispatcher
(tuner.dispatch.dispatcher_source) linked with stub buckets that record their calls instead of
launching. Builds in seconds (no kernel template); needs nvcc."""

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
// Each stub bucket records the call; S == 777 fails, to test error forwarding.
static int g_bucket = -1, g_calls = 0, g_prepares = 0, g_S = 0;
#define STUB(i)                                                                                 \
  extern "C" __attribute__((visibility("default"))) int fa_tune_b##i##_forward(                 \
      const void*, const void*, const void*, void*, float*, int, int, int, int S, float,        \
      cudaStream_t) {                                                                           \
    g_bucket = i; g_calls++; g_S = S; return S == 777 ? 1 : 0;                                  \
  }                                                                                             \
  extern "C" int fa_tune_b##i##_prepare(int, int, int, int, cudaStream_t, double* ms) {         \
    if (ms) *ms = 0.5; g_bucket = i; g_prepares++; return 0;                                    \
  }                                                                                             \
  extern "C" const char* fa_tune_b##i##_last_error(void) { return "stub says no"; }             \
  extern "C" int fa_tune_b##i##_smem_bytes(void) { return 1000 * (i + 1); }
STUB(0)
STUB(1)
STUB(2)
STUB(3)
extern "C" __attribute__((visibility("default"))) int stub_last_bucket(void) { return g_bucket; }
extern "C" __attribute__((visibility("default"))) int stub_calls(void) { return g_calls; }
extern "C" __attribute__((visibility("default"))) int stub_prepares(void) { return g_prepares; }
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
