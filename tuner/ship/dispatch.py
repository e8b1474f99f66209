"""Dispatch tables: which kernel config serves which length bucket, and the C++ dispatcher.

A ``DispatchTable`` maps each bucket of a workload (tuner/ship/workload.py) to one config: heads
(Hq, Hkv), head dim and mask, a query-length range (s_min..s_max) and a key-length range
(k_min..k_max; both None: any key length, so a chunk of a chunked prefill runs the kernel of
its query length's bucket), the config and where it came from (a study's trial, a preset, a
config file) with what was measured. It is JSON (``dispatch.json``, schema 2; schema 1, from
before key ranges, still loads) and round-trips exactly (``DispatchTable.from_dict(t.to_dict())
== t``). Entries are in dispatch order: the first that serves a call wins. Two entries of the
same heads may overlap only when the first has a key range and the second has none (a
key-range bucket takes its part of a query-length bucket's calls); a workload's key-range
buckets come first (``Workload.dispatch_order``).

``dispatcher_cpp.dispatcher_source`` writes the C++ of a library that links every bucket's kernel,
each built from the same template with its C ABI renamed by ``-DFA_TUNE_API_PREFIX=fa_tune_b<i>_``
(cuda_src/fa_tune/entry.cuh), and exports the C ABI of cuda_src/fa_tune/fa_tune.h (its
FA_TUNE_ABI_VERSION; shipped as include/fa_tune.h, which it includes) itself:
``fa_tune_forward``, ``_prepare`` and ``_workspace_bytes`` pick the first entry whose heads
match and whose ranges hold the call's (seqlen_q, seqlen_k): S_q and S_k, or max_seqlen_q and
max_seqlen_k for a call with device metadata (``select``/``index_for`` are the same rule in
Python). A call no bucket serves gets
cudaErrorNotSupported with a last_error naming what the library serves; args of another ABI version
or size are refused in one line. Every bucket is built with the varlen kernel (its kernel.cu defines
FA_TUNE_VARLEN 1) except where its config cannot serve varlen (config.check_varlen): that bucket
answers a call with device metadata (cu_seqlens_q/k, seqused_k) with cudaErrorNotSupported (801) and
says why, and the library's problem_class says ``"varlen": true`` when some bucket serves it."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import FaTuneError
from tuner.kernel.config import KernelConfig, validate
from tuner.kernel.runtime import abi
from tuner.problem import Problem, ProblemClass
from tuner.problem_text import HEAD_DIMS
from tuner.ship.workload import Workload, is_bucket_name, is_safe_name
from tuner.ship.workload import range_text as _range_text

# ProblemClass's flags beyond D and the mask: the models' masks, a paged KV cache.
MASKS = ("window", "softcap", "sinks", "paged")
SCHEMA = 2  # 2: key ranges (k_min, k_max); 1 had none (any key length)
ABI_VERSION = abi.ABI_VERSION
CUDA_ERROR_NOT_SUPPORTED = 801  # cudaErrorNotSupported: no bucket serves it / no varlen kernel
HEADER_NAME = "fa_tune.h"  # cuda_src/fa_tune/fa_tune.h; an export ships it as include/fa_tune.h


class DispatchError(FaTuneError):
    """A dispatch table or a bucket's config source is malformed or inconsistent."""


def symbol_prefix(index: int) -> str:
    """The C ABI prefix of the table's index-th kernel inside a workload library."""
    return f"fa_tune_b{index}_"


