"""The attention problem: what is computed, apart from how (the kernel config).

A ``Problem`` is batch B, query heads Hq, K/V heads Hkv (Hq a multiple of Hkv: Hkv = Hq is MHA,
Hkv = 1 is MQA, between is GQA), sequence length S (query = key length), head dim D and whether
the mask is causal. It flows wherever a shape flows: the CLI, the search objective, results,
study attributes, the gate, timing, export.

Text form (the CLI's ``--shape``)::

    B x Hq[/Hkv] x S [:dD] [:full | :causal]
    Hq[/Hkv] x [len, len*count, ...] [:dD] [:full | :causal]     (varlen: a packed batch)

``4x32x8192`` is today's seed problem (MHA, D 128, causal); ``1x32/8x8192`` is Llama-3-8B's GQA;
``4x32x8192:d64``; ``4x32x8192:full`` is non-causal; ``1x64/8x8192:d256:full``. ``str()`` gives
the canonical form: the parts that differ from MHA / D 128 / causal only, so every problem the
tool knew before keeps its name (and the study attributes and result files that use it).

A varlen problem (``seqlens``) is a packed batch: its sequences' tokens one after another in
[total, Hq, D] tensors (FA3's ``flash_attn_varlen_func`` layout, cu_seqlens the prefix sums of
the lengths), each sequence its own attention problem (query length = key length). B is the
number of sequences and S the longest (max_seqlen); ``32/8x[8192,4096*2,2048*4,1024*8]`` is the
anchors' varlen batch. Its memory is a fixed problem of B=1, S=total (``layout``): buffers, input
generation, poisoning and comparison treat it so; the reference and the kernel follow the
sequence boundaries.

FLOPs follow the anchors' convention: causal 2*B*Hq*S^2*D, non-causal 4*B*Hq*S^2*D; varlen the
sum over its sequences.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from tuner.errors import ShapeError

HEAD_DIMS: tuple[int, ...] = (64, 128, 256)
DEFAULT_HEAD_DIM = 128
# Offsets into Q/K/V/O are 32-bit in the kernel and the oracle: B*S*Hq*D must stay below 2^31.
_MAX_ELEMS = 2**31 - 1

_RE = re.compile(
    r"\s*(\d+)\s*x\s*(\d+)\s*(?:/\s*(\d+)\s*)?x\s*(\d+)\s*((?::\s*[A-Za-z0-9]+\s*)*)",
    re.IGNORECASE,  # the BxHxS parser before problems took '4X32X8192', so this one does too
)
_RE_VARLEN = re.compile(
    r"\s*(\d+)\s*(?:/\s*(\d+)\s*)?x\s*\[([^\]]*)\]\s*((?::\s*[A-Za-z0-9]+\s*)*)",
    re.IGNORECASE,
)
MAX_SEQS = 65535  # sequences in one varlen batch (the device-side schedule's bound)


def parse_lengths(text: str, where: str) -> tuple[int, ...]:
    """'8192,4096*2,1024' -> (8192, 4096, 4096, 1024)."""
    out: list[int] = []
    for part in (x.strip() for x in text.split(",")):
        m = re.fullmatch(r"(\d+)\s*(?:\*\s*(\d+))?", part)
        if not m:
            raise ShapeError(f"malformed problem '{where}': '{part}' is not a length or "
                             "length*count (e.g. [8192,4096*2,1024])")
        count = int(m.group(2) or 1)
        if count < 1 or count > MAX_SEQS:
            raise ShapeError(f"malformed problem '{where}': count {count} in '{part}' must be "
                             f"1..{MAX_SEQS}")
        out.extend([int(m.group(1))] * count)
    return tuple(out)


def lengths_text(seqlens: tuple[int, ...]) -> str:
    """Run-length form: (8192, 4096, 4096) -> '8192,4096*2'."""
    parts: list[str] = []
    i = 0
    while i < len(seqlens):
        j = i
        while j < len(seqlens) and seqlens[j] == seqlens[i]:
            j += 1
        parts.append(str(seqlens[i]) if j - i == 1 else f"{seqlens[i]}*{j - i}")
        i = j
    return ",".join(parts)


def _parse_options(opts: str, text: str) -> tuple[int, bool]:
    d, causal = DEFAULT_HEAD_DIM, True
    for opt in (o.strip().lower() for o in opts.split(":") if o.strip()):
        if opt in ("full", "noncausal", "non-causal"):
            causal = False
        elif opt == "causal":
            causal = True
        elif re.fullmatch(r"d\d+", opt):
            d = int(opt[1:])
        else:
            raise ShapeError(
                f"malformed problem '{text}': unknown option ':{opt}' (use :dD for the head "
                "dim, e.g. :d64, and :full for a non-causal mask)"
            )
    return d, causal


@dataclass(frozen=True)
class Problem:
    """One attention problem. Positional (B, Hq, S) is today's MHA, D 128, causal problem."""

    B: int
    Hq: int
    S: int
    Hkv: int = field(default=0)  # 0: same as Hq (MHA); normalised in __post_init__
    D: int = DEFAULT_HEAD_DIM
    causal: bool = True
    # Varlen: the packed batch's sequence lengths (then B = len(seqlens), S = max(seqlens));
    # empty for a fixed-length batch. Use Problem.varlen() to make one.
    seqlens: tuple[int, ...] = ()

    @classmethod
    def varlen(cls, seqlens: Iterable[int], Hq: int, Hkv: int = 0, D: int = DEFAULT_HEAD_DIM,
               causal: bool = True) -> Problem:
        """A packed batch of these sequence lengths (0 allowed; at least one token in all)."""
        lens = tuple(seqlens)
        for x in lens:
            if not isinstance(x, int) or isinstance(x, bool) or x < 0:
                raise ShapeError(f"varlen sequence lengths must be integers >= 0 (got {x!r})")
        if not lens or sum(lens) < 1:
            raise ShapeError("a varlen batch needs at least one sequence and one token")
        if len(lens) > MAX_SEQS:
            raise ShapeError(f"a varlen batch holds at most {MAX_SEQS} sequences "
                             f"(got {len(lens)}); split it")
        return cls(len(lens), Hq, max(max(lens), 1), Hkv=Hkv, D=D, causal=causal, seqlens=lens)

    def __post_init__(self) -> None:
        for name in ("B", "Hq", "S", "D"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ShapeError(f"problem {name} must be a positive integer (got {v!r})")
        if not isinstance(self.Hkv, int) or isinstance(self.Hkv, bool) or self.Hkv < 0:
            raise ShapeError(f"problem Hkv must be a positive integer (got {self.Hkv!r})")
        if self.Hkv == 0:
            object.__setattr__(self, "Hkv", self.Hq)
        if self.Hq % self.Hkv:
            raise ShapeError(
                f"problem {self}: Hq={self.Hq} must be a multiple of Hkv={self.Hkv} "
                "(each K/V head serves the same number of query heads)"
            )
        if self.D not in HEAD_DIMS:
            raise ShapeError(
                f"problem head dim D={self.D} is not supported: choose from "
                f"{', '.join(map(str, HEAD_DIMS))}"
            )
        if not isinstance(self.causal, bool):
            raise ShapeError(f"problem causal must be true or false (got {self.causal!r})")
        if not isinstance(self.seqlens, tuple):
            object.__setattr__(self, "seqlens", tuple(self.seqlens))
        if self.seqlens and (self.B != len(self.seqlens)
                             or self.S != max(max(self.seqlens), 1)):
            raise ShapeError("a varlen problem's B and S are its number of sequences and its "
                             "longest length: make it with Problem.varlen()")
        if self.tokens * self.Hq * self.D > _MAX_ELEMS:
            what = "total tokens*Hq*D" if self.seqlens else "B*S*Hq*D"
            raise ShapeError(f"problem {self} is too large: {what} must stay below 2^31 elements")

    # -- names
    @property
    def H(self) -> int:  # noqa: N802 - the seeds' name for the (query) head count
        """Query heads (= Hq): the name code written for MHA uses."""
        return self.Hq

    @property
    def group(self) -> int:
        """Query heads per K/V head (1 for MHA)."""
        return self.Hq // self.Hkv

    @property
    def is_varlen(self) -> bool:
        return bool(self.seqlens)

    @property
    def tokens(self) -> int:
        """Query (= key) rows in the tensors: B*S, or the packed batch's total."""
        return sum(self.seqlens) if self.seqlens else self.B * self.S

    def cu_seqlens(self) -> list[int]:
        """Varlen: the prefix sums of the lengths (num_seqs + 1 entries, first 0)."""
        out = [0]
        for x in self.seqlens:
            out.append(out[-1] + x)
        return out

    @property
    def layout(self) -> Problem:
        """The fixed-length problem with this one's memory: itself, or for a packed batch one
        batch of all its tokens (B=1, S=total): what buffers, input generation, poisoning and
        the comparison see."""
        if not self.seqlens:
            return self
        return Problem(1, self.Hq, self.tokens, Hkv=self.Hkv, D=self.D, causal=self.causal)

    @property
    def problem_class(self) -> ProblemClass:
        """The compile-time part (head dim, mask; varlen needs the packed-sequence kernel too):
        which kernel library can run it."""
        return ProblemClass(self.D, self.causal, self.is_varlen)

    @property
    def kind(self) -> str:
        if self.Hkv == self.Hq:
            return "MHA"
        return "MQA" if self.Hkv == 1 else "GQA"

    @classmethod
    def parse(cls, text: str) -> Problem:
        m = _RE.fullmatch(str(text))
        v = None if m else _RE_VARLEN.fullmatch(str(text))
        if not m and not v:
            raise ShapeError(
                f"malformed problem '{text}': write BxHq[/Hkv]xS[:dD][:full], e.g. 4x32x8192, "
                "1x32/8x8192, 4x16x8192:d256, 4x32x8192:full; or a packed varlen batch "
                "Hq[/Hkv]x[len,len*count,...], e.g. 32/8x[8192,4096*2,1024*8]"
            )
        if v:
            hq, hkv, lens, opts = v.groups()
        else:
            b, hq, hkv, s, opts = m.groups()  # type: ignore[union-attr]
        if hkv is not None and int(hkv) < 1:  # '/0' is not MHA (Hkv=0 only means it in code)
            raise ShapeError(f"problem '{text}': Hkv must be a positive integer (got {hkv})")
        d, causal = _parse_options(opts, str(text))
        if v:
            return cls.varlen(parse_lengths(lens, str(text)), int(hq),
                              Hkv=int(hkv) if hkv else 0, D=d, causal=causal)
        return cls(int(b), int(hq), int(s), Hkv=int(hkv) if hkv else 0, D=d, causal=causal)

    def __str__(self) -> str:
        heads = f"{self.Hq}" if self.Hkv == self.Hq else f"{self.Hq}/{self.Hkv}"
        text = (f"{heads}x[{lengths_text(self.seqlens)}]" if self.seqlens
                else f"{self.B}x{heads}x{self.S}")
        if self.D != DEFAULT_HEAD_DIM:
            text += f":d{self.D}"
        if not self.causal:
            text += ":full"
        return text

    # -- cost
    @property
    def flops(self) -> int:
        """Causal 2*B*Hq*S^2*D (not halved, as the anchors count it); non-causal twice that.
        Varlen: the sum over its sequences (s^2 for B*S^2)."""
        sq = sum(x * x for x in self.seqlens) if self.seqlens else self.B * self.S * self.S
        f = 2 * self.Hq * sq * self.D
        return f if self.causal else 2 * f

    def tflops(self, ms: float) -> float:
        return self.flops / (ms * 1e9)

    def to_dict(self) -> dict[str, int | bool | list[int]]:
        out: dict[str, int | bool | list[int]] = {
            "B": self.B, "H": self.Hq, "Hq": self.Hq, "Hkv": self.Hkv, "S": self.S, "D": self.D,
            "causal": self.causal}
        if self.seqlens:  # only then: a fixed problem's dict stays what it always was
            out["seqlens"] = list(self.seqlens)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Problem:
        hq = d.get("Hq", d.get("H"))
        kw = {"Hkv": int(d.get("Hkv") or 0), "D": int(d.get("D", DEFAULT_HEAD_DIM)),
              "causal": bool(d.get("causal", True))}
        if d.get("seqlens"):
            return cls.varlen([int(x) for x in d["seqlens"]], int(hq), **kw)
        return cls(int(d["B"]), int(hq), int(d["S"]), **kw)


@dataclass(frozen=True)
class ProblemClass:
    """What a kernel library is compiled for: head dim and mask (Hq, Hkv, B and S are run-time
    arguments). Part of a built kernel's identity (its cache key) beside the config."""

    head_dim: int = DEFAULT_HEAD_DIM
    causal: bool = True
    # The library also holds the packed-sequence (varlen) kernel: a second instantiation of the
    # same pieces, so twice the compile; only exports and varlen problems ask for it.
    varlen: bool = False

    def __str__(self) -> str:
        return (f"D {self.head_dim}, {'causal' if self.causal else 'non-causal'}"
                + (", with varlen" if self.varlen else ""))

    def to_dict(self) -> dict:
        out: dict = {"head_dim": self.head_dim, "causal": self.causal}
        if self.varlen:  # only then: stored classes of fixed-length studies stay as they were
            out["varlen"] = True
        return out

    @classmethod
    def from_dict(cls, d: dict) -> ProblemClass:
        return cls(int(d.get("head_dim", DEFAULT_HEAD_DIM)), bool(d.get("causal", True)),
                   bool(d.get("varlen", False)))



DEFAULT_CLASS = ProblemClass()


def class_of(problems: Iterable[object]) -> ProblemClass:
    """The one problem class (D and mask) a set of problems shares: one kernel library serves
    them. Raises ShapeError when they mix head dims or masks; the default class for none."""
    ps = [as_problem(p) for p in problems]
    if len({p.D for p in ps}) > 1:
        raise ShapeError(
            "these problems mix head dims; a kernel is built for one head dim: run them in "
            "separate invocations"
        )
    if len({p.causal for p in ps}) > 1:
        raise ShapeError(
            "these problems mix causal and non-causal (:full) masks; a kernel is built for one "
            "mask: run them in two invocations"
        )
    if not ps:
        return DEFAULT_CLASS
    # A varlen library runs fixed-length problems too: one library for a mix.
    return ProblemClass(ps[0].D, ps[0].causal, any(p.is_varlen for p in ps))


SEED_PROBLEMS: tuple[Problem, ...] = (Problem(4, 32, 4096), Problem(4, 32, 8192),
                                      Problem(4, 32, 16384))


# ---- helpers (callers: cli, compare, the GPU worker, results) ----------------------------------
def as_problem(obj: object) -> Problem:
    """A Problem from a Problem, its text form, its dict (``to_dict()``; an old results file's
    {B, H, S, D} too) or an old worker request's [B, H, S] list."""
    if isinstance(obj, Problem):
        return obj
    if isinstance(obj, str):
        return Problem.parse(obj)
    if isinstance(obj, dict):
        try:
            return Problem.from_dict(obj)
        except (KeyError, TypeError, ValueError):
            raise ShapeError(f"malformed problem {obj!r}: needs B, Hq (or H) and S") from None
    if isinstance(obj, (list, tuple)) and len(obj) == 3:
        return Problem(*(int(v) for v in obj))
    raise ShapeError(f"malformed problem {obj!r}: give a Problem, 'BxHq[/Hkv]xS[:dD][:full]' "
                     "or a dict")


def parse_problems(texts: Iterable[object] | None) -> list[Problem]:
    """The CLI's ``--shape`` values -> problems (the seed problems when none are given)."""
    if not texts:
        return list(SEED_PROBLEMS)
    return [as_problem(t) for t in texts]


def describe(problems: Iterable[object]) -> str:
    """What a list of problems has in common, for titles: 'causal, D=128, MHA' (a part that
    differs among them is named as varying: 'D varies')."""
    ps = [as_problem(p) for p in problems]
    if not ps:
        return ""
    masks = {p.causal for p in ps}
    dims = {p.D for p in ps}
    kinds = {p.kind for p in ps}
    parts = [("causal" if masks == {True} else "non-causal") if len(masks) == 1
             else "causal and non-causal"]
    parts.append(f"D={ps[0].D}" if len(dims) == 1 else f"D={'/'.join(map(str, sorted(dims)))}")
    heads = {(p.Hq, p.Hkv) for p in ps}
    if len(heads) == 1 and ps[0].kind != "MHA":
        parts.append(f"{ps[0].kind} (Hq={ps[0].Hq}, Hkv={ps[0].Hkv})")
    else:
        parts.append(ps[0].kind if len(kinds) == 1 else "/".join(sorted(kinds)))
    return ", ".join(parts)
