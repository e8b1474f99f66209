"""``fa-tune export``: a standalone package of one tuned kernel, usable without fa-tune.

Layout of the output folder::

    kernel.cu            the rendered compilation unit (tuner.build.render of the config)
    fa_tune/*.cuh        the shared kernel headers it includes (copied from cuda_src/fa_tune)
    build.sh             nvcc with exactly tuner/build.py's KERNEL_FLAGS -> build/libfa_tune_fwd.so
    lib/libfa_tune_fwd.so  the prebuilt sm_90a library: the measured config, built (cached) for
                         its class with the varlen kernel too (ProblemClass.varlen), so it
                         exports a working fa_tune_forward_varlen
    config.yaml          the config (every knob)
    results.json         the trial's measured results (per problem: its dict B, H = Hq, Hq, Hkv,
                         S, D, causal and "shape" = its text form, as tuner/store.py writes)
    README.md            the C ABI, a C++ example and a PyTorch (ctypes) example

CUTLASS/CuTe headers are not copied: build.sh takes CUTLASS_DIR (the folder holding cute/ and
cutlass/), else finds the nvidia-cutlass wheel's headers with the python on PATH.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from tuner import _paths
from tuner import build as build_mod
from tuner.config import KernelConfig, varlen_reason
from tuner.errors import FaTuneError
from tuner.problem import ProblemClass
from tuner.study import SearchError

LIB_NAME = "libfa_tune_fwd.so"


class ExportError(FaTuneError):
    """The export cannot be written (output folder exists, artifact missing, ...)."""


def nvcc_flags() -> list[str]:
    """KERNEL_FLAGS with the include placeholders as build.sh spells them."""
    out: list[str] = []
    for f in build_mod.KERNEL_FLAGS:
        if f == build_mod.CUDA_SRC_INC:
            out.append('-I"$HERE"')
        elif f == build_mod.CUTLASS_INC:
            out.append('-I"$CUTLASS_DIR"')
        else:
            out.append(shlex.quote(f))
    return out


# Finds the CUTLASS headers for an export's build.sh (both kinds of export).
_CUTLASS_PROBE = """\
if [ -z "${CUTLASS_DIR:-}" ]; then
  CUTLASS_DIR="$(python3 - <<'PY'
import importlib.util, pathlib
spec = importlib.util.find_spec("cutlass_library")
for loc in (spec.submodule_search_locations if spec else []):
    inc = pathlib.Path(loc) / "source" / "include"
    if (inc / "cute" / "tensor.hpp").is_file():
        print(inc)
        break
PY
)"
fi
if [ -z "$CUTLASS_DIR" ] || [ ! -f "$CUTLASS_DIR/cute/tensor.hpp" ]; then
  echo "build.sh: CUTLASS headers not found; set CUTLASS_DIR or pip install nvidia-cutlass" >&2
  exit 2
fi
"""


def build_script() -> str:
    flags = " \\\n    ".join(nvcc_flags())
    return f"""#!/usr/bin/env bash
# Builds build/{LIB_NAME} for sm_90a from kernel.cu with the flags fa-tune used (kernel.cu
# defines FA_TUNE_VARLEN 1: the varlen kernel, fa_tune_forward_varlen, is built too).
#   NVCC         the nvcc to use (default: nvcc on PATH, then $CUDA_HOME/bin/nvcc)
#   CUTLASS_DIR  CUTLASS include folder (holds cute/ and cutlass/); default: the headers of the
#                nvidia-cutlass pip wheel found with `python3` (pip install nvidia-cutlass)
set -euo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
NVCC="${{NVCC:-$(command -v nvcc || echo "${{CUDA_HOME:-/usr/local/cuda}}/bin/nvcc")}}"
{_CUTLASS_PROBE}mkdir -p "$HERE/build"
"$NVCC" \\
    {flags} \\
    -o "$HERE/build/{LIB_NAME}" "$HERE/kernel.cu"
echo "built $HERE/build/{LIB_NAME}"
"""


def readme(cfg: KernelConfig, info: dict[str, Any]) -> str:
    shapes = info.get("shapes") or {}
    table = "\n".join(
        f"| {s} | {v.get('median_ms', float('nan')):.4f} | {v.get('tflops', float('nan')):.1f} |"
        for s, v in shapes.items()
    )
    knobs = "\n".join(f"    {k}: {v}" for k, v in cfg.to_dict().items())
    causal = bool(info.get("causal", True))
    mask = "Causal" if causal else "Non-causal"
    d = int(info.get("head_dim", 128))
    why_not = varlen_reason(cfg, d)
    pclass_json = json.dumps({"head_dim": d, "causal": causal, "varlen": why_not is None},
                             separators=(",", ":"))
    varlen = ("`fa_tune_problem_class()` says `\"varlen\":true`." if why_not is None else
              "`fa_tune_problem_class()` says `\"varlen\":false` and `fa_tune_forward_varlen` "
              f"returns cudaErrorNotSupported (801), since this library has no varlen kernel: "
              f"{why_not}.")
    return f"""# fa-tune kernel {cfg.config_id()}

