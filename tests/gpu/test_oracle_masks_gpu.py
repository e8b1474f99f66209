"""On the GPU: the models' masks (issue 36) through the oracle and the gate (fa-tune's kernel
with them: tests/gpu/test_masks_gpu.py). The generators and the sinks each input set draws
against their NumPy twins; every row of the FP32 reference (both walk orders) and of the
BF16-math reference against NumPy, for a sliding window (causal, not, wider than the sequence,
S_q < S_k, S_q > S_k, packed), a softcap, sinks and all three; the gate passes the reference and
fails the sink and window bugs; FlashAttention-3 (and cuDNN, where it takes the mask) passes
the gate for each mask.

    pytest -s -m gpu tests/gpu/test_oracle_masks_gpu.py
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gate_cases import gate_peer_on

from tuner.kernel.runtime import AttnBuffers, Device, OracleModule, Stream
from tuner.measure import gate_rule as GR
from tuner.measure import oracle as O
from tuner.measure import reference_numpy as RN
from tuner.problem import Problem

pytestmark = pytest.mark.gpu

MASKED = [Problem.parse(t) for t in (
    "1x4/2x300:w64",  # causal window, S not a multiple of the reference's tile
    "1x4/2x300:w64:full",
    "2x2x100:w500",  # a window wider than the sequence: every causal key
    "1x4/2x130:k700:w200",  # S_q < S_k, the window's edge inside the prefix
    "1x4/2x400:k150:full:w40",  # S_q > S_k non-causal: the first rows see every key
    "1x2x256:d64:w1",  # one key per row: O = V's diagonal row
    "1x4x200:cap50",
    "1x4/2x256:d256:cap5",
    "1x4/2x300:k500:sinks",
    "1x8/2x256:d64:full:sinks",
    "1x4/2x300:k600:w100:cap30:sinks",  # all three
    "1x4/2x300:k200:full:w50:cap20:sinks",
)]
PACKED = [Problem.parse(t) for t in (
    "4/2x[100:300,0:64,65,1:700]:w48:sinks",
    "8/2x[200:250*2,7:9,0,90:40]:d64:full:w16:cap10:sinks",
)]


@pytest.mark.parametrize("problem", MASKED + PACKED, ids=str)
@pytest.mark.parametrize("input_set", sorted(O.INPUT_SETS))
def test_inputs_and_sinks_equal_numpy_twin(dev: Device, orc: OracleModule, stream: Stream,
                                           input_set: str, problem: Problem) -> None:
    """Q, K, V bit for bit; the sinks (oracle_fill_uniform_f32) bit for bit host_sinks."""
    with AttnBuffers(dev, problem) as bufs:
        assert (bufs.sinks is not None) == problem.sinks
        O.fill_inputs(orc, bufs, input_set, 42, stream)
        stream.synchronize()
        got, sinks = O.inputs_to_host(bufs), O.sinks_to_host(bufs)
    for g, w in zip(got, O.host_inputs(problem, input_set, 42), strict=True):
        assert np.array_equal(g, w)
    if problem.sinks:
        assert sinks is not None
        assert np.array_equal(sinks, O.host_sinks(problem, input_set, 42))


def _reference(dev: Device, orc: OracleModule, stream: Stream, problem: Problem,
               input_set: str, flags: int = 0) -> tuple[Any, ...]:
    """(q, k, v, sinks, o_ref, lse_ref, o_bf16) of the CUDA references on the set's inputs."""
    with AttnBuffers(dev, problem) as bufs, dev.alloc(bufs.n * 4) as o_ref, \
            dev.alloc(bufs.n_lse * 4) as lse_ref, dev.alloc(bufs.n * 2) as o_bf16:
        O.fill_inputs(orc, bufs, input_set, 42, stream)
        orc.reference_for(bufs, o_ref.ptr, lse_ref.ptr, stream, flags=flags)
        orc.reference_bf16_for(bufs, o_bf16.ptr, stream)
        stream.synchronize()
        q, k, v = O.inputs_to_host(bufs)
        return (q, k, v, O.sinks_to_host(bufs), o_ref.copy_to_host(np.float32),
                lse_ref.copy_to_host(np.float32), o_bf16.copy_to_host(np.uint16, bufs.n))


