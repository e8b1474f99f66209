"""The text form of a problem (the CLI's ``--shape``): its vocabulary, the ':...' options, and
the run-length lists of a packed batch's lengths. tuner.problem's ``Problem.parse`` and
``str(Problem)`` are the two users; the grammar itself is written out in tuner.problem's
docstring (and README's Problems section)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

from tuner.errors import ShapeError
from tuner.paging import MAX_PAGE_SIZE, MIN_PAGE_SIZE

HEAD_DIMS: tuple[int, ...] = (64, 128, 256)
DEFAULT_HEAD_DIM = 128
NO_WINDOW = 0  # Problem.window: no sliding window (every key the mask leaves)

# The options are anything between colons: parse_options says what is wrong with one (a cap in
# exponent form, a duplicate) rather than the whole text failing to match. re.ASCII: \d is 0-9
# only (Python's int() would take full-width and other Unicode digits).
SHAPE_RE = re.compile(
    r"\s*(\d+)\s*x\s*(\d+)\s*(?:/\s*(\d+)\s*)?x\s*(\d+)\s*((?::[^:]*)*)",
    re.IGNORECASE | re.ASCII,  # the BxHxS parser before problems took '4X32X8192', so this does
)
VARLEN_RE = re.compile(
    r"\s*(\d+)\s*(?:/\s*(\d+)\s*)?x\s*\[([^\]]*)\]\s*((?::[^:]*)*)",
    re.IGNORECASE | re.ASCII,
)
MAX_SEQS = 65535  # sequences in one varlen batch (the device-side schedule's bound)
# What the kernel's C ABI (cuda_src/fa_tune/fa_tune.h) holds: its sizes are int32, and its
# window at most 2^30 keys (the launcher's check; params.cuh's kNoWindow).
INT32_MAX = 2**31 - 1
MAX_WINDOW = 2**30
# The ABI's softcap is float32, and the launcher takes cap * log2(e) and scale / cap in float32:
# within these bounds all three stay finite, normal numbers.
MIN_SOFTCAP = 1e-30
MAX_SOFTCAP = 1e30
INT32_WHY = "2^31 - 1: the kernel's C ABI holds it as int32"
SOFTCAP_RANGE = "from 10^-30 to 10^30 (the kernel takes it as float32)"
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


def check_chars(text: str, where: str) -> None:
    """Printable ASCII only: other digits (full-width '１') would read as numbers in some places
    and not others, and a control character would break the one-line error."""
    bad = next((c for c in text if not (c.isascii() and c.isprintable())), None)
    if bad is not None:
        raise ShapeError(f"malformed problem {where!r}: {bad!r} (U+{ord(bad):04X}) is not a plain "
                         "ASCII character; write the problem in ASCII digits and letters, "
                         "e.g. 4x32x8192:d64")


def num_text(v: object) -> str:
    """A value for an error line, short even for a huge int (str() refuses past 4300 digits)."""
    if isinstance(v, int) and v.bit_length() > 256:
        return f"a {v.bit_length()}-bit number"
    return repr(v)


def parse_count(digits: str, prefix: str, where: str, limit: int = INT32_MAX,
                why: str = INT32_WHY) -> int:
    """ASCII digits -> an int of at most ``limit``; else one line, ``prefix`` + the digits
    ('S 99999999999', 'the window :w99999999999') and the limit. Checked on the text first:
    int() of thousands of digits is slow, and refused past 4300."""
    shown = digits if len(digits) <= 24 else f"{digits[:12]}... ({len(digits)} digits)"
    if not (digits.isascii() and digits.isdigit()):
        raise ShapeError(f"malformed problem '{where}': {prefix}{shown} is not a whole number "
                         "in ASCII digits")
    sig = digits.lstrip("0")
    if len(sig) > len(str(limit)) or (sig and int(sig) > limit):
        raise ShapeError(f"malformed problem '{where}': {prefix}{shown} is out of range: at most "
                         f"{limit} ({why})")
    return int(digits)


def decimal_text(x: float) -> str:
    """A float in plain decimal that reads back as exactly x: the shortest repr's digits, never
    an exponent (the parser takes none), no trailing zeros: 50.0 -> '50', 1e-10 ->
    '0.0000000001', 1234567.0 -> '1234567'. Values '%g' printed exactly print the same."""
    text = format(Decimal(repr(float(x))), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def parse_pairs(text: str, where: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """'2048:8192,512:4096*2,1024' -> ((2048, 512, 512, 1024), (8192, 4096, 4096, 1024)): each
    entry a query length, optionally ':' its key length (else the same), optionally '*count'."""
    check_chars(text, where)
    qs: list[int] = []
    ks: list[int] = []
    for part in (x.strip() for x in text.split(",")):
        m = re.fullmatch(r"(\d+)\s*(?::\s*(\d+)\s*)?(?:\*\s*(\d+))?", part, re.ASCII)
        if not m:
            raise ShapeError(f"malformed problem '{where}': '{part}' is not a length, q:k or "
                             "length*count (e.g. [8192,4096*2] or [2048:8192,512:4096*2])")
        count = parse_count(m.group(3) or "1", f"'{part}': the count ", where, MAX_SEQS,
                            "sequences in one varlen batch")
        if count < 1:
            raise ShapeError(f"malformed problem '{where}': count {count} in '{part}' must be "
                             f"1..{MAX_SEQS}")
        # Checked as the list grows: '[1*65535,1*65535,...]' must not build millions of entries.
        if len(qs) + count > MAX_SEQS:
            raise ShapeError(f"malformed problem '{where}': a varlen batch holds at most "
                             f"{MAX_SEQS} sequences (got more by '{part}'); split it")
        q = parse_count(m.group(1), "the sequence length ", where)
        k = q if m.group(2) is None else parse_count(m.group(2), "the key length ", where)
        qs.extend([q] * count)
        ks.extend([k] * count)
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


# What each option sets, for the line when one is given twice.
_SETTING_NAMES = {"d": "the head dim (:d)", "causal": "the mask (:full / :causal)",
                  "sk": "the key length (:k)", "layout": "the layout (:qkv / :bhsd)",
                  "window": "the window (:w)", "softcap": "the softcap (:cap)",
                  "sinks": ":sinks", "page_size": "the page size (:p)"}
_UNKNOWN = ("use :dD for the head dim, e.g. :d64, :full for a non-causal mask, :kSK for the key "
            "length, e.g. :k8192, :wW for a sliding window, e.g. :w4096, :capC for logit "
            "softcapping, e.g. :cap50, :sinks for attention sinks, :pP for a paged KV cache of "
            "P-row pages, e.g. :p64, and :qkv or :bhsd for the memory layout")


def _positive(opt: str, what: str, text: str, at_least: str, limit: int = INT32_MAX,
              why: str = INT32_WHY) -> int:
    """The number after an option's letter: ASCII digits, 1 .. limit."""
    v = parse_count(opt[1:], f"{what} :{opt[0]}", text, limit, why)
    if v < 1:
        raise ShapeError(f"malformed problem '{text}': {what} :{opt} must be >= {at_least}")
    return v


