"""tuner.measure.reference_numpy with S_q queries over S_k keys: the float64 reference against
a direct per-row formula (bottom-right causal and non-causal, fixed length and packed), and the
NumPy twin of the generators (shapes, which stream feeds which tensor, the rising property)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tuner.measure import reference_numpy as RN
from tuner.problem import Problem


def _direct(q: np.ndarray, k: np.ndarray, v: np.ndarray, b: int, h: int, i: int,
            causal: bool) -> tuple[np.ndarray, float]:
    """One row by the definition: softmax over the keys j <= i + S_k - S_q (causal) or all,
    in plain float64 loops; query head h reads K/V head h // (Hq / Hkv)."""
    sq, sk, hq, d = q.shape[1], k.shape[1], q.shape[2], q.shape[3]
    g = h // (hq // k.shape[2])
    keys = [j for j in range(sk) if not causal or j <= i + sk - sq]
    s = [float(np.dot(q[b, i, h].astype(np.float64), k[b, j, g].astype(np.float64)))
         / math.sqrt(d) for j in keys]
    m = max(s)
    w = [math.exp(x - m) for x in s]
    tot = sum(w)
    o = sum(wj * v[b, j, g].astype(np.float64) for wj, j in zip(w, keys, strict=True)) / tot
    return o, m + math.log(tot)


def _rand(shape: tuple[int, ...], seed: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("sq", "sk"), [(5, 12), (1, 9), (7, 7), (16, 17)])
def test_numpy_reference_is_the_direct_formula(causal: bool, sq: int, sk: int) -> None:
    q, k, v = _rand((2, sq, 4, 16), 1), _rand((2, sk, 2, 16), 2), _rand((2, sk, 2, 16), 3, -1, 1)
    o, lse = RN.numpy_reference(q, k, v, causal)
    assert o.shape == (2, sq, 4, 16) and lse.shape == (2, 4, sq)
    rows = [(b, h, i) for b in range(2) for h in range(4) for i in range(sq)]
    o_rows, l_rows = RN.numpy_reference_rows(q, k, v, rows, causal=causal)
    for n, (b, h, i) in enumerate(rows):
        want_o, want_l = _direct(q, k, v, b, h, i, causal)
        np.testing.assert_allclose(o[b, i, h], want_o, rtol=0, atol=1e-12)
        assert lse[b, h, i] == pytest.approx(want_l, abs=1e-12)
        np.testing.assert_allclose(o_rows[n], want_o, rtol=0, atol=1e-12)
        assert l_rows[n] == pytest.approx(want_l, abs=1e-12)


def test_bottom_right_alignment() -> None:
    """Causal S_q < S_k: the last query row sees every key (as non-causal does), the first
    sees S_k - S_q + 1 of them; with S_q = S_k the mask is the lower triangle."""
    assert np.array_equal(RN.causal_mask(4, 4), np.tril(np.ones((4, 4), dtype=bool)))
    m = RN.causal_mask(3, 8)
    assert m.sum(axis=1).tolist() == [6, 7, 8]
    q, k, v = _rand((1, 3, 2, 8), 4), _rand((1, 8, 2, 8), 5), _rand((1, 8, 2, 8), 6)
    oc, lc = RN.numpy_reference(q, k, v, True)
    of, lf = RN.numpy_reference(q, k, v, False)
    np.testing.assert_allclose(oc[:, -1], of[:, -1], atol=1e-12)
    np.testing.assert_allclose(lc[:, :, -1], lf[:, :, -1], atol=1e-12)
    assert not np.allclose(oc[:, 0], of[:, 0])
    # Top-left alignment (what SDPA's is_causal does) would be another mask: row 0 sees key 0.
    assert m[0].tolist() == [True] * 6 + [False] * 2


