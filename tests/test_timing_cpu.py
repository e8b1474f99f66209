"""CPU tests of tuner/measure/timing.py: protocol validation, the TFLOPS formula, throttle
decoding, the bounded temperature wait, the settle phase, aggregation, and the time_kernel loop
against fake CUDA events."""

from __future__ import annotations

import statistics
from types import SimpleNamespace
from typing import Any

import pytest

from tuner.errors import FaTuneError
from tuner.measure import timing as T


def test_protocol_defaults_and_validation() -> None:
    p = T.Protocol()
    assert (p.warmup, p.repeat, p.rounds) == (50, 200, 3)
    assert T.Protocol(0, 1, 1).warmup == 0
    for kw in (dict(repeat=0), dict(rounds=0), dict(warmup=-1), dict(repeat=2.5),
               dict(rounds=True), dict(repeat=10**7)):
        with pytest.raises(FaTuneError):
            T.Protocol(**kw)  # type: ignore[arg-type]
    for kw in (dict(settle_s=-1.0), dict(settle_s=61.0), dict(temp_wait_s=-1.0),
               dict(max_round_s=-1.0), dict(max_round_s=601.0)):
        with pytest.raises(FaTuneError):
            T.Protocol(**kw)  # type: ignore[arg-type]
    d = T.Protocol(1, 2, 3).to_dict()
    assert d == {"warmup": 1, "repeat": 2, "rounds": 3, "settle_s": 2.0, "temp_limit_c": 65,
                 "temp_wait_s": 60.0, "max_round_s": 0.0}
    assert T.Protocol.from_dict(d) == T.Protocol(1, 2, 3)
    assert T.Protocol.from_dict({"warmup": 7}) == T.Protocol(warmup=7)


def test_named_protocols() -> None:
    # Every reported number (run, compare, the search's confirmation, export timing) uses FULL.
    assert T.FULL == T.Protocol() and T.FULL.settle_s == 2.0
    assert (T.FULL.warmup, T.FULL.repeat, T.FULL.rounds) == (50, 200, 3)
    # The search's rankings are short and skip the settle phase.
    assert T.SCREEN.settle_s == 0.0 and T.SURVEY.settle_s == 0.0
    assert T.SCREEN.repeat < T.SURVEY.repeat < T.FULL.repeat


def test_settle_launches_until_the_clock_runs_out() -> None:
    now = [0.0]
    calls: list[str] = []

    def launch() -> None:
        calls.append("l")
        now[0] += 0.1

    def sync() -> None:
        calls.append("s")

    n = T.settle(launch, 1.0, sync, clock=lambda: now[0])
    # 4 launches then a sync per step, until 1.0 s of (fake) GPU time has passed.
    assert n == 12 and calls.count("s") == 3 and calls[:5] == ["l"] * 4 + ["s"]
    assert T.settle(launch, 0.0, sync) == 0


def test_tflops_matches_the_anchor_table() -> None:
    # The anchors the project started from: FA3 0.971 ms at 4x32x4096 -> 566 TFLOPS;
    # 13.898 ms at 16384 -> 633.
    assert T.tflops(SimpleNamespace(B=4, H=32, S=4096), 0.971) == pytest.approx(566.2, abs=0.1)
    assert T.tflops(SimpleNamespace(B=4, H=32, S=16384), 13.898) == pytest.approx(633.0, abs=0.1)
    assert T.flops(SimpleNamespace(B=1, H=1, S=2)) == 2 * 4 * 128
    with pytest.raises(ValueError):
        T.tflops(SimpleNamespace(B=1, H=1, S=2), 0.0)


def test_flops_follow_the_problem() -> None:
    from tuner.problem import Problem

    # GQA does not change the FLOPs (every query head attends); D scales them; non-causal x2.
    base = T.flops(Problem(4, 32, 4096))
    assert base == Problem(4, 32, 4096).flops == 2 * 4 * 32 * 4096**2 * 128
    assert T.flops(Problem(4, 32, 4096, Hkv=8)) == base
    assert T.flops(Problem(4, 32, 4096, Hkv=1, D=64)) == base / 2
    assert T.flops(Problem(4, 32, 4096, D=256, causal=False)) == base * 4
    p = Problem(1, 32, 8192, Hkv=8, causal=False)
    assert T.tflops(p, 2.0) == pytest.approx(p.tflops(2.0))


