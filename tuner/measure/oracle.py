"""The correctness gate: input sets, poisoning, the FP32 reference, and the comparison.

``gate()`` runs, for every input set: generate Q/K/V on the GPU from the seed, poison O and
LSE, launch the kernel once, compute (or reuse) the FP32 reference, compare on the GPU, read
back a 144-byte stats struct. The GPU side is ``cuda_src/oracle.cu`` (its header documents the
C ABI and the "rising" construction); this module turns its stats into pass/fail.

Pass, per set: every element |err| <= 0.05 + 0.1*|ref| (the seeds' rule), relative L2 error
<= 1e-2, no NaN/Inf, nothing unwritten (poison pattern left), and, when the kernel writes LSE,
every LSE within 1e-2 + 1e-4*|ref| of the reference (natural-log units).

Also here: a NumPy twin of the GPU input generators (bit-exact, for tests and for checking the
"rising" property on the host) and a float64 NumPy reference for sampled rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tuner.errors import FaTuneError
from tuner.runtime import (
    F32_BYTES,
    HEAD_DIM,
    ORACLE_STATS_BYTES,
    AttnBuffers,
    CudaError,
    Device,
    DeviceBuffer,
    OracleModule,
    ShapeLike,
    Stream,
    elems_bshd,
    elems_lse,
)

# ---- the rule -------------------------------------------------------------------------------
O_ATOL = 0.05
O_RTOL = 0.1
REL_L2_MAX = 1e-2
LSE_ATOL = 1e-2
LSE_RTOL = 1e-4  # matters only for the "rising" set, whose |LSE| reaches ~400 at S=16384
DEFAULT_SEED = 42

POISON_BF16 = 0x7FBF
POISON_F32 = 0x7FBADBAD
NO_VIOLATION = (1 << 64) - 1

# input set -> (generator, direction for "rising" kinds)
INPUT_SETS: dict[str, tuple[str, int]] = {
    "seed": ("seed", 0),  # Q, K ~ U[-2, 2], V ~ U[-1, 1]
    "rising": ("rising", -1),  # running row max rises at every tile of a REVERSE KV walk
    "rising_fwd": ("rising", 1),  # ... of a FORWARD walk
}
DEFAULT_INPUT_SETS = ("seed", "rising")
RISING_MAX_S = 32768

# Reference debug flags (oracle.cu): used by self-tests to prove bugs are caught.
REF_REVERSE = 1
REF_BUG_NO_RESCALE_O = 2
REF_BUG_NO_RESCALE_L = 4


class KernelLike(Protocol):
    """What the gate needs from a kernel: tuner.runtime.KernelModule, or a test double."""

    @property
    def writes_lse(self) -> bool: ...

    def prepare(self, shape: ShapeLike, stream: Stream | int | None) -> float: ...

    def forward(self, bufs: AttnBuffers, stream: Stream | int | None) -> None: ...


# ---- stats struct ---------------------------------------------------------------------------
# Mirrors struct OracleStats in cuda_src/oracle.cu (18 x 8 bytes, little endian).
_STATS_DTYPE = np.dtype(
    [
        ("o_count", "<u8"), ("o_violations", "<u8"), ("o_nonfinite", "<u8"),
        ("o_unwritten", "<u8"), ("o_first_violation", "<u8"), ("o_ref_nonfinite", "<u8"),
        ("o_max_abs_err_bits", "<u8"), ("o_reserved", "<u8"),
        ("o_sum_sq_err", "<f8"), ("o_sum_sq_ref", "<f8"),
        ("l_count", "<u8"), ("l_violations", "<u8"), ("l_nonfinite", "<u8"),
        ("l_unwritten", "<u8"), ("l_first_violation", "<u8"), ("l_ref_nonfinite", "<u8"),
        ("l_max_abs_err_bits", "<u8"), ("l_reserved", "<u8"),
    ]
)
assert _STATS_DTYPE.itemsize == ORACLE_STATS_BYTES


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


# ---- index decoding -------------------------------------------------------------------------
def decode_bshd(index: int, shape: ShapeLike) -> tuple[int, int, int, int]:
    """Flat index into a contiguous [B, S, H, 128] tensor -> (b, s, h, d)."""
    n = elems_bshd(shape)
    if not 0 <= index < n:
        raise ValueError(f"index {index} outside [0, {n})")
    d = index % HEAD_DIM
    row = index // HEAD_DIM
    h = row % shape.H
    s = (row // shape.H) % shape.S
    b = row // (shape.H * shape.S)
    return b, s, h, d


def decode_bhs(index: int, shape: ShapeLike) -> tuple[int, int, int]:
    """Flat index into a contiguous [B, H, S] tensor (LSE) -> (b, h, s)."""
    n = elems_lse(shape)
    if not 0 <= index < n:
        raise ValueError(f"index {index} outside [0, {n})")
    s = index % shape.S
    h = (index // shape.S) % shape.H
    b = index // (shape.S * shape.H)
    return b, h, s


# ---- metrics and verdict --------------------------------------------------------------------
def _shape_str(shape: ShapeLike) -> str:
    return f"{shape.B}x{shape.H}x{shape.S}"


@dataclass
class SetMetrics:
    """Gate metrics of one input set."""

    input_set: str
    passed: bool
    max_abs_err: float
    rel_l2: float
    violations: int
    first_violation: tuple[int, int, int, int] | None  # (b, s, h, d)
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
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("first_violation", "lse_first_violation"):
            if d[k] is not None:
                d[k] = list(d[k])
        if math.isinf(self.rel_l2):
            d["rel_l2"] = None  # JSON has no inf; reasons say why
        return d

    def brief(self) -> str:
        s = f"{self.input_set}: max|err| {self.max_abs_err:.3g}, rel L2 {self.rel_l2:.3g}"
        if self.lse_checked and self.lse_max_abs_err is not None:
            s += f", LSE max|err| {self.lse_max_abs_err:.3g}"
        if not self.passed:
            s += " -- " + "; ".join(self.reasons)
        return s


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
) -> SetMetrics:
    """Turn one stats struct into metrics and a verdict (pure: testable without a GPU)."""
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
    reasons: list[str] = []
    if stats.o_count != n:
        reasons.append(f"compared {stats.o_count} of {n} elements (oracle bug)")
    if stats.o_ref_nonfinite:
        reasons.append(f"reference has {stats.o_ref_nonfinite} non-finite values (oracle bug)")
    if stats.o_unwritten:
        reasons.append(f"{stats.o_unwritten} output elements never written")
    if stats.o_nonfinite:
        reasons.append(f"{stats.o_nonfinite} NaN/Inf outputs")
    if stats.o_violations:
        where = "" if first is None else " (first at b={},s={},h={},d={})".format(*first)
        reasons.append(
            f"{stats.o_violations} elements violate |err| <= {o_atol:g} + {o_rtol:g}*|ref|{where}"
        )
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
    if check_lse:
        nl = elems_lse(shape)
        m.lse_max_abs_err = stats.l_max_abs_err
        m.lse_violations = stats.l_violations
        m.lse_nan_count = stats.l_nonfinite
        m.lse_unwritten = stats.l_unwritten
        if stats.l_violations and stats.l_first_violation != NO_VIOLATION:
            m.lse_first_violation = decode_bhs(stats.l_first_violation, shape)
        if stats.l_count != nl:
            reasons.append(f"compared {stats.l_count} of {nl} LSE values (oracle bug)")
        if stats.l_ref_nonfinite:
            reasons.append(f"reference LSE has {stats.l_ref_nonfinite} non-finite values")
        if stats.l_unwritten:
            reasons.append(f"{stats.l_unwritten} LSE values never written")
        if stats.l_nonfinite:
            reasons.append(f"{stats.l_nonfinite} NaN/Inf LSE values")
        if stats.l_violations:
            lf = m.lse_first_violation
            where = "" if lf is None else " (first at b={},h={},s={})".format(*lf)
            reasons.append(
                f"{stats.l_violations} LSE values violate |err| <= {lse_atol:g} + "
                f"{lse_rtol:g}*|ref|{where}"
            )
    m.reasons = reasons
    m.passed = not reasons
    return m


@dataclass
class GateResult:
    """The gate's verdict for one (kernel, shape)."""

    passed: bool
    shape: tuple[int, int, int]  # (B, H, S)
    seed: int
    sets: list[SetMetrics]
    prepare_host_ms: float | None = None

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

    def first_failure(self) -> SetMetrics | None:
        return next((m for m in self.sets if not m.passed), None)

    def summary(self) -> str:
        b, h, s = self.shape
        head = f"gate {'PASS' if self.passed else 'FAIL'} {b}x{h}x{s} seed {self.seed}"
        return head + " | " + " | ".join(m.brief() for m in self.sets)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "shape": list(self.shape),
            "seed": self.seed,
            "prepare_host_ms": self.prepare_host_ms,
            "max_abs_err": self.max_abs_err,
            "rel_l2": None if math.isinf(self.rel_l2) else self.rel_l2,
            "violations": self.violations,
            "sets": [m.to_dict() for m in self.sets],
            "rule": {
                "o_atol": O_ATOL, "o_rtol": O_RTOL, "rel_l2_max": REL_L2_MAX,
                "lse_atol": LSE_ATOL, "lse_rtol": LSE_RTOL,
            },
        }


