"""CPU test of gate()'s orchestration with fake device/oracle objects: the call order per input
set, LSE handling, reference caching, restoring the seed inputs, the budget sums' round trip,
collect() for peers, check_output(), and cleanup on errors; for MHA and for the problem family
(GQA/MQA, head dims 64/256, non-causal: the oracle is called with Hq, Hkv, D and the mask)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tuner.kernel.runtime import KernelError, problem_dims
from tuner.measure import gate_rule as GR
from tuner.measure import oracle as O
from tuner.problem import Problem

_ptrs = itertools.count(0x10000, 0x1000)
STATS: dict[int, bytes] = {}


class FakeBuf:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.ptr = next(_ptrs)
        self.freed = False

    def free(self) -> None:
        self.freed = True

    def copy_to_host(self, dtype: Any = np.uint8, count: int | None = None,
                     offset: int = 0) -> np.ndarray:
        out = np.frombuffer(STATS[self.ptr], dtype=dtype).copy()
        assert count is None or count == out.size, (count, out.size)
        return out


class FakeStream:
    def __init__(self) -> None:
        self.destroyed = False

    def synchronize(self) -> None:
        pass

    def destroy(self) -> None:
        self.destroyed = True


class FakeDev:
    index = 0

    def __init__(self) -> None:
        self.allocs: list[FakeBuf] = []
        self.streams: list[FakeStream] = []

    def make_current(self) -> None:
        pass

    def alloc(self, nbytes: int) -> FakeBuf:
        b = FakeBuf(nbytes)
        self.allocs.append(b)
        return b

    def stream(self) -> FakeStream:
        s = FakeStream()
        self.streams.append(s)
        return s


def _pass_stats(shape: Any, **kw: Any) -> bytes:
    B, H, _, Sq, _, D, _ = problem_dims(shape)  # O and LSE: the query rows
    base = dict(o_count=B * Sq * H * D, o_violations=0, o_nonfinite=0, o_unwritten=0,
                o_first_violation=GR.NO_VIOLATION, o_ref_nonfinite=0, o_max_abs_err=0.001,
                o_sum_sq_err=1e-8, o_sum_sq_ref=1.0, l_count=B * H * Sq)
    base.update(kw)
    return GR.OracleStats(**base).to_bytes()  # type: ignore[arg-type]


REF2 = (1e-3 / (0.84 * GR.BF16_UNIT)) ** 2  # sum ref^2 of a block whose sum bf16 err^2 is 1e-6


def _budget_bytes(shape: Any, bad_block: bool = False) -> tuple[bytes, bytes]:
    """Device images of the budget sums: every block and column at 1.25x its rounding error
    (a correct kernel), or one block at 4x (1% on a few rows). rms_bf16 / rms_ref = 0.84 *
    2^-9, as measured for attention outputs."""
    B, H, _, Sq, _, D, _ = problem_dims(shape)
    nb = GR.n_row_blocks(Sq)
    blocks = np.zeros((B, H, nb, 4), np.float32)
    blocks[..., 1] = 1e-6
    blocks[..., 0] = 1.25**2 * 1e-6
    blocks[..., 2] = REF2
    blocks[..., 3] = 16 * D
    if bad_block:
        blocks[0, 1, nb - 1, 0] = 4.0**2 * 1e-6
    cols = np.zeros((B, H, D, 4), np.float64)
    cols[..., 0], cols[..., 1], cols[..., 2], cols[..., 3] = 1.2**2 * 1e-6, 1e-6, REF2, Sq
    return blocks.tobytes(), cols.tobytes()


IMPL_ERR = 0.004  # the BF16 implementation's max|err| the fake reports (the kernel's: 0.001)


class FakeOracle:
    def __init__(self, shape: Any, bad_set: str | None = None,
                 budget_bad_set: str | None = None, impl_err: float = IMPL_ERR) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.shape = shape
        self.bad_set = bad_set
        self.budget_bad_set = budget_bad_set
        self.impl_err = impl_err
        self.current_set = ""
        self.impl_bufs: set[int] = set()  # the BF16 implementation's outputs

    def _dims(self, a: tuple[Any, ...]) -> None:
        # (q, k, v, B, Hq, Hkv, Sq, Sk, D, ...): the problem's every dimension reaches the
        # generator (a packed batch: its layout's rows)
        B, hq, hkv, Sq, Sk, D, _ = problem_dims(self.shape)
        assert tuple(a[3:9]) == (B, hq, hkv, Sq, Sk, D), a

    def gen_seed(self, *a: Any) -> None:
        self._dims(a)
        self.current_set = "seed"
        self.calls.append(("gen_seed", a[9]))

    def gen_rising(self, *a: Any) -> None:
        self._dims(a)
        self.current_set = "rising" if a[10] < 0 else "rising_fwd"
        self.calls.append(("gen_rising", a[10]))

    def poison(self, o: int, n_o: int, lse: int | None, n_lse: int, stream: Any) -> None:
        self.calls.append(("poison", lse is not None))

    def reference_for(self, bufs: Any, o_ref: int, lse_ref: int | None, stream: Any,
                      flags: int = 0) -> None:
        p = bufs.shape
        if getattr(p, "seqlens", ()):  # the real one's dispatch: per sequence, both cu_seqlens
            self.calls.append(("reference_varlen", self.current_set))
            assert (p.B, p.S_q, p.tokens_q, p.Hq, p.Hkv) == (len(p.seqlens), max(p.seqlens),
                                                            sum(p.seqlens), p.Hq, p.Hkv)
            return
        B, hq, hkv, Sq, Sk, D, causal = problem_dims(p)
        self.reference(bufs.q.ptr, bufs.k.ptr, bufs.v.ptr, o_ref, lse_ref, B, hq, hkv, Sq, Sk,
                       D, causal, stream, flags=flags)

    def reference_bf16_for(self, bufs: Any, o_bf16: int, stream: Any) -> None:
        assert problem_dims(bufs.shape) == problem_dims(self.shape)
        self.impl_bufs.add(o_bf16)
        self.calls.append(("reference_bf16", self.current_set))

    def reference(self, *a: Any, **kw: Any) -> None:
        # (q, k, v, o_ref, lse_ref, B, Hq, Hkv, Sq, Sk, D, causal, stream): mask, GQA, S_k too
        assert tuple(a[5:12]) == problem_dims(self.shape), a
        self.calls.append(("reference", self.current_set))

    def compare(self, o: int, o_ref: int, B: int, H: int, S: int, D: int, lse: int | None,
                lse_ref: int | None, o_atol: float, o_rtol: float, lse_atol: float,
                lse_rtol: float, stats: int, block_sums: int | None, col_sums: int | None,
                stream: Any) -> None:
        pb, ph, _, psq, _, pd, _ = problem_dims(self.shape)
        assert (B, H, S, D) == (pb, ph, psq, pd)  # over O's query rows
        assert (o_atol, o_rtol, lse_atol, lse_rtol) == (GR.O_ATOL, GR.O_RTOL, GR.LSE_ATOL,
                                                        GR.LSE_RTOL)
        if o in self.impl_bufs:  # the BF16 implementation against the FP32 reference
            assert lse is None and block_sums is None and col_sums is None
            self.calls.append(("compare_bf16", self.current_set))
            STATS[stats] = _pass_stats(self.shape, o_max_abs_err=self.impl_err,
                                       o_sum_sq_err=4e-8, l_count=0)
            return
        assert block_sums is not None and col_sums is not None
        self.calls.append(("compare", lse is not None))
        n_lse = B * H * S if lse is not None else 0
        if self.current_set == self.bad_set:
            STATS[stats] = _pass_stats(self.shape, o_violations=3, o_first_violation=130,
                                       o_max_abs_err=0.5, l_count=n_lse)
        else:
            STATS[stats] = _pass_stats(self.shape, l_count=n_lse)
        STATS[block_sums], STATS[col_sums] = _budget_bytes(
            self.shape, bad_block=self.current_set == self.budget_bad_set)


class FakeKernel:
    def __init__(self, orc: FakeOracle, writes_lse: bool = True, fail: bool = False) -> None:
        self.orc = orc
        self.writes_lse = writes_lse
        self.fail = fail

    def prepare(self, shape: Any, stream: Any) -> float:
        self.orc.calls.append(("prepare", None))
        return 0.5

    def forward(self, bufs: Any, stream: Any) -> None:
        if self.fail:
            raise KernelError("fa_tune_forward failed with cudaErrorInvalidValue (1)", code=1)
        self.orc.calls.append(("forward", None))


class FakePeer(FakeKernel):
    """A launchable that computes elsewhere and copies its output into bufs in collect()."""

    def collect(self, bufs: Any, stream: Any) -> None:
        self.orc.calls.append(("collect", None))


def _bufs(shape: Any) -> SimpleNamespace:
    B, hq, hkv, Sq, Sk, D, _ = problem_dims(shape)
    n, n_kv = B * Sq * hq * D, B * Sk * hkv * D
    return SimpleNamespace(shape=shape, n=n, n_kv=n_kv, n_lse=B * hq * Sq,
                           q=FakeBuf(2 * n), k=FakeBuf(2 * n_kv), v=FakeBuf(2 * n_kv),
                           o=FakeBuf(2 * n), lse=FakeBuf(4 * n), cu_q=FakeBuf(4), cu_k=FakeBuf(4))


def test_gate_call_order_and_verdict() -> None:
    shape = SimpleNamespace(B=1, H=2, S=128)
    dev, orc = FakeDev(), FakeOracle(shape)
    cache = O.ReferenceCache()
    g = O.gate(dev, FakeKernel(orc), shape, _bufs(shape), 42, ("seed", "rising"),  # type: ignore[arg-type]
               oracle=orc, reference_cache=cache)  # type: ignore[arg-type]
    assert g.passed and [m.input_set for m in g.sets] == ["seed", "rising"]
    assert g.prepare_host_ms == 0.5
    assert orc.calls == [
        ("prepare", None),
        # The BF16 implementation right after the reference, on the same pristine inputs.
        ("gen_seed", 42), ("reference", "seed"), ("reference_bf16", "seed"),
        ("compare_bf16", "seed"), ("poison", True), ("forward", None), ("compare", True),
        ("gen_rising", -1), ("reference", "rising"), ("reference_bf16", "rising"),
        ("compare_bf16", "rising"), ("poison", True), ("forward", None), ("compare", True),
        ("gen_seed", 42),  # the seed set is restored for timing
    ]
    assert all(m.lse_checked for m in g.sets)
    assert dev.streams and dev.streams[0].destroyed  # its own stream is cleaned up
    stats_bufs = [b for b in dev.allocs if b.nbytes == O.ORACLE_STATS_BYTES]
    assert stats_bufs and all(b.freed for b in stats_bufs)
    scratch = [b for b in dev.allocs
               if b.nbytes in (O.ORACLE_STATS_BYTES, *GR.BudgetSums.device_bytes(shape))]
    # The budget sums' buffers too, and the BF16 implementation's stats (one per set).
    assert len(scratch) == 5 and all(b.freed for b in scratch)
    impl_out = [b for b in dev.allocs if b.ptr in orc.impl_bufs]
    assert len(impl_out) == 2 and all(b.freed for b in impl_out)  # its output: scratch too
    # FlashAttention's rule on every set: the kernel's 0.001 against the BF16 impl's 0.004.
    for m in g.sets:
        assert m.err_bf16_max == pytest.approx(IMPL_ERR) and m.fa_rule_ok
        assert m.fa_ratio == pytest.approx(0.001 / IMPL_ERR, rel=1e-6)
        assert m.err_bf16_rms == pytest.approx((4e-8 / (2 * 128 * 128)) ** 0.5)
    assert g.fa_ratio == pytest.approx(0.25, rel=1e-6) and g.fa_rule_ok
    assert g.to_dict()["fa_ratio"] == pytest.approx(0.25, rel=1e-6)
    assert g.err_vs_default is None  # not compared here (Bench does that)
    # The budget was checked on every set, and its worst ratios are reported.
    for m in g.sets:
        assert m.budget_ratio is not None and m.bf16_ratio == pytest.approx(1.25)
        assert m.block_worst is not None and m.col_worst is not None
    d = g.to_dict()
    assert d["budget_ratio"] == pytest.approx(g.budget_ratio)
    assert d["rule"]["budget_k"] == GR.BUDGET_K
    assert "budget" in g.summary()

    # Second gate on the same shape: the references come from the cache.
    orc.calls.clear()
    O.gate(dev, FakeKernel(orc), shape, _bufs(shape), 42, ("seed", "rising"),  # type: ignore[arg-type]
           oracle=orc, reference_cache=cache)  # type: ignore[arg-type]
    assert not [c for c in orc.calls if c[0] in ("reference", "reference_bf16")]
    assert len(cache) == 2


def test_gate_fails_flash_attentions_rule_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel more than 2x the BF16 implementation's max error (+ 1e-5) is recorded as
    failing the rule; with FA_RULE_GATES (the default) it fails the gate, with the numbers, even
    where every other rule holds; fa_rule=False records nothing."""
    from tuner.measure import accuracy

    shape = SimpleNamespace(B=1, H=2, S=128)
    dev, orc = FakeDev(), FakeOracle(shape, impl_err=0.0004)
    assert accuracy.FA_RULE_GATES  # the product's setting since the H200 checked the yardstick
    monkeypatch.setattr(accuracy, "FA_RULE_GATES", False)
    g = O.gate(dev, FakeKernel(orc), shape, _bufs(shape),  # type: ignore[arg-type]
               oracle=orc, reference_cache=O.ReferenceCache())  # type: ignore[arg-type]
    assert g.passed and g.fa_rule_ok is False and g.fa_ratio == pytest.approx(2.5, rel=1e-6)
    monkeypatch.setattr(accuracy, "FA_RULE_GATES", True)
    g = O.gate(dev, FakeKernel(orc), shape, _bufs(shape),  # type: ignore[arg-type]
               oracle=orc, reference_cache=O.ReferenceCache())  # type: ignore[arg-type]
    assert not g.passed and g.fa_rule_ok is False
    assert all(m.violations == 0 and m.budget_ratio < 1 for m in g.sets)
    assert g.fa_ratio == pytest.approx(2.5, rel=1e-6)
    assert "FlashAttention's test rule" in g.summary() and "2.5x" in g.summary()
    orc.calls.clear()
    off = O.gate(dev, FakeKernel(orc), shape, _bufs(shape),  # type: ignore[arg-type]
                 oracle=orc, reference_cache=O.ReferenceCache(), fa_rule=False)  # type: ignore[arg-type]
    assert off.passed and off.fa_ratio is None and off.fa_rule_ok is None
    assert not [c for c in orc.calls if c[0] == "reference_bf16"]


