"""GPU test of the timing protocol on a trivial kernel (the oracle's poison fill)."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

from tuner.kernel.runtime import AttnBuffers, Device
from tuner.measure import oracle as O
from tuner.measure import timing as T

pytestmark = pytest.mark.gpu


class FillKernel:
    """Writes O once (a memory-bound fill): a kernel with a known, small cost."""

    writes_lse = False

    def __init__(self, orc: Any) -> None:
        self.orc = orc
        self.prepared = 0

    def prepare(self, shape: Any, stream: Any) -> float:
        self.prepared += 1
        return 0.0

    def forward(self, bufs: AttnBuffers, stream: Any) -> None:
        self.orc.poison(bufs.o.ptr, bufs.n, None, 0, stream)


def test_time_kernel_sane_numbers() -> None:
    dev = Device.open(0)
    orc = O.get_oracle()
    shape = SimpleNamespace(B=4, H=32, S=4096)
    kern = FillKernel(orc)
    with AttnBuffers(dev, shape) as bufs:
        proto = T.Protocol(warmup=5, repeat=30, rounds=2, settle_s=0.2, temp_wait_s=5)
        r = T.time_kernel(dev, kern, shape, bufs, proto)
    assert kern.prepared == 1
    assert len(r.extra["settle_launches"]) == 2 and min(r.extra["settle_launches"]) > 0
    assert len(r.rounds) == 2 and len(r.samples_ms) == 60
    assert 0.005 < r.median_ms < 5.0  # 128 MiB written at a few TB/s: ~0.05 ms
    assert r.min_ms <= r.median_ms <= r.max_ms
    assert math.isfinite(r.tflops) and r.tflops == pytest.approx(T.tflops(shape, r.median_ms))
    nv = T.nvml_for(dev)
    if nv.available:
        st = r.state_before
        assert st.temperature_c is not None and st.sm_clock_mhz and st.power_limit_w
        assert isinstance(st.throttle_reasons, list)
    else:
        assert r.nvml_note