# ---- the oracle library ---------------------------------------------------------------------
_ORACLE: dict[str, OracleModule] = {}


def get_oracle(so_path: str | Path | None = None) -> OracleModule:
    """Load oracle.so (building cuda_src/oracle.cu through tuner.build's cache if needed)."""
    if so_path is None:
        from tuner import build  # lazy: build pulls in config/yaml; not needed for a given path

        so_path = build.build_oracle().so_path
    key = str(Path(so_path).resolve())
    mod = _ORACLE.get(key)
    if mod is None:
        mod = OracleModule(key)
        _ORACLE[key] = mod
    return mod


def check_input_set(name: str, shape: ShapeLike) -> None:
    if name not in INPUT_SETS:
        raise FaTuneError(
            f"unknown input set '{name}' (known: {', '.join(sorted(INPUT_SETS))})"
        )
    if INPUT_SETS[name][0] == "rising" and shape.S > RISING_MAX_S:
        raise FaTuneError(f"input set '{name}' supports S <= {RISING_MAX_S} (got {shape.S})")


def fill_inputs(oracle: OracleModule, bufs: AttnBuffers, input_set: str, seed: int,
                stream: Stream | int | None) -> None:
    """Generate one input set into bufs.q/k/v on the GPU (asynchronous on ``stream``)."""
    shape = bufs.shape
    check_input_set(input_set, shape)
    kind, direction = INPUT_SETS[input_set]
    if kind == "seed":
        oracle.gen_seed(bufs.q.ptr, bufs.k.ptr, bufs.v.ptr, shape.B, shape.H, shape.S, seed,
                        stream)
    else:
        oracle.gen_rising(bufs.q.ptr, bufs.k.ptr, bufs.v.ptr, shape.B, shape.H, shape.S, seed,
                          direction, stream)


