"""tuner.problem: the attention problem (B, Hq, Hkv, S, D, causal), its text form and its dict."""

from __future__ import annotations

import pytest

from tuner.errors import ShapeError
from tuner.measure import store
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
    assert p.as_fixed == Problem(1, 32, 32768, Hkv=8)
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


# ---- queries over a longer KV (S_q < S_k) -----------------------------------------------------
@pytest.mark.parametrize(("text", "fields"), [
    ("1x32/8x2048:k8192", (1, 32, 8, 2048, 8192, 128, True)),
    ("4x32/8x1024:k4096", (4, 32, 8, 1024, 4096, 128, True)),
    ("1x32/8x512:k16384:d64", (1, 32, 8, 512, 16384, 64, True)),
    ("2x16x300:k100:full", (2, 16, 16, 300, 100, 128, False)),  # non-causal: any lengths
    ("1x8x64:k64", (1, 8, 8, 64, 64, 128, True)),
])
def test_key_length_parse_str_round_trip(text: str, fields: tuple) -> None:
    p = Problem.parse(text)
    assert (p.B, p.Hq, p.Hkv, p.S_q, p.S_k, p.D, p.causal) == fields
    assert (p.S, p.Sk, p.max_seqlen_k) == (p.S_q, p.S_k, p.S_k)
    want = text.replace(":k64", "")  # as many keys as queries: :k is left out
    assert str(p) == want and Problem.parse(str(p)) == p
    assert Problem.from_dict(p.to_dict()) == p and as_problem(p.to_dict()) == p
    assert p.tokens_q == p.tokens == p.B * p.S_q and p.tokens_k == p.B * p.S_k
    assert p.as_fixed is p and p.problem_class == ProblemClass(p.D, p.causal)


def test_key_length_canonical_form_and_old_names() -> None:
    assert str(Problem.parse("1x32/8x2048:full:d64:k8192")) == "1x32/8x2048:k8192:d64:full"
    assert str(Problem.parse("1X32/8X2048:K8192")) == "1x32/8x2048:k8192"
    # Sk 0 (the default) is S: every problem the tool knew keeps its name and its dict.
    p = Problem(4, 32, 8192)
    assert p.Sk == 8192 and p == Problem(4, 32, 8192, Sk=8192) and str(p) == "4x32x8192"
    assert "Sk" not in p.to_dict() and "seqlens_k" not in p.to_dict()
    assert Problem.parse("1x32/8x2048:k8192").to_dict()["Sk"] == 8192
    assert Problem.from_dict({"B": 4, "H": 32, "S": 8192, "D": 128}) == p  # an old dict