def test_decode_throttle() -> None:
    assert T.decode_throttle(0) == []
    assert T.decode_throttle(0x4) == ["sw_power_cap"]
    assert T.decode_throttle(0x1 | 0x40) == ["gpu_idle", "hw_thermal_slowdown"]
    assert T.decode_throttle(0x4 | 0x1000) == ["sw_power_cap", "unknown_0x1000"]


def test_throttle_bits_match_pynvml() -> None:
    nv = pytest.importorskip("pynvml")
    names = {
        "gpu_idle": "GpuIdle", "applications_clocks_setting": "ApplicationsClocksSetting",
        "sw_power_cap": "SwPowerCap", "hw_slowdown": "HwSlowdown", "sync_boost": "SyncBoost",
        "sw_thermal_slowdown": "SwThermalSlowdown", "hw_thermal_slowdown": "HwThermalSlowdown",
        "hw_power_brake_slowdown": "HwPowerBrakeSlowdown",
        "display_clock_setting": "DisplayClockSetting",
    }
    for bit, name in T.THROTTLE_REASONS:
        assert getattr(nv, "nvmlClocksThrottleReason" + names[name]) == bit


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_wait_for_temperature_cool_gpu_does_not_wait() -> None:
    clk = FakeClock()
    w = T.wait_for_temperature(lambda: 40, 65, 60, clock=clk, sleep=clk.sleep)
    assert w.waited_s == 0 and not w.bound_hit and not w.skipped and w.end_c == 40


def test_wait_for_temperature_waits_until_cool() -> None:
    clk = FakeClock()
    temps = iter([80, 75, 70, 64, 60])
    w = T.wait_for_temperature(lambda: next(temps), 65, 60, clock=clk, sleep=clk.sleep, poll_s=2)
    assert w.start_c == 80 and w.end_c == 64 and w.waited_s == 6 and not w.bound_hit


def test_wait_for_temperature_is_bounded() -> None:
    clk = FakeClock()
    w = T.wait_for_temperature(lambda: 90, 65, 10, clock=clk, sleep=clk.sleep, poll_s=3)
    assert w.bound_hit and w.waited_s == pytest.approx(10) and w.end_c == 90


def test_wait_for_temperature_without_nvml() -> None:
    w = T.wait_for_temperature(lambda: None, 65, 60)
    assert w.skipped and not w.bound_hit and w.start_c is None


def test_nvml_missing_is_tolerated(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name: str, *a: Any, **kw: Any) -> Any:
        if name == "pynvml":
            raise ImportError("no pynvml")
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    nv = T.Nvml("0000:00:00.0")
    assert not nv.available and "not installed" in (nv.note or "")
    st = nv.state()
    assert st.temperature_c is None and st.throttle_reasons is None and st.note == nv.note
    assert nv.temperature() is None and nv.driver_version() is None


def test_nvml_without_driver_is_tolerated() -> None:
    nv = T.Nvml(None, 0)
    if nv.available:
        pytest.skip("NVML works here")
    assert nv.note and "\n" not in nv.note
    assert nv.state().sm_clock_mhz is None


def _state() -> T.GpuState:
    return T.GpuState(time_unix=0.0, temperature_c=50)


def _wait(hit: bool = False) -> T.TempWait:
    return T.TempWait(65, 60, 0.0, 50, 50, bound_hit=hit, skipped=False)


def test_summarize_rounds() -> None:
    rounds = [
        T.make_round(0, [1.0, 2.0, 3.0], _wait(), _state(), _state()),
        T.make_round(1, [1.5, 1.6, 9.0], _wait(True), _state(), _state()),
        T.make_round(2, [0.5, 2.5, 2.6], _wait(), _state(), _state()),
    ]
    shape = SimpleNamespace(B=1, H=1, S=1024)
    r = T.summarize_rounds(T.Protocol(0, 3, 3), shape, rounds, 65)
    assert r.round_medians_ms == [2.0, 1.6, 2.5]
    assert r.median_ms == 2.0 and r.min_ms == 0.5 and r.max_ms == 9.0
    assert r.tflops == pytest.approx(T.tflops(shape, 2.0))
    assert r.tflops_max == pytest.approx(T.tflops(shape, 0.5))
    assert r.temp_wait_bound_hit
    assert len(r.samples_ms) == 9
    d = r.to_dict()
    assert d["rounds"][1]["samples_ms"] == [1.5, 1.6, 9.0]
    assert "temperature bound hit" in r.summary()
    assert r.shape == d["shape"] == "1x1x1024" and r.summary().startswith("1x1x1024: median")
    assert d["problem"] == {"B": 1, "H": 1, "Hq": 1, "Hkv": 1, "S": 1024, "D": 128,
                            "causal": True}
    with pytest.raises(FaTuneError):
        T.make_round(0, [1.0, 0.0], _wait(), _state(), _state())