{mask} FlashAttention forward for Hopper (sm_90a): BF16 Q/O in BSHD layout (`[B, S, Hq, {d}]`,
contiguous) and K/V (`[B, S, Hkv, {d}]`: MHA, GQA or MQA), head dimension {d}, FP32
accumulation, LSE in FP32 (`[B, Hq, S]`, natural log). Exported by fa-tune from study
`{info.get('study')}`, trial {info.get('trial')}; measured on {info.get('gpu', '?')}
({info.get('protocol_text', '')}):

| problem (BxHq[/Hkv]xS[:dD][:full]) | median ms | TFLOPS (causal 2·B·Hq·S²·D / t, non-causal 4·) |
|---|---|---|
{table}

Config (every knob; also in `config.yaml`):

{knobs}

## Files

* `lib/{LIB_NAME}`: the prebuilt library: the config fa-tune gated and timed, compiled with the
  same flags from the same source plus the varlen kernel (`kernel.cu` defines `FA_TUNE_VARLEN
  1`: `fa_tune_forward_varlen`, below), a second instantiation beside the fixed-length one.
* `kernel.cu` + `fa_tune/*.cuh`: its source; `./build.sh` rebuilds it into
  `build/{LIB_NAME}` (needs nvcc >= 12.3 and the CUTLASS headers: set `CUTLASS_DIR`, or
  `pip install nvidia-cutlass`). The CUDA runtime is linked statically; the library needs only
  the NVIDIA driver at run time.
* `results.json`: the measurements; `config.yaml`: the config.

## C ABI (version 2)

```c
int fa_tune_abi_version(void);           // 2
// 0 on success, else a cudaError_t value; fa_tune_last_error() then says why.
int fa_tune_forward(const void* q, const void* k, const void* v, void* o, float* lse,
                    int B, int Hq, int Hkv, int S, float softmax_scale, cudaStream_t stream);
// one-time host setup for a shape (call once per shape before forward); *host_ms = time spent
int fa_tune_prepare(int B, int Hq, int Hkv, int S, cudaStream_t stream, double* host_ms);
// varlen (packed) prefill; 0 or a cudaError_t value, as forward
int fa_tune_forward_varlen(const void* q, const void* k, const void* v, void* o, float* lse,
                           const int* cu_seqlens, int num_seqs, int total_tokens, int max_seqlen,
                           int Hq, int Hkv, float softmax_scale, void* workspace,
                           size_t workspace_bytes, cudaStream_t stream);
// bytes of workspace a varlen call needs (host only, no CUDA call); 0: invalid arguments
size_t fa_tune_varlen_workspace_bytes(int num_seqs, int Hq, int total_tokens, int max_seqlen);
const char* fa_tune_last_error(void);
const char* fa_tune_config_json(void);   // the config this library was built from
// compiled in: {pclass_json}
const char* fa_tune_problem_class(void);
int fa_tune_smem_bytes(void);            // dynamic shared memory per CTA
```

Q, O: `[B, S, Hq, {d}]`; K, V: `[B, S, Hkv, {d}]` BF16 device pointers (16-byte aligned,
contiguous); Hkv divides Hq, and query head h reads K/V head h / (Hq / Hkv). `lse`:
`[B, Hq, S]` FP32 or NULL. `softmax_scale` 0 means 1/sqrt({d}). The launch is asynchronous on
`stream`. The library uses the CUDA context current on the calling thread (the primary context,
as the CUDA runtime does).