def test_gate_failure_is_reported_per_set() -> None:
    shape = SimpleNamespace(B=1, H=2, S=128)
    dev, orc = FakeDev(), FakeOracle(shape, bad_set="rising")
    g = O.gate(dev, FakeKernel(orc, writes_lse=False), shape, _bufs(shape),  # type: ignore[arg-type]
               oracle=orc, reference_cache=O.ReferenceCache())  # type: ignore[arg-type]
    assert not g.passed
    seed, rising = g.sets
    assert seed.passed and not rising.passed
    assert rising.first_violation == (0, 0, 1, 2)  # flat 130 = row 1 (s=0, h=1), d=2
    assert not rising.lse_checked
    assert ("compare", False) in orc.calls  # no LSE compared when the kernel does not write it
    assert "FAIL" in g.summary() and "3 elements violate" in g.summary()


def test_gate_launch_error_propagates_and_cleans_up() -> None:
    shape = SimpleNamespace(B=1, H=2, S=128)
    dev, orc = FakeDev(), FakeOracle(shape)
    with pytest.raises(KernelError):
        O.gate(dev, FakeKernel(orc, fail=True), shape, _bufs(shape),  # type: ignore[arg-type]
               oracle=orc, reference_cache=O.ReferenceCache())  # type: ignore[arg-type]
    assert all(b.freed for b in dev.allocs if b.nbytes == O.ORACLE_STATS_BYTES)
    assert dev.streams[0].destroyed