def test_a_row_without_keys_is_zero_with_minus_infinite_lse() -> None:
    """The kernel's convention (a causal S_q > S_k, which Problem refuses)."""
    q, k, v = _rand((1, 5, 1, 8), 7), _rand((1, 3, 1, 8), 8), _rand((1, 3, 1, 8), 9)
    o, lse = RN.numpy_reference(q, k, v, True)
    assert np.all(o[0, :2] == 0) and np.all(np.isneginf(lse[0, 0, :2]))
    assert np.isfinite(lse[0, 0, 2:]).all()
    o_r, l_r = RN.numpy_reference_rows(q, k, v, [(0, 0, 1), (0, 0, 4)])
    assert np.all(o_r[0] == 0) and l_r[0] == -math.inf
    np.testing.assert_allclose(o_r[1], o[0, 4, 0], atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_numpy_reference_varlen_is_each_sequence_on_its_own(causal: bool) -> None:
    p = Problem.varlen([3, 0, 5, 1], 4, Hkv=2, causal=causal,  # its lengths only
                       seqlens_k=[10, 4, 5, 6])
    q, k, v = (_rand((1, p.tokens_q, 4, 16), 10), _rand((1, p.tokens_k, 2, 16), 11),
               _rand((1, p.tokens_k, 2, 16), 12, -1, 1))
    cq, ck = p.cu_seqlens(), p.cu_seqlens_k()
    o, lse = RN.numpy_reference_varlen(q, k, v, cq, ck, causal)
    assert o.shape == (p.tokens_q, 4, 16) and lse.shape == (4, p.tokens_q)
    for b in range(p.B):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        for i in range(cq[b + 1] - cq[b]):
            for h in range(4):
                want_o, want_l = _direct(q[:, qs], k[:, ks], v[:, ks], 0, h, i, causal)
                np.testing.assert_allclose(o[cq[b] + i, h], want_o, atol=1e-12)
                assert lse[h, cq[b] + i] == pytest.approx(want_l, abs=1e-12)
    # The packed [total, H, D] form and the layout's [1, total, H, D] form agree.
    o2, l2 = RN.numpy_reference_varlen(q[0], k[0], v[0], cq, ck, causal)
    assert np.array_equal(o, o2) and np.array_equal(lse, l2)


# ---- the generators ---------------------------------------------------------------------------
@pytest.mark.parametrize("input_set", ["seed", "rising", "rising_fwd"])
def test_generators_split_queries_from_keys(input_set: str) -> None:
    """Q depends on S_q only, K and V on S_k only (each tensor's own flat index; the trend is
    over the keys, c2 per query row): 1x4/2x64:k256 is Q of 1x4/2x64 over K, V of 1x4/2x256."""
    q, k, v = RN.host_inputs(Problem.parse("1x4/2x64:k256"), input_set, 42)
    assert q.shape == (1, 64, 4, 128) and k.shape == v.shape == (1, 256, 2, 128)
    q_short = RN.host_inputs(Problem.parse("1x4/2x64"), input_set, 42)[0]
    _, k_long, v_long = RN.host_inputs(Problem.parse("1x4/2x256"), input_set, 42)
    assert np.array_equal(q, q_short)
    assert np.array_equal(k, k_long) and np.array_equal(v, v_long)


@pytest.mark.parametrize("problem", [Problem.parse("1x4/2x100:k700"),
                                     Problem.parse("2x2x64:k320:d64"),
                                     Problem.parse("1x4/1x150:k400:d256:full"),
                                     Problem.parse("1x2x40:k600:full")], ids=str)
def test_rising_set_rises_with_more_keys_than_queries(problem: Problem) -> None:
    """Bottom-right rows see a key prefix 0 .. i + S_k - S_q: a reverse walk from the tile of
    its last key rises at every tile by the construction's margin, causal or not."""
    q, k, _ = RN.host_inputs(problem, "rising", 42)
    margin = RN.rising_min_rise(problem.D)
    for block_n in (64, 80, 128, 176):
        assert RN.rising_failures(q, k, block_n, reverse=True, min_rise=margin - 1e-9,
                                  causal=problem.causal) == 0, block_n
    assert RN.rising_failures(q, k, 64, reverse=False, causal=problem.causal) > 0
    qf, kf, _ = RN.host_inputs(problem, "rising_fwd", 42)
    assert RN.rising_failures(qf, kf, 64, reverse=True, causal=problem.causal) > 0


def test_rising_set_of_a_packed_batch_rises_per_sequence() -> None:
    """A packed batch's keys are one layout of S_k = total_k rows, but each sequence's keys are a
    trend of their own, so every sequence rises on its own."""
    p = Problem.varlen([60, 0, 130, 20], 4, Hkv=2, seqlens_k=[200, 30, 130, 333])
    q, k, _ = RN.host_inputs(p, "rising", 42)
    assert q.shape == (1, p.tokens_q, 4, 128) and k.shape == (1, p.tokens_k, 2, 128)
    margin = RN.rising_min_rise(128)
    cq, ck = p.cu_seqlens(), p.cu_seqlens_k()
    for b in range(p.B):
        if cq[b + 1] == cq[b]:
            continue
        qs, ks = q[:, cq[b]:cq[b + 1]], k[:, ck[b]:ck[b + 1]]
        for block_n in (64, 128):
            assert RN.rising_failures(qs, ks, block_n, reverse=True,
                                      min_rise=margin - 1e-9) == 0, (b, block_n)


def _trend(k: np.ndarray) -> np.ndarray:
    """[B, S_k, Hkv] int64: t = 256 hi + lo from K's dims 0 and 1 (exact small integers)."""
    kf = RN.bf16_bits_to_f32(k).astype(np.int64)
    return 256 * kf[..., 0] + kf[..., 1]


# 8 prompts, 55552 packed keys: over RISING_MAX_S in all, each sequence under it.
MIXED = ("32/8x[512,1024:5120,2048:10240,4096:6144,8192,768:6912,3072:4096,"
         "6144:14336]")
# Small enough for float64 tile walks, over 32768 keys in all; an empty sequence of each kind.
OVER_32K = Problem.varlen([64, 0, 48, 1, 0], 2, Hkv=1, D=64,
                          seqlens_k=[20000, 7, 16000, 300, 0])


@pytest.mark.parametrize("input_set", ["rising", "rising_fwd"])
def test_packed_trend_is_per_sequence_beyond_the_total_bound(input_set: str) -> None:
    """K's trend restarts in every sequence (its own index s and key count Sk_b: t = 4 (Sk_b // 2
    - s) + jit reversed, 4 (s - Sk_b // 2) + jit forward), so a batch of 36307 keys stays exact in
    BF16 and every sequence rises by the construction's margin on the walk its set is for."""
    p = OVER_32K
    assert p.tokens_k > RN.RISING_MAX_S
    q, k, _ = RN.host_inputs(p, input_set, 42)
    t = _trend(k)[0, :, 0]
    kf = RN.bf16_bits_to_f32(k)[0, :, 0, :2]
    assert np.abs(kf[:, 0]).max() <= 256 and kf[:, 1].min() >= 0 and kf[:, 1].max() <= 255
    reverse = RN.INPUT_SETS[input_set][1] < 0
    cq, ck = p.cu_seqlens(), p.cu_seqlens_k()
    margin = RN.rising_min_rise(p.D)
    for b, n in enumerate(p.seqlens_k):
        s = np.arange(n)
        base = 4 * (n // 2 - s) if reverse else 4 * (s - n // 2)
        jit = t[ck[b]:ck[b + 1]] - base
        assert jit.min(initial=0) >= 0 and jit.max(initial=0) <= 3, b
        if cq[b + 1] == cq[b]:
            continue
        qs, ks = q[:, cq[b]:cq[b + 1]], k[:, ck[b]:ck[b + 1]]
        if reverse:
            for block_n in (64, 176):
                assert RN.rising_failures(qs, ks, block_n, reverse=True,
                                          min_rise=margin - 1e-9) == 0, (b, block_n)
        else:  # forward: every full tile rises; only the short diagonal tile may not
            assert RN.rising_failures(qs, ks, 128, reverse=False,
                                      min_rise=margin - 1e-9) <= qs.shape[1], b


@pytest.mark.parametrize("input_set", sorted(RN.INPUT_SETS))
@pytest.mark.parametrize(("packed", "fixed"), [
    (Problem.varlen([100], 4, Hkv=2, seqlens_k=[300]), Problem.parse("1x4/2x100:k300")),
    (Problem.varlen([77], 2, D=64, causal=False), Problem.parse("1x2x77:d64:full")),
    (Problem.varlen([30], 4, Hkv=1, D=256, seqlens_k=[513]),
     Problem.parse("1x4/1x30:k513:d256")),
], ids=str)
def test_a_packed_batch_of_one_sequence_is_the_fixed_problem(input_set: str, packed: Problem,
                                                             fixed: Problem) -> None:
    """One sequence from key row 0: its trend index, key count and every random index are the
    fixed problem's, so Q, K and V are the same bits."""
    for a, b in zip(RN.host_inputs(packed, input_set, 42), RN.host_inputs(fixed, input_set, 42),
                    strict=True):
        assert a.shape == b.shape and np.array_equal(a, b)


def test_packed_sequences_share_the_trend_not_the_noise() -> None:
    """Two sequences of equal lengths: the same trend up to the jitter, but their noise (the
    jitter, K's and V's other dims, Q's c2) is keyed by the packed rows, so it differs."""
    p = Problem.varlen([16, 16], 2, Hkv=1, seqlens_k=[256, 256])
    q, k, v = RN.host_inputs(p, "rising", 42)
    t = _trend(k)[0, :, 0]
    assert np.abs(t[:256] - t[256:]).max() <= 3 and not np.array_equal(t[:256], t[256:])
    assert not np.array_equal(k[0, :256, :, 2:], k[0, 256:, :, 2:])
    assert not np.array_equal(v[0, :256], v[0, 256:])
    assert not np.array_equal(q[0, :16, :, :2], q[0, 16:, :, :2])  # c2 per packed query row


# Pinned with the generator before the per-sequence trend (oracle ABI 8): fixed-length
# problems keep their bits (sha256 of Q, K, V's bytes, first 16 hex digits).
FIXED_DIGESTS = {
    ("1x4/2x100:k700", "rising"): "266e66fffdc0493c",
    ("1x4/2x100:k700", "rising_fwd"): "de58bb0fc59f0de7",
    ("2x2x64:k320:d64", "rising"): "f822ef0efebc09a1",
    ("1x4/1x150:k400:d256:full", "rising"): "a45aaf2971f21959",
    ("3x4/2x130:k131", "rising_fwd"): "b25da94c90f1de8d",
    ("2x3x256", "seed"): "1af231b32bb6c7bd",
}


@pytest.mark.parametrize(("text", "input_set"), sorted(FIXED_DIGESTS), ids=str)
def test_fixed_problems_keep_their_bits(text: str, input_set: str) -> None:
    import hashlib

    h = hashlib.sha256()
    for a in RN.host_inputs(Problem.parse(text), input_set, 42):
        h.update(a.tobytes())
    assert h.hexdigest()[:16] == FIXED_DIGESTS[(text, input_set)]


def test_host_inputs_ranges_and_the_key_bound() -> None:
    q, k, v = RN.host_inputs(Problem.parse("2x4/2x10:k50:d64"), "seed", 3)
    assert q.shape == (2, 10, 4, 64) and k.shape == v.shape == (2, 50, 2, 64)
    qf, vf = RN.bf16_bits_to_f32(q), RN.bf16_bits_to_f32(v)
    assert qf.min() >= -2 and qf.max() <= 2 and vf.min() >= -1 and vf.max() <= 1
    RN.check_input_set("rising", Problem.parse("1x1x16:k32768"))
    with pytest.raises(RN.FaTuneError, match=r"^input set 'rising' supports S_k <= 32768 key "
                                             r"rows \(got 32769\)$"):
        RN.check_input_set("rising", Problem.parse("1x1x16:k32769"))


def test_the_rising_key_bound_is_per_sequence() -> None:
    """A packed batch: each sequence's keys <= 32768, whatever the total; one sequence over it
    is refused in one line naming it."""
    for name in ("rising", "rising_fwd", "seed"):
        RN.check_input_set(name, Problem.parse(MIXED))
        RN.check_input_set(name, Problem.varlen([10, 10], 1, seqlens_k=[32768, 32768]))
    RN.check_input_set("seed", Problem.varlen([10, 10], 1, seqlens_k=[50, 32769]))
    for name in ("rising", "rising_fwd"):
        with pytest.raises(RN.FaTuneError, match=rf"^input set '{name}' supports S_k <= 32768 "
                           r"key rows per sequence \(sequence 1 has 32769; 1 over\)$"):
            RN.check_input_set(name, Problem.varlen([10, 10, 3], 1,
                                                    seqlens_k=[20000, 32769, 3]))


@pytest.mark.parametrize("input_set", ["rising", "rising_fwd"])
@pytest.mark.parametrize("text", ["[64:20000,0:7,48:16000,1:300,0]:d64",
                                  "[64:20000,48:16000,10:300]:d64:full:w100",
                                  "[100:300,0:5,50:50]:w20", "[60:60,30:200,1:9]:full"])
def test_sink_range_is_the_lowest_over_each_sequences_trend(input_set: str, text: str) -> None:
    """A packed batch's sinks sit on its lowest row max, each sequence reasoned as the fixed
    problem it is: the batch's range is the lowest of its sequences' own, and a lower bound on
    every row max the twin's inputs give (near the lowest)."""
    p = Problem.parse("2/1x" + text + ":sinks")
    ranges = [RN.sink_range(Problem(1, p.Hq, sq, Hkv=p.Hkv, D=p.D, causal=p.causal, Sk=sk,
                                    window=p.window, sinks=True), input_set)
              for sq, sk in zip(p.seqlens, p.seqlens_k, strict=True) if sq > 0]
    lo, hi = RN.sink_range(p, input_set)
    assert (lo, hi) == min(ranges)
    low = lo - RN.RISING_SINK_SPREAD[0]
    q, k, _ = RN.host_inputs(p, input_set, 42)
    cq, ck = p.cu_seqlens(), p.cu_seqlens_k()
    row_max = []
    for b in range(p.B):
        qs, ks = q[:, cq[b]:cq[b + 1]], k[:, ck[b]:ck[b + 1]]
        if qs.shape[1] == 0:
            continue
        mask = RN.key_mask(qs.shape[1], ks.shape[1], p.causal, p.window)
        for h in range(p.Hq):
            row_max.append(np.where(mask, RN.scores_f64(qs, ks, 0, h), -np.inf).max(axis=1))
    lowest = float(np.concatenate(row_max).min())
    # Tight up to the spread of c2 (x1.5 from the bound's c2) and the noise's two sides.
    assert low <= lowest <= low + 0.5 * abs(low) + 2 * RN.rising_noise_bound(p.D), (low, lowest)


@pytest.mark.parametrize(("text", "std"), [("1x2/1x300:d256:cap50", 50.0), ("1x2x300:d64", 16.0),
                                           ("1x2/1x200:k400:cap5", 5.0)])
def test_peaky_scores_spread_to_the_cap(text: str, std: float) -> None:
    """The peaky set's scores (softmax scale included) have about the cap's deviation (16
    without one), so a softcap's tanh is exercised into saturation."""
    p = Problem.parse(text)
    q, k, _ = RN.host_inputs(p, "peaky", 42)
    s = RN.scores_f64(q, k, 0, 0)
    assert 0.85 * std < s.std() < 1.15 * std, s.std()
    assert np.mean(np.abs(s) > std) > 0.2  # a fifth of them beyond the cap
