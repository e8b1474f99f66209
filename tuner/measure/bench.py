"""A measurement session on one GPU: the API every command measures through.

``Bench`` owns the device, the oracle, one set of buffers and one reference cache per problem,
one stream and the NVML handle. A shape is a ``tuner.problem.Problem`` (MHA/GQA/MQA, head dim,
mask). ``measure(launch, shape, protocol)`` is the whole path:

0. a launchable that cannot run the problem (``supports(problem)`` gives a reason: fa-tune's
   kernel library runs D 128 and its compiled mask; a peer may lack GQA or a head dim) is
   ``unavailable``, with that reason, before anything is generated or launched;

1. the gate (tuner.measure.oracle): every input set generated on the GPU, O and LSE poisoned,
   one launch, compared with the FP32 reference; a failed gate ends here (no timing);
2. the timing protocol (tuner.measure.timing.time_kernel) on the seed inputs;
3. optionally the output of the last timed launch checked again (``gate_after``: a kernel that
   is right only when the GPU is idle has no valid timing).

With ``default_launch`` (a function of the problem giving the default config's launchable for
its class, or None), every gate also records the candidate's error against the default
config's on the same inputs (``err_vs_default``, tuner.measure.accuracy): the default is gated
once per problem, seed and input sets per Bench, and cached.

``launch`` is fa-tune's kernel (``KernelLaunch`` / ``tuner.kernel.runtime.KernelModule``) or a peer
(``PeerLaunch``): same buffers, same inputs, same stream, same gate, same loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuner.kernel.runtime import AttnBuffers, Device, ShapeLike, as_problem
from tuner.measure import accuracy, gate_rule, oracle, store, timing
from tuner.measure.launch import launch_supports
from tuner.measure.peers.base import Unsupported
from tuner.problem import Problem


def _key(shape: ShapeLike) -> Problem:
    return as_problem(shape)  # all of it: a varlen batch's lengths too


@dataclass
class Measurement:
    """One launchable on one problem. ``status``: ok | gate_failed | unavailable (the launchable
    does not support the problem; ``reason`` says why)."""

    status: str
    reason: str
    gate: gate_rule.GateResult | None
    timing: timing.TimingResult | None
    gate_after: gate_rule.SetMetrics | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "gate": None if self.gate is None else gate_dict(self.gate),
            "timing": None if self.timing is None else self.timing.to_dict(),
            "gate_after": None if self.gate_after is None else self.gate_after.to_dict(),
        }


def gate_dict(g: gate_rule.GateResult | gate_rule.SetMetrics) -> dict[str, Any]:
    """The gate's verdict as every results payload stores it: the headline numbers (worst over
    the input sets) plus the oracle's full result under ``details``."""
    details = store.to_plain(g)
    brief = g.summary() if isinstance(g, gate_rule.GateResult) else g.brief()
    return {
        "passed": bool(g.passed),
        "summary": brief,
        "max_abs_err": float(g.max_abs_err),
        "rel_l2": None if math.isinf(g.rel_l2) else float(g.rel_l2),
        # The error ratios (tuner.measure.accuracy), None where not computed.
        "fa_ratio": accuracy.finite_or_none(g.fa_ratio),
        "fa_rule_ok": g.fa_rule_ok,
        "err_vs_default": accuracy.finite_or_none(g.err_vs_default),
        "rms_vs_default": accuracy.finite_or_none(g.rms_vs_default),
        "lse_ratio": accuracy.finite_or_none(getattr(g, "lse_ratio", None)),
        "details": details,
    }


def gpu_info(dev: Device, nvml: timing.Nvml) -> dict[str, Any]:
    """What results payloads and study attributes record about the GPU."""
    info = store.to_plain(dev.properties())
    st = nvml.state()
    info.update(driver_version=nvml.driver_version() or info.get("nvidia_driver_version"),
                memory_gib=round(dev.info.total_mem_bytes / 2**30, 1),
                power_limit_w=st.power_limit_w, nvml_note=nvml.note)
    return info


