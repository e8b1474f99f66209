"""tuner.problem: the attention problem (B, Hq, Hkv, S, D, causal), its text form and its dict."""

from __future__ import annotations

import pytest

from tuner import store
from tuner.errors import ShapeError
from tuner.problem import (
    SEED_PROBLEMS,
    Problem,
    ProblemClass,
    as_problem,
    class_of,
    describe,
    parse_problems,
)


@pytest.mark.parametrize(
    ("text", "fields"),
    [
        ("4x32x8192", (4, 32, 32, 8192, 128, True)),
        ("1x32/8x8192", (1, 32, 8, 8192, 128, True)),  # Llama-3-8B GQA
        ("2x16/1x4096", (2, 16, 1, 4096, 128, True)),  # MQA
        ("4x32x8192:d64", (4, 32, 32, 8192, 64, True)),
        ("4x16x8192:d256", (4, 16, 16, 8192, 256, True)),
        ("4x32x8192:full", (4, 32, 32, 8192, 128, False)),
        ("1x64/8x8192:d256:full", (1, 64, 8, 8192, 256, False)),
    ],
)
def test_parse_str_round_trip(text: str, fields: tuple) -> None:
    p = Problem.parse(text)
    assert (p.B, p.Hq, p.Hkv, p.S, p.D, p.causal) == fields
    assert str(p) == text  # canonical text is the round trip
    assert Problem.parse(str(p)) == p
    assert Problem.from_dict(p.to_dict()) == p
    assert as_problem(p.to_dict()) == p and as_problem(text) == p and as_problem(p) is p


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        (" 4 x 32 x 8192 ", "4x32x8192"),
        ("4X32X8192", "4x32x8192"),  # the old parser took an upper-case X
        ("4x32/32x8192", "4x32x8192"),  # Hkv = Hq is MHA: not spelled out
        ("4x32x8192:d128", "4x32x8192"),  # the default head dim is not spelled out
        ("4x32x8192:causal", "4x32x8192"),
        ("4x32x8192:full:d64", "4x32x8192:d64:full"),  # options in one order
        ("4x32x8192:noncausal", "4x32x8192:full"),
        ("4x32x8192:D64:FULL", "4x32x8192:d64:full"),
    ],
)
def test_canonical_form(text: str, canonical: str) -> None:
    assert str(Problem.parse(text)) == canonical


def test_old_shapes_keep_their_names() -> None:
    """Study attributes and result files use these names: they must not change."""
    assert [str(p) for p in SEED_PROBLEMS] == ["4x32x4096", "4x32x8192", "4x32x16384"]
    for text in ("4x32x4096", "1x2x256", "2x3x1000", "1x1x1"):
        p = Problem.parse(text)
        assert str(p) == text and p == Problem(p.B, p.H, p.S)
        assert (p.Hkv, p.D, p.causal, p.kind, p.group) == (p.Hq, 128, True, "MHA", 1)


def test_positional_is_the_old_problem_and_h_is_hq() -> None:
    p = Problem(4, 32, 8192)
    assert p == Problem(4, 32, 8192, Hkv=32, D=128, causal=True)
    assert p.H == p.Hq == 32


@pytest.mark.parametrize(
    ("text", "needle"),
    [
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
    ],
)
def test_bad_input_is_one_helpful_sentence(text: str, needle: str) -> None:
    with pytest.raises(ShapeError) as ei:
        Problem.parse(text)
    msg = str(ei.value)
    assert needle in msg, msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"B": 1.5, "Hq": 2, "S": 3}, "B must be a positive integer"),
        ({"B": True, "Hq": 2, "S": 3}, "B must be a positive integer"),
        ({"B": 1, "Hq": 2, "S": 3, "Hkv": -1}, "Hkv must be a positive integer"),
        ({"B": 1, "Hq": 2, "S": 3, "causal": 1}, "causal must be true or false"),
        ({"B": 1, "Hq": 2, "S": 3, "D": 100}, "D=100 is not supported"),
    ],
)
def test_bad_fields_are_shape_errors(kwargs: dict, needle: str) -> None:
    with pytest.raises(ShapeError, match=needle.replace("(", r"\(")):
        Problem(**kwargs)


def test_flops_causal_and_non_causal() -> None:
    causal = Problem.parse("4x32x8192")
    assert causal.flops == 2 * 4 * 32 * 8192 * 8192 * 128  # the seeds' count, not halved
    assert causal.tflops(1.0) == pytest.approx(causal.flops / 1e9)
    full = Problem.parse("4x32x8192:full")
    assert full.flops == 4 * 4 * 32 * 8192 * 8192 * 128 == 2 * causal.flops
    d64 = Problem.parse("4x32x8192:d64")
    assert d64.flops == causal.flops // 2
    # FLOPs count query heads: K/V sharing (GQA) changes memory traffic, not the math.
    assert Problem.parse("1x32/8x8192").flops == Problem.parse("1x32x8192").flops


def test_gqa_grouping() -> None:
    gqa = Problem.parse("1x32/8x8192")
    assert (gqa.kind, gqa.group) == ("GQA", 4)
    mqa = Problem.parse("1x32/1x8192")
    assert (mqa.kind, mqa.group) == ("MQA", 32)
    mha = Problem.parse("1x32x8192")
    assert (mha.kind, mha.group) == ("MHA", 1)


def test_to_dict_carries_every_field_and_h_for_old_readers() -> None:
    d = Problem.parse("1x32/8x8192:d64:full").to_dict()
    assert d == {"B": 1, "H": 32, "Hq": 32, "Hkv": 8, "S": 8192, "D": 64, "causal": False}


