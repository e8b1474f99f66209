"""The attention problem: what is computed, apart from how (the kernel config).

A ``Problem`` is batch B, query heads Hq, K/V heads Hkv (Hq a multiple of Hkv: Hkv = Hq is MHA,
Hkv = 1 is MQA, between is GQA), query length S (= S_q), key length Sk (= S_k; S_q by default),
head dim D and whether the mask is causal. It flows wherever a shape flows: the CLI, the search
objective, results, study attributes, the gate, timing, export.

Queries over a longer KV (S_q < S_k: a prompt continuing a cached prefix, chunked prefill) use
FlashAttention's causal alignment, bottom-right: query i of a sequence with s_q queries and s_k
keys sees keys 0 .. i + s_k - s_q. A causal problem with more queries than keys would leave rows
that see no key, so it is refused; non-causal takes any S_q, S_k >= 1.

Text form (the CLI's ``--shape``)::

    B x Hq[/Hkv] x S [:kSK] [:dD] [:full | :causal] [:wW] [:capC] [:sinks] [:pP] [:qkv | :bhsd]
    Hq[/Hkv] x [q[:k], q[:k]*count, ...] [:dD] [:full | :causal] [:wW] [:capC] [:sinks] [:pP]
                                                                    (varlen: a packed batch)

``4x32x8192`` is today's seed problem (MHA, D 128, causal); ``1x32/8x8192`` is Llama-3-8B's GQA;
``1x32/8x2048:k8192`` is 2048 queries over 8192 keys; ``4x32x8192:d64``; ``4x32x8192:full`` is
non-causal; ``1x64/8x8192:d256:full``; ``1x32/8x8192:qkv`` has q, k, v as views of one fused QKV
projection. ``str()`` gives the canonical form: the parts that differ from MHA / S_k = S_q / D 128
/ causal / dense BSHD only, in that order (``:k``, ``:d``, ``:full``, then the layout), so every
problem the tool knew before keeps its name (and the study attributes and result files that use
it). Each option may be given once; numbers are ASCII digits within what the kernel's C ABI holds
(int32; a window of at most 2^30 keys), and the cap a plain decimal (``:cap50``, ``:cap0.5``).

The models' masks (issue 36), each optional: ``:wW`` a sliding window of W keys (query i sees
its diagonal key and the W-1 before it: transformers' ``sliding_window``, FlashAttention's
``window_size=(W-1, 0)`` causal, ``(W-1, -1)`` not); ``:capC`` logit softcapping (scores s, the
softmax scale included, become C tanh(s / C) before the softmax: Gemma-2's 50); ``:sinks``
attention sinks (an FP32 logit per query head joins each row's softmax denominator, exp(sink),
with no value row: gpt-oss; the LSE includes it). ``1x32/8x16384:w4096`` is Mistral's window,
``1x16/8x8192:d256:w4096:cap50`` a Gemma-2 local layer, ``1x64/8x8192:d64:w128:sinks`` a gpt-oss
windowed layer. They print after the mask, in that order. The window's width, the cap and the
sinks' values are run-time; that a kernel has them at all is its ``ProblemClass``.

``:pP`` puts K and V in a paged cache of P-row pages read through a block table (issue 37,
tuner.paging): ``4x32/8x2048:k8192:p64`` is four sequences of 2048 new queries over 8192 cached
keys each, in pages of 64 rows; ``32/8x[2048:8192,512:4096]:p16`` a packed batch over pages.
Queries stay dense (fixed) or packed (varlen).

The layout (``Problem.layout``) is where q, k and v live in memory, as inference hands them over
(issue 34); the kernel and the peers read them there through strides, O stays dense BSHD:

* ``bshd`` (default): q [B, S_q, Hq, D], k and v [B, S_k, Hkv, D], each dense;
* ``qkv``: views of one fused projection output [B, S, Hq + 2 Hkv, D] (q its heads [0, Hq), k
  [Hq, Hq + Hkv), v the rest), so S_q = S_k;
* ``bhsd``: q dense BSHD, k and v views of [B, Hkv, S_k, D] memory (transformers' KV cache).

``Problem.view(name)`` gives each tensor's buffer, element offset and strides. It is a run-time
property (strides are call arguments), so it is no part of the ``ProblemClass``.

A varlen problem (``seqlens``, and ``seqlens_k`` when the key lengths differ) is a packed batch:
its sequences' query tokens one after another in a [total_q, Hq, D] tensor and their keys in
[total_k, Hkv, D] tensors (FA3's ``flash_attn_varlen_func`` layout, cu_seqlens_q / cu_seqlens_k
the prefix sums of the lengths), each sequence its own attention problem. B is the number of
sequences, S the longest query length and Sk the longest key length (max_seqlen_q / _k);
``32/8x[8192,4096*2,2048*4,1024*8]`` is the anchors' varlen batch (q = k), and
``32/8x[2048:8192,512:4096*2]`` three sequences whose queries continue a cached prefix. Its
memory is a fixed problem of B=1, S_q=total_q, S_k=total_k (``as_fixed``): buffers, input
generation, poisoning and comparison treat it so; the reference and the kernel follow the
sequence boundaries.

FLOPs = 4*Hq*D*(the (query, key) pairs the mask keeps) per batch entry or sequence, causal pairs
counted continuously as s_q*s_k - s_q^2/2 (the anchors' convention: S_q = S_k gives causal
2*B*Hq*S^2*D and non-causal 4*B*Hq*S^2*D, so every stored TFLOPS stays the same); with a
sliding window, the kept pairs counted exactly (as issue 36's FA3 figures are).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TypedDict

from tuner.errors import ShapeError
from tuner.paging import PageLayout, page_layout, page_size_problem
from tuner.problem_class import DEFAULT_CLASS, ProblemClass
from tuner.problem_text import (  # noqa: F401 - the grammar's names, as importers know them
    DEFAULT_HEAD_DIM,
    DEFAULT_LAYOUT,
    HEAD_DIMS,
    INT32_MAX,
    INT32_WHY,
    LAYOUTS,
    MAX_SEQS,
    MAX_SOFTCAP,
    MAX_WINDOW,
    MIN_SOFTCAP,
    NO_WINDOW,
    SHAPE_RE,
    SOFTCAP_RANGE,
    SYNTAX,
    VARLEN_RE,
    check_chars,
    decimal_text,
    lengths_text,
    num_text,
    parse_count,
    parse_lengths,
    parse_options,
    parse_pairs,
)

# The kernel's rule (the oracle and the torch op's checks keep it too): Q, K, V and O each below
# 2^31 elements. The kernel itself indexes them with 64-bit offsets (size_t, int64 strides, TMA);
# its row counts (total_q, seqlen, cu_seqlens) are int32, which this rule keeps in range too.
_MAX_ELEMS = 2**31 - 1


def _sum_over(lo: int, hi: int, c: int) -> int:
    """Sum of max(0, a - c) for a in [lo, hi] (0 for an empty range)."""
    lo = max(lo, c + 1)
    if hi < lo:
        return 0
    n = hi - lo + 1
    return n * (lo - c + hi - c) // 2


def _pairs2(sq: int, sk: int, causal: bool, window: int = NO_WINDOW) -> int:
    """Twice the (query, key) pairs the mask keeps, causal counted continuously (s_q s_k -
    s_q^2 / 2, so the diagonal tile's half is not counted, as the anchors count it). With a
    sliding window of W keys every pair is counted exactly: query i sees keys max(0, a - W + 1)
    .. a causal, max(0, a - W + 1) .. s_k - 1 otherwise, a = i + s_k - s_q its diagonal key."""
    if window <= 0:
        return 2 * sq * sk - sq * sq if causal else 2 * sq * sk
    lo, hi = sk - sq, sk - 1  # the diagonal keys of the first and last query row
    left_cut = _sum_over(lo, hi, window - 1)  # keys left of each row's window
    if causal:  # rows with a >= 0 only (causal problems have s_k >= s_q): a + 1 keys
        return 2 * ((lo + hi + 2) * sq // 2 - left_cut)
    return 2 * (sq * sk - left_cut)


@lru_cache(maxsize=64)  # every view and buffer of a paged problem asks for its layout
def _page_layout(lens: tuple[int, ...], starts: tuple[int, ...], page_size: int,
                 name: str) -> PageLayout:
    return page_layout(lens, starts, page_size, name)


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class TensorView:
    """Where one of a problem's tensors lives in memory. ``buffer`` names the buffer that holds
    it (an ``AttnBuffers`` attribute): "q", "k", "v", "o" for the dense tensors, "qkv" for the
    fused projection, "k_cache" / "v_cache" for [B, Hkv, S_k, D] memory; ``offset`` is in
    elements into that buffer; ``dims`` the logical [B, S, H, D]; ``strides`` the element
    strides of (batch, sequence, head), the head dim being contiguous: the C ABI's q_stride /
    k_stride / v_stride, and torch.as_strided's strides without the trailing 1."""

    buffer: str
    offset: int
    dims: tuple[int, int, int, int]
    strides: tuple[int, int, int]


def dense_strides(rows: int, heads: int, D: int) -> tuple[int, int, int]:
    """Dense BSHD strides in elements: (batch, sequence, head)."""
    return rows * heads * D, heads * D, D


@dataclass(frozen=True)
class Problem:
    """One attention problem. Positional (B, Hq, S) is today's MHA, D 128, causal problem."""

    B: int
    Hq: int
    S: int  # query length (varlen: the longest query length)
    Hkv: int = field(default=0)  # 0: same as Hq (MHA); normalised in __post_init__
    D: int = DEFAULT_HEAD_DIM
    causal: bool = True
    # Varlen: the packed batch's query lengths (then B = len(seqlens), S = max(seqlens)); empty
    # for a fixed-length batch. Use Problem.varlen() to make one.
    seqlens: tuple[int, ...] = ()
    Sk: int = 0  # key length (varlen: the longest); 0: same as S; normalised in __post_init__
    seqlens_k: tuple[int, ...] = ()  # varlen key lengths; empty: the query lengths
    layout: str = DEFAULT_LAYOUT  # where q, k, v live in memory: a key of LAYOUTS
    # The models' masks (issue 36), run-time values of a kernel compiled for them (ProblemClass):
    window: int = NO_WINDOW  # sliding window: a query sees at most this many keys, its own
    #                          (diagonal) one and those before it: transformers' sliding_window,
    #                          FA's window_size[0] + 1; NO_WINDOW: every key
    softcap: float = 0.0     # logit softcap: scores become cap * tanh(s / cap); 0: none
    sinks: bool = False      # a learnable logit per query head joins each row's softmax
    # A paged KV cache (issue 37, tuner.paging): K and V in pages of this many rows, read
    # through a block table; 0: K and V are tensors of their own (the layout's).
    page_size: int = 0

    @classmethod
    def varlen(cls, seqlens: Iterable[int], Hq: int, Hkv: int = 0, D: int = DEFAULT_HEAD_DIM,
               causal: bool = True, seqlens_k: Iterable[int] | None = None,
               window: int = NO_WINDOW, softcap: float = 0.0, sinks: bool = False,
               page_size: int = 0) -> Problem:
        """A packed batch of these query lengths (0 allowed; at least one query in all) over
        these key lengths (None: the same)."""
        lens = tuple(seqlens)
        lens_k = lens if seqlens_k is None else tuple(seqlens_k)
        for x in lens + lens_k:
            if not _is_count(x) or not 0 <= x <= INT32_MAX:
                raise ShapeError(f"varlen sequence lengths must be integers from 0 to {INT32_MAX} "
                                 f"({INT32_WHY}); got {num_text(x)}")
        if not lens or sum(lens) < 1:
            raise ShapeError("a varlen batch needs at least one sequence and one token of queries")
        if len(lens) > MAX_SEQS:
            raise ShapeError(f"a varlen batch holds at most {MAX_SEQS} sequences "
                             f"(got {len(lens)}); split it")
        if len(lens_k) != len(lens):
            raise ShapeError(f"a varlen batch needs one key length per sequence: got "
                             f"{len(lens_k)} key lengths for {len(lens)} sequences")
        return cls(len(lens), Hq, max(max(lens), 1), Hkv=Hkv, D=D, causal=causal, seqlens=lens,
                   Sk=max(max(lens_k), 1), seqlens_k=lens_k, window=window, softcap=softcap,
                   sinks=sinks, page_size=page_size)

    def __post_init__(self) -> None:
        for name in ("B", "Hq", "S", "D", "Hkv", "Sk"):
            v = getattr(self, name)
            if not _is_count(v) or v < (0 if name in ("Hkv", "Sk") else 1):  # 0: normalised
                raise ShapeError(f"problem {name} must be a positive integer (got {num_text(v)})")
            if v > INT32_MAX:  # ctypes would wrap it silently
                raise ShapeError(f"problem {name}={num_text(v)} is out of range: at most "
                                 f"{INT32_MAX} ({INT32_WHY})")
        if self.Hkv == 0:
            object.__setattr__(self, "Hkv", self.Hq)
        for name in ("seqlens", "seqlens_k"):
            if not isinstance(getattr(self, name), tuple):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        self._normalise_lengths()
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
        self._check_masks()
        self._check_keys()
        self._check_layout()
        if self.tokens_q * self.Hq * self.D > _MAX_ELEMS:
            what = "total query tokens*Hq*D" if self.seqlens else "B*S*Hq*D"
            raise ShapeError(f"problem {self} is too large: {what} must stay below 2^31 elements")
        if self.tokens_k * self.Hkv * self.D > _MAX_ELEMS:
            what = "total key tokens*Hkv*D" if self.seqlens else "B*S_k*Hkv*D"
            raise ShapeError(f"problem {self} is too large: {what} must stay below 2^31 elements")

    def _normalise_lengths(self) -> None:
        """Sk = S for a fixed problem without one; a varlen problem's key lengths default to its
        query lengths, and its B, S and Sk must be what Problem.varlen() makes of them."""
        if not self.seqlens:
            if self.seqlens_k:
                raise ShapeError("key lengths (seqlens_k) need query lengths (seqlens): make a "
                                 "varlen problem with Problem.varlen()")
            if self.Sk == 0:
                object.__setattr__(self, "Sk", self.S)
            return
        if not self.seqlens_k:
            object.__setattr__(self, "seqlens_k", self.seqlens)
        sk = max(max(self.seqlens_k), 1) if self.seqlens_k else 0
        if self.Sk == 0:
            object.__setattr__(self, "Sk", sk)
        if (self.B != len(self.seqlens) or len(self.seqlens_k) != len(self.seqlens)
                or self.S != max(max(self.seqlens), 1) or self.Sk != sk):
            raise ShapeError("a varlen problem's B, S and Sk are its number of sequences and its "
                             "longest query and key lengths: make it with Problem.varlen()")

    def _check_keys(self) -> None:
        """Every query row must see a key: causal needs s_k >= s_q (bottom-right alignment),
        and no sequence may have queries but no keys."""
        pairs = (zip(self.seqlens, self.seqlens_k, strict=True) if self.seqlens
                 else [(self.S, self.Sk)])
        for i, (q, k) in enumerate(pairs):
            where = f"sequence {i} of " if self.seqlens else ""
            if self.causal and q > k:
                raise ShapeError(
                    f"problem {self}: {where}{q} queries over {k} keys: a causal mask is aligned "
                    f"bottom-right (query i sees keys 0 .. i + S_k - S_q), so {q - k} query rows "
                    "would see no key; give at least as many keys as queries, or use :full")
            if q > 0 and k == 0:
                raise ShapeError(f"problem {self}: {where}{q} queries over no key; give each "
                                 "sequence with queries at least one key")

    def _check_masks(self) -> None:
        if not _is_count(self.window) or not 0 <= self.window <= MAX_WINDOW:
            raise ShapeError(f"problem window must be a number of keys from 1 to 2^30 (the "
                             f"kernel's widest), or {NO_WINDOW} for none "
                             f"(got {num_text(self.window)})")
        cap = self.softcap  # compared before float(): float() of a huge int raises
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) \
                or not (cap == 0 or MIN_SOFTCAP <= cap <= MAX_SOFTCAP):
            raise ShapeError(f"problem softcap must be a number {SOFTCAP_RANGE}, or 0 for none "
                             f"(got {num_text(cap)})")
        object.__setattr__(self, "softcap", float(self.softcap))
        if not isinstance(self.sinks, bool):
            raise ShapeError(f"problem sinks must be true or false (got {self.sinks!r})")

    def _check_layout(self) -> None:
        if self.layout not in LAYOUTS:
            raise ShapeError(f"problem layout {self.layout!r} is not one of "
                             f"{', '.join(LAYOUTS)} (the default, bshd, is dense tensors)")
        if not _is_count(self.page_size) or self.page_size < 0:
            raise ShapeError(f"problem page_size must be a number of rows, or 0 for no pages "
                             f"(got {num_text(self.page_size)})")
        if self.page_size and (why := page_size_problem(self.page_size)):
            raise ShapeError(f"problem {self}: {why}")
        if self.page_size and self.layout != DEFAULT_LAYOUT:
            raise ShapeError(f"problem {self}: a paged KV cache has its own layout; drop "
                             f":{self.layout}")
        if self.layout == DEFAULT_LAYOUT:
            return
        if self.seqlens:
            raise ShapeError(f"problem {self}: the {self.layout} layout is for fixed-length "
                             "batches; a packed varlen batch is dense [total, H, D] tensors")
        if self.layout == "qkv" and self.S != self.Sk:
            raise ShapeError(f"problem {self}: q, k, v as views of one fused QKV tensor have as "
                             f"many keys as queries (got {self.S} queries over {self.Sk} keys); "
                             "drop :k or use :bhsd")

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
    def is_paged(self) -> bool:
        return self.page_size > 0

    @property
    def device_scheduled(self) -> bool:
        """Whether the kernel builds its schedule on the device (a packed batch, or pages: the
        per-sequence key lengths and the block table are device metadata)."""
        return self.is_varlen or self.is_paged

    @property
    def pages(self) -> PageLayout:
        """A paged problem's pages and block table (tuner.paging), over the dense keys of
        ``as_fixed``."""
        if not self.page_size:
            raise ValueError(f"problem {self} has no paged KV cache")
        lens = self.seqlens_k if self.seqlens else (self.Sk,) * self.B
        starts = (tuple(self.cu_seqlens_k()[:-1]) if self.seqlens
                  else tuple(b * self.Sk for b in range(self.B)))
        return _page_layout(lens, starts, self.page_size, str(self))

    @property
    def S_q(self) -> int:  # noqa: N802 - the ABI's and FlashAttention's name
        """Query length (varlen: the longest, max_seqlen_q)."""
        return self.S

    @property
    def S_k(self) -> int:  # noqa: N802
        """Key length (varlen: the longest, max_seqlen_k)."""
        return self.Sk

    @property
    def max_seqlen_k(self) -> int:
        return self.Sk

    @property
    def tokens_q(self) -> int:
        """Query rows in Q and O: B*S, or the packed batch's total."""
        return sum(self.seqlens) if self.seqlens else self.B * self.S

    @property
    def tokens(self) -> int:
        """Query rows (``tokens_q``; the name from before S_q != S_k)."""
        return self.tokens_q

    @property
    def tokens_k(self) -> int:
        """Key rows in K and V: B*S_k, or the packed batch's total."""
        return sum(self.seqlens_k) if self.seqlens else self.B * self.Sk

    @staticmethod
    def _prefix(lengths: tuple[int, ...]) -> list[int]:
        out = [0]
        for x in lengths:
            out.append(out[-1] + x)
        return out

    def cu_seqlens(self) -> list[int]:
        """Varlen: the prefix sums of the query lengths (num_seqs + 1 entries, first 0)."""
        return self._prefix(self.seqlens)

    def cu_seqlens_k(self) -> list[int]:
        """Varlen: the prefix sums of the key lengths (num_seqs + 1 entries, first 0)."""
        return self._prefix(self.seqlens_k)

    @property
    def as_fixed(self) -> Problem:
        """The fixed-length problem with this one's memory: itself, or for a packed batch one
        batch of all its query rows (S=total_q) and key rows (Sk=total_k): what buffers, input
        generation, poisoning and the comparison see."""
        if not self.seqlens:
            return self
        return Problem(1, self.Hq, self.tokens_q, Hkv=self.Hkv, D=self.D, causal=self.causal,
                       Sk=self.tokens_k)

    def view(self, name: str) -> TensorView:
        """Where tensor ``name`` ("q", "k", "v" or "o") lives under this problem's layout (a
        packed batch: its ``as_fixed`` tensors). O is always dense BSHD."""
        if name not in ("q", "k", "v", "o"):
            raise ValueError(f"no tensor {name!r}: q, k, v or o")
        m = self.as_fixed
        rows, heads = (m.S, m.Hq) if name in ("q", "o") else (m.Sk, m.Hkv)
        dims = (m.B, rows, heads, m.D)
        if self.layout == "qkv" and name != "o":
            # One projection output [B, S, Hq + 2 Hkv, D]: a token's q, k, v heads side by side.
            width = (m.Hq + 2 * m.Hkv) * m.D
            offset = {"q": 0, "k": m.Hq * m.D, "v": (m.Hq + m.Hkv) * m.D}[name]
            return TensorView("qkv", offset, dims, (rows * width, width, m.D))
        if self.page_size and name in ("k", "v"):
            # [num_pages, page_size, Hkv, D]: batch stride = one page, read through the table.
            n = self.pages.num_pages
            return TensorView(f"{name}_pages", 0, (n, self.page_size, heads, m.D),
                              (self.page_size * heads * m.D, heads * m.D, m.D))
        if self.layout == "bhsd" and name in ("k", "v"):
            # [B, Hkv, S_k, D] memory read as [B, S_k, Hkv, D]: sequence stride D, head S_k*D.
            return TensorView(f"{name}_cache", 0, dims, (heads * rows * m.D, m.D, rows * m.D))
        return TensorView(name, 0, dims, dense_strides(rows, heads, m.D))

    def layout_buffers(self) -> dict[str, int]:
        """The buffers this layout needs beside the dense q, k, v, o (name -> BF16 elements):
        none for bshd; {"qkv"} for qkv; {"k_cache", "v_cache"} for bhsd; {"k_pages",
        "v_pages"} for a paged KV cache."""
        if self.page_size:
            n = self.pages.num_pages * self.page_size * self.Hkv * self.D
            return {"k_pages": n, "v_pages": n}
        if self.layout == "qkv":
            return {"qkv": self.B * self.S * (self.Hq + 2 * self.Hkv) * self.D}
        if self.layout == "bhsd":
            n = self.B * self.Hkv * self.Sk * self.D
            return {"k_cache": n, "v_cache": n}
        return {}

    @property
    def problem_class(self) -> ProblemClass:
        """The compile-time part (head dim, mask; varlen needs the packed-sequence kernel too):
        which kernel library can run it. S_q < S_k is a run-time value: no class of its own."""
        return ProblemClass(self.D, self.causal, self.device_scheduled, window=self.window > 0,
                            softcap=self.softcap > 0, sinks=self.sinks, paged=self.is_paged)

    @property
    def kind(self) -> str:
        if self.Hkv == self.Hq:
            return "MHA"
        return "MQA" if self.Hkv == 1 else "GQA"

    @classmethod
    def parse(cls, text: str) -> Problem:
        # Printable ASCII only (a control character would break the error's one line; int()
        # takes full-width and other Unicode digits, which the options never did).
        text = str(text).strip()
        check_chars(text, text)
        m = SHAPE_RE.fullmatch(text)
        v = None if m else VARLEN_RE.fullmatch(text)
        if not m and not v:
            raise ShapeError(f"malformed problem '{text}': {SYNTAX}")
        if v:
            hq_t, hkv_t, lens, opts = v.groups()
        else:
            b_t, hq_t, hkv_t, s_t, opts = m.groups()  # type: ignore[union-attr]
        hq = parse_count(hq_t, "Hq ", text)
        hkv = 0 if hkv_t is None else parse_count(hkv_t, "Hkv ", text)
        if hkv_t is not None and hkv < 1:  # '/0' is not MHA (Hkv=0 only means it in code)
            raise ShapeError(f"problem '{text}': Hkv must be a positive integer (got {hkv_t})")
        o = parse_options(opts, text)
        d, causal, sk, layout = o.d, o.causal, o.sk, o.layout
        masks = {"window": o.window, "softcap": o.softcap, "sinks": o.sinks,
                 "page_size": o.page_size}
        if v:
            if sk:
                raise ShapeError(f"malformed problem '{text}': :k is for fixed-length problems; "
                                 "give each sequence's key length as q:k, e.g. [2048:8192]")
            if layout != DEFAULT_LAYOUT:
                raise ShapeError(f"malformed problem '{text}': :{layout} is for fixed-length "
                                 "problems; a packed varlen batch is dense [total, H, D] tensors")
            qs, ks = parse_pairs(lens, text)
            return cls.varlen(qs, hq, Hkv=hkv, D=d, causal=causal, seqlens_k=ks,
                              **masks)  # type: ignore[arg-type]
        return cls(parse_count(b_t, "B ", text), hq, parse_count(s_t, "S ", text), Hkv=hkv, D=d,
                   causal=causal, Sk=sk, layout=layout, **masks)  # type: ignore[arg-type]

    def __str__(self) -> str:
        heads = f"{self.Hq}" if self.Hkv == self.Hq else f"{self.Hq}/{self.Hkv}"
        if self.seqlens:
            text = f"{heads}x[{lengths_text(self.seqlens, self.seqlens_k)}]"
        else:
            text = f"{self.B}x{heads}x{self.S}"
            if self.Sk not in (0, self.S):  # 0: str() of a problem still being validated
                text += f":k{self.Sk}"
        if self.D != DEFAULT_HEAD_DIM:
            text += f":d{self.D}"
        if not self.causal:
            text += ":full"
        return (text + self.masks_text + (f":p{self.page_size}" if self.page_size else "")
                + (f":{self.layout}" if self.layout != DEFAULT_LAYOUT else ""))

    @property
    def masks_text(self) -> str:
        """The models' masks in the text form: ':w4096:cap50:sinks' (those set, in that order).
        The cap in plain decimal that parses back to this very float (decimal_text): studies
        are named by this text and resumed by parsing it."""
        text = f":w{self.window}" if self.window > 0 else ""
        if self.softcap > 0:
            text += f":cap{decimal_text(self.softcap)}"
        return text + (":sinks" if self.sinks else "")

    # -- cost
    @property
    def flops(self) -> int:
        """4*Hq*D*(the (query, key) pairs the mask keeps), summed over the batch (varlen: its
        sequences); causal pairs counted continuously as s_q*s_k - s_q^2/2. S_q = S_k: causal
        2*B*Hq*S^2*D (not halved, as the anchors count it), non-causal twice that."""
        if self.seqlens:
            p2 = sum(_pairs2(q, k, self.causal, self.window)
                     for q, k in zip(self.seqlens, self.seqlens_k, strict=True))
        else:
            p2 = self.B * _pairs2(self.S, self.Sk, self.causal, self.window)
        return 2 * self.Hq * self.D * p2

    def tflops(self, ms: float) -> float:
        return self.flops / (ms * 1e9)

    def to_dict(self) -> dict[str, int | bool | str | float | list[int]]:
        out: dict[str, int | bool | str | float | list[int]] = {
            "B": self.B, "H": self.Hq, "Hq": self.Hq, "Hkv": self.Hkv, "S": self.S, "D": self.D,
            "causal": self.causal}
        # Only where they say something: a problem's dict stays what it always was otherwise.
        if self.seqlens:
            out["seqlens"] = list(self.seqlens)
            if self.seqlens_k != self.seqlens:
                out["seqlens_k"] = list(self.seqlens_k)
        elif self.Sk != self.S:
            out["Sk"] = self.Sk
        if self.layout != DEFAULT_LAYOUT:
            out["layout"] = self.layout
        if self.window > 0:
            out["window"] = self.window
        if self.softcap > 0:
            out["softcap"] = self.softcap
        if self.sinks:
            out["sinks"] = True
        if self.page_size:
            out["page_size"] = self.page_size
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Problem:
        hq = d.get("Hq", d.get("H"))
        if hq is None:  # the TypeError int(None) raised; as_problem says what is missing
            raise TypeError("a problem dict needs Hq (or H)")
        kw: _ProblemKw = {
            "Hkv": int(d.get("Hkv") or 0), "D": int(d.get("D", DEFAULT_HEAD_DIM)),
            "causal": bool(d.get("causal", True)),
            "window": int(d.get("window", NO_WINDOW)), "softcap": float(d.get("softcap", 0.0)),
            "sinks": bool(d.get("sinks", False)), "page_size": int(d.get("page_size", 0))}
        if d.get("seqlens"):
            ks = d.get("seqlens_k")
            return cls.varlen([int(x) for x in d["seqlens"]], int(hq), **kw,
                              seqlens_k=None if not ks else [int(x) for x in ks])
        return cls(int(d["B"]), int(hq), int(d["S"]), Sk=int(d.get("Sk") or 0),
                   layout=str(d.get("layout") or DEFAULT_LAYOUT), **kw)


