"""Accuracy in plain sight (docs/GATE.md, "Error ratios"): a kernel's error against two yardsticks
that a user choosing a config can read, beside the gate's pass/fail.

* FlashAttention's own test rule: ``err_max <= FA_RULE_FACTOR * err_bf16_max + FA_RULE_ATOL``,
  err_max = max |O - O_ref| (the FP32 reference) and err_bf16_max = max |O_bf16 - O_ref|, O_bf16
  attention computed in BF16 the way FlashAttention's tests do it (``attention_ref(upcast=False)``;
  oracle.cu's BF16-math reference, computed once per input set like the FP32 reference; its
  NumPy twin is tuner.measure.reference_numpy.numpy_reference_bf16). ``fa_ratio`` = err_max /
  err_bf16_max. A correct kernel (P and O rounded to BF16 once each, FP32 scores) measures
  0.2-0.8 of the BF16 implementation's error in the NumPy emulation, which also rounds the
  scores. Recorded in every gate result, and it fails the gate (FA_RULE_GATES): the GPU BF16
  reference equals its NumPy twin on the H200 (tests/gpu/test_oracle_gpu.py, 2026-12-05), so
  the yardstick is checked and rejects no correct kernel.
* The default config's error on the same inputs (``err_vs_default``: max|err| / the default's
  max|err|; ``rms_vs_default``: relative L2 / the default's, the same reference so the same
  RMS ratio): what a searched config costs in accuracy against the one fa-tune ships by
  default. Recorded; ``fa-tune search --max-error-ratio`` rejects on it.
* The LSE's error in units of the gate's LSE bound (``lse_ratio``: max |LSE - LSE_ref| / 2^-9):
  FA3 read 0.0015 on the seed set and 0.125 on the rising set (H100, 1x64/8x8192:d64); a row
  sum of BF16-rounded P (``sum_in_pv``) reached 1.03, where the gate refuses (docs/PERF.md step
  63). Recorded.

No GPU and no gate types here (gate_rule imports this module): plain numbers and duck-typed
metrics objects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

FA_RULE_FACTOR = 2.0  # flash-attention's tests: rtol = 2 (no softcap)
FA_RULE_FACTOR_SOFTCAP = 3.0  # ... and 3 with a softcap (tests/cute/test_flash_attn.py)
FA_RULE_ATOL = 1e-5
# Whether a kernel failing the rule fails the gate (False: recorded only, as before the GPU
# BF16 reference was checked).
FA_RULE_GATES = True
FA_RULE_TEXT = (f"max|err| <= {FA_RULE_FACTOR:g} x the BF16 implementation's max|err| + "
                f"{FA_RULE_ATOL:g} (FlashAttention's test rule)")


@dataclass(frozen=True)
class ImplError:
    """The BF16 implementation's error against the FP32 reference on one input set."""

    max_abs_err: float
    rms_err: float  # sqrt(sum err^2 / compared elements)

    @classmethod
    def from_stats(cls, stats: Any) -> ImplError:
        """From the comparison's stats struct (gate_rule.OracleStats) of O_bf16 vs O_ref."""
        n = max(1, int(stats.o_count) - int(stats.o_nonfinite) - int(stats.o_unwritten)
                - int(stats.o_ref_nonfinite))
        return cls(max_abs_err=float(stats.o_max_abs_err),
                   rms_err=math.sqrt(max(0.0, float(stats.o_sum_sq_err)) / n))

    def to_dict(self) -> dict[str, float]:
        return {"max_abs_err": self.max_abs_err, "rms_err": self.rms_err}


def error_ratio(err: float | None, base: float | None) -> float | None:
    """err / base; None when either is unknown; equal zeros are 1 (as good), err > 0 over a
    zero base is inf."""
    if err is None or base is None or not math.isfinite(err) or not math.isfinite(base):
        return None
    if base > 0:
        return err / base
    return 1.0 if err == 0 else math.inf


