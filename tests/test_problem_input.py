"""The problem text as input: what str() prints parses back to the same problem (the softcap's
float included: studies are named by this text and resumed by parsing it), old printed forms keep
their problems, and bad input (repeated options, non-ASCII digits, numbers past what the kernel's
C ABI holds) is one ShapeError line, exit 2 from the CLI."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tuner import _paths
from tuner.errors import ShapeError
from tuner.problem import Problem, as_problem
from tuner.problem_text import (
    INT32_MAX,
    MAX_SEQS,
    MAX_SOFTCAP,
    MAX_WINDOW,
    MIN_SOFTCAP,
    decimal_text,
)

PLAIN_DECIMAL = re.compile(r"(0|[1-9]\d*)(\.\d*[1-9])?")  # no exponent, sign or trailing zero


def _cap_text(p: Problem) -> str:
    return str(p).split(":cap", 1)[1].split(":", 1)[0]


def _assert_round_trip(p: Problem) -> None:
    text = str(p)
    back = Problem.parse(text)
    assert back == p, (text, back)
    assert back.softcap == p.softcap  # the very float, not a near one
    assert str(back) == text
    assert Problem.from_dict(p.to_dict()) == p


# ---- the softcap's float --------------------------------------------------------------------
@pytest.mark.parametrize(("text", "printed"), [
    ("1x32x8192:cap1234567", "1x32x8192:cap1234567"),          # was cap1.23457e+06
    ("1x32x8192:cap0.0000000001", "1x32x8192:cap0.0000000001"),  # was cap1e-10
    ("1x32x8192:cap50.123456789", "1x32x8192:cap50.123456789"),  # was cap50.1235
    ("1x32x8192:cap50.0", "1x32x8192:cap50"),
    ("1x32x8192:cap050.500", "1x32x8192:cap50.5"),
    ("1x32x8192:cap7.", "1x32x8192:cap7"),
    ("1x32x8192:cap123456789012345678", "1x32x8192:cap123456789012345680"),  # the float's
])
def test_audit_caps_print_what_parses_back(text: str, printed: str) -> None:
    p = Problem.parse(text)
    assert str(p) == printed
    _assert_round_trip(p)


def test_cap_text_is_the_exact_float() -> None:
    assert Problem.parse("1x8x64:cap50.123456789").softcap == 50.123456789
    assert Problem.parse("1x8x64:cap1234567").softcap == 1234567.0
    assert Problem.parse("1x8x64:cap0.0000000001").softcap == 1e-10
    # Two caps that '%g' printed alike are two problems, with two names.
    a, b = Problem.parse("1x8x64:cap50.12345"), Problem.parse("1x8x64:cap50.12349")
    assert a != b and str(a) != str(b)


def _random_caps(rng: random.Random, n: int) -> list[float]:
    caps: list[float] = []
    while len(caps) < n:
        kind = len(caps) % 4
        if kind == 0:  # any double of any magnitude the parser takes (random mantissa bits)
            x = rng.uniform(1.0, 10.0) * 10.0 ** rng.randint(-30, 29)
        elif kind == 1:  # short decimals, as people write them
            x = round(rng.uniform(0, 1000), rng.randint(0, 6))
        elif kind == 2:  # whole numbers, up to 2^63 (past the doubles' exact integers)
            x = float(rng.randint(1, 2**rng.randint(1, 63)))
        else:  # tiny and huge
            x = rng.uniform(0.5, 1.0) * 10.0 ** rng.choice((-29, -20, -7, -5, 15, 16, 22, 29))
        if MIN_SOFTCAP <= x <= MAX_SOFTCAP:
            caps.append(x)
    return caps


def test_a_thousand_random_caps_round_trip() -> None:
    rng = random.Random(20240611)
    caps = _random_caps(rng, 1000) + [MIN_SOFTCAP, MAX_SOFTCAP, 2.0**-99, 0.1, 1 / 3,
                                     2.0**53 + 2, 2.0**-60, 50.0, 30.0, 50.5]
    for x in caps:
        p = Problem(1, 8, 64, softcap=x)
        cap = _cap_text(p)
        assert PLAIN_DECIMAL.fullmatch(cap), (x, cap)
        assert float(cap) == x
        _assert_round_trip(p)


def test_decimal_text_is_shortest_and_plain() -> None:
    assert [decimal_text(x) for x in (50.0, 30.0, 50.5, 0.25, 1e-10, 1234567.0, 1e22, 1.5e-7)] \
        == ["50", "30", "50.5", "0.25", "0.0000000001", "1234567",
            "10000000000000000000000", "0.00000015"]
    rng = random.Random(7)
    for _ in range(500):
        x = rng.uniform(1.0, 10.0) * 10.0 ** rng.randint(-30, 29)
        text = decimal_text(x)
        assert PLAIN_DECIMAL.fullmatch(text) and float(text) == x
        # As short as repr: no more significant digits than the shortest round-tripping form.
        sig = text.replace(".", "").strip("0")
        assert len(sig) <= len(repr(x).split("e")[0].replace(".", "").replace("-", "").strip("0"))


def test_typed_caps_are_canonical_after_one_parse() -> None:
    """Whatever decimal a user types, the printed form is fixed: it parses to the same problem
    and prints itself."""
    rng = random.Random(3)
    for _ in range(500):
        whole = str(rng.randint(0, 10**rng.randint(0, 12)))
        frac = "".join(rng.choice("0123456789") for _ in range(rng.randint(0, 20)))
        typed = whole + ("." + frac if frac or rng.random() < 0.2 else "")
        try:
            p = Problem.parse(f"1x8x64:cap{typed}")
        except ShapeError as e:  # 0, or below 10^-30: refused with the range
            assert float(typed) < MIN_SOFTCAP and "\n" not in str(e), typed
            continue
        assert p.softcap == float(typed)
        _assert_round_trip(p)


@pytest.mark.parametrize("x", [50.0, 30.0, 50.5, 30.5, 20.0, 5.0, 0.25, 0.001, 0.0001, 123.456,
                               50.1235, 999999.0, 123457.0, 1.5])
def test_old_printed_caps_keep_their_text(x: float) -> None:
    """Studies store str(problem) from before: its '%g' cap (where it parsed at all) reads to the
    same problem and prints the same text, so old studies resume under their names."""
    old = f"1x16/8x8192:d256:w4096:cap{x:g}"
    assert "e" not in old
    p = Problem.parse(old)
    assert str(p) == old and p.softcap == float(f"{x:g}")


def test_every_old_g_form_that_parsed_prints_the_same() -> None:
    rng = random.Random(11)
    for x in _random_caps(rng, 1000):
        old = f"{x:g}"
        if "e" in old:  # '%g' went to exponent form: the old parser refused it (the bug)
            continue
        assert _cap_text(Problem.parse(f"1x8x64:cap{old}")) == old


# ---- whole problems with every option -------------------------------------------------------
@pytest.mark.parametrize("text", [
    "4x32x8192", "1x32/8x8192", "1x32/8x2048:k8192", "4x16x8192:d256:full",
    "1x16/8x8192:d256:w4096:cap50", "1x64/8x8192:d64:w128:sinks", "1x8x256:cap30.5:sinks:bhsd",
    "1x32/8x8192:qkv", "2x8/2x512:k2048:d64:full:w100:cap0.0000000001:sinks:p64",
    "4x32/8x2048:k8192:p16", "32/8x[8192,4096*2,2048*4,1024*8]", "32/8x[2048:8192,512:4096*2]",
    "32/8x[2048:8192,512]:d64:full:w128:cap1234567:sinks:p256", "4/2x[30:100,0,5:16]:cap20",
    "1x32x8192:w1073741824",  # the widest window the kernel takes
])
def test_full_problems_round_trip(text: str) -> None:
    p = Problem.parse(text)
    assert str(p) == text
    _assert_round_trip(p)


def _random_problem(rng: random.Random) -> Problem:
    masks = {"window": rng.choice((0, 0, 1, 128, 4096, MAX_WINDOW)),
             "softcap": rng.choice((0.0, 50.0, 30.5)) or rng.choice((0.0, *_random_caps(rng, 1))),
             "sinks": rng.random() < 0.5, "page_size": rng.choice((0, 0, 8, 64, 4096))}
    hkv = rng.choice((1, 2, 4))
    hq = hkv * rng.choice((1, 2, 4))
    D, causal = rng.choice((64, 128, 256)), rng.random() < 0.5
    if rng.random() < 0.3:
        qs = [rng.randint(0, 300) for _ in range(rng.randint(1, 6))]
        qs[0] = max(qs[0], 1)
        ks = [q + rng.randint(0, 300) * (q > 0 or not causal) + (q == 0) for q in qs]
        return Problem.varlen(qs, hq, Hkv=hkv, D=D, causal=causal, seqlens_k=ks, **masks)
    S = rng.randint(1, 5000)
    layout = "bshd" if masks["page_size"] else rng.choice(("bshd", "qkv", "bhsd"))
    Sk = S if layout == "qkv" else S + rng.randint(0, 5000)
    return Problem(rng.randint(1, 8), hq, S, Hkv=hkv, D=D, causal=causal, Sk=Sk, layout=layout,
                   **masks)


def test_random_problems_round_trip_in_any_option_order() -> None:
    rng = random.Random(5)
    for _ in range(300):
        p = _random_problem(rng)
        _assert_round_trip(p)
        text = str(p)
        cut = text.index("]") + 1 if p.is_varlen else 0  # a packed batch's lengths hold ':'
        head, *opts = text[cut:].split(":")
        rng.shuffle(opts)
        assert Problem.parse(text[:cut] + ":".join([head, *opts])) == p


# ---- bad input: one line each ---------------------------------------------------------------
BAD = [
    # a setting given twice, or two that conflict
    ("1x32x8192:d64:d128", "the head dim (:d) is given twice (:d64 and :d128)"),
    ("1x32x8192:d64:d64", "the head dim (:d) is given twice"),
    ("1x32x8192:w128:w256", "the window (:w) is given twice (:w128 and :w256)"),
    ("1x32x8192:cap50:cap30", "the softcap (:cap) is given twice (:cap50 and :cap30)"),
    ("1x32x2048:k4096:k8192", "the key length (:k) is given twice"),
    ("1x32/8x2048:k8192:p16:p64", "the page size (:p) is given twice"),
    ("1x32x8192:sinks:sinks", ":sinks is given twice"),
    ("1x32x8192:full:causal", "give one mask (:full and :causal)"),
    ("1x32x8192:causal:noncausal", "give one mask (:causal and :noncausal)"),
    ("1x32x8192:full:full", "the mask (:full / :causal) is given twice"),
    ("1x32x8192:qkv:bhsd", "give one layout (:qkv and :bhsd)"),
    ("1x32x8192:bshd:qkv", "give one layout (:bshd and :qkv)"),
    ("1x32x8192:qkv:qkv", "the layout (:qkv / :bhsd) is given twice"),
    ("32/8x[2048,512]:w64:w64", "the window (:w) is given twice"),
    # digits other than ASCII's
    ("１x32x8192", "'１' (U+FF11) is not a plain ASCII character"),
    ("1x３２x8192", "is not a plain ASCII character"),
    ("1x32/８x8192", "is not a plain ASCII character"),
    ("1x32x８１９２", "is not a plain ASCII character"),
    ("1x32x8192:d６４", "is not a plain ASCII character"),
    ("1x32x8192:w١٢٨", "is not a plain ASCII character"),  # Arabic-Indic digits
    ("32/8x[８１９２,4096]", "is not a plain ASCII character"),
    ("4x32\tx8192", "'\\t' (U+0009) is not a plain ASCII character"),
    # integers past what the kernel's C ABI holds (int32), or its smaller limits
    ("1x32x8192:w99999999999999999999999", "the window :w99999999999999999999999 is out of "
                                           "range: at most 1073741824 (2^30 keys"),
    (f"1x32x8192:w{MAX_WINDOW + 1}", f"the window :w{MAX_WINDOW + 1} is out of range"),
    ("1x32x2147483648", "S 2147483648 is out of range: at most 2147483647 (2^31 - 1: the "
                        "kernel's C ABI holds it as int32)"),
    ("2147483648x1x1", "B 2147483648 is out of range: at most 2147483647"),
    ("1x99999999999x1", "Hq 99999999999 is out of range"),
    ("1x32/99999999999x1", "Hkv 99999999999 is out of range"),
    ("1x32x2048:k2147483648", "the key length :k2147483648 is out of range"),
    ("1x32x2048:d99999999999", "the head dim :d99999999999 is out of range"),
    ("1x32/8x2048:p99999999999", "the page size :p99999999999 is out of range: at most 4096 (a "
                                 "power of two from 8 to 4096 rows)"),
    ("1x32x" + "9" * 5000, "(5000 digits) is out of range"),  # int() refuses > 4300 digits
    ("32/8x[2147483648]", "the sequence length 2147483648 is out of range"),
    ("32/8x[2048:2147483648]", "the key length 2147483648 is out of range"),
    ("32/8x[8192*99999999999999]", "the count 99999999999999 is out of range: at most 65535"),
    ("32/8x[1*65535,1*65535]", f"a varlen batch holds at most {MAX_SEQS} sequences"),
    ("32/8x[" + ",".join(["1*65535"] * 2000) + "]", "at most 65535 sequences"),  # not built
    ("1x32x1048576", "too large: B*S*Hq*D must stay below 2^31"),
    # the softcap: a plain decimal, finite, > 0, in float32's range
    ("1x32x8192:cap1.23457e+06", "the softcap :cap1.23457e+06 must be a plain decimal number"),
    ("1x32x8192:cap1e-10", "must be a plain decimal number, e.g. :cap50 or :cap0.5 (no sign, "
                           "no exponent)"),
    ("1x32x8192:cap-5", "must be a plain decimal number"),
    ("1x32x8192:cap+5", "must be a plain decimal number"),
    ("1x32x8192:capinf", "must be a plain decimal number"),
    ("1x32x8192:capnan", "must be a plain decimal number"),
    ("1x32x8192:cap", "must be a plain decimal number"),
    ("1x32x8192:cap.5", "must be a plain decimal number"),
    ("1x32x8192:cap0", "the softcap :cap0 must be > 0"),
    ("1x32x8192:cap0.000", "must be > 0"),
    ("1x32x8192:cap0." + "0" * 30 + "1", "is out of range: from 10^-30 to 10^30"),
    ("1x32x8192:cap1" + "0" * 31, "is out of range: from 10^-30 to 10^30"),
    ("1x32x8192:cap" + "9" * 400, "is out of range"),  # float() of it is inf
    # empty options
    ("1x32x8192::d64", "an empty option"),
    ("1x32x8192:", "an empty option"),
    ("1x32x8192:d64: :full", "an empty option"),
    # the grammar's older refusals (from test_problem.py)

        ("", "malformed problem ''"),
        ("4x32", "write BxHq[/Hkv]xS[:dD][:full]"),
        ("4x32x", "write BxHq[/Hkv]xS[:dD][:full]"),
        ("axbxc", "write BxHq[/Hkv]xS[:dD][:full]"),
        ("4x32x-1", "write BxHq[/Hkv]xS[:dD][:full]"),
        ("4*32*8192", "e.g. 4x32x8192, 1x32/8x8192"),
        ("4x32/x8192", "write BxHq[/Hkv]xS[:dD][:full]"),
        ("0x32x128", "B must be a positive integer"),
        ("4x0x128", "Hq must be a positive integer"),
        ("4x32x0", "S must be a positive integer"),
        ("4x32/0x128", "Hkv must be a positive integer (got 0)"),
        ("4x32/5x8192", "Hq=32 must be a multiple of Hkv=5"),
        ("4x8/16x8192", "Hq=8 must be a multiple of Hkv=16"),
        ("4x32x8192:d96", "head dim D=96 is not supported: choose from 64, 128, 256"),
        ("4x32x8192:dx", "unknown option ':dx'"),
        ("4x32x8192:sliding", "unknown option ':sliding' (use :dD for the head dim"),
        ("64x64x1048576", "too large: B*S*Hq*D must stay below 2^31"),
        ("8x64x1048576:d64", "too large"),
]


@pytest.mark.parametrize(("text", "needle"), BAD, ids=[t[:40] for t, _ in BAD])
def test_bad_input_is_one_shape_error_line(text: str, needle: str) -> None:
    with pytest.raises(ShapeError) as ei:
        Problem.parse(text)
    msg = str(ei.value)
    assert needle in msg, msg
    assert "\n" not in msg
    with pytest.raises(ShapeError):  # every path in: as_problem is what the CLI calls
        as_problem(text)


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"window": MAX_WINDOW + 1}, "window must be a number of keys from 1 to 2^30"),
    ({"window": 2**31}, "window must be a number of keys from 1 to 2^30"),
    ({"B": 2**31}, "B=2147483648 is out of range: at most 2147483647"),
    ({"Hq": 2**40, "Hkv": 1}, "Hq=1099511627776 is out of range"),
    ({"S": 2**31}, "S=2147483648 is out of range"),
    ({"Sk": 2**31}, "Sk=2147483648 is out of range"),
    ({"S": 10**5000}, "a 16610-bit number"),  # str() would refuse it
    ({"softcap": float("nan")}, "softcap must be a number from 10^-30 to 10^30"),
    ({"softcap": float("inf")}, "softcap must be a number from 10^-30 to 10^30"),
    ({"softcap": -1.0}, "softcap must be a number"),
    ({"softcap": 1e31}, "softcap must be a number"),
    ({"softcap": 1e-31}, "softcap must be a number"),
    ({"softcap": 10**400}, "softcap must be a number"),  # float() would overflow
])
def test_constructor_checks_the_same_ranges(kwargs: dict, needle: str) -> None:
    fields = {"B": 1, "Hq": 8, "S": 64} | kwargs
    with pytest.raises(ShapeError) as ei:
        Problem(**fields)
    assert needle in str(ei.value) and "\n" not in str(ei.value), str(ei.value)


def test_stored_dicts_out_of_range_are_shape_errors() -> None:
    for d in ({"B": 1, "H": 8, "S": 64, "window": float("inf")},  # int(inf): OverflowError
              {"B": 1, "H": 8, "S": 64, "window": 2**31}, {"B": 2**31, "H": 8, "S": 64},
              {"B": 1, "H": 8, "S": 64, "softcap": 1e300}):
        with pytest.raises(ShapeError):
            as_problem(d)


def test_varlen_lengths_are_int32() -> None:
    with pytest.raises(ShapeError, match="from 0 to 2147483647"):
        Problem.varlen([2**31], 8)
    with pytest.raises(ShapeError, match="from 0 to 2147483647"):
        Problem.varlen([8], 8, seqlens_k=[2**31])


def test_limits_are_the_kernels() -> None:
    """The limits named in the lines are the C ABI's: int32 sizes, kNoWindow = 2^30."""
    assert INT32_MAX == 2**31 - 1 and MAX_WINDOW == 2**30
    params = _paths.cuda_src_dir() / "fa_tune" / "params.cuh"
    if not params.is_file():
        pytest.skip("kernel sources not in this checkout")
    assert re.search(r"kNoWindow\s*=\s*1\s*<<\s*30\b", params.read_text())
    header = params.with_name("fa_tune.h").read_text()
    for field in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "window", "page_size"):
        assert re.search(rf"int32_t {field};", header), field


# ---- the CLI ---------------------------------------------------------------------------------
def test_console_script_duplicate_suffix_one_line(tmp_path: Path) -> None:
    """The installed entry point: a repeated suffix is one stderr line, exit 2, before the
    search opens (or creates) its study."""
    db = tmp_path / "x.db"
    r = subprocess.run(
        [sys.executable, "-c", "from tuner.cli import main; main()", "search", "--trials", "1",
         "--study", "x", "--storage", f"sqlite:///{db}", "--shape", "1x32x8192:cap50:cap30"],
        capture_output=True, text=True, env={**os.environ, "COLUMNS": "80"}, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("fa-tune: error: ")
    assert "the softcap (:cap) is given twice (:cap50 and :cap30)" in r.stderr
    assert not db.exists()