class _ProblemKw(TypedDict):
    """The keyword arguments Problem.from_dict passes both constructors."""

    Hkv: int
    D: int
    causal: bool
    window: int
    softcap: float
    sinks: bool
    page_size: int


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
    if len({p.softcap > 0 for p in ps}) > 1:
        raise ShapeError(
            "these problems mix softcapped (:cap) and plain scores; a kernel is built with or "
            "without softcapping: run them in two invocations"
        )
    paged = any(p.is_paged for p in ps)
    if paged and any(p.is_varlen and not p.is_paged for p in ps):
        raise ShapeError(
            "these problems mix packed K/V (varlen without :p) and a paged KV cache (:p); a "
            "library's varlen kernel reads one of them: run them in two invocations")
    if not ps:
        return DEFAULT_CLASS
    # A varlen library runs fixed-length problems too, a window library problems without one,
    # a sinks library problems without sinks, a paged library fixed-length problems without
    # pages: one library for a mix.
    return ProblemClass(ps[0].D, ps[0].causal, any(p.device_scheduled for p in ps),
                        window=any(p.window > 0 for p in ps), softcap=ps[0].softcap > 0,
                        sinks=any(p.sinks for p in ps), paged=paged)


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
        except (KeyError, TypeError, ValueError, OverflowError):  # int(inf) overflows
            raise ShapeError(f"malformed problem {obj!r}: needs B, Hq (or H) and S") from None
    if isinstance(obj, (list, tuple)) and len(obj) == 3:
        b, h, s = (int(v) for v in obj)
        return Problem(b, h, s)
    raise ShapeError(f"malformed problem {obj!r}: give a Problem, "
                     "'BxHq[/Hkv]xS[:kSK][:dD][:full][:qkv|:bhsd]' or a dict")


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
    for name, have in (("sliding window", lambda p: p.window > 0),
                       ("softcap", lambda p: p.softcap > 0), ("sinks", lambda p: p.sinks)):
        if any(have(p) for p in ps):
            parts.append(name)
    layouts = sorted({p.layout for p in ps})
    if layouts == [DEFAULT_LAYOUT]:
        pass  # dense tensors, as every problem before layouts: the titles stay as they were
    elif len(layouts) == 1:
        parts.append(LAYOUTS[layouts[0]])
    else:
        parts.append(f"layouts {'/'.join(layouts)}")
    return ", ".join(parts)
