"""The timing protocol, the one timing loop, and the GPU state around it.

Per round (``Protocol``): a bounded wait until NVML reads <= ``temp_limit_c``; ``settle_s``
seconds of untimed launches (the power ramp); ``warmup`` launches; ``repeat`` launches, each
bracketed by its own pair of CUDA events. Round median; result = median of the round medians,
min and max over every sample (all samples are kept). TFLOPS = problem.flops / (ms*1e9), with
tuner.problem.Problem's convention: causal 2*B*Hq*S^2*D (full S^2, as in the anchors the project
started from, not the causal half), non-causal 4*B*Hq*S^2*D; S_q queries over S_k keys:
4*B*Hq*D times the (query, key) pairs the mask keeps (causal: S_q*S_k - S_q^2/2).

NVML (nvidia-ml-py) is optional: without it there is no temperature wait and the state fields
are None, and the result says why.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tuner.errors import FaTuneError
from tuner.kernel.runtime import (
    AttnBuffers,
    Device,
    Event,
    ShapeLike,
    Stream,
    as_problem,
    same_problem,
)

DEFAULT_TEMP_LIMIT_C = 65
DEFAULT_TEMP_WAIT_S = 60.0
MIN_CAPPED_REPEAT = 10  # timed launches a capped round keeps at least (Protocol.capped)


@dataclass(frozen=True)
class Protocol:
    """The timing protocol, one for every command (run, compare, the search, export timing).

    Per round: wait (at most ``temp_wait_s``) until the GPU is at or below ``temp_limit_c``;
    launch back to back for ``settle_s`` seconds so the round starts at the card's
    power-capped steady state (the H200's board power takes about a second of load to reach
    its 700 W cap, and the clock falls with it: docs/PERF.md, step 18); ``warmup`` launches;
    then ``repeat`` launches, each between its own pair of CUDA events. ``rounds`` rounds;
    the headline is the median of the round medians. ``max_round_s`` (0: none) caps the
    launches of a round of a long kernel (``capped``).
    """

    warmup: int = 50
    repeat: int = 200
    rounds: int = 3
    settle_s: float = 2.0
    temp_limit_c: int = DEFAULT_TEMP_LIMIT_C
    temp_wait_s: float = DEFAULT_TEMP_WAIT_S
    max_round_s: float = 0.0

    def __post_init__(self) -> None:
        for name, lo in (("warmup", 0), ("repeat", 1), ("rounds", 1)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise FaTuneError(f"timing --{name} must be an integer >= {lo} (got {v!r})")
        if self.repeat > 100_000 or self.warmup > 100_000 or self.rounds > 1000:
            raise FaTuneError(
                "timing protocol too long: warmup/repeat <= 100000 and rounds <= 1000"
            )
        if not 0.0 <= float(self.settle_s) <= 60.0:
            raise FaTuneError(f"--settle-s must be between 0 and 60 seconds (got {self.settle_s})")
        if not 0.0 <= float(self.temp_wait_s) <= 3600.0:
            raise FaTuneError(f"temperature wait must be 0..3600 s (got {self.temp_wait_s})")
        if not 0.0 <= float(self.max_round_s) <= 600.0:
            raise FaTuneError(f"a round's cap must be 0..600 s (got {self.max_round_s})")

    def capped(self, launch_ms: float) -> tuple[int, int]:
        """(warmup, repeat) of a round for a kernel of ``launch_ms`` a launch: the protocol's,
        or where they would run past ``max_round_s``, both cut in proportion (at least
        MIN_CAPPED_REPEAT timed launches). A search ranks a 32k-token causal layer (tens of
        milliseconds a launch) in seconds then, not minutes; one such launch already averages
        over thousands of tiles, so fewer of them lose little (docs/PERF.md step 78)."""
        n = self.warmup + self.repeat
        if self.max_round_s <= 0 or not launch_ms > 0 or n * launch_ms <= self.max_round_s * 1e3:
            return self.warmup, self.repeat
        share = self.max_round_s * 1e3 / (n * launch_ms)
        repeat = min(self.repeat, max(MIN_CAPPED_REPEAT, int(self.repeat * share)))
        warmup = min(self.warmup, max(1, int(self.warmup * share)))
        return warmup, repeat

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Protocol:
        """Inverse of to_dict; fields left out keep their defaults."""
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


# The named protocols. FULL is what every reported number uses: `fa-tune run`, `compare` and
# the export timing; the search's confirmation of a new best is FULL too (CONFIRM), so the best
# the search shows is the number a user measures. SCREEN and SURVEY are the search's cheap
# rankings (no settle phase: candidates are compared with each other under the same short
# protocol, never reported as the kernel's speed).
FULL = Protocol()
# The rankings' rounds stop at about 2 s (1 s for a screen): only kernels over 16 ms a launch
# (25 ms for a screen) get fewer launches.
SURVEY = Protocol(warmup=20, repeat=100, rounds=1, settle_s=0.0, temp_wait_s=10.0,
                  max_round_s=2.0)
SCREEN = Protocol(warmup=10, repeat=30, rounds=1, settle_s=0.0, temp_wait_s=10.0,
                  max_round_s=1.0)
# FULL with its rounds stopped near 4 s: the same launches up to 16 ms a launch; a 32k-token
# layer's 84 ms launch gets 38 a round, not 200 (uncapped, a trial at 32k tokens took 176 s and
# a 75 s bucket measured one; capped, 103 s: docs/PERF.md step 80).
CONFIRM = Protocol(max_round_s=4.0)


def flops(problem: ShapeLike) -> float:
    """FLOPs of one forward, ``Problem.flops``: causal 2*B*Hq*S*S*D, non-causal twice that
    (S_q < S_k: 4*B*Hq*D per (query, key) pair the mask keeps)."""
    return float(as_problem(problem).flops)


def tflops(problem: ShapeLike, ms: float) -> float:
    """TFLOPS = flops(problem) / (ms*1e9)."""
    if not ms > 0:
        raise ValueError(f"time must be positive (got {ms!r} ms)")
    return flops(problem) / (ms * 1e9)


# ---- NVML -----------------------------------------------------------------------------------
# Clock event ("throttle") reason bits, as in nvml.h (nvmlClocksEventReason*).
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)


def decode_throttle(mask: int) -> list[str]:
    """Reason names of a clock-event bitmask; unknown bits are named by value."""
    names = [name for bit, name in THROTTLE_REASONS if mask & bit]
    rest = mask & ~sum(bit for bit, _ in THROTTLE_REASONS)
    if rest:
        names.append(f"unknown_0x{rest:x}")
    return names


@dataclass
class GpuState:
    """One NVML snapshot; every field None when NVML is unavailable (``note`` says why)."""

    time_unix: float
    temperature_c: int | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    throttle_mask: int | None = None
    throttle_reasons: list[str] | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Nvml:
    """NVML access for one CUDA device (matched by PCI bus id); tolerant of missing NVML."""

    def __init__(self, pci_bus_id: str | None = None, index: int = 0) -> None:
        self.available = False
        self.note: str | None = None
        self._nv: Any = None
        self._h: Any = None
        try:
            import pynvml as nv
        except ImportError:
            self.note = "nvidia-ml-py (pynvml) is not installed: no NVML readings"
            return
        try:
            nv.nvmlInit()
        except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, driver issues, ...
            self.note = f"NVML unavailable ({_nvml_text(e)}): no temperature wait or GPU state"
            return
        h = None
        if pci_bus_id:
            try:
                h = nv.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
            except Exception:  # noqa: BLE001 - fall back to the index below
                h = None
        if h is None:
            try:
                h = nv.nvmlDeviceGetHandleByIndex(index)
            except Exception as e:  # noqa: BLE001
                self.note = f"NVML has no handle for GPU {index} ({_nvml_text(e)})"
                return
        self._nv, self._h, self.available = nv, h, True

    def driver_version(self) -> str | None:
        if not self.available:
            return None
        try:
            v = self._nv.nvmlSystemGetDriverVersion()
        except Exception:  # noqa: BLE001
            return None
        return v.decode() if isinstance(v, bytes) else str(v)

    def temperature(self) -> int | None:
        if not self.available:
            return None
        try:
            return int(self._nv.nvmlDeviceGetTemperature(self._h, self._nv.NVML_TEMPERATURE_GPU))
        except Exception:  # noqa: BLE001
            return None

    def state(self) -> GpuState:
        st = GpuState(time_unix=time.time(), note=self.note)
        if not self.available:
            return st
        nv, h = self._nv, self._h
        errors: list[str] = []

        def read(what: str, fn: Callable[[], Any]) -> Any:
            try:
                return fn()
            except Exception as e:  # noqa: BLE001 - one unsupported query must not lose the rest
                errors.append(f"{what}: {_nvml_text(e)}")
                return None

        st.temperature_c = read(
            "temperature", lambda: int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        )
        st.sm_clock_mhz = read(
            "sm clock", lambda: int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        )
        st.mem_clock_mhz = read(
            "mem clock", lambda: int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))
        )
        mw = read("power", lambda: nv.nvmlDeviceGetPowerUsage(h))
        st.power_w = None if mw is None else mw / 1000.0
        lim = read("power limit", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h))
        st.power_limit_w = None if lim is None else lim / 1000.0
        # Newer NVML renamed "throttle reasons" to "clocks event reasons".
        getter = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if getter is None:
            getter = nv.nvmlDeviceGetCurrentClocksThrottleReasons
        mask = read("throttle reasons", lambda: int(getter(h)))
        if mask is not None:
            st.throttle_mask = mask
            st.throttle_reasons = decode_throttle(mask)
        if errors:
            st.note = "; ".join(errors)
        return st


def _nvml_text(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__


@dataclass
class TempWait:
    limit_c: int
    bound_s: float
    waited_s: float
    start_c: int | None
    end_c: int | None
    bound_hit: bool  # the GPU was still above the limit when the bound ran out
    skipped: bool  # no NVML temperature: nothing was waited for

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def wait_for_temperature(
    read_temp: Callable[[], int | None],
    limit_c: int,
    bound_s: float,
    *,
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> TempWait:
    """Poll until ``read_temp() <= limit_c`` or ``bound_s`` seconds have passed."""
    t0 = clock()
    start = cur = read_temp()
    if cur is None:
        return TempWait(limit_c, bound_s, 0.0, None, None, bound_hit=False, skipped=True)
    while cur is not None and cur > limit_c:
        waited = clock() - t0
        if waited >= bound_s:
            return TempWait(limit_c, bound_s, waited, start, cur, bound_hit=True, skipped=False)
        sleep(min(poll_s, max(bound_s - waited, 0.0)))
        cur = read_temp()
    return TempWait(limit_c, bound_s, clock() - t0, start, cur, bound_hit=False,
                    skipped=cur is None)


# ---- results --------------------------------------------------------------------------------
@dataclass
class RoundResult:
    index: int
    samples_ms: list[float]
    median_ms: float
    min_ms: float
    max_ms: float
    temp_wait: TempWait
    state_before: GpuState
    state_after: GpuState

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "median_ms": self.median_ms,
            "min_ms": self.min_ms,
            "max_ms": self.max_ms,
            "temp_wait": self.temp_wait.to_dict(),
            "state_before": self.state_before.to_dict(),
            "state_after": self.state_after.to_dict(),
            "samples_ms": self.samples_ms,
        }


@dataclass
class TimingResult:
    protocol: Protocol
    shape: str  # the problem's text, str(Problem): "4x32x8192", "1x32/8x8192:d64:full"
    median_ms: float  # median of the round medians
    min_ms: float  # over every sample
    max_ms: float
    tflops: float  # at median_ms
    tflops_max: float  # at min_ms
    rounds: list[RoundResult]
    state_before: GpuState
    state_after: GpuState
    temp_limit_c: int
    temp_wait_bound_hit: bool  # some round started above the limit
    nvml_note: str | None = None
    prepare_host_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    problem: dict[str, Any] = field(default_factory=dict)  # Problem.to_dict()

    @property
    def samples_ms(self) -> list[float]:
        return [x for r in self.rounds for x in r.samples_ms]

    @property
    def round_medians_ms(self) -> list[float]:
        return [r.median_ms for r in self.rounds]

    def summary(self) -> str:
        warn = " (temperature bound hit)" if self.temp_wait_bound_hit else ""
        return (
            f"{self.shape}: median {self.median_ms:.4f} ms ({self.tflops:.1f} TFLOPS), "
            f"min {self.min_ms:.4f}, max {self.max_ms:.4f} ms over "
            f"{self.protocol.rounds}x{self.protocol.repeat} launches{warn}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol.to_dict(),
            "shape": self.shape,
            "problem": self.problem,
            "median_ms": self.median_ms,
            "min_ms": self.min_ms,
            "max_ms": self.max_ms,
            "tflops": self.tflops,
            "tflops_max": self.tflops_max,
            "round_medians_ms": self.round_medians_ms,
            "temp_limit_c": self.temp_limit_c,
            "temp_wait_bound_hit": self.temp_wait_bound_hit,
            "nvml_note": self.nvml_note,
            "prepare_host_ms": self.prepare_host_ms,
            "state_before": self.state_before.to_dict(),
            "state_after": self.state_after.to_dict(),
            "rounds": [r.to_dict() for r in self.rounds],
            **({"extra": self.extra} if self.extra else {}),
        }


def summarize_rounds(protocol: Protocol, shape: ShapeLike, rounds: list[RoundResult],
                     temp_limit_c: int, nvml_note: str | None = None,
                     prepare_host_ms: float | None = None) -> TimingResult:
    """Aggregate rounds (pure: testable without a GPU)."""
    if not rounds:
        raise ValueError("no timing rounds")
    med = float(statistics.median(r.median_ms for r in rounds))
    lo = min(r.min_ms for r in rounds)
    hi = max(r.max_ms for r in rounds)
    problem = as_problem(shape)
    return TimingResult(
        protocol=protocol,
        shape=str(problem),
        problem=problem.to_dict(),
        median_ms=med,
        min_ms=lo,
        max_ms=hi,
        tflops=tflops(shape, med),
        tflops_max=tflops(shape, lo),
        rounds=rounds,
        state_before=rounds[0].state_before,
        state_after=rounds[-1].state_after,
        temp_limit_c=temp_limit_c,
        temp_wait_bound_hit=any(r.temp_wait.bound_hit for r in rounds),
        nvml_note=nvml_note,
        prepare_host_ms=prepare_host_ms,
    )


def make_round(index: int, samples_ms: list[float], temp_wait: TempWait, before: GpuState,
               after: GpuState) -> RoundResult:
    if not samples_ms:
        raise ValueError("a round needs at least one sample")
    bad = [x for x in samples_ms if not x > 0]
    if bad:
        raise FaTuneError(f"CUDA events measured a non-positive time ({bad[0]} ms): timing broken")
    return RoundResult(
        index=index,
        samples_ms=list(samples_ms),
        median_ms=float(statistics.median(samples_ms)),
        min_ms=min(samples_ms),
        max_ms=max(samples_ms),
        temp_wait=temp_wait,
        state_before=before,
        state_after=after,
    )


_NVML_CACHE: dict[str, Nvml] = {}


def nvml_for(dev: Device) -> Nvml:
    key = dev.info.pci_bus_id or str(dev.index)
    nv = _NVML_CACHE.get(key)
    if nv is None:
        nv = Nvml(dev.info.pci_bus_id, dev.index)
        _NVML_CACHE[key] = nv
    return nv


def settle(launch: Callable[[], Any], seconds: float, sync: Callable[[], Any],
           clock: Callable[[], float] = time.monotonic) -> int:
    """Launch back to back for about ``seconds``; returns the number of launches.

    Synchronizes every few launches so the host never queues far ahead of the GPU (the wall
    clock then measures GPU time, not how fast the host enqueues).
    """
    if seconds <= 0:
        return 0
    n = 0
    end = clock() + seconds
    while clock() < end:
        for _ in range(4):
            launch()
        n += 4
        sync()
    return n


def time_kernel(
    dev: Device,
    kernel: Any,
    shape: ShapeLike,
    bufs: AttnBuffers,
    protocol: Protocol | None = None,
    *,
    stream: Stream | None = None,
    nvml: Nvml | None = None,
    poll_s: float = 1.0,
    wait_bound_s: Callable[[], float] | None = None,
    on_wait: Callable[[TempWait], None] | None = None,
) -> TimingResult:
    """THE timing loop: time ``kernel.forward(bufs, stream)`` with ``protocol``.

    The inputs are whatever bufs holds (the gate leaves the seed set there). ``kernel`` is any
    launchable with prepare(shape, stream) and forward(bufs, stream): fa-tune's kernel through
    its C ABI, or a peer adapted by tuner.measure.launch. ``wait_bound_s`` may shorten each
    round's temperature wait (a suite-wide budget); ``on_wait`` sees every wait.
    """
    proto = protocol or Protocol()
    if not same_problem(bufs.shape, shape):
        raise ValueError("buffers do not match the problem")
    dev.make_current()
    nv = nvml if nvml is not None else nvml_for(dev)
    st = stream if stream is not None else dev.stream()
    starts = [Event(dev) for _ in range(proto.repeat)]
    ends = [Event(dev) for _ in range(proto.repeat)]
    rounds: list[RoundResult] = []
    settled: list[int] = []
    try:
        prep_ms = kernel.prepare(shape, st)
        st.synchronize()
        if proto.max_round_s > 0:  # launches timed first: how many a round can afford
            probes = min(2, proto.repeat)  # the faster of two: a first launch may load the module
            for i in range(probes):
                starts[i].record(st)
                kernel.forward(bufs, st)
                ends[i].record(st)
            st.synchronize()
            warmup, repeat = proto.capped(min(Event.elapsed_ms(starts[i], ends[i])
                                              for i in range(probes)))
            proto = replace(proto, warmup=warmup, repeat=repeat)  # what the result records
        for r in range(proto.rounds):
            bound = proto.temp_wait_s
            if wait_bound_s is not None:
                bound = max(0.0, min(bound, wait_bound_s()))
            tw = wait_for_temperature(nv.temperature, proto.temp_limit_c, bound, poll_s=poll_s)
            if on_wait is not None:
                on_wait(tw)
            settled.append(settle(lambda: kernel.forward(bufs, st), proto.settle_s,
                                  st.synchronize))
            before = nv.state()
            for _ in range(proto.warmup):
                kernel.forward(bufs, st)
            for i in range(proto.repeat):
                starts[i].record(st)
                kernel.forward(bufs, st)
                ends[i].record(st)
            # A kernel fault surfaces here (CudaError), not as a wrong number.
            st.synchronize()
            samples = [Event.elapsed_ms(starts[i], ends[i]) for i in range(proto.repeat)]
            after = nv.state()
            rounds.append(make_round(r, samples, tw, before, after))
    finally:
        for e in (*starts, *ends):
            try:
                e.destroy()
            except Exception:  # noqa: BLE001 - cleanup must not mask the real error
                pass
        if stream is None:
            try:
                st.destroy()
            except Exception:  # noqa: BLE001
                pass
    res = summarize_rounds(proto, shape, rounds, proto.temp_limit_c, nv.note, prep_ms)
    res.extra["settle_launches"] = settled
    return res


def geomean(values: Sequence[float]) -> float:
    """The geometric mean of positive TFLOPS (a trial's value over its problems)."""
    if not values or any(v <= 0 for v in values):
        raise ValueError("geometric mean needs positive values")
    return math.exp(sum(math.log(v) for v in values) / len(values))
