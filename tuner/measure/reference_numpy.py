"""The NumPy twin of the oracle (cuda_src/oracle.cu): its input generators bit for bit, and a
float64 attention reference; for tests and for checking the "rising" property on the host.

Everything here takes S_q queries over S_k keys (S_q <= S_k: a prompt continuing a cached
prefix) with FlashAttention's bottom-right causal alignment: query row i sees keys
0 .. i + S_k - S_q. Q and O are [B, S_q, Hq, D], K and V [B, S_k, Hkv, D], LSE [B, Hq, S_q]; a
packed (varlen) batch is the tensors of its ``Problem.as_fixed`` (B = 1, S_q = total_q, S_k =
total_k), each sequence its own problem (``numpy_reference_varlen``; the "rising" sets give
each sequence its own K trend). Query head h reads K/V head h // (Hq / Hkv); the scale is
1/sqrt(D).

The models' masks (tuner/problem.py; oracle.cu's header) are keyword arguments of every
reference: ``window`` (a query sees its diagonal key a = i + S_k - S_q and the window - 1 before
it; causal: none after it), ``softcap`` (scores s become C tanh(s / C)), ``sinks`` (one logit per
query head joins each row's softmax denominator; the LSE includes it, and a row that sees no key
gets LSE = sink). ``host_sinks`` is the twin of the sinks an input set gets (``sink_range``: at
magnitudes that matter against the rows' sums).

No GPU, no cuda-python: this module imports NumPy and the problem type only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TypeVar

import numpy as np

from tuner.errors import FaTuneError
from tuner.kernel.runtime import ShapeLike, as_problem, problem_dims
from tuner.problem import Problem

DEFAULT_SEED = 42
# input set -> (generator, direction for "rising" kinds)
INPUT_SETS: dict[str, tuple[str, int]] = {
    "seed": ("seed", 0),  # Q, K ~ U[-2, 2], V ~ U[-1, 1]
    "rising": ("rising", -1),  # running row max rises at every tile of a REVERSE KV walk
    "rising_fwd": ("rising", 1),  # ... of a FORWARD walk
    # Q, K ~ U[-a, a] with scores' std at the softcap (PEAKY_STD without one): a softcap's tanh
    # is exercised into saturation, where an approximate form errs most, and rows' softmax mass
    # sits on a few keys. The gate adds it for softcap problems (oracle.gate_sets).
    "peaky": ("peaky", 0),
}
# Keys of one trend: K's trend must stay exact in BF16 (oracle.cu's header). A packed batch's
# trend restarts in every sequence, so the bound is per sequence, not on the total.
RISING_MAX_S = 32768


def check_input_set(name: str, shape: ShapeLike) -> None:
    if name not in INPUT_SETS:
        raise FaTuneError(
            f"unknown input set '{name}' (known: {', '.join(sorted(INPUT_SETS))})"
        )
    if INPUT_SETS[name][0] != "rising":
        return
    p = as_problem(shape)
    if p.is_varlen:
        over = [(b, n) for b, n in enumerate(p.seqlens_k) if n > RISING_MAX_S]
        if over:
            b, n = over[0]
            raise FaTuneError(f"input set '{name}' supports S_k <= {RISING_MAX_S} key rows per "
                              f"sequence (sequence {b} has {n}; {len(over)} over)")
    elif p.S_k > RISING_MAX_S:
        raise FaTuneError(f"input set '{name}' supports S_k <= {RISING_MAX_S} key rows "
                          f"(got {p.S_k})")


# ---- NumPy twin of the GPU generators (bit-exact) -------------------------------------------
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_STREAM_MUL = 0xD1B54A32D192ED03
STREAM_Q, STREAM_K, STREAM_V = 1, 2, 3
STREAM_RQ, STREAM_RK, STREAM_RV, STREAM_RC2, STREAM_RJIT = 11, 12, 13, 14, 15
STREAM_PQ, STREAM_PK, STREAM_PV = 31, 32, 33
# The attention sinks' stream per input set: each set draws its own (oracle_fill_uniform_f32).
SINK_STREAMS: dict[str, int] = {"seed": 21, "rising": 22, "rising_fwd": 23, "peaky": 24}
PEAKY_STD = 16.0  # the peaky set's score std (softmax scale included) without a softcap


def peaky_amplitude(shape: ShapeLike) -> float:
    """a of the peaky set's Q, K ~ U[-a, a]: q.k / sqrt(D) then has std a^2 / 3 (any D), set
    to the problem's softcap (so half the scores lie beyond two thirds of the cap, where tanh
    bends and saturates) or PEAKY_STD."""
    cap = as_problem(shape).softcap
    return math.sqrt(3.0 * (cap if cap > 0 else PEAKY_STD))


def _splitmix64_int(x: int) -> int:
    x = (x + _GOLDEN) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _splitmix64_np(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64) + np.uint64(_GOLDEN)  # uint64 array arithmetic wraps mod 2^64
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def hash3(seed: int, stream: int, idx: np.ndarray) -> np.ndarray:
    key = _splitmix64_int((seed ^ ((stream * _STREAM_MUL) & _M64)) & _M64)
    return _splitmix64_np(np.asarray(idx, dtype=np.uint64) ^ np.uint64(key))


def uniform01(seed: int, stream: int, idx: np.ndarray) -> np.ndarray:
    return (hash3(seed, stream, idx) >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-24)


def uniform_in(seed: int, stream: int, idx: np.ndarray, lo: float, hi: float) -> np.ndarray:
    lo32, hi32 = np.float32(lo), np.float32(hi)
    return lo32 + (hi32 - lo32) * uniform01(seed, stream, idx)  # float32, rounded per op


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even FP32 -> BF16 bit patterns (finite inputs)."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + np.uint64(0x7FFF) + ((b >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    return b.astype(np.uint16)


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _bf16_round(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to BF16 (returned as float32)."""
    return bf16_bits_to_f32(f32_to_bf16_bits(x))