def test_gate_rejects_mismatched_buffers_and_bad_sets() -> None:
    shape = SimpleNamespace(B=1, H=2, S=128)
    dev, orc = FakeDev(), FakeOracle(shape)
    with pytest.raises(ValueError):
        O.gate(dev, FakeKernel(orc), SimpleNamespace(B=1, H=2, S=256), _bufs(shape),  # type: ignore[arg-type]
               oracle=orc)  # type: ignore[arg-type]
    with pytest.raises(O.FaTuneError):
        O.gate(dev, FakeKernel(orc), shape, _bufs(shape), 42, ("bogus",),  # type: ignore[arg-type]
               oracle=orc)  # type: ignore[arg-type]


def test_reference_cache_frees_on_shape_change() -> None:
    dev, orc = FakeDev(), FakeOracle(SimpleNamespace(B=1, H=1, S=64))
    cache = O.ReferenceCache()
    b1 = _bufs(SimpleNamespace(B=1, H=1, S=64))
    a = cache.get(dev, orc, b1, "seed", 42, None)  # type: ignore[arg-type]
    assert cache.get(dev, orc, b1, "seed", 42, None) is a  # type: ignore[arg-type]
    cache.get(dev, orc, b1, "rising", 42, None)  # type: ignore[arg-type]
    assert len(cache) == 2
    b2 = _bufs(SimpleNamespace(B=1, H=1, S=128))
    orc.shape = b2.shape
    cache.get(dev, orc, b2, "seed", 42, None)  # type: ignore[arg-type]
    assert len(cache) == 1 and a[0].freed and a[1].freed
    cache.clear()
    assert len(cache) == 0


