"""fa-tune profile's parsers on what ncu really prints: output captured on the H200
(ncu 2025.3.1, 2026-11-30; tests/data/ncu_h200/README.md says how), not made-up CSV."""

from __future__ import annotations

import lzma
from pathlib import Path

import pytest

from tuner import profile

DATA = Path(__file__).resolve().parent / "data" / "ncu_h200"


def test_details_page_gives_every_headline_metric() -> None:
    h = profile.parse_details_csv((DATA / "ncu_details_h200_2025.3.1.csv").read_text())
    assert h.kernel_name == "void attention_fwd_kernel<<unnamed>::Config>(Params)"
    # The values in the captured CSV (its metric rows end with a trailing comma).
    assert h.duration_ms == pytest.approx(2.99)
    assert h.metrics["sm_throughput_pct"] == pytest.approx(81.9)
    assert h.metrics["memory_throughput_pct"] == pytest.approx(43.38)
    assert h.metrics["achieved_occupancy_pct"] == pytest.approx(14.06)
    assert h.metrics["l2_hit_rate_pct"] == pytest.approx(86.28)
    rows = dict(h.rows())
    assert all("n/a" not in v for k, v in rows.items() if k != "tensor pipe utilization")


def test_raw_page_gives_the_tensor_pipe() -> None:
    text = lzma.open(DATA / "ncu_raw_h200_2025.3.1.csv.xz", "rt").read()
    assert profile.parse_raw_tensor_pipe(text) == pytest.approx(82.775845)