def host_inputs(shape: ShapeLike, input_set: str, seed: int = DEFAULT_SEED,
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q ([B, S_q, Hq, D]), K and V ([B, S_k, Hkv, D]) exactly as the GPU generates them: BF16
    bit patterns, uint16 (a packed batch: its as_fixed tensors, B = 1).

    For small problems (tests): memory is O(B*S*H*D) 8-byte temporaries.
    """
    check_input_set(input_set, shape)
    prob = as_problem(shape)
    B, H, Hkv, Sq, Sk, D, _ = problem_dims(prob)
    dims_q, dims_kv = (B, Sq, H, D), (B, Sk, Hkv, D)
    iq = np.arange(B * Sq * H * D, dtype=np.uint64)
    ikv = np.arange(B * Sk * Hkv * D, dtype=np.uint64)
    kind, direction = INPUT_SETS[input_set]
    if kind == "peaky":
        a = peaky_amplitude(prob)
        q = f32_to_bf16_bits(uniform_in(seed, STREAM_PQ, iq, -a, a))
        k = f32_to_bf16_bits(uniform_in(seed, STREAM_PK, ikv, -a, a))
        v = f32_to_bf16_bits(uniform_in(seed, STREAM_PV, ikv, -1.0, 1.0))
        return q.reshape(dims_q), k.reshape(dims_kv), v.reshape(dims_kv)
    if kind == "seed":
        q = f32_to_bf16_bits(uniform_in(seed, STREAM_Q, iq, -2.0, 2.0))
        k = f32_to_bf16_bits(uniform_in(seed, STREAM_K, ikv, -2.0, 2.0))
        v = f32_to_bf16_bits(uniform_in(seed, STREAM_V, ikv, -1.0, 1.0))
        return q.reshape(dims_q), k.reshape(dims_kv), v.reshape(dims_kv)

    # "rising": see cuda_src/oracle.cu's header for the construction and its proof. The trend
    # t runs over the keys (a packed batch's: over each sequence's own); each query row has its
    # own coefficient c2. Every random index is the tensors' own (packed) row.
    b_idx = np.arange(B, dtype=np.int64)[:, None, None]
    sq_idx = np.arange(Sq, dtype=np.int64)[None, :, None]
    sk_idx = np.arange(Sk, dtype=np.int64)[None, :, None]
    pos, n_keys = _trend_keys(prob)
    q_key = ((b_idx * H + np.arange(H, dtype=np.int64)[None, None, :]) * Sq
             + sq_idx).astype(np.uint64)  # [B, Sq, Hq]: per query row
    kv_key = ((b_idx * Hkv + np.arange(Hkv, dtype=np.int64)[None, None, :]) * Sk
              + sk_idx).astype(np.uint64)  # [B, Sk, Hkv]: per key of a K/V head
    c2 = bf16_bits_to_f32(f32_to_bf16_bits(
        np.float32(0.09) + np.float32(0.045) * uniform01(seed, STREAM_RC2, q_key)))
    c2 = c2 * np.float32(rising_c2_scale(D))  # exact: a power of two
    jit = (hash3(seed, STREAM_RJIT, kv_key) >> np.uint64(62)).astype(np.int64)
    half = n_keys // 2
    t = (4 * (half - pos) if direction < 0 else 4 * (pos - half)) + jit
    hi = np.floor_divide(t, 256)
    lo = t - 256 * hi

    qf = uniform_in(seed, STREAM_RQ, iq, -1.0, 1.0).reshape(dims_q)
    qf[..., 0] = c2 * np.float32(256.0)
    qf[..., 1] = c2
    k_strong = uniform_in(seed, STREAM_RK, ikv, -1.0, 1.0).reshape(dims_kv)
    k_weak = uniform_in(seed, STREAM_RK, ikv, -0.01, 0.01).reshape(dims_kv)
    kf = np.where(np.arange(D) < 10, k_strong, k_weak).astype(np.float32)
    kf[..., 0] = hi.astype(np.float32)
    kf[..., 1] = lo.astype(np.float32)
    vf = uniform_in(seed, STREAM_RV, ikv, -1.0, 1.0).reshape(dims_kv)
    return f32_to_bf16_bits(qf), f32_to_bf16_bits(kf), f32_to_bf16_bits(vf)


def _trend_keys(p: Problem) -> tuple[np.ndarray, np.ndarray]:
    """([1, S_k, 1] int64 each) every key row's index in its trend and that trend's key count:
    the row and S_k of a fixed problem; a packed batch's row r of sequence b (the last b with
    cu_seqlens_k[b] <= r, which passes over empty sequences as the GPU's binary search does)
    r - cu_seqlens_k[b] and sequence b's key count."""
    if not p.is_varlen:
        r = np.arange(p.S_k, dtype=np.int64)
        return r[None, :, None], np.full((1, 1, 1), p.S_k, dtype=np.int64)
    cu = np.asarray(p.cu_seqlens_k(), dtype=np.int64)
    r = np.arange(p.tokens_k, dtype=np.int64)
    b = np.searchsorted(cu[:-1], r, side="right") - 1
    return (r - cu[b])[None, :, None], (cu[b + 1] - cu[b])[None, :, None]


# c2 = bf16(0.09 + 0.045 u), u in [0, 1): the rising set's per-row trend coefficient (before m_D)
RISING_C2 = (0.08984375, 0.134765625)


def rising_c2_scale(D: int) -> float:
    """m_D of the rising construction: Q's trend coefficient c2 is doubled at D = 256 so every
    tile still beats the running max by a margin (oracle.cu's header: >= 1.53 logits)."""
    return 2.0 if D == 256 else 1.0


def rising_noise_bound(D: int) -> float:
    """Worst-case |logit - trend| of the rising set: (8 + (D - 10) * bf16(0.01)) / sqrt(D)."""
    return (8 + (D - 10) * 0.010009765625) / math.sqrt(D)


def rising_min_rise(D: int) -> float:
    """The guaranteed rise of the running max per tile (>= 64 keys), in logits."""
    return 0.08984375 * rising_c2_scale(D) * 253 / math.sqrt(D) - 2 * rising_noise_bound(D)


# ---- attention sinks: the values each input set gets ------------------------------------------
SEED_SCORE_VAR = 16.0 / 9.0  # Var(q.k / sqrt(D)) of the seed set: D (4/3)^2 / D, any D
SINK_SPREAD = (-4.0, 4.0)  # seed: logits either side of the typical row's LSE
RISING_SINK_SPREAD = (-2.0, 6.0)  # rising: around the lowest row max (at most ~7 above it)


def _sequences(p: object) -> list[tuple[int, int]]:
    """[(s_q, s_k)] of each sequence with queries, each its own rising trend over its s_k
    keys: a fixed batch is one (every batch entry alike), a packed batch its sequences."""
    prob = as_problem(p)
    if not prob.is_varlen:
        return [(prob.S_q, prob.S_k)]
    return [(q, k) for q, k in zip(prob.seqlens, prob.seqlens_k, strict=True) if q > 0]


_Scores = TypeVar("_Scores", np.ndarray, np.float64)  # an array of scores or one score


def _cap(sc: _Scores, softcap: float) -> _Scores:
    """Logit softcapping: C tanh(s / C) (softcap 0: the scores as they are)."""
    return softcap * np.tanh(sc / softcap) if softcap > 0 else sc


def sink_range(shape: ShapeLike, input_set: str) -> tuple[float, float]:
    """[lo, hi) of the sinks an input set draws (uniform per query head), where a sink matters
    against the rows' sums: a kernel that leaves it out, or scales it (a base-2 softmax given
    the natural-log sink as is: x ln 2), fails the gate.

    seed: the typical row's LSE, log(the mean keys a row sees) + Var(s) / 2 (scores ~ N(0, 16/9)),
    +-4: above some rows' LSE, below others' (the first rows of a causal problem see few keys,
    the last ones many). rising: the scores follow the keys' trend (hundreds of logits at long
    S_k), so a sink near the typical LSE would sit far above the rows with the lowest maxima; it
    is drawn from the lowest row max (a bound from the construction: c2 t / sqrt(D) - E_D at each
    row's largest key, with windows; the lowest over a packed batch's sequences, each with its
    own trend) - 2 to + 6, so it matters for the rows near
    there and exceeds no row's max by more than ~7 logits (a kernel's sum exp(sink - max) then
    stays finite in FP32, as it does for real models' sinks, O(1)-O(10)). peaky: -4 to 4, which
    matters to rows whose few keys score low and is far below the rows of many keys (their max
    is several score deviations up); it exceeds a row's max by at most ~4 deviations, inside
    FP32's exp range at the cap of 50 (PEAKY_STD without one)."""
    p = as_problem(shape)
    check_input_set(input_set, p)
    kind, direction = INPUT_SETS[input_set]
    if kind == "peaky":
        return SINK_SPREAD
    if kind == "seed":
        rows = p.tokens_q
        mean_keys = max(1.0, p.flops / (4 * p.Hq * p.D) / rows)
        var = SEED_SCORE_VAR if p.softcap <= 0 else min(SEED_SCORE_VAR, p.softcap ** 2)
        centre = math.log(mean_keys) + var / 2
        return centre + SINK_SPREAD[0], centre + SINK_SPREAD[1]
    seqs = _sequences(p)
    w = p.window if p.window > 0 else 1 << 40
    # The least trend value at a row's largest-scoring key over all sequences (c2 t rises with
    # t whatever c2's sign rule, so the lowest t gives the lowest row max; jit >= 0 is dropped).
    if direction < 0:  # t falls with the key: a row's max at its first key (the last row's
        #                window edge is the latest)
        t = min(4 * (sk // 2 - max(0, sk - w)) for _, sk in seqs)
    else:  # t rises with the key: a row's max at its last key (causal: the first row's least)
        t = min(4 * ((sk - sq if p.causal else sk - 1) - sk // 2) for sq, sk in seqs)
    scale = rising_c2_scale(p.D) / math.sqrt(p.D)
    c2 = RISING_C2[0] if t >= 0 else RISING_C2[1]
    low = float(_cap(np.float64(c2 * t * scale - rising_noise_bound(p.D)), p.softcap))
    return low + RISING_SINK_SPREAD[0], low + RISING_SINK_SPREAD[1]


def host_sinks(shape: ShapeLike, input_set: str, seed: int = DEFAULT_SEED) -> np.ndarray:
    """The sinks (float32 [Hq], natural-log units) the GPU draws for an input set, bit for bit
    (oracle_fill_uniform_f32 over ``sink_range`` with the set's SINK_STREAMS entry)."""
    lo, hi = sink_range(shape, input_set)
    hq = problem_dims(shape)[1]
    return uniform_in(seed, SINK_STREAMS[input_set], np.arange(hq, dtype=np.uint64),
                      float(np.float32(lo)), float(np.float32(hi)))


# ---- float64 NumPy reference and the rising check -------------------------------------------
def _f32(x: np.ndarray) -> np.ndarray:
    return bf16_bits_to_f32(x) if x.dtype == np.uint16 else x


def causal_mask(Sq: int, Sk: int) -> np.ndarray:
    """[Sq, Sk] bool: key j is seen by query row i iff j <= i + Sk - Sq (bottom-right)."""
    return np.arange(Sk)[None, :] <= np.arange(Sq)[:, None] + (Sk - Sq)


def key_mask(Sq: int, Sk: int, causal: bool = True, window: int = 0) -> np.ndarray:
    """[Sq, Sk] bool: the keys each query row sees: j <= a causal (a = i + Sk - Sq, its
    diagonal key) and, with a window of W keys, j > a - W (causal or not)."""
    mask = causal_mask(Sq, Sk) if causal else np.ones((Sq, Sk), dtype=bool)
    if window > 0:
        mask &= np.arange(Sk)[None, :] > np.arange(Sq)[:, None] + (Sk - Sq - window)
    return mask


def _sink_of(sinks: np.ndarray | None, h: int) -> float | None:
    return None if sinks is None else float(np.asarray(sinks, dtype=np.float32)[h])


def _softmax_rows(sc: np.ndarray, sink: float | None) -> tuple[np.ndarray, np.ndarray]:
    """(exp(s - M) / den, LSE) of score rows (-inf: masked; every row has a finite score) in
    float64, with the sink's exp(sink - M) in den (M = max(max_j s_j, sink))."""
    m = sc.max(axis=-1, keepdims=True)
    if sink is not None:
        m = np.maximum(m, sink)
    p = np.exp(sc - m)
    den = p.sum(axis=-1, keepdims=True) + (0.0 if sink is None else np.exp(sink - m))
    return p / den, (m + np.log(den))[..., 0]


def numpy_reference_rows(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                         rows: Iterable[tuple[int, int, int]], causal: bool = True, *,
                         window: int = 0, softcap: float = 0.0,
                         sinks: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Attention in float64 for sampled rows (b, h, s), h a query head; q [B, S_q, Hq, D], k
    and v [B, S_k, Hkv, D] (BF16 bits or floats); causal: keys <= s + S_k - S_q, else all; the
    masks as numpy_reference's. Returns (o [n, D], lse [n]); a row that sees no key gets O = 0,
    LSE = -inf (its sink with sinks)."""
    qf, kf, vf = _f32(q), _f32(k), _f32(v)
    group = qf.shape[2] // kf.shape[2]
    Sq, Sk = qf.shape[1], kf.shape[1]
    outs, lses = [], []
    scale = 1.0 / math.sqrt(qf.shape[-1])
    for b, h, s in rows:
        g = h // group
        a = s + Sk - Sq  # the row's diagonal key
        keys = np.arange(max(0, a - window + 1) if window > 0 else 0,
                         min(a, Sk - 1) + 1 if causal else Sk)
        sink = _sink_of(sinks, h)
        if keys.size == 0:
            outs.append(np.zeros(qf.shape[-1]))
            lses.append(-math.inf if sink is None else sink)
            continue
        qr = qf[b, s, h, :].astype(np.float64)
        sc = _cap(kf[b, keys, g, :].astype(np.float64) @ qr * scale, softcap)
        p, lse = _softmax_rows(sc, sink)
        outs.append(p @ vf[b, keys, g, :].astype(np.float64))
        lses.append(float(lse))
    return np.array(outs), np.array(lses)


def numpy_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = True, *,
                    window: int = 0, softcap: float = 0.0, sinks: np.ndarray | None = None,
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The whole float64 reference (small problems): q [B, S_q, Hq, D], k and v [B, S_k, Hkv,
    D] -> (o [B, S_q, Hq, D], lse [B, Hq, S_q]). Causal is aligned bottom-right; ``window``
    keys (0: none), ``softcap`` (0: none), ``sinks`` ([Hq] logits or None): the models' masks.
    A row that sees no key gets O = 0, LSE = -inf (its sink with sinks)."""
    qf, kf, vf = (_f32(a).astype(np.float64) for a in (q, k, v))
    B, Sq, H, D = qf.shape
    Sk = kf.shape[1]
    group = H // kf.shape[2]
    out = np.zeros((B, Sq, H, D))
    lse = np.full((B, H, Sq), -np.inf)
    if sinks is not None:
        lse[:] = np.asarray(sinks, dtype=np.float32).astype(np.float64)[None, :, None]
    mask = key_mask(Sq, Sk, causal, window)
    seen = mask.any(axis=1)
    if not seen.any():
        return out, lse
    for b in range(B):
        for h in range(H):
            g = h // group
            sc = _cap(qf[b, :, h] @ kf[b, :, g].T / math.sqrt(D), softcap)
            p, lse[b, h, seen] = _softmax_rows(np.where(mask, sc, -np.inf)[seen],
                                               _sink_of(sinks, h))
            out[b, seen, h] = p @ vf[b, :, g]
    return out, lse


def numpy_reference_bf16(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = True, *,
                         window: int = 0, softcap: float = 0.0, sinks: np.ndarray | None = None,
                         ) -> np.ndarray:
    """The NumPy twin of oracle.cu's BF16-math reference (FlashAttention's
    ``attention_ref(upcast=False)``): Q * scale rounded to BF16; S = (Q * scale) K^T summed in
    float64, rounded to FP32 and then to BF16; softmax of those BF16 scores in float64 (max, sum
    of exp(s - max), exp(s - max) / sum) rounded to BF16 (P); O = P V summed in float64,
    rounded to FP32 and then to BF16. q [B, S_q, Hq, D], k and v [B, S_k, Hkv, D] (BF16 bits or
    floats); causal bottom-right. The masks as attention_ref applies them to BF16 tensors:
    softcap rounds s / C, tanh of it and C times that to BF16 each (float32 ops); the window is
    a -inf score; the sink (FP32) joins the max and the sum. Returns O as BF16 bits, uint16 [B,
    S_q, Hq, D]; a row that sees no key gets O = 0. (The GPU sums in FP32: the two agree but for
    a rounding flip of a few elements near a BF16 tie.)"""
    qf, kf, vf = _f32(q), _f32(k), _f32(v)
    B, Sq, H, D = qf.shape
    Sk = kf.shape[1]
    group = H // kf.shape[2]
    qs = _bf16_round(qf * np.float32(1.0 / math.sqrt(D)))
    out = np.zeros((B, Sq, H, D), dtype=np.float32)
    mask = key_mask(Sq, Sk, causal, window)
    seen = mask.any(axis=1)
    for b in range(B):
        for h in range(H):
            g = h // group
            sc = qs[b, :, h].astype(np.float64) @ kf[b, :, g].T.astype(np.float64)
            sc = _bf16_round(sc.astype(np.float32))
            if softcap > 0:
                c = np.float32(softcap)
                sc = _bf16_round(c * _bf16_round(np.tanh(_bf16_round(sc / c))))
            p, _ = _softmax_rows(np.where(mask, sc.astype(np.float64), -np.inf)[seen],
                                 _sink_of(sinks, h))
            p = _bf16_round(p.astype(np.float32))
            o = p.astype(np.float64) @ vf[b, :, g].astype(np.float64)
            out[b, seen, h] = bf16_bits_to_f32(f32_to_bf16_bits(o.astype(np.float32)))
    return f32_to_bf16_bits(out)


def numpy_reference_varlen(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                           cu_seqlens_q: Sequence[int], cu_seqlens_k: Sequence[int],
                           causal: bool = True, **masks: object) -> tuple[np.ndarray, np.ndarray]:
    """The float64 reference of a packed batch: q [total_q, Hq, D], k and v [total_k, Hkv, D]
    (or the as_fixed [1, total, H, D]); sequence b is query rows cu_seqlens_q[b] .. [b + 1]
    over key rows cu_seqlens_k[b] .. [b + 1], its own problem (its own causal offset and
    window); ``masks``: numpy_reference's window, softcap, sinks. Returns (o [total_q, Hq, D],
    lse [Hq, total_q])."""
    q, k, v = (a[0] if a.ndim == 4 else a for a in (q, k, v))
    total_q, H, D = q.shape
    out = np.zeros((total_q, H, D))
    lse = np.full((H, total_q), -np.inf)
    for b in range(len(cu_seqlens_q) - 1):
        q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        k0, k1 = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
        if q1 == q0:
            continue
        o_b, l_b = numpy_reference(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal,
                                   **masks)  # type: ignore[arg-type]
        out[q0:q1] = o_b[0]
        lse[:, q0:q1] = l_b[0]
    return out, lse


def problem_masks(shape: ShapeLike, sinks: np.ndarray | None = None) -> dict[str, object]:
    """A problem's masks as the references' keyword arguments (``sinks``: its values, e.g.
    host_sinks, used only when the problem has sinks)."""
    return {"window": int(getattr(shape, "window", 0)),
            "softcap": float(getattr(shape, "softcap", 0.0)),
            "sinks": sinks if getattr(shape, "sinks", False) else None}


def numpy_reference_for(shape: ShapeLike, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                        sinks: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The float64 reference of a problem on its tensors (q, k, v as host_inputs gives them),
    with its mask, masks and ``sinks``: (o, lse) as the oracle lays them out, [B, S_q, Hq, D]
    and [B, Hq, S_q], a packed batch's [total_q, Hq, D] and [Hq, total_q]."""
    p = as_problem(shape)
    kw = problem_masks(p, sinks)
    if p.is_varlen:
        return numpy_reference_varlen(q, k, v, p.cu_seqlens(), p.cu_seqlens_k(), p.causal, **kw)
    return numpy_reference(q, k, v, p.causal, **kw)  # type: ignore[arg-type]


def scores_f64(q: np.ndarray, k: np.ndarray, b: int, h: int) -> np.ndarray:
    """[S_q, S_k] float64 logits q.k/sqrt(D) of one (b, query head h) against its K/V head
    h // (Hq / Hkv); the mask is not applied."""
    group = q.shape[2] // k.shape[2]
    qf = _f32(q[b, :, h, :]).astype(np.float64)
    kf = _f32(k[b, :, h // group, :]).astype(np.float64)
    return qf @ kf.T / math.sqrt(q.shape[-1])


def rising_failures(q: np.ndarray, k: np.ndarray, block_n: int, reverse: bool = True,
                    min_rise: float = 0.0, causal: bool = True) -> int:
    """How many (b, h, row, tile) steps of a KV-tile walk do NOT raise the running row max by
    more than ``min_rise`` (the first tile of each row excluded); h runs over the query heads
    (GQA: each against its K/V head). Causal: a row walks the tiles up to the one holding its
    last key (i + S_k - S_q, bottom-right); non-causal: every tile (a reverse walk starts at
    the last). 0 for a correct rising set."""
    B, Sq, H, _ = q.shape
    Sk = k.shape[1]
    off = Sk - Sq
    n_tiles = (Sk + block_n - 1) // block_n
    fails = 0
    for b in range(B):
        for h in range(H):
            sc = scores_f64(q, k, b, h)
            if causal:
                sc = np.where(causal_mask(Sq, Sk), sc, -np.inf)
            tile_max = np.stack(
                [sc[:, t * block_n:(t + 1) * block_n].max(axis=1) for t in range(n_tiles)], axis=1
            )  # [Sq, n_tiles]; -inf where the tile is fully masked
            for r in range(Sq):
                last = min(r + off, Sk - 1) // block_n if causal else n_tiles - 1
                order = range(last, -1, -1) if reverse else range(0, last + 1)
                run = -np.inf
                for j, t in enumerate(order):
                    if j > 0 and not tile_max[r, t] > run + min_rise:
                        fails += 1
                    run = max(run, tile_max[r, t])
    return fails
