"""The NumPy twin of the oracle (cuda_src/oracle.cu): its input generators bit for bit, and a
float64 attention reference; for tests and for checking the "rising" property on the host.

Everything here takes S_q queries over S_k keys (S_q <= S_k: a prompt continuing a cached
prefix) with FlashAttention's bottom-right causal alignment: query row i sees keys
0 .. i + S_k - S_q. Q and O are [B, S_q, Hq, D], K and V [B, S_k, Hkv, D], LSE [B, Hq, S_q]; a
packed (varlen) batch is the tensors of its ``Problem.as_fixed`` (B = 1, S_q = total_q, S_k =
total_k), each sequence its own problem (``numpy_reference_varlen``). Query head h reads K/V
head h // (Hq / Hkv); the scale is 1/sqrt(D).

No GPU, no cuda-python: this module imports NumPy and the problem type only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from tuner.errors import FaTuneError
from tuner.kernel.runtime import ShapeLike, problem_dims

DEFAULT_SEED = 42
# input set -> (generator, direction for "rising" kinds)
INPUT_SETS: dict[str, tuple[str, int]] = {
    "seed": ("seed", 0),  # Q, K ~ U[-2, 2], V ~ U[-1, 1]
    "rising": ("rising", -1),  # running row max rises at every tile of a REVERSE KV walk
    "rising_fwd": ("rising", 1),  # ... of a FORWARD walk
}
RISING_MAX_S = 32768  # keys: K's trend must stay exact in BF16 (oracle.cu's header)


def check_input_set(name: str, shape: ShapeLike) -> None:
    if name not in INPUT_SETS:
        raise FaTuneError(
            f"unknown input set '{name}' (known: {', '.join(sorted(INPUT_SETS))})"
        )
    Sk = problem_dims(shape)[4]  # the tensors' key rows: a packed batch's total
    if INPUT_SETS[name][0] == "rising" and Sk > RISING_MAX_S:
        raise FaTuneError(f"input set '{name}' supports S_k <= {RISING_MAX_S} key rows "
                          f"(got {Sk})")


# ---- NumPy twin of the GPU generators (bit-exact) -------------------------------------------
_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_STREAM_MUL = 0xD1B54A32D192ED03
STREAM_Q, STREAM_K, STREAM_V = 1, 2, 3
STREAM_RQ, STREAM_RK, STREAM_RV, STREAM_RC2, STREAM_RJIT = 11, 12, 13, 14, 15


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


def host_inputs(shape: ShapeLike, input_set: str, seed: int = DEFAULT_SEED,
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q ([B, S_q, Hq, D]), K and V ([B, S_k, Hkv, D]) exactly as the GPU generates them: BF16
    bit patterns, uint16 (a packed batch: its as_fixed tensors, B = 1).

    For small problems (tests): memory is O(B*S*H*D) 8-byte temporaries.
    """
    check_input_set(input_set, shape)
    B, H, Hkv, Sq, Sk, D, _ = problem_dims(shape)
    dims_q, dims_kv = (B, Sq, H, D), (B, Sk, Hkv, D)
    iq = np.arange(B * Sq * H * D, dtype=np.uint64)
    ikv = np.arange(B * Sk * Hkv * D, dtype=np.uint64)
    kind, direction = INPUT_SETS[input_set]
    if kind == "seed":
        q = f32_to_bf16_bits(uniform_in(seed, STREAM_Q, iq, -2.0, 2.0))
        k = f32_to_bf16_bits(uniform_in(seed, STREAM_K, ikv, -2.0, 2.0))
        v = f32_to_bf16_bits(uniform_in(seed, STREAM_V, ikv, -1.0, 1.0))
        return q.reshape(dims_q), k.reshape(dims_kv), v.reshape(dims_kv)

    # "rising": see cuda_src/oracle.cu's header for the construction and its proof. The trend
    # t runs over the keys; each query row has its own coefficient c2.
    b_idx = np.arange(B, dtype=np.int64)[:, None, None]
    sq_idx = np.arange(Sq, dtype=np.int64)[None, :, None]
    sk_idx = np.arange(Sk, dtype=np.int64)[None, :, None]
    q_key = ((b_idx * H + np.arange(H, dtype=np.int64)[None, None, :]) * Sq
             + sq_idx).astype(np.uint64)  # [B, Sq, Hq]: per query row
    kv_key = ((b_idx * Hkv + np.arange(Hkv, dtype=np.int64)[None, None, :]) * Sk
              + sk_idx).astype(np.uint64)  # [B, Sk, Hkv]: per key of a K/V head
    c2 = bf16_bits_to_f32(f32_to_bf16_bits(
        np.float32(0.09) + np.float32(0.045) * uniform01(seed, STREAM_RC2, q_key)))
    c2 = c2 * np.float32(rising_c2_scale(D))  # exact: a power of two
    jit = (hash3(seed, STREAM_RJIT, kv_key) >> np.uint64(62)).astype(np.int64)
    half = Sk // 2
    t = (4 * (half - sk_idx) if direction < 0 else 4 * (sk_idx - half)) + jit
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


