"""What the gate-every-config GPU test files share (imported by name: tests/gpu is on sys.path):
the parametrize ids and one gated case."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tuner.kernel.config import KernelConfig
from tuner.measure.bench import Bench
from tuner.measure.gate_rule import GateResult
from tuner.problem import Problem


def case_id(x: object) -> str:
    """A config as '<config id>-<scheduler>[-multicast][-heads<N>]', anything else as its
    text."""
    if isinstance(x, KernelConfig):
        return (f"{x.config_id()}-{x.scheduler}" + ("-multicast" if x.kv_multicast else "")
                + (f"-heads{x.head_cluster}" if x.head_cluster > 1 else ""))
    return str(x)


def case_kernels(cases: list[tuple[str, Problem]]) -> dict:
    """Each (preset, problem) case's kernel, built for the problem's class, once per (config,
    class): the ``kernels`` that gate_case reads."""
    from tuner.kernel import build
    from tuner.kernel.config import load_preset
    from tuner.measure.launch import KernelLaunch

    out: dict = {}
    for name, p in cases:
        key = (load_preset(name), p.problem_class)
        if key not in out:
            res = build.build_config(key[0], pclass=key[1])
            res.require_timeable()
            out[key] = KernelLaunch(res.so_path)
    return out


def gate_case(bench: Bench, kernels: dict, cfg: KernelConfig, problem: Problem) -> GateResult:
    """Gate cfg's kernel (built for the problem's class) on the problem; print the summary."""
    kernel = kernels[(cfg, problem.problem_class)]
    assert kernel.module.problem_class == problem.problem_class
    g = bench.gate(kernel, problem)
    bench.release(problem)
    print(f"{case_id(cfg):36s} {problem!s:40s} {g.summary()}")
    return g


def more_keys_problems(head_dim: int, causal: bool, varlen: bool = False) -> list[Problem]:
    """Problems with more keys than queries (S_q < S_k; causal aligned bottom-right) for a
    kernel gate of one problem class: no length a multiple of a tile, GQA, MQA and B > 1, a
    few query rows over many keys, a prefix far longer than the chunk; with ``varlen`` also
    packed batches with their own key lengths (empty sequences of either kind, q = k, one
    query). Not fewer than 16 rows per fixed problem: below that the per-column budget judges
    a handful of elements and a correct kernel's emulation fails it (issue 35)."""
    opts = ("" if head_dim == 128 else f":d{head_dim}") + ("" if causal else ":full")
    texts = ["2x8/2x1000:k3000", "1x8/1x333:k1500", "1x4x16:k2049", "3x4/2x130:k131",
             "1x8/2x200:k9000"]
    if varlen:
        texts += ["8/2x[300:1000,0:64,128,1:513]", "8/2x[200:900*3,77:78,0]"]
    return [Problem.parse(t + opts) for t in texts]


def gate_peer(bench: Bench, launch: Any, name: str, problem: Problem, declined: list[str],
              failed: list[str]) -> GateResult | None:
    """Gate a peer's launch on the problem: None (and a line in ``declined``) when the peer
    declines it at prepare; a failed gate's summary goes to ``failed``."""
    from tuner.measure.peers.base import Unsupported

    try:
        g = bench.gate(launch, problem)
    except Unsupported as e:
        declined.append(f"{problem}: {e}")
        return None
    finally:
        launch.release()
    print(f"{name} {g.summary()}")
    if not g.passed:
        failed.append(g.summary())
    return g


def gate_peer_on(peer_name: str, problems: list[Problem],
                 may_refuse: Callable[[Problem], bool]) -> tuple[list[GateResult], list[str]]:
    """Gate a peer (gate only, no timing) on each problem it supports, in a Bench of its own: a
    problem its supports() refuses must be one ``may_refuse`` allows; no gate may fail; FA3's
    must check its LSE. Returns the gates and the lines of the problems it declined at prepare
    (Unsupported). Skips when the peer is not installed."""
    from tuner.measure.bench import Bench

    launch = peer_launch(peer_name)
    bench = Bench(0)
    gates: list[GateResult] = []
    declined: list[str] = []
    failed: list[str] = []
    try:
        for problem in problems:
            why = launch.supports(problem)
            if why is not None:
                assert may_refuse(problem), why
                continue
            g = gate_peer(bench, launch, peer_name, problem, declined, failed)
            if g is not None:
                gates.append(g)
                if peer_name == "fa3":  # [B, Hq, S_q] LSE
                    assert all(m.lse_checked for m in g.sets), g.summary()
            bench.release(problem)
    finally:
        bench.close()
    print(f"{peer_name} declined: {declined}")
    assert not failed, failed
    return gates, declined


def peer_launch(peer_name: str) -> Any:
    """The peer's PeerLaunch, or a pytest skip saying why the peer is not installed here."""
    import pytest

    from tuner.measure.launch import PeerLaunch
    from tuner.measure.peers import make_peer

    peer = make_peer(peer_name)
    ok, why = peer.available()
    if not ok:
        pytest.skip(f"{peer_name}: {why}")
    return PeerLaunch(peer)
