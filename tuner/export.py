"""``fa-tune export``: a standalone package of one tuned kernel, usable without fa-tune.

Layout of the output folder::

    kernel.cu            the rendered compilation unit (tuner.build.render of the config)
    fa_tune/*.cuh        the shared kernel headers it includes (copied from cuda_src/fa_tune)
    build.sh             nvcc with exactly tuner/build.py's KERNEL_FLAGS -> build/libfa_tune_fwd.so
    lib/libfa_tune_fwd.so  the prebuilt sm_90a library: the very file the tuner measured
    config.yaml          the config (every knob)
    results.json         the trial's measured results (per problem: its dict B, H = Hq, Hq, Hkv,
                         S, D, causal and "shape" = its text form, as tuner/store.py writes)
    README.md            the C ABI, a C++ example and a PyTorch (ctypes) example

CUTLASS/CuTe headers are not copied: build.sh takes CUTLASS_DIR (the folder holding cute/ and
cutlass/), else finds the nvidia-cutlass wheel's headers with the python on PATH.
"""

from __future__ import annotations

import json
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

from tuner import _paths
from tuner import build as build_mod
from tuner.config import KernelConfig
from tuner.errors import FaTuneError
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


def build_script() -> str:
    flags = " \\\n    ".join(nvcc_flags())
    return f"""#!/usr/bin/env bash
# Builds build/{LIB_NAME} for sm_90a from kernel.cu with the flags fa-tune used.
#   NVCC         the nvcc to use (default: nvcc on PATH, then $CUDA_HOME/bin/nvcc)
#   CUTLASS_DIR  CUTLASS include folder (holds cute/ and cutlass/); default: the headers of the
#                nvidia-cutlass pip wheel found with `python3` (pip install nvidia-cutlass)
set -euo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
NVCC="${{NVCC:-$(command -v nvcc || echo "${{CUDA_HOME:-/usr/local/cuda}}/bin/nvcc")}}"
if [ -z "${{CUTLASS_DIR:-}}" ]; then
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
mkdir -p "$HERE/build"
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
    return f"""# fa-tune kernel {cfg.config_id()}

{mask} FlashAttention forward for Hopper (sm_90a): BF16 Q/O in BSHD layout (`[B, S, Hq, 128]`,
contiguous) and K/V (`[B, S, Hkv, 128]`: MHA, GQA or MQA), head dimension 128, FP32
accumulation, LSE in FP32 (`[B, Hq, S]`, natural log). Exported by fa-tune from study
`{info.get('study')}`, trial {info.get('trial')}; measured on {info.get('gpu', '?')}
({info.get('protocol_text', '')}):

| problem (BxHq[/Hkv]xS[:dD][:full]) | median ms | TFLOPS (causal 2·B·Hq·S²·D / t, non-causal 4·) |
|---|---|---|
{table}

Config (every knob; also in `config.yaml`):

{knobs}

## Files

* `lib/{LIB_NAME}`: the prebuilt library, the exact file fa-tune gated and timed.
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
const char* fa_tune_last_error(void);
const char* fa_tune_config_json(void);   // the config this library was built from
// compiled in: {{"head_dim":128,"causal":{str(causal).lower()}}}
const char* fa_tune_problem_class(void);
int fa_tune_smem_bytes(void);            // dynamic shared memory per CTA
```

Q, O: `[B, S, Hq, 128]`; K, V: `[B, S, Hkv, 128]` BF16 device pointers (16-byte aligned,
contiguous); Hkv divides Hq, and query head h reads K/V head h / (Hq / Hkv). `lse`:
`[B, Hq, S]` FP32 or NULL. `softmax_scale` 0 means 1/sqrt(128). The launch is asynchronous on
`stream`. The library uses the CUDA context current on the calling thread (the primary context,
as the CUDA runtime does).

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
  const int B = 1, Hq = 32, Hkv = 8, S = 8192, D = 128;  // Llama-3-8B's GQA
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

def attention(q, k, v, scale=0.0):  # q [B, S, Hq, 128], k/v [B, S, Hkv, 128], bf16 CUDA
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    assert D == 128 and q.dtype == torch.bfloat16 and q.is_contiguous()
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

q = torch.randn(1, 8192, 32, 128, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(1, 8192, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
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


def _library_causal(so: str) -> bool | None:
    """The mask a built library serves (None: not a library this fa-tune can load)."""
    from tuner.runtime import KernelModule

    try:
        return KernelModule(so).causal
    except FaTuneError:
        return None


def artifact_for(trial: Any, cfg: KernelConfig, causal: bool | None = None) -> Any:
    """The cached .so the trial measured (for its problems' mask, or ``causal`` when given);
    rebuilt through the cache if it was removed, predates this fa-tune, or serves the other
    mask."""
    from tuner.study import trial_causal

    causal = trial_causal(trial) if causal is None else causal
    b = trial.user_attrs.get("build") or {}
    so = b.get("so_path")
    if so and Path(so).is_file() and _library_causal(so) == causal:
        art = Path(so).parent / "artifact.json"
        if art.is_file():
            try:
                return build_mod.BuildResult.from_json(json.loads(art.read_text()), cache_hit=True)
            except (ValueError, TypeError):
                pass
        from types import SimpleNamespace

        return SimpleNamespace(so_path=so, key=b.get("key"))
    return build_mod.build_config(cfg, causal=causal)


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
    from tuner.study import trial_causal

    causal = trial_causal(trial)
    built = artifact_for(trial, cfg, causal)
    so = Path(built.so_path)
    if not so.is_file():
        raise ExportError(f"the artifact {so} is missing; rebuild with `fa-tune build`")
    payload = _results_payload(trial, cfg, built)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        (tmp / "kernel.cu").write_text(build_mod.render(cfg, causal=causal))
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
            "study": study_name, "trial": trial.number, "shapes": shapes, "causal": causal,
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