# ---- time_kernel against fakes --------------------------------------------------------------
class FakeStream:
    def __init__(self) -> None:
        self.clock = 0.0
        self.synced = 0
        self.destroyed = False

    def synchronize(self) -> None:
        self.synced += 1

    def destroy(self) -> None:
        self.destroyed = True


class FakeEvent:
    def __init__(self, dev: Any) -> None:
        self.t: float | None = None

    def record(self, stream: FakeStream) -> None:
        self.t = stream.clock

    def destroy(self) -> None:
        pass

    @staticmethod
    def elapsed_ms(a: FakeEvent, b: FakeEvent) -> float:
        assert a.t is not None and b.t is not None
        return b.t - a.t


class FakeKernel:
    def __init__(self, durations: list[float]) -> None:
        self.durations = durations
        self.calls = 0
        self.prepared = 0

    def prepare(self, shape: Any, stream: Any) -> float:
        self.prepared += 1
        return 1.25

    def forward(self, bufs: Any, stream: FakeStream) -> None:
        stream.clock += self.durations[self.calls % len(self.durations)]
        self.calls += 1


class FakeNvml:
    note = None

    def __init__(self) -> None:
        self.reads = 0

    def temperature(self) -> int:
        self.reads += 1
        return 50

    def state(self) -> T.GpuState:
        return T.GpuState(time_unix=0.0, temperature_c=50, sm_clock_mhz=1980,
                          throttle_mask=0, throttle_reasons=[])


def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, Any]:
    """(device, problem, buffers) for time_kernel on fake CUDA events."""
    monkeypatch.setattr(T, "Event", FakeEvent)
    shape = SimpleNamespace(B=1, H=2, S=256)
    return SimpleNamespace(make_current=lambda: None), shape, SimpleNamespace(shape=shape)


def test_time_kernel_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    dev, shape, bufs = fake_gpu(monkeypatch)
    stream = FakeStream()
    kern = FakeKernel([1.0, 2.0, 3.0, 4.0, 5.0])
    nv = FakeNvml()
    proto = T.Protocol(warmup=3, repeat=5, rounds=2, settle_s=0.0)
    r = T.time_kernel(dev, kern, shape, bufs, proto, stream=stream, nvml=nv)  # type: ignore[arg-type]
    assert kern.prepared == 1 and kern.calls == 2 * (3 + 5)
    assert r.extra["settle_launches"] == [0, 0]
    assert nv.reads == 2  # one temperature wait per round
    assert len(r.rounds) == 2 and all(len(x.samples_ms) == 5 for x in r.rounds)
    # Round 0 times calls 3..7 (durations 4,5,1,2,3); round 1 times calls 11..15 (2,3,4,5,1).
    assert r.rounds[0].samples_ms == [4.0, 5.0, 1.0, 2.0, 3.0]
    assert r.rounds[1].samples_ms == [2.0, 3.0, 4.0, 5.0, 1.0]
    assert r.median_ms == statistics.median([3.0, 3.0]) and r.min_ms == 1.0 and r.max_ms == 5.0
    assert r.prepare_host_ms == 1.25
    assert r.state_before.sm_clock_mhz == 1980
    assert not stream.destroyed  # a caller's stream is left alone
    assert stream.synced >= 3


def test_protocol_capped_cuts_only_long_kernels() -> None:
    # Every reported number (FULL) keeps its counts; the search's rankings stop near 2 s a round.
    assert T.FULL.max_round_s == 0.0 and T.FULL.capped(70.0) == (50, 200)
    assert T.SURVEY.capped(1.0) == (20, 100) and T.SURVEY.capped(16.0) == (20, 100)
    # A 32k-token causal layer at 70 ms a launch: 120 launches (8.4 s) become 28 (2 s).
    w, r = T.SURVEY.capped(70.0)
    assert (w, r) == (4, 23) and (w + r) * 70.0 <= 2000.0
    # Never under MIN_CAPPED_REPEAT timed launches, and one warm-up at least.
    assert T.SURVEY.capped(10_000.0) == (1, T.MIN_CAPPED_REPEAT)
    assert T.SCREEN.capped(0.0) == (10, 30)  # an unmeasurable probe: no cut
    # The search's confirmation: FULL's launches up to 16 ms a launch; a 32k-token layer's
    # 84 ms launch (docs/PERF.md step 80) 9 + 38 a round, under 4 s.
    assert T.CONFIRM.capped(16.0) == (50, 200)
    w, r = T.CONFIRM.capped(84.0)
    assert (w, r) == (9, 38) and (w + r) * 84.0 <= 4000.0
    assert (T.CONFIRM.settle_s, T.CONFIRM.rounds) == (T.FULL.settle_s, T.FULL.rounds)


