"""Dispatch tables: which kernel config serves which length bucket, and the C++ dispatcher.

A ``DispatchTable`` maps each bucket of a workload (tuner/workload.py) to one config: heads
(Hq, Hkv), head dim and mask, an S range, the config and where it came from (a study's trial, a
preset, a config file) with what was measured. It is JSON (``dispatch.json``) and round-trips
exactly (``DispatchTable.from_dict(t.to_dict()) == t``).

``dispatcher_source`` writes the C++ of a library that links every bucket's kernel, each built
from the same template with its C ABI renamed by ``-DFA_TUNE_API_PREFIX=fa_tune_b<i>_``
(cuda_src/fa_tune/entry.cuh), and exports the fa_tune_ C ABI v2 itself: ``fa_tune_forward``
picks the first entry whose heads match and whose S range holds S (``select`` is the same rule
in Python), and returns cudaErrorNotSupported with a last_error naming what the library serves
for a problem no bucket serves. ``fa_tune_forward_varlen`` picks the bucket the same way by
(Hq, Hkv, max_seqlen); ``fa_tune_varlen_workspace_bytes`` answers for it. Every bucket is built
with the varlen kernel (its kernel.cu defines FA_TUNE_VARLEN 1) except where its config cannot
serve varlen (config.check_varlen): that bucket answers cudaErrorNotSupported, and the library's
problem_class says ``"varlen": true`` when some bucket serves it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.build import c_string_literal
from tuner.config import KernelConfig, validate
from tuner.errors import FaTuneError
from tuner.problem import Problem, ProblemClass
from tuner.workload import Workload

SCHEMA = 1
ABI_VERSION = 2
CUDA_ERROR_NOT_SUPPORTED = 801  # cudaErrorNotSupported: no bucket serves it / no varlen kernel


class DispatchError(FaTuneError):
    """A dispatch table or a bucket's config source is malformed or inconsistent."""


def symbol_prefix(index: int) -> str:
    """The C ABI prefix of the table's index-th kernel inside a workload library."""
    return f"fa_tune_b{index}_"


@dataclass(frozen=True)
class DispatchEntry:
    """One bucket: problems with these heads, head dim and mask and s_min <= S <= s_max (None:
    no upper bound) run ``config``."""

    bucket: str
    Hq: int
    Hkv: int
    head_dim: int
    causal: bool
    s_min: int
    s_max: int | None
    config: KernelConfig
    source: dict[str, Any] = field(default_factory=dict)  # {"kind": "study"|"preset"|"file", ...}
    problems: tuple[str, ...] = ()                         # what it was (or is to be) tuned on
    measured: dict[str, Any] | None = None                 # {problem: {median_ms, tflops}}

    @property
    def problem_class(self) -> ProblemClass:
        return ProblemClass(self.head_dim, self.causal)

    def serves(self, Hq: int, Hkv: int, S: int) -> bool:
        return (Hq == self.Hq and Hkv == self.Hkv and S >= self.s_min
                and (self.s_max is None or S <= self.s_max))

    def range_text(self) -> str:
        return f"{self.s_min}..{self.s_max}" if self.s_max is not None else f">= {self.s_min}"

    def source_text(self) -> str:
        s = self.source
        if s.get("kind") == "study":
            return f"study {s.get('study')}, trial {s.get('trial')}"
        if s.get("kind") == "preset":
            return f"preset {s.get('name')}"
        if s.get("kind") == "file":
            return f"file {s.get('path')}"
        return "?"

    def to_dict(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket, "Hq": self.Hq, "Hkv": self.Hkv, "head_dim": self.head_dim,
            "causal": self.causal, "s_min": self.s_min, "s_max": self.s_max,
            "config": self.config.to_dict(), "config_id": self.config.config_id(),
            "source": dict(self.source), "problems": list(self.problems),
            "measured": self.measured,
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "entry") -> DispatchEntry:
        if not isinstance(d, Mapping):
            raise DispatchError(f"{where}: must be a mapping")
        try:
            s_max = d["s_max"]
            entry = cls(
                bucket=str(d["bucket"]), Hq=_int(d["Hq"]), Hkv=_int(d["Hkv"]),
                head_dim=_int(d["head_dim"]), causal=_bool(d["causal"]), s_min=_int(d["s_min"]),
                s_max=None if s_max is None else _int(s_max),
                config=KernelConfig.from_dict(d["config"], source=where),
                source=dict(d.get("source") or {}),
                problems=tuple(str(p) for p in d.get("problems") or ()),
                measured=d.get("measured"),
            )
        except KeyError as e:
            raise DispatchError(f"{where}: missing {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise DispatchError(f"{where}: {e}") from None
        cid = d.get("config_id")
        if cid is not None and cid != entry.config.config_id():
            raise DispatchError(f"{where}: config_id {cid} does not match its config "
                                f"({entry.config.config_id()}); the file was edited by hand?")
        return entry


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"expected an integer, got {v!r}")
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"expected true or false, got {v!r}")
    return v