# ---- float64 NumPy reference and the rising check -------------------------------------------
def _f32(x: np.ndarray) -> np.ndarray:
    return bf16_bits_to_f32(x) if x.dtype == np.uint16 else x


def causal_mask(Sq: int, Sk: int) -> np.ndarray:
    """[Sq, Sk] bool: key j is seen by query row i iff j <= i + Sk - Sq (bottom-right)."""
    return np.arange(Sk)[None, :] <= np.arange(Sq)[:, None] + (Sk - Sq)


def numpy_reference_rows(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                         rows: Iterable[tuple[int, int, int]], causal: bool = True,
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Attention in float64 for sampled rows (b, h, s), h a query head; q [B, S_q, Hq, D], k
    and v [B, S_k, Hkv, D] (BF16 bits or floats); causal: keys <= s + S_k - S_q, else all.
    Returns (o [n, D], lse [n]); a row that sees no key gets O = 0, LSE = -inf."""
    qf, kf, vf = _f32(q), _f32(k), _f32(v)
    group = qf.shape[2] // kf.shape[2]
    off = kf.shape[1] - qf.shape[1]
    outs, lses = [], []
    scale = 1.0 / math.sqrt(qf.shape[-1])
    for b, h, s in rows:
        g = h // group
        end = max(0, min(s + 1 + off, kf.shape[1])) if causal else kf.shape[1]
        if end == 0:
            outs.append(np.zeros(qf.shape[-1]))
            lses.append(-math.inf)
            continue
        qr = qf[b, s, h, :].astype(np.float64)
        kr = kf[b, :end, g, :].astype(np.float64)
        vr = vf[b, :end, g, :].astype(np.float64)
        sc = kr @ qr * scale
        m = sc.max()
        p = np.exp(sc - m)
        lsum = p.sum()
        outs.append(p @ vr / lsum)
        lses.append(m + math.log(lsum))
    return np.array(outs), np.array(lses)


def numpy_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = True,
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The whole float64 reference (small problems): q [B, S_q, Hq, D], k and v [B, S_k, Hkv,
    D] -> (o [B, S_q, Hq, D], lse [B, Hq, S_q]). Causal is aligned bottom-right; a row that
    sees no key gets O = 0, LSE = -inf."""
    qf, kf, vf = (_f32(a).astype(np.float64) for a in (q, k, v))
    B, Sq, H, D = qf.shape
    Sk = kf.shape[1]
    group = H // kf.shape[2]
    out = np.zeros((B, Sq, H, D))
    lse = np.full((B, H, Sq), -np.inf)
    mask = causal_mask(Sq, Sk) if causal else np.ones((Sq, Sk), dtype=bool)
    seen = mask.any(axis=1)
    if not seen.any():
        return out, lse
    for b in range(B):
        for h in range(H):
            g = h // group
            sc = np.where(mask, qf[b, :, h] @ kf[b, :, g].T / math.sqrt(D), -np.inf)[seen]
            m = sc.max(axis=1, keepdims=True)
            p = np.exp(sc - m)
            lsum = p.sum(axis=1, keepdims=True)
            out[b, seen, h] = p @ vf[b, :, g] / lsum
            lse[b, h, seen] = (m + np.log(lsum))[:, 0]
    return out, lse


def numpy_reference_bf16(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = True,
                         ) -> np.ndarray:
    """The NumPy twin of oracle.cu's BF16-math reference (FlashAttention's
    ``attention_ref(upcast=False)``): Q * scale rounded to BF16; S = (Q * scale) K^T summed in
    float64, rounded to FP32 and then to BF16; softmax of those BF16 scores in float64 (max, sum
    of exp(s - max), exp(s - max) / sum) rounded to BF16 (P); O = P V summed in float64,
    rounded to FP32 and then to BF16. q [B, S_q, Hq, D], k and v [B, S_k, Hkv, D] (BF16 bits or
    floats); causal bottom-right. Returns O as BF16 bits, uint16 [B, S_q, Hq, D]; a row that
    sees no key gets O = 0. (The GPU sums in FP32: the two agree but for a rounding flip of a
    few elements near a BF16 tie.)"""
    qf, kf, vf = _f32(q), _f32(k), _f32(v)
    B, Sq, H, D = qf.shape
    Sk = kf.shape[1]
    group = H // kf.shape[2]
    qs = bf16_bits_to_f32(f32_to_bf16_bits(qf * np.float32(1.0 / math.sqrt(D))))
    out = np.zeros((B, Sq, H, D), dtype=np.float32)
    mask = causal_mask(Sq, Sk) if causal else np.ones((Sq, Sk), dtype=bool)
    seen = mask.any(axis=1)
    for b in range(B):
        for h in range(H):
            g = h // group
            sc = qs[b, :, h].astype(np.float64) @ kf[b, :, g].T.astype(np.float64)
            sc = bf16_bits_to_f32(f32_to_bf16_bits(sc.astype(np.float32))).astype(np.float64)
            sc = np.where(mask, sc, -np.inf)[seen]
            e = np.exp(sc - sc.max(axis=1, keepdims=True))
            p = bf16_bits_to_f32(f32_to_bf16_bits((e / e.sum(axis=1, keepdims=True))
                                                  .astype(np.float32)))
            o = p.astype(np.float64) @ vf[b, :, g].astype(np.float64)
            out[b, seen, h] = bf16_bits_to_f32(f32_to_bf16_bits(o.astype(np.float32)))
    return f32_to_bf16_bits(out)


def numpy_reference_varlen(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                           cu_seqlens_q: Sequence[int], cu_seqlens_k: Sequence[int],
                           causal: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The float64 reference of a packed batch: q [total_q, Hq, D], k and v [total_k, Hkv, D]
    (or the as_fixed [1, total, H, D]); sequence b is query rows cu_seqlens_q[b] .. [b + 1]
    over key rows cu_seqlens_k[b] .. [b + 1], its own problem (its own causal offset).
    Returns (o [total_q, Hq, D], lse [Hq, total_q])."""
    q, k, v = (a[0] if a.ndim == 4 else a for a in (q, k, v))
    total_q, H, D = q.shape
    out = np.zeros((total_q, H, D))
    lse = np.full((H, total_q), -np.inf)
    for b in range(len(cu_seqlens_q) - 1):
        q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        k0, k1 = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
        if q1 == q0:
            continue
        o_b, l_b = numpy_reference(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], causal)
        out[q0:q1] = o_b[0]
        lse[:, q0:q1] = l_b[0]
    return out, lse


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
