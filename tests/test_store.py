from __future__ import annotations

import csv
import json
from pathlib import Path

from tuner.measure import store


def _payload() -> dict:
    return {
        "status": "failed",
        "failure": "4x32x8192: gate failed: 12 violations",
        "created_utc": "2026-11-29T18:30:00Z",
        "config": {"block_m": 128},
        "config_id": "abc123def456",
        "preset": "baseline",
        "protocol": {"warmup": 50, "repeat": 200, "rounds": 3},
        "gpu": {"name": "NVIDIA H200", "driver_version": "580.159"},
        "build": {"nvcc_version": "13.0.88", "so_sha256": "f" * 64},
        "shapes": [
            {
                "shape": "4x32x4096", "status": "passed", "error": None,
                "gate": {"passed": True, "summary": "ok", "max_abs_err": 0.002, "rel_l2": 1e-3},
                "timing": {"median_ms": 1.5, "min_ms": 1.4, "max_ms": 1.6, "tflops": 366.5},
            },
            {
                "shape": "4x32x8192", "status": "failed", "error": "gate failed: 12 violations",
                "gate": {"passed": False, "summary": "12 violations", "max_abs_err": 0.9,
                         "rel_l2": 0.2},
                "timing": None,
            },
        ],
    }


def test_new_result_dir_unique(tmp_path: Path) -> None:
    dirs = {store.new_result_dir(tmp_path) for _ in range(5)}
    assert len(dirs) == 5 and all(d.is_dir() for d in dirs)
    first = min(dirs, key=lambda d: len(d.name))
    assert len(first.name) == 16 and first.name.endswith("Z") and first.name[8] == "T"


def test_write_results_three_files(tmp_path: Path) -> None:
    d = store.new_result_dir(tmp_path)
    paths = store.write_results(d, _payload())
    assert {p.name for p in d.iterdir()} == {"results.json", "summary.csv", "summary.md"}
    data = json.loads(paths["json"].read_text())
    assert data["schema"] == store.SCHEMA_VERSION and data["status"] == "failed"
    rows = list(csv.DictReader(paths["csv"].open()))
    assert [r["shape"] for r in rows] == ["4x32x4096", "4x32x8192"]
    assert tuple(rows[0]) == store.CSV_COLUMNS
    assert rows[0]["median_ms"] == "1.5" and rows[0]["gate_passed"] == "True"
    assert rows[1]["median_ms"] == "" and rows[1]["gate_passed"] == "False"
    md = paths["md"].read_text()
    assert "| 4x32x4096 | pass | 1.500 | 366.5 |" in md
    assert "| 4x32x8192 | FAIL | - " not in md and "4x32x8192 | FAIL" in md
    assert "failed" in md and "NVIDIA H200" in md
    assert store.read_results(d)["config_id"] == "abc123def456"