def _softcap(opt: str, text: str) -> float:
    digits = opt[3:]
    if not re.fullmatch(r"\d+(\.\d*)?", digits, re.ASCII):
        raise ShapeError(f"malformed problem '{text}': the softcap :{opt} must be a plain decimal "
                         "number, e.g. :cap50 or :cap0.5 (no sign, no exponent)")
    cap = float(digits)  # a decimal of any length reads as the nearest float: never an error
    if not cap > 0:
        raise ShapeError(f"malformed problem '{text}': the softcap :{opt} must be > 0 "
                         "(leave :cap out for no softcapping)")
    if not MIN_SOFTCAP <= cap <= MAX_SOFTCAP:
        raise ShapeError(f"malformed problem '{text}': the softcap :{opt} is out of range: "
                         f"{SOFTCAP_RANGE}; models use tens, e.g. :cap50")
    return cap


def _option(opt: str, text: str) -> tuple[str, object]:
    """One ':...' option (lower case) -> (the Options field it sets, its value)."""
    if opt in LAYOUTS:
        return "layout", opt
    if opt in ("full", "noncausal", "non-causal", "causal"):
        return "causal", opt == "causal"
    if opt == "sinks":
        return "sinks", True
    if opt.startswith("cap"):
        return "softcap", _softcap(opt, text)
    if re.fullmatch(r"[dkwp]\d+", opt, re.ASCII):
        letter = opt[0]
        if letter == "d":  # HEAD_DIMS is checked by Problem, with the choices in its line
            return "d", _positive(opt, "the head dim", text, "1 (e.g. :d64)")
        if letter == "k":
            return "sk", _positive(opt, "the key length", text,
                                   "1 (leave :k out for as many keys as queries)")
        if letter == "w":
            return "window", _positive(opt, "the window", text,
                                       "1 key (leave :w out for no window)", MAX_WINDOW,
                                       "2^30 keys, the kernel's widest window")
        # The power of two is checked by Problem (tuner.paging), with the range in its line.
        return "page_size", _positive(
            opt, "the page size", text, "1 row (leave :p out for K and V without pages)",
            MAX_PAGE_SIZE,
            f"a power of two from {MIN_PAGE_SIZE} to {MAX_PAGE_SIZE} rows")
    raise ShapeError(f"malformed problem '{text}': unknown option ':{opt}' ({_UNKNOWN})")


def parse_options(opts: str, text: str) -> Options:
    """':d64:full:w128' -> Options. Each setting at most once: a repeat would silently take the
    last one (':d64:d128'), so it is refused, as two masks or two layouts are."""
    check_chars(opts, text)
    given: dict[str, str] = {}  # Options field -> the option that set it
    values: dict[str, object] = {}
    for raw in opts.split(":")[1:]:  # opts is '' or starts with ':'
        opt = raw.strip().lower()
        if not opt:
            raise ShapeError(f"malformed problem '{text}': an empty option (a ':' with nothing "
                             "after it); drop the extra ':'")
        name, value = _option(opt, text)
        if name in given:
            prev = given[name]
            if name in ("causal", "layout") and prev != opt:
                what = "mask" if name == "causal" else "layout"
                raise ShapeError(f"malformed problem '{text}': give one {what} (:{prev} and "
                                 f":{opt})")
            raise ShapeError(f"malformed problem '{text}': {_SETTING_NAMES[name]} is given twice "
                             f"(:{prev} and :{opt}); give each option once")
        given[name] = opt
        values[name] = value
    return Options(**values)  # type: ignore[arg-type]
