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

build.sh needs nvcc alone: the kernel's headers include nothing outside fa_tune/ and the CUDA
toolkit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
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


def os_error_text(e: OSError) -> str:
    """An OSError as 'reason: path' (its strerror and the file it names), for one line."""
    why = e.strerror or str(e)
    return f"{why}: {e.filename}" if e.filename else why


def out_problem(out: Path) -> str | None:
    """Why a new output folder cannot be made there (None: it can): it exists, or the nearest
    folder above it that exists is not a folder or is not writable. Asked before compiling."""
    if os.path.lexists(out):
        return f"{out} already exists"
    above = next((a for a in (out.parent, *out.parent.parents) if os.path.lexists(a)), Path("."))
    if not above.is_dir():
        return f"cannot create {out}: {above} is not a folder"
    if not os.access(above, os.W_OK | os.X_OK):
        return f"cannot create {out}: {above} is not writable"
    return None


def check_out(out: Path) -> None:
    why = out_problem(out)
    if why is not None:
        raise ExportError(f"{why}; choose a new --out folder")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A fresh staging folder beside ``out`` (a new unique name, never an existing path: a
    user's folder of that name is left alone), renamed to ``out`` when the body succeeds and
    removed (with the parents it made) when anything fails. An OSError while writing is one
    ExportError line naming the path."""
    check_out(out)
    made = [a for a in (out.parent, *out.parent.parents) if not os.path.lexists(a)]
    mode = 0o777 & ~_umask()  # mkdtemp makes 0700; the export gets a plain folder's mode
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    except OSError as e:
        _remove_empty(made)
        raise ExportError(f"cannot create {out}: {e.strerror or e} (in {out.parent}); choose "
                          "another --out folder") from None
    done = False
    try:
        yield tmp
        tmp.chmod(mode)
        if os.path.lexists(out):  # made by someone else while this export ran
            raise ExportError(f"{out} appeared while exporting; choose a new --out folder")
        tmp.rename(out)
        done = True
    except OSError as e:
        raise ExportError(f"cannot write the export {out}: {os_error_text(e)}") from None
    finally:
        if not done:
            shutil.rmtree(tmp, ignore_errors=True)
            _remove_empty(made)


def _remove_empty(folders: list[Path]) -> None:
    """Remove the parents an export made (deepest first) if they are still empty."""
    for a in folders:
        with contextlib.suppress(OSError):
            a.rmdir()


def nvcc_flags() -> list[str]:
    """KERNEL_FLAGS with the include placeholders as build.sh spells them."""
    out: list[str] = []
    for f in build_mod.KERNEL_FLAGS:
        if f == build_mod.CUDA_SRC_INC:
            out.append('-I"$HERE"')
        else:
            out.append(shlex.quote(f))
    return out


def build_script() -> str:
    flags = " \\\n    ".join(nvcc_flags())
    return f"""#!/usr/bin/env bash
# Builds build/{LIB_NAME} for sm_90a from kernel.cu with the flags fa-tune used (kernel.cu
# defines FA_TUNE_VARLEN 1: the varlen kernel, for calls with device metadata, is built too).
#   NVCC         the nvcc to use (default: nvcc on PATH, then $CUDA_HOME/bin/nvcc)
set -euo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
NVCC="${{NVCC:-$(command -v nvcc || echo "${{CUDA_HOME:-/usr/local/cuda}}/bin/nvcc")}}"
mkdir -p "$HERE/build"
"$NVCC" \\
    {flags} \\
    -o "$HERE/build/{LIB_NAME}" "$HERE/kernel.cu"
echo "built $HERE/build/{LIB_NAME}"
"""


ABI_FILE = "fa_tune_abi.py"  # a single-kernel export's copy of tuner/ship/fa_tune_ops/abi.py


def abi_section(d: int, causal: bool, header: str, pclass_json: str, workload: bool) -> str:
    """The README's C ABI section (its version, fa_tune.h's), for a single kernel or a workload
    library."""
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


def varlen_why_not(cfgs: Sequence[KernelConfig], pclass: ProblemClass, *, compile: bool = True,
                   jobs: int | None = None) -> list[str | None]:
    """Per config, why a library of it for pclass leaves the varlen kernel out (a call with
    device metadata then gets cudaErrorNotSupported), or None when it carries it: the static
    register check (config.varlen_reason), then the varlen build's own verdict, since a mask's
    registers can tip it into local memory where the estimate fits (d256 with a softcap,
    docs/PERF.md step 61). The builds run in parallel into the cache, and the export compiles
    the same kernels anyway; ``compile=False`` (sources only, no nvcc) asks the static check."""
    if not compile:
        return [varlen_reason(c, pclass.head_dim) for c in cfgs]
    outcomes = build_mod.build_many(cfgs, jobs=jobs,
                                    pclass=dataclasses.replace(pclass, varlen=True))
    why: list[str | None] = []
    for o in outcomes:
        if o.error is not None:
            why.append(str(o.error))
        elif o.result is not None and o.result.unfit is not None:
            why.append(f"its varlen kernel compiles with {o.result.unfit}")
        else:
            why.append(None)
    return why


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
    why_not = info.get("varlen_why_not")
    masks = {m: True for m in info.get("masks") or ()}  # the models' masks the class has
    pclass_json = json.dumps({"head_dim": d, "causal": causal, "varlen": why_not is None,
                              **masks}, separators=(",", ":"))
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
  rebuilds it into `build/{LIB_NAME}` (needs nvcc >= 12.3, nothing else). The CUDA runtime is
  linked statically; the
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


def exported_results(trial: Any, cfg: KernelConfig, built: Any) -> dict[str, Any]:
    """The trial's results, with its error ratios (worst over its gated problems: max|err| /
    the BF16 implementation's and / the default config's; docs/GATE.md) under "accuracy"."""
    payload = _measured_payload(trial, cfg, built)
    from tuner.search.trials import trial_accuracy

    payload["accuracy"] = trial_accuracy(trial)
    return payload


def _measured_payload(trial: Any, cfg: KernelConfig, built: Any) -> dict[str, Any]:
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
    check_out(out)
    _, trial = pick_trial(study_name, storage, trial_number)
    cfg_d = trial.user_attrs.get("config")
    if not isinstance(cfg_d, dict):
        raise SearchError(f"trial {trial.number} has no stored config")
    cfg = KernelConfig.from_dict(cfg_d)
    from tuner.search.study import trial_class

    pclass = trial_class(trial)
    # The folder is made before the compile: an --out that cannot be written fails at once.
    with staged(out) as tmp:
        # The measured config with the varlen kernel too (the search built it without), unless
        # the config cannot serve varlen (the README says why).
        [why_not] = varlen_why_not([cfg], pclass)
        pclass = dataclasses.replace(pclass, varlen=why_not is None)
        built = build_mod.build_config(cfg, pclass=pclass)
        so = Path(built.so_path)
        if not so.is_file():
            raise ExportError(f"the artifact {so} is missing; rebuild with `fa-tune build`")
        payload = exported_results(trial, cfg, built)
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
            # The class's flags beyond D and the mask: the models' masks, a paged KV cache.
            "masks": [m for m in ("window", "softcap", "sinks", "paged") if getattr(pclass, m)],
            "varlen_why_not": why_not,
            "gpu": (payload.get("gpu") or {}).get("name", "the tuning GPU"),
            "protocol_text": protocol_text(conf.get("protocol")) if conf
            else "search protocol (not confirmed)",
        }
        (tmp / "README.md").write_text(readme(cfg, info))
    return {"out": out, "trial": trial.number, "config_id": cfg.config_id(), "so": so}
