"""Workload files: a model's attention problem, the traffic it sees, and its length buckets.

A workload (``workloads/<name>.yaml``) is what one exported library is tuned for and serves::

    name: llama3-8b
    description: free text
    attention: {Hq: 32, Hkv: 8, head_dim: 128, causal: true}
    # the models' masks, each optional (tuner.problem): a sliding window of W keys, a logit
    # softcap, attention sinks; e.g. {Hq: 16, Hkv: 8, head_dim: 256, window: 4096, softcap: 50};
    # and page_size: K and V in a paged cache of that many rows per page (every call's)
    buckets:                     # by the query length S (a varlen batch's max_seqlen_q);
      - {name: s1k, max_s: 1024} # each bucket serves (previous max_s, max_s], any key length;
      - {name: s8k, max_s: 8192} # the last may say max_s: null (no upper bound)
      # a key-range bucket (chunked prefill, a prompt continuing a cached prefix): queries
      # min_s..max_s (min_s default 1) over keys k.min..k.max (max null: no upper bound)
      - {name: chunk2k, max_s: 2048, k: {min: 4096, max: 16384}}
    traffic:                     # relative call frequencies; any of these, all combined
      lengths: {512: 3, 2048: 2} # prefill length S -> weight ...
      batch: {1: 0.7, 4: 0.3}    # ... times batch size B -> weight (default {1: 1})
      shapes:                    # and fixed (B, S) shapes with their own weights; Sk: queries
        - {B: 1, S: 8192, weight: 1}               # over that many keys (default S)
        - {B: 1, S: 2048, Sk: 8192, weight: 1}     # (a chunk of a chunked prefill)
      packed:                    # and packed varlen batches (a prefill server's): the lengths
        - {lengths: "4096,2048*2,512*8", weight: 1}   # as in a problem's [...] (q:k pairs
        - {lengths: "2048:8192,512:4096*2"}           # too), or a list of query lengths
    tuning: {max_problems: 3}    # problems per bucket to tune on (default 3)
    layers:                      # optional: layers of kinds that differ in their window
      - {name: local, window: 4096, count: 21}   # (Gemma-2's local and global layers); each
      - {name: global, count: 21}                # kind gets every bucket, named kind-bucket

Buckets without ``k`` chain by query length, in file order, and serve every key length; a
bucket with ``k`` stands alone (its own query range, not part of the chain) and is dispatched
before the chain, so in their overlap it takes the calls: a chunk of 2048 queries over 8192
cached keys runs chunk2k's kernel, a fresh 2048-token prompt s2k's. Key-range buckets must not
overlap each other.

With ``layers``, every bucket is made once per kind (``local-s2k``, ``global-s2k``, ...), each
serving only calls with its kind's window (0: none) and tuned on its kind's problems, and one
library serves all of them: the window is a run-time argument of one problem class (it has a
window where some kind has one). The traffic is every layer's, weighted by the kind's ``count``.

``plan()`` turns it into the problems to tune per bucket: the traffic points in the bucket,
ranked by their share of attention time there (weight x FLOPs, the time at a constant TFLOPS
rate), the top ``max_problems``; a bucket without traffic is tuned on its upper edge (B=1, over
its largest key length). A packed batch lands in the bucket of its longest sequences (the
dispatcher picks by max_seqlen_q and max_seqlen_k) and is tuned on as a varlen problem, so that
bucket's search builds the varlen kernel too. A bad file is one ``WorkloadError`` line naming
the file and the entry.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from tuner import _paths
from tuner.errors import FaTuneError
from tuner.problem import Problem, ProblemClass, ShapeError, lengths_text, parse_pairs
from tuner.yaml_file import load_yaml

DEFAULT_MAX_PROBLEMS = 3
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# Bucket names become file names, study-name suffixes and C identifiers' comments.
_BUCKET_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_TOP_KEYS = {"name", "description", "attention", "buckets", "traffic", "tuning", "layers"}


def is_safe_name(text: object) -> TypeGuard[str]:
    """A workload's (and its library's) name: it names files and folders, so no '/' or '..'."""
    return isinstance(text, str) and bool(_NAME_RE.fullmatch(text)) and ".." not in text


def is_bucket_name(text: object) -> TypeGuard[str]:
    """A bucket's name: a folder, a file stem and a study-name suffix in an export."""
    return isinstance(text, str) and bool(_BUCKET_RE.fullmatch(text))


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
    window: int = 0       # sliding window in keys (0: none)
    softcap: float = 0.0  # logit softcap (0: none)
    sinks: bool = False   # attention sinks
    page_size: int = 0    # a paged KV cache's rows per page (0: K and V as tensors)

    @property
    def problem_class(self) -> ProblemClass:
        return ProblemClass(self.head_dim, self.causal, varlen=self.page_size > 0,
                            window=self.window > 0, softcap=self.softcap > 0, sinks=self.sinks,
                            paged=self.page_size > 0)

    def _masks(self) -> dict[str, Any]:
        return {"window": self.window, "softcap": self.softcap, "sinks": self.sinks,
                "page_size": self.page_size}

    def problem(self, B: int, S: int, Sk: int = 0) -> Problem:
        """B x Hq/Hkv x S, over Sk keys (0: S), with the model's masks."""
        return Problem(B, self.Hq, S, Hkv=self.Hkv, D=self.head_dim, causal=self.causal, Sk=Sk,
                       **self._masks())

    def packed(self, lengths: tuple[int, ...], lengths_k: tuple[int, ...] = ()) -> Problem:
        return Problem.varlen(lengths, self.Hq, Hkv=self.Hkv, D=self.head_dim, causal=self.causal,
                              seqlens_k=lengths_k or None, **self._masks())

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"Hq": self.Hq, "Hkv": self.Hkv, "head_dim": self.head_dim,
                             "causal": self.causal}
        d.update({k: v for k, v in self._masks().items() if v})  # only those the model has
        return d