def test_gate_fails_on_the_budget_alone() -> None:
    shape = SimpleNamespace(B=1, H=2, S=100)
    dev, orc = FakeDev(), FakeOracle(shape, budget_bad_set="rising")
    g = O.gate(dev, FakeKernel(orc), shape, _bufs(shape),  # type: ignore[arg-type]
               oracle=orc, reference_cache=O.ReferenceCache())  # type: ignore[arg-type]
    seed, rising = g.sets
    assert seed.passed and not rising.passed and rising.violations == 0
    assert rising.block_failures == 1 and rising.block_worst == (0, 1, 96, 99)
    budget = GR.BUDGET_K * 1e-3 + GR.BUDGET_FLOOR * GR.BF16_UNIT * REF2**0.5
    assert rising.block_budget_ratio == pytest.approx(4e-3 / budget)
    assert rising.block_bf16_ratio == pytest.approx(4.0)
    assert "16-row blocks exceed the BF16 error budget" in g.summary()
    assert g.budget_ratio == rising.budget_ratio


def test_gate_collects_a_peers_output_before_comparing() -> None:
    shape = SimpleNamespace(B=1, H=2, S=128)
    dev, orc = FakeDev(), FakeOracle(shape)
    g = O.gate(dev, FakePeer(orc), shape, _bufs(shape), 42, ("seed",),  # type: ignore[arg-type]
               oracle=orc, reference_cache=O.ReferenceCache())  # type: ignore[arg-type]
    assert g.passed
    names = [c[0] for c in orc.calls]
    assert names.index("forward") < names.index("collect") < names.index("compare")


