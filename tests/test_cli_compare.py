"""``fa-tune compare`` on the CPU: every wrong input is one line and exit 2, before any compile;
a kernel that fails its gate is exit 1. No torch, GPU or peer package needed."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import one_error_line as _one_error_line
from typer.testing import CliRunner

from tuner import build as build_mod
from tuner import compare as compare_mod
from tuner import peers
from tuner.cli import app

REPO = Path(__file__).resolve().parent.parent
runner = CliRunner()


@pytest.fixture(autouse=True)
def no_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong-input test must fail before building: any compile is a test failure."""

    def refuse(*_a: Any, **_k: Any) -> None:
        raise AssertionError("compare built a kernel on a wrong-input path")

    monkeypatch.setattr(build_mod, "build_config", refuse)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--preset", "default", "--config", "x.yaml"], "at most one of --study, --preset"),
        (["--study", "s", "--preset", "default"], "at most one of --study, --preset"),
        (["--preset", "nope"], "unknown preset 'nope'"),
        (["--preset", "default", "--shape", "4x32"], "shape"),
        (["--preset", "default", "--shape", "0x1x128"], "shape"),
        (["--preset", "default", "--backends", "fa3,flashinfer"], "unknown backend 'flashinfer'"),
        (["--preset", "default", "--warmup", "-1"], "warmup"),
        (["--config", "/nonexistent/c.yaml"], "cannot read config file"),
    ],
)
def test_compare_wrong_input_exit_2(args: list[str], needle: str) -> None:
    r = runner.invoke(app, ["compare", *args])
    assert r.exit_code == 2, r.output
    if needle == "warmup":  # typer's own range check: its usage error, also exit 2
        assert "--warmup" in r.output and "Traceback" not in r.output
    else:
        assert needle in _one_error_line(r.output)