@pytest.mark.parametrize("problem", MASKED + PACKED, ids=str)
@pytest.mark.parametrize("input_set", ["seed", "rising"])
def test_references_match_numpy(dev: Device, orc: OracleModule, stream: Stream,
                                problem: Problem, input_set: str) -> None:
    """Every row of the FP32 reference against NumPy float64 with the problem's masks (the
    reverse walk too: the window's first tile is where it starts or ends); the BF16-math
    reference against its twin, up to rounding flips at BF16 ties."""
    q, k, v, sinks, o, lse, o_bf16 = _reference(dev, orc, stream, problem, input_set)
    o_np, l_np = O.numpy_reference_for(problem, q, k, v, sinks)
    o = o.reshape(o_np.shape)
    lse = lse.reshape(l_np.shape)
    assert np.isfinite(o).all() and np.isfinite(lse).all()
    np.testing.assert_allclose(o, o_np, atol=1e-4, rtol=0)
    np.testing.assert_allclose(lse, l_np, atol=1e-5, rtol=1e-5)
    o_rev = _reference(dev, orc, stream, problem, input_set, O.REF_REVERSE)[4]
    np.testing.assert_allclose(o_rev.reshape(o_np.shape), o_np, atol=1e-4, rtol=0)
    want = _bf16_twin(problem, q, k, v, sinks)
    got, exp = O.bf16_bits_to_f32(o_bf16), O.bf16_bits_to_f32(want)
    assert np.isfinite(got).all()
    assert np.mean(o_bf16 != want) < 0.1 and np.abs(got - exp).max() < 0.03


def _bf16_twin(problem: Problem, q: Any, k: Any, v: Any, sinks: Any) -> np.ndarray:
    """numpy_reference_bf16 of the problem (a packed batch per sequence), flat BF16 bits."""
    kw = RN.problem_masks(problem, sinks)
    if not problem.is_varlen:
        return O.numpy_reference_bf16(q, k, v, problem.causal, **kw).reshape(-1)
    out = np.zeros((problem.tokens_q, problem.Hq, problem.D), np.uint16)
    cq, ck = problem.cu_seqlens(), problem.cu_seqlens_k()
    for b in range(problem.B):
        if cq[b + 1] > cq[b]:
            out[cq[b]:cq[b + 1]] = O.numpy_reference_bf16(
                q[:, cq[b]:cq[b + 1]], k[:, ck[b]:ck[b + 1]], v[:, ck[b]:ck[b + 1]],
                problem.causal, **kw)[0]
    return out.reshape(-1)


@pytest.mark.parametrize("problem", [MASKED[0], MASKED[3], MASKED[4], MASKED[6], MASKED[8],
                                     MASKED[10], PACKED[0]], ids=str)
def test_gate_passes_the_reference_and_fails_the_mask_bugs(dev: Device, orc: OracleModule,
                                                           stream: Stream,
                                                           problem: Problem) -> None:
    """The reference rounded to BF16 passes every set (its forward and reverse walks); a sink
    left out or scaled by ln 2 fails, and so does a window one key wider; without a softcap
    (which saturates the rising trend) the rescale bugs fail the rising sets too."""
    sets = ("seed", "rising", "rising_fwd")
    cache = O.ReferenceCache()
    with AttnBuffers(dev, problem) as bufs:
        def gate(flags: int) -> GR.GateResult:
            with O.ReferenceKernel(dev, orc, flags) as kern:
                return O.gate(dev, kern, problem, bufs, 42, sets, oracle=orc, stream=stream,
                              reference_cache=cache)

        try:
            g = gate(0)  # exactly its own rounding error
            assert g.passed and g.problem == problem.to_dict(), g.summary()
            assert all(m.lse_checked and m.bf16_ratio == pytest.approx(1.0, abs=1e-3)
                       for m in g.sets)
            assert gate(O.REF_REVERSE).passed
            bugs = []
            if problem.sinks:
                bugs += [O.REF_BUG_NO_SINK, O.REF_BUG_SINK_LN2]
            if problem.window:
                bugs.append(O.REF_BUG_WIDE_WINDOW)
            for flags in bugs:
                bad = gate(flags)
                assert not bad.by_set["seed"].passed, (flags, bad.summary())
            if problem.softcap == 0:
                m = gate(O.REF_REVERSE | O.REF_BUG_NO_RESCALE_O).by_set["rising"]
                assert not m.passed and m.violations > 0, m.brief()
        finally:
            cache.clear()


@pytest.mark.parametrize("peer_name", ["fa3", "cudnn"])
def test_peers_pass_the_gate_for_each_mask(peer_name: str) -> None:
    """FA3 (window_size, softcap, learnable_sink) must run and pass every masked problem on
    every input set, LSE (with the sink) included; cuDNN runs the windows it takes (a boolean
    mask) and passes them, declines a softcap, sinks and packed batches up front."""
    gates, declined = gate_peer_on(
        peer_name, MASKED + PACKED,
        lambda p: peer_name == "cudnn" and bool(p.softcap or p.sinks or p.is_varlen))
    if peer_name == "fa3":
        assert not declined and len(gates) == len(MASKED + PACKED), declined