def test_check_output_checks_the_last_launch_without_launching() -> None:
    shape = SimpleNamespace(B=1, H=2, S=128)
    dev, orc = FakeDev(), FakeOracle(shape)
    cache = O.ReferenceCache()
    bufs = _bufs(shape)
    O.gate(dev, FakePeer(orc), shape, bufs, 42, ("seed",),  # type: ignore[arg-type]
           oracle=orc, reference_cache=cache)  # type: ignore[arg-type]
    orc.calls.clear()
    m = O.check_output(dev, FakePeer(orc), shape, bufs, 42,  # type: ignore[arg-type]
                       oracle=orc, reference_cache=cache)  # type: ignore[arg-type]
    assert m.passed and m.input_set == "seed" and m.budget_ratio is not None
    assert orc.calls == [("collect", None), ("compare", True)]  # cached reference, no launch
    scratch = [b for b in dev.allocs
               if b.nbytes in (O.ORACLE_STATS_BYTES, *GR.BudgetSums.device_bytes(shape))]
    # gate's (and the BF16 implementation's stats, once: cached) and check_output's
    assert len(scratch) == 7 and all(b.freed for b in scratch)
    assert m.fa_ratio == pytest.approx(0.25, rel=1e-6) and m.fa_rule_ok  # the cached impl
    assert all(s.destroyed for s in dev.streams)