def test_compare_invalid_config_exit_2(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("block_m: 64\npingpong: true\n")
    r = runner.invoke(app, ["compare", "--config", str(p)])
    assert r.exit_code == 2
    assert "pingpong needs at least 2 consumer warpgroups" in _one_error_line(r.output)


def _study(tmp_path: Path, name: str, config: dict[str, Any] | None,
           confirmed: dict[str, Any] | None = None) -> str:
    """A real SQLite study with one trial (complete with ``config``, or failed when None)."""
    import optuna

    url = f"sqlite:///{tmp_path / name}.db"
    st = optuna.create_study(study_name=name, storage=url, direction="maximize")
    t = st.ask()
    if config is None:
        st.tell(t, state=optuna.trial.TrialState.FAIL)
    else:
        t.set_user_attr("config", config)
        if confirmed is not None:
            t.set_user_attr("confirmed", confirmed)
        st.tell(t, 600.0)
    return url


def test_compare_unknown_study_exit_2(tmp_path: Path) -> None:
    r = runner.invoke(app, ["compare", "--study", "nope", "--storage",
                            f"sqlite:///{tmp_path / 'x'}.db"])
    assert r.exit_code == 2
    assert "unknown study 'nope'" in _one_error_line(r.output)


@pytest.mark.parametrize(
    ("config", "needle"),
    [(None, "has no best config"), ({"block_m": 64, "pingpong": True}, "pingpong needs")],
)
def test_compare_study_resolution_errors(tmp_path: Path, config: Any, needle: str) -> None:
    url = _study(tmp_path, "mine", config)
    r = runner.invoke(app, ["compare", "--study", "mine", "--storage", url])
    assert r.exit_code == 2
    assert needle in _one_error_line(r.output)


def test_compare_without_a_gpu_is_one_line_before_building() -> None:
    """No GPU on this machine: one line, exit 2, and no compile (the fixture refuses builds)."""
    from tuner import runtime

    try:
        runtime.Device.open(0)
    except runtime.GpuError:
        pass
    else:  # pragma: no cover - only where a GPU is visible
        pytest.skip("a GPU is visible here")
    r = runner.invoke(app, ["compare", "--preset", "default", "--backends", "none"])
    assert r.exit_code == 2
    assert "GPU" in _one_error_line(r.output) or "driver" in _one_error_line(r.output)


def test_compare_storage_without_study_exit_2() -> None:
    r = runner.invoke(app, ["compare", "--preset", "default", "--storage", "sqlite:///x.db"])
    assert r.exit_code == 2
    assert "--storage goes with --study" in _one_error_line(r.output)


def _fake_gpu_path(monkeypatch: pytest.MonkeyPatch, payload: dict[str, Any],
                   calls: list[dict[str, Any]], tmp_path: Path) -> None:
    """Pretend torch is there, the build succeeded and compare_command ran."""
    so = tmp_path / "kernel.so"
    so.write_bytes(b"")
    built = types.SimpleNamespace(so_path=str(so), require_timeable=lambda: None)
    monkeypatch.setattr(build_mod, "build_config", lambda cfg: built)
    monkeypatch.setattr("tuner.peers.base.module_missing", lambda name: None)
    monkeypatch.setattr("tuner.runtime.Device.open", lambda *a, **k: None)  # "a GPU is there"

    def fake_compare(so_path: Any, shapes: Any, backends: Any, **kw: Any) -> dict[str, Any]:
        calls.append({"so_path": so_path, "shapes": shapes, "backends": backends, **kw})
        return payload

    monkeypatch.setattr(compare_mod, "compare_command", fake_compare)


def _payload(kernel_status: str, peer_status: str = "ok") -> dict[str, Any]:
    return {
        "backends": [
            {"name": "fa-tune", "role": "kernel", "available": True, "reason": "ok"},
            {"name": "fa3", "role": "peer", "available": True, "reason": "ok"},
        ],
        "summary": [
            {"shape": "4x32x4096", "backend": "fa-tune", "status": kernel_status,
             "reason": "" if kernel_status == "ok" else "7 elements outside tolerance"},
            {"shape": "4x32x4096", "backend": "fa3", "status": peer_status,
             "reason": "" if peer_status == "ok" else "O holds NaN or Inf"},
        ],
    }


def test_compare_passes_options_through(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    _fake_gpu_path(monkeypatch, _payload("ok"), calls, tmp_path)
    r = runner.invoke(app, ["compare", "--preset", "default", "--shape", "2x4x1024",
                            "--backends", "fa3,cudnn", "--warmup", "1", "--repeat", "2",
                            "--rounds", "1", "--results-dir", str(tmp_path / "res")])
    assert r.exit_code == 0, r.output
    [c] = calls
    assert c["so_path"] == tmp_path / "kernel.so"
    assert c["shapes"] == ["2x4x1024"] and c["backends"] == "fa3,cudnn"
    assert (c["warmup"], c["repeat"], c["rounds"]) == (1, 2, 1)
    assert c["results_root"] == tmp_path / "res"


def test_compare_study_passes_the_confirmed_number(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    _fake_gpu_path(monkeypatch, _payload("ok"), calls, tmp_path)
    conf = {"geomean_tflops": 640.0, "shapes": {"4x32x4096": {"tflops": 600.0}}}
    url = _study(tmp_path, "s", {"block_n": 112}, conf)
    r = runner.invoke(app, ["compare", "--study", "s", "--storage", url, "--backends", "fa3"])
    assert r.exit_code == 0, r.output
    assert calls[0]["confirmed"] == conf


def test_check_confirmed_ratio() -> None:
    payload = {"protocol": {"settle_s": 2.0}, "summary": [
        {"shape": "4x32x4096", "backend": "fa-tune", "status": "ok", "tflops": 606.0},
        {"shape": "4x32x8192", "backend": "fa-tune", "status": "gate_failed", "tflops": None},
        {"shape": "4x32x4096", "backend": "fa3", "status": "ok", "tflops": 560.0},
    ]}
    conf = {"protocol": {"settle_s": 2.0}, "shapes": {"4x32x4096": {"tflops": 600.0},
                                                      "4x32x8192": {"tflops": 650.0}}}
    chk = compare_mod.check_confirmed(payload, conf)
    [row] = chk["shapes"]
    assert row["shape"] == "4x32x4096" and row["ratio"] == pytest.approx(1.01)
    payload["search_confirmed"] = chk
    assert "ratio 1.010" in compare_mod.confirmed_lines(payload)[1]


def test_compare_failed_kernel_gate_exit_1(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    _fake_gpu_path(monkeypatch, _payload("gate_failed"), [], tmp_path)
    r = runner.invoke(app, ["compare", "--preset", "default"])
    assert r.exit_code == 1, r.output
    assert "compare FAILED: 4x32x4096: gate_failed" in r.output


def test_compare_failed_peer_gate_is_not_our_failure(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    _fake_gpu_path(monkeypatch, _payload("ok", peer_status="gate_failed"), [], tmp_path)
    r = runner.invoke(app, ["compare", "--preset", "default"])
    assert r.exit_code == 0, r.output


def test_compare_peers_only_passes_no_kernel(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    payload = _payload("ok")
    payload["backends"] = payload["backends"][1:]
    payload["summary"] = payload["summary"][1:]
    _fake_gpu_path(monkeypatch, payload, calls, tmp_path)
    r = runner.invoke(app, ["compare"])
    assert r.exit_code == 0, r.output
    assert calls[0]["so_path"] is None and calls[0]["shapes"] is None


def test_compare_without_torch_is_one_line_before_building() -> None:
    """The real console script with torch hidden: exit 2 and no compile (it would take ~1 min)."""
    code = (
        "import importlib.abc, sys\n"
        "class B(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in {'torch', 'triton', 'flash_attn'}:\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, B())\n"
        "import tuner.build\n"
        "def refuse(*a, **k): raise SystemExit('built a kernel')\n"
        "tuner.build.build_config = refuse\n"
        "from tuner.cli import main\n"
        "main(['compare', '--preset', 'default'])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert "need torch" in _one_error_line(r.stderr)
    assert peers.DEFAULT_PEERS  # the peers package imported fine without torch too