class Bench:
    """One device, the oracle, per-shape buffers and references, one stream, NVML."""

    def __init__(self, device_index: int = 0, *, seed: int = oracle.DEFAULT_SEED,
                 input_sets: tuple[str, ...] = oracle.DEFAULT_INPUT_SETS,
                 temp_wait_total_s: float | None = None,
                 default_launch: Callable[[Problem], Any] | None = None) -> None:
        self.dev = Device.open(device_index)
        self.oracle = oracle.get_oracle()
        self.nvml = timing.nvml_for(self.dev)
        self.stream = self.dev.stream()
        self.seed = seed
        self.input_sets = tuple(input_sets)
        # A suite-wide cap on temperature waiting (compare): a card that idles hot delays the
        # comparison, it never outlives the caller's time limit. None: only per-round bounds.
        self.wait_left_s = temp_wait_total_s
        self._bufs: dict[Problem, AttnBuffers] = {}
        self._refs: dict[Problem, oracle.ReferenceCache] = {}
        # The default config's launchable per problem (None: no comparison), and its gates.
        self.default_launch = default_launch
        self._default_gates: dict[tuple[Any, ...], gate_rule.GateResult] = {}
        self._last_default: gate_rule.GateResult | None = None

    # -- buffers
    def buffers(self, shape: ShapeLike) -> AttnBuffers:
        b = self._bufs.get(_key(shape))
        if b is None:
            b = self._bufs[_key(shape)] = AttnBuffers(self.dev, shape)
        return b

    def release(self, shape: ShapeLike | None = None) -> None:
        """Free the buffers and references of one shape (or of all)."""
        keys = list(self._bufs) if shape is None else [_key(shape)]
        for k in keys:
            b = self._bufs.pop(k, None)
            if b is not None:
                b.free()
            r = self._refs.pop(k, None)
            if r is not None:
                r.clear()

    def close(self) -> None:
        self.release()
        self.stream.destroy()

    def load_inputs(self, shape: ShapeLike, input_set: str = "seed") -> AttnBuffers:
        bufs = self.buffers(shape)
        oracle.fill_inputs(self.oracle, bufs, input_set, self.seed, self.stream)
        self.stream.synchronize()
        return bufs

    # -- the three steps
    def gate(self, launch: Any, shape: ShapeLike, *,
             vs_default: bool = True) -> gate_rule.GateResult:
        """Gate ``launch`` on every input set; leaves the seed inputs in the buffers. With a
        ``default_launch`` (and ``vs_default``), the result records its error against the
        default config's on the same inputs."""
        g = self._gate(launch, shape)
        if vs_default and self.default_launch is not None:
            d = self.default_gate(shape, candidate=(launch, g))
            if d is not None:
                accuracy.relate(g, d)
        return g

    def default_gate(self, shape: ShapeLike, candidate: tuple[Any, gate_rule.GateResult] | None
                     = None) -> gate_rule.GateResult | None:
        """The default config's gate on this problem (same seed and input sets), once per
        Bench: None when there is no default launchable for the problem. ``candidate``: a
        (launch, its gate) just made; when it is the default's launchable, that gate is it."""
        launch = None if self.default_launch is None else self.default_launch(_key(shape))
        if launch is None:
            return None
        key = (_key(shape), self.seed, self.input_sets, id(launch))
        if key not in self._default_gates:
            if candidate is not None and candidate[0] is launch:
                self._default_gates[key] = candidate[1]
            else:
                self._default_gates[key] = self._gate(launch, shape)
        self._last_default = self._default_gates[key]
        return self._default_gates[key]

    def _gate(self, launch: Any, shape: ShapeLike) -> gate_rule.GateResult:
        bufs = self.buffers(shape)
        bind = getattr(launch, "bind", None)
        if bind is not None:
            self.load_inputs(shape)
            bind(bufs, self.stream)  # a peer's JIT / autotune, before anything is checked
        refs = self._refs.setdefault(_key(shape), oracle.ReferenceCache())
        return oracle.gate(self.dev, launch, shape, bufs, seed=self.seed,
                           input_sets=self.input_sets, oracle=self.oracle, stream=self.stream,
                           reference_cache=refs)

    def time(self, launch: Any, shape: ShapeLike, protocol: timing.Protocol,
             *, fresh_inputs: bool = True) -> timing.TimingResult:
        """The timing protocol on the seed inputs (regenerated unless the gate just left them)."""
        bufs = self.load_inputs(shape) if fresh_inputs else self.buffers(shape)
        return timing.time_kernel(self.dev, launch, shape, bufs, protocol, stream=self.stream,
                                  nvml=self.nvml, wait_bound_s=self._wait_bound,
                                  on_wait=self._spent)

    def check_output(self, launch: Any, shape: ShapeLike) -> gate_rule.SetMetrics:
        """Check what the last launch left in the buffers against the seed set's reference."""
        bufs = self.buffers(shape)
        refs = self._refs.setdefault(_key(shape), oracle.ReferenceCache())
        m = oracle.check_output(self.dev, launch, shape, bufs, seed=self.seed,
                                oracle=self.oracle, stream=self.stream, reference_cache=refs)
        d = self._last_default  # the gate before the timing this output comes from
        if d is not None and d.problem == _key(shape).to_dict() and "seed" in d.by_set:
            accuracy.relate_set(m, d.by_set["seed"])
        return m

    def measure(self, launch: Any, shape: ShapeLike, protocol: timing.Protocol, *,
                gate: bool = True, gate_after: bool = False) -> Measurement:
        """Gate (unless ``gate`` is False), time, and optionally check the last output. A
        launchable that does not support the problem is ``unavailable`` (nothing runs)."""
        why = launch_supports(launch, shape)
        if why is not None:
            return Measurement("unavailable", why, None, None)
        g = None
        try:  # a peer may find only at prepare() (in bind) that it cannot run the inputs
            if gate:
                g = self.gate(launch, shape)
                if not g.passed:
                    return Measurement("gate_failed", g.summary(), g, None)
            t = self.time(launch, shape, protocol, fresh_inputs=not gate)
        except Unsupported as e:
            return Measurement("unavailable", str(e), None, None)
        after = None
        if gate_after:
            after = self.check_output(launch, shape)
            if not after.passed:
                return Measurement("gate_failed", f"after timing: {after.brief()}", g, t, after)
        return Measurement("ok", "", g, t, after)

    # -- the suite-wide temperature wait budget
    def _wait_bound(self) -> float:
        return float("inf") if self.wait_left_s is None else max(0.0, self.wait_left_s)

    def _spent(self, tw: timing.TempWait) -> None:
        if self.wait_left_s is not None:
            self.wait_left_s -= tw.waited_s

    # -- facts for result payloads
    def gpu_info(self) -> dict[str, Any]:
        return gpu_info(self.dev, self.nvml)