def test_key_length_flops_count_the_pairs_the_mask_keeps() -> None:
    """4*Hq*D*pairs; causal pairs counted continuously as s_q*s_k - s_q^2/2 (S_q = S_k: the
    anchors' 2*B*Hq*S^2*D, so every stored TFLOPS stays the same)."""
    p = Problem.parse("1x32/8x2048:k8192")
    assert p.flops == 4 * 32 * 128 * (2048 * 8192 - 2048 * 2048 // 2)
    assert p.tflops(0.392) == pytest.approx(613.57, abs=0.01)  # issue 34's FA3 number
    for s in (1, 7, 4096):
        assert Problem(2, 8, s).flops == 2 * 2 * 8 * s * s * 128
        assert Problem(2, 8, s, causal=False).flops == 4 * 2 * 8 * s * s * 128
    assert Problem.parse("3x4x10:k30:full").flops == 4 * 3 * 4 * 128 * 10 * 30
    assert Problem.parse("1x1x3:k4").flops == 2 * 128 * (2 * 3 * 4 - 9)  # odd s_q^2: exact int
    v = Problem.parse("32/8x[2048:8192,512:4096*2,0:100]")
    assert v.flops == sum(2 * 32 * 128 * (2 * q * k - q * q)
                          for q, k in ((2048, 8192), (512, 4096), (512, 4096)))


@pytest.mark.parametrize(("text", "needle"), [
    ("1x32x4096:k2048", "4096 queries over 2048 keys: a causal mask is aligned bottom-right"),
    ("1x32x4096:k2048", "give at least as many keys as queries, or use :full"),
    ("32x[100:300,300:200]", "sequence 1 of"),
    ("32x[100:0]:full", "100 queries over no key"),
    ("1x32x128:k0", "the key length :k0 must be >= 1"),
    ("32x[100:300]:k500", ":k is for fixed-length problems"),
    ("32x[100:x]", "is not a length, q:k"),
    ("1x32/8x16:k1048576:d256", "B*S_k*Hkv*D must stay below 2^31"),
])
def test_key_length_refusals_are_one_sentence(text: str, needle: str) -> None:
    with pytest.raises(ShapeError) as ei:
        Problem.parse(text)
    assert needle in str(ei.value) and "\n" not in str(ei.value), str(ei.value)


def test_varlen_with_key_lengths() -> None:
    p = Problem.parse("32/8x[2048:8192,512:4096*2]")
    assert p.seqlens == (2048, 512, 512) and p.seqlens_k == (8192, 4096, 4096)
    assert (p.B, p.S_q, p.S_k, p.tokens_q, p.tokens_k) == (3, 2048, 8192, 3072, 16384)
    assert p.cu_seqlens() == [0, 2048, 2560, 3072]
    assert p.cu_seqlens_k() == [0, 8192, 12288, 16384]
    assert str(p) == "32/8x[2048:8192,512:4096*2]" and Problem.parse(str(p)) == p
    assert p.to_dict()["seqlens_k"] == [8192, 4096, 4096] and as_problem(p.to_dict()) == p
    # Buffers are sized per tensor: Q/O by the query rows, K/V by the key rows.
    assert p.as_fixed == Problem(1, 32, 3072, Hkv=8, Sk=16384)
    assert p.problem_class == ProblemClass(128, True, varlen=True)  # no class of its own
    # q = k entries print plainly; a mix round-trips; plain lengths keep meaning q = k.
    m = Problem.parse("8x[100,50:60,7:7*2]:full")
    assert str(m) == "8x[100,50:60,7*2]:full" and m.seqlens_k == (100, 60, 7, 7)
    plain = Problem.parse("32/8x[8192,4096*2]")
    assert plain.seqlens_k == plain.seqlens and "seqlens_k" not in plain.to_dict()
    assert plain == Problem.varlen([8192, 4096, 4096], 32, Hkv=8, seqlens_k=[8192, 4096, 4096])
    # A sequence with keys but no queries is allowed (nothing to compute).
    assert Problem.parse("4x[0:100,10:20]").tokens_q == 10
    with pytest.raises(ShapeError, match="one key length per sequence"):
        Problem.varlen([10, 20], 4, seqlens_k=[30])
    with pytest.raises(ShapeError, match=r"Problem\.varlen"):
        Problem(2, 4, 20, seqlens=(10, 20), Sk=99, seqlens_k=(30, 40))


# ---- memory layouts (q, k, v as views of a fused QKV tensor, K/V as a [B, H, S, D] cache) -----
@pytest.mark.parametrize(("text", "fields"), [
    ("1x32/8x8192:qkv", (1, 32, 8, 8192, 8192, 128, True, "qkv")),
    ("2x8/2x1000:qkv", (2, 8, 2, 1000, 1000, 128, True, "qkv")),
    ("1x32/8x2048:k8192:bhsd", (1, 32, 8, 2048, 8192, 128, True, "bhsd")),
    ("1x8/2x333:k1000:bhsd", (1, 8, 2, 333, 1000, 128, True, "bhsd")),
    ("4x16x512:d64:full:qkv", (4, 16, 16, 512, 512, 64, False, "qkv")),
    ("1x8/1x100:k300:d256:full:bhsd", (1, 8, 1, 100, 300, 256, False, "bhsd")),
])
def test_layout_parse_str_round_trip(text: str, fields: tuple) -> None:
    p = Problem.parse(text)
    assert (p.B, p.Hq, p.Hkv, p.S_q, p.S_k, p.D, p.causal, p.layout) == fields
    assert str(p) == text and Problem.parse(str(p)) == p
    assert p.to_dict()["layout"] == p.layout
    assert Problem.from_dict(p.to_dict()) == p and as_problem(p.to_dict()) == p
    assert store.problem_of({"shape": text, **p.to_dict()}) == p
    # Strides are run-time arguments: the layout is no part of what a library is built for.
    assert p.problem_class == ProblemClass(p.D, p.causal)
    # The flops are the attention's, whatever the memory layout.
    dense = Problem(p.B, p.Hq, p.S_q, Hkv=p.Hkv, D=p.D, causal=p.causal, Sk=p.S_k)
    assert p.flops == dense.flops and p != dense and hash(p) != hash(dense)


def test_layout_canonical_form_and_default() -> None:
    # One order: :k, :d, :full, then the layout, whatever order they came in.
    p = Problem.parse("1x32/8x2048:bhsd:full:k8192:d64")
    assert str(p) == "1x32/8x2048:k8192:d64:full:bhsd"
    assert str(Problem.parse("1X32/8X8192:QKV")) == "1x32/8x8192:qkv"
    # bshd is the default: never printed, never stored, so every name and dict stays as it was.
    p = Problem.parse("4x32x8192:bshd")
    assert p == Problem(4, 32, 8192) and p.layout == "bshd" and str(p) == "4x32x8192"
    assert "layout" not in p.to_dict() and "layout" not in Problem.parse("1x32/8x8192").to_dict()
    assert Problem.from_dict({"B": 4, "H": 32, "S": 8192, "D": 128}).layout == "bshd"
    # A compare of the fused layout must not share the dense problem's buffers (Bench keys on it).
    keys = {Problem.parse("1x32/8x8192"): "dense", Problem.parse("1x32/8x8192:qkv"): "fused"}
    assert len(keys) == 2


@pytest.mark.parametrize(("text", "needle"), [
    ("1x32/8x2048:k8192:qkv", "as many keys as queries (got 2048 queries over 8192 keys)"),
    ("1x32/8x2048:k8192:qkv", "drop :k or use :bhsd"),
    ("32/8x[100,200]:qkv", ":qkv is for fixed-length problems"),
    ("32/8x[100:300]:bhsd", ":bhsd is for fixed-length problems"),
    ("1x32x100:qkv:bhsd", "give one layout (:qkv and :bhsd)"),
    ("1x32x100:nhd", "unknown option ':nhd'"),
    ("1x32x100:nhd", ":qkv or :bhsd for the memory layout"),
])
def test_layout_refusals_are_one_sentence(text: str, needle: str) -> None:
    with pytest.raises(ShapeError) as ei:
        Problem.parse(text)
    assert needle in str(ei.value) and "\n" not in str(ei.value), str(ei.value)


def test_layout_field_refusals() -> None:
    with pytest.raises(ShapeError, match="layout 'nchw' is not one of bshd, qkv, bhsd"):
        Problem(1, 4, 64, layout="nchw")
    with pytest.raises(ShapeError, match="as many keys as queries"):
        Problem(1, 4, 64, Sk=128, layout="qkv")
    with pytest.raises(ShapeError, match="fixed-length batches"):
        Problem(2, 4, 20, seqlens=(10, 20), layout="bhsd")


def test_describe_names_a_layout() -> None:
    assert describe(["1x32/8x8192:qkv"]) == (
        "causal, D=128, GQA (Hq=32, Hkv=8), q, k, v views of one fused QKV tensor "
        "[B, S, Hq+2Hkv, D]")
    assert describe(["1x32/8x2048:k8192:bhsd"]).endswith(
        "k, v views of [B, Hkv, S_k, D] memory (a KV cache)")
    assert describe(["1x32/8x8192", "1x32/8x8192:qkv"]).endswith(", layouts bshd/qkv")
    assert describe(["1x32/8x8192", "1x32/8x4096"]) == "causal, D=128, GQA (Hq=32, Hkv=8)"


# ---- the models' masks (issue 36) --------------------------------------------------------------
def _pairs_brute(sq: int, sk: int, causal: bool, window: int) -> int:
    off, n = sk - sq, 0
    for i in range(sq):
        a = i + off
        n += sum(1 for j in range(sk)
                 if (j <= a or not causal) and (window == 0 or j >= a - window + 1))
    return n


@pytest.mark.parametrize("text", ["1x32/8x16384:w4096", "1x64/8x8192:d64:w128:sinks",
                                  "1x16/8x8192:d256:w4096:cap50", "2x8x512:k2048:full:w100",
                                  "32/8x[2048:8192,512]:w128", "1x8x256:cap30.5:sinks:bhsd"])
def test_mask_syntax_round_trips(text: str) -> None:
    p = Problem.parse(text)
    assert str(p) == text and Problem.parse(str(p)) == p
    assert Problem.from_dict(p.to_dict()) == p
    assert p.problem_class == ProblemClass(p.D, p.causal, p.is_varlen, window=p.window > 0,
                                           softcap=p.softcap > 0, sinks=p.sinks)
    assert ProblemClass.from_dict(p.problem_class.to_dict()) == p.problem_class


def test_masks_print_after_the_mask_in_one_order() -> None:
    assert str(Problem.parse("1x8x512:sinks:cap50:w64:full")) == "1x8x512:full:w64:cap50:sinks"
    assert Problem.parse("1x8x512").to_dict() == Problem(1, 8, 512).to_dict()  # no new keys
    assert "window" not in ProblemClass().to_dict()


@pytest.mark.parametrize("sq,sk,causal,w", [(7, 7, True, 3), (5, 20, True, 8), (16, 16, False, 4),
                                            (9, 4, False, 2), (3, 3, True, 100), (12, 12, True, 1)])
def test_window_flops_count_the_kept_pairs(sq: int, sk: int, causal: bool, w: int) -> None:
    p = Problem(1, 2, sq, Sk=sk, D=64, causal=causal, window=w)
    assert p.flops == 4 * 2 * 64 * _pairs_brute(sq, sk, causal, w)


def test_window_flops_match_fa3s_figure() -> None:
    # Issue 36: FA3 at 0.146 ms on a 128-key window, 1x64/8x8192:d64, is ~118 TFLOPS.
    assert Problem.parse("1x64/8x8192:d64:w128").tflops(0.146) == pytest.approx(117, abs=1)


@pytest.mark.parametrize("text,needle", [
    ("1x8x512:w0", "window :w0 must be >= 1"),
    ("1x8x512:cap0", "softcap :cap0 must be > 0"),
    ("1x8x512:sink", "unknown option ':sink'"),
])
def test_bad_masks_are_one_line(text: str, needle: str) -> None:
    with pytest.raises(ShapeError) as e:
        Problem.parse(text)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_classes_of_masked_problems() -> None:
    plain, win = Problem.parse("1x8x512"), Problem.parse("1x8x512:w64:sinks")
    assert class_of([plain, win]) == ProblemClass(128, True, window=True, sinks=True)
    with pytest.raises(ShapeError, match="mix softcapped"):
        class_of([plain, Problem.parse("1x8x512:cap50")])
    pc = ProblemClass(128, True, window=True)
    assert pc.serves(plain) == "" and pc.serves(Problem.parse("1x8x512:w64")) == ""
    assert "without sinks" in pc.serves(win)
    assert "with softcapping" in ProblemClass(128, True, softcap=True).serves(plain)
    assert "window" in describe([win]) and "sinks" in describe([win])


# ---- a paged KV cache (issue 37) ----------------------------------------------------------------
@pytest.mark.parametrize("text", ["4x32/8x2048:k8192:p64", "32/8x[2048:8192,512:4096*2,0:100]:p16",
                                  "3x4x100:k300:d64:full:p8", "2x4x77:k4096:w128:sinks:p256"])
def test_a_paged_problems_pages(text: str) -> None:
    """Every key of every sequence is in exactly one page copy or a shared page; pages are used
    once (shared ones by two sequences); the table points into the pool; the text round-trips."""
    import numpy as np

    p = Problem.parse(text)
    assert str(p) == text and Problem.parse(str(p)) == p and Problem.from_dict(p.to_dict()) == p
    assert p.is_paged and p.device_scheduled and p.problem_class.paged and p.problem_class.varlen
    pg = p.pages
    lens = p.seqlens_k or (p.Sk,) * p.B
    starts = p.cu_seqlens_k()[:-1] if p.seqlens else [b * p.Sk for b in range(p.B)]
    assert pg.block_table.dtype == np.int32 and pg.block_table.shape[0] == p.B
    assert pg.max_pages == max(1, max(-(-k // p.page_size) for k in lens))
    used = [c.page for c in pg.copies]
    assert len(set(used)) == len(used) == pg.num_pages or not used  # each page written once
    covered = sum(c.rows for c in pg.copies) + sum(r for _, _, r in pg.shared)
    assert covered == sum(lens)
    for b, (k, s0) in enumerate(zip(lens, starts, strict=True)):
        for j in range(-(-k // p.page_size)):
            page = int(pg.block_table[b, j])
            assert 0 <= page < pg.num_pages
            src = next((c.src_row for c in pg.copies if c.page == page), None)
            if (starts[0], s0 + j * p.page_size, p.page_size) in pg.shared:
                assert page == pg.block_table[0, 0]  # the shared prefix page
            else:
                assert src == s0 + j * p.page_size
    assert p.view("k").buffer == "k_pages" and p.view("k").dims[:2] == (pg.num_pages, p.page_size)
    assert p.layout_buffers()["v_pages"] == pg.num_pages * p.page_size * p.Hkv * p.D


def test_odd_sequences_share_the_first_page() -> None:
    p = Problem.parse("4x8x64:k1000:p128")
    t = p.pages.block_table
    assert t[1, 0] == t[0, 0] == t[3, 0] and t[2, 0] != t[0, 0]
    assert len(p.pages.shared) == 2
    # The page order is a property of the problem: the same every time, another for another.
    assert (Problem.parse("4x8x64:k1000:p128").pages.block_table == t).all()


@pytest.mark.parametrize(("text", "needle"), [
    ("1x4x100:p12", "power of two from 8 to 4096"),
    ("1x4x100:p4", "power of two from 8 to 4096"),
    ("1x4x100:p0", "must be >= 1 row"),
    ("1x4x100:p64:qkv", "has its own layout"),
])
def test_bad_page_sizes_are_one_line(text: str, needle: str) -> None:
    with pytest.raises(ShapeError, match=needle) as ei:
        Problem.parse(text)
    assert "\n" not in str(ei.value)


def test_paged_classes() -> None:
    paged, plain = Problem.parse("1x8x64:k512:p16"), Problem.parse("1x8x64")
    pc = class_of([paged, plain])  # a paged library's fixed-length kernel runs plain problems
    assert pc.paged and pc.varlen and pc.serves(plain) == "" and pc.serves(paged) == ""
    assert "without varlen and paged" in plain.problem_class.serves(paged)
    packed = Problem.parse("8x[100,200]")
    assert "paged KV cache" in pc.serves(packed)
    with pytest.raises(ShapeError, match="mix packed K/V"):
        class_of([paged, packed])
    assert ProblemClass.from_dict(pc.to_dict()) == pc and pc.to_dict()["paged"] is True