def range_text(lo: int, hi: int | None) -> str:
    return f"{lo}..{hi}" if hi is not None else f">= {lo}"


@dataclass(frozen=True)
class Bucket:
    """Query lengths s_min <= S <= s_max (s_max None: no upper bound) over any key length, or
    (a key-range bucket, ``keyed``) over key lengths k_min <= Sk <= k_max only."""

    name: str
    s_min: int
    s_max: int | None
    k_min: int | None = None  # None: any key length (a bucket of the query-length chain)
    k_max: int | None = None
    window: int | None = None  # a layer kind's bucket: calls with this window only (0: none)

    @property
    def keyed(self) -> bool:
        return self.k_min is not None

    def contains(self, S: int, Sk: int | None = None, window: int | None = None) -> bool:
        """Whether it serves S queries over Sk keys (None: S) with this window (None: any)."""
        sk = S if Sk is None else Sk
        return (S >= self.s_min and (self.s_max is None or S <= self.s_max)
                and (self.k_min is None or sk >= self.k_min)
                and (self.k_max is None or sk <= self.k_max)
                and (self.window is None or window is None or window == self.window))

    def range_text(self) -> str:
        text = range_text(self.s_min, self.s_max)
        if self.k_min is not None:
            text += f", k {range_text(self.k_min, self.k_max)}"
        if self.window is not None:
            text += f", window {self.window}" if self.window else ", no window"
        return text

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "s_min": self.s_min, "s_max": self.s_max}
        if self.keyed:
            d.update(k_min=self.k_min, k_max=self.k_max)
        if self.window is not None:
            d["window"] = self.window
        return d


@dataclass(frozen=True)
class LayerKind:
    """Layers of one kind in a model whose layers differ in their sliding window: its name,
    window (keys; 0: none) and how many layers of it the model has (weights its traffic)."""

    name: str
    window: int = 0
    count: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "window": self.window, "count": self.count}