@dataclass(frozen=True)
class DispatchEntry:
    """One bucket: problems with these heads, head dim and mask, s_min <= S_q <= s_max (None: no
    upper bound) and k_min <= S_k <= k_max (k_min None: any key length) run ``config``."""

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
    k_min: int | None = None
    k_max: int | None = None
    masks: tuple[str, ...] = ()  # the class flags its kernel carries (MASKS): window, ..., paged
    window: int | None = None    # a layer kind's bucket: calls with this window only (0: none)

    @property
    def problem_class(self) -> ProblemClass:
        return ProblemClass(self.head_dim, self.causal, **{m: True for m in self.masks})

    @property
    def keyed(self) -> bool:
        """Whether it serves a key-length range only (else every key length)."""
        return self.k_min is not None

    def serves(self, Hq: int, Hkv: int, S: int, Sk: int | None = None, window: int = 0) -> bool:
        """Whether it serves S queries over Sk keys (None: S) with these heads and window."""
        sk = S if Sk is None else Sk
        return (Hq == self.Hq and Hkv == self.Hkv and S >= self.s_min
                and (self.s_max is None or S <= self.s_max)
                and (self.k_min is None or sk >= self.k_min)
                and (self.k_max is None or sk <= self.k_max)
                and (self.window is None or window == self.window))

    def range_text(self) -> str:
        text = _range_text(self.s_min, self.s_max)
        if self.k_min is not None:
            text += f", k {_range_text(self.k_min, self.k_max)}"
        if self.window is not None:
            text += f", window {self.window}" if self.window else ", no window"
        return text

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
            "k_min": self.k_min, "k_max": self.k_max,
            "config": self.config.to_dict(), "config_id": self.config.config_id(),
            "source": dict(self.source), "problems": list(self.problems),
            "measured": self.measured,
            **({"masks": list(self.masks)} if self.masks else {}),
            **({"window": self.window} if self.window is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "entry") -> DispatchEntry:
        """An entry as dispatch.json holds it; every field's type and range checked (a table is
        user input: its names become files, its values generated code), one line naming it."""
        if not isinstance(d, Mapping):
            raise DispatchError(f"{where}: must be a mapping")
        if "bucket" not in d:
            raise DispatchError(f"{where}: missing 'bucket'")
        if not is_bucket_name(d["bucket"]):
            raise DispatchError(f"{where}: bucket must be letters, digits, '_' or '-' (it names "
                                f"the bucket's files; got {d['bucket']!r})")
        where = f"{where} (bucket {d['bucket']})"
        try:
            if not isinstance(d["config"], Mapping):
                raise DispatchError(f"{where}: config must be a mapping of knob: value (got "
                                    f"{d['config']!r})")
            s_max, k_min, k_max = d["s_max"], d.get("k_min"), d.get("k_max")
            entry = cls(
                bucket=d["bucket"], Hq=_int(d["Hq"], "Hq"), Hkv=_int(d["Hkv"], "Hkv"),
                head_dim=_int(d["head_dim"], "head_dim"), causal=_bool(d["causal"], "causal"),
                s_min=_int(d["s_min"], "s_min"),
                s_max=None if s_max is None else _int(s_max, "s_max"),
                config=KernelConfig.from_dict(d["config"], source=f"{where}: config"),
                source=_source(d.get("source")),
                problems=_problems(d.get("problems")),
                measured=_measured_field(d.get("measured")),
                k_min=None if k_min is None else _int(k_min, "k_min"),
                k_max=None if k_max is None else _int(k_max, "k_max"),
                masks=_masks(d.get("masks") or ()),
                window=None if d.get("window") is None else _int(d["window"], "window"),
            )
        except KeyError as e:
            raise DispatchError(f"{where}: missing {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise DispatchError(f"{where}: {e}") from None
        except FaTuneError as e:  # a config's knob, a problem's text
            raise DispatchError(str(e) if where in str(e) else f"{where}: {e}") from None
        entry._check(where)
        if entry.k_max is not None and entry.k_min is None:
            raise DispatchError(f"{where}: k_max without k_min (a key range needs both ends; "
                                "k_max null: no upper bound)")
        cid = d.get("config_id")
        if cid is not None and cid != entry.config.config_id():
            raise DispatchError(f"{where}: config_id {cid} does not match its config "
                                f"({entry.config.config_id()}); the file was edited by hand?")
        return entry

    def _check(self, where: str) -> None:
        """The ranges the rest of fa-tune holds a problem and a bucket to."""
        for name in ("Hq", "Hkv", "s_min", "k_min", "k_max", "s_max"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise DispatchError(f"{where}: {name} must be a positive integer (got {v})")
        if self.head_dim not in HEAD_DIMS:
            raise DispatchError(f"{where}: head_dim {self.head_dim} is not one the kernel "
                                f"builds; choose from {', '.join(map(str, HEAD_DIMS))}")
        if self.window is not None and self.window < 0:
            raise DispatchError(f"{where}: window must be 0 (none) or a positive number of keys "
                                f"(got {self.window})")
        if self.window and "window" not in self.masks:
            raise DispatchError(f"{where}: window {self.window} needs 'window' in masks (the "
                                "library's kernel carries the window)")
        if self.Hq % self.Hkv:
            raise DispatchError(f"{where}: Hq {self.Hq} must be a multiple of Hkv {self.Hkv} "
                                "(each K/V head serves the same number of query heads)")
        try:  # the problem's own rules (any beyond those above)
            Problem(1, self.Hq, 1, Hkv=self.Hkv, D=self.head_dim, causal=self.causal)
        except FaTuneError as e:
            raise DispatchError(f"{where}: {e}") from None
        try:
            check_entry_config(self.bucket, self.config, self.problem_class)
        except DispatchError as e:
            raise DispatchError(f"{where}: {str(e).removeprefix(f'bucket {self.bucket}: ')}"
                                ) from None


def _int(v: Any, field: str = "value") -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{field}: expected an integer, got {v!r}")
    return v


def _bool(v: Any, field: str = "value") -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{field}: expected true or false, got {v!r}")
    return v


SOURCE_KINDS = ("study", "preset", "file")


def _source(v: Any) -> dict[str, Any]:
    """Where a bucket's config came from: {"kind": study|preset|file, ...} of plain values."""
    if v is None:
        return {}
    if not isinstance(v, Mapping) or not all(
            isinstance(k, str) and (x is None or isinstance(x, (str, int, float, bool)))
            for k, x in v.items()):
        raise ValueError(f"source must be a mapping of names to plain values (got {v!r})")
    if v and v.get("kind") not in SOURCE_KINDS:
        raise ValueError(f"source kind must be one of {', '.join(SOURCE_KINDS)} "
                         f"(got {v.get('kind')!r})")
    return dict(v)


def _problems(v: Any) -> tuple[str, ...]:
    """The problems a bucket was tuned on, each a problem text the normal parser takes."""
    if v is None:
        return ()
    if not isinstance(v, list):
        raise ValueError(f"problems must be a list of problem texts (got {v!r})")
    for i, text in enumerate(v):
        if not isinstance(text, str):
            raise ValueError(f"problems[{i}] must be a problem text (got {text!r})")
        try:
            Problem.parse(text)
        except FaTuneError as e:
            raise ValueError(f"problems[{i}]: {e}") from None
    return tuple(v)


def _measured_field(v: Any) -> dict[str, Any] | None:
    """{"protocol": text, PROBLEM: {median_ms, tflops, ...: number}} or null (the README
    formats the numbers)."""
    if v is None:
        return None
    if not isinstance(v, Mapping):
        raise ValueError(f"measured must be a mapping or null (got {v!r})")
    for k, x in v.items():
        if not isinstance(k, str):
            raise ValueError(f"measured: key {k!r} must be text")
        if k == "protocol" and isinstance(x, str):
            continue
        if not isinstance(x, Mapping) or not all(
                isinstance(n, str) and isinstance(y, (int, float)) and not isinstance(y, bool)
                for n, y in x.items()):
            raise ValueError(f"measured[{k!r}] must map median_ms, tflops, ... to numbers "
                             f"(got {x!r})")
    return dict(v)


@dataclass(frozen=True)
class DispatchTable:
    """The buckets of one library, in dispatch order (the first entry that serves wins)."""

    name: str
    entries: tuple[DispatchEntry, ...]
    workload: dict[str, Any] | None = None  # the workload it was made for (Workload.to_dict())

    def __post_init__(self) -> None:
        # Names become folders and files of an export: checked however the table was made.
        if not is_safe_name(self.name):
            raise DispatchError(f"dispatch table name must be letters, digits, '_', '-' or '.' "
                                f"(not '..'; got {self.name!r})")
        if not self.entries:
            raise DispatchError(f"dispatch table '{self.name}' has no entries")
        bad = next((e.bucket for e in self.entries if not is_bucket_name(e.bucket)), None)
        if bad is not None:
            raise DispatchError(f"dispatch table '{self.name}': bucket name {bad!r} must be "
                                "letters, digits, '_' or '-'")
        # One head dim and mask a library. Its kernels differ only where a kind of layers
        # has no window: those buckets (window 0) are built without one.
        classes = {dataclasses.replace(e.problem_class, window=False) for e in self.entries}
        if len(classes) > 1:
            raise DispatchError(
                f"dispatch table '{self.name}' mixes problem classes "
                f"({'; '.join(sorted(map(str, classes)))}): one library serves one head dim "
                "and mask"
            )
        lone = next((e for e in self.entries if e.window != 0 and "window" not in e.masks), None)
        if lone is not None and any("window" in e.masks for e in self.entries):
            raise DispatchError(
                f"dispatch table '{self.name}': bucket {lone.bucket} has no window in its "
                "masks but may be handed a windowed call; only a kind's bucket of window 0 "
                "leaves the library's window out")
        names = [e.bucket for e in self.entries]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise DispatchError(f"dispatch table '{self.name}': bucket {dup[0]} appears twice")
        for i, a in enumerate(self.entries):
            if a.s_max is not None and a.s_max < a.s_min:
                raise DispatchError(f"bucket {a.bucket}: s_max {a.s_max} < s_min {a.s_min}")
            if a.k_min is not None and a.k_max is not None and a.k_max < a.k_min:
                raise DispatchError(f"bucket {a.bucket}: k_max {a.k_max} < k_min {a.k_min}")
            for b in self.entries[i + 1:]:
                # A key-range entry before an any-key entry is the one allowed overlap: it
                # takes that part of the other's calls (chunked prefill of those lengths).
                if (a.Hq, a.Hkv) == (b.Hq, b.Hkv) and _overlap(a, b) and not (
                        a.keyed and not b.keyed) and (a.window is None or b.window is None
                                                      or a.window == b.window):
                    hint = (f"; put {b.bucket} first (a key-range bucket goes before the "
                            "query-length buckets it overlaps)" if b.keyed and not a.keyed
                            else "")
                    raise DispatchError(
                        f"buckets {a.bucket} (S {a.range_text()}) and {b.bucket} "
                        f"(S {b.range_text()}) overlap for Hq={a.Hq}, Hkv={a.Hkv}{hint}"
                    )

    @property
    def problem_class(self) -> ProblemClass:
        """The class the library serves: its buckets', with a window where one has it."""
        pc = self.entries[0].problem_class
        return dataclasses.replace(pc, window=any("window" in e.masks for e in self.entries))

    def index_for(self, Hq: int, Hkv: int, S: int, Sk: int | None = None,
                  window: int = 0) -> int:
        """The index of the entry serving S queries over Sk keys (None: S; for a call with
        device metadata max_seqlen_q and max_seqlen_k) with this window (0: none): the
        dispatcher's fa_tune_bucket_for; -1 for none."""
        return next((i for i, e in enumerate(self.entries)
                     if e.serves(Hq, Hkv, S, Sk, window)), -1)

    def select(self, problem: Problem | str) -> DispatchEntry | None:
        """The entry serving a problem (None: no bucket does, or another head dim or mask)."""
        p = Problem.parse(problem) if isinstance(problem, str) else problem
        if self.problem_class.serves(p, varlen=False):  # varlen is each bucket's own
            return None
        i = self.index_for(p.Hq, p.Hkv, p.S, getattr(p, "Sk", 0) or p.S, p.window)
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
        if d.get("schema") not in (1, SCHEMA):
            raise DispatchError(f"{source}: dispatch table schema {d.get('schema')!r}; this "
                                f"fa-tune reads schemas 1 and {SCHEMA}")
        entries = d.get("entries")
        if not isinstance(entries, list):
            raise DispatchError(f"{source}: 'entries' must be a list")
        name = d.get("name")
        if not is_safe_name(name):
            raise DispatchError(f"{source}: 'name' must be letters, digits, '_', '-' or '.' "
                                f"(not '..'; it names the library; got {name!r})")
        # An older table's library is built for this ABI all the same; a newer one's may need
        # what this fa-tune lacks. Schema 1 tables may have none.
        abi_v = d.get("abi_version", ABI_VERSION)
        if isinstance(abi_v, bool) or not isinstance(abi_v, int) or not 1 <= abi_v <= ABI_VERSION:
            raise DispatchError(f"{source}: abi_version {abi_v!r}: this fa-tune reads tables of "
                                f"ABI 1..{ABI_VERSION}; export it with the fa-tune that wrote "
                                "it, or export its workload again (--workload)")
        workload = d.get("workload")
        if workload is not None and not isinstance(workload, Mapping):
            raise DispatchError(f"{source}: 'workload' must be a mapping or null")
        try:
            table = cls(name, tuple(DispatchEntry.from_dict(e, f"{source}: entries[{i}]")
                                    for i, e in enumerate(entries)),
                        None if workload is None else dict(workload))
        except DispatchError as e:
            raise DispatchError(f"{source}: {e}" if source not in str(e) else str(e)) from None
        if "problem_class" in d:
            _check_class(d["problem_class"], table.problem_class, source)
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


_CLASS_KEYS = ("head_dim", "causal", "varlen", *MASKS)


def _check_class(v: Any, pc: ProblemClass, source: str) -> None:
    """The table's problem_class must be a class and its entries' (varlen is each bucket's)."""
    if not isinstance(v, Mapping) or any(k not in _CLASS_KEYS for k in v) or not all(
            isinstance(x, bool) for k, x in v.items() if k != "head_dim"):
        raise DispatchError(f"{source}: problem_class must be a mapping of head_dim and the "
                            f"flags {', '.join(_CLASS_KEYS[1:])} (true/false); got {v!r}")
    want = {k: x for k, x in pc.to_dict().items() if k != "varlen"}
    got = {k: x for k, x in v.items() if k != "varlen" and (k in ("head_dim", "causal") or x)}
    if got != want:
        raise DispatchError(f"{source}: problem_class {dict(v)} is not its entries' "
                            f"({want}); the file was edited by hand?")


def _span_overlap(a_lo: int, a_hi: int | None, b_lo: int, b_hi: int | None) -> bool:
    return (b_hi is None or a_lo <= b_hi) and (a_hi is None or b_lo <= a_hi)


def _overlap(a: DispatchEntry, b: DispatchEntry) -> bool:
    """Whether some (S_q, S_k) is served by both (an entry without a key range serves all)."""
    return _span_overlap(a.s_min, a.s_max, b.s_min, b.s_max) and _span_overlap(
        a.k_min or 1, a.k_max, b.k_min or 1, b.k_max)


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
    """A bucket's config from SOURCE (``SOURCE_HELP``), checked against the bucket's class."""
    text = str(text).strip()
    if text.startswith("study:"):
        from tuner.search.study import redact, trial_class
        from tuner.search.trials import pick_trial

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
                                f"problems; this bucket serves {pclass}")
        measured, problems = _measured(trial)
        src = {"kind": "study", "study": name, "trial": trial.number,
               "storage": redact(storage) if storage else None}
        return Resolved(KernelConfig.from_dict(cfg_d, source=f"study {name}"), src, measured,
                        problems, trial)
    if text.startswith("preset:"):
        from tuner.kernel.config import load_preset

        name = text[len("preset:"):]
        return Resolved(load_preset(name), {"kind": "preset", "name": name})
    path = Path(text[len("config:"):] if text.startswith("config:") else text)
    if not path.is_file():
        raise DispatchError(f"bad source '{text}': no such file; give {SOURCE_HELP}")
    return Resolved(KernelConfig.load(path), {"kind": "file", "path": str(path)})


def _study_exists(name: str, storage: str | None) -> bool:
    from tuner.errors import SearchError
    from tuner.search.study import load_existing_study

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
    missing = [b.name for b in workload.buckets if b.name not in texts]
    if missing and study_prefix:  # say which studies were looked for, and how to make them
        many = len(missing) > 1
        raise DispatchError(
            f"no study {study_prefix}<bucket> for bucket{'s' if many else ''} "
            f"{', '.join(missing)} of workload '{workload.name}': tune {'them' if many else 'it'} "
            f"(fa-tune tune --workload {workload.name} --bucket {missing[0]}), or give --default "
            f"SOURCE or --bucket NAME=SOURCE, SOURCE one of {SOURCE_HELP}")
    return {name: resolve_source(src, workload.bucket_class(workload.bucket(name)), storage)
            for name, src in texts.items()}


def _class_masks(pc: ProblemClass) -> tuple[str, ...]:
    return tuple(m for m in MASKS if getattr(pc, m))


def _masks(v: Any) -> tuple[str, ...]:
    if not isinstance(v, (list, tuple)) or any(m not in MASKS for m in v):
        raise ValueError(f"masks must be a list of {', '.join(MASKS)} (got {v!r})")
    return tuple(m for m in MASKS if m in v)


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
    """One entry per bucket of the workload, in dispatch order (its key-range buckets, then its
    query-length chain, each in file order); every bucket needs a source."""
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
    for b in workload.dispatch_order():  # key-range buckets first: the first that serves wins
        r, pclass = sources[b.name], workload.bucket_class(b)
        check_entry_config(b.name, r.config, pclass)
        entries.append(DispatchEntry(
            bucket=b.name, Hq=att.Hq, Hkv=att.Hkv, head_dim=att.head_dim, causal=att.causal,
            s_min=b.s_min, s_max=b.s_max, config=r.config, source=dict(r.source),
            problems=r.problems or tuple(plans[b.name].shapes), measured=r.measured,
            k_min=b.k_min, k_max=b.k_max, masks=_class_masks(pclass), window=b.window))
    return DispatchTable(workload.name, tuple(entries), workload.to_dict())


# ---- C++ ----------------------------------------------------------------------------------------


