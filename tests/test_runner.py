"""The results payload's gate form and JSON conversion with the oracle's real result types
(no GPU needed)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tuner.measure import gate_rule, store
from tuner.problem import SEED_PROBLEMS

oracle = pytest.importorskip("tuner.measure.oracle")
bench = pytest.importorskip("tuner.measure.bench")


def _metrics(name: str, passed: bool, err: float, rel: float) -> gate_rule.SetMetrics:
    return gate_rule.SetMetrics(
        input_set=name, passed=passed, max_abs_err=err, rel_l2=rel,
        violations=0 if passed else 7, first_violation=None if passed else (0, 5, 1, 3),
        nan_count=0, unwritten=0, elements=10,
        reasons=[] if passed else ["7 elements violate"],
    )


def test_gate_dict_takes_worst_set_and_is_json_safe(tmp_path: Path) -> None:
    g = gate_rule.GateResult(
        passed=False, shape=(4, 32, 4096), seed=42,
        sets=[_metrics("seed", True, 0.002, 1e-3), _metrics("rising", False, 0.7, math.inf)],
    )
    d = bench.gate_dict(g)
    assert d["passed"] is False and d["max_abs_err"] == 0.7
    assert "FAIL" in d["summary"] and d["details"]["sets"][1]["first_violation"] == [0, 5, 1, 3]
    payload = {
        "status": "failed", "failure": "4x32x4096: gate failed", "config_id": "x",
        "shapes": [{"shape": str(SEED_PROBLEMS[0]), "status": "failed", "gate": d, "timing": None}],
    }
    out = store.new_result_dir(tmp_path)
    store.write_results(out, payload)
    data = json.loads((out / "results.json").read_text())  # strict JSON: inf became null
    assert data["shapes"][0]["gate"]["rel_l2"] is None
    assert "FAIL" in (out / "summary.md").read_text()


def test_to_plain() -> None:
    assert store.to_plain({"a": (1, 2), "b": Path("x")}) == {"a": [1, 2], "b": "x"}