@dataclass(frozen=True)
class TrafficPoint:
    """One (B, S) the model is called with (over Sk keys; 0: S), or one packed batch of these
    sequence lengths (then B is their count, S the longest query length and Sk the longest key
    length); weight = its share of calls (all sum to 1)."""

    B: int
    S: int
    weight: float
    lengths: tuple[int, ...] = ()
    Sk: int = 0
    lengths_k: tuple[int, ...] = ()  # the packed batch's key lengths; empty: its query lengths

    @property
    def S_k(self) -> int:  # noqa: N802 - FlashAttention's name
        return self.Sk or self.S

    def problem(self, att: Attention) -> Problem:
        if self.lengths:
            return att.packed(self.lengths, self.lengths_k)
        return att.problem(self.B, self.S, self.Sk)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"B": self.B, "S": self.S, "weight": self.weight}
        if self.Sk and self.Sk != self.S:
            d["Sk"] = self.Sk
        if self.lengths:
            d["lengths"] = lengths_text(self.lengths, self.lengths_k)
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
    kinds: tuple[LayerKind, ...] = ()  # layers of kinds by window; buckets are then per kind

    @property
    def problem_class(self) -> ProblemClass:
        """The class the library serves: the attention's, with a window where some kind of
        layer has one (each bucket's kernel is built for its own, ``bucket_class``)."""
        pc = self.attention.problem_class
        return dataclasses.replace(pc, window=pc.window or any(k.window for k in self.kinds))

    def bucket_class(self, b: Bucket) -> ProblemClass:
        """The class a bucket's kernel is built and tuned for: its kind's. A full-attention
        kind's buckets carry no window (the window class cost such a layer 1.2 %,
        docs/PERF.md step 81); the dispatcher never hands them a windowed call."""
        return self.attention_of(b).problem_class

    def attention_of(self, b: Bucket) -> Attention:
        """The attention a bucket is tuned on: its kind's window, if it is a kind's."""
        if b.window is None:
            return self.attention
        return dataclasses.replace(self.attention, window=b.window)

    def dispatch_order(self) -> tuple[Bucket, ...]:
        """The buckets as the dispatcher tries them: key-range buckets first, then the chain."""
        return tuple(b for b in self.buckets if b.keyed) + tuple(
            b for b in self.buckets if not b.keyed)

    def bucket_for(self, S: int, Sk: int | None = None,
                   window: int | None = None) -> Bucket | None:
        """The bucket serving S queries over Sk keys (None: S; a varlen batch: max_seqlen_q and
        max_seqlen_k) with this window (None: any kind's), or None."""
        return next((b for b in self.dispatch_order() if b.contains(S, Sk, window)), None)

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
        # Every layer sees every call: a kind's share is its layer count's.
        kinds = self.kinds or (LayerKind("", self.attention.window),)
        layers = sum(k.count for k in kinds)
        share = {k.window: k.count / layers for k in kinds}
        plain = not self.kinds
        total_time = sum(
            share[k.window] * t.weight * t.problem(dataclasses.replace(
                self.attention, window=k.window)).flops
            for k in kinds for t in self.traffic)
        plans = []
        for b in self.buckets:
            window = b.window if not plain else self.attention.window
            assert window is not None  # with kinds, every bucket is a kind's (_per_kind)
            att, kind_share = self.attention_of(b), share[window]
            pts = [t for t in self.traffic if self.bucket_for(t.S, t.S_k, b.window) is b]
            calls = sum(t.weight for t in pts) * kind_share
            if not pts:  # no traffic here: tune on the bucket's upper edge, B=1
                S = b.s_max if b.s_max is not None else b.s_min
                Sk = 0 if b.k_min is None else max(b.k_max or b.k_min, S)
                p = att.problem(1, S, Sk)
                plans.append(BucketPlan(b, (PlannedProblem(p, 0.0, 0.0),), 0.0, 0.0))
                continue
            cost = [(t, t.problem(att)) for t in pts]
            time = sum(t.weight * p.flops for t, p in cost) * kind_share
            ranked = sorted(cost, key=lambda tp: (-tp[0].weight * tp[1].flops, tp[1].S,
                                                  tp[1].Sk, tp[1].B))
            problems = tuple(PlannedProblem(p, t.weight * kind_share / calls,
                                            t.weight * kind_share * p.flops / time)
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
            **({"layers": [k.to_dict() for k in self.kinds]} if self.kinds else {}),
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
    d = _mapping(d, "attention", src, {"Hq", "Hkv", "head_dim", "causal", "window", "softcap",
                                       "sinks", "page_size"})
    for k in ("Hq", "Hkv"):
        if k not in d:
            raise WorkloadError(f"{src}: attention needs {k}")
    hq = _pos_int(d["Hq"], "attention.Hq", src)
    hkv = _pos_int(d["Hkv"], "attention.Hkv", src)
    dim = _pos_int(d.get("head_dim", 128), "attention.head_dim", src)
    causal = d.get("causal", True)
    if not isinstance(causal, bool):
        raise WorkloadError(f"{src}: attention.causal must be true or false (got {causal!r})")
    window = d.get("window", 0)
    if window != 0:
        window = _pos_int(window, "attention.window", src)
    softcap = d.get("softcap", 0)
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or softcap < 0:
        raise WorkloadError(f"{src}: attention.softcap must be a number > 0, or 0 for none "
                            f"(got {softcap!r})")
    sinks = d.get("sinks", False)
    if not isinstance(sinks, bool):
        raise WorkloadError(f"{src}: attention.sinks must be true or false (got {sinks!r})")
    page_size = d.get("page_size", 0)
    if page_size != 0:
        page_size = _pos_int(page_size, "attention.page_size", src)
    att = Attention(hq, hkv, dim, causal, window, float(softcap), sinks, page_size)
    try:
        att.problem(1, 1)  # Problem's own checks: Hq a multiple of Hkv, a supported head dim
    except FaTuneError as e:
        raise WorkloadError(f"{src}: attention: {e}") from None
    return att


def _kinds(items: Any, att: Attention, src: str) -> tuple[LayerKind, ...]:
    """The ``layers`` list: kinds of layers by window (none: one kind, the attention's)."""
    if items is None:
        return ()
    if not isinstance(items, list) or len(items) < 2:
        raise WorkloadError(f"{src}: layers must list two or more kinds of layers "
                            "({name, window, count}); leave it out for one kind")
    if att.window:
        raise WorkloadError(f"{src}: with layers, give each kind its window "
                            "(layers[i].window), not attention.window")
    out: list[LayerKind] = []
    for i, item in enumerate(items):
        what = f"layers[{i}]"
        item = _mapping(item, what, src, {"name", "window", "count"})
        name = item.get("name")
        if not isinstance(name, str) or not _BUCKET_RE.fullmatch(name):
            raise WorkloadError(f"{src}: {what}.name must be letters, digits, '_' or '-' "
                                f"(got {name!r})")
        window = item.get("window", 0)
        window = 0 if window == 0 else _pos_int(window, f"{what}.window", src)
        if any(k.name == name for k in out):
            raise WorkloadError(f"{src}: layer kind '{name}' is named twice")
        if any(k.window == window for k in out):
            raise WorkloadError(f"{src}: layer kinds {out[-1].name} and {name} have the same "
                                "window; a library tells kinds apart by it")
        out.append(LayerKind(name, window, _pos_int(item.get("count", 1), f"{what}.count",
                                                    src)))
    return tuple(out)


def _per_kind(buckets: tuple[Bucket, ...], kinds: tuple[LayerKind, ...]) -> tuple[Bucket, ...]:
    """Each bucket once per kind of layer (kind-bucket, serving that kind's window only)."""
    if not kinds:
        return buckets
    return tuple(dataclasses.replace(b, name=f"{k.name}-{b.name}", window=k.window)
                 for k in kinds for b in buckets)


def _bucket_name(item: Mapping, what: str, src: str, seen: list[Bucket]) -> str:
    name = item.get("name")
    if not isinstance(name, str) or not _BUCKET_RE.fullmatch(name):
        raise WorkloadError(f"{src}: {what}.name must be letters, digits, '_' or '-' "
                            f"(got {name!r})")
    if any(b.name == name for b in seen):
        raise WorkloadError(f"{src}: bucket name '{name}' is used twice")
    if "max_s" not in item:
        raise WorkloadError(f"{src}: {what} ({name}) needs max_s (null: no upper bound)")
    return name


def _keyed_bucket(item: Mapping, name: str, what: str, src: str) -> Bucket:
    """A key-range bucket: {name, [min_s,] max_s, k: {[min,] [max]}}."""
    k = _mapping(item["k"], f"{what}.k", src, {"min", "max"})
    lo = _pos_int(item.get("min_s", 1), f"{what}.min_s", src)
    hi = item["max_s"]
    hi = None if hi is None else _pos_int(hi, f"{what}.max_s", src)
    k_lo = _pos_int(k.get("min", 1), f"{what}.k.min", src)
    k_hi = k.get("max")
    k_hi = None if k_hi is None else _pos_int(k_hi, f"{what}.k.max", src)
    if hi is not None and hi < lo:
        raise WorkloadError(f"{src}: {what} ({name}): max_s {hi} is below min_s {lo}")
    if k_hi is not None and k_hi < k_lo:
        raise WorkloadError(f"{src}: {what} ({name}): k.max {k_hi} is below k.min {k_lo}")
    return Bucket(name, lo, hi, k_lo, k_hi)


def _overlap(a_lo: int, a_hi: int | None, b_lo: int, b_hi: int | None) -> bool:
    return (b_hi is None or a_lo <= b_hi) and (a_hi is None or b_lo <= a_hi)


def _buckets(items: Any, src: str) -> tuple[Bucket, ...]:
    if not isinstance(items, list) or not items:
        raise WorkloadError(f"{src}: buckets must be a non-empty list of {{name, max_s}}")
    out: list[Bucket] = []
    lo = 1
    chain = [i for i, item in enumerate(items) if not (isinstance(item, Mapping) and "k" in item)]
    for i, item in enumerate(items):
        what = f"buckets[{i}]"
        item = _mapping(item, what, src, {"name", "max_s", "min_s", "k"})
        name = _bucket_name(item, what, src, out)
        if "k" in item:
            b = _keyed_bucket(item, name, what, src)
            for other in out:
                if other.keyed and _overlap(b.s_min, b.s_max, other.s_min, other.s_max) and \
                        _overlap(b.k_min or 1, b.k_max, other.k_min or 1, other.k_max):
                    raise WorkloadError(f"{src}: key-range buckets {other.name} "
                                        f"({other.range_text()}) and {name} ({b.range_text()}) "
                                        "overlap; the dispatcher would never pick the second")
            out.append(b)
            continue
        if "min_s" in item:
            raise WorkloadError(f"{src}: {what} ({name}): min_s goes with k (a key-range "
                                "bucket); the query-length chain starts where the previous "
                                "bucket ends")
        hi = item["max_s"]
        if hi is None:
            if i != chain[-1]:
                raise WorkloadError(f"{src}: only the last bucket may have max_s: null "
                                    f"({name} is not last)")
        else:
            hi = _pos_int(hi, f"{what}.max_s", src)
            if hi < lo:
                raise WorkloadError(f"{src}: buckets must grow: {name}'s max_s {hi} is not above "
                                    f"the previous bucket's {lo - 1}")
        out.append(Bucket(name, lo, hi))
        lo = (hi or 0) + 1
    if not chain:
        raise WorkloadError(f"{src}: buckets need at least one bucket without k (the "
                            "query-length chain serves every call no key-range bucket takes)")
    return tuple(out)


@dataclass(frozen=True)
class _Raw:
    """A traffic entry before normalising."""

    B: int
    S: int
    weight: float
    where: str
    lengths: tuple[int, ...] = ()
    lengths_k: tuple[int, ...] = ()  # empty: the query lengths
    Sk: int = 0                      # 0: S

    @property
    def key(self) -> tuple[bool, int, int, int, tuple[int, ...], tuple[int, ...]]:
        """Identity (entries with one key merge) and order: fixed shapes by (S, Sk, B), then
        packed batches by (S, Sk, B, lengths)."""
        return (bool(self.lengths), self.S, self.Sk, self.B, self.lengths, self.lengths_k)


def _packed_lengths(value: Any, what: str, src: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(query lengths, key lengths; empty when the same) of a packed batch."""
    lengths_k: tuple[int, ...] = ()
    if isinstance(value, str):
        try:
            lengths, ks = parse_pairs(value.strip("[] "), value)
        except ShapeError as e:
            raise WorkloadError(f"{src}: {what}: {e}") from None
        lengths_k = ks if ks != lengths else ()
    elif isinstance(value, list) and value:
        lengths = tuple(v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else
                        _pos_int(v, f"{what} entries", src) for v in value)
    else:
        raise WorkloadError(f"{src}: {what} must be sequence lengths: text as in a problem "
                            f"('4096,2048*2,512*8' or q:k pairs '2048:8192,512:4096*2') or a "
                            f"list of integers (got {value!r})")
    if not lengths or max(lengths) < 1:
        raise WorkloadError(f"{src}: {what} must hold at least one sequence of 1 token or more")
    return lengths, lengths_k


def _traffic(d: Any, src: str) -> list[_Raw]:
    d = _mapping(d, "traffic", src, {"lengths", "batch", "shapes", "packed"})
    pts: list[_Raw] = []
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
                pts.append(_Raw(B, S, w_s * _weight(wb, f"traffic.batch[{b}]", src),
                                f"traffic.lengths[{S}] x batch[{B}]"))
    elif "batch" in d:
        raise WorkloadError(f"{src}: traffic.batch needs traffic.lengths (batch sizes weight "
                            "the lengths)")
    shapes = d.get("shapes", [])
    if not isinstance(shapes, list):
        raise WorkloadError(f"{src}: traffic.shapes must be a list of {{B, S, weight}}")
    for i, item in enumerate(shapes):
        what = f"traffic.shapes[{i}]"
        item = _mapping(item, what, src, {"B", "S", "Sk", "weight"})
        if "S" not in item:
            raise WorkloadError(f"{src}: {what} needs S")
        S = _pos_int(item["S"], f"{what}.S", src)
        Sk = _pos_int(item.get("Sk", S), f"{what}.Sk", src)
        pts.append(_Raw(_pos_int(item.get("B", 1), f"{what}.B", src), S,
                        _weight(item.get("weight", 1), f"{what}.weight", src), what,
                        Sk=0 if Sk == S else Sk))
    packed = d.get("packed", [])
    if not isinstance(packed, list):
        raise WorkloadError(f"{src}: traffic.packed must be a list of {{lengths, weight}}")
    for i, item in enumerate(packed):
        what = f"traffic.packed[{i}]"
        item = _mapping(item, what, src, {"lengths", "weight"})
        if "lengths" not in item:
            raise WorkloadError(f"{src}: {what} needs lengths (e.g. '4096,2048*2,512*8')")
        seqs, seqs_k = _packed_lengths(item["lengths"], f"{what}.lengths", src)
        sk = max(seqs_k) if seqs_k else 0
        pts.append(_Raw(len(seqs), max(seqs),
                        _weight(item.get("weight", 1), f"{what}.weight", src), what, seqs,
                        seqs_k, Sk=0 if sk in (0, max(seqs)) else sk))
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
    if not is_safe_name(name):
        raise WorkloadError(f"{src}: name must be letters, digits, '_', '-' or '.' (not '..') "
                            f"(got {name!r})")
    desc = d.get("description", "")
    if not isinstance(desc, str):
        raise WorkloadError(f"{src}: description must be text")
    att = _attention(d["attention"], src)
    kinds = _kinds(d.get("layers"), att, src)
    buckets = _per_kind(_buckets(d["buckets"], src), kinds)
    probe = Workload(name, att, buckets, (), desc, DEFAULT_MAX_PROBLEMS, src, kinds)
    merged: dict[tuple[Any, ...], tuple[_Raw, float]] = {}
    for r in _traffic(d["traffic"], src):
        try:
            r_problem = (att.packed(r.lengths, r.lengths_k) if r.lengths
                         else att.problem(r.B, r.S, r.Sk))
        except FaTuneError as e:
            raise WorkloadError(f"{src}: {r.where}: {e}") from None
        if probe.bucket_for(r.S, r_problem.Sk) is None:
            longest = " (its longest sequence)" if r.lengths else ""
            keys = f" over Sk={r_problem.Sk}" if r_problem.Sk != r.S else ""
            chain = [b for b in buckets if not b.keyed]
            raise WorkloadError(f"{src}: {r.where}: S={r.S}{keys}{longest} falls in no bucket "
                                f"(the last serves {chain[-1].range_text()}); add a bucket or "
                                "max_s: null")
        prev = merged.get(r.key)
        merged[r.key] = (r, (prev[1] if prev else 0.0) + r.weight)
    total = sum(w for _, w in merged.values())
    if total <= 0:
        raise WorkloadError(f"{src}: traffic weights sum to 0; give some weight > 0")
    traffic = tuple(TrafficPoint(r.B, r.S, w / total, r.lengths, r.Sk, r.lengths_k)
                    for _, (r, w) in sorted(merged.items(), key=lambda x: x[0]))
    tuning = _mapping(d.get("tuning", {}), "tuning", src, {"max_problems"})
    keep = _pos_int(tuning.get("max_problems", DEFAULT_MAX_PROBLEMS), "tuning.max_problems", src)
    return Workload(name, att, buckets, traffic, desc, keep, src, kinds)


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
    data = load_yaml(path, "workload", WorkloadError)
    return workload_from_dict(data, str(path))


def shipped_workloads() -> list[str]:
    return sorted(p.stem for p in _paths.workloads_dir().glob("*.yaml"))