def test_from_dict_of_an_old_entry() -> None:
    """results.json entries before problems: {B, H, S, D} (MHA, causal)."""
    old = {"shape": "4x32x8192", "B": 4, "H": 32, "S": 8192, "D": 128, "flops": 1}
    p = Problem.from_dict(old)
    assert p == Problem(4, 32, 8192) and str(p) == "4x32x8192"
    assert Problem.from_dict({"B": 1, "H": 2, "S": 3}) == Problem(1, 2, 3)
    assert store.problem_of(old) == p
    filled = store.with_problem(old)
    assert filled["Hq"] == filled["Hkv"] == 32 and filled["causal"] is True
    assert filled["shape"] == "4x32x8192" and filled["flops"] == 1  # the entry's own values stay
    assert store.problem_of({"shape": "1x32/8x8192"}) == Problem.parse("1x32/8x8192")


def test_as_problem_reads_every_encoding() -> None:
    p = Problem.parse("2x16x1024")
    assert as_problem([2, 16, 1024]) == p  # an old worker request's [B, H, S]
    assert as_problem({"B": 2, "Hq": 16, "S": 1024}) == p
    with pytest.raises(ShapeError, match="needs B, Hq"):
        as_problem({"B": 2})
    with pytest.raises(ShapeError, match="malformed problem"):
        as_problem(3.5)


def test_parse_problems_defaults_to_the_seeds() -> None:
    assert parse_problems(None) == list(SEED_PROBLEMS)
    assert parse_problems([]) == list(SEED_PROBLEMS)
    assert parse_problems(["1x32/8x8192", "4x32x8192:d64"]) == [
        Problem(1, 32, 8192, Hkv=8), Problem(4, 32, 8192, D=64)]


def test_describe_names_what_problems_share() -> None:
    assert describe(SEED_PROBLEMS) == "causal, D=128, MHA"
    assert describe(["1x32/8x4096", "1x32/8x8192"]) == "causal, D=128, GQA (Hq=32, Hkv=8)"
    assert describe(["4x32x8192:full:d64"]) == "non-causal, D=64, MHA"
    assert describe(["4x32x8192", "4x32x8192:d64:full"]) == "causal and non-causal, D=64/128, MHA"
    assert describe([]) == ""


# ---- varlen (packed) batches -------------------------------------------------------------------
def test_varlen_text_form_round_trips() -> None:
    p = Problem.parse("32/8x[8192,4096*2,2048*4,1024*8]")
    assert p.is_varlen and p.B == 15 and p.S == 8192 and p.tokens == 32768
    assert p.seqlens[:4] == (8192, 4096, 4096, 2048) and len(p.seqlens) == 15
    assert str(p) == "32/8x[8192,4096*2,2048*4,1024*8]"
    assert Problem.parse(str(p)) == p and as_problem(p.to_dict()) == p
    q = Problem.parse(" 8 x [ 0 , 1 , 100*2 ] :d64:full")
    assert q.seqlens == (0, 1, 100, 100) and q.D == 64 and not q.causal and q.Hkv == 8
    assert str(q) == "8x[0,1,100*2]:d64:full"
    # A fixed problem's dict has no seqlens key: stored results and studies stay as they were.
    assert "seqlens" not in Problem(4, 32, 8192).to_dict()


def test_varlen_flops_layout_and_class() -> None:
    p = Problem.varlen([8192, 4096, 4096] + [2048] * 4 + [1024] * 8, 32, Hkv=8)
    # The anchors' convention: the sum over sequences of 2*Hq*s^2*D (causal).
    assert p.flops == sum(2 * 32 * s * s * 128 for s in p.seqlens) == 1_030_792_151_040
    assert Problem.varlen([100], 4, causal=False).flops == 4 * 4 * 100 * 100 * 128
    # Memory: one batch of all tokens; the kernel and reference follow cu_seqlens.
    assert p.layout == Problem(1, 32, 32768, Hkv=8)
    assert p.cu_seqlens()[:4] == [0, 8192, 12288, 16384] and p.cu_seqlens()[-1] == 32768
    assert p.problem_class == ProblemClass(128, True, varlen=True)
    # A varlen library serves fixed-length problems too: one class for a mix.
    assert class_of([p, Problem(1, 32, 8192, Hkv=8)]) == ProblemClass(128, True, varlen=True)
    assert class_of([Problem(1, 32, 8192)]).varlen is False
    assert ProblemClass.from_dict(ProblemClass(64, False, True).to_dict()) == ProblemClass(
        64, False, True)
    assert ProblemClass().to_dict() == {"head_dim": 128, "causal": True}


@pytest.mark.parametrize(("text", "needle"), [
    ("32/8x[]", "is not a length"),
    ("32/8x[0,0]", "at least one sequence and one token"),
    ("32/8x[100,x]", "'x' is not a length"),
    ("32/8x[100*0]", "count 0"),
    ("32/8x[100*70000]", "count 70000"),
    ("32/8x[100]:d96", "head dim D=96"),
    ("32/5x[100]", "multiple of Hkv=5"),
])
def test_varlen_bad_text_is_one_clear_line(text: str, needle: str) -> None:
    with pytest.raises(ShapeError) as e:
        Problem.parse(text)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_varlen_needs_its_constructor() -> None:
    with pytest.raises(ShapeError, match=r"Problem\.varlen"):
        Problem(2, 8, 50, seqlens=(100, 20))
    with pytest.raises(ShapeError, match="at most 65535 sequences"):
        Problem.varlen([1] * 65536, 8)
