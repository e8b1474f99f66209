"""``fa-tune export --workload`` / ``--table``: one library per workload, its buckets' kernels
behind the generated dispatcher, with the PyTorch op (tuner/ship/fa_tune_ops) beside it."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner import _paths, child_process
from tuner.kernel import build as build_mod
from tuner.kernel import toolchain
from tuner.ship import dispatcher_cpp
from tuner.ship.export import (
    LIB_NAME,
    ExportError,
    abi_section,
    check_out,
    exported_results,
    nvcc_flags,
    staged,
    varlen_why_not,
)

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
    # Bucket names are checked when a table is made; quoted here all the same, so no value
    # can become shell code.
    specs = " ".join(sh_word(f"{e.bucket} {dispatch_mod.symbol_prefix(i)}")
                     for i, e in enumerate(table.entries))
    objs = " ".join(sh_word(f"{e.bucket}.o", "$OBJ/") for e in table.entries)
    arch = shlex.quote(build_mod.ARCH_FLAG)
    return f"""#!/usr/bin/env bash
# Builds build/{LIB_NAME} for sm_90a: each bucket's kernel (buckets/<name>/kernel.cu) with the
# flags fa-tune used (each kernel.cu defines FA_TUNE_VARLEN 1) and its C ABI renamed
# (-DFA_TUNE_API_PREFIX=fa_tune_b<i>_), the dispatcher (dispatch.cu), linked into one library
# that exports the fa_tune_ C ABI (include/fa_tune.h).
#   NVCC         the nvcc to use (default: nvcc on PATH, then $CUDA_HOME/bin/nvcc)
#   JOBS         kernels compiled at once (default: the number of CPUs; ~2 GB of memory each)
set -euo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
NVCC="${{NVCC:-$(command -v nvcc || echo "${{CUDA_HOME:-/usr/local/cuda}}/bin/nvcc")}}"
JOBS="${{JOBS:-$(nproc 2>/dev/null || echo 1)}}"
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
"$NVCC" -std=c++17 -O2 {arch} -Xcompiler -fPIC -Xcompiler -fvisibility=hidden \\
    -I"$HERE/include" -c -o "$OBJ/dispatch.o" "$HERE/dispatch.cu"
"$NVCC" -shared {arch} -Xcompiler -fPIC -o "$HERE/build/{LIB_NAME}" \\
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


_PLAIN = re.compile(r"[A-Za-z0-9_ .,:=+/-]*")


def sh_word(text: str, var_prefix: str = "") -> str:
    """One shell word of ``text`` after ``var_prefix`` (a "$VAR/" to expand): double-quoted
    when it holds nothing the shell expands there (as the scripts have always read), else
    shlex.quote'd."""
    if _PLAIN.fullmatch(text):
        return f'"{var_prefix}{text}"'
    return (f'"{var_prefix}"' if var_prefix else "") + shlex.quote(text)


def _md_cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _varlen_cell(why_not: str | None) -> str:
    return "yes" if why_not is None else _md_cell(f"no ({why_not})")


def workload_readme(table: Any, varlen_why: dict[str, str | None]) -> str:
    """The library's README; ``varlen_why``: per bucket, why it has no varlen kernel (None: it
    has one; export.varlen_why_not)."""
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
                    f"{_varlen_cell(varlen_why.get(e.bucket))} | "
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
  rebuilds the library into `build/{LIB_NAME}` (nvcc >= 12.3; `JOBS` kernels at
  once). Each kernel is
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
            payload = exported_results(trial, e.config, SimpleNamespace(so_path=None, key=None))
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
        # The class: D, the mask and every flag (a mask class's library says window: true...).
        want = table.problem_class.to_dict()
        keys = ("head_dim", "causal", *dispatch_mod.MASKS)
        ok = (lib.fa_tune_abi_version() == dispatch_mod.ABI_VERSION
              and lib.fa_tune_bucket_count() == len(table.entries)
              and got == json.loads(json.dumps(table.to_dict()))
              and all(pclass.get(k, False) == want.get(k, False) for k in keys)
              and isinstance(pclass.get("varlen"), bool))
    except (OSError, AttributeError, ValueError) as e:
        raise ExportError(f"the built library {so} cannot be checked: {e}") from None
    if not ok:
        raise ExportError(f"the built library {so} does not answer as dispatch.json says")


