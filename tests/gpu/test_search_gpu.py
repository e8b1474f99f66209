"""On an H200: a tiny real search (real builds, the real GPU worker), then its export built
standalone with its own build.sh and run through the gate."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from typer.testing import CliRunner

from tuner.cli import app

pytestmark = pytest.mark.gpu
SPACE = "block_n: [112, 128]\nk_stages: [2, 3]\nv_stages: [2, 3]\n"


@pytest.fixture(scope="module")
def gpu_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("gpusearch")
    space = root / "space.yaml"
    space.write_text(SPACE)
    url = f"sqlite:///{root / 'g.db'}"
    r = CliRunner().invoke(app, ["search", "--study", "g", "--storage", url, "--space",
                                 str(space), "--shape", "2x16x2048", "--trials", "3"],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    return "g", url


def test_search_runs_on_gpu(gpu_study: tuple[str, str]) -> None:
    name, url = gpu_study
    ts = optuna.load_study(study_name=name, storage=url).get_trials()
    assert not [t for t in ts if t.state == TrialState.RUNNING]
    done = [t for t in ts if t.state == TrialState.COMPLETE]
    assert done and done[0].user_attrs["source"] == "preset:default"
    assert any(t.user_attrs.get("confirmed") for t in done)


def test_export_builds_and_passes_gate(gpu_study: tuple[str, str], tmp_path: Path) -> None:
    name, url = gpu_study
    out = tmp_path / "pkg"
    r = CliRunner().invoke(app, ["export", "--study", name, "--storage", url, "--out", str(out)])
    assert r.exit_code == 0, r.output
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # build.sh needs nvcc alone (no fa-tune, no CUTLASS).
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    p = subprocess.run(["bash", str(out / "build.sh")], capture_output=True, text=True, env=env,
                       timeout=1800)
    assert p.returncode == 0, p.stderr[-3000:]
    from tuner.kernel import runtime
    from tuner.measure import oracle
    from tuner.problem import Problem

    dev = runtime.Device.open(0)
    shape = Problem(2, 16, 2048)
    for so in (out / "build" / "libfa_tune_fwd.so", out / "lib" / "libfa_tune_fwd.so"):
        kernel = runtime.KernelModule(so)
        with runtime.AttnBuffers(dev, shape) as bufs:
            g = oracle.gate(dev, kernel, shape, bufs)
        assert g.passed, g.summary()