@pytest.mark.parametrize("problem", [Problem(1, 8, 100, Hkv=2), Problem(2, 4, 64, Hkv=1, D=64),
                                     Problem(1, 2, 128, D=256, causal=False),
                                     Problem(1, 4, 48, Hkv=2, D=64, causal=False)], ids=str)
def test_gate_flow_for_the_problem_family(problem: Problem) -> None:
    """The same calls for GQA/MQA, D 64/256 and non-causal problems; the fake oracle asserts
    that every call carries the problem's Hq, Hkv, D and mask, and the budget sums' layout
    ([B, Hq, blocks] and [B, Hq, D]) round-trips."""
    dev, orc = FakeDev(), FakeOracle(problem)
    g = O.gate(dev, FakeKernel(orc), problem, _bufs(problem), 42,  # type: ignore[arg-type]
               ("seed", "rising", "rising_fwd"), oracle=orc,  # type: ignore[arg-type]
               reference_cache=O.ReferenceCache())
    assert g.passed, g.summary()
    assert [c[0] for c in orc.calls].count("reference") == 3
    assert g.shape == str(problem) and g.problem == problem.to_dict()
    assert g.summary().startswith(f"gate PASS {problem} seed 42")
    assert all(m.elements == problem.B * problem.S * problem.Hq * problem.D for m in g.sets)
    scratch = [b for b in dev.allocs if b.nbytes in GR.BudgetSums.device_bytes(problem)]
    assert len(scratch) == 2 and all(b.freed for b in scratch)


def test_gate_rejects_buffers_of_another_problem() -> None:
    gqa = Problem(1, 8, 128, Hkv=2)
    dev, orc = FakeDev(), FakeOracle(gqa)
    for other in (Problem(1, 8, 128), Problem(1, 8, 128, Hkv=2, causal=False),
                  Problem(1, 8, 128, Hkv=2, D=64)):
        with pytest.raises(ValueError, match="buffers are for 1x8/2x128"):
            O.gate(dev, FakeKernel(orc), other, _bufs(gqa), oracle=orc)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            O.check_output(dev, FakeKernel(orc), other, _bufs(gqa),  # type: ignore[arg-type]
                           oracle=orc)  # type: ignore[arg-type]


def test_reference_cache_keys_on_the_whole_problem() -> None:
    """A causal and a non-causal reference of the same inputs differ: the cache must not hand
    one out for the other (nor across Hkv or D)."""
    dev = FakeDev()
    cache = O.ReferenceCache()
    p_causal, p_full = Problem(1, 4, 64, Hkv=2), Problem(1, 4, 64, Hkv=2, causal=False)
    a = cache.get(dev, FakeOracle(p_causal), _bufs(p_causal), "seed", 42, None)  # type: ignore[arg-type]
    b = cache.get(dev, FakeOracle(p_full), _bufs(p_full), "seed", 42, None)  # type: ignore[arg-type]
    assert a is not b and a[0].freed and len(cache) == 1
    assert cache.get(dev, FakeOracle(p_full), _bufs(p_full), "seed", 42, None) is b  # type: ignore[arg-type]


# ---- queries over a longer KV (S_q < S_k), fixed length and packed ----------------------------
@pytest.mark.parametrize("problem", [Problem.parse("2x8/2x100:k300"),
                                     Problem.parse("1x4x64:k1000:d64:full"),
                                     Problem.parse("4/2x[100:300,0:7,50:50*2]")], ids=str)