def test_time_kernel_caps_a_long_kernels_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    dev, shape, bufs = fake_gpu(monkeypatch)
    stream = FakeStream()
    proto = T.Protocol(warmup=20, repeat=100, rounds=2, settle_s=0.0, max_round_s=2.0)
    # ms a launch: 120 x 50 = 6 s a round uncapped; the first launch 400 ms (a module loading)
    long_kernel = FakeKernel([400.0] + [50.0] * 200)
    r = T.time_kernel(dev, long_kernel, shape, bufs, proto, stream=stream,  # type: ignore[arg-type]
                      nvml=FakeNvml())  # type: ignore[arg-type]
    # Two probe launches (the faster counts), then per round 6 warm-up and 33 timed (a third).
    assert long_kernel.calls == 2 + 2 * (6 + 33)
    assert all(len(x.samples_ms) == 33 for x in r.rounds) and r.median_ms == 50.0
    assert (r.protocol.warmup, r.protocol.repeat, r.protocol.max_round_s) == (6, 33, 2.0)
    short = FakeKernel([30.0] + [0.5] * 300)  # a slow first launch does not cut a short kernel
    r = T.time_kernel(dev, short, shape, bufs, proto, stream=FakeStream(),  # type: ignore[arg-type]
                      nvml=FakeNvml())  # type: ignore[arg-type]
    assert short.calls == 2 + 2 * 120 and r.protocol == proto  # under the cap: as asked


def test_time_kernel_rejects_mismatched_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(T, "Event", FakeEvent)
    dev = SimpleNamespace(make_current=lambda: None)
    with pytest.raises(ValueError):
        T.time_kernel(dev, FakeKernel([1.0]), SimpleNamespace(B=1, H=1, S=64),  # type: ignore[arg-type]
                      SimpleNamespace(shape=SimpleNamespace(B=1, H=1, S=128)),  # type: ignore[arg-type]
                      stream=FakeStream(), nvml=FakeNvml())  # type: ignore[arg-type]


def test_summarize_rounds_for_a_gqa_non_causal_problem() -> None:
    from tuner.problem import Problem

    p = Problem(1, 32, 8192, Hkv=8, D=64, causal=False)
    rounds = [T.make_round(0, [2.0, 2.0], _wait(), _state(), _state())]
    r = T.summarize_rounds(T.Protocol(0, 2, 1), p, rounds, 65)
    assert r.shape == "1x32/8x8192:d64:full" and r.median_ms == 2.0
    assert r.tflops == pytest.approx(p.flops / 2e9)
    d = r.to_dict()
    assert Problem.from_dict(d["problem"]) == p and d["shape"] == str(p)
    assert r.summary().startswith("1x32/8x8192:d64:full: median 2.0000 ms")


def test_time_kernel_rejects_buffers_of_another_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.problem import Problem

    monkeypatch.setattr(T, "Event", FakeEvent)
    dev = SimpleNamespace(make_current=lambda: None)
    p = Problem(1, 4, 64, Hkv=2)
    for other in (Problem(1, 4, 64), Problem(1, 4, 64, Hkv=2, causal=False)):
        with pytest.raises(ValueError, match="do not match"):
            T.time_kernel(dev, FakeKernel([1.0]), other,  # type: ignore[arg-type]
                          SimpleNamespace(shape=p), stream=FakeStream(),  # type: ignore[arg-type]
                          nvml=FakeNvml())  # type: ignore[arg-type]
    r = T.time_kernel(dev, FakeKernel([1.0]), p, SimpleNamespace(shape=p),  # type: ignore[arg-type]
                      T.Protocol(0, 2, 1, settle_s=0.0), stream=FakeStream(),  # type: ignore[arg-type]
                      nvml=FakeNvml())  # type: ignore[arg-type]
    assert r.shape == "1x4/2x64" and r.tflops == pytest.approx(p.tflops(1.0))
