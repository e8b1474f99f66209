"""The correctness gate's rule (docs/GATE.md): the tolerances and the BF16 error budget, the
oracle's stats struct and budget sums as they come back from the GPU, and the verdict of one
input set (``evaluate`` -> ``SetMetrics``) and of a whole gate (``GateResult``), with the
NumPy twin of the budget sums and of the comparison (``budget_sums_numpy``, ``compare_numpy``).
No GPU here: tuner.measure.oracle runs the gate and hands its numbers to this module."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tuner.kernel.runtime import (
    ORACLE_ROW_BLOCK,
    ORACLE_STATS_BYTES,
    ShapeLike,
    as_problem,
    elems_bshd,
    elems_lse,
    problem_dims,
)
from tuner.measure import accuracy
from tuner.measure.accuracy import ImplError
from tuner.measure.reference_numpy import bf16_bits_to_f32, f32_to_bf16_bits

O_ATOL = 0.05
O_RTOL = 0.1
REL_L2_MAX = 1e-2
# LSE (natural log; docs/GATE.md): an error d scales every probability exp(s - LSE) of its row
# by e^-d, so |d| <= 2^-9 keeps it within BF16's unit roundoff of P; 2^-18 |ref| is FP32's
# resolution of scores of that size (the "rising" set's |LSE| reaches ~550 at S=16384).
LSE_ATOL = 2.0**-9
LSE_RTOL = 2.0**-18
# The BF16 error budget (docs/GATE.md): per (b, h, ROW_BLOCK query rows) and per (b, h, column),
# rms_err <= BUDGET_K * rms_bf16 + BUDGET_FLOOR * BF16_UNIT * rms_ref. Correct kernels (P and O
# rounded to BF16 once each) measured 1.2-1.6x rms_bf16 on an H200 (1.9x with lazy_rescale), at
# most 0.62x their budget; 1% on 8 rows of a 16-row block or on 4 columns measures >= 4.7x.
BUDGET_K = 2.5
BUDGET_FLOOR = 0.5
BF16_UNIT = 2.0**-9  # unit roundoff of BF16's 8-bit significand
ROW_BLOCK = ORACLE_ROW_BLOCK  # 16: one warp's rows of a wgmma tile
RULE_TEXT = (
    f"per element |err| <= {O_ATOL:g} + {O_RTOL:g}*|ref|; relative L2 <= {REL_L2_MAX:g}; no "
    f"NaN/Inf/unwritten; LSE |err| <= 2^-9 + 2^-18*|ref|; {accuracy.FA_RULE_TEXT}; BF16 error "
    f"budget per "
    f"(b, h, {ROW_BLOCK}-row block) and per (b, h, head-dim column): rms_err <= {BUDGET_K:g}*"
    f"rms_bf16 + {BUDGET_FLOOR:g}*2^-9*rms_ref (rms_bf16: RMS of bf16_rn(ref) - ref; a column's at "
    "least its head's)"
)

POISON_BF16 = 0x7FBF
POISON_F32 = 0x7FBADBAD
NO_VIOLATION = (1 << 64) - 1

# Mirrors struct OracleStats in cuda_src/oracle.cu (19 x 8 bytes, little endian).
_STATS_DTYPE = np.dtype(
    [
        ("o_count", "<u8"), ("o_violations", "<u8"), ("o_nonfinite", "<u8"),
        ("o_unwritten", "<u8"), ("o_first_violation", "<u8"), ("o_ref_nonfinite", "<u8"),
        ("o_max_abs_err_bits", "<u8"), ("o_block_rows", "<u8"),
        ("o_sum_sq_err", "<f8"), ("o_sum_sq_ref", "<f8"), ("o_sum_sq_bf16", "<f8"),
        ("l_count", "<u8"), ("l_violations", "<u8"), ("l_nonfinite", "<u8"),
        ("l_unwritten", "<u8"), ("l_first_violation", "<u8"), ("l_ref_nonfinite", "<u8"),
        ("l_max_abs_err_bits", "<u8"), ("l_reserved", "<u8"),
    ]
)


def _bits_to_f32(bits: int) -> float:
    return float(np.array([bits & 0xFFFFFFFF], dtype=np.uint32).view(np.float32)[0])


def _f32_bits(x: float) -> int:
    return int(np.array([x], dtype=np.float32).view(np.uint32)[0])


@dataclass(frozen=True)
class OracleStats:
    """The comparison counters for one (set, launch), decoded from the device struct."""

    o_count: int
    o_violations: int
    o_nonfinite: int
    o_unwritten: int
    o_first_violation: int  # NO_VIOLATION if none
    o_ref_nonfinite: int
    o_max_abs_err: float
    o_sum_sq_err: float
    o_sum_sq_ref: float
    o_sum_sq_bf16: float = 0.0  # sum (bf16_rn(ref) - ref)^2 over the elements err is summed on
    o_block_rows: int = ROW_BLOCK
    l_count: int = 0
    l_violations: int = 0
    l_nonfinite: int = 0
    l_unwritten: int = 0
    l_first_violation: int = NO_VIOLATION
    l_ref_nonfinite: int = 0
    l_max_abs_err: float = 0.0

    @classmethod
    def from_bytes(cls, raw: bytes | np.ndarray) -> OracleStats:
        buf = raw.tobytes() if isinstance(raw, np.ndarray) else bytes(raw)
        if len(buf) != ORACLE_STATS_BYTES:
            raise ValueError(f"stats struct is {len(buf)} bytes, expected {ORACLE_STATS_BYTES}")
        r = np.frombuffer(buf, dtype=_STATS_DTYPE)[0]
        return cls(
            o_count=int(r["o_count"]),
            o_violations=int(r["o_violations"]),
            o_nonfinite=int(r["o_nonfinite"]),
            o_unwritten=int(r["o_unwritten"]),
            o_first_violation=int(r["o_first_violation"]),
            o_ref_nonfinite=int(r["o_ref_nonfinite"]),
            o_max_abs_err=_bits_to_f32(int(r["o_max_abs_err_bits"])),
            o_sum_sq_err=float(r["o_sum_sq_err"]),
            o_sum_sq_ref=float(r["o_sum_sq_ref"]),
            o_sum_sq_bf16=float(r["o_sum_sq_bf16"]),
            o_block_rows=int(r["o_block_rows"]),
            l_count=int(r["l_count"]),
            l_violations=int(r["l_violations"]),
            l_nonfinite=int(r["l_nonfinite"]),
            l_unwritten=int(r["l_unwritten"]),
            l_first_violation=int(r["l_first_violation"]),
            l_ref_nonfinite=int(r["l_ref_nonfinite"]),
            l_max_abs_err=_bits_to_f32(int(r["l_max_abs_err_bits"])),
        )

    def to_bytes(self) -> bytes:
        """The device layout (tests craft structs with this)."""
        a = np.zeros(1, dtype=_STATS_DTYPE)
        for name in _STATS_DTYPE.names or ():
            if name.endswith("_reserved"):
                continue
            if name.endswith("_max_abs_err_bits"):
                a[name] = _f32_bits(getattr(self, name.replace("_bits", "")))
            else:
                a[name] = getattr(self, name)
        return a.tobytes()


def decode_bshd(index: int, shape: ShapeLike) -> tuple[int, int, int, int]:
    """Flat index into a contiguous [B, S_q, Hq, D] tensor (Q, O) -> (b, s, h, d)."""
    _, hq, _, S, _, D, _ = problem_dims(shape)
    n = elems_bshd(shape)
    if not 0 <= index < n:
        raise ValueError(f"index {index} outside [0, {n})")
    d = index % D
    row = index // D
    h = row % hq
    s = (row // hq) % S
    b = row // (hq * S)
    return b, s, h, d


def decode_bhs(index: int, shape: ShapeLike) -> tuple[int, int, int]:
    """Flat index into a contiguous [B, Hq, S_q] tensor (LSE) -> (b, h, s)."""
    _, hq, _, S, _, _, _ = problem_dims(shape)
    n = elems_lse(shape)
    if not 0 <= index < n:
        raise ValueError(f"index {index} outside [0, {n})")
    s = index % S
    h = (index // S) % hq
    b = index // (S * hq)
    return b, h, s


def n_row_blocks(S: int, row_block: int = ROW_BLOCK) -> int:
    return (S + row_block - 1) // row_block


@dataclass(frozen=True)
class BudgetSums:
    """What oracle_compare writes for the budget, as float64 arrays:
    ``blocks`` [B, Hq, ceil(S / row_block), 4] per (b, h, block of row_block query rows; D
    columns each) and ``cols`` [B, Hq, D, 4] per (b, h, head-dim column), each holding (sum
    err^2, sum (bf16_rn(ref) - ref)^2, sum ref^2, element count) over the compared finite
    elements."""

    blocks: np.ndarray
    cols: np.ndarray
    row_block: int = ROW_BLOCK

    @classmethod
    def device_bytes(cls, shape: ShapeLike, row_block: int = ROW_BLOCK) -> tuple[int, int]:
        """(block_sums bytes, col_sums bytes) oracle_compare needs for a problem (its query
        rows)."""
        B, hq, _, S, _, D, _ = problem_dims(shape)
        heads = B * hq
        return heads * n_row_blocks(S, row_block) * 4 * 4, heads * D * 4 * 8

    @classmethod
    def from_device(cls, shape: ShapeLike, blocks_f32: np.ndarray, cols_f64: np.ndarray,
                    row_block: int = ROW_BLOCK) -> BudgetSums:
        B, hq, _, S, _, D, _ = problem_dims(shape)
        nb = n_row_blocks(S, row_block)
        return cls(
            blocks=np.asarray(blocks_f32, dtype=np.float32).astype(np.float64).reshape(
                B, hq, nb, 4),
            cols=np.asarray(cols_f64, dtype=np.float64).reshape(B, hq, D, 4),
            row_block=row_block,
        )


def budget_sums_numpy(o: np.ndarray, ref: np.ndarray, row_block: int = ROW_BLOCK,
                      ) -> BudgetSums:
    """NumPy twin of oracle_compare's budget sums. ``o``: [B, S, Hq, D] BF16 bits (uint16) or
    floats; ``ref``: [B, S, Hq, D] FP32 reference. Non-finite pairs are left out, as on the
    GPU (they fail the gate on their own). Sums in float64 (the GPU's block sums are float32)."""
    of = bf16_bits_to_f32(o) if o.dtype == np.uint16 else np.asarray(o, dtype=np.float32)
    rf = np.asarray(ref, dtype=np.float32)
    B, S, H, D = rf.shape
    ok = np.isfinite(of) & np.isfinite(rf)
    if o.dtype == np.uint16:
        ok &= o != POISON_BF16
    r64 = np.where(ok, rf, 0).astype(np.float64)
    err = np.where(ok, of, 0).astype(np.float64) - r64
    rb = np.where(ok, bf16_bits_to_f32(f32_to_bf16_bits(np.where(ok, rf, 0))).astype(np.float64)
                  - r64, 0.0)
    q = np.stack([err * err, rb * rb, r64 * r64, ok.astype(np.float64)], axis=-1)  # B,S,H,D,4
    q = q.transpose(0, 2, 1, 3, 4)  # B, H, S, D, 4
    cols = q.sum(axis=2)
    nb = n_row_blocks(S, row_block)
    pad = nb * row_block - S
    qp = np.pad(q, ((0, 0), (0, 0), (0, pad), (0, 0), (0, 0)))
    blocks = qp.reshape(B, H, nb, row_block, D, 4).sum(axis=(3, 4))
    return BudgetSums(blocks=blocks, cols=cols, row_block=row_block)


def compare_numpy(o: np.ndarray, ref: np.ndarray, lse: np.ndarray | None = None,
                  lse_ref: np.ndarray | None = None, *, o_atol: float = O_ATOL,
                  o_rtol: float = O_RTOL, lse_atol: float = LSE_ATOL,
                  lse_rtol: float = LSE_RTOL) -> tuple[OracleStats, BudgetSums]:
    """NumPy twin of oracle_compare for small tensors (tests): ``o`` [B, S, Hq, D] BF16 bits,
    ``ref`` its FP32 reference; ``lse``/``lse_ref`` [B, Hq, S] FP32 (lse as float32 values or
    uint32 bits) or None. Same counters, same first-violation indices, same sums (up to FP
    summation order, and to FMA contraction of the tolerance at exact ties)."""

    def side(x: np.ndarray, poisoned: np.ndarray, r: np.ndarray, atol: float, rtol: float,
             ) -> tuple[dict[str, Any], np.ndarray]:
        x, r = x.reshape(-1), r.reshape(-1)
        poisoned = poisoned.reshape(-1)
        ref_ok = np.isfinite(r)
        nonfinite = ~poisoned & ~np.isfinite(x)
        summed = ~poisoned & ~nonfinite & ref_ok
        with np.errstate(invalid="ignore", over="ignore"):
            err = np.abs(np.where(summed, x, 0).astype(np.float32)
                         - np.where(summed, r, 0).astype(np.float32))
            tol = np.float32(atol) + np.float32(rtol) * np.abs(np.where(ref_ok, r, 0))
        bad = ~summed | ~(err <= tol.astype(np.float32))
        idx = np.flatnonzero(bad)
        d = dict(count=int(x.size), violations=int(bad.sum()), nonfinite=int(nonfinite.sum()),
                 unwritten=int(poisoned.sum()),
                 first=int(idx[0]) if idx.size else NO_VIOLATION,
                 ref_nonfinite=int((~ref_ok).sum()),
                 max_err=float(err[summed].max(initial=0.0)),
                 sum_sq_err=float((err[summed].astype(np.float64) ** 2).sum()),
                 sum_sq_ref=float((r[ref_ok].astype(np.float64) ** 2).sum()))
        return d, summed

    o = np.asarray(o, dtype=np.uint16)
    rf = np.asarray(ref, dtype=np.float32)
    od, _ = side(bf16_bits_to_f32(o), o == POISON_BF16, rf, o_atol, o_rtol)
    sums = budget_sums_numpy(o, rf)
    kw: dict[str, Any] = {}
    if lse is not None and lse_ref is not None:
        bits = (np.asarray(lse, dtype=np.uint32) if np.asarray(lse).dtype == np.uint32
                else np.asarray(lse, dtype=np.float32).view(np.uint32))
        ld, _ = side(bits.view(np.float32), bits == POISON_F32,
                     np.asarray(lse_ref, dtype=np.float32), lse_atol, lse_rtol)
        kw = dict(l_count=ld["count"], l_violations=ld["violations"],
                  l_nonfinite=ld["nonfinite"], l_unwritten=ld["unwritten"],
                  l_first_violation=ld["first"], l_ref_nonfinite=ld["ref_nonfinite"],
                  l_max_abs_err=ld["max_err"])
    stats = OracleStats(
        o_count=od["count"], o_violations=od["violations"], o_nonfinite=od["nonfinite"],
        o_unwritten=od["unwritten"], o_first_violation=od["first"],
        o_ref_nonfinite=od["ref_nonfinite"], o_max_abs_err=od["max_err"],
        o_sum_sq_err=od["sum_sq_err"], o_sum_sq_ref=od["sum_sq_ref"],
        o_sum_sq_bf16=float(sums.cols[..., 1].sum()), o_block_rows=sums.row_block, **kw,
    )
    return stats, sums


def _safe_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den with 0/0 = 0, x/0 = inf, NaN (an overflowed sum) = inf."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num > 0, np.inf, 0.0))
    return np.where(np.isnan(r) | np.isnan(num) | np.isnan(den), np.inf, r)


@dataclass
class BudgetCheck:
    """The budget's verdict for one (set, launch): worst ratios, failure counts, locations."""

    block_budget_ratio: float  # max over blocks of rms_err / budget (<= 1 passes)
    block_bf16_ratio: float  # max over blocks of rms_err / rms_bf16
    block_failures: int
    blocks: int
    block_worst: tuple[int, int, int, int] | None  # (b, h, first row, last row), worst budget
    col_budget_ratio: float
    col_bf16_ratio: float  # rms_bf16 of a column taken as at least its head's
    col_failures: int
    cols: int
    col_worst: tuple[int, int, int] | None  # (b, h, d), worst budget

    @property
    def budget_ratio(self) -> float:
        return max(self.block_budget_ratio, self.col_budget_ratio)

    @property
    def bf16_ratio(self) -> float:
        return max(self.block_bf16_ratio, self.col_bf16_ratio)

    @property
    def passed(self) -> bool:
        return not self.block_failures and not self.col_failures

    def reasons(self, k: float = BUDGET_K, floor: float = BUDGET_FLOOR,
                row_block: int = ROW_BLOCK) -> list[str]:
        rule = f"rms_err <= {k:g}*rms_bf16 + {floor:g}*2^-9*rms_ref"
        out = []
        if self.block_failures and self.block_worst is not None:
            b, h, s0, s1 = self.block_worst
            out.append(
                f"{self.block_failures} of {self.blocks} {row_block}-row blocks exceed the BF16 "
                f"error budget {rule} (worst b={b},h={h},s={s0}..{s1}: "
                f"{self.block_budget_ratio:.3g}x budget; worst block "
                f"{self.block_bf16_ratio:.3g}x rms_bf16)"
            )
        if self.col_failures and self.col_worst is not None:
            b, h, d = self.col_worst
            out.append(
                f"{self.col_failures} of {self.cols} head-dim columns exceed the BF16 error "
                f"budget {rule} (worst b={b},h={h},d={d}: {self.col_budget_ratio:.3g}x budget; "
                f"worst column {self.col_bf16_ratio:.3g}x rms_bf16)"
            )
        return out


def check_budget(sums: BudgetSums, S: int, k: float = BUDGET_K,
                 floor: float = BUDGET_FLOOR) -> BudgetCheck:
    """The budget rule on per-block and per-column sums (pure NumPy: testable without a GPU).

    Block: rms_err <= k * rms_bf16 + floor * 2^-9 * rms_ref over its elements. Column: the same
    with rms_bf16 = max(the column's, its head's): a column's own |O| can be small by
    cancellation (the "rising" set: every row mixes the same few V rows) while the error P's
    BF16 rounding leaves in it scales with |V|, like every other column's. Every quantity is an
    RMS over the same elements, so the comparison is on square roots of the sums.
    """
    blk = sums.blocks
    e, q, r = (np.sqrt(np.maximum(blk[..., i], 0.0)) for i in range(3))
    b_ratio = _safe_ratio(e, k * q + floor * BF16_UNIT * r)
    b_bf16 = _safe_ratio(e, q)
    col = sums.cols
    head_n = col[..., 3].sum(axis=2, keepdims=True)
    head_q2 = col[..., 1].sum(axis=2, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        head_mean = np.where(head_n > 0, head_q2 / np.where(head_n > 0, head_n, 1.0), 0.0)
    ce, cr = np.sqrt(np.maximum(col[..., 0], 0.0)), np.sqrt(np.maximum(col[..., 2], 0.0))
    cq = np.sqrt(np.maximum(col[..., 1], head_mean * col[..., 3]))
    c_ratio = _safe_ratio(ce, k * cq + floor * BF16_UNIT * cr)
    c_bf16 = _safe_ratio(ce, cq)

    def worst(a: np.ndarray) -> tuple[int, ...] | None:
        if a.size == 0:
            return None
        return tuple(int(i) for i in np.unravel_index(int(np.argmax(a)), a.shape))

    bw = worst(b_ratio)
    block_worst = None
    if bw is not None:
        s0 = bw[2] * sums.row_block
        block_worst = (bw[0], bw[1], s0, min(s0 + sums.row_block, S) - 1)
    cw = worst(c_ratio)
    return BudgetCheck(
        block_budget_ratio=float(b_ratio.max(initial=0.0)),
        block_bf16_ratio=float(b_bf16.max(initial=0.0)),
        block_failures=int((b_ratio > 1.0).sum()),
        blocks=int(b_ratio.size),
        block_worst=block_worst,
        col_budget_ratio=float(c_ratio.max(initial=0.0)),
        col_bf16_ratio=float(c_bf16.max(initial=0.0)),
        col_failures=int((c_ratio > 1.0).sum()),
        cols=int(c_ratio.size),
        col_worst=cw,  # type: ignore[arg-type]
    )


def _shape_str(shape: ShapeLike) -> str:
    """The problem's canonical text (tuner.problem.Problem's str: 4x32x8192, 1x32/8x8192:d64)."""
    return str(as_problem(shape))


@dataclass
class SetMetrics:
    """Gate metrics of one input set."""

    input_set: str
    passed: bool
    max_abs_err: float
    rel_l2: float
    violations: int
    first_violation: tuple[int, int, int, int] | None  # (b, s, h, d); h a query head
    nan_count: int  # computed NaN/Inf, poison excluded
    unwritten: int
    elements: int
    ref_nonfinite: int = 0
    lse_checked: bool = False
    lse_max_abs_err: float | None = None
    lse_violations: int = 0
    lse_first_violation: tuple[int, int, int] | None = None  # (b, h, s)
    lse_nan_count: int = 0
    lse_unwritten: int = 0
    # The BF16 error budget (None when not checked): worst rms_err / budget (<= 1 passes) and
    # worst rms_err / rms_bf16, over blocks and columns; then per kind, with the worst place.
    budget_ratio: float | None = None
    bf16_ratio: float | None = None
    err_over_bf16: float | None = None  # whole tensor: sqrt(sum err^2 / sum bf16 err^2)
    block_budget_ratio: float | None = None
    block_bf16_ratio: float | None = None
    block_failures: int = 0
    block_worst: tuple[int, int, int, int] | None = None  # (b, h, first row, last row)
    col_budget_ratio: float | None = None
    col_bf16_ratio: float | None = None
    col_failures: int = 0
    col_worst: tuple[int, int, int] | None = None  # (b, h, d)
    # Error ratios (tuner.measure.accuracy; None when not computed): FA's rule, the default's.
    err_bf16_max: float | None = None
    err_bf16_rms: float | None = None
    fa_ratio: float | None = None  # max_abs_err / err_bf16_max
    fa_rule_ok: bool | None = None
    err_vs_default: float | None = None  # max_abs_err / the default config's
    rms_vs_default: float | None = None  # rel_l2 / the default config's (same reference)
    reasons: list[str] = field(default_factory=list)

    @property
    def budget_checked(self) -> bool:
        return self.budget_ratio is not None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("first_violation", "lse_first_violation", "block_worst", "col_worst"):
            if d[k] is not None:
                d[k] = list(d[k])
        for k, v in d.items():
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = None  # JSON has no inf; reasons say why
        d["err_max"] = d["max_abs_err"]  # the error ratios' name for it
        return d

    def brief(self) -> str:
        s = f"{self.input_set}: max|err| {self.max_abs_err:.3g}, rel L2 {self.rel_l2:.3g}"
        if self.lse_checked and self.lse_max_abs_err is not None:
            s += f", LSE max|err| {self.lse_max_abs_err:.3g}"
        if self.budget_ratio is not None:
            s += (f", budget {self.budget_ratio:.2f}x (rms_err/rms_bf16 max "
                  f"{self.bf16_ratio:.2f})")
        if self.fa_ratio is not None:
            s += f", {accuracy.ratio_text(self.fa_ratio)}x BF16 impl"
        if self.err_vs_default is not None:
            s += f", {accuracy.ratio_text(self.err_vs_default)}x default"
        if not self.passed:
            s += " -- " + "; ".join(self.reasons)
        return s


def _tensor_reasons(words: tuple[str, str, str, str, str], counts: tuple[int, ...],
                    rule: str) -> list[str]:
    """The completeness and tolerance reasons of one compared tensor (O or LSE).

    words: (what was compared, the reference's non-finite message with {}, never written,
    non-finite, what violates); counts: (compared, expected, ref non-finite, unwritten,
    non-finite, violations)."""
    what, ref_bad, unwritten_w, nonfinite_w, violating = words
    count, expected, ref_nonfinite, unwritten, nonfinite, violations = counts
    reasons: list[str] = []
    if count != expected:
        reasons.append(f"compared {count} of {expected} {what} (oracle bug)")
    if ref_nonfinite:
        reasons.append(ref_bad.format(ref_nonfinite))
    if unwritten:
        reasons.append(f"{unwritten} {unwritten_w}")
    if nonfinite:
        reasons.append(f"{nonfinite} {nonfinite_w}")
    if violations:
        reasons.append(f"{violations} {violating} violate {rule}")
    return reasons


def evaluate(
    stats: OracleStats,
    shape: ShapeLike,
    input_set: str,
    check_lse: bool,
    *,
    o_atol: float = O_ATOL,
    o_rtol: float = O_RTOL,
    rel_l2_max: float = REL_L2_MAX,
    lse_atol: float = LSE_ATOL,
    lse_rtol: float = LSE_RTOL,
    budget: BudgetSums | None = None,
    budget_k: float = BUDGET_K,
    budget_floor: float = BUDGET_FLOOR,
    bf16_impl: ImplError | None = None,
) -> SetMetrics:
    """Turn one stats struct (and the budget sums and the BF16 implementation's error, when
    given) into metrics and a verdict (pure: testable without a GPU)."""
    n = elems_bshd(shape)
    if stats.o_sum_sq_ref > 0:
        rel_l2 = math.sqrt(stats.o_sum_sq_err / stats.o_sum_sq_ref)
    else:
        rel_l2 = 0.0 if stats.o_sum_sq_err == 0 else math.inf
    first = (
        decode_bshd(stats.o_first_violation, shape)
        if stats.o_violations and stats.o_first_violation != NO_VIOLATION
        else None
    )
    where = "" if first is None else " (first at b={},s={},h={},d={})".format(*first)
    reasons = _tensor_reasons(
        ("elements", "reference has {} non-finite values (oracle bug)",
         "output elements never written", "NaN/Inf outputs", "elements"),
        (stats.o_count, n, stats.o_ref_nonfinite, stats.o_unwritten, stats.o_nonfinite,
         stats.o_violations), f"|err| <= {o_atol:g} + {o_rtol:g}*|ref|{where}")
    if not rel_l2 <= rel_l2_max:
        reasons.append(f"relative L2 error {rel_l2:.3g} > {rel_l2_max:g}")

    m = SetMetrics(
        input_set=input_set,
        passed=False,
        max_abs_err=stats.o_max_abs_err,
        rel_l2=rel_l2,
        violations=stats.o_violations,
        first_violation=first,
        nan_count=stats.o_nonfinite,
        unwritten=stats.o_unwritten,
        elements=n,
        ref_nonfinite=stats.o_ref_nonfinite,
        lse_checked=check_lse,
    )
    if stats.o_sum_sq_bf16 > 0:
        m.err_over_bf16 = math.sqrt(stats.o_sum_sq_err / stats.o_sum_sq_bf16)
    if budget is not None:
        B, hq, _, S, _, D, _ = problem_dims(shape)
        want_blocks = (B, hq, n_row_blocks(S, budget.row_block), 4)
        want_cols = (B, hq, D, 4)
        if (budget.blocks.shape != want_blocks or budget.cols.shape != want_cols
                or stats.o_block_rows != budget.row_block):
            reasons.append(
                f"budget sums are {budget.blocks.shape}/{budget.cols.shape} for "
                f"{stats.o_block_rows}-row blocks, expected {want_blocks}/{want_cols} for "
                f"{budget.row_block}-row blocks (oracle bug)"
            )
        else:
            bc = check_budget(budget, S, budget_k, budget_floor)
            m.budget_ratio, m.bf16_ratio = bc.budget_ratio, bc.bf16_ratio
            m.block_budget_ratio, m.block_bf16_ratio = bc.block_budget_ratio, bc.block_bf16_ratio
            m.block_failures, m.block_worst = bc.block_failures, bc.block_worst
            m.col_budget_ratio, m.col_bf16_ratio = bc.col_budget_ratio, bc.col_bf16_ratio
            m.col_failures, m.col_worst = bc.col_failures, bc.col_worst
            reasons.extend(bc.reasons(budget_k, budget_floor, budget.row_block))
    if bf16_impl is not None:
        m.err_bf16_max, m.err_bf16_rms = bf16_impl.max_abs_err, bf16_impl.rms_err
        factor = accuracy.fa_rule_factor(shape)  # 3 with a softcap, as FA's tests
        m.fa_ratio, m.fa_rule_ok = accuracy.fa_rule(stats.o_max_abs_err, bf16_impl.max_abs_err,
                                                    factor)
        if not m.fa_rule_ok and accuracy.FA_RULE_GATES:
            reasons.append(accuracy.fa_rule_reason(stats.o_max_abs_err, bf16_impl.max_abs_err,
                                                   factor))
    if check_lse:
        nl = elems_lse(shape)
        m.lse_max_abs_err = stats.l_max_abs_err
        m.lse_violations = stats.l_violations
        m.lse_nan_count = stats.l_nonfinite
        m.lse_unwritten = stats.l_unwritten
        if stats.l_violations and stats.l_first_violation != NO_VIOLATION:
            m.lse_first_violation = decode_bhs(stats.l_first_violation, shape)
        lf = m.lse_first_violation
        where = "" if lf is None else " (first at b={},h={},s={})".format(*lf)
        reasons += _tensor_reasons(
            ("LSE values", "reference LSE has {} non-finite values", "LSE values never written",
             "NaN/Inf LSE values", "LSE values"),
            (stats.l_count, nl, stats.l_ref_nonfinite, stats.l_unwritten, stats.l_nonfinite,
             stats.l_violations), f"|err| <= {lse_atol:g} + {lse_rtol:g}*|ref|{where}")
    m.reasons = reasons
    m.passed = not reasons
    return m


@dataclass
class GateResult:
    """The gate's verdict for one (kernel, problem)."""

    passed: bool
    shape: str  # the problem's text (str(Problem): "4x32x8192", "1x32/8x8192:d64:full")
    seed: int
    sets: list[SetMetrics]
    prepare_host_ms: float | None = None
    problem: dict[str, Any] | None = None  # Problem.to_dict()
    default_passed: bool | None = None  # the default config's gate, where err_vs_default is set

    @property
    def by_set(self) -> dict[str, SetMetrics]:
        return {m.input_set: m for m in self.sets}

    @property
    def max_abs_err(self) -> float:
        return max((m.max_abs_err for m in self.sets), default=0.0)

    @property
    def rel_l2(self) -> float:
        return max((m.rel_l2 for m in self.sets), default=0.0)

    @property
    def violations(self) -> int:
        return sum(m.violations for m in self.sets)

    @property
    def budget_ratio(self) -> float | None:
        """Worst rms_err / budget over the sets (None if no set checked the budget)."""
        return accuracy.worst(m.budget_ratio for m in self.sets)

    @property
    def bf16_ratio(self) -> float | None:
        return accuracy.worst(m.bf16_ratio for m in self.sets)

    @property
    def fa_ratio(self) -> float | None:
        """Worst max|err| / the BF16 implementation's over the sets (None: not computed)."""
        return accuracy.worst(m.fa_ratio for m in self.sets)

    @property
    def lse_ratio(self) -> float | None:
        """Worst LSE max|err| over the sets / the LSE bound's 2^-9 (None: no LSE checked)."""
        return accuracy.worst((m.lse_max_abs_err or 0.0) / LSE_ATOL for m in self.sets
                              if m.lse_checked)

    @property
    def fa_rule_ok(self) -> bool | None:
        return accuracy.all_known(m.fa_rule_ok for m in self.sets)

    @property
    def err_vs_default(self) -> float | None:
        """Worst max|err| / the default config's over the sets (None: not compared)."""
        return accuracy.worst(m.err_vs_default for m in self.sets)

    @property
    def rms_vs_default(self) -> float | None:
        return accuracy.worst(m.rms_vs_default for m in self.sets)

    def first_failure(self) -> SetMetrics | None:
        return next((m for m in self.sets if not m.passed), None)

    @property
    def shape_text(self) -> str:
        s = self.shape
        return "x".join(str(x) for x in s) if isinstance(s, (tuple, list)) else str(s)

    def summary(self) -> str:
        head = f"gate {'PASS' if self.passed else 'FAIL'} {self.shape_text} seed {self.seed}"
        return head + " | " + " | ".join(m.brief() for m in self.sets)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "shape": self.shape_text,
            "problem": self.problem,
            "seed": self.seed,
            "prepare_host_ms": self.prepare_host_ms,
            "max_abs_err": self.max_abs_err,
            "rel_l2": None if math.isinf(self.rel_l2) else self.rel_l2,
            "violations": self.violations,
            "budget_ratio": _finite_or_none(self.budget_ratio),
            "bf16_ratio": _finite_or_none(self.bf16_ratio),
            "fa_ratio": _finite_or_none(self.fa_ratio),
            "fa_rule_ok": self.fa_rule_ok,
            "err_vs_default": _finite_or_none(self.err_vs_default),
            "rms_vs_default": _finite_or_none(self.rms_vs_default),
            "lse_ratio": _finite_or_none(self.lse_ratio),
            "default_passed": self.default_passed,
            "sets": [m.to_dict() for m in self.sets],
            "rule": rule_dict(),
        }


_finite_or_none = accuracy.finite_or_none


def rule_dict() -> dict[str, Any]:
    """The gate's constants, as every GateResult.to_dict() records them."""
    return {
        "o_atol": O_ATOL, "o_rtol": O_RTOL, "rel_l2_max": REL_L2_MAX,
        "lse_atol": LSE_ATOL, "lse_rtol": LSE_RTOL,
        "budget_k": BUDGET_K, "budget_floor": BUDGET_FLOOR, "budget_unit": BF16_UNIT,
        "budget_row_block": ROW_BLOCK,
        "fa_rule_factor": accuracy.FA_RULE_FACTOR, "fa_rule_atol": accuracy.FA_RULE_ATOL,
        "fa_rule_factor_softcap": accuracy.FA_RULE_FACTOR_SOFTCAP,
        "budget": f"per (b, h, {ROW_BLOCK}-row block) and per (b, h, column): rms_err <= "
                  f"{BUDGET_K:g}*rms_bf16 + {BUDGET_FLOOR:g}*2^-9*rms_ref",
    }