def poison(oracle: OracleModule, bufs: AttnBuffers, stream: Stream | int | None) -> None:
    oracle.poison(bufs.o.ptr, bufs.n, bufs.lse.ptr, bufs.n_lse, stream)


class ReferenceCache:
    """FP32 reference outputs per (device, shape, input set, seed).

    They are expensive (seconds at S=16384) and large (2x the BF16 output), so only ONE shape
    is kept: asking for another shape frees everything first.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[Any, ...], tuple[DeviceBuffer, DeviceBuffer]] = {}
        self._shape_key: tuple[int, int, int, int] | None = None

    def get(self, dev: Device, oracle: OracleModule, bufs: AttnBuffers, input_set: str, seed: int,
            stream: Stream | int | None) -> tuple[DeviceBuffer, DeviceBuffer]:
        """The reference for the inputs CURRENTLY in bufs (which must be ``input_set``/``seed``:
        the caller has just generated them). Computes on ``stream`` on a miss."""
        s = bufs.shape
        shape_key = (dev.index, s.B, s.H, s.S)
        if self._shape_key != shape_key:
            self.clear()
            self._shape_key = shape_key
        key = (*shape_key, input_set, seed)
        hit = self._entries.get(key)
        if hit is not None:
            return hit
        o_ref = dev.alloc(bufs.n * F32_BYTES)
        try:
            lse_ref = dev.alloc(bufs.n_lse * F32_BYTES)
        except BaseException:
            o_ref.free()
            raise
        try:
            oracle.reference(bufs.q.ptr, bufs.k.ptr, bufs.v.ptr, o_ref.ptr, lse_ref.ptr,
                             s.B, s.H, s.S, stream)
        except BaseException:
            o_ref.free()
            lse_ref.free()
            raise
        entry = self._entries[key] = (o_ref, lse_ref)
        return entry

    def clear(self) -> None:
        for o_ref, lse_ref in self._entries.values():
            o_ref.free()
            lse_ref.free()
        self._entries.clear()
        self._shape_key = None

    def __len__(self) -> int:
        return len(self._entries)


_REF_CACHE = ReferenceCache()


def clear_reference_cache() -> None:
    """Free the cached reference outputs (e.g. before timing a large shape)."""
    _REF_CACHE.clear()


def compare(dev: Device, oracle: OracleModule, bufs: AttnBuffers, o_ref: DeviceBuffer,
            lse_ref: DeviceBuffer | None, stream: Stream, stats_buf: DeviceBuffer | None = None,
            ) -> OracleStats:
    """Compare bufs.o (and bufs.lse when lse_ref is given) with the reference; synchronises."""
    own = stats_buf is None
    sb = dev.alloc(ORACLE_STATS_BYTES) if stats_buf is None else stats_buf
    try:
        oracle.compare(
            bufs.o.ptr, o_ref.ptr, bufs.n,
            bufs.lse.ptr if lse_ref is not None else None,
            lse_ref.ptr if lse_ref is not None else None,
            bufs.n_lse if lse_ref is not None else 0,
            O_ATOL, O_RTOL, LSE_ATOL, LSE_RTOL, sb.ptr, stream,
        )
        stream.synchronize()
        return OracleStats.from_bytes(sb.copy_to_host(np.uint8, ORACLE_STATS_BYTES))
    finally:
        if own:
            sb.free()


def gate(
    dev: Device,
    kernel: KernelLike,
    shape: ShapeLike,
    bufs: AttnBuffers,
    seed: int = DEFAULT_SEED,
    input_sets: Sequence[str] = DEFAULT_INPUT_SETS,
    *,
    oracle: OracleModule | None = None,
    stream: Stream | None = None,
    reference_cache: ReferenceCache | None = None,
) -> GateResult:
    """Check one kernel on one shape against the FP32 reference, for each input set.

    Launches the kernel once per set on poisoned outputs. On return bufs holds the "seed" input
    set for ``seed`` again (what timing uses). A launch error raises KernelError; a fault during
    the checked launch raises CudaError (the context is then unusable: run in a fresh process).
    """
    if (bufs.shape.B, bufs.shape.H, bufs.shape.S) != (shape.B, shape.H, shape.S):
        raise ValueError(f"buffers are for {_shape_str(bufs.shape)}, not {_shape_str(shape)}")
    if not input_sets:
        raise ValueError("gate needs at least one input set")
    for name in input_sets:
        check_input_set(name, shape)
    dev.make_current()
    orc = oracle if oracle is not None else get_oracle()
    # `is not None`: an empty ReferenceCache is falsy (it has __len__).
    cache = reference_cache if reference_cache is not None else _REF_CACHE
    st = stream if stream is not None else dev.stream()
    stats_buf = dev.alloc(ORACLE_STATS_BYTES)
    check_lse = bool(kernel.writes_lse)
    results: list[SetMetrics] = []
    try:
        prep_ms = kernel.prepare(shape, st)
        for name in input_sets:
            fill_inputs(orc, bufs, name, seed, st)
            # Reference first: it reads pristine inputs even if a buggy kernel scribbles on them.
            o_ref, lse_ref = cache.get(dev, orc, bufs, name, seed, st)
            poison(orc, bufs, st)
            kernel.forward(bufs, st)
            try:
                stats = compare(dev, orc, bufs, o_ref, lse_ref if check_lse else None, st,
                                stats_buf)
            except CudaError as e:
                raise CudaError(
                    f"GPU fault while gating {_shape_str(shape)} on input set '{name}' "
                    f"(kernel launch or reference): {e}",
                    code=e.code,
                ) from None
            results.append(evaluate(stats, shape, name, check_lse))
        # Leave the timing inputs (the seed set) in place.
        fill_inputs(orc, bufs, "seed", seed, st)
        st.synchronize()
    finally:
        # After a GPU fault these calls fail too; never let them mask the real error.
        for cleanup in (stats_buf.free, *(() if stream is not None else (st.destroy,))):
            try:
                cleanup()
            except Exception:  # noqa: BLE001
                pass
    return GateResult(
        passed=all(m.passed for m in results),
        shape=(shape.B, shape.H, shape.S),
        seed=seed,
        sets=results,
        prepare_host_ms=prep_ms,
    )


# ---- self-test helpers ----------------------------------------------------------------------
class ReferenceKernel:
    """A KernelLike whose output is the oracle's FP32 reference rounded to BF16.

    For self-tests of the gate: it must pass; with ``flags`` (REF_BUG_*, REF_REVERSE) it injects
    real kernel bugs the gate must catch; ``after(bufs, stream)`` runs after each launch (e.g. to
    corrupt one element). ``write_lse=False`` mimics a variant that does not write LSE.
    """

    def __init__(self, dev: Device, oracle: OracleModule, flags: int = 0, *,
                 writes_lse: bool = True, lse_target: str = "lse",
                 after: Any = None) -> None:
        self.dev = dev
        self.oracle = oracle
        self.flags = flags
        self._writes_lse = writes_lse
        self.lse_target = lse_target  # "lse" writes bufs.lse; "none" leaves it (a missing write)
        self.after = after
        self._scratch: DeviceBuffer | None = None

    @property
    def writes_lse(self) -> bool:
        return self._writes_lse

    def prepare(self, shape: ShapeLike, stream: Stream | int | None) -> float:
        return 0.0

    def forward(self, bufs: AttnBuffers, stream: Stream | int | None) -> None:
        if self._scratch is None or self._scratch.nbytes < bufs.n * F32_BYTES:
            if self._scratch is not None:
                self._scratch.free()
            self._scratch = self.dev.alloc(bufs.n * F32_BYTES)
        s = bufs.shape
        lse = bufs.lse.ptr if (self._writes_lse and self.lse_target == "lse") else None
        self.oracle.reference(bufs.q.ptr, bufs.k.ptr, bufs.v.ptr, self._scratch.ptr, lse,
                              s.B, s.H, s.S, stream, flags=self.flags)
        self.oracle.f32_to_bf16(self._scratch.ptr, bufs.o.ptr, bufs.n, stream)
        if self.after is not None:
            self.after(bufs, stream)

    def free(self) -> None:
        if self._scratch is not None:
            self._scratch.free()
            self._scratch = None


def inputs_to_host(bufs: AttnBuffers) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q, K, V from the device as BF16 bits, [B, S, H, 128] uint16 (synchronous copies)."""
    s = bufs.shape
    dims = (s.B, s.S, s.H, HEAD_DIM)
    return tuple(  # type: ignore[return-value]
        b.copy_to_host(np.uint16, bufs.n).reshape(dims) for b in (bufs.q, bufs.k, bufs.v)
    )


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
    """Q, K, V exactly as the GPU generates them: BF16 bit patterns, [B, S, H, 128] uint16.

    For small shapes (tests): memory is O(B*S*H*128) 8-byte temporaries.
    """
    check_input_set(input_set, shape)
    B, H, S = shape.B, shape.H, shape.S
    dims = (B, S, H, HEAD_DIM)
    n = B * S * H * HEAD_DIM
    i = np.arange(n, dtype=np.uint64)
    kind, direction = INPUT_SETS[input_set]
    if kind == "seed":
        q = f32_to_bf16_bits(uniform_in(seed, STREAM_Q, i, -2.0, 2.0))
        k = f32_to_bf16_bits(uniform_in(seed, STREAM_K, i, -2.0, 2.0))
        v = f32_to_bf16_bits(uniform_in(seed, STREAM_V, i, -1.0, 1.0))
        return q.reshape(dims), k.reshape(dims), v.reshape(dims)

    # "rising": see cuda_src/oracle.cu's header for the construction and its proof.
    b_idx = np.arange(B, dtype=np.int64)[:, None, None]
    s_idx = np.arange(S, dtype=np.int64)[None, :, None]
    h_idx = np.arange(H, dtype=np.int64)[None, None, :]
    row_key = ((b_idx * H + h_idx) * S + s_idx).astype(np.uint64)  # [B, S, H]
    c2 = bf16_bits_to_f32(f32_to_bf16_bits(
        np.float32(0.09) + np.float32(0.045) * uniform01(seed, STREAM_RC2, row_key)))
    jit = (hash3(seed, STREAM_RJIT, row_key) >> np.uint64(62)).astype(np.int64)
    half = S // 2
    t = (4 * (half - s_idx) if direction < 0 else 4 * (s_idx - half)) + jit
    hi = np.floor_divide(t, 256)
    lo = t - 256 * hi

    qf = uniform_in(seed, STREAM_RQ, i, -1.0, 1.0).reshape(dims)
    qf[..., 0] = c2 * np.float32(256.0)
    qf[..., 1] = c2
    k_strong = uniform_in(seed, STREAM_RK, i, -1.0, 1.0).reshape(dims)
    k_weak = uniform_in(seed, STREAM_RK, i, -0.01, 0.01).reshape(dims)
    kf = np.where(np.arange(HEAD_DIM) < 10, k_strong, k_weak).astype(np.float32)
    kf[..., 0] = hi.astype(np.float32)
    kf[..., 1] = lo.astype(np.float32)
    vf = uniform_in(seed, STREAM_RV, i, -1.0, 1.0).reshape(dims)
    return f32_to_bf16_bits(qf), f32_to_bf16_bits(kf), f32_to_bf16_bits(vf)


