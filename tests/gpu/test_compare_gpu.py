"""On the GPU: fa-tune's kernel and its peers on the one measurement path (tuner.measure).

The kernel and every installed peer see the same device buffers, are gated by the same oracle
on every input set and timed by the same loop; a peer that is not installed is reported as
such, never substituted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gate_cases import gate_peer_on

from tuner.analysis import compare
from tuner.kernel import build
from tuner.kernel.config import load_preset
from tuner.measure.timing import Protocol
from tuner.problem import Problem

pytestmark = pytest.mark.gpu

QUICK = Protocol(warmup=2, repeat=10, rounds=2, settle_s=0.2, temp_wait_s=5)


def test_compare_kernel_and_peers_on_one_path(tmp_path: Path) -> None:
    so = build.build_config(load_preset("default")).so_path
    payload = compare.run_compare(so, ["2x8x1000", "1x4x4096"], "fa3,cudnn", QUICK,
                                  results_root=tmp_path, log=print)
    rows = {(r["shape"], r["backend"]): r for r in payload["summary"]}
    for shape in ("2x8x1000", "1x4x4096"):
        k = rows[(shape, "fa-tune")]
        assert k["status"] == "ok", k
        assert k["max_abs_err"] < 0.01
    runs = [r for s in payload["shapes"] for r in s["runs"]]
    for r in runs:
        if r["status"] == "unavailable":
            continue
        # Every backend was checked on every input set, then again after timing.
        assert r["status"] == "ok", (r["backend"], r["reason"])
        sets = [m["input_set"] for m in r["gate"]["details"]["sets"]]
        assert sets == ["seed", "rising"], sets
        assert r["gate_after"]["passed"]
        assert len(r["timing"]["rounds"]) == 2
        print(r["backend"], r["gate"]["summary"])
    assert (Path(payload["result_dir"]) / "summary.md").is_file()


def test_peer_sees_the_oracle_inputs() -> None:
    """A peer's torch views alias the bench's buffers: what the oracle generated is what the
    peer reads (checked by reading the views back against the NumPy twin of the generator)."""
    torch = pytest.importorskip("torch")
    from tuner.measure import oracle
    from tuner.measure.bench import Bench
    from tuner.measure.launch import torch_views

    bench = Bench(0)
    for shape in (Problem(1, 2, 64), Problem(1, 8, 64, Hkv=2, D=64, causal=False)):
        bufs = bench.load_inputs(shape)
        q, k, v, o, lse = torch_views(bufs)
        hq, hk, hv = oracle.host_inputs(shape, "seed", bench.seed)  # BF16 bit patterns, uint16
        for t, want in ((q, hq), (k, hk), (v, hv)):
            got = t.view(torch.int16).cpu().numpy().view(np.uint16)
            assert (got == want).all()
        assert o.shape == q.shape == (1, 64, shape.Hq, shape.D)
        assert k.shape == v.shape == (1, 64, shape.Hkv, shape.D)
        assert lse.shape == (1, shape.Hq, 64)
        bench.release(shape)
    bench.close()


# Small problems of each kind: FA3 and cuDNN must pass the gate on them. Both are independent,
# widely used implementations, so this checks the oracle's GQA mapping, its D 64/256 paths and
# its non-causal mask (and the peers' plumbing: views, enable_gqa, is_causal).
FAMILY = [
    Problem(2, 8, 1000),  # MHA, D 128, causal (the baseline)
    Problem(2, 8, 1000, Hkv=2),  # GQA
    Problem(1, 8, 777, Hkv=1),  # MQA
    Problem(2, 4, 1000, D=64),
    Problem(1, 4, 640, D=256),
    Problem(2, 8, 1000, causal=False),
    Problem(1, 8, 1024, Hkv=2, D=64, causal=False),
    Problem(1, 8, 513, Hkv=4, D=256, causal=False),
]


@pytest.mark.parametrize("peer_name", ["fa3", "cudnn"])
def test_peers_pass_the_gate_on_the_family(peer_name: str) -> None:
    """Gate only (no timing): every input set against the FP32 reference. A peer that is not
    installed skips; a problem the peer declines at prepare (Unsupported) is listed, not
    failed, except that FA3 must run every problem of the family."""
    gates, declined = gate_peer_on(peer_name, FAMILY, lambda p: False)
    for g in gates:
        assert [m.input_set for m in g.sets] == ["seed", "rising"]
    if peer_name == "fa3":
        assert not declined, declined
    assert len(declined) < len(FAMILY) - 1  # cuDNN runs at least MHA and some of the rest


def test_kernel_is_unavailable_for_problems_it_cannot_run() -> None:
    """A causal D 128 library runs MHA, GQA and MQA; it is reported, never launched, for a
    problem of another head dim or the other mask."""
    from tuner.measure.bench import Bench
    from tuner.measure.launch import KernelLaunch

    so = build.build_config(load_preset("default")).so_path
    bench = Bench(0)
    try:
        k = KernelLaunch(so)
        for problem in FAMILY:
            m = bench.measure(k, problem, QUICK)
            if problem.D == 128 and problem.causal:
                assert m.status == "ok", (problem, m.reason)
            else:
                assert m.status == "unavailable" and "runs D 128, causal" in m.reason, (
                    problem, m.reason)
            bench.release(problem)
    finally:
        bench.close()


# ---- queries over a longer KV (S_q < S_k) ----------------------------------------------------
# Causal is bottom-right in the oracle, FA3 and fa-tune; cuDNN gets an explicit boolean mask.
# FA3 and cuDNN passing the gate here checks the oracle's offset with two independent
# implementations.
MORE_KEYS = [
    Problem.parse("1x8/2x1000:k3000"),
    Problem.parse("2x4x100:k1000:d64"),
    Problem.parse("1x8x513:k1024:full"),
    Problem.parse("1x4/1x64:k640:d256"),
    # 16 query rows over many keys. Fewer rows are a question for issue 35: the per-column
    # budget then judges single elements (cuDNN failed 1x8/2x1:k2048 by 1.45x, as a NumPy
    # emulation of a correct kernel does: tests/test_oracle_cpu.py).
    Problem.parse("1x8/2x16:k2048"),
]
PACKED_MORE_KEYS = [Problem.parse("8/2x[300:1000,0:64,128,1:513]"),
                    Problem.parse("8/2x[200:900*2]:d64:full")]


@pytest.mark.parametrize("peer_name", ["fa3", "cudnn"])
def test_peers_pass_the_gate_with_more_keys(peer_name: str) -> None:
    """Gate only: FA3 must run and pass every problem (fixed and packed, its own cu_seqlens_q /
    cu_seqlens_k); cuDNN may decline one (Unsupported: the mask or GQA), never fail one."""
    _, declined = gate_peer_on(peer_name, MORE_KEYS + PACKED_MORE_KEYS,
                               lambda p: peer_name != "fa3" and p.is_varlen)
    if peer_name == "fa3":
        assert not declined, declined


def test_peer_views_with_more_keys() -> None:
    """A peer's views: q and o with S_q rows, k and v with S_k rows, LSE [B, Hq, S_q]; a packed
    batch's are its layout's ([1, total_q, ...], [1, total_k, ...])."""
    torch = pytest.importorskip("torch")
    from tuner.measure import oracle
    from tuner.measure.bench import Bench
    from tuner.measure.launch import torch_views

    bench = Bench(0)
    for shape in (Problem.parse("2x8/2x64:k320"), PACKED_MORE_KEYS[0]):
        bufs = bench.load_inputs(shape)
        q, k, v, o, lse = torch_views(bufs)
        hq, hk, hv = oracle.host_inputs(shape, "seed", bench.seed)
        for t, want in ((q, hq), (k, hk), (v, hv)):
            assert tuple(t.shape) == want.shape
            assert (t.view(torch.int16).cpu().numpy().view(np.uint16) == want).all()
        assert o.shape == q.shape and tuple(lse.shape) == (q.shape[0], shape.Hq, q.shape[1])
        bench.release(shape)
    bench.close()


def test_compare_with_more_keys_end_to_end(tmp_path: Path) -> None:
    """fa-tune compare on a :k problem: the kernel and FA3 gated and timed on the same
    inputs; the payload's rows carry the problem's dict (Sk) and its shape text."""
    so = build.build_config(load_preset("default")).so_path
    shape = "1x8/2x1000:k3000"
    payload = compare.run_compare(so, [shape], "fa3", QUICK, results_root=tmp_path, log=print)
    rows = {(r["shape"], r["backend"]): r for r in payload["summary"]}
    k = rows[(shape, "fa-tune")]
    assert k["status"] == "ok", k
    assert (k["S"], k["Sk"], k["Hkv"]) == (1000, 3000, 2)
    assert payload["shapes"][0]["Sk"] == 3000 and payload["shapes"][0]["shape"] == shape
    assert Problem.parse(shape).tflops(k["median_ms"]) == pytest.approx(k["tflops"])
