"""The correctness gate: input sets, poisoning, the FP32 reference, and the comparison.

``gate()`` runs, for every input set: generate Q/K/V on the GPU from the seed, poison O and
LSE, launch the kernel once, compute (or reuse) the FP32 reference, compare on the GPU, read
back a 152-byte stats struct and the BF16 error budget's per-block and per-column sums. The GPU
side is ``cuda_src/oracle.cu`` (its header documents the C ABI and the "rising" construction);
this module turns its numbers into pass/fail. docs/GATE.md explains the rule.

Pass, per set: every element |err| <= 0.05 + 0.1*|ref| (the seeds' rule), relative L2 error
<= 1e-2, no NaN/Inf, nothing unwritten (poison pattern left), when the kernel writes LSE every
LSE within 2^-9 + 2^-18*|ref| of the reference (natural-log units), the BF16 error budget:
for every (b, h, block of 16 query rows) and every (b, h, head-dim column d) over all rows,
rms_err <= BUDGET_K * rms_bf16 + BUDGET_FLOOR * 2^-9 * rms_ref, where rms_bf16 is the RMS of
(bf16_rn(ref) - ref) over the same elements (for a column: at least its head's), and
FlashAttention's own test rule: max|err| <= 2 x the max|err| of attention computed in BF16 the
way FlashAttention's tests do it (oracle.cu's BF16-math reference, computed once per input set
beside the FP32 reference and cached with it) + 1e-5 (tuner.measure.accuracy).

Every problem of the family (tuner.problem.Problem: GQA/MQA with Hkv K/V heads, head dim D in
{64, 128, 256}, causal or not) goes through the same path: the generators, the reference and the
comparison take Hq, Hkv, D and the mask from the problem; O, its reference and the budget sums
are per query head ([B, S_q, Hq, D]; blocks of 16 rows x D columns; columns d < D).

Queries over a longer KV (S_q < S_k, bottom-right causal) change the inputs and the reference
(oracle.cu), not the rule: O, LSE and the budget's blocks and columns are over the query rows.
So do the models' masks (a sliding window, a softcap, attention sinks: issue 36): the references
compute them, each input set draws the problem's sinks beside Q, K and V (``fill_inputs``), and
the LSE the gate checks includes the sink.

The rule itself (tolerances, the budget, the stats struct, ``evaluate``, ``GateResult``) and the
NumPy twin of the budget sums and of the comparison live in tuner.measure.gate_rule. The NumPy
twin of the input generators (bit-exact) and the float64 NumPy reference live in
tuner.measure.reference_numpy and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tuner.errors import FaTuneError  # noqa: F401 - O.FaTuneError (input-set errors)
from tuner.kernel.runtime import (
    BF16_BYTES,
    F32_BYTES,
    ORACLE_STATS_BYTES,
    AttnBuffers,
    BufferGroup,
    CudaError,
    Device,
    DeviceBuffer,
    KernelError,
    OracleModule,
    ShapeLike,
    Stream,
    as_problem,
    elems_kv,
    problem_dims,
    same_problem,
)
from tuner.measure.accuracy import ImplError
from tuner.measure.gate_rule import (
    _STATS_DTYPE,
    LSE_ATOL,
    LSE_RTOL,
    O_ATOL,
    O_RTOL,
    BudgetSums,
    GateResult,
    OracleStats,
    SetMetrics,
    _shape_str,
    evaluate,
)
from tuner.measure.reference_numpy import (  # noqa: F401 - re-exported: the twin's old home
    DEFAULT_SEED,
    INPUT_SETS,
    RISING_MAX_S,
    SINK_STREAMS,
    STREAM_K,
    STREAM_PK,
    STREAM_PQ,
    STREAM_PV,
    STREAM_Q,
    STREAM_RC2,
    STREAM_RJIT,
    STREAM_RK,
    STREAM_RQ,
    STREAM_RV,
    STREAM_V,
    bf16_bits_to_f32,
    causal_mask,
    check_input_set,
    f32_to_bf16_bits,
    hash3,
    host_inputs,
    host_sinks,
    numpy_reference,
    numpy_reference_bf16,
    numpy_reference_for,
    numpy_reference_rows,
    numpy_reference_varlen,
    peaky_amplitude,
    rising_c2_scale,
    rising_failures,
    rising_min_rise,
    rising_noise_bound,
    scores_f64,
    sink_range,
    uniform01,
    uniform_in,
)

DEFAULT_INPUT_SETS = ("seed", "rising")


def gate_sets(shape: ShapeLike, input_sets: Sequence[str]) -> tuple[str, ...]:
    """The input sets a gate runs: those asked for, and for a softcap problem the peaky set too
    (scores spread to the cap, where a tanh form errs most: docs/GATE.md)."""
    sets = tuple(input_sets)
    if as_problem(shape).softcap > 0 and "peaky" not in sets:
        sets += ("peaky",)
    return sets

# Reference debug flags (oracle.cu): used by self-tests to prove bugs are caught.
REF_REVERSE = 1
REF_BUG_NO_RESCALE_O = 2
REF_BUG_NO_RESCALE_L = 4
REF_BUG_NO_SINK = 8  # the sink left out
REF_BUG_SINK_LN2 = 16  # the sink times ln 2 (natural-log sink given to a base-2 softmax)
REF_BUG_WIDE_WINDOW = 32  # the window one key wider


class KernelLike(Protocol):
    """What the gate needs from a kernel: tuner.kernel.runtime.KernelModule, or a test double."""

    @property
    def writes_lse(self) -> bool: ...

    def prepare(self, shape: ShapeLike, stream: Stream | int | None) -> float: ...

    def forward(self, bufs: AttnBuffers, stream: Stream | int | None) -> None: ...


# ---- stats struct ---------------------------------------------------------------------------
assert _STATS_DTYPE.itemsize == ORACLE_STATS_BYTES


# ---- index decoding -------------------------------------------------------------------------


# ---- the BF16 error budget ------------------------------------------------------------------


# ---- metrics and verdict --------------------------------------------------------------------


# ---- the oracle library ---------------------------------------------------------------------
_ORACLE: dict[str, OracleModule] = {}


def get_oracle(so_path: str | Path | None = None) -> OracleModule:
    """Load oracle.so (building cuda_src/oracle.cu through tuner.kernel.build's cache if needed)."""
    if so_path is None:
        from tuner.kernel import (
            build,  # lazy: build pulls in config/yaml; not needed for a given path
        )

        so_path = build.build_oracle().so_path
    key = str(Path(so_path).resolve())
    mod = _ORACLE.get(key)
    if mod is None:
        mod = OracleModule(key)
        _ORACLE[key] = mod
    return mod


def fill_inputs(oracle: OracleModule, bufs: AttnBuffers, input_set: str, seed: int,
                stream: Stream | int | None) -> None:
    """Generate one input set into bufs.q/k/v on the GPU (asynchronous on ``stream``), and into
    bufs.sinks for a problem with attention sinks (the set's own draw, ``sink_range``), then
    mirror it into the problem's layout buffers (a fused QKV tensor, a [B, H, S, D] cache) where
    it has any: every fill goes through here (Bench.load_inputs, the gate's input sets, the
    check after timing), so what launchables read through the layout's views is always what the
    reference was computed from."""
    shape = bufs.shape
    check_input_set(input_set, shape)
    kind, direction = INPUT_SETS[input_set]
    B, hq, hkv, Sq, Sk, D, _ = problem_dims(shape)  # a packed batch: its as_fixed rows
    if kind == "peaky":
        a = peaky_amplitude(shape)
        oracle.fill_uniform(bufs.q.ptr, B * Sq * hq * D, seed, STREAM_PQ, -a, a, stream)
        oracle.fill_uniform(bufs.k.ptr, B * Sk * hkv * D, seed, STREAM_PK, -a, a, stream)
        oracle.fill_uniform(bufs.v.ptr, B * Sk * hkv * D, seed, STREAM_PV, -1.0, 1.0, stream)
    elif kind == "seed":
        oracle.gen_seed(bufs.q.ptr, bufs.k.ptr, bufs.v.ptr, B, hq, hkv, Sq, Sk, D, seed, stream)
    else:
        p = as_problem(shape)
        cu_k, num_seqs = None, 0
        if p.is_varlen:  # K's trend per sequence: the generator reads the key offsets
            cu_buf = getattr(bufs, "cu_k", None)
            if cu_buf is None:
                raise KernelError(f"buffers of {_shape_str(shape)} hold no cu_seqlens_k")
            cu_k, num_seqs = cu_buf.ptr, p.B
        oracle.gen_rising(bufs.q.ptr, bufs.k.ptr, bufs.v.ptr, B, hq, hkv, Sq, Sk, D, seed,
                          direction, stream, cu_k, num_seqs)
    if getattr(shape, "sinks", False):
        sinks = getattr(bufs, "sinks", None)
        if sinks is None:
            raise KernelError(f"buffers of {_shape_str(shape)} hold no sinks")
        lo, hi = sink_range(shape, input_set)
        oracle.fill_uniform_f32(sinks.ptr, hq, seed, SINK_STREAMS[input_set], lo, hi, stream)
    if getattr(bufs, "layout_bufs", None):  # (stand-in buffers in tests have none)
        oracle.mirror_inputs(bufs, stream)


def poison(oracle: OracleModule, bufs: AttnBuffers, stream: Stream | int | None) -> None:
    oracle.poison(bufs.o.ptr, bufs.n, bufs.lse.ptr, bufs.n_lse, stream)


class ReferenceCache:
    """FP32 reference outputs per (device, problem, input set, seed); the problem's key is all
    of it (B, Hq, Hkv, S_q, S_k, D, causal, the window, softcap and sinks; a packed batch's
    lengths): a causal and a non-causal reference of the same inputs differ. (The sinks' values
    are the input set's, drawn from the seed like Q, K and V.)

    They are expensive (seconds at S=16384) and large (2x the BF16 output), so only ONE problem
    is kept: asking for another problem frees everything first.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[Any, ...], tuple[DeviceBuffer, DeviceBuffer]] = {}
        self._impl: dict[tuple[Any, ...], ImplError] = {}  # the BF16 implementation's error
        self._shape_key: tuple[Any, ...] | None = None

    def get(self, dev: Device, oracle: OracleModule, bufs: AttnBuffers, input_set: str, seed: int,
            stream: Stream | int | None) -> tuple[DeviceBuffer, DeviceBuffer]:
        """The reference for the inputs CURRENTLY in bufs (which must be ``input_set``/``seed``:
        the caller has just generated them). Computes on ``stream`` on a miss."""
        shape_key = (dev.index, as_problem(bufs.shape))  # varlen: the lengths too
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
            oracle.reference_for(bufs, o_ref.ptr, lse_ref.ptr, stream)  # varlen: per sequence
        except BaseException:
            o_ref.free()
            lse_ref.free()
            raise
        entry = self._entries[key] = (o_ref, lse_ref)
        return entry

    def impl_error(self, dev: Device, oracle: OracleModule, bufs: AttnBuffers, input_set: str,
                   seed: int, stream: Stream) -> ImplError:
        """The BF16 implementation's error against the FP32 reference for the inputs CURRENTLY
        in bufs (``input_set``/``seed``, as for get()); computed once, then cached beside the
        reference. Synchronises on a miss."""
        o_ref, _ = self.get(dev, oracle, bufs, input_set, seed, stream)
        key = (*(self._shape_key or ()), input_set, seed)
        hit = self._impl.get(key)
        if hit is None:
            hit = self._impl[key] = bf16_impl_error(dev, oracle, bufs, o_ref, stream)
        return hit

    def clear(self) -> None:
        for o_ref, lse_ref in self._entries.values():
            o_ref.free()
            lse_ref.free()
        self._entries.clear()
        self._impl.clear()
        self._shape_key = None

    def __len__(self) -> int:
        return len(self._entries)


_REF_CACHE = ReferenceCache()


def clear_reference_cache() -> None:
    """Free the cached reference outputs (e.g. before timing a large shape)."""
    _REF_CACHE.clear()


class CompareScratch(BufferGroup):
    """The device buffers one comparison writes: the stats struct and the budget sums
    (B*Hq*ceil(S/16)*16 + B*Hq*D*32 bytes: 2.5 MB at 4x32x16384, D 128)."""

    def __init__(self, dev: Device, shape: ShapeLike) -> None:
        super().__init__(dev)
        self.shape = shape
        nb_blocks, nb_cols = BudgetSums.device_bytes(shape)
        try:
            self.stats = self._alloc(ORACLE_STATS_BYTES)
            self.blocks = self._alloc(nb_blocks)
            self.cols = self._alloc(nb_cols)
        except BaseException:
            self.free()
            raise


def bf16_impl_error(dev: Device, oracle: OracleModule, bufs: AttnBuffers, o_ref: DeviceBuffer,
                    stream: Stream) -> ImplError:
    """Attention of the inputs in bufs computed in BF16 the way FlashAttention's tests do it
    (oracle.cu's BF16-math reference) into a scratch buffer, compared with the FP32 reference
    (no budget sums, no LSE): its max and RMS error. Synchronises."""
    B, hq, _, S, _, D, _ = problem_dims(bufs.shape)
    o_bf16 = dev.alloc(bufs.n * BF16_BYTES)
    try:
        stats_buf = dev.alloc(ORACLE_STATS_BYTES)
    except BaseException:
        o_bf16.free()
        raise
    try:
        oracle.reference_bf16_for(bufs, o_bf16.ptr, stream)
        oracle.compare(o_bf16.ptr, o_ref.ptr, B, hq, S, D, None, None, O_ATOL, O_RTOL, LSE_ATOL,
                       LSE_RTOL, stats_buf.ptr, None, None, stream)
        stream.synchronize()
        stats = OracleStats.from_bytes(stats_buf.copy_to_host(np.uint8, ORACLE_STATS_BYTES))
    finally:
        o_bf16.free()
        stats_buf.free()
    return ImplError.from_stats(stats)


def compare(dev: Device, oracle: OracleModule, bufs: AttnBuffers, o_ref: DeviceBuffer,
            lse_ref: DeviceBuffer | None, stream: Stream,
            scratch: CompareScratch | None = None) -> tuple[OracleStats, BudgetSums]:
    """Compare bufs.o (and bufs.lse when lse_ref is given) with the reference; synchronises.
    Returns the stats struct and the budget sums."""
    s = bufs.shape
    B, hq, _, S, _, D, _ = problem_dims(s)  # over O's query rows
    own = scratch is None
    sc = CompareScratch(dev, s) if scratch is None else scratch
    try:
        oracle.compare(
            bufs.o.ptr, o_ref.ptr, B, hq, S, D,
            bufs.lse.ptr if lse_ref is not None else None,
            lse_ref.ptr if lse_ref is not None else None,
            O_ATOL, O_RTOL, LSE_ATOL, LSE_RTOL, sc.stats.ptr, sc.blocks.ptr, sc.cols.ptr, stream,
        )
        stream.synchronize()
        stats = OracleStats.from_bytes(sc.stats.copy_to_host(np.uint8, ORACLE_STATS_BYTES))
        nb_blocks, nb_cols = BudgetSums.device_bytes(s)
        sums = BudgetSums.from_device(s, sc.blocks.copy_to_host(np.float32, nb_blocks // 4),
                                      sc.cols.copy_to_host(np.float64, nb_cols // 8))
        return stats, sums
    finally:
        if own:
            sc.free()


def _check_metadata(kernel: Any, m: SetMetrics) -> SetMetrics:
    """After a synchronised launch: a kernel whose device checks a packed batch's metadata
    (KernelLaunch) says here whether it rejected it; then the set fails with that reason (its
    outputs are NaN then, but the reason is the device's). Returns ``m``."""
    check = getattr(kernel, "check_status", None)
    if check is not None:
        try:
            check()
        except KernelError as e:
            m.reasons.append(str(e))
            m.passed = False
    return m


def _collect(kernel: Any, bufs: AttnBuffers, stream: Stream) -> None:
    """A launchable that computes elsewhere (a peer: tuner.measure.launch.PeerLaunch) copies
    its output into bufs.o / bufs.lse here; fa-tune's kernels write them directly."""
    collect = getattr(kernel, "collect", None)
    if collect is not None:
        collect(bufs, stream)


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
    fa_rule: bool = True,
) -> GateResult:
    """Check one kernel on one problem against the FP32 reference, for each input set (and,
    with ``fa_rule``, against the BF16 implementation's error: FlashAttention's rule).

    ``shape`` is a tuner.problem.Problem (or anything with its fields: B, H/Hq, S, and
    optionally Hkv, D, causal). Launches the kernel once per set on poisoned outputs. On return
    bufs holds the "seed" input set for ``seed`` again (what timing uses). A launch error
    raises KernelError; a fault during the checked launch raises CudaError (the context is then
    unusable: run in a fresh process).
    """
    if not same_problem(bufs.shape, shape):
        raise ValueError(f"buffers are for {_shape_str(bufs.shape)}, not {_shape_str(shape)}")
    if not input_sets:
        raise ValueError("gate needs at least one input set")
    input_sets = gate_sets(shape, input_sets)
    for name in input_sets:
        check_input_set(name, shape)
    dev.make_current()
    orc = oracle if oracle is not None else get_oracle()
    # `is not None`: an empty ReferenceCache is falsy (it has __len__).
    cache = reference_cache if reference_cache is not None else _REF_CACHE
    st = stream if stream is not None else dev.stream()
    try:
        scratch = CompareScratch(dev, shape)
    except BaseException:
        if stream is None:
            st.destroy()
        raise
    check_lse = bool(kernel.writes_lse)
    results: list[SetMetrics] = []
    try:
        prep_ms = kernel.prepare(shape, st)
        for name in input_sets:
            fill_inputs(orc, bufs, name, seed, st)
            # Reference first: it reads pristine inputs even if a buggy kernel scribbles on them.
            o_ref, lse_ref = cache.get(dev, orc, bufs, name, seed, st)
            impl = cache.impl_error(dev, orc, bufs, name, seed, st) if fa_rule else None
            poison(orc, bufs, st)
            kernel.forward(bufs, st)
            _collect(kernel, bufs, st)
            try:
                stats, sums = compare(dev, orc, bufs, o_ref, lse_ref if check_lse else None, st,
                                      scratch)
            except CudaError as e:
                raise CudaError(
                    f"GPU fault while gating {_shape_str(shape)} on input set '{name}' "
                    f"(kernel launch or reference): {e}",
                    code=e.code,
                ) from None
            results.append(_check_metadata(kernel, evaluate(stats, shape, name, check_lse,
                                                            budget=sums, bf16_impl=impl)))
        # Leave the timing inputs (the seed set) in place.
        fill_inputs(orc, bufs, "seed", seed, st)
        st.synchronize()
    finally:
        # After a GPU fault these calls fail too; never let them mask the real error.
        for cleanup in (scratch.free, *(() if stream is not None else (st.destroy,))):
            try:
                cleanup()
            except Exception:  # noqa: BLE001
                pass
    problem = as_problem(shape)
    return GateResult(
        passed=all(m.passed for m in results),
        shape=str(problem),
        seed=seed,
        sets=results,
        prepare_host_ms=prep_ms,
        problem=problem.to_dict(),
    )


def check_output(
    dev: Device,
    kernel: KernelLike,
    shape: ShapeLike,
    bufs: AttnBuffers,
    seed: int = DEFAULT_SEED,
    *,
    oracle: OracleModule | None = None,
    stream: Stream | None = None,
    reference_cache: ReferenceCache | None = None,
    fa_rule: bool = True,
) -> SetMetrics:
    """Check what the kernel's LAST launch left in bufs (no new launch) against the "seed" set's
    reference, with the gate's rule; bufs must hold the seed inputs for ``seed`` (what gate()
    leaves and timing uses). For a kernel that is right only when the GPU is idle."""
    if not same_problem(bufs.shape, shape):
        raise ValueError(f"buffers are for {_shape_str(bufs.shape)}, not {_shape_str(shape)}")
    dev.make_current()
    orc = oracle if oracle is not None else get_oracle()
    cache = reference_cache if reference_cache is not None else _REF_CACHE
    st = stream if stream is not None else dev.stream()
    check_lse = bool(kernel.writes_lse)
    try:
        _collect(kernel, bufs, st)
        o_ref, lse_ref = cache.get(dev, orc, bufs, "seed", seed, st)
        stats, sums = compare(dev, orc, bufs, o_ref, lse_ref if check_lse else None, st)
        # The BF16 implementation's error is the gate's, cached (it reads only the reference and
        # the inputs, which bufs still hold; a miss recomputes it from them).
        impl = cache.impl_error(dev, orc, bufs, "seed", seed, st) if fa_rule else None
        return _check_metadata(kernel, evaluate(stats, shape, "seed", check_lse, budget=sums,
                                                bf16_impl=impl))
    finally:
        if stream is None:
            try:
                st.destroy()
            except Exception:  # noqa: BLE001
                pass


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
        lse = bufs.lse.ptr if (self._writes_lse and self.lse_target == "lse") else None
        self.oracle.reference_for(bufs, self._scratch.ptr, lse, stream, flags=self.flags)
        self.oracle.f32_to_bf16(self._scratch.ptr, bufs.o.ptr, bufs.n, stream)
        if self.after is not None:
            self.after(bufs, stream)

    def free(self) -> None:
        if self._scratch is not None:
            self._scratch.free()
            self._scratch = None

    def __enter__(self) -> ReferenceKernel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()


def sinks_to_host(bufs: AttnBuffers) -> np.ndarray | None:
    """The sinks in bufs (float32 [Hq], synchronous copy), None for a problem without them."""
    sinks = getattr(bufs, "sinks", None)
    return None if sinks is None else sinks.copy_to_host(np.float32, problem_dims(bufs.shape)[1])


def inputs_to_host(bufs: AttnBuffers) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q ([B, S_q, Hq, D]), K and V ([B, S_k, Hkv, D]) from the device as BF16 bits, uint16
    (synchronous copies; a packed batch: its as_fixed tensors)."""
    B, hq, hkv, Sq, Sk, D, _ = problem_dims(bufs.shape)
    n_kv = elems_kv(bufs.shape)
    return (bufs.q.copy_to_host(np.uint16, bufs.n).reshape(B, Sq, hq, D),
            bufs.k.copy_to_host(np.uint16, n_kv).reshape(B, Sk, hkv, D),
            bufs.v.copy_to_host(np.uint16, n_kv).reshape(B, Sk, hkv, D))