@dataclass(frozen=True)
class DispatchTable:
    """The buckets of one library, in dispatch order (the first entry that serves wins)."""

    name: str
    entries: tuple[DispatchEntry, ...]
    workload: dict[str, Any] | None = None  # the workload it was made for (Workload.to_dict())

    def __post_init__(self) -> None:
        if not self.entries:
            raise DispatchError(f"dispatch table '{self.name}' has no entries")
        classes = {e.problem_class for e in self.entries}
        if len(classes) > 1:
            raise DispatchError(
                f"dispatch table '{self.name}' mixes problem classes "
                f"({'; '.join(sorted(map(str, classes)))}): one library serves one head dim "
                "and mask"
            )
        names = [e.bucket for e in self.entries]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise DispatchError(f"dispatch table '{self.name}': bucket {dup[0]} appears twice")
        for i, a in enumerate(self.entries):
            if a.s_max is not None and a.s_max < a.s_min:
                raise DispatchError(f"bucket {a.bucket}: s_max {a.s_max} < s_min {a.s_min}")
            for b in self.entries[i + 1:]:
                if (a.Hq, a.Hkv) == (b.Hq, b.Hkv) and _overlap(a, b):
                    raise DispatchError(
                        f"buckets {a.bucket} (S {a.range_text()}) and {b.bucket} "
                        f"(S {b.range_text()}) overlap for Hq={a.Hq}, Hkv={a.Hkv}"
                    )

    @property
    def problem_class(self) -> ProblemClass:
        return self.entries[0].problem_class

    def index_for(self, Hq: int, Hkv: int, S: int) -> int:
        """The serving entry's index (the dispatcher's fa_tune_bucket_for), -1 for none."""
        return next((i for i, e in enumerate(self.entries) if e.serves(Hq, Hkv, S)), -1)

    def select(self, problem: Problem | str) -> DispatchEntry | None:
        """The entry serving a problem (None: no bucket does, or another head dim or mask)."""
        p = Problem.parse(problem) if isinstance(problem, str) else problem
        if p.problem_class != self.problem_class:
            return None
        i = self.index_for(p.Hq, p.Hkv, p.S)
        return self.entries[i] if i >= 0 else None

    def serves_text(self) -> str:
        """What the library serves, for the no-bucket error: 'Hq=32 Hkv=8: S 1..1024 (s1k), ...'."""
        groups: dict[tuple[int, int], list[str]] = {}
        for e in self.entries:
            groups.setdefault((e.Hq, e.Hkv), []).append(f"S {e.range_text()} ({e.bucket})")
        return "; ".join(f"Hq={hq} Hkv={hkv}: {', '.join(v)}" for (hq, hkv), v in groups.items())

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "abi_version": ABI_VERSION, "name": self.name,
                "problem_class": self.problem_class.to_dict(),
                "entries": [e.to_dict() for e in self.entries], "workload": self.workload}

    def dumps(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(self.dumps())
        return p

    @classmethod
    def from_dict(cls, d: Any, source: str = "<dispatch table>") -> DispatchTable:
        if not isinstance(d, Mapping):
            raise DispatchError(f"{source}: a dispatch table is a JSON object")
        if d.get("schema") != SCHEMA:
            raise DispatchError(f"{source}: dispatch table schema {d.get('schema')!r}; this "
                                f"fa-tune reads schema {SCHEMA}")
        entries = d.get("entries")
        if not isinstance(entries, list):
            raise DispatchError(f"{source}: 'entries' must be a list")
        name = d.get("name")
        if not isinstance(name, str) or not name:
            raise DispatchError(f"{source}: 'name' must be a non-empty string")
        try:
            table = cls(name, tuple(DispatchEntry.from_dict(e, f"{source}: entries[{i}]")
                                    for i, e in enumerate(entries)), d.get("workload"))
        except DispatchError as e:
            raise DispatchError(f"{source}: {e}" if source not in str(e) else str(e)) from None
        return table

    @classmethod
    def load(cls, path: str | Path) -> DispatchTable:
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except OSError as e:
            raise DispatchError(f"cannot read dispatch table {p}: {e.strerror or e}") from None
        except ValueError as e:
            raise DispatchError(f"{p}: not valid JSON: {e}") from None
        return cls.from_dict(data, str(p))


def _overlap(a: DispatchEntry, b: DispatchEntry) -> bool:
    a_hi = a.s_max if a.s_max is not None else float("inf")
    b_hi = b.s_max if b.s_max is not None else float("inf")
    return a.s_min <= b_hi and b.s_min <= a_hi


# ---- config sources ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Resolved:
    """A bucket's config and where it came from (``trial``: the study trial, when one)."""

    config: KernelConfig
    source: dict[str, Any]
    measured: dict[str, Any] | None = None
    problems: tuple[str, ...] = ()
    trial: Any = field(default=None, compare=False)


SOURCE_HELP = "study:NAME[:TRIAL] (its best trial, or that one), preset:NAME, or a config file"


def _measured(trial: Any) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    """The trial's per-problem numbers (confirmed, else the search's) and its problems."""
    conf = trial.user_attrs.get("confirmed") or {}
    per = conf.get("shapes") or trial.user_attrs.get("shapes") or {}
    out: dict[str, Any] = {}
    for shape, v in per.items():
        if isinstance(v, Mapping):
            out[shape] = {k: v[k] for k in ("median_ms", "tflops", "min_ms", "max_ms") if k in v}
    if out:
        out = {"protocol": "confirmed (full)" if conf else "search (not confirmed)", **out}
    return (out or None), tuple(per.keys())


def resolve_source(text: str, pclass: ProblemClass, storage: str | None = None) -> Resolved:
    """A bucket's config from SOURCE (``SOURCE_HELP``), checked against the library's class."""
    text = str(text).strip()
    if text.startswith("study:"):
        from tuner.show import pick_trial
        from tuner.study import redact, trial_class

        m = re.fullmatch(r"study:([^:]+)(?::(\d+))?", text)
        if not m:
            raise DispatchError(f"bad source '{text}': write study:NAME or study:NAME:TRIAL")
        name, num = m.group(1), (int(m.group(2)) if m.group(2) else None)
        _, trial = pick_trial(name, storage, num)
        cfg_d = trial.user_attrs.get("config")
        if not isinstance(cfg_d, dict):
            raise DispatchError(f"study {name}, trial {trial.number} has no stored config")
        tclass = trial_class(trial)
        if tclass != pclass:
            raise DispatchError(f"study {name}, trial {trial.number} was measured on {tclass} "
                                f"problems; this library serves {pclass}")
        measured, problems = _measured(trial)
        src = {"kind": "study", "study": name, "trial": trial.number,
               "storage": redact(storage) if storage else None}
        return Resolved(KernelConfig.from_dict(cfg_d, source=f"study {name}"), src, measured,
                        problems, trial)
    if text.startswith("preset:"):
        from tuner.config import load_preset

        name = text[len("preset:"):]
        return Resolved(load_preset(name), {"kind": "preset", "name": name})
    path = Path(text[len("config:"):] if text.startswith("config:") else text)
    if not path.is_file():
        raise DispatchError(f"bad source '{text}': no such file; give {SOURCE_HELP}")
    return Resolved(KernelConfig.load(path), {"kind": "file", "path": str(path)})


def _study_exists(name: str, storage: str | None) -> bool:
    from tuner.study import SearchError, load_existing_study

    try:
        load_existing_study(name, storage)
    except SearchError:
        return False
    return True


def bucket_sources(workload: Workload, assignments: list[str] | None = None,
                   study_prefix: str | None = None, default: str | None = None,
                   storage: str | None = None) -> dict[str, Resolved]:
    """Each bucket's config: ``NAME=SOURCE`` assignments first, then the study
    ``<study_prefix><bucket>`` when it exists, then ``default``; a bucket left without one is
    table_for_workload's error."""
    texts: dict[str, str] = {}
    for a in assignments or []:
        name, sep, src = a.partition("=")
        if not sep or not name.strip() or not src.strip():
            raise DispatchError(f"bad --bucket '{a}': write NAME=SOURCE, SOURCE one of "
                                f"{SOURCE_HELP}")
        workload.bucket(name.strip())  # an unknown bucket is an error naming the known ones
        if name.strip() in texts:
            raise DispatchError(f"bucket {name.strip()} is given twice")
        texts[name.strip()] = src.strip()
    for b in workload.buckets:
        if b.name in texts:
            continue
        if study_prefix and _study_exists(f"{study_prefix}{b.name}", storage):
            texts[b.name] = f"study:{study_prefix}{b.name}"
        elif default:
            texts[b.name] = default
    pclass = workload.attention.problem_class
    return {name: resolve_source(src, pclass, storage) for name, src in texts.items()}


def check_entry_config(bucket: str, cfg: KernelConfig, pclass: ProblemClass) -> None:
    """A bucket's config must fit the class and write LSE (the op returns it)."""
    try:
        validate(cfg, pclass.head_dim, pclass.causal)
    except FaTuneError as e:
        raise DispatchError(f"bucket {bucket}: {e}") from None
    if not cfg.write_lse:
        raise DispatchError(f"bucket {bucket}: config {cfg.config_id()} has write_lse: false; a "
                            "workload library returns LSE for every bucket")


def table_for_workload(workload: Workload, sources: Mapping[str, Resolved]) -> DispatchTable:
    """One entry per bucket of the workload, in bucket order; every bucket needs a source."""
    names = [b.name for b in workload.buckets]
    unknown = sorted(set(sources) - set(names))
    if unknown:
        raise DispatchError(f"workload '{workload.name}' has no bucket {unknown[0]}; its "
                            f"buckets: {', '.join(names)}")
    missing = [n for n in names if n not in sources]
    if missing:
        raise DispatchError(f"no config for bucket{'s' if len(missing) > 1 else ''} "
                            f"{', '.join(missing)} of workload '{workload.name}': give "
                            f"--bucket NAME={SOURCE_HELP.split(' (')[0]}... or --study-prefix")
    att = workload.attention
    plans = {p.bucket.name: p for p in workload.plan()}
    entries = []
    for b in workload.buckets:
        r = sources[b.name]
        check_entry_config(b.name, r.config, att.problem_class)
        entries.append(DispatchEntry(
            bucket=b.name, Hq=att.Hq, Hkv=att.Hkv, head_dim=att.head_dim, causal=att.causal,
            s_min=b.s_min, s_max=b.s_max, config=r.config, source=dict(r.source),
            problems=r.problems or tuple(plans[b.name].shapes), measured=r.measured))
    return DispatchTable(workload.name, tuple(entries), workload.to_dict())


# ---- C++ ----------------------------------------------------------------------------------------
HEADER_NAME = "fa_tune.h"

HEADER = """\
// fa-tune kernel library: C ABI version 2 (README.md beside this folder documents it).
// Tensors are BF16 device pointers, contiguous: Q, O [B, S, Hq, D]; K, V [B, S, Hkv, D];
// lse [B, Hq, S] FP32 (natural log) or NULL. Calls are asynchronous on `stream`; every int
// result is 0 on success, else a cudaError_t value, and fa_tune_last_error() says why.
#pragma once
#include <cuda_runtime.h>
#include <stddef.h>

#ifndef FA_TUNE_API
#define FA_TUNE_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

FA_TUNE_API int fa_tune_abi_version(void);  // 2
// Fixed-length prefill. The library picks the kernel of the bucket serving (Hq, Hkv, S); a
// problem no bucket serves returns cudaErrorNotSupported. softmax_scale 0: 1/sqrt(D).
FA_TUNE_API int fa_tune_forward(const void* q, const void* k, const void* v, void* o,
                                float* lse, int B, int Hq, int Hkv, int S,
                                float softmax_scale, cudaStream_t stream);
// One-time host setup for a shape (scheduler task lists: a cudaMalloc and a synchronous
// upload); forward() does it on first use, so call it before capturing a CUDA graph.
FA_TUNE_API int fa_tune_prepare(int B, int Hq, int Hkv, int S, cudaStream_t stream,
                                double* host_ms);
// Varlen (packed) prefill, causal or not as the library's class, per sequence (query length =
// key length): Q, O [total_tokens, Hq, D]; K, V [total_tokens, Hkv, D] (BF16, contiguous);
// cu_seqlens: int32 [num_seqs + 1] ON THE DEVICE (cu_seqlens[0] = 0, non-decreasing,
// cu_seqlens[num_seqs] = total_tokens); max_seqlen >= every length (as FA3's
// flash_attn_varlen_func); lse: FP32 [Hq, total_tokens] or NULL. The library picks the bucket
// serving (Hq, Hkv, max_seqlen). workspace: device memory of at least
// fa_tune_varlen_workspace_bytes(num_seqs, Hq, total_tokens, max_seqlen) bytes, or NULL for a
// library-owned one (grown on demand with cudaMalloc: never inside a CUDA graph capture, one
// stream at a time). No host sync: the schedule is built on the device from cu_seqlens by a
// small kernel. A bucket without the varlen kernel (config.varlen_reason refused its config)
// returns cudaErrorNotSupported (801).
FA_TUNE_API int fa_tune_forward_varlen(const void* q, const void* k, const void* v, void* o,
                                       float* lse, const int* cu_seqlens, int num_seqs,
                                       int total_tokens, int max_seqlen, int Hq, int Hkv,
                                       float softmax_scale, void* workspace,
                                       size_t workspace_bytes, cudaStream_t stream);
// Bytes of workspace a varlen call needs (host only, no CUDA call); 0 when the arguments are
// invalid or no bucket serves them. It takes no Hkv: the most any bucket with these Hq whose
// S range holds max_seqlen needs.
FA_TUNE_API size_t fa_tune_varlen_workspace_bytes(int num_seqs, int Hq, int total_tokens,
                                                  int max_seqlen);
FA_TUNE_API const char* fa_tune_last_error(void);     // this thread's last error
FA_TUNE_API const char* fa_tune_config_json(void);    // {"dispatch": name, "buckets": [...]}
// {"head_dim":D,"causal":bool,"varlen":bool}; varlen: some bucket serves varlen (each
// bucket's fa_tune_b<i>_problem_class says whether it does).
FA_TUNE_API const char* fa_tune_problem_class(void);
FA_TUNE_API int fa_tune_smem_bytes(void);             // the largest bucket's, per CTA
// The dispatcher's own: how many buckets, which serves a problem (-1: none; host only, no
// CUDA call; for varlen pass max_seqlen as S), and the dispatch table (dispatch.json, compact).
FA_TUNE_API int fa_tune_bucket_count(void);
FA_TUNE_API int fa_tune_bucket_for(int B, int Hq, int Hkv, int S);
FA_TUNE_API const char* fa_tune_dispatch_json(void);

#ifdef __cplusplus
}  // extern "C"
#endif
"""


def _library_config_json(table: DispatchTable) -> str:
    """What the library's fa_tune_config_json() returns: every bucket's config."""
    return json.dumps({
        "dispatch": table.name,
        "write_lse": all(e.config.write_lse for e in table.entries),
        "buckets": [{"bucket": e.bucket, "prefix": symbol_prefix(i),
                     "config_id": e.config.config_id(), "config": e.config.to_dict()}
                    for i, e in enumerate(table.entries)],
    }, sort_keys=True, separators=(",", ":"))


def _comment(text: str) -> str:
    """Text safe inside a // comment: printable ASCII, and no backslash (one ending the line
    would continue the comment over the next line)."""
    return re.sub(r"[^\x20-\x5b\x5d-\x7e]", "?", text)


def dispatcher_source(table: DispatchTable) -> str:
    """The C++ of the dispatcher (dispatch.cu): exports the fa_tune_ C ABI v2 and calls the
    bucket kernels' prefixed entry points."""
    decls, rows = [], []
    for i, e in enumerate(table.entries):
        p = symbol_prefix(i)
        decls.append(
            f"int {p}forward(const void*, const void*, const void*, void*, float*, int, int, int,"
            f" int, float, cudaStream_t);\n"
            f"int {p}prepare(int, int, int, int, cudaStream_t, double*);\n"
            f"int {p}forward_varlen(const void*, const void*, const void*, void*, float*,"
            f" const int*, int, int, int, int, int, float, void*, size_t,\n"
            f"    cudaStream_t) FA_TUNE_WEAK;\n"
            f"size_t {p}varlen_workspace_bytes(int, int, int, int) FA_TUNE_WEAK;\n"
            f"const char* {p}last_error(void);\n"
            f"const char* {p}problem_class(void);\n"
            f"int {p}smem_bytes(void);"
        )
        s_max = -1 if e.s_max is None else e.s_max
        rows.append(f"    {{{c_string_literal(e.bucket)}, {e.Hq}, {e.Hkv}, {e.s_min}, {s_max}, "
                    f"{p}forward, {p}prepare, {p}forward_varlen, {p}varlen_workspace_bytes, "
                    f"{p}last_error, {p}problem_class, {p}smem_bytes}},"
                    f"  // {e.config.config_id()}: {_comment(e.source_text())}")
    pc = table.problem_class
    compact = json.dumps(table.to_dict(), sort_keys=True, separators=(",", ":"))
    # The varlen flag is the buckets' (asked at run time), the rest is the table's.
    pclass_head = json.dumps({"head_dim": pc.head_dim, "causal": pc.causal},
                             separators=(",", ":"))[:-1] + ',"varlen":'
    decl_text = "\n".join(decls)
    row_text = "\n".join(rows)
    return f"""\
// Generated by fa-tune (tuner/dispatch.py) for '{table.name}'. Do not edit: export again.
// The dispatcher of a workload library: every bucket's kernel is the template rendered for its
// config (buckets/<name>/kernel.cu) and compiled with -DFA_TUNE_API_PREFIX=fa_tune_b<i>_, so
// its C ABI is renamed; this unit exports the fa_tune_ C ABI v2 and forwards each call to the
// first bucket serving (Hq, Hkv, S), a varlen call to the one serving (Hq, Hkv, max_seqlen).
// D and the mask are the library's class ({pc}).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "{HEADER_NAME}"

// Weak: a bucket object built before the varlen entry points still links; its pointers are
// then null and a varlen call to it answers cudaErrorNotSupported.
#define FA_TUNE_WEAK __attribute__((weak))

extern "C" {{
{decl_text}
}}

namespace {{

using ForwardFn = int (*)(const void*, const void*, const void*, void*, float*, int, int, int,
                          int, float, cudaStream_t);
using PrepareFn = int (*)(int, int, int, int, cudaStream_t, double*);
using VarlenFn = int (*)(const void*, const void*, const void*, void*, float*, const int*, int,
                         int, int, int, int, float, void*, size_t, cudaStream_t);
using WorkspaceFn = size_t (*)(int, int, int, int);
using TextFn = const char* (*)(void);
using IntFn = int (*)(void);

struct Bucket {{
  const char* name;
  int hq, hkv, s_min, s_max;  // s_max -1: no upper bound
  ForwardFn forward;
  PrepareFn prepare;
  VarlenFn forward_varlen;               // null: built before varlen
  WorkspaceFn varlen_workspace_bytes;    // null: built before varlen
  TextFn last_error;
  TextFn problem_class;
  IntFn smem_bytes;
}};

const Bucket kBuckets[] = {{
{row_text}
}};
constexpr int kNumBuckets = int(sizeof(kBuckets) / sizeof(kBuckets[0]));

const char kServes[] = {c_string_literal(table.serves_text())};
const char kProblemClassHead[] = {c_string_literal(pclass_head)};
const char kConfigJson[] = {c_string_literal(_library_config_json(table))};
const char kDispatchJson[] = {c_string_literal(compact)};

thread_local std::string g_error;

bool holds(const Bucket& b, int S) {{ return S >= b.s_min && (b.s_max < 0 || S <= b.s_max); }}

// Buckets are few (one per length range): a scan beats anything cleverer.
int find(int Hq, int Hkv, int S) {{
  for (int i = 0; i < kNumBuckets; ++i) {{
    const Bucket& b = kBuckets[i];
    if (b.hq == Hq && b.hkv == Hkv && holds(b, S)) return i;
  }}
  return -1;
}}

int no_bucket(const std::string& what) {{
  g_error = "no bucket of this library serves " + what + "; it serves " + kServes;
  return int(cudaErrorNotSupported);
}}

std::string dims(int B, int Hq, int Hkv, int S) {{
  return "B=" + std::to_string(B) + " Hq=" + std::to_string(Hq) + " Hkv=" +
         std::to_string(Hkv) + " S=" + std::to_string(S);
}}

// A bucket's failure: its own message, prefixed with the bucket (its last_error is per kernel).
int result(const Bucket& b, int rc) {{
  if (rc != 0) {{
    const char* why = b.last_error();
    g_error = std::string("bucket ") + b.name + ": " + (why != nullptr ? why : "");
  }}
  return rc;
}}

// Whether a bucket's kernel serves varlen: its entry points and its problem_class's flag.
bool serves_varlen(const Bucket& b) {{
  if (b.forward_varlen == nullptr || b.varlen_workspace_bytes == nullptr) return false;
  const char* json = b.problem_class();
  const char* at = json != nullptr ? std::strstr(json, "\\"varlen\\"") : nullptr;
  if (at == nullptr) return false;
  at += std::strlen("\\"varlen\\"");
  while (*at == ' ' || *at == ':') ++at;
  return std::strncmp(at, "true", 4) == 0;
}}

}}  // namespace

extern "C" {{

FA_TUNE_API int fa_tune_abi_version(void) {{ return 2; }}

FA_TUNE_API int fa_tune_forward(const void* q, const void* k, const void* v, void* o,
                                float* lse, int B, int Hq, int Hkv, int S,
                                float softmax_scale, cudaStream_t stream) {{
  g_error.clear();
  const int i = find(Hq, Hkv, S);
  if (i < 0) return no_bucket(dims(B, Hq, Hkv, S));
  const Bucket& b = kBuckets[i];
  return result(b, b.forward(q, k, v, o, lse, B, Hq, Hkv, S, softmax_scale, stream));
}}

FA_TUNE_API int fa_tune_prepare(int B, int Hq, int Hkv, int S, cudaStream_t stream,
                                double* host_ms) {{
  g_error.clear();
  if (host_ms != nullptr) *host_ms = 0.0;
  const int i = find(Hq, Hkv, S);
  if (i < 0) return no_bucket(dims(B, Hq, Hkv, S));
  const Bucket& b = kBuckets[i];
  return result(b, b.prepare(B, Hq, Hkv, S, stream, host_ms));
}}

FA_TUNE_API int fa_tune_forward_varlen(const void* q, const void* k, const void* v, void* o,
                                       float* lse, const int* cu_seqlens, int num_seqs,
                                       int total_tokens, int max_seqlen, int Hq, int Hkv,
                                       float softmax_scale, void* workspace,
                                       size_t workspace_bytes, cudaStream_t stream) {{
  g_error.clear();
  if (max_seqlen < 1) {{
    g_error = "max_seqlen must be positive (the longest sequence), got " +
              std::to_string(max_seqlen);
    return int(cudaErrorInvalidValue);
  }}
  const int i = find(Hq, Hkv, max_seqlen);
  if (i < 0) {{
    return no_bucket("varlen Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) +
                     " max_seqlen=" + std::to_string(max_seqlen));
  }}
  const Bucket& b = kBuckets[i];
  if (b.forward_varlen == nullptr) {{
    g_error = std::string("bucket ") + b.name +
              ": its kernel was built before the varlen entry points (export the library again)";
    return int(cudaErrorNotSupported);
  }}
  return result(b, b.forward_varlen(q, k, v, o, lse, cu_seqlens, num_seqs, total_tokens,
                                    max_seqlen, Hq, Hkv, softmax_scale, workspace,
                                    workspace_bytes, stream));
}}

// No Hkv here: the most any bucket for Hq whose S range holds max_seqlen needs, which covers
// the one forward_varlen picks.
FA_TUNE_API size_t fa_tune_varlen_workspace_bytes(int num_seqs, int Hq, int total_tokens,
                                                  int max_seqlen) {{
  size_t most = 0;
  for (const Bucket& b : kBuckets) {{
    if (b.hq == Hq && holds(b, max_seqlen) && b.varlen_workspace_bytes != nullptr)
      most = std::max(most, b.varlen_workspace_bytes(num_seqs, Hq, total_tokens, max_seqlen));
  }}
  return most;
}}

FA_TUNE_API const char* fa_tune_last_error(void) {{ return g_error.c_str(); }}

FA_TUNE_API const char* fa_tune_config_json(void) {{ return kConfigJson; }}

FA_TUNE_API const char* fa_tune_problem_class(void) {{
  static const std::string json = [] {{
    bool any = false;
    for (const Bucket& b : kBuckets) any = any || serves_varlen(b);
    return std::string(kProblemClassHead) + (any ? "true" : "false") + "}}";
  }}();
  return json.c_str();
}}

FA_TUNE_API int fa_tune_smem_bytes(void) {{
  int most = 0;
  for (const Bucket& b : kBuckets) most = std::max(most, b.smem_bytes());
  return most;
}}

FA_TUNE_API int fa_tune_bucket_count(void) {{ return kNumBuckets; }}

FA_TUNE_API int fa_tune_bucket_for(int /*B*/, int Hq, int Hkv, int S) {{ return find(Hq, Hkv, S); }}

FA_TUNE_API const char* fa_tune_dispatch_json(void) {{ return kDispatchJson; }}

}}  // extern "C"
"""
