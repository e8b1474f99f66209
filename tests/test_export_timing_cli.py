"""scripts/export_timing.py up to the GPU: which problems it times and its one-line refusals."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna

from tuner.kernel.config import load_preset

REPO = Path(__file__).resolve().parents[1]


def _gqa_study(tmp_path: Path) -> str:
    """A real SQLite study whose best trial is a GQA-only config measured on a Llama row."""
    url = f"sqlite:///{tmp_path / 'g'}.db"
    st = optuna.create_study(study_name="g", storage=url, direction="maximize")
    t = st.ask()
    t.set_user_attr("config", load_preset("gqa-cluster").to_dict())
    t.set_user_attr("confirmed", {"geomean_tflops": 650.0,
                                  "shapes": {"1x32/8x8192": {"median_ms": 0.85, "tflops": 650.0}}})
    st.tell(t, 650.0)
    return url


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "export_timing.py"), *args],
                          capture_output=True, text=True, timeout=120)


def test_defaults_to_the_trials_own_problems(tmp_path: Path) -> None:
    # The seed shapes (MHA) would be refused by head_cluster 2: the trial's GQA row is taken,
    # so the script gets as far as the missing export (2026-12-02 on the H200 it refused).
    url = _gqa_study(tmp_path)
    r = _run("--study", "g", "--storage", url, "--export", str(tmp_path / "none"))
    assert r.returncode == 2, r.stderr
    assert "libfa_tune_fwd.so is missing" in r.stdout, r.stdout + r.stderr


def test_a_problem_the_config_cannot_run_is_one_line(tmp_path: Path) -> None:
    url = _gqa_study(tmp_path)
    r = _run("--study", "g", "--storage", url, "--export", str(tmp_path / "none"),
             "--shape", "4x32x4096")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "head_cluster 2" in lines[0], r.stderr
