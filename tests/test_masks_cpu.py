"""The models' masks (issue 36) on the measurement side, on the CPU: the NumPy twin's window,
softcap and sinks against a brute-force definition (fixed and packed, S_q < S_k and S_q > S_k,
sinks above and below the row max, all three together), its BF16-math twin step by step, the
sinks each input set draws (bit for bit the GPU's, at magnitudes that matter), the gate on an
emulated kernel (correct passes; a forgotten or mis-scaled sink and a window one key too wide
fail), the oracle's Python side passing the masks on, and the peers (which express which mask,
FA3's arguments, SDPA's window mask through torch's CPU backend)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tuner.kernel.oracle_module import Masks, OracleModule, masks_of
from tuner.kernel.runtime import KernelError
from tuner.measure import accuracy as A
from tuner.measure import gate_rule as GR
from tuner.measure import oracle as O
from tuner.measure import reference_numpy as RN
from tuner.measure.peers import make_peer
from tuner.measure.peers.base import PeerMasks, Unsupported
from tuner.problem import Problem

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_oracle_cpu import _fa_emulate  # noqa: E402


def _rand(shape: tuple[int, ...], seed: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)


def _direct(q: np.ndarray, k: np.ndarray, v: np.ndarray, b: int, h: int, i: int, causal: bool,
            window: int = 0, softcap: float = 0.0, sink: float | None = None,
            ) -> tuple[np.ndarray, float]:
    """One row by the definitions, in plain float64 loops: keys j <= a (causal) and j >= a - W
    + 1 (window W), a = i + S_k - S_q; scores C tanh(s / C); the sink's exp(sink) in the
    denominator only. A row without keys: O = 0, LSE = sink (or -inf)."""
    sq, sk, hq, d = q.shape[1], k.shape[1], q.shape[2], q.shape[3]
    g = h // (hq // k.shape[2])
    a = i + sk - sq
    keys = [j for j in range(sk) if (not causal or j <= a) and (window <= 0 or j >= a - window + 1)]
    s = [float(np.dot(q[b, i, h].astype(np.float64), k[b, j, g].astype(np.float64)))
         / math.sqrt(d) for j in keys]
    if softcap > 0:
        s = [softcap * math.tanh(x / softcap) for x in s]
    terms = s + ([sink] if sink is not None else [])
    if not terms:
        return np.zeros(d), -math.inf
    m = max(terms)
    w = [math.exp(x - m) for x in s]
    den = sum(w) + (math.exp(sink - m) if sink is not None else 0.0)
    o = sum((wj * v[b, j, g].astype(np.float64) for wj, j in zip(w, keys, strict=True)),
            np.zeros(d)) / den
    return o, m + math.log(den)


SINKS = np.array([20.0, -20.0, 1.0, 3.0], np.float32)  # far above, far below, near the row max
CASES = [  # (id, s_q, s_k, causal, window, softcap, sinks)
    ("window", 20, 20, True, 5, 0.0, None),
    ("window-full", 20, 20, False, 5, 0.0, None),
    ("window-of-one", 9, 9, True, 1, 0.0, None),
    ("window-of-one-full", 9, 9, False, 1, 0.0, None),
    ("window-over-the-sequence", 12, 12, True, 100, 0.0, None),
    ("window-over-the-sequence-full", 12, 12, False, 100, 0.0, None),
    ("more-keys-window", 7, 30, True, 9, 0.0, None),
    ("more-keys-window-full", 7, 30, False, 9, 0.0, None),
    ("more-queries-window-full", 30, 7, False, 3, 0.0, None),
    ("softcap", 11, 11, True, 0, 5.0, None),
    ("sinks", 11, 16, True, 0, 0.0, SINKS),
    ("sinks-full", 11, 16, False, 0, 0.0, SINKS),
    ("all-three", 13, 40, True, 6, 4.0, SINKS),
    ("all-three-full", 40, 13, False, 6, 4.0, SINKS),
]


@pytest.mark.parametrize(("sq", "sk", "causal", "window", "softcap", "sinks"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_numpy_reference_is_the_definition(sq: int, sk: int, causal: bool, window: int,
                                           softcap: float, sinks: np.ndarray | None) -> None:
    # q and k x 4 with a softcap: scores up to ~+-30 logits, far into tanh's saturation.
    big = 4.0 if softcap else 1.0
    q, k = _rand((2, sq, 4, 16), 1) * big, _rand((2, sk, 2, 16), 2) * big
    v = _rand((2, sk, 2, 16), 3, -1, 1)
    kw = {"window": window, "softcap": softcap, "sinks": sinks}
    o, lse = RN.numpy_reference(q, k, v, causal, **kw)
    rows = [(b, h, i) for b in range(2) for h in range(4) for i in range(sq)]
    o_rows, l_rows = RN.numpy_reference_rows(q, k, v, rows, causal, **kw)
    for n, (b, h, i) in enumerate(rows):
        want_o, want_l = _direct(q, k, v, b, h, i, causal, window, softcap,
                                 None if sinks is None else float(sinks[h]))
        np.testing.assert_allclose(o[b, i, h], want_o, rtol=0, atol=1e-12)
        assert lse[b, h, i] == pytest.approx(want_l, abs=1e-12)
        np.testing.assert_allclose(o_rows[n], want_o, rtol=0, atol=1e-12)
        assert l_rows[n] == pytest.approx(want_l, abs=1e-12)
    if sinks is not None:  # the sinks above the row max dominate, those below vanish
        plain = RN.numpy_reference(q, k, v, causal, window=window, softcap=softcap)[1]
        assert np.all(lse[:, 0] > 19.9) and np.allclose(lse[:, 1], plain[:, 1], atol=1e-8)
        assert np.all(lse[:, 2:] > plain[:, 2:])


def test_key_mask_is_the_window() -> None:
    """Row i's keys: its diagonal key a = i + S_k - S_q and the W - 1 before it (causal), or
    from there to the last key (not)."""
    assert RN.key_mask(4, 6, True, 2).astype(int).tolist() == [
        [0, 1, 1, 0, 0, 0], [0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 1]]
    assert RN.key_mask(4, 6, False, 2).astype(int).tolist() == [
        [0, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1]]
    assert np.array_equal(RN.key_mask(5, 5, True, 0), RN.causal_mask(5, 5))
    assert np.array_equal(RN.key_mask(5, 5, True, 99), RN.causal_mask(5, 5))
    # More queries than keys, non-causal: rows with a < 0 see every key (none is "before").
    assert RN.key_mask(6, 2, False, 1).sum(axis=1).tolist() == [2, 2, 2, 2, 2, 1]


@pytest.mark.parametrize("causal", [True, False])
def test_numpy_reference_varlen_masks_each_sequence(causal: bool) -> None:
    """Mixed lengths (an empty sequence, a single query, more keys, fewer keys): each sequence
    its own window (its own offset), the masks of the problem; numpy_reference_for dispatches."""
    qs, ks = [3, 0, 5, 1, 9], [10, 4, 5, 6, 9]
    if not causal:
        qs[3], ks[3] = 8, 3  # more queries than keys
    p = Problem.varlen(qs, 4, Hkv=2, causal=causal, seqlens_k=ks, window=4, softcap=7.0,
                       sinks=True)
    q, k = _rand((1, p.tokens_q, 4, 16), 10) * 3, _rand((1, p.tokens_k, 2, 16), 11) * 3
    v = _rand((1, p.tokens_k, 2, 16), 12, -1, 1)
    sinks = np.array([0.5, 2.0, -1.0, 4.0], np.float32)
    o, lse = RN.numpy_reference_for(p, q, k, v, sinks)
    assert o.shape == (p.tokens_q, 4, 16) and lse.shape == (4, p.tokens_q)
    cq, ck = p.cu_seqlens(), p.cu_seqlens_k()
    for b in range(p.B):
        qb, kb, vb = q[:, cq[b]:cq[b + 1]], k[:, ck[b]:ck[b + 1]], v[:, ck[b]:ck[b + 1]]
        for i in range(cq[b + 1] - cq[b]):
            for h in range(4):
                want_o, want_l = _direct(qb, kb, vb, 0, h, i, causal, 4, 7.0, float(sinks[h]))
                np.testing.assert_allclose(o[cq[b] + i, h], want_o, atol=1e-12)
                assert lse[h, cq[b] + i] == pytest.approx(want_l, abs=1e-12)
    # Without sinks the problem's other masks still apply; the values are ignored.
    o2, _ = RN.numpy_reference_for(Problem.varlen(qs, 4, Hkv=2, causal=causal, seqlens_k=ks,
                                                  window=4, softcap=7.0), q, k, v, sinks)
    assert not np.allclose(o, o2)


def test_a_row_without_keys_gets_its_sink() -> None:
    """O = 0 and LSE = sink (FA3's convention with learnable_sink); -inf without one."""
    q, k, v = _rand((1, 5, 2, 8), 7), _rand((1, 3, 2, 8), 8), _rand((1, 3, 2, 8), 9)
    sinks = np.array([1.5, -0.25], np.float32)
    o, lse = RN.numpy_reference(q, k, v, True, sinks=sinks)
    assert np.all(o[0, :2] == 0) and lse[0, :, :2].tolist() == [[1.5, 1.5], [-0.25, -0.25]]
    o_r, l_r = RN.numpy_reference_rows(q, k, v, [(0, 1, 0)], sinks=sinks)
    assert np.all(o_r == 0) and l_r[0] == -0.25
    bf = RN.numpy_reference_bf16(q, k, v, True, sinks=sinks)
    assert np.all(bf[0, :2] == 0)


# ---- the BF16-math twin -------------------------------------------------------------------------
def test_bf16_reference_with_masks_is_attention_refs_bf16_math() -> None:
    """attention_ref(upcast=False) on one row with all three masks: s / C, tanh of it and C
    times that each rounded to BF16; the window a -inf score; the FP32 sink in the max and the
    sum before P is rounded."""
    rng = np.random.default_rng(0)
    q = RN.f32_to_bf16_bits(rng.uniform(-2, 2, (1, 6, 4, 64)).astype(np.float32))
    k = RN.f32_to_bf16_bits(rng.uniform(-2, 2, (1, 6, 2, 64)).astype(np.float32))
    v = RN.f32_to_bf16_bits(rng.uniform(-1, 1, (1, 6, 2, 64)).astype(np.float32))
    sinks = np.array([0.5, 1.0, 1.5, 2.25], np.float32)
    o = RN.numpy_reference_bf16(q, k, v, True, window=3, softcap=2.0, sinks=sinks)
    qf, kf, vf = (RN.bf16_bits_to_f32(x) for x in (q, k, v))
    b16 = RN._bf16_round
    h, s = 3, 4  # query head 3 reads K/V head 1; row 4 sees keys 2..4
    sc = b16((b16(qf[0, s, h] * np.float32(0.125)).astype(np.float64)
              @ kf[0, 2:5, 1].T.astype(np.float64)).astype(np.float32))
    c = np.float32(2.0)
    sc = b16(c * b16(np.tanh(b16(sc / c)))).astype(np.float64)
    mx = max(sc.max(), float(sinks[h]))
    e = np.exp(sc - mx)
    p = b16((e / (e.sum() + math.exp(float(sinks[h]) - mx))).astype(np.float32))
    want = b16((p.astype(np.float64) @ vf[0, 2:5, 1].astype(np.float64)).astype(np.float32))
    np.testing.assert_array_equal(RN.bf16_bits_to_f32(o[0, s, h]), want)


# ---- the sinks each input set draws -------------------------------------------------------------
SINK_PROBLEMS = [Problem.parse(t) for t in (
    "1x4/2x256:sinks", "1x4/2x256:w32:sinks", "2x4/2x100:k700:sinks", "1x4/2x300:k120:full:sinks",
    "1x4/2x256:k1000:full:w100:sinks", "1x4/2x300:k200:full:w50:sinks", "1x4x256:cap5:sinks",
    "1x2x600:w300:d64:sinks", "1x2x100:k400:d256:sinks", "4/2x[100:300,0:5,50:50]:w20:sinks",
    "4/2x[60:60,30:200,1:9]:full:sinks")]


def test_host_sinks_are_the_gpu_generators_twin() -> None:
    """oracle_fill_uniform_f32 over sink_range with the set's stream: float32 [Hq] in [lo, hi),
    deterministic, its own values per set and per seed."""
    p = Problem.parse("1x8/2x256:sinks")
    for name, stream in RN.SINK_STREAMS.items():
        lo, hi = RN.sink_range(p, name)
        got = RN.host_sinks(p, name, 42)
        assert got.dtype == np.float32 and got.shape == (8,)
        assert np.all(got >= np.float32(lo)) and np.all(got < np.float32(hi))
        want = RN.uniform_in(42, stream, np.arange(8, dtype=np.uint64), lo, hi)
        assert np.array_equal(got, want) and np.array_equal(got, RN.host_sinks(p, name, 42))
        assert not np.array_equal(got, RN.host_sinks(p, name, 43))
    draws = [RN.host_sinks(p, name, 42) for name in RN.SINK_STREAMS]
    assert not np.array_equal(draws[0], draws[1]) and not np.array_equal(draws[1], draws[2])
    assert RN.SINK_STREAMS.keys() == RN.INPUT_SETS.keys()


@pytest.mark.parametrize("problem", SINK_PROBLEMS, ids=str)
def test_sinks_matter_and_stay_near_the_rows(problem: Problem) -> None:
    """seed: the sink takes 1-99% of the denominator of most rows (a forgotten or mis-scaled
    sink shows); every set: no sink exceeds a row's max score by more than the design bound
    (rising: 6 logits, from the construction's lowest row max; seed: its spread), far from the
    ~88 logits where a kernel's exp(sink - max) would overflow in FP32."""
    for name in RN.INPUT_SETS:
        q, k, v = RN.host_inputs(problem, name, 42)
        sinks = RN.host_sinks(problem, name, 42)
        plain = Problem.from_dict({**problem.to_dict(), "sinks": False})
        _, lse = RN.numpy_reference_for(plain, q, k, v)  # the rows' LSE without the sink
        lse = (lse if problem.is_varlen else lse.transpose(1, 0, 2)).reshape(problem.Hq, -1)
        over = sinks[:, None] - _row_max(problem, q, k)
        if name == "seed":
            share = 1 / (1 + np.exp(np.clip(lse - sinks[:, None], -50, 50)))
            assert np.mean((share > 0.01) & (share < 0.99)) > 0.5, problem
            assert over.max() < 20
        elif name == "peaky":  # a row of few keys may score several deviations below 0
            std = problem.softcap if problem.softcap > 0 else RN.PEAKY_STD
            assert over.max() < RN.SINK_SPREAD[1] + 4 * std < 88, (name, over.max())
        else:
            assert over.max() <= RN.RISING_SINK_SPREAD[1] + 1e-4, (name, over.max())


def _row_max(p: Problem, q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """[Hq, rows] the largest (capped) score each query row sees, rows in (b, s) order (a
    packed batch: its query rows)."""
    cq, ck = (p.cu_seqlens(), p.cu_seqlens_k()) if p.is_varlen else ([0, p.S_q], [0, p.S_k])
    out = []
    for b in range(p.B):
        bq, seq = (0, b) if p.is_varlen else (b, 0)
        qs, ks = slice(cq[seq], cq[seq + 1]), slice(ck[seq], ck[seq + 1])
        if qs.stop == qs.start:
            continue
        mask = RN.key_mask(qs.stop - qs.start, ks.stop - ks.start, p.causal, p.window)
        heads = [np.where(mask, RN._cap(RN.scores_f64(q[:, qs], k[:, ks], bq, h), p.softcap),
                          -np.inf).max(axis=1) for h in range(p.Hq)]
        out.append(np.stack(heads))
    return np.concatenate(out, axis=1)


# ---- the gate on an emulated kernel -------------------------------------------------------------
GATE_PROBLEMS = [Problem.parse(t) for t in (
    "1x4/2x256:w32", "1x4/2x256:w32:full", "1x4/2x200:k500:w64", "1x4x256:cap50",
    "1x4x256:cap5", "1x4/2x256:sinks", "1x4/2x256:k400:w40:cap30:sinks",
    "1x4/2x300:k200:full:w50:sinks")]


def _gate_emulated(problem: Problem, input_set: str, **bug: Any) -> GR.SetMetrics:
    """The gate's verdict on the emulated kernel (``bug``: _fa_emulate's masks overridden)."""
    q, k, v = RN.host_inputs(problem, input_set, 42)
    sinks = RN.host_sinks(problem, input_set, 42) if problem.sinks else None
    kw = RN.problem_masks(problem, sinks)
    ref, lse_ref = (x.astype(np.float32) for x in RN.numpy_reference(q, k, v, problem.causal,
                                                                       **kw))
    o, lse = _fa_emulate(q, k, v, 64, problem.causal, True, **{**kw, **bug})
    stats, sums = GR.compare_numpy(RN.f32_to_bf16_bits(o), ref, lse, lse_ref)
    impl, _ = GR.compare_numpy(RN.numpy_reference_bf16(q, k, v, problem.causal, **kw), ref)
    return GR.evaluate(stats, problem, input_set, True, budget=sums,
                       bf16_impl=A.ImplError.from_stats(impl))


@pytest.mark.parametrize("problem", GATE_PROBLEMS, ids=str)
@pytest.mark.parametrize("input_set", ["seed", "rising"])
def test_gate_passes_a_correct_kernel_and_fails_the_mask_bugs(problem: Problem,
                                                              input_set: str) -> None:
    """The emulated correct kernel passes with the usual margins (budget <= 0.6, FA's rule
    well inside, LSE at most 0.05 of its tolerance); a kernel that leaves the sink out, gives
    the natural-log sink to its base-2 softmax (x ln 2), or widens the window by one key
    fails by the budget."""
    good = _gate_emulated(problem, input_set)
    assert good.passed, good.reasons
    assert good.budget_ratio is not None and good.budget_ratio < 0.6
    assert good.fa_rule_ok and good.fa_ratio is not None and good.fa_ratio < 0.6
    assert good.lse_max_abs_err is not None and good.lse_max_abs_err < 0.05 * GR.LSE_ATOL
    bugs: list[dict[str, Any]] = []
    if problem.sinks:
        sinks = RN.host_sinks(problem, input_set, 42)
        bugs += [{"sinks": None}, {"sinks": sinks * np.float32(math.log(2))}]
    if problem.window:
        bugs.append({"window": problem.window + 1})
    for bug in bugs:
        bad = _gate_emulated(problem, input_set, **bug)
        assert not bad.passed and bad.budget_ratio is not None and bad.budget_ratio > 3, (
            list(bug), bad.budget_ratio)


def test_flash_attentions_rule_allows_three_times_with_a_softcap() -> None:
    """FA's tests: rtol = 2, and 3 with a softcap; the gate takes the problem's."""
    assert A.fa_rule_factor(Problem.parse("1x2x64")) == 2.0
    assert A.fa_rule_factor(Problem.parse("1x2x64:cap50")) == 3.0
    assert A.fa_rule_factor(SimpleNamespace(B=1, H=2, S=64)) == 2.0
    stats = GR.OracleStats(o_count=1 * 64 * 2 * 128, o_violations=0, o_nonfinite=0,
                           o_unwritten=0, o_first_violation=GR.NO_VIOLATION, o_ref_nonfinite=0,
                           o_max_abs_err=0.0025, o_sum_sq_err=1e-8, o_sum_sq_ref=1.0)
    impl = A.ImplError(max_abs_err=0.001, rms_err=1e-4)
    plain = GR.evaluate(stats, Problem.parse("1x2x64"), "seed", False, bf16_impl=impl)
    capped = GR.evaluate(stats, Problem.parse("1x2x64:cap50"), "seed", False, bf16_impl=impl)
    assert plain.fa_rule_ok is False and capped.fa_rule_ok is True
    assert capped.fa_ratio == plain.fa_ratio == pytest.approx(2.5)
    assert "3 x 0.001" in A.fa_rule_reason(0.0035, 0.001, 3.0)
    assert GR.rule_dict()["fa_rule_factor_softcap"] == 3.0


# ---- the oracle's Python side -------------------------------------------------------------------
class _Buf:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


def _bufs(p: Problem, sinks: bool = True) -> SimpleNamespace:
    return SimpleNamespace(shape=p, q=_Buf(0x100), k=_Buf(0x200), v=_Buf(0x300),
                           sinks=_Buf(0x400) if sinks else None, cu_q=_Buf(0x500),
                           cu_k=_Buf(0x600), layout_bufs={})


def test_fill_inputs_draws_the_sets_sinks() -> None:
    calls: list[tuple[str, tuple[Any, ...]]] = []

    def recorder(what: str) -> Any:
        return lambda *a: calls.append((what, a))

    orc = SimpleNamespace(**{n: recorder(n) for n in ("gen_seed", "gen_rising", "fill_uniform",
                                                      "fill_uniform_f32")})
    p = Problem.parse("1x8/2x300:k500:w64:sinks")
    for name, stream in RN.SINK_STREAMS.items():
        calls.clear()
        O.fill_inputs(orc, _bufs(p), name, 7, "st")  # type: ignore[arg-type]
        lo, hi = RN.sink_range(p, name)
        assert calls[-1] == ("fill_uniform_f32", (0x400, 8, 7, stream, lo, hi, "st")), name
    calls.clear()
    O.fill_inputs(orc, _bufs(Problem.parse("1x8/2x300:w64")), "seed", 7, None)  # type: ignore[arg-type]
    assert [c[0] for c in calls] == ["gen_seed"]  # no sinks: nothing drawn
    # peaky: Q, K and V from the uniform fill, the amplitude the NumPy twin uses.
    calls.clear()
    capped = Problem.parse("1x8/2x300:k500:cap30")
    O.fill_inputs(orc, _bufs(capped), "peaky", 7, None)  # type: ignore[arg-type]
    a = RN.peaky_amplitude(capped)
    assert a == pytest.approx(np.sqrt(90.0))
    assert [(c[0], c[1][1:]) for c in calls] == [
        ("fill_uniform", (300 * 8 * 128, 7, RN.STREAM_PQ, -a, a, None)),
        ("fill_uniform", (500 * 2 * 128, 7, RN.STREAM_PK, -a, a, None)),
        ("fill_uniform", (500 * 2 * 128, 7, RN.STREAM_PV, -1.0, 1.0, None))]
    with pytest.raises(KernelError, match=r"^buffers of 1x8/2x300:k500:w64:sinks hold no sinks$"):
        O.fill_inputs(orc, _bufs(p, sinks=False), "seed", 7, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["2x4/2x100:k300:w33:cap20:sinks", "4/2x[50:80,0:3,9]:full:w5",
                                  "1x4x64"])
def test_references_get_the_problems_masks(text: str) -> None:
    """reference_for and reference_bf16_for hand the oracle the window, the softcap and the
    sinks' device pointer (0, 0, NULL for a plain problem), fixed length or packed."""
    p = Problem.parse(text)
    bufs = _bufs(p)
    want = Masks(p.window, p.softcap, 0x400 if p.sinks else None)
    assert masks_of(bufs) == want  # type: ignore[arg-type]
    seen: dict[str, Any] = {}
    stub = SimpleNamespace(
        reference=lambda *a, **kw: seen.update(fp32=kw["masks"]),
        reference_varlen=lambda *a, **kw: seen.update(fp32=kw["masks"]),
        _reference_bf16=lambda *a: seen.update(bf16=a[11:14]) or 0,
        _reference_bf16_varlen=lambda *a: seen.update(bf16=a[13:16]) or 0,
        _ok=lambda rc, what: None)
    OracleModule.reference_for(stub, bufs, 1, 2, None)  # type: ignore[arg-type]
    OracleModule.reference_bf16_for(stub, bufs, 3, None)  # type: ignore[arg-type]
    assert seen["fp32"] == want
    assert seen["bf16"] == (p.window, p.softcap, 0x400 if p.sinks else None)
    if p.sinks:
        with pytest.raises(KernelError, match="hold no sinks"):
            masks_of(_bufs(p, sinks=False))  # type: ignore[arg-type]


# ---- the peers ----------------------------------------------------------------------------------
MASKED = [Problem.parse(t) for t in ("1x8/2x1024:w256", "1x8/2x1024:cap50",
                                     "1x8/2x1024:d64:w128:sinks", "8/2x[512:1024,64]:full:w100")]


def test_which_peer_expresses_which_mask() -> None:
    """FA3 takes every mask (window_size, softcap, learnable_sink); cuDNN and the memory-
    efficient backend a window (a boolean mask), not a softcap or sinks; FA2's backend and the
    Triton kernel none: one line each, naming the mask."""
    fa3 = make_peer("fa3")
    assert all(fa3.supports(p) is None for p in MASKED)
    for name in ("cudnn", "mem_efficient"):
        peer = make_peer(name)
        assert peer.supports(Problem.parse("1x8x1024:w256")) is None
        assert peer.supports(Problem.parse("1x8x1024:k2000:full:w256")) is None
    for name, p, needle in (("cudnn", MASKED[1], "logit softcapping"),
                            ("cudnn", MASKED[2], "attention sinks"),
                            ("mem_efficient", Problem.parse("1x8x64:w8:cap5:sinks"),
                             "logit softcapping and attention sinks"),
                            ("fa2", Problem.parse("1x8x64:w8"), "a sliding window"),
                            ("triton", Problem.parse("1x8x64:w8"), "a sliding window"),
                            ("triton", Problem.parse("1x8x64:sinks"), "attention sinks")):
        why = make_peer(name).supports(p) or ""
        assert needle in why and str(p) in why and "\n" not in why, (name, why)
        assert "cannot express" in why
    assert make_peer("cudnn").supports(Problem.parse("1x8x64")) is None  # no mask: unchanged


def test_fa3_gets_the_masks_as_its_interfaces_arguments() -> None:
    """flash_attn.cute.interface: window_size=(W - 1, 0) causal, (W - 1, None) not (None is
    "no limit" there), softcap=C, learnable_sink=the FP32 [Hq] tensor; nothing for a plain
    problem; an installed function without one of them declines the problem in one line."""
    torch = pytest.importorskip("torch")
    from tuner.measure.peers.fa3 import FA3Peer

    sinks = torch.zeros(4)
    assert FA3Peer.mask_args(True, None) == {} and FA3Peer.mask_args(True, PeerMasks()) == {}
    assert FA3Peer.mask_args(True, PeerMasks(window=4096)) == {"window_size": (4095, 0)}
    assert FA3Peer.mask_args(False, PeerMasks(window=1)) == {"window_size": (0, None)}
    got = FA3Peer.mask_args(True, PeerMasks(128, 30.0, sinks))
    assert got == {"window_size": (127, 0), "softcap": 30.0, "learnable_sink": sinks}

    calls: list[dict[str, Any]] = []

    def flash_attn_func(q: Any, k: Any, v: Any, causal: bool = False,
                        window_size: Any = (None, None), learnable_sink: Any = None,
                        softcap: float = 0.0, return_lse: bool = False) -> Any:
        calls.append({"causal": causal, "window_size": window_size, "softcap": softcap,
                      "learnable_sink": learnable_sink})
        return q, None

    def old_func(q: Any, k: Any, v: Any, causal: bool = False, window_size: Any = None,
                 softcap: float = 0.0, return_lse: bool = False) -> Any:
        return q, None

    q = torch.zeros(1, 64, 4, 64, dtype=torch.bfloat16)
    kv = torch.zeros(1, 64, 2, 64, dtype=torch.bfloat16)
    peer = FA3Peer()
    peer._fn = peer._varlen_fn = flash_attn_func
    peer.prepare(q, kv, kv, False, masks=PeerMasks(64, 50.0, sinks))
    assert calls[-1] == {"causal": False, "window_size": (63, None), "softcap": 50.0,
                         "learnable_sink": sinks}
    assert peer.details()["window_size"] == [63, None] and peer.details()["softcap"] == 50.0
    peer.prepare(q, kv, kv, True)  # a plain problem: the call it always was
    assert calls[-1] == {"causal": True, "window_size": (None, None), "softcap": 0.0,
                         "learnable_sink": None}
    peer._fn = peer._varlen_fn = old_func
    with pytest.raises(Unsupported, match=r"^fa3: .*old_func takes no learnable_sink \(") as e:
        peer.prepare(q, kv, kv, True, masks=PeerMasks(sinks=sinks))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("sq", "sk", "causal", "window"),
                         [(9, 9, True, 3), (9, 9, False, 3), (5, 12, True, 4), (5, 12, False, 4),
                          (12, 5, False, 2), (6, 6, True, 100)])
def test_sdpa_peer_gives_the_window_as_a_mask(monkeypatch: pytest.MonkeyPatch, sq: int, sk: int,
                                              causal: bool, window: int) -> None:
    """cuDNN's peer with a window: the boolean mask of exactly the window's keys (checked on
    the CPU through torch's own backend against the float64 reference); a softcap or sinks are
    refused at prepare too, never approximated."""
    torch = pytest.importorskip("torch")
    from contextlib import nullcontext

    from tuner.measure.peers.sdpa import SdpaPeer

    q = torch.from_numpy(_rand((2, sq, 4, 16), 20))
    k = torch.from_numpy(_rand((2, sk, 2, 16), 21))
    v = torch.from_numpy(_rand((2, sk, 2, 16), 22, -1, 1))
    peer = SdpaPeer("cudnn")
    monkeypatch.setattr(peer, "_ctx_manager", nullcontext)  # no CUDA here: torch's CPU backend
    peer.prepare(q, k, v, causal, masks=PeerMasks(window=window))
    want = RN.numpy_reference(q.numpy(), k.numpy(), v.numpy(), causal, window=window)[0]
    np.testing.assert_allclose(peer.run().numpy(), want, atol=1e-5)
    d = peer.details()
    assert d["is_causal"] is False and f"window {window}" in d["attn_mask"]
    for masks in (PeerMasks(softcap=5.0), PeerMasks(sinks=torch.zeros(4))):
        with pytest.raises(Unsupported, match="cannot express a softcap or attention sinks"):
            peer.prepare(q, k, v, causal, masks=masks)
    peer.release()


def test_a_softcap_problem_is_also_gated_on_peaky_inputs() -> None:
    assert O.gate_sets(Problem.parse("1x4x256:cap50"), O.DEFAULT_INPUT_SETS) == (
        "seed", "rising", "peaky")
    assert O.gate_sets(Problem.parse("1x4x256:w64:sinks"), O.DEFAULT_INPUT_SETS) == (
        "seed", "rising")
    assert O.gate_sets(Problem.parse("1x4x256:cap50"), ("peaky", "seed")) == ("peaky", "seed")