**Varlen** (packed sequences, FA3's `flash_attn_varlen_func` layout), {mask.lower()} per
sequence, query length = key length: Q, O `[total_tokens, Hq, {d}]`, K, V `[total_tokens, Hkv,
{d}]` (BF16, contiguous); `cu_seqlens` int32 `[num_seqs + 1]` on the device (`cu_seqlens[0]` =
0, non-decreasing, `cu_seqlens[num_seqs]` = total_tokens); `max_seqlen` at least every
sequence's length; `lse` FP32 `[Hq, total_tokens]` or NULL. `workspace`: device memory of at
least `fa_tune_varlen_workspace_bytes(num_seqs, Hq, total_tokens, max_seqlen)` bytes, or NULL
for a library-owned one (grown on demand with cudaMalloc: never inside a CUDA graph capture, one
stream at a time). No host sync: a small kernel builds the schedule from `cu_seqlens` on the
device. {varlen}

## C++ example

```cpp
// g++ -std=c++17 example.cpp -I$CUDA_HOME/include -L$CUDA_HOME/lib64 -lcudart \\
//     -L./lib -lfa_tune_fwd -Wl,-rpath,'$ORIGIN/lib' -o example
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdio>
extern "C" {{
int fa_tune_forward(const void*, const void*, const void*, void*, float*, int, int, int, int,
                    float, cudaStream_t);
int fa_tune_prepare(int, int, int, int, cudaStream_t, double*);
const char* fa_tune_last_error(void);
}}
int main() {{
  const int B = 1, Hq = 32, Hkv = 8, S = 8192, D = {d};  // Llama-3-8B's heads
  size_t nq = size_t(B) * S * Hq * D, nkv = size_t(B) * S * Hkv * D;
  __nv_bfloat16 *q, *k, *v, *o; float* lse;
  cudaMalloc(&q, nq * 2); cudaMalloc(&k, nkv * 2); cudaMalloc(&v, nkv * 2);
  cudaMalloc(&o, nq * 2); cudaMalloc(&lse, size_t(B) * Hq * S * 4);
  // ... fill q, k, v ...
  double host_ms = 0;
  if (fa_tune_prepare(B, Hq, Hkv, S, 0, &host_ms)) {{
    printf("%s\\n", fa_tune_last_error()); return 1;
  }}
  if (int rc = fa_tune_forward(q, k, v, o, lse, B, Hq, Hkv, S, 0.f, 0)) {{
    printf("error %d: %s\\n", rc, fa_tune_last_error()); return 1;
  }}
  cudaDeviceSynchronize();
  return 0;
}}
```

## PyTorch example (ctypes)

```python
import ctypes, torch
lib = ctypes.CDLL("./lib/{LIB_NAME}")
vp, ci, cf = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
lib.fa_tune_forward.argtypes = [vp, vp, vp, vp, vp, ci, ci, ci, ci, cf, vp]
lib.fa_tune_prepare.argtypes = [ci, ci, ci, ci, vp, ctypes.POINTER(ctypes.c_double)]
lib.fa_tune_last_error.restype = ctypes.c_char_p

def attention(q, k, v, scale=0.0):  # q [B, S, Hq, {d}], k/v [B, S, Hkv, {d}], bf16 CUDA
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    assert D == {d} and q.dtype == torch.bfloat16 and q.is_contiguous()
    o = torch.empty_like(q)
    lse = torch.empty(B, Hq, S, device=q.device, dtype=torch.float32)
    stream = torch.cuda.current_stream().cuda_stream
    ms = ctypes.c_double()
    if lib.fa_tune_prepare(B, Hq, Hkv, S, stream, ctypes.byref(ms)):  # once per shape
        raise RuntimeError(lib.fa_tune_last_error().decode())
    rc = lib.fa_tune_forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                             lse.data_ptr(), B, Hq, Hkv, S, scale, stream)
    if rc:
        raise RuntimeError(f"fa_tune_forward: {{rc}}: {{lib.fa_tune_last_error().decode()}}")
    return o, lse

q = torch.randn(1, 8192, 32, {d}, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(1, 8192, 8, {d}, device="cuda", dtype=torch.bfloat16) for _ in range(2))
o, lse = attention(q, k, v)
ref = torch.nn.functional.scaled_dot_product_attention(
    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal={causal},
    enable_gqa=True).transpose(1, 2)
print((o.float() - ref.float()).abs().max())
```
"""


def _results_payload(trial: Any, cfg: KernelConfig, built: Any) -> dict[str, Any]:
    conf = trial.user_attrs.get("confirmed") or {}
    from tuner.store import with_problem

    rd = conf.get("results_dir")
    if rd and (Path(rd) / "results.json").is_file():
        payload = json.loads((Path(rd) / "results.json").read_text())
        if isinstance(payload.get("shapes"), list):  # a file from before problems: fill in
            payload["shapes"] = [with_problem(s) if isinstance(s, dict) else s
                                 for s in payload["shapes"]]
        return payload
    per = conf.get("shapes") or trial.user_attrs.get("shapes") or {}
    return {  # a trial without a full results folder: what the study holds
        "schema": 1, "status": "passed", "failure": None,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": cfg.to_dict(), "config_id": cfg.config_id(),
        "note": "from the study's trial attributes (search protocol; not confirmed)"
        if not conf else "from the study's trial attributes (confirmed)",
        "value_geomean_tflops": trial.value, "confirmed": conf or None,
        "shapes": [with_problem({"shape": s, **(v if isinstance(v, dict) else {})})
                   for s, v in per.items()],
        "screen": trial.user_attrs.get("screen"),
        "build": {"so_path": str(built.so_path), "key": getattr(built, "key", None)},
    }


def protocol_text(p: dict[str, Any] | None) -> str:
    """One line naming the protocol a confirmed number was measured with."""
    if not isinstance(p, dict):
        return "full protocol"
    settle = p.get("settle_s")
    return (f"{p.get('warmup', '?')} warm-up, {p.get('rounds', '?')} x {p.get('repeat', '?')} "
            f"timed launches" + (f", each round after {settle:g} s of untimed launches"
                                 if isinstance(settle, (int, float)) and settle > 0 else ""))


def _library_class(so: str) -> ProblemClass | None:
    """The problem class a built library serves (None: not a library this fa-tune can load)."""
    from tuner.runtime import KernelModule

    try:
        return KernelModule(so).problem_class
    except FaTuneError:
        return None


def artifact_for(trial: Any, cfg: KernelConfig, pclass: ProblemClass | None = None) -> Any:
    """The cached .so the trial measured (for its problems' class, or ``pclass`` when given);
    rebuilt through the cache if it was removed, predates this fa-tune, or serves another
    class."""
    from tuner.study import trial_class

    pclass = trial_class(trial) if pclass is None else pclass
    b = trial.user_attrs.get("build") or {}
    so = b.get("so_path")
    if so and Path(so).is_file() and _library_class(so) == pclass:
        art = Path(so).parent / "artifact.json"
        if art.is_file():
            try:
                return build_mod.BuildResult.from_json(json.loads(art.read_text()), cache_hit=True)
            except (ValueError, TypeError):
                pass
        from types import SimpleNamespace

        return SimpleNamespace(so_path=so, key=b.get("key"))
    return build_mod.build_config(cfg, pclass=pclass)


def export_trial(study_name: str, storage: str | None, trial_number: int | None,
                 out: Path) -> dict[str, Any]:
    from tuner.show import pick_trial

    out = Path(out)
    if out.exists():
        raise ExportError(f"{out} already exists; choose a new --out folder")
    _, trial = pick_trial(study_name, storage, trial_number)
    cfg_d = trial.user_attrs.get("config")
    if not isinstance(cfg_d, dict):
        raise SearchError(f"trial {trial.number} has no stored config")
    cfg = KernelConfig.from_dict(cfg_d)
    from tuner.study import trial_class

    pclass = trial_class(trial)
    # The measured config with the varlen kernel too (cached; the search built it without),
    # unless the config cannot serve varlen (config.varlen_reason; the README says why).
    pclass = dataclasses.replace(pclass, varlen=varlen_reason(cfg, pclass.head_dim) is None)
    built = build_mod.build_config(cfg, pclass=pclass)
    so = Path(built.so_path)
    if not so.is_file():
        raise ExportError(f"the artifact {so} is missing; rebuild with `fa-tune build`")
    payload = _results_payload(trial, cfg, built)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        (tmp / "kernel.cu").write_text(build_mod.render(cfg, pclass=pclass))
        shutil.copytree(_paths.cuda_src_dir() / "fa_tune", tmp / "fa_tune",
                        ignore=shutil.ignore_patterns("__pycache__"))
        (tmp / "build.sh").write_text(build_script())
        (tmp / "build.sh").chmod(0o755)
        (tmp / "lib").mkdir()
        shutil.copy2(so, tmp / "lib" / LIB_NAME)
        (tmp / "config.yaml").write_text(cfg.to_yaml())
        (tmp / "results.json").write_text(json.dumps(payload, indent=2, default=str))
        conf = trial.user_attrs.get("confirmed") or {}
        shapes = conf.get("shapes") or trial.user_attrs.get("shapes") or {}
        info = {
            "study": study_name, "trial": trial.number, "shapes": shapes, "causal": pclass.causal,
            "head_dim": pclass.head_dim,
            "gpu": (payload.get("gpu") or {}).get("name", "the tuning GPU"),
            "protocol_text": protocol_text(conf.get("protocol")) if conf
            else "search protocol (not confirmed)",
        }
        (tmp / "README.md").write_text(readme(cfg, info))
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"out": out, "trial": trial.number, "config_id": cfg.config_id(), "so": so}


# ---- one library per workload (`fa-tune export --workload` / `--table`) ----------------------
# Layout of a workload export::
#
#     lib/libfa_tune_fwd.so     the dispatcher library: every bucket's kernel + dispatch.cu
#     lib/libfa_tune_torch.<torch version>.so  the op's C++ launch path (where torch was found)
#     include/fa_tune.h         the C ABI (fixed-length, varlen, dispatcher extras)
#     dispatch.cu               the generated dispatcher (tuner/dispatch.py)
#     buckets/<name>/kernel.cu  each bucket's rendered kernel; fa_tune/*.cuh the shared headers
#     build.sh                  compiles each bucket with -DFA_TUNE_API_PREFIX (each kernel.cu
#                               defines FA_TUNE_VARLEN 1: the varlen kernel too), links all
#     configs/<name>.yaml       each bucket's config
#     dispatch.json             the dispatch table (tuner.dispatch.DispatchTable, round-trips)
#     workload.yaml             the workload file it was made from (when given)
#     results.json              per bucket: the measured results of its trial (or "not measured")
#     fa_tune_ops/              the PyTorch op and the transformers backend (tuner/fa_tune_ops)
#     README.md
WORKLOAD_BUILD_TIMEOUT_S = 1800.0



def workload_build_script(table: Any) -> str:
    """build.sh of a workload export: the bucket kernels with exactly the tuner's KERNEL_FLAGS
    (compiled, not linked: -c instead of -shared; each rendered with the varlen kernel too) and
    their C ABI renamed, then the dispatcher, then one link. The prefix renames host functions
    only."""
    from tuner import dispatch as dispatch_mod

    flags = " \\\n    ".join(f for f in nvcc_flags() if f != "-shared")
    specs = " ".join(f'"{e.bucket} {dispatch_mod.symbol_prefix(i)}"'
                     for i, e in enumerate(table.entries))
    objs = " ".join(f'"$OBJ/{e.bucket}.o"' for e in table.entries)
    return f"""#!/usr/bin/env bash
# Builds build/{LIB_NAME} for sm_90a: each bucket's kernel (buckets/<name>/kernel.cu) with the
# flags fa-tune used (each kernel.cu defines FA_TUNE_VARLEN 1) and its C ABI renamed
# (-DFA_TUNE_API_PREFIX=fa_tune_b<i>_), the dispatcher (dispatch.cu), linked into one library
# that exports the fa_tune_ C ABI (include/fa_tune.h).
#   NVCC         the nvcc to use (default: nvcc on PATH, then $CUDA_HOME/bin/nvcc)
#   CUTLASS_DIR  CUTLASS include folder (holds cute/ and cutlass/); default: the headers of the
#                nvidia-cutlass pip wheel found with `python3` (pip install nvidia-cutlass)
#   JOBS         kernels compiled at once (default: the number of CPUs; ~2 GB of memory each)
set -euo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
NVCC="${{NVCC:-$(command -v nvcc || echo "${{CUDA_HOME:-/usr/local/cuda}}/bin/nvcc")}}"
{_CUTLASS_PROBE}JOBS="${{JOBS:-$(nproc 2>/dev/null || echo 1)}}"
OBJ="$HERE/build/obj"
mkdir -p "$OBJ"
KERNEL_FLAGS=(
    {flags}
)
compile_bucket() {{  # NAME PREFIX
  if ! "$NVCC" "${{KERNEL_FLAGS[@]}}" -DFA_TUNE_API_PREFIX="$2" -c -o "$OBJ/$1.o" \\
      "$HERE/buckets/$1/kernel.cu" > "$OBJ/$1.log" 2>&1; then
    echo "build.sh: bucket $1 failed to compile (log: $OBJ/$1.log):" >&2
    grep -m 3 "error" "$OBJ/$1.log" >&2 || tail -n 5 "$OBJ/$1.log" >&2
    return 1
  fi
  echo "compiled bucket $1"
}}
pids=()
status=0
for spec in {specs}; do
  # shellcheck disable=SC2086  # NAME PREFIX: two words on purpose
  compile_bucket $spec &
  pids+=("$!")
  if [ "${{#pids[@]}}" -ge "$JOBS" ]; then
    wait "${{pids[0]}}" || status=1
    pids=("${{pids[@]:1}}")
  fi
done
for pid in ${{pids[@]+"${{pids[@]}}"}}; do wait "$pid" || status=1; done
[ "$status" -eq 0 ] || exit 1
"$NVCC" -std=c++17 -O2 {build_mod.ARCH_FLAG} -Xcompiler -fPIC -Xcompiler -fvisibility=hidden \\
    -I"$HERE/include" -c -o "$OBJ/dispatch.o" "$HERE/dispatch.cu"
"$NVCC" -shared {build_mod.ARCH_FLAG} -Xcompiler -fPIC -o "$HERE/build/{LIB_NAME}" \\
    "$OBJ/dispatch.o" {objs}
echo "built $HERE/build/{LIB_NAME}"
# The PyTorch op's C++ launch path (fa_tune_ops/native.py) for $PYTHON's torch, when it has
# one: it goes beside the library. Without it the op runs its Python implementation.
PYTHON="${{PYTHON:-python3}}"
if "$PYTHON" -c "import torch" > /dev/null 2>&1; then
  PYTHONPATH="$HERE${{PYTHONPATH:+:$PYTHONPATH}}" \\
    "$PYTHON" -m fa_tune_ops.build_ext "$HERE/build" \\
    || echo "build.sh: the op's C++ launch path did not build; fa_tune_ops runs in Python" >&2
fi
"""


def _md_cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _with_varlen(cfg: KernelConfig, pclass: ProblemClass) -> ProblemClass:
    """pclass with the varlen kernel, unless cfg cannot serve varlen (config.varlen_reason):
    such a bucket answers varlen calls with cudaErrorNotSupported."""
    return dataclasses.replace(pclass, varlen=varlen_reason(cfg, pclass.head_dim) is None)


def _varlen_cell(cfg: KernelConfig, head_dim: int) -> str:
    return "yes" if varlen_reason(cfg, head_dim) is None else "no (its varlen kernel spills)"


def workload_readme(table: Any) -> str:
    from tuner import dispatch as dispatch_mod

    pc = table.problem_class
    d, causal = pc.head_dim, pc.causal
    rows = []
    for i, e in enumerate(table.entries):
        meas = e.measured or {}
        nums = "; ".join(f"{s}: {v.get('median_ms', float('nan')):.4f} ms, "
                         f"{v.get('tflops', float('nan')):.0f} TFLOPS"
                         for s, v in meas.items() if isinstance(v, dict)) or "not measured"
        rows.append(f"| {_md_cell(e.bucket)} | {e.Hq}/{e.Hkv} | {e.range_text()} | "
                    f"`{dispatch_mod.symbol_prefix(i)}` | {e.config.config_id()} | "
                    f"{_varlen_cell(e.config, d)} | "
                    f"{_md_cell(e.source_text())} | {_md_cell(nums)} |")
    table_md = "\n".join(rows)
    mask = "causal" if causal else "non-causal"
    return f"""# fa-tune workload library: {table.name}

One shared library for the workload `{table.name}`: a {mask} FlashAttention forward for Hopper
(sm_90a), BF16, head dim {d}, with one tuned kernel per length bucket and a dispatcher that
picks the bucket on every call by (Hq, Hkv, S), or for packed sequences (varlen) by (Hq, Hkv,
max_seqlen). Q/O are `[B, S, Hq, {d}]`, K/V `[B, S, Hkv, {d}]` (BSHD, contiguous), LSE
`[B, Hq, S]` FP32 (natural log); varlen below.

| bucket | Hq/Hkv | S | symbol prefix | config | varlen | from | measured |
|---|---|---|---|---|---|---|---|
{table_md}

A problem no bucket serves (other heads, S outside every range) returns cudaErrorNotSupported
(801) and `fa_tune_last_error()` says what the library serves. Batch size is not part of the
choice.

## Files

* `lib/{LIB_NAME}`: the library (built by `build.sh` at export time).
* `include/fa_tune.h`: the C ABI. `dispatch.cu`: the generated dispatcher.
* `buckets/<name>/kernel.cu` + `fa_tune/*.cuh`: each bucket's kernel source; `./build.sh`
  rebuilds the library into `build/{LIB_NAME}` (nvcc >= 12.3, the CUTLASS headers: set
  `CUTLASS_DIR` or `pip install nvidia-cutlass`; `JOBS` kernels at once). Each kernel is
  compiled with the flags fa-tune measured it with, plus `-DFA_TUNE_API_PREFIX=<prefix>`, which
  renames its C ABI functions only; each `kernel.cu` defines `FA_TUNE_VARLEN 1`, which adds
  the bucket's varlen kernel beside its fixed-length one. The CUDA runtime is linked
  statically: only the NVIDIA driver is needed at run time.
* `configs/<name>.yaml`: each bucket's config; `dispatch.json`: the dispatch table (buckets, S
  ranges, configs, sources, measured numbers); `results.json`: each bucket's measured results;
  `workload.yaml`: the workload file.
* `fa_tune_ops/`: the PyTorch op and the Hugging Face transformers backend (below).

## C ABI (version 2; `include/fa_tune.h`)

```c
int fa_tune_abi_version(void);  // 2
int fa_tune_forward(const void* q, const void* k, const void* v, void* o, float* lse,
                    int B, int Hq, int Hkv, int S, float softmax_scale, cudaStream_t stream);
int fa_tune_prepare(int B, int Hq, int Hkv, int S, cudaStream_t stream, double* host_ms);
int fa_tune_forward_varlen(const void* q, const void* k, const void* v, void* o, float* lse,
                           const int* cu_seqlens, int num_seqs, int total_tokens,
                           int max_seqlen, int Hq, int Hkv, float softmax_scale,
                           void* workspace, size_t workspace_bytes, cudaStream_t stream);
size_t fa_tune_varlen_workspace_bytes(int num_seqs, int Hq, int total_tokens, int max_seqlen);
const char* fa_tune_last_error(void);
const char* fa_tune_config_json(void);    // {{"dispatch":..., "buckets":[{{bucket, config}}...]}}
// {{"head_dim":{d},"causal":{str(causal).lower()},"varlen":...}}: varlen when some bucket serves it
const char* fa_tune_problem_class(void);
int fa_tune_smem_bytes(void);             // the largest bucket's
int fa_tune_bucket_count(void);
int fa_tune_bucket_for(int B, int Hq, int Hkv, int S);  // -1: none (host only, no CUDA)
const char* fa_tune_dispatch_json(void);  // dispatch.json, compact
```

Every call returns 0 or a cudaError_t value; `fa_tune_last_error()` (per thread) then says why,
prefixed with the bucket. `softmax_scale` 0 means 1/sqrt({d}). Launches are asynchronous on
`stream`; the library uses the CUDA context current on the calling thread. `fa_tune_prepare`
does a shape's one-time setup (the persistent scheduler's task lists: a cudaMalloc and a
synchronous upload); `fa_tune_forward` does it on first use of a shape, so prepare every shape
before capturing a CUDA graph. Each bucket's own entry points (`fa_tune_b<i>_forward`, ...: the
same ABI, no dispatch) are exported too.

