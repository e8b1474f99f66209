"""``fa-tune export``: a standalone package of one tuned kernel, usable without fa-tune.

Layout of the output folder::

    kernel.cu            the rendered compilation unit (tuner.kernel.build.render of the config)
    fa_tune/*.cuh        the shared kernel headers it includes (copied from cuda_src/fa_tune)
    build.sh             nvcc with exactly tuner/kernel/build.py's KERNEL_FLAGS ->
    build/libfa_tune_fwd.so fa_tune_abi.py       the C ABI (fa_tune/fa_tune.h) for ctypes:
    tuner/ship/fa_tune_ops/abi.py lib/libfa_tune_fwd.so  the prebuilt sm_90a library: the measured
    config, built (cached) for
                         its class with the varlen kernel too (ProblemClass.varlen), so it
                         serves calls with device metadata (cu_seqlens, seqused_k)
    config.yaml          the config (every knob)
    results.json         the trial's measured results (per problem: its dict B, H = Hq, Hq, Hkv,
                         S, D, causal and "shape" = its text form, as tuner/measure/store.py writes)
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
from tuner.errors import FaTuneError, SearchError
from tuner.kernel import build as build_mod
from tuner.kernel.config import KernelConfig, varlen_reason
from tuner.problem import ProblemClass

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
# defines FA_TUNE_VARLEN 1: the varlen kernel, for calls with device metadata, is built too).
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


ABI_FILE = "fa_tune_abi.py"  # a single-kernel export's copy of tuner/ship/fa_tune_ops/abi.py


def abi_section(d: int, causal: bool, header: str, pclass_json: str, workload: bool) -> str:
    """The README's C ABI section (version 3), for a single kernel or a workload library."""
    from tuner.ship import dispatch as dispatch_mod

    extras = """
int fa_tune_bucket_count(void);
int fa_tune_bucket_for(const fa_tune_args* args);  // -1: none (host only, no CUDA call)
const char* fa_tune_dispatch_json(void);           // dispatch.json, compact""" if workload else ""
    picks = ("The library picks the bucket serving (heads_q, heads_kv, seqlen_q, seqlen_k) on "
             "every call. " if workload else "")
    mask = "causal" if causal else "non-causal"
    return f"""## C ABI (version {dispatch_mod.ABI_VERSION}; `{header}`)

```c
int fa_tune_abi_version(void);  // FA_TUNE_ABI_VERSION ({dispatch_mod.ABI_VERSION})
// 0 on success, else a cudaError_t value; fa_tune_last_error() then says why (per thread).
int fa_tune_forward(const fa_tune_args* args, cudaStream_t stream);
// one-time host setup of a fixed-length shape (forward does it on first use); *host_ms = time
int fa_tune_prepare(const fa_tune_args* args, double* host_ms);
// workspace bytes of a call with device metadata (host only); 0: fixed length, or refused
size_t fa_tune_workspace_bytes(const fa_tune_args* args);
const char* fa_tune_last_error(void);
const char* fa_tune_config_json(void);
const char* fa_tune_problem_class(void);  // {pclass_json}
int fa_tune_smem_bytes(void);{extras}
```

Every call takes one `fa_tune_args` (the header documents each field): set `abi_version =
FA_TUNE_ABI_VERSION` and `struct_bytes = sizeof(fa_tune_args)`; a library of another version
refuses the call in one line. {picks}q, k, v are BF16 device pointers, 16-byte aligned, with the
head dim ({d}) contiguous and batch, sequence and head strides in elements, each a multiple of
8 (TMA reads 16-byte aligned rows): views of a fused QKV projection, or a `[B, H, S, D]` KV
cache read as BSHD, need no copy. `o` is written dense; `lse` (FP32, natural log) may be NULL.
`softmax_scale` 0 means 1/sqrt({d}). Hkv divides Hq: query head h reads K/V head h / (Hq /
Hkv). Launches are asynchronous on `stream`, in the CUDA context current on the calling thread.

* **Fixed length**: q `[batch, seqlen_q, heads_q, {d}]`, k/v `[batch, seqlen_k, heads_kv,
  {d}]`; o like q, lse `[batch, heads_q, seqlen_q]`. {mask.capitalize()}, aligned
  bottom-right as FlashAttention's: query i sees keys 0 .. i + seqlen_k - seqlen_q (a prompt
  continuing a cached prefix, a chunk of a chunked prefill). `fa_tune_prepare` does a shape's
  one-time setup (the persistent scheduler's task lists: a cudaMalloc and a synchronous
  upload); run it, or one forward, before capturing a CUDA graph.
* **Device metadata** (int32, on the device; the schedule is built there, no host sync):
  `cu_seqlens_q` `[batch + 1]` for packed q `[total_q, heads_q, {d}]` (o alike, lse `[heads_q,
  total_q]`), `cu_seqlens_k` `[batch + 1]` for packed k/v `[total_k, heads_kv, {d}]`
  (FlashAttention-3's `flash_attn_varlen_func`), `seqused_k` `[batch]`: the keys each sequence
  uses of a cache k/v `[batch, seqlen_k, heads_kv, {d}]` (`flash_attn_with_kvcache`'s
  `cache_seqlens`). `seqlen_q`/`seqlen_k` are then max_seqlen_q / max_seqlen_k. `workspace`:
  device memory of `fa_tune_workspace_bytes(args)` bytes, or NULL for a library-owned one
  (grown with cudaMalloc: never inside a graph capture). `status`: a device-visible int32[2]
  (e.g. pinned host memory) or NULL. Metadata that breaks the header's rules (not
  non-decreasing, past the rows, negative, above the max lengths) is caught on the device
  before any load: nothing is read or written out of bounds, o and lse are filled with NaN, and
  status[0] gets the `FA_TUNE_BAD_*` bits, status[1] the first bad sequence.

From ABI 2: `fa_tune_forward(q, k, v, o, lse, B, Hq, Hkv, S, scale, stream)` and
`fa_tune_forward_varlen(..., cu_seqlens, num_seqs, total_tokens, max_seqlen, ...)` are now
`fa_tune_forward(&args, stream)` (cu_seqlens goes to cu_seqlens_q and cu_seqlens_k, max_seqlen
to seqlen_q and seqlen_k), `fa_tune_varlen_workspace_bytes` is `fa_tune_workspace_bytes(&args)`
and `fa_tune_bucket_for` takes the args too.
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
    varlen = ("`fa_tune_problem_class()` says `\"varlen\":true`: calls with device metadata run."
              if why_not is None else
              "`fa_tune_problem_class()` says `\"varlen\":false` and a call with device metadata "
              f"returns cudaErrorNotSupported (801), since this library has no varlen kernel: "
              f"{why_not}.")
    return f"""# fa-tune kernel {cfg.config_id()}