def test_gate_flow_with_more_keys_than_queries(problem: Problem) -> None:
    """The generators get S_q and S_k (a packed batch: its layout's totals), the comparison
    runs over O's S_q query rows, the varlen reference gets both cu_seqlens; the metrics count
    the query rows."""
    dev, orc = FakeDev(), FakeOracle(problem)
    bufs = _bufs(problem)
    assert bufs.n == problem.tokens_q * problem.Hq * problem.D
    assert bufs.n_kv == problem.tokens_k * problem.Hkv * problem.D
    g = O.gate(dev, FakeKernel(orc), problem, bufs, 42,  # type: ignore[arg-type]
               ("seed", "rising"), oracle=orc,  # type: ignore[arg-type]
               reference_cache=O.ReferenceCache())
    assert g.passed, g.summary()
    assert g.shape == str(problem) and g.problem == problem.to_dict()
    ref = "reference_varlen" if problem.is_varlen else "reference"
    assert [c[0] for c in orc.calls].count(ref) == 2
    assert all(m.elements == problem.tokens_q * problem.Hq * problem.D for m in g.sets)


class StatusKernel(FakeKernel):
    """A kernel whose device rejected the metadata of its last launch (check_status raises)."""

    def __init__(self, orc: FakeOracle, bad_sets: tuple[str, ...]) -> None:
        super().__init__(orc)
        self.bad_sets = bad_sets

    def check_status(self) -> None:
        if self.orc.current_set in self.bad_sets:
            raise KernelError("fa_tune_forward: the device rejected the varlen metadata: "
                              "cu_seqlens_k does not run from 0 to the key rows (first at "
                              "sequence 1)")


def test_gate_reports_rejected_metadata_as_the_sets_reason() -> None:
    problem = Problem.parse("4x[100:300,50:60]")
    dev, orc = FakeDev(), FakeOracle(problem)
    g = O.gate(dev, StatusKernel(orc, ("rising",)), problem, _bufs(problem),  # type: ignore[arg-type]
               42, ("seed", "rising"), oracle=orc,  # type: ignore[arg-type]
               reference_cache=O.ReferenceCache())
    seed, rising = g.sets
    assert seed.passed and not rising.passed and not g.passed
    assert "rejected the varlen metadata" in " ".join(rising.reasons)
    assert "cu_seqlens_k" in g.summary()


def test_gpu_worker_takes_a_problem_with_more_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The search's GPU worker reads the request's problem dict (Sk too) back into the same
    Problem and measures that (fake bench and kernel: no GPU here)."""
    from tuner.measure import bench as bench_mod
    from tuner.measure import launch as launch_mod
    from tuner.measure.timing import Protocol
    from tuner.search import gpu_worker

    seen: list[Problem] = []

    class FakeBench:
        seed = 42

        def __init__(self, index: int) -> None:
            pass

        def gpu_info(self) -> dict[str, Any]:
            return {"name": "TEST FIXTURE GPU"}

        def measure(self, kernel: Any, shape: Problem, proto: Any, gate: bool) -> Any:
            seen.append(shape)
            return SimpleNamespace(status="ok", to_dict=lambda: {"gate": None, "timing": {}})

    class Conn:
        def __init__(self, msgs: list[Any]) -> None:
            self.msgs, self.sent = msgs, []

        def recv(self) -> Any:
            if not self.msgs:
                raise EOFError
            return self.msgs.pop(0)

        def send(self, d: dict[str, Any]) -> None:
            self.sent.append(d)

    monkeypatch.setattr(bench_mod, "Bench", FakeBench)
    monkeypatch.setattr(launch_mod, "KernelLaunch", lambda so: SimpleNamespace(so=so))
    p = Problem.parse("1x32/8x2048:k8192")
    v = Problem.parse("32/8x[2048:8192,512:4096*2]")
    conn = Conn([{"op": "measure", "so_path": "k.so", "shape": q.to_dict(), "gate": True,
                  "seed": 42, "protocol": Protocol().to_dict()} for q in (p, v)]
                + [{"op": "stop"}])
    gpu_worker.main(conn, 0)
    assert seen == [p, v]
    assert [m["status"] for m in conn.sent] == ["ready", "ok", "ok"]