**Varlen** (packed sequences, FA3's `flash_attn_varlen_func` layout): {mask} per sequence,
query length = key length. Q, O `[total_tokens, Hq, {d}]`, K, V `[total_tokens, Hkv, {d}]`
(BF16, contiguous); `cu_seqlens` int32 `[num_seqs + 1]` on the device (`cu_seqlens[0]` = 0,
non-decreasing, `cu_seqlens[num_seqs]` = total_tokens); `max_seqlen` at least every sequence's
length (it picks the bucket, as S does); `lse` FP32 `[Hq, total_tokens]` or NULL. `workspace`:
device memory of at least `fa_tune_varlen_workspace_bytes(num_seqs, Hq, total_tokens,
max_seqlen)` bytes, or NULL for a library-owned one (grown on demand with cudaMalloc: never
inside a CUDA graph capture, one stream at a time). No host sync: a small kernel builds the
schedule from `cu_seqlens` on the device. A bucket whose config has no varlen kernel (the
table's varlen column says why) returns cudaErrorNotSupported (801) for varlen calls.

## PyTorch

```python
import sys; sys.path.insert(0, "/path/to/this/folder")
import torch, fa_tune_ops                      # registers torch.ops.fa_tune.attention
q = torch.randn(1, 8192, {table.entries[0].Hq}, {d}, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(1, 8192, {table.entries[0].Hkv}, {d}, device="cuda", dtype=torch.bfloat16)
        for _ in range(2))
out, lse = torch.ops.fa_tune.attention(q, k, v, {causal}, None)  # softmax_scale None: 1/sqrt(D)
# Packed: sequences of 3000 and 5192 tokens in one [8192, H, {d}] batch.
cu = torch.tensor([0, 3000, 8192], dtype=torch.int32, device="cuda")
out, lse = torch.ops.fa_tune.attention(q[0], k[0], v[0], {causal}, None, cu, 5192)
```

`fa_tune::attention(q, k, v, causal=True, softmax_scale=None, cu_seqlens=None,
max_seqlen=None) -> (out, lse)` takes BSHD BF16 CUDA tensors, contiguous, head dim {d}, the
library's mask; out is like q, lse `[B, Hq, S]` FP32. With `cu_seqlens` (int32, 1-D, on q's
device) and `max_seqlen` (an int at least every length), it is the varlen call: q
`[total_tokens, Hq, {d}]`, k/v `[total_tokens, Hkv, {d}]`, lse `[Hq, total_tokens]`. Anything
else is a ValueError saying what is wrong. It launches on torch's current stream, allocates
its outputs (and the varlen workspace) with torch, does not synchronise the host (a fixed-length
shape's first call does the one-time setup above; varlen needs none), and has a fake (meta)
implementation, so it works under `torch.compile(fullgraph=True)` and in CUDA graph capture
(run each fixed-length shape once before capturing: the one-time setup above must not happen
inside a capture). Forward only.
The library is `lib/{LIB_NAME}` beside the package, or `$FA_TUNE_LIB`, or
`fa_tune_ops.load(PATH)`.

The op's launch path is C++ (`lib/libfa_tune_torch.<torch version>.so`, built by `build.sh`
where `python3` has torch; `$PYTHON` picks another interpreter) when it was built for the
torch you import, and Python otherwise: the same checks and results, with 4.5 us instead of
13.4 us of host time per call above a direct launch (varlen: 6.1 and 22.8 us; H200,
2026-12-01). `fa_tune_ops.native.status()` says which runs and why; `FA_TUNE_OPS_NATIVE=0`
turns the C++ path off. A call the C++ path cannot vouch for (a
shape's first call, any input it would refuse) takes the Python path, which says what is wrong.

### Hugging Face transformers

```python
import fa_tune_ops
fa_tune_ops.register_hf()          # AttentionInterface "fa_tune" (+ its mask function)
model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="fa_tune")
# or: model.set_attn_implementation("fa_tune")
```

The backend serves prefill without padding: query length = key length (no KV cache in use, or
an empty one), no attention mask other than the model's own causal one, dropout 0, BF16, head
dim {d}. Packed sequences run the varlen kernel: given as FlashAttention's keyword arguments
(`cu_seq_lens_q` = `cu_seq_lens_k`, `max_length_q`/`max_length_k`, e.g. from
`DataCollatorWithFlattening(return_flash_attn_kwargs=True)`), or found by transformers in
`position_ids` that restart (no cache, no padding mask). Anything else (decoding steps, padded
batches, softcapping, sliding windows) is a ValueError naming the cause; use another backend for
those calls.
"""


def _workload_results(table: Any, resolved: Any) -> dict[str, Any]:
    """results.json: per bucket, the measured results of its trial (a study source), else what
    the table records."""
    from types import SimpleNamespace

    out: dict[str, Any] = {"schema": 1, "workload": table.name,
                           "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "buckets": {}}
    for e in table.entries:
        r = (resolved or {}).get(e.bucket)
        trial = getattr(r, "trial", None)
        if trial is not None:
            payload = _results_payload(trial, e.config, SimpleNamespace(so_path=None, key=None))
        else:
            payload = {"status": "measured" if e.measured else "not measured",
                       "measured": e.measured}
        out["buckets"][e.bucket] = {"source": e.source, "config_id": e.config.config_id(),
                                    "results": payload}
    return out


def _check_built_library(so: Path, table: Any) -> None:
    """The library just built answers as the table says (no GPU needed: host-only calls)."""
    import ctypes

    try:
        lib = ctypes.CDLL(str(so))
        lib.fa_tune_dispatch_json.restype = ctypes.c_char_p
        lib.fa_tune_problem_class.restype = ctypes.c_char_p
        got = json.loads(lib.fa_tune_dispatch_json().decode())
        pclass = json.loads(lib.fa_tune_problem_class().decode())
        ok = (lib.fa_tune_abi_version() == 2 and lib.fa_tune_bucket_count() == len(table.entries)
              and got == json.loads(json.dumps(table.to_dict()))
              and {k: pclass.get(k) for k in ("head_dim", "causal")}
              == table.problem_class.to_dict() and isinstance(pclass.get("varlen"), bool))
    except (OSError, AttributeError, ValueError) as e:
        raise ExportError(f"the built library {so} cannot be checked: {e}") from None
    if not ok:
        raise ExportError(f"the built library {so} does not answer as dispatch.json says")


def _run_build(folder: Path, jobs: int | None) -> Path:
    """Run the export's own build.sh (so the shipped script is what built the library)."""
    import os
    import subprocess

    env = {**os.environ, "NVCC": str(build_mod.find_nvcc()),
           "CUTLASS_DIR": str(build_mod.cutlass_include()), "PYTHON": sys.executable}
    if jobs:
        env["JOBS"] = str(jobs)
    log = folder / "build" / "build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        p = subprocess.run(["bash", str(folder / "build.sh")], capture_output=True, text=True,
                           env=env, cwd=folder, timeout=WORKLOAD_BUILD_TIMEOUT_S)
        text, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired:
        text, rc = f"build.sh ran past {WORKLOAD_BUILD_TIMEOUT_S:.0f} s", -1
    log.write_text(text)
    if rc != 0:
        keep = _paths.cache_root() / "failed" / f"export-{time.strftime('%Y%m%dT%H%M%SZ')}"
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copytree(folder / "build", keep, dirs_exist_ok=True)
        first = next((ln for ln in text.splitlines() if "error" in ln.lower()),
                     text.strip().splitlines()[-1] if text.strip() else "no output")
        raise ExportError(f"build.sh failed: {first.strip()[:300]} (logs: {keep})")
    return folder / "build" / LIB_NAME


def export_workload(table: Any, out: Path, *, resolved: Any = None,
                    workload_file: Path | None = None, build: bool = True,
                    jobs: int | None = None) -> dict[str, Any]:
    """Write a workload export (layout above) for a dispatch table; with ``build``, run its
    build.sh and ship the library in lib/ (without: sources only, no nvcc)."""
    from tuner import dispatch as dispatch_mod

    out = Path(out)
    if out.exists():
        raise ExportError(f"{out} already exists; choose a new --out folder")
    pclass = table.problem_class
    for e in table.entries:
        dispatch_mod.check_entry_config(e.bucket, e.config, pclass)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        shutil.copytree(_paths.cuda_src_dir() / "fa_tune", tmp / "fa_tune",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for e in table.entries:
            (tmp / "buckets" / e.bucket).mkdir(parents=True)
            (tmp / "buckets" / e.bucket / "kernel.cu").write_text(
                build_mod.render(e.config, pclass=_with_varlen(e.config, pclass)))
            (tmp / "configs").mkdir(exist_ok=True)
            (tmp / "configs" / f"{e.bucket}.yaml").write_text(e.config.to_yaml())
        (tmp / "include").mkdir()
        (tmp / "include" / dispatch_mod.HEADER_NAME).write_text(dispatch_mod.HEADER)
        (tmp / "dispatch.cu").write_text(dispatch_mod.dispatcher_source(table))
        (tmp / "build.sh").write_text(workload_build_script(table))
        (tmp / "build.sh").chmod(0o755)
        table.save(tmp / "dispatch.json")
        if workload_file is not None:
            shutil.copy2(workload_file, tmp / "workload.yaml")
        (tmp / "results.json").write_text(
            json.dumps(_workload_results(table, resolved), indent=2, default=str))
        shutil.copytree(Path(__file__).resolve().parent / "fa_tune_ops", tmp / "fa_tune_ops",
                        ignore=shutil.ignore_patterns("__pycache__"))
        (tmp / "README.md").write_text(workload_readme(table))
        so = None
        if build:
            built = _run_build(tmp, jobs)
            _check_built_library(built, table)
            (tmp / "lib").mkdir()
            shutil.move(str(built), tmp / "lib" / LIB_NAME)
            for ext in built.parent.glob("libfa_tune_torch.*.so"):  # the op's C++ path
                shutil.move(str(ext), tmp / "lib" / ext.name)
            shutil.rmtree(tmp / "build", ignore_errors=True)
            so = out / "lib" / LIB_NAME
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"out": out, "buckets": [e.bucket for e in table.entries], "so": so}