# ---- float64 NumPy reference and the rising check -------------------------------------------
def numpy_reference_rows(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                         rows: Iterable[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Causal attention in float64 for sampled rows (b, h, s); inputs [B, S, H, 128] BF16 bits
    or floats. Returns (o [n, 128], lse [n])."""
    qf = bf16_bits_to_f32(q) if q.dtype == np.uint16 else q
    kf = bf16_bits_to_f32(k) if k.dtype == np.uint16 else k
    vf = bf16_bits_to_f32(v) if v.dtype == np.uint16 else v
    outs, lses = [], []
    scale = 1.0 / math.sqrt(HEAD_DIM)
    for b, h, s in rows:
        qr = qf[b, s, h, :].astype(np.float64)
        kr = kf[b, : s + 1, h, :].astype(np.float64)
        vr = vf[b, : s + 1, h, :].astype(np.float64)
        sc = kr @ qr * scale
        m = sc.max()
        p = np.exp(sc - m)
        lsum = p.sum()
        outs.append(p @ vr / lsum)
        lses.append(m + math.log(lsum))
    return np.array(outs), np.array(lses)


def scores_f64(q: np.ndarray, k: np.ndarray, b: int, h: int) -> np.ndarray:
    """[S, S] float64 logits q.k/sqrt(128) of one (b, h), causal entries only meaningful."""
    qf = bf16_bits_to_f32(q[b, :, h, :]).astype(np.float64)
    kf = bf16_bits_to_f32(k[b, :, h, :]).astype(np.float64)
    return qf @ kf.T / math.sqrt(HEAD_DIM)


def rising_failures(q: np.ndarray, k: np.ndarray, block_n: int, reverse: bool = True,
                    min_rise: float = 0.0) -> int:
    """How many (b, h, row, tile) steps of a KV-tile walk do NOT raise the running row max by
    more than ``min_rise`` (the first tile of each row excluded). 0 for a correct rising set."""
    B, S, H, _ = q.shape
    fails = 0
    for b in range(B):
        for h in range(H):
            sc = scores_f64(q, k, b, h)
            rows = np.arange(S)
            mask = np.arange(S)[None, :] <= rows[:, None]
            sc = np.where(mask, sc, -np.inf)
            n_tiles = (S + block_n - 1) // block_n
            tile_max = np.stack(
                [sc[:, t * block_n:(t + 1) * block_n].max(axis=1) for t in range(n_tiles)], axis=1
            )  # [S, n_tiles]; -inf where the tile is fully masked
            for r in range(S):
                last = r // block_n
                order = range(last, -1, -1) if reverse else range(0, last + 1)
                run = -np.inf
                for j, t in enumerate(order):
                    if j > 0 and not tile_max[r, t] > run + min_rise:
                        fails += 1
                    run = max(run, tile_max[r, t])
    return fails
