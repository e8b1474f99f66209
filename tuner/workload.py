"""Workload files: a model's attention problem, the traffic it sees, and its length buckets.

A workload (``workloads/<name>.yaml``) is what one exported library is tuned for and serves::

    name: llama3-8b
    description: free text
    attention: {Hq: 32, Hkv: 8, head_dim: 128, causal: true}
    buckets:                     # by S (a varlen batch's max_seqlen);
      - {name: s1k, max_s: 1024} # each bucket serves (previous max_s, max_s]; the last may
      - {name: s8k, max_s: 8192} # say max_s: null (no upper bound)
    traffic:                     # relative call frequencies; any of these, all combined
      lengths: {512: 3, 2048: 2} # prefill length S -> weight ...
      batch: {1: 0.7, 4: 0.3}    # ... times batch size B -> weight (default {1: 1})
      shapes:                    # and fixed (B, S) shapes with their own weights
        - {B: 1, S: 8192, weight: 1}
      packed:                    # and packed varlen batches (a prefill server's): the lengths
        - {lengths: "4096,2048*2,512*8", weight: 1}   # as in a problem's [...], or a list
    tuning: {max_problems: 3}    # problems per bucket to tune on (default 3)

``plan()`` turns it into the problems to tune per bucket: the traffic points in the bucket,
ranked by their share of attention time there (weight x FLOPs, the time at a constant TFLOPS
rate), the top ``max_problems``; a bucket without traffic is tuned on its upper edge (B=1). A
packed batch lands in the bucket of its longest sequence (the dispatcher picks by max_seqlen)
and is tuned on as a varlen problem, so that bucket's search builds the varlen kernel too.
A bad file is one ``WorkloadError`` line naming the file and the entry.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tuner import _paths
from tuner.errors import FaTuneError
from tuner.problem import Problem, ProblemClass, ShapeError, lengths_text, parse_lengths

DEFAULT_MAX_PROBLEMS = 3
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# Bucket names become file names, study-name suffixes and C identifiers' comments.
_BUCKET_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_TOP_KEYS = {"name", "description", "attention", "buckets", "traffic", "tuning"}


class WorkloadError(FaTuneError):
    """A workload file is missing, unreadable or malformed."""


@dataclass(frozen=True)
class Attention:
    """The model's attention problem apart from B and S (heads per GPU under tensor
    parallelism: a TP-8 Llama-3-70B shard is Hq 8, Hkv 1)."""

    Hq: int
    Hkv: int
    head_dim: int = 128
    causal: bool = True

    @property
    def problem_class(self) -> ProblemClass:
        return ProblemClass(self.head_dim, self.causal)

    def problem(self, B: int, S: int) -> Problem:
        return Problem(B, self.Hq, S, Hkv=self.Hkv, D=self.head_dim, causal=self.causal)

    def packed(self, lengths: tuple[int, ...]) -> Problem:
        return Problem.varlen(lengths, self.Hq, Hkv=self.Hkv, D=self.head_dim, causal=self.causal)

    def to_dict(self) -> dict[str, Any]:
        return {"Hq": self.Hq, "Hkv": self.Hkv, "head_dim": self.head_dim, "causal": self.causal}


@dataclass(frozen=True)
class Bucket:
    """Sequence lengths s_min <= S <= s_max (s_max None: no upper bound)."""

    name: str
    s_min: int
    s_max: int | None

    def contains(self, S: int) -> bool:
        return S >= self.s_min and (self.s_max is None or S <= self.s_max)

    def range_text(self) -> str:
        return f"{self.s_min}..{self.s_max}" if self.s_max is not None else f">= {self.s_min}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "s_min": self.s_min, "s_max": self.s_max}


@dataclass(frozen=True)
class TrafficPoint:
    """One (B, S) the model is called with, or one packed batch of these sequence lengths (then
    B is their count and S the longest); weight = its share of calls (all sum to 1)."""

    B: int
    S: int
    weight: float
    lengths: tuple[int, ...] = ()

    def problem(self, att: Attention) -> Problem:
        return att.packed(self.lengths) if self.lengths else att.problem(self.B, self.S)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"B": self.B, "S": self.S, "weight": self.weight}
        if self.lengths:
            d["lengths"] = lengths_text(self.lengths)
        return d


@dataclass(frozen=True)
class PlannedProblem:
    problem: Problem
    weight: float      # share of the bucket's calls
    time_share: float  # share of the bucket's attention time (weight x FLOPs)


@dataclass(frozen=True)
class BucketPlan:
    bucket: Bucket
    problems: tuple[PlannedProblem, ...]
    call_share: float  # share of all calls that land in this bucket
    time_share: float  # share of all attention time spent in this bucket

    @property
    def shapes(self) -> list[str]:
        return [str(p.problem) for p in self.problems]


@dataclass(frozen=True)
class Workload:
    name: str
    attention: Attention
    buckets: tuple[Bucket, ...]
    traffic: tuple[TrafficPoint, ...]
    description: str = ""
    max_problems: int = DEFAULT_MAX_PROBLEMS
    source: str = "<workload>"

    def bucket_for(self, S: int) -> Bucket | None:
        """The bucket serving sequence length S (max_seqlen for a varlen batch), or None."""
        return next((b for b in self.buckets if b.contains(S)), None)

    def bucket(self, name: str) -> Bucket:
        for b in self.buckets:
            if b.name == name:
                return b
        raise WorkloadError(f"workload '{self.name}' has no bucket '{name}'; its buckets: "
                            f"{', '.join(b.name for b in self.buckets)}")

    def plan(self, max_problems: int | None = None) -> list[BucketPlan]:
        """Per bucket, the problems to tune on (most attention time first)."""
        keep = self.max_problems if max_problems is None else max_problems
        if keep < 1:
            raise WorkloadError(f"max problems per bucket must be at least 1 (got {keep})")
        total_time = sum(t.weight * t.problem(self.attention).flops for t in self.traffic)
        plans = []
        for b in self.buckets:
            pts = [t for t in self.traffic if b.contains(t.S)]
            calls = sum(t.weight for t in pts)
            if not pts:  # no traffic here: tune on the bucket's upper edge, B=1
                p = self.attention.problem(1, b.s_max if b.s_max is not None else b.s_min)
                plans.append(BucketPlan(b, (PlannedProblem(p, 0.0, 0.0),), 0.0, 0.0))
                continue
            cost = [(t, t.problem(self.attention)) for t in pts]
            time = sum(t.weight * p.flops for t, p in cost)
            ranked = sorted(cost, key=lambda tp: (-tp[0].weight * tp[1].flops, tp[1].S, tp[1].B))
            problems = tuple(PlannedProblem(p, t.weight / calls, t.weight * p.flops / time)
                             for t, p in ranked[:keep])
            plans.append(BucketPlan(b, problems, calls, time / total_time if total_time else 0.0))
        return plans

    def to_dict(self) -> dict[str, Any]:
        """The workload as parsed (normalised weights), for dispatch tables and exports."""
        return {
            "name": self.name, "description": self.description,
            "attention": self.attention.to_dict(),
            "buckets": [b.to_dict() for b in self.buckets],
            "traffic": [t.to_dict() for t in self.traffic],
            "max_problems": self.max_problems,
        }


# ---- parsing ---------------------------------------------------------------------------------
def _pos_int(value: Any, what: str, src: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise WorkloadError(f"{src}: {what} must be a positive integer (got {value!r})")
    return value


def _weight(value: Any, what: str, src: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 \
            or value == float("inf"):
        raise WorkloadError(f"{src}: {what} must be a finite number >= 0 (got {value!r})")
    return float(value)


def _mapping(value: Any, what: str, src: str, keys: set[str] | None = None) -> Mapping:
    if not isinstance(value, Mapping):
        raise WorkloadError(f"{src}: {what} must be a mapping (got {type(value).__name__})")
    if keys is not None:
        extra = sorted(str(k) for k in value if k not in keys)
        if extra:
            raise WorkloadError(f"{src}: unknown key{'s' if len(extra) > 1 else ''} "
                                f"{', '.join(extra)} in {what}; allowed: {', '.join(sorted(keys))}")
    return value


def _attention(d: Any, src: str) -> Attention:
    d = _mapping(d, "attention", src, {"Hq", "Hkv", "head_dim", "causal"})
    for k in ("Hq", "Hkv"):
        if k not in d:
            raise WorkloadError(f"{src}: attention needs {k}")
    hq = _pos_int(d["Hq"], "attention.Hq", src)
    hkv = _pos_int(d["Hkv"], "attention.Hkv", src)
    dim = _pos_int(d.get("head_dim", 128), "attention.head_dim", src)
    causal = d.get("causal", True)
    if not isinstance(causal, bool):
        raise WorkloadError(f"{src}: attention.causal must be true or false (got {causal!r})")
    att = Attention(hq, hkv, dim, causal)
    try:
        att.problem(1, 1)  # Problem's own checks: Hq a multiple of Hkv, a supported head dim
    except FaTuneError as e:
        raise WorkloadError(f"{src}: attention: {e}") from None
    return att


def _buckets(items: Any, src: str) -> tuple[Bucket, ...]:
    if not isinstance(items, list) or not items:
        raise WorkloadError(f"{src}: buckets must be a non-empty list of {{name, max_s}}")
    out: list[Bucket] = []
    lo = 1
    for i, item in enumerate(items):
        what = f"buckets[{i}]"
        item = _mapping(item, what, src, {"name", "max_s"})
        name = item.get("name")
        if not isinstance(name, str) or not _BUCKET_RE.fullmatch(name):
            raise WorkloadError(f"{src}: {what}.name must be letters, digits, '_' or '-' "
                                f"(got {name!r})")
        if any(b.name == name for b in out):
            raise WorkloadError(f"{src}: bucket name '{name}' is used twice")
        if "max_s" not in item:
            raise WorkloadError(f"{src}: {what} ({name}) needs max_s (null: no upper bound)")
        hi = item["max_s"]
        if hi is None:
            if i != len(items) - 1:
                raise WorkloadError(f"{src}: only the last bucket may have max_s: null "
                                    f"({name} is not last)")
        else:
            hi = _pos_int(hi, f"{what}.max_s", src)
            if hi < lo:
                raise WorkloadError(f"{src}: buckets must grow: {name}'s max_s {hi} is not above "
                                    f"the previous bucket's {lo - 1}")
        out.append(Bucket(name, lo, hi))
        lo = (hi or 0) + 1
    return tuple(out)


Raw = tuple[int, int, float, str, tuple[int, ...]]  # (B, S, weight, where, packed lengths)


def _packed_lengths(value: Any, what: str, src: str) -> tuple[int, ...]:
    if isinstance(value, str):
        try:
            lengths = parse_lengths(value.strip("[] "), value)
        except ShapeError as e:
            raise WorkloadError(f"{src}: {what}: {e}") from None
    elif isinstance(value, list) and value:
        lengths = tuple(v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else
                        _pos_int(v, f"{what} entries", src) for v in value)
    else:
        raise WorkloadError(f"{src}: {what} must be sequence lengths: text as in a problem "
                            f"('4096,2048*2,512*8') or a list of integers (got {value!r})")
    if not lengths or max(lengths) < 1:
        raise WorkloadError(f"{src}: {what} must hold at least one sequence of 1 token or more")
    return lengths


def _traffic(d: Any, src: str) -> list[Raw]:
    """(B, S, weight, where, lengths) before normalising."""
    d = _mapping(d, "traffic", src, {"lengths", "batch", "shapes", "packed"})
    pts: list[Raw] = []
    if "lengths" in d:
        lengths = _mapping(d["lengths"], "traffic.lengths", src)
        batch = _mapping(d.get("batch", {1: 1}), "traffic.batch", src)
        if not lengths or not batch:
            raise WorkloadError(f"{src}: traffic.lengths and traffic.batch must not be empty")
        for s, ws in lengths.items():
            S = _pos_int(s, f"traffic.lengths key {s!r}", src)
            w_s = _weight(ws, f"traffic.lengths[{s}]", src)
            for b, wb in batch.items():
                B = _pos_int(b, f"traffic.batch key {b!r}", src)
                pts.append((B, S, w_s * _weight(wb, f"traffic.batch[{b}]", src),
                            f"traffic.lengths[{S}] x batch[{B}]", ()))
    elif "batch" in d:
        raise WorkloadError(f"{src}: traffic.batch needs traffic.lengths (batch sizes weight "
                            "the lengths)")
    shapes = d.get("shapes", [])
    if not isinstance(shapes, list):
        raise WorkloadError(f"{src}: traffic.shapes must be a list of {{B, S, weight}}")
    for i, item in enumerate(shapes):
        what = f"traffic.shapes[{i}]"
        item = _mapping(item, what, src, {"B", "S", "weight"})
        if "S" not in item:
            raise WorkloadError(f"{src}: {what} needs S")
        pts.append((_pos_int(item.get("B", 1), f"{what}.B", src),
                    _pos_int(item["S"], f"{what}.S", src),
                    _weight(item.get("weight", 1), f"{what}.weight", src), what, ()))
    packed = d.get("packed", [])
    if not isinstance(packed, list):
        raise WorkloadError(f"{src}: traffic.packed must be a list of {{lengths, weight}}")
    for i, item in enumerate(packed):
        what = f"traffic.packed[{i}]"
        item = _mapping(item, what, src, {"lengths", "weight"})
        if "lengths" not in item:
            raise WorkloadError(f"{src}: {what} needs lengths (e.g. '4096,2048*2,512*8')")
        lengths = _packed_lengths(item["lengths"], f"{what}.lengths", src)
        pts.append((len(lengths), max(lengths),
                    _weight(item.get("weight", 1), f"{what}.weight", src), what, lengths))
    if not pts:
        raise WorkloadError(f"{src}: traffic names no shapes: give traffic.lengths (and batch), "
                            "traffic.shapes or traffic.packed")
    return pts


def workload_from_dict(data: Any, source: str = "<workload>") -> Workload:
    src = source
    d = _mapping(data, "the file", src, _TOP_KEYS)
    for k in ("name", "attention", "buckets", "traffic"):
        if k not in d:
            raise WorkloadError(f"{src}: missing '{k}' (a workload names name, attention, "
                                "buckets and traffic)")
    name = d["name"]
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise WorkloadError(f"{src}: name must be letters, digits, '_', '-' or '.' "
                            f"(got {name!r})")
    desc = d.get("description", "")
    if not isinstance(desc, str):
        raise WorkloadError(f"{src}: description must be text")
    att = _attention(d["attention"], src)
    buckets = _buckets(d["buckets"], src)
    raw = _traffic(d["traffic"], src)
    merged: dict[tuple[int, int, tuple[int, ...]], float] = {}
    for B, S, w, where, lengths in raw:
        try:
            att.packed(lengths) if lengths else att.problem(B, S)
        except FaTuneError as e:
            raise WorkloadError(f"{src}: {where}: {e}") from None
        if not any(b.contains(S) for b in buckets):
            longest = " (its longest sequence)" if lengths else ""
            raise WorkloadError(f"{src}: {where}: S={S}{longest} falls in no bucket (the last "
                                f"serves {buckets[-1].range_text()}); add a bucket or max_s: "
                                "null")
        merged[(B, S, lengths)] = merged.get((B, S, lengths), 0.0) + w
    total = sum(merged.values())
    if total <= 0:
        raise WorkloadError(f"{src}: traffic weights sum to 0; give some weight > 0")
    # Fixed shapes by (S, B), then packed batches by (S, B, lengths).
    order = sorted(merged.items(), key=lambda x: (bool(x[0][2]), x[0][1], x[0][0], x[0][2]))
    traffic = tuple(TrafficPoint(B, S, w / total, lengths) for (B, S, lengths), w in order)
    tuning = _mapping(d.get("tuning", {}), "tuning", src, {"max_problems"})
    keep = _pos_int(tuning.get("max_problems", DEFAULT_MAX_PROBLEMS), "tuning.max_problems", src)
    return Workload(name, att, buckets, traffic, desc, keep, src)


def workload_path(name_or_path: str | Path) -> Path:
    """A workload file by path, or by name from the shipped ``workloads/`` folder."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    text = str(name_or_path)
    if _NAME_RE.fullmatch(text):
        shipped = _paths.workloads_dir() / f"{text}.yaml"
        if shipped.is_file():
            return shipped
    known = sorted(q.stem for q in _paths.workloads_dir().glob("*.yaml"))
    raise WorkloadError(f"no workload file '{name_or_path}'; give a path or one of the shipped "
                        f"workloads: {', '.join(known) or 'none'}")


def load_workload(name_or_path: str | Path) -> Workload:
    path = workload_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise WorkloadError(f"cannot read workload {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise WorkloadError(f"{path}: not valid YAML{where}: "
                            f"{getattr(e, 'problem', None) or e}") from None
    return workload_from_dict(data, str(path))


def shipped_workloads() -> list[str]:
    return sorted(p.stem for p in _paths.workloads_dir().glob("*.yaml"))
