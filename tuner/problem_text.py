"""The text form of a problem (the CLI's ``--shape``): its vocabulary, the ':...' options, and
the run-length lists of a packed batch's lengths. tuner.problem's ``Problem.parse`` and
``str(Problem)`` are the two users; the grammar itself is written out in tuner.problem's
docstring (and README's Problems section)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tuner.errors import ShapeError

HEAD_DIMS: tuple[int, ...] = (64, 128, 256)
DEFAULT_HEAD_DIM = 128
NO_WINDOW = 0  # Problem.window: no sliding window (every key the mask leaves)

SHAPE_RE = re.compile(
    r"\s*(\d+)\s*x\s*(\d+)\s*(?:/\s*(\d+)\s*)?x\s*(\d+)\s*((?::\s*[A-Za-z0-9.]+\s*)*)",
    re.IGNORECASE,  # the BxHxS parser before problems took '4X32X8192', so this one does too
)
VARLEN_RE = re.compile(
    r"\s*(\d+)\s*(?:/\s*(\d+)\s*)?x\s*\[([^\]]*)\]\s*((?::\s*[A-Za-z0-9.]+\s*)*)",
    re.IGNORECASE,
)
MAX_SEQS = 65535  # sequences in one varlen batch (the device-side schedule's bound)
SYNTAX = ("write BxHq[/Hkv]xS[:dD][:full] (:kSK for S queries over SK keys; :wW for a sliding "
           "window of W keys (a query's own and the W-1 before it), :capC for logit softcapping "
           "at C, :sinks for attention sinks; :qkv or :bhsd for q, k, v laid out as one fused "
           "QKV tensor or k, v as a [B, H, S, D] cache; :pP for k, v in a paged cache of P-row "
           "pages), e.g. 4x32x8192, 1x32/8x8192, "
           "1x32/8x2048:k8192, 4x16x8192:d256, 4x32x8192:full, 1x32/8x16384:w4096, "
           "1x16/8x8192:d256:cap50, 1x64/8x8192:d64:w128:sinks, "
           "1x32/8x8192:qkv; or a packed varlen batch Hq[/Hkv]x[q[:k],q[:k]*count,...], e.g. "
           "32/8x[8192,4096*2] or 32/8x[2048:8192,512:4096*2]")

# Where q, k and v live in memory (module docstring). "bshd" is the default and never printed.
DEFAULT_LAYOUT = "bshd"
LAYOUTS: dict[str, str] = {
    "bshd": "dense BSHD q, k, v",
    "qkv": "q, k, v views of one fused QKV tensor [B, S, Hq+2Hkv, D]",
    "bhsd": "k, v views of [B, Hkv, S_k, D] memory (a KV cache)",
}


def parse_pairs(text: str, where: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """'2048:8192,512:4096*2,1024' -> ((2048, 512, 512, 1024), (8192, 4096, 4096, 1024)): each
    entry a query length, optionally ':' its key length (else the same), optionally '*count'."""
    qs: list[int] = []
    ks: list[int] = []
    for part in (x.strip() for x in text.split(",")):
        m = re.fullmatch(r"(\d+)\s*(?::\s*(\d+)\s*)?(?:\*\s*(\d+))?", part)
        if not m:
            raise ShapeError(f"malformed problem '{where}': '{part}' is not a length, q:k or "
                             "length*count (e.g. [8192,4096*2] or [2048:8192,512:4096*2])")
        count = int(m.group(3) or 1)
        if count < 1 or count > MAX_SEQS:
            raise ShapeError(f"malformed problem '{where}': count {count} in '{part}' must be "
                             f"1..{MAX_SEQS}")
        q = int(m.group(1))
        qs.extend([q] * count)
        ks.extend([int(m.group(2)) if m.group(2) is not None else q] * count)
    return tuple(qs), tuple(ks)


def parse_lengths(text: str, where: str) -> tuple[int, ...]:
    """'8192,4096*2,1024' -> (8192, 4096, 4096, 1024) (query = key lengths only)."""
    qs, ks = parse_pairs(text, where)
    if qs != ks:
        raise ShapeError(f"malformed problem '{where}': give plain lengths here, not q:k pairs")
    return qs


def lengths_text(seqlens: tuple[int, ...], seqlens_k: tuple[int, ...] = ()) -> str:
    """Run-length form: (8192, 4096, 4096) -> '8192,4096*2'; with key lengths that differ,
    each such entry as q:k: ((2048, 512, 512), (8192, 4096, 4096)) -> '2048:8192,512:4096*2'."""
    ks = seqlens_k or seqlens
    items = [str(q) if q == k else f"{q}:{k}" for q, k in zip(seqlens, ks, strict=True)]
    parts: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j < len(items) and items[j] == items[i]:
            j += 1
        parts.append(items[i] if j - i == 1 else f"{items[i]}*{j - i}")
        i = j
    return ",".join(parts)


@dataclass(frozen=True)
class Options:
    """The ':...' options of a problem's text form."""

    d: int = DEFAULT_HEAD_DIM
    causal: bool = True
    sk: int = 0  # 0: not given
    layout: str = DEFAULT_LAYOUT
    window: int = NO_WINDOW
    softcap: float = 0.0
    sinks: bool = False
    page_size: int = 0


def parse_options(opts: str, text: str) -> Options:
    d, causal, sk, layout = DEFAULT_HEAD_DIM, True, 0, DEFAULT_LAYOUT
    window, softcap, sinks, page_size = NO_WINDOW, 0.0, False, 0
    for opt in (o.strip().lower() for o in opts.split(":") if o.strip()):
        if opt in LAYOUTS:
            if layout != DEFAULT_LAYOUT and opt != layout:
                raise ShapeError(f"malformed problem '{text}': give one layout (:{layout} and "
                                 f":{opt})")
            layout = opt
        elif opt in ("full", "noncausal", "non-causal"):
            causal = False
        elif opt == "causal":
            causal = True
        elif opt == "sinks":
            sinks = True
        elif re.fullmatch(r"d\d+", opt):
            d = int(opt[1:])
        elif re.fullmatch(r"k\d+", opt):
            sk = int(opt[1:])
            if sk < 1:
                raise ShapeError(f"malformed problem '{text}': the key length :k{sk} must be "
                                 ">= 1 (leave :k out for as many keys as queries)")
        elif re.fullmatch(r"w\d+", opt):
            window = int(opt[1:])
            if window < 1:
                raise ShapeError(f"malformed problem '{text}': the window :w{window} must be "
                                 ">= 1 key (leave :w out for no window)")
        elif re.fullmatch(r"p\d+", opt):
            page_size = int(opt[1:])
            if page_size < 1:
                raise ShapeError(f"malformed problem '{text}': the page size :p{page_size} must "
                                 "be >= 1 row (leave :p out for K and V without pages)")
        elif re.fullmatch(r"cap\d+(\.\d*)?", opt):
            softcap = float(opt[3:])
            if not softcap > 0:
                raise ShapeError(f"malformed problem '{text}': the softcap :{opt} must be > 0 "
                                 "(leave :cap out for no softcapping)")
        else:
            raise ShapeError(
                f"malformed problem '{text}': unknown option ':{opt}' (use :dD for the head "
                "dim, e.g. :d64, :full for a non-causal mask, :kSK for the key length, e.g. "
                ":k8192, :wW for a sliding window, e.g. :w4096, :capC for logit softcapping, "
                "e.g. :cap50, :sinks for attention sinks, :pP for a paged KV cache of P-row "
                "pages, e.g. :p64, and :qkv or :bhsd for the memory layout)"
            )
    return Options(d, causal, sk, layout, window, softcap, sinks, page_size)