def fa_rule_factor(problem: Any) -> float:
    """FlashAttention's factor for a problem: 2, or 3 with a logit softcap (its tests' rtol:
    the BF16 implementation's tanh of BF16 scores is the smaller error there)."""
    return FA_RULE_FACTOR_SOFTCAP if getattr(problem, "softcap", 0) > 0 else FA_RULE_FACTOR


def fa_rule(err_max: float, err_bf16_max: float,
            factor: float = FA_RULE_FACTOR) -> tuple[float | None, bool]:
    """(fa_ratio, whether FlashAttention's rule holds, err_max <= factor x err_bf16_max +
    FA_RULE_ATOL)."""
    ok = err_max <= factor * err_bf16_max + FA_RULE_ATOL
    return error_ratio(err_max, err_bf16_max), bool(ok)


def fa_rule_reason(err_max: float, err_bf16_max: float, factor: float = FA_RULE_FACTOR) -> str:
    ratio = error_ratio(err_max, err_bf16_max)
    r = "inf" if ratio is None or not math.isfinite(ratio) else f"{ratio:.3g}"
    return (f"max|err| {err_max:.3g} > {factor:g} x {err_bf16_max:.3g} (the BF16 "
            f"implementation's) + {FA_RULE_ATOL:g}: {r}x the BF16 implementation's error "
            "(FlashAttention's test rule)")


def relate_set(m: Any, d: Any) -> None:
    """Set ``m.err_vs_default`` and ``m.rms_vs_default`` (m, d: gate_rule.SetMetrics of the same
    input set, d the default config's)."""
    m.err_vs_default = error_ratio(m.max_abs_err, d.max_abs_err)
    m.rms_vs_default = error_ratio(m.rel_l2, d.rel_l2)


def relate(g: Any, d: Any) -> None:
    """Every set of ``g`` (a gate_rule.GateResult) against the same set of ``d``, the default
    config's gate on the same problem, seed and inputs."""
    by = {m.input_set: m for m in d.sets}
    for m in g.sets:
        if m.input_set in by:
            relate_set(m, by[m.input_set])
    g.default_passed = bool(d.passed)


def worst(values: Any) -> float | None:
    """The largest of the known values (inf included), None when none is known."""
    vals = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return max(vals) if vals else None


def all_known(oks: Any) -> bool | None:
    """Whether every known verdict holds (None when none is known)."""
    known = [ok for ok in oks if ok is not None]
    return all(known) if known else None


def finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def ratio_text(x: Any) -> str:
    """A ratio for tables: '0.52', 'inf', or '-' when not recorded."""
    if not isinstance(x, (int, float)):
        return "-"
    return f"{x:.2f}" if math.isfinite(x) else "inf"


def accuracy_record(gate: dict[str, Any] | None) -> dict[str, Any]:
    """The error ratios of a stored gate dict (Bench's gate_dict, a trial's, an export's):
    {fa_ratio, fa_rule_ok, err_vs_default, rms_vs_default, lse_ratio} (None where not
    recorded)."""
    g = gate or {}
    det = got if isinstance(got := g.get("details"), dict) else {}
    out = {}
    for k in ("fa_ratio", "fa_rule_ok", "err_vs_default", "rms_vs_default", "lse_ratio"):
        out[k] = g.get(k, det.get(k))
    return out


def max_error_ratio_reason(err_vs_default: float | None, limit: float, shape: str) -> str | None:
    """Why a candidate fails ``--max-error-ratio`` on ``shape`` (None: it does not)."""
    if err_vs_default is None:
        return (f"error ratio: no default-config error to compare with on {shape} "
                f"(--max-error-ratio {limit:g})")
    if err_vs_default > limit:
        return (f"error ratio: max|err| is {ratio_text(err_vs_default)}x the default config's "
                f"on {shape}, over --max-error-ratio {limit:g}")
    return None