def _run_build(folder: Path, jobs: int | None) -> Path:
    """Run the export's own build.sh (so the shipped script is what built the library)."""
    import os
    import subprocess

    env = {**os.environ, "NVCC": str(toolchain.find_nvcc()),
           "PYTHON": sys.executable}
    if jobs:
        env["JOBS"] = str(jobs)
    log = folder / "build" / "build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        p = child_process.run(["bash", str(folder / "build.sh")], env=env, cwd=folder,
                              timeout=WORKLOAD_BUILD_TIMEOUT_S)
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
                    jobs: int | None = None,
                    say: Callable[[str], None] = lambda _line: None) -> dict[str, Any]:
    """Write a workload export (layout above) for a dispatch table; with ``build``, run its
    build.sh and ship the library in lib/ (without: sources only, no nvcc). ``say`` hears a
    line before each step that takes minutes."""
    from tuner.ship import dispatch as dispatch_mod

    out = Path(out)
    check_out(out)
    for e in table.entries:
        dispatch_mod.check_entry_config(e.bucket, e.config, e.problem_class)
    # The folder is made before the compiles: an --out that cannot be written fails at once.
    with staged(out) as tmp:
        # Each bucket with its varlen kernel where its config serves it (compiled to be sure,
        # when this export builds; the build.sh compiles the same kernels after).
        n = len(table.entries)
        if build:
            say(f"compiling {n} bucket kernel(s) for packed batches on "
                f"{toolchain.compile_jobs(jobs)} core(s), to see which configs serve them "
                "(cached ones are instant)")
        why: dict[str, str | None] = {}
        for pclass in dict.fromkeys(e.problem_class for e in table.entries):  # a kind's class
            es = [e for e in table.entries if e.problem_class == pclass]
            why.update(zip([e.bucket for e in es],
                           varlen_why_not([e.config for e in es], pclass, compile=build,
                                          jobs=jobs), strict=True))
        shutil.copytree(_paths.cuda_src_dir() / "fa_tune", tmp / "fa_tune",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for e in table.entries:
            (tmp / "buckets" / e.bucket).mkdir(parents=True)
            (tmp / "buckets" / e.bucket / "kernel.cu").write_text(
                build_mod.render(e.config, pclass=dataclasses.replace(
                    e.problem_class, varlen=why[e.bucket] is None)))
            (tmp / "configs").mkdir(exist_ok=True)
            (tmp / "configs" / f"{e.bucket}.yaml").write_text(e.config.to_yaml())
        (tmp / "include").mkdir()  # the C ABI's one header, as the kernels include it
        shutil.copy2(_paths.cuda_src_dir() / "fa_tune" / dispatch_mod.HEADER_NAME,
                     tmp / "include" / dispatch_mod.HEADER_NAME)
        (tmp / "dispatch.cu").write_text(dispatcher_cpp.dispatcher_source(table))
        (tmp / "build.sh").write_text(workload_build_script(table))
        (tmp / "build.sh").chmod(0o755)
        table.save(tmp / "dispatch.json")
        if workload_file is not None:
            shutil.copy2(workload_file, tmp / "workload.yaml")
        (tmp / "results.json").write_text(
            json.dumps(_workload_results(table, resolved), indent=2, default=str))
        shutil.copytree(Path(__file__).resolve().parent / "fa_tune_ops", tmp / "fa_tune_ops",
                        ignore=shutil.ignore_patterns("__pycache__"))
        (tmp / "README.md").write_text(workload_readme(table, why))
        so = None
        if build:
            say(f"building the library with the export's build.sh: {n} bucket(s), "
                f"{toolchain.compile_jobs(jobs)} compile(s) at once, typically a few minutes")
            built = _run_build(tmp, jobs)
            _check_built_library(built, table)
            (tmp / "lib").mkdir()
            shutil.move(str(built), tmp / "lib" / LIB_NAME)
            for ext in built.parent.glob("libfa_tune_torch.*.so"):  # the op's C++ path
                shutil.move(str(ext), tmp / "lib" / ext.name)
            shutil.rmtree(tmp / "build", ignore_errors=True)
            so = out / "lib" / LIB_NAME
    return {"out": out, "buckets": [e.bucket for e in table.entries], "so": so}