{mask} FlashAttention forward for Hopper (sm_90a): BF16 Q/O in BSHD layout (`[B, S_q, Hq, {d}]`)
and K/V (`[B, S_k, Hkv, {d}]`: MHA, GQA or MQA; strided views too), head dimension {d}, FP32
accumulation, LSE in FP32 (`[B, Hq, S_q]`, natural log). Exported by fa-tune from study
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
  1`: calls with device metadata, below), a second instantiation beside the fixed-length one.
* `kernel.cu` + `fa_tune/*.cuh`: its source, and `fa_tune/fa_tune.h`, the C ABI; `./build.sh`
  rebuilds it into `build/{LIB_NAME}` (needs nvcc >= 12.3 and the CUTLASS headers: set
  `CUTLASS_DIR`, or `pip install nvidia-cutlass`). The CUDA runtime is linked statically; the
  library needs only the NVIDIA driver at run time.
* `{ABI_FILE}`: the C ABI's struct and functions for Python's ctypes (no dependencies).
* `results.json`: the measurements; `config.yaml`: the config.

{abi_section(d, causal, "fa_tune/fa_tune.h", pclass_json, workload=False)}
{varlen}

## C++ example

```cpp
// g++ -std=c++17 example.cpp -I. -I$CUDA_HOME/include -L$CUDA_HOME/lib64 -lcudart \\
//     -L./lib -lfa_tune_fwd -Wl,-rpath,'$ORIGIN/lib' -o example
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cstdio>
#include "fa_tune/fa_tune.h"
int main() {{
  const int B = 1, Hq = 32, Hkv = 8, Sq = 2048, Sk = 8192, D = {d};  // a chunk over its cache
  size_t nq = size_t(B) * Sq * Hq * D, nkv = size_t(B) * Sk * Hkv * D;
  __nv_bfloat16 *q, *k, *v, *o; float* lse;
  cudaMalloc(&q, nq * 2); cudaMalloc(&k, nkv * 2); cudaMalloc(&v, nkv * 2);
  cudaMalloc(&o, nq * 2); cudaMalloc(&lse, size_t(B) * Hq * Sq * 4);
  // ... fill q, k, v ...
  fa_tune_args a = {{}};
  a.abi_version = FA_TUNE_ABI_VERSION;
  a.struct_bytes = sizeof(fa_tune_args);
  a.q = q; a.k = k; a.v = v; a.o = o; a.lse = lse;
  // element strides (batch, sequence, head) of dense BSHD tensors; any multiples of 8 will do
  const long long qs[3] = {{(long long)Sq * Hq * D, Hq * D, D}};
  const long long ks[3] = {{(long long)Sk * Hkv * D, Hkv * D, D}};
  for (int i = 0; i < 3; ++i) {{
    a.q_stride[i] = qs[i]; a.k_stride[i] = ks[i]; a.v_stride[i] = ks[i];
  }}
  a.batch = B; a.heads_q = Hq; a.heads_kv = Hkv; a.head_dim = D;
  a.seqlen_q = Sq; a.seqlen_k = Sk; a.causal = {int(causal)};
  double host_ms = 0;
  if (fa_tune_prepare(&a, &host_ms)) {{ printf("%s\\n", fa_tune_last_error()); return 1; }}
  if (int rc = fa_tune_forward(&a, 0)) {{
    printf("error %d: %s\\n", rc, fa_tune_last_error()); return 1;
  }}
  cudaDeviceSynchronize();
  return 0;
}}
```

## PyTorch example (ctypes)

```python
import ctypes, torch
from fa_tune_abi import bind, make_args   # the C ABI's struct, mirrored for ctypes
fn = bind(ctypes.CDLL("./lib/{LIB_NAME}"))

def attention(q, k, v, scale=0.0):  # q [B, Sq, Hq, {d}], k/v [B, Sk, Hkv, {d}], bf16 CUDA views
    B, Sq, Hq, D = q.shape
    o = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, Hq, Sq, device=q.device, dtype=torch.float32)
    a = make_args(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(),
                  lse=lse.data_ptr(), q_stride=q.stride()[:3], k_stride=k.stride()[:3],
                  v_stride=v.stride()[:3], batch=B, heads_q=Hq, heads_kv=k.shape[2],
                  head_dim=D, seqlen_q=Sq, seqlen_k=k.shape[1], softmax_scale=scale,
                  causal={int(causal)})
    rc = fn["forward"](ctypes.byref(a), torch.cuda.current_stream().cuda_stream)
    if rc:
        raise RuntimeError(f"fa_tune_forward: {{rc}}: {{fn['last_error']().decode()}}")
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
    from tuner.measure.store import with_problem

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
    from tuner.kernel.runtime import KernelModule

    try:
        return KernelModule(so).problem_class
    except FaTuneError:
        return None


def artifact_for(trial: Any, cfg: KernelConfig, pclass: ProblemClass | None = None) -> Any:
    """The cached .so the trial measured (for its problems' class, or ``pclass`` when given);
    rebuilt through the cache if it was removed, predates this fa-tune, or serves another
    class."""
    from tuner.search.study import trial_class

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
    from tuner.search.trials import pick_trial

    out = Path(out)
    if out.exists():
        raise ExportError(f"{out} already exists; choose a new --out folder")
    _, trial = pick_trial(study_name, storage, trial_number)
    cfg_d = trial.user_attrs.get("config")
    if not isinstance(cfg_d, dict):
        raise SearchError(f"trial {trial.number} has no stored config")
    cfg = KernelConfig.from_dict(cfg_d)
    from tuner.search.study import trial_class

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
        shutil.copy2(Path(__file__).resolve().parent / "fa_tune_ops" / "abi.py", tmp / ABI_FILE)
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
#     include/fa_tune.h         the C ABI (cuda_src/fa_tune/fa_tune.h: the args struct, every
#                               function, the dispatcher's extras)
#     dispatch.cu               the generated dispatcher (tuner/ship/dispatch.py)
#     buckets/<name>/kernel.cu  each bucket's rendered kernel; fa_tune/*.cuh the shared headers
#     build.sh                  compiles each bucket with -DFA_TUNE_API_PREFIX (each kernel.cu
#                               defines FA_TUNE_VARLEN 1: the varlen kernel too), links all
#     configs/<name>.yaml       each bucket's config
#     dispatch.json             the dispatch table (tuner.ship.dispatch.DispatchTable, round-trips)
#     workload.yaml             the workload file it was made from (when given)
#     results.json              per bucket: the measured results of its trial (or "not measured")
#     fa_tune_ops/              the PyTorch op and the transformers backend (tuner/ship/fa_tune_ops)
#     README.md
WORKLOAD_BUILD_TIMEOUT_S = 1800.0



def workload_build_script(table: Any) -> str:
    """build.sh of a workload export: the bucket kernels with exactly the tuner's KERNEL_FLAGS
    (compiled, not linked: -c instead of -shared; each rendered with the varlen kernel too) and
    their C ABI renamed, then the dispatcher, then one link. The prefix renames host functions
    only."""
    from tuner.ship import dispatch as dispatch_mod

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
    from tuner.ship import dispatch as dispatch_mod

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
    pclass_json = (f'{{"head_dim":{d},"causal":{str(causal).lower()},"varlen":...}}: varlen '
                   "when some bucket serves it")
    hq, hkv = table.entries[0].Hq, table.entries[0].Hkv
    return f"""# fa-tune workload library: {table.name}

One shared library for the workload `{table.name}`: a {mask} FlashAttention forward for Hopper
(sm_90a), BF16, head dim {d}, with one tuned kernel per length bucket and a dispatcher that
picks the bucket on every call by (Hq, Hkv, S_q, S_k), or for a call with device metadata
(packed sequences, a cache's per-sequence lengths) by (Hq, Hkv, max_seqlen_q, max_seqlen_k):
the first row below that serves the call wins. A bucket without a key range (k) serves every
key length, so a prompt continuing a cached prefix runs the kernel of its query length's
bucket. Q/O are `[B, S_q, Hq, {d}]`, K/V `[B, S_k, Hkv, {d}]` (BSHD, strided views too), LSE
`[B, Hq, S_q]` FP32 (natural log); the rest below.

| bucket | Hq/Hkv | S | symbol prefix | config | varlen | from | measured |
|---|---|---|---|---|---|---|---|
{table_md}

A problem no bucket serves (other heads, lengths outside every range) returns
cudaErrorNotSupported (801) and `fa_tune_last_error()` says what the library serves. Batch size
is not part of the choice.

## Files

* `lib/{LIB_NAME}`: the library (built by `build.sh` at export time).
* `include/fa_tune.h`: the C ABI (the same header the kernels are compiled with).
  `dispatch.cu`: the generated dispatcher.
* `buckets/<name>/kernel.cu` + `fa_tune/*.cuh`: each bucket's kernel source; `./build.sh`
  rebuilds the library into `build/{LIB_NAME}` (nvcc >= 12.3, the CUTLASS headers: set
  `CUTLASS_DIR` or `pip install nvidia-cutlass`; `JOBS` kernels at once). Each kernel is
  compiled with the flags fa-tune measured it with, plus `-DFA_TUNE_API_PREFIX=<prefix>`, which
  renames its C ABI functions only; each `kernel.cu` defines `FA_TUNE_VARLEN 1`, which adds
  the bucket's varlen kernel beside its fixed-length one. The CUDA runtime is linked
  statically: only the NVIDIA driver is needed at run time.
* `configs/<name>.yaml`: each bucket's config; `dispatch.json`: the dispatch table (buckets,
  length ranges, configs, sources, measured numbers); `results.json`: each bucket's measured
  results; `workload.yaml`: the workload file.
* `fa_tune_ops/`: the PyTorch op and the Hugging Face transformers backend (below).

{abi_section(d, causal, "include/fa_tune.h", pclass_json, workload=True)}
Errors come prefixed with the bucket. Each bucket's own entry points (`fa_tune_b<i>_forward`,
...: the same ABI, no dispatch) are exported too. A bucket whose config has no varlen kernel
(the table's varlen column says why) returns cudaErrorNotSupported (801) for calls with device
metadata.

## PyTorch

```python
import sys; sys.path.insert(0, "/path/to/this/folder")
import torch, fa_tune_ops                      # registers torch.ops.fa_tune.attention
q = torch.randn(1, 2048, {hq}, {d}, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(1, 8192, {hkv}, {d}, device="cuda", dtype=torch.bfloat16) for _ in range(2))
out, lse = fa_tune_ops.attention(q, k, v)      # 2048 queries over 8192 keys, bottom-right
# Packed: 2 sequences, queries 1000 + 1048 over keys 3000 + 5192.
cu_q = torch.tensor([0, 1000, 2048], dtype=torch.int32, device="cuda")
cu_k = torch.tensor([0, 3000, 8192], dtype=torch.int32, device="cuda")
out, lse = fa_tune_ops.attention(q[0], k[0], v[0], cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                 max_seqlen_q=1048, max_seqlen_k=5192)
# A cache: each batch entry uses its first cache_seqlens[b] keys (flash_attn_with_kvcache).
lens = torch.tensor([6000], dtype=torch.int32, device="cuda")
out, lse = fa_tune_ops.attention(q, k, v, cache_seqlens=lens)
```

`fa_tune::attention(q, k, v, causal=True, softmax_scale=None, cu_seqlens_q=None,
cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, seqused_k=None) -> (out, lse)`, with
FlashAttention-3's names: BF16 CUDA tensors, head dim {d}, the library's mask (causal needs
S_q <= S_k for fixed length). q `[B, S_q, Hq, {d}]` or, with `cu_seqlens_q` and
`max_seqlen_q`, packed `[total_q, Hq, {d}]`; k/v `[B, S_k, Hkv, {d}]` or, with `cu_seqlens_k`
and `max_seqlen_k`, packed `[total_k, Hkv, {d}]` (a packed k needs its own cu_seqlens_k: with
cu_seqlens_q alone, k/v are a cache `[num_seqs, S_cache, Hkv, {d}]`); `seqused_k` `[B]`
(`cache_seqlens=` in `fa_tune_ops.attention`). Metadata tensors are int32, 1-D, contiguous, on
q's device. q, k and v may be strided views (fused QKV, a `[B, H, S, D]` cache transposed);
one whose strides TMA cannot read (not multiples of 8 elements, or a pointer off 16 bytes) is
copied, with a `fa_tune_ops.CopyWarning` once per process. out is dense like q's shape; lse
`[B, Hq, S_q]`, or `[Hq, total_q]` with packed q. Anything else is a ValueError saying what is
wrong, decided from shapes alone (the fake implementation runs the same checks, so
`torch.compile(fullgraph=True)` traces the op).

It launches on torch's current stream, allocates its outputs (and the workspace of a call with
device metadata) with torch, and does not synchronise the host: a fixed-length shape's first
call does the one-time setup above (run each shape once before capturing a CUDA graph); calls
with device metadata need none. Bad device metadata never faults: the kernel finds it, that
call's out and lse are NaN, and the op raises ValueError naming what was wrong at the next
call on that device; `fa_tune_ops.check()` synchronises and raises at once, and
`FA_TUNE_OPS_SYNC_CHECK=1` (or `fa_tune_ops.set_sync_check(True)`) makes every such call
synchronise and raise. `fa_tune_ops.stats()` counts the calls the kernel served and the
transformers backend's fallbacks, by reason. Forward only. The library is `lib/{LIB_NAME}`
beside the package, or `$FA_TUNE_LIB`, or `fa_tune_ops.load(PATH)`.

The op's launch path is C++ (`lib/libfa_tune_torch.<torch version>.abi<N>.so`, built by
`build.sh` where `python3` has torch; `$PYTHON` picks another interpreter) when it was built for
the torch you import, and Python otherwise: the same checks and results, with 4.5 us instead of
13.4 us of host time per call above a direct launch (ABI 2; H200, 2026-12-01).
`fa_tune_ops.native.status()` says which runs and why; `FA_TUNE_OPS_NATIVE=0` turns the C++
path off. A call the C++ path cannot vouch for (a shape's first call, a layout to copy, any
input it would refuse) takes the Python path, which says what is wrong.

### Hugging Face transformers

```python
import fa_tune_ops
fa_tune_ops.register_hf()          # AttentionInterface "fa_tune" (+ its mask function)
model = AutoModelForCausalLM.from_pretrained(..., attn_implementation="fa_tune")
out = model.generate(ids, max_new_tokens=32)   # the default DynamicCache
print(fa_tune_ops.stats())         # {{"fa_tune": ..., "fallback:fa3:decode (S_q=1 < 64)": ...}}
```

The kernel runs prefill: a fresh prompt, a prompt continuing a cached prefix (bottom-right
causal over the cache, read in place through its strides), packed sequences (FlashAttention's
`cu_seq_lens_q/k` and `max_length_q/k` keyword arguments, or `position_ids` that restart).
Every other call goes to a stated fallback, counted in `stats()`: FlashAttention-3
(`flash_attn.cute.interface`) when it imports, else torch's sdpa (with the bottom-right mask
where S_q != S_k; eager for softcap or sinks without FA3): decode steps (fewer than 64 queries:
the kernel's 64-row tiles would waste most of their work), a real attention mask (padding, a
static cache; it arrives materialised and the fallback uses it), sliding windows, softcap,
attention sinks, dropout, another dtype or head dim, lengths no bucket serves.
`FA_TUNE_HF_FALLBACK=sdpa` skips FA3.
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

    from tuner.ship import dispatch as dispatch_mod

    try:
        lib = ctypes.CDLL(str(so))
        lib.fa_tune_dispatch_json.restype = ctypes.c_char_p
        lib.fa_tune_problem_class.restype = ctypes.c_char_p
        got = json.loads(lib.fa_tune_dispatch_json().decode())
        pclass = json.loads(lib.fa_tune_problem_class().decode())
        ok = (lib.fa_tune_abi_version() == dispatch_mod.ABI_VERSION
              and lib.fa_tune_bucket_count() == len(table.entries)
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
    from tuner.ship import dispatch as dispatch_mod

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
        (tmp / "include").mkdir()  # the C ABI's one header, as the kernels include it
        shutil.copy2(_paths.cuda_src_dir() / "fa_tune" / dispatch_mod.HEADER_NAME,
                     tmp / "include" / dispatch_mod.HEADER_NAME)
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
