"""GPU tests of the oracle: generators vs the NumPy twin, the FP32 reference vs NumPy float64 on
sampled rows, oracle_compare (stats and BF16 budget sums) vs its NumPy twin, and the gate against
the reference kernel with injected bugs; for MHA D 128 causal and for the problem family (GQA,
MQA, head dims 64 and 256, non-causal)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tuner.kernel.runtime import AttnBuffers, Device, OracleModule, Stream
from tuner.measure import gate_rule as GR
from tuner.measure import oracle as O
from tuner.problem import Problem

pytestmark = pytest.mark.gpu


def Shape(B: int, H: int, S: int) -> SimpleNamespace:  # noqa: N802 - an MHA D 128 problem
    return SimpleNamespace(B=B, H=H, S=S)


# Small problems of each kind (the reference's GQA mapping, D templates and mask).
FAMILY = [
    Problem(1, 4, 256, Hkv=2),  # GQA
    Problem(2, 4, 200, Hkv=1),  # MQA, S not a multiple of 64
    Problem(1, 2, 256, D=64),
    Problem(1, 2, 200, D=256),
    Problem(1, 2, 256, causal=False),
    Problem(1, 8, 320, Hkv=2, D=64, causal=False),
    Problem(1, 4, 130, Hkv=1, D=256, causal=False),
]


def test_device_is_sm90(dev: Device) -> None:
    assert dev.cc == (9, 0)
    assert dev.sm_count >= 100 and dev.l2_bytes > 0
    assert dev.info.cuda_driver_version >= 12000


def test_buffers_roundtrip(dev: Device) -> None:
    with dev.alloc(4096) as b:
        x = np.arange(1024, dtype=np.float32)
        b.copy_from_host(x)
        assert np.array_equal(b.copy_to_host(np.float32), x)
        b.copy_from_host(np.array([7], np.uint16), offset=6)
        assert b.copy_to_host(np.uint16, 4)[3] == 7
        b.memset_u8(0xAB)
        assert set(b.copy_to_host(np.uint8).tolist()) == {0xAB}


@pytest.mark.parametrize("shape", [Shape(2, 3, 256), Problem(2, 6, 100, Hkv=2, D=64),
                                   Problem(1, 4, 64, Hkv=1, D=256, causal=False)], ids=str)
@pytest.mark.parametrize("input_set", sorted(O.INPUT_SETS))
def test_generators_equal_numpy_twin(dev: Device, orc: OracleModule, stream: Stream,
                                     input_set: str, shape: Any) -> None:
    with AttnBuffers(dev, shape) as bufs:
        O.fill_inputs(orc, bufs, input_set, 42, stream)
        stream.synchronize()
        got = O.inputs_to_host(bufs)
    want = O.host_inputs(shape, input_set, 42)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w)


def test_poison_patterns(dev: Device, orc: OracleModule, stream: Stream) -> None:
    shape = Shape(1, 2, 64)
    with AttnBuffers(dev, shape) as bufs:
        O.poison(orc, bufs, stream)
        stream.synchronize()
        assert set(bufs.o.copy_to_host(np.uint16).tolist()) == {GR.POISON_BF16}
        assert set(bufs.lse.copy_to_host(np.uint32).tolist()) == {GR.POISON_F32}


def test_rising_set_rises_on_gpu_inputs(dev: Device, orc: OracleModule, stream: Stream) -> None:
    shape = Shape(1, 2, 1024)
    with AttnBuffers(dev, shape) as bufs:
        O.fill_inputs(orc, bufs, "rising", 42, stream)
        stream.synchronize()
        q, k, _ = O.inputs_to_host(bufs)
    for block_n in (64, 128, 192):
        assert O.rising_failures(q, k, block_n, reverse=True, min_rise=0.38) == 0


def _rows(shape: SimpleNamespace, bhs: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    S = shape.S
    ss = sorted({0, 1, 63, 64, 65, 127, 128, S // 2, S - 65, S - 64, S - 2, S - 1} & set(range(S)))
    return [(b, h, s) for b, h in bhs for s in ss]


@pytest.mark.parametrize(
    ("shape", "bhs"),
    [
        (Shape(1, 2, 256), [(0, 0), (0, 1)]),
        (Shape(2, 3, 1024), [(0, 0), (1, 2), (1, 0)]),
        (Shape(1, 2, 200), [(0, 1)]),  # S not a multiple of the reference's tile
        (Shape(1, 2, 4096), [(0, 1)]),
    ],
)
@pytest.mark.parametrize("input_set", ["seed", "rising"])
def test_reference_matches_float64(dev: Device, orc: OracleModule, stream: Stream,
                                   shape: SimpleNamespace, bhs: list[tuple[int, int]],
                                   input_set: str) -> None:
    with AttnBuffers(dev, shape) as bufs, dev.alloc(bufs.n * 4) as o_ref, \
            dev.alloc(bufs.n_lse * 4) as lse_ref:
        O.fill_inputs(orc, bufs, input_set, 42, stream)
        orc.reference_for(bufs, o_ref.ptr, lse_ref.ptr, stream)
        stream.synchronize()
        q, k, v = O.inputs_to_host(bufs)
        o_gpu = o_ref.copy_to_host(np.float32).reshape(shape.B, shape.S, shape.H, 128)
        l_gpu = lse_ref.copy_to_host(np.float32).reshape(shape.B, shape.H, shape.S)
    assert np.isfinite(o_gpu).all() and np.isfinite(l_gpu).all()
    rows = _rows(shape, bhs)
    o_np, l_np = O.numpy_reference_rows(q, k, v, rows)
    for i, (b, h, s) in enumerate(rows):
        np.testing.assert_allclose(o_gpu[b, s, h], o_np[i], atol=1e-4, rtol=0,
                                   err_msg=f"row {(b, h, s)}")
        assert abs(l_gpu[b, h, s] - l_np[i]) <= 1e-5 * (1 + abs(l_np[i])), (b, h, s)


@pytest.mark.parametrize("problem", FAMILY, ids=str)
@pytest.mark.parametrize("input_set", ["seed", "rising"])
def test_reference_matches_float64_for_the_family(dev: Device, orc: OracleModule,
                                                  stream: Stream, problem: Problem,
                                                  input_set: str) -> None:
    """The whole FP32 reference (every row, every head) against NumPy float64: GQA mapping
    (query head h reads K/V head h / group), 1/sqrt(D), the D 64/256 templates and the mask."""
    with AttnBuffers(dev, problem) as bufs, dev.alloc(bufs.n * 4) as o_ref, \
            dev.alloc(bufs.n_lse * 4) as lse_ref:
        O.fill_inputs(orc, bufs, input_set, 42, stream)
        orc.reference_for(bufs, o_ref.ptr, lse_ref.ptr, stream)
        stream.synchronize()
        q, k, v = O.inputs_to_host(bufs)
        o_gpu = o_ref.copy_to_host(np.float32).reshape(problem.B, problem.S, problem.Hq,
                                                       problem.D)
        l_gpu = lse_ref.copy_to_host(np.float32).reshape(problem.B, problem.Hq, problem.S)
    o_np, l_np = O.numpy_reference(q, k, v, problem.causal)
    assert np.isfinite(o_gpu).all() and np.isfinite(l_gpu).all()
    np.testing.assert_allclose(o_gpu, o_np, atol=1e-4, rtol=0)
    np.testing.assert_allclose(l_gpu, l_np, atol=1e-5, rtol=1e-5)


# ---- the gate -------------------------------------------------------------------------------
GATE_SHAPE = Shape(2, 4, 1024)


@pytest.fixture(scope="module")
def gbufs(dev: Device) -> Iterator[AttnBuffers]:
    b = AttnBuffers(dev, GATE_SHAPE)
    yield b
    b.free()
    O.clear_reference_cache()


def _gate(dev: Device, orc: OracleModule, stream: Stream, bufs: AttnBuffers, kern: Any,
          sets: tuple[str, ...] = ("seed", "rising")) -> GR.GateResult:
    try:
        return O.gate(dev, kern, GATE_SHAPE, bufs, 42, sets, oracle=orc, stream=stream)
    finally:
        kern.free()


def test_gate_passes_reference_kernel(dev: Device, orc: OracleModule, stream: Stream,
                                      gbufs: AttnBuffers) -> None:
    g = _gate(dev, orc, stream, gbufs, O.ReferenceKernel(dev, orc))
    assert g.passed, g.summary()
    for m in g.sets:
        assert m.violations == 0 and m.unwritten == 0 and m.nan_count == 0
        assert m.max_abs_err < 0.01 and m.rel_l2 < 5e-3 and m.lse_checked
        # Its output IS the reference rounded to BF16: the error is exactly the rounding error.
        assert m.bf16_ratio == pytest.approx(1.0, abs=1e-3) and m.budget_ratio < 0.5
        assert m.err_over_bf16 == pytest.approx(1.0, abs=1e-6)
    # The gate leaves the seed set in the buffers (timing uses it).
    q, _, _ = O.inputs_to_host(gbufs)
    assert np.array_equal(q, O.host_inputs(GATE_SHAPE, "seed", 42)[0])


def test_gate_passes_reverse_walk(dev: Device, orc: OracleModule, stream: Stream,
                                  gbufs: AttnBuffers) -> None:
    g = _gate(dev, orc, stream, gbufs, O.ReferenceKernel(dev, orc, O.REF_REVERSE))
    assert g.passed, g.summary()


@pytest.mark.parametrize(
    ("flags", "catching_set"),
    [
        (O.REF_REVERSE | O.REF_BUG_NO_RESCALE_O, "rising"),
        (O.REF_REVERSE | O.REF_BUG_NO_RESCALE_L, "rising"),
        (O.REF_BUG_NO_RESCALE_O, "rising_fwd"),
        (O.REF_BUG_NO_RESCALE_L, "rising_fwd"),
    ],
)
def test_gate_catches_broken_rescale(dev: Device, orc: OracleModule, stream: Stream,
                                     gbufs: AttnBuffers, flags: int, catching_set: str) -> None:
    g = _gate(dev, orc, stream, gbufs, O.ReferenceKernel(dev, orc, flags),
              ("seed", "rising", "rising_fwd"))
    m = g.by_set[catching_set]
    assert not g.passed and not m.passed and m.violations > 0, g.summary()


def _poke(buf_name: str, flat: int, bits: int, dtype: Any) -> Any:
    def after(bufs: AttnBuffers, st: Stream) -> None:
        st.synchronize()
        getattr(bufs, buf_name).copy_from_host(np.array([bits], dtype=dtype),
                                               offset=flat * np.dtype(dtype).itemsize)
    return after


_WHERE = (1, 777, 2, 5)  # (b, s, h, d)
_FLAT = ((_WHERE[0] * GATE_SHAPE.S + _WHERE[1]) * GATE_SHAPE.H + _WHERE[2]) * 128 + _WHERE[3]


@pytest.mark.parametrize(
    ("bits", "violations", "nans", "unwritten"),
    [(0x4120, 1, 0, 0), (GR.POISON_BF16, 1, 0, 1), (0x7FC0, 1, 1, 0), (0xFF80, 1, 1, 0)],
    ids=["value_10", "poison", "nan", "minus_inf"],
)
def test_gate_counts_single_bad_element(dev: Device, orc: OracleModule, stream: Stream,
                                        gbufs: AttnBuffers, bits: int, violations: int,
                                        nans: int, unwritten: int) -> None:
    kern = O.ReferenceKernel(dev, orc, after=_poke("o", _FLAT, bits, np.uint16))
    g = _gate(dev, orc, stream, gbufs, kern, ("seed",))
    m = g.sets[0]
    assert not g.passed
    assert (m.violations, m.nan_count, m.unwritten) == (violations, nans, unwritten)
    assert m.first_violation == _WHERE


def test_gate_counts_single_bad_lse(dev: Device, orc: OracleModule, stream: Stream,
                                    gbufs: AttnBuffers) -> None:
    flat = (1 * GATE_SHAPE.H + 3) * GATE_SHAPE.S + 500
    bits = int(np.array([1234.5], np.float32).view(np.uint32)[0])
    kern = O.ReferenceKernel(dev, orc, after=_poke("lse", flat, bits, np.uint32))
    m = _gate(dev, orc, stream, gbufs, kern, ("seed",)).sets[0]
    assert not m.passed and m.violations == 0
    assert m.lse_violations == 1 and m.lse_first_violation == (1, 3, 500)


def test_gate_catches_missing_lse(dev: Device, orc: OracleModule, stream: Stream,
                                  gbufs: AttnBuffers) -> None:
    m = _gate(dev, orc, stream, gbufs, O.ReferenceKernel(dev, orc, lse_target="none"),
              ("seed",)).sets[0]
    assert not m.passed and m.lse_unwritten == gbufs.n_lse


def test_gate_ignores_lse_when_not_written(dev: Device, orc: OracleModule, stream: Stream,
                                           gbufs: AttnBuffers) -> None:
    g = _gate(dev, orc, stream, gbufs, O.ReferenceKernel(dev, orc, writes_lse=False), ("seed",))
    assert g.passed and not g.sets[0].lse_checked


def test_reference_cache_is_bounded(dev: Device, orc: OracleModule, stream: Stream) -> None:
    cache = O.ReferenceCache()
    for shape in (Shape(1, 2, 128), Shape(1, 2, 256)):
        with AttnBuffers(dev, shape) as bufs:
            for name in ("seed", "rising"):
                O.fill_inputs(orc, bufs, name, 42, stream)
                a = cache.get(dev, orc, bufs, name, 42, stream)
                assert cache.get(dev, orc, bufs, name, 42, stream) is a
            assert len(cache) == 2  # the previous shape's entries were freed
    cache.clear()
    assert len(cache) == 0


# ---- oracle_compare vs its NumPy twin, and the BF16 error budget -----------------------------
def _scale_rows_after(rows: np.ndarray | slice, factor: float, cols: slice = slice(None)) -> Any:
    """An ``after`` hook: O[:, rows, :, cols] *= factor (through the host; small shapes)."""
    def after(bufs: AttnBuffers, st: Stream) -> None:
        st.synchronize()
        s = bufs.shape
        o = O.bf16_bits_to_f32(bufs.o.copy_to_host(np.uint16, bufs.n)).reshape(s.B, s.S, s.H,
                                                                              s.D)
        o[:, rows, :, cols] *= np.float32(factor)
        bufs.o.copy_from_host(O.f32_to_bf16_bits(o).reshape(-1))
    return after


@pytest.mark.parametrize("shape", [Shape(2, 3, 1000), Shape(1, 2, 37), Shape(1, 1, 1),
                                   Problem(2, 4, 700, Hkv=2, D=64),
                                   Problem(1, 3, 600, Hkv=1, D=256, causal=False)], ids=str)
def test_compare_matches_numpy_twin(dev: Device, orc: OracleModule, stream: Stream,
                                    shape: Any) -> None:
    """The one-pass compare kernel (row blocks per warp, columns per lane, atomics) computes the
    same counters and sums as the NumPy twin, poison and NaN included."""
    with AttnBuffers(dev, shape) as bufs, dev.alloc(bufs.n * 4) as o_ref, \
            dev.alloc(bufs.n_lse * 4) as lse_ref:
        O.fill_inputs(orc, bufs, "seed", 42, stream)
        orc.reference_for(bufs, o_ref.ptr, lse_ref.ptr, stream)
        kern = O.ReferenceKernel(dev, orc, after=_scale_rows_after(slice(0, 8), 1.01))
        try:
            kern.forward(bufs, stream)
        finally:
            kern.free()
        stream.synchronize()
        o = bufs.o.copy_to_host(np.uint16, bufs.n)
        if bufs.n > 300:
            o[17] = GR.POISON_BF16
            o[299] = 0x7FC0
            bufs.o.copy_from_host(o)
        stats, sums = O.compare(dev, orc, bufs, o_ref, lse_ref, stream)
        ref = o_ref.copy_to_host(np.float32)
        lse = bufs.lse.copy_to_host(np.uint32)
        lref = lse_ref.copy_to_host(np.float32)
    dims = (shape.B, shape.S, shape.H, getattr(shape, "D", 128))
    want, wsums = GR.compare_numpy(o.reshape(dims), ref.reshape(dims),
                                  lse.reshape(shape.B, shape.H, shape.S),
                                  lref.reshape(shape.B, shape.H, shape.S))
    for f in ("o_count", "o_violations", "o_nonfinite", "o_unwritten", "o_first_violation",
              "o_ref_nonfinite", "o_block_rows", "l_count", "l_violations", "l_unwritten",
              "l_first_violation"):
        assert getattr(stats, f) == getattr(want, f), f
    assert stats.o_max_abs_err == want.o_max_abs_err
    for f in ("o_sum_sq_err", "o_sum_sq_ref", "o_sum_sq_bf16"):
        assert getattr(stats, f) == pytest.approx(getattr(want, f), rel=1e-9), f
    # FP32 sums on the GPU (blocks; per-CTA column partials) vs FP64 here.
    np.testing.assert_allclose(sums.blocks, wsums.blocks, rtol=1e-4, atol=1e-30)
    np.testing.assert_allclose(sums.cols, wsums.cols, rtol=1e-5, atol=1e-30)


@pytest.mark.parametrize(
    ("rows", "cols", "factor", "needle"),
    [
        (np.arange(GATE_SHAPE.S) % 64 < 8, slice(None), 1.015, "16-row blocks"),
        (slice(512, 520), slice(None), 1.01, "16-row blocks"),
        (slice(None), slice(0, 4), 1.01, "head-dim columns"),
    ],
    ids=["1.5pct_rows0-7_of_64", "1pct_8rows", "1pct_4cols"],
)
def test_gate_budget_catches_small_errors(dev: Device, orc: OracleModule, stream: Stream,
                                          gbufs: AttnBuffers, rows: Any, cols: slice,
                                          factor: float, needle: str) -> None:
    kern = O.ReferenceKernel(dev, orc, after=_scale_rows_after(rows, factor, cols))
    g = _gate(dev, orc, stream, gbufs, kern, ("seed", "rising"))
    for m in g.sets:
        assert m.violations == 0 and m.rel_l2 <= GR.REL_L2_MAX  # the old rule misses it
        assert not m.passed and needle in " ".join(m.reasons), m.brief()


def test_check_output_rechecks_the_last_launch(dev: Device, orc: OracleModule, stream: Stream,
                                               gbufs: AttnBuffers) -> None:
    kern = O.ReferenceKernel(dev, orc)
    try:
        g = O.gate(dev, kern, GATE_SHAPE, gbufs, 42, ("seed",), oracle=orc, stream=stream)
        assert g.passed
        kern.forward(gbufs, stream)  # a "timed" launch on the seed inputs the gate left
        m = O.check_output(dev, kern, GATE_SHAPE, gbufs, 42, oracle=orc, stream=stream)
        assert m.passed and m.bf16_ratio == pytest.approx(1.0, abs=1e-3)
        _scale_rows_after(slice(8, 16), 1.02)(gbufs, stream)  # the last output goes bad
        bad = O.check_output(dev, kern, GATE_SHAPE, gbufs, 42, oracle=orc, stream=stream)
        assert not bad.passed and "BF16 error budget" in " ".join(bad.reasons)
    finally:
        kern.free()


# ---- the gate on the problem family -----------------------------------------------------------
@pytest.mark.parametrize("problem", FAMILY, ids=str)
def test_gate_on_the_family(dev: Device, orc: OracleModule, stream: Stream,
                            problem: Problem) -> None:
    """The reference rounded to BF16 passes on every set (exactly its rounding error); the
    rescale bugs are caught by the rising sets (which must rise for GQA, every D and the
    non-causal walk too); 1% on 4 columns fails by the budget alone."""
    _gate_catches_the_bugs(dev, orc, stream, problem)


def _gate_catches_the_bugs(dev: Device, orc: OracleModule, stream: Stream,
                           problem: Problem) -> None:
    """The reference rounded to BF16 passes every set (exactly its rounding error, over O's
    query rows); the rescale bugs fail the rising sets; 1% on 4 head-dim columns fails by the
    budget alone (fixed length: the hook reshapes O as [B, S_q, Hq, D])."""
    sets = ("seed", "rising", "rising_fwd")
    with AttnBuffers(dev, problem) as bufs:
        cache = O.ReferenceCache()
        try:
            def gate(kern: Any) -> GR.GateResult:
                try:
                    return O.gate(dev, kern, problem, bufs, 42, sets, oracle=orc, stream=stream,
                                  reference_cache=cache)
                finally:
                    kern.free()

            g = gate(O.ReferenceKernel(dev, orc))
            assert g.passed, g.summary()
            assert g.shape == str(problem) and g.problem == problem.to_dict()
            for m in g.sets:
                assert m.bf16_ratio == pytest.approx(1.0, abs=1e-3) and m.lse_checked
                assert m.elements == problem.tokens_q * problem.Hq * problem.D
            assert gate(O.ReferenceKernel(dev, orc, O.REF_REVERSE)).passed
            for flags, catching in ((O.REF_REVERSE | O.REF_BUG_NO_RESCALE_O, "rising"),
                                    (O.REF_REVERSE | O.REF_BUG_NO_RESCALE_L, "rising"),
                                    (O.REF_BUG_NO_RESCALE_O, "rising_fwd")):
                m = gate(O.ReferenceKernel(dev, orc, flags)).by_set[catching]
                assert not m.passed and m.violations > 0, (flags, m.brief())
            if not problem.is_varlen:
                bad = gate(O.ReferenceKernel(dev, orc, after=_scale_rows_after(
                    slice(None), 1.01, slice(0, 4))))
                for m in bad.sets:
                    assert not m.passed and "head-dim columns" in " ".join(m.reasons), m.brief()
        finally:
            cache.clear()


# ---- queries over a longer KV (S_q < S_k), bottom-right causal -------------------------------
MORE_KEYS = [
    Problem.parse("1x4/2x100:k300"),  # GQA, causal, neither length a multiple of 64
    Problem.parse("2x2x64:k1000:d64"),
    Problem.parse("1x4/1x130:k257:d256:full"),
    Problem.parse("1x2x1:k4096"),  # one query row over every key
    Problem.parse("1x8/2x1000:k1024"),
    Problem.parse("1x2x200:k200"),  # S_q = S_k through the same entry points
]
# Packed batches with their own key lengths: empty sequences of either kind, q = k, one query.
PACKED = [
    Problem.parse("4/2x[100:300,0:64,65,1:700]"),
    Problem.parse("8/2x[200:250*2,7:9,0]:d64:full"),
    Problem.parse("4/1x[64:1000,130:257]:d256"),
]


@pytest.mark.parametrize("problem", MORE_KEYS + PACKED, ids=str)
@pytest.mark.parametrize("input_set", sorted(O.INPUT_SETS))
def test_generators_equal_numpy_twin_with_more_keys(dev: Device, orc: OracleModule,
                                                    stream: Stream, input_set: str,
                                                    problem: Problem) -> None:
    """Q with S_q rows, K and V with S_k rows (a packed batch: its layout's totals), bit for bit
    the NumPy twin's."""
    with AttnBuffers(dev, problem) as bufs:
        assert bufs.n == problem.tokens_q * problem.Hq * problem.D
        assert bufs.n_kv == problem.tokens_k * problem.Hkv * problem.D
        O.fill_inputs(orc, bufs, input_set, 42, stream)
        stream.synchronize()
        got = O.inputs_to_host(bufs)
    for g, w in zip(got, O.host_inputs(problem, input_set, 42), strict=True):
        assert g.shape == w.shape and np.array_equal(g, w)


# Packed batches with more keys in all than one rising trend may hold (RISING_MAX_S), each
# sequence within it (oracle ABI 9: K's trend per sequence); empty sequences of either kind
# before, between and after, where the generator's binary search must pass over them.
PACKED_OVER_32K = [
    Problem.varlen([64, 0, 48, 1, 0], 2, Hkv=1, D=64, seqlens_k=[20000, 7, 16000, 300, 0]),
    Problem.parse("8/2x[0:5,100:18000,0:0,37:15001,1:2]:full"),
]


@pytest.mark.parametrize("problem", PACKED_OVER_32K, ids=str)
@pytest.mark.parametrize("input_set", sorted(O.INPUT_SETS))
def test_generators_equal_numpy_twin_for_packed_trends_over_32k(dev: Device, orc: OracleModule,
                                                                stream: Stream, input_set: str,
                                                                problem: Problem) -> None:
    """The GPU's per-sequence trend (bufs.cu_k, binary search per key row) is the NumPy twin's
    bit for bit, and every sequence of the GPU's rising inputs rises on the reverse walk."""
    assert problem.tokens_k > O.RISING_MAX_S
    with AttnBuffers(dev, problem) as bufs:
        O.fill_inputs(orc, bufs, input_set, 42, stream)
        stream.synchronize()
        got = O.inputs_to_host(bufs)
    for g, w in zip(got, O.host_inputs(problem, input_set, 42), strict=True):
        assert g.shape == w.shape and np.array_equal(g, w)
    if input_set != "rising":
        return
    q, k, _ = got
    cq, ck = problem.cu_seqlens(), problem.cu_seqlens_k()
    for b in range(problem.B):
        if cq[b + 1] > cq[b]:
            assert O.rising_failures(q[:, cq[b]:cq[b + 1]], k[:, ck[b]:ck[b + 1]], 128,
                                     min_rise=O.rising_min_rise(problem.D) - 1e-9,
                                     causal=problem.causal) == 0, b


def _reference(dev: Device, orc: OracleModule, stream: Stream, problem: Problem,
               input_set: str, flags: int = 0) -> tuple[Any, ...]:
    """(q, k, v as BF16 bits, o_ref, lse_ref) of the CUDA reference on the set's inputs."""
    with AttnBuffers(dev, problem) as bufs, dev.alloc(bufs.n * 4) as o_ref, \
            dev.alloc(bufs.n_lse * 4) as lse_ref:
        O.fill_inputs(orc, bufs, input_set, 42, stream)
        orc.reference_for(bufs, o_ref.ptr, lse_ref.ptr, stream, flags=flags)
        stream.synchronize()
        q, k, v = O.inputs_to_host(bufs)
        return q, k, v, o_ref.copy_to_host(np.float32), lse_ref.copy_to_host(np.float32)


@pytest.mark.parametrize("problem", MORE_KEYS, ids=str)
@pytest.mark.parametrize("input_set", ["seed", "rising"])
def test_reference_matches_float64_with_more_keys(dev: Device, orc: OracleModule,
                                                  stream: Stream, problem: Problem,
                                                  input_set: str) -> None:
    """Every row of the FP32 reference against NumPy float64 with the bottom-right mask (query
    i sees keys 0 .. i + S_k - S_q); the reverse walk computes the same."""
    q, k, v, o, lse = _reference(dev, orc, stream, problem, input_set)
    o = o.reshape(problem.B, problem.S_q, problem.Hq, problem.D)
    lse = lse.reshape(problem.B, problem.Hq, problem.S_q)
    o_np, l_np = O.numpy_reference(q, k, v, problem.causal)
    assert np.isfinite(o).all() and np.isfinite(lse).all()
    np.testing.assert_allclose(o, o_np, atol=1e-4, rtol=0)
    np.testing.assert_allclose(lse, l_np, atol=1e-5, rtol=1e-5)
    o_rev = _reference(dev, orc, stream, problem, input_set, O.REF_REVERSE)[3]
    np.testing.assert_allclose(o_rev.reshape(o.shape), o_np, atol=1e-4, rtol=0)


@pytest.mark.parametrize("problem", PACKED, ids=str)
@pytest.mark.parametrize("input_set", ["seed", "rising"])
def test_varlen_reference_with_separate_key_lengths(dev: Device, orc: OracleModule,
                                                    stream: Stream, problem: Problem,
                                                    input_set: str) -> None:
    """oracle_reference_varlen with cu_seqlens_q / cu_seqlens_k: each sequence its own problem
    (its own bottom-right offset), against NumPy float64 per sequence; O [total_q, Hq, D], LSE
    [Hq, total_q]."""
    q, k, v, o, lse = _reference(dev, orc, stream, problem, input_set)
    o = o.reshape(problem.tokens_q, problem.Hq, problem.D)
    lse = lse.reshape(problem.Hq, problem.tokens_q)
    o_np, l_np = O.numpy_reference_varlen(q, k, v, problem.cu_seqlens(), problem.cu_seqlens_k(),
                                          problem.causal)
    assert np.isfinite(o).all() and np.isfinite(lse).all()
    np.testing.assert_allclose(o, o_np, atol=1e-4, rtol=0)
    np.testing.assert_allclose(lse, l_np, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("problem", [MORE_KEYS[0], MORE_KEYS[2], MORE_KEYS[4], PACKED[0]],
                         ids=str)
def test_gate_with_more_keys(dev: Device, orc: OracleModule, stream: Stream,
                             problem: Problem) -> None:
    """The reference rounded to BF16 passes on every set; the rescale bugs are caught by the
    rising sets (the trend is over the keys, so bottom-right rows rise too); 1% on 4 columns of
    O's query rows fails by the budget alone."""
    _gate_catches_the_bugs(dev, orc, stream, problem)


@pytest.mark.parametrize("shape", [Problem.parse("2x3x77:k500:d64"),
                                   Problem.parse("1x4/2x600:k1100:full")], ids=str)
def test_compare_over_the_query_rows(dev: Device, orc: OracleModule, stream: Stream,
                                     shape: Problem) -> None:
    """oracle_compare runs over O's S_q query rows (LSE [B, Hq, S_q]): its counters equal the
    NumPy twin's when the keys outnumber the queries."""
    with AttnBuffers(dev, shape) as bufs, dev.alloc(bufs.n * 4) as o_ref, \
            dev.alloc(bufs.n_lse * 4) as lse_ref:
        O.fill_inputs(orc, bufs, "seed", 42, stream)
        orc.reference_for(bufs, o_ref.ptr, lse_ref.ptr, stream)
        kern = O.ReferenceKernel(dev, orc, after=_scale_rows_after(slice(0, 8), 1.01))
        try:
            kern.forward(bufs, stream)
        finally:
            kern.free()
        stats, sums = O.compare(dev, orc, bufs, o_ref, lse_ref, stream)
        o = bufs.o.copy_to_host(np.uint16, bufs.n)
        ref = o_ref.copy_to_host(np.float32)
        lse = bufs.lse.copy_to_host(np.uint32)
        lref = lse_ref.copy_to_host(np.float32)
    dims = (shape.B, shape.S_q, shape.Hq, shape.D)
    want, wsums = GR.compare_numpy(o.reshape(dims), ref.reshape(dims),
                                  lse.reshape(shape.B, shape.Hq, shape.S_q),
                                  lref.reshape(shape.B, shape.Hq, shape.S_q))
    assert stats.o_count == shape.B * shape.S_q * shape.Hq * shape.D == want.o_count
    assert stats.l_count == shape.B * shape.Hq * shape.S_q == want.l_count
    for f in ("o_violations", "o_unwritten", "o_first_violation", "l_violations"):
        assert getattr(stats, f) == getattr(want, f), f
    np.testing.assert_allclose(sums.blocks, wsums.blocks, rtol=1e-4, atol=1e-30)


def test_mapped_status_words_are_the_devices(dev: Device) -> None:
    """KernelModule's status words (pinned, device-mapped host memory): what the device writes
    at status.ptr is what the host reads, without a copy."""
    from cuda.bindings import driver as drv

    from tuner.kernel import runtime as R

    st = R.MappedStatus()
    try:
        assert st.ptr and st.words[0] == st.words[1] == 0
        assert drv.cuMemsetD32(st.ptr, 7, 2)[0] == drv.CUresult.CUDA_SUCCESS
        dev.synchronize()
        assert [st.words[0], st.words[1]] == [7, 7]
        st.words[1] = 3
        back = np.zeros(2, np.int32)
        assert drv.cuMemcpyDtoH(back.ctypes.data, st.ptr, 8)[0] == drv.CUresult.CUDA_SUCCESS
        assert back.tolist() == [7, 3]
    finally:
        st.free()


# ---- the error ratios (issue 35): the BF16-math reference, FA's rule, the default's error ----
def _bf16_impl(dev: Device, orc: OracleModule, stream: Stream, problem: Problem,
               input_set: str) -> tuple[Any, ...]:
    """(q, k, v, the FP32 reference, oracle.cu's BF16-math reference as BF16 bits, its error
    as the gate computes it)."""
    with AttnBuffers(dev, problem) as bufs, dev.alloc(bufs.n * 4) as o_ref, \
            dev.alloc(bufs.n * 2) as o_bf16:
        O.fill_inputs(orc, bufs, input_set, 42, stream)
        orc.reference_for(bufs, o_ref.ptr, None, stream)
        orc.reference_bf16_for(bufs, o_bf16.ptr, stream)
        impl = O.bf16_impl_error(dev, orc, bufs, o_ref, stream)
        stream.synchronize()
        q, k, v = O.inputs_to_host(bufs)
        return (q, k, v, o_ref.copy_to_host(np.float32), o_bf16.copy_to_host(np.uint16, bufs.n),
                impl)


@pytest.mark.parametrize("problem", [*FAMILY, MORE_KEYS[0], MORE_KEYS[3], PACKED[0], PACKED[1]],
                         ids=str)
@pytest.mark.parametrize("input_set", ["seed", "rising"])
def test_bf16_reference_matches_numpy_twin(dev: Device, orc: OracleModule, stream: Stream,
                                           problem: Problem, input_set: str) -> None:
    """oracle_reference_bf16(_varlen) against reference_numpy.numpy_reference_bf16: the same
    BF16 values but for rounding flips where FP32 and float64 sums straddle a BF16 tie (a
    flipped score moves its P by a BF16 unit), and the same error against the reference."""
    q, k, v, ref, o, impl = _bf16_impl(dev, orc, stream, problem, input_set)
    if problem.is_varlen:
        want = np.zeros_like(o)
        cq, ck = problem.cu_seqlens(), problem.cu_seqlens_k()
        w = want.reshape(problem.tokens_q, problem.Hq, problem.D)
        for b in range(len(cq) - 1):
            if cq[b + 1] > cq[b]:
                w[cq[b]:cq[b + 1]] = O.numpy_reference_bf16(
                    q[:, cq[b]:cq[b + 1]], k[:, ck[b]:ck[b + 1]], v[:, ck[b]:ck[b + 1]],
                    problem.causal)[0]
    else:
        want = O.numpy_reference_bf16(q, k, v, problem.causal).reshape(-1)
    got, exp = O.bf16_bits_to_f32(o), O.bf16_bits_to_f32(want)
    assert np.isfinite(got).all()
    assert np.mean(o != want) < 0.1 and np.abs(got - exp).max() < 0.02
    stats, _ = GR.compare_numpy(want.reshape(1, -1, 1, 1), ref.reshape(1, -1, 1, 1))
    assert impl.max_abs_err == pytest.approx(stats.o_max_abs_err, rel=0.3)
    assert impl.max_abs_err > 0


def test_gate_records_flash_attentions_rule(dev: Device, orc: OracleModule, stream: Stream,
                                            gbufs: AttnBuffers) -> None:
    """The reference rounded to BF16 (the best a BF16 output can be) passes FA's rule far below
    2x; 3% on 8 rows breaks it; the BF16 implementation is computed once per set (cached)."""
    cache = O.ReferenceCache()
    try:
        g = O.gate(dev, O.ReferenceKernel(dev, orc), GATE_SHAPE, gbufs, 42, ("seed", "rising"),
                   oracle=orc, stream=stream, reference_cache=cache)
        assert g.passed and g.fa_rule_ok, g.summary()
        for m in g.sets:
            assert m.err_bf16_max is not None and m.err_bf16_max > m.max_abs_err
            assert m.fa_ratio is not None and m.fa_ratio < 0.5
        d = g.to_dict()
        assert d["fa_ratio"] == pytest.approx(g.fa_ratio) and d["fa_rule_ok"] is True
        assert d["sets"][0]["err_max"] == d["sets"][0]["max_abs_err"]
        assert d["rule"]["lse_atol"] == 2.0**-9 and d["rule"]["fa_rule_factor"] == 2.0
        bad = O.gate(dev, O.ReferenceKernel(dev, orc, after=_scale_rows_after(slice(0, 8), 1.03)),
                     GATE_SHAPE, gbufs, 42, ("seed",), oracle=orc, stream=stream,
                     reference_cache=cache)
        assert not bad.passed and bad.fa_rule_ok is False, bad.summary()
    finally:
        cache.clear()


def test_bench_records_err_vs_default(dev: Device, orc: OracleModule) -> None:
    """Bench(default_launch=...): every gate records max|err| (and relative L2) against the
    default's on the same inputs; the default is gated once per problem; the default itself
    measures 1.0; 1% on every output measures > 1."""
    from tuner.measure.bench import Bench

    default = O.ReferenceKernel(dev, orc)
    calls: list[Problem] = []

    def default_launch(p: Problem) -> Any:
        calls.append(p)
        return default

    bench = Bench(0, default_launch=default_launch)
    problem = Problem(1, 4, 512, Hkv=2)
    try:
        g = bench.gate(default, problem)
        assert g.err_vs_default == 1.0 and g.rms_vs_default == 1.0
        worse = O.ReferenceKernel(dev, orc, after=_scale_rows_after(slice(None), 1.01))
        w = bench.gate(worse, problem)
        assert w.err_vs_default is not None and w.err_vs_default > 1.5, w.summary()
        assert w.rms_vs_default is not None and w.rms_vs_default > 1.5
        assert w.default_passed is True
        assert len(bench._default_gates) == 1  # gated once (the default's own gate, reused)
        worse.forward(bench.buffers(problem), bench.stream)  # as timing leaves it: seed inputs
        m = bench.check_output(worse, problem)  # vs the default's seed set
        assert m.err_vs_default is not None and m.err_vs_default > 1.5
        worse.free()
    finally:
        default.free()
        bench.close()
