"""End to end on an H200: `fa-tune run` builds, gates and times the baseline on the seed shapes."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tuner.cli import app

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("preset", ["baseline"])
def test_cli_run_seed_shapes(preset: str, tmp_path: Path) -> None:
    out = tmp_path / "results"
    r = CliRunner().invoke(
        app,
        ["run", "--preset", preset, "--warmup", "5", "--repeat", "20", "--rounds", "2",
         "--results-dir", str(out)],
        env={"COLUMNS": "200"},
    )
    assert r.exit_code == 0, r.output
    [d] = list(out.iterdir())
    data = json.loads((d / "results.json").read_text())
    assert data["status"] == "passed"
    assert [s["shape"] for s in data["shapes"]] == ["4x32x4096", "4x32x8192", "4x32x16384"]
    for s in data["shapes"]:
        assert s["gate"]["passed"] and s["timing"]["median_ms"] > 0
        assert s["timing"]["min_ms"] <= s["timing"]["median_ms"] <= s["timing"]["max_ms"]
        assert s["timing"]["tflops"] == pytest.approx(
            s["flops"] / (s["timing"]["median_ms"] * 1e9), rel=1e-3
        )
    assert data["build"]["so_sha256"] and data["build"]["template_sha256"]
    assert data["gpu"]["name"] and data["protocol"]["repeat"] == 20
    rows = list(csv.DictReader((d / "summary.csv").open()))
    assert len(rows) == 3 and all(row["gate_passed"] == "True" for row in rows)
    assert "TFLOPS" in (d / "summary.md").read_text()


def test_cli_run_bad_shape_on_gpu() -> None:
    r = CliRunner().invoke(app, ["run", "--preset", "baseline", "--shape", "4x32"])
    assert r.exit_code == 2
