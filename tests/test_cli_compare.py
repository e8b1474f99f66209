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

from tuner.analysis import compare as compare_mod
from tuner.analysis import compare_report
from tuner.cli import app
from tuner.kernel import build as build_mod
from tuner.kernel.config import load_preset
from tuner.measure import peers
from tuner.problem import Problem, ProblemClass

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
        (["--preset", "default", "--shape", "4x32"], "malformed problem '4x32'"),
        (["--preset", "default", "--shape", "0x1x128"], "B must be a positive integer"),
        (["--shape", "4x32/3x128"], "Hq=32 must be a multiple of Hkv=3"),
        (["--shape", "1x32/8x8192:d80"], "D=80 is not supported"),
        (["--preset", "default", "--shape", "1x32/8x8192:d256"], "head dim 256), more than the "
         "232448 an sm_90 CTA can have; lower block_m, block_n or the stages (for head dim 256 "
         "problems; preset 'd256' is the default there)"),
        (["--preset", "default", "--shape", "4x32x4096", "--shape", "4x32x8192:d64"],
         "these problems mix head dims"),
        (["--config", "CFG", "--shape", "4x32x4096", "--shape", "4x32x8192:full"],
         "these problems mix causal and non-causal (:full) masks; a kernel is built for one "
         "mask: run them in two invocations"),
        (["--preset", "default", "--backends", "fa3,xformers"], "unknown backend 'xformers'"),
        (["--preset", "default", "--warmup", "-1"], "warmup"),
        (["--config", "/nonexistent/c.yaml"], "cannot read config file"),
    ],
)
def test_compare_wrong_input_exit_2(args: list[str], needle: str, tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("block_n: 112\n")
    r = runner.invoke(app, ["compare", *[str(cfg) if a == "CFG" else a for a in args]])
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
    # The named database does not exist: said so, and the file is not created.
    assert "no fa-tune study database at" in _one_error_line(r.output)
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize(
    ("config", "needle"),
    [(None, "has no completed trial yet"), ({"block_m": 64, "pingpong": True}, "pingpong needs")],
)
def test_compare_study_resolution_errors(tmp_path: Path, config: Any, needle: str) -> None:
    url = _study(tmp_path, "mine", config)
    r = runner.invoke(app, ["compare", "--study", "mine", "--storage", url])
    assert r.exit_code == 2
    assert needle in _one_error_line(r.output)


def test_compare_without_a_gpu_is_one_line_before_building() -> None:
    """No GPU on this machine: one line, exit 2, and no compile (the fixture refuses builds)."""
    from tuner.kernel import runtime

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
                   calls: list[dict[str, Any]], tmp_path: Path,
                   builds: list[dict[str, Any]] | None = None) -> None:
    """Pretend torch is there, the build succeeded and compare_command ran; each build's
    keyword arguments (``causal``) go to ``builds``."""
    so = tmp_path / "kernel.so"
    so.write_bytes(b"")
    built = types.SimpleNamespace(so_path=str(so), require_timeable=lambda: None)

    def fake_build(cfg: Any, **kw: Any) -> Any:
        if builds is not None:
            builds.append(kw)
        return built

    monkeypatch.setattr(build_mod, "build_config", fake_build)
    monkeypatch.setattr("tuner.measure.peers.base.module_missing", lambda name: None)
    # "a GPU is there"
    monkeypatch.setattr("tuner.kernel.runtime.Device.open", lambda *a, **k: None)

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
    builds: list[dict[str, Any]] = []
    _fake_gpu_path(monkeypatch, _payload("ok"), calls, tmp_path, builds)
    r = runner.invoke(app, ["compare", "--preset", "default", "--shape", "2x4x1024",
                            "--backends", "fa3,cudnn", "--warmup", "1", "--repeat", "2",
                            "--rounds", "1", "--results-dir", str(tmp_path / "res")])
    assert r.exit_code == 0, r.output
    [c] = calls
    assert c["so_path"] == tmp_path / "kernel.so"
    assert c["shapes"] == ["2x4x1024"] and c["backends"] == "fa3,cudnn"
    assert (c["warmup"], c["repeat"], c["rounds"]) == (1, 2, 1)
    assert c["results_root"] == tmp_path / "res"
    assert builds == [{"pclass": ProblemClass(128, True)}]  # the problems' class


@pytest.mark.parametrize(("texts", "causal"), [
    (["1x32/8x8192"], True),
    (["4x32x4096", "1x32/1x8192"], True),
    (["4x32x8192:full"], False),
    (["4x32x8192:full", "1x32/8x8192:full"], False),
    (["1x32/8x8192:d64"], True),
])
def test_compare_kernel_runs_gqa_and_non_causal_problems(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, texts: list[str], causal: bool) -> None:
    """GQA/MQA, :full and D 64 problems are the kernel's, built for the problems' one class."""
    calls: list[dict[str, Any]] = []
    builds: list[dict[str, Any]] = []
    _fake_gpu_path(monkeypatch, _payload("ok"), calls, tmp_path, builds)
    argv = ["compare", "--preset", "d64" if ":d64" in texts[0] else "default", "--backends",
            "fa3"]
    for t in texts:
        argv += ["--shape", t]
    r = runner.invoke(app, argv)
    assert r.exit_code == 0, r.output
    assert builds == [{"pclass": Problem.parse(texts[0]).problem_class}]
    [c] = calls
    assert c["so_path"] == tmp_path / "kernel.so" and c["shapes"] == texts


def test_compare_study_passes_the_confirmed_number(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    builds: list[dict[str, Any]] = []
    _fake_gpu_path(monkeypatch, _payload("ok"), calls, tmp_path, builds)
    conf = {"geomean_tflops": 640.0, "shapes": {"4x32x4096": {"tflops": 600.0}}}
    url = _study(tmp_path, "s", {"block_n": 112}, conf)
    r = runner.invoke(app, ["compare", "--study", "s", "--storage", url, "--backends", "fa3"])
    assert r.exit_code == 0, r.output
    assert calls[0]["confirmed"] == conf
    assert calls[0]["shapes"] == ["4x32x4096"]  # the study's own problems
    assert builds == [{"pclass": ProblemClass(128, True)}]


def test_compare_study_defaults_to_its_own_problem_class(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    """A D 256 study compared without --shape runs its own (D 256) problems, built for D 256,
    not the seed problems; --shape still overrides."""
    calls: list[dict[str, Any]] = []
    builds: list[dict[str, Any]] = []
    _fake_gpu_path(monkeypatch, _payload("ok"), calls, tmp_path, builds)
    d256 = load_preset("d256").to_dict()
    conf = {"geomean_tflops": 650.0, "shapes": {"4x16x8192:d256": {"tflops": 650.0}}}
    url = _study(tmp_path, "d", d256, conf)
    r = runner.invoke(app, ["compare", "--study", "d", "--storage", url, "--backends", "fa3"])
    assert r.exit_code == 0, r.output
    assert calls[0]["shapes"] == ["4x16x8192:d256"]
    assert builds == [{"pclass": ProblemClass(256, True)}]
    r = runner.invoke(app, ["compare", "--study", "d", "--storage", url, "--backends", "fa3",
                            "--shape", "1x16x4096:d256:full"])
    assert r.exit_code == 0, r.output
    assert calls[1]["shapes"] == ["1x16x4096:d256:full"]
    assert builds[1] == {"pclass": ProblemClass(256, False)}


def test_check_confirmed_ratio() -> None:
    payload = {"protocol": {"settle_s": 2.0}, "summary": [
        {"shape": "4x32x4096", "backend": "fa-tune", "status": "ok", "tflops": 606.0},
        {"shape": "4x32x8192", "backend": "fa-tune", "status": "gate_failed", "tflops": None},
        {"shape": "4x32x4096", "backend": "fa3", "status": "ok", "tflops": 560.0},
    ]}
    conf = {"protocol": {"settle_s": 2.0}, "shapes": {"4x32x4096": {"tflops": 600.0},
                                                      "4x32x8192": {"tflops": 650.0}}}
    chk = compare_report.check_confirmed(payload, conf)
    [row] = chk["shapes"]
    assert row["shape"] == "4x32x4096" and row["ratio"] == pytest.approx(1.01)
    payload["search_confirmed"] = chk
    assert "ratio 1.010" in compare_report.confirmed_lines(payload)[1]


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


def _peers_only_payload() -> dict[str, Any]:
    """_payload's peer rows alone (a compare without --study/--preset/--config)."""
    payload = _payload("ok")
    payload["backends"] = payload["backends"][1:]
    payload["summary"] = payload["summary"][1:]
    return payload


def test_compare_peers_only_passes_no_kernel(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    payload = _peers_only_payload()
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
        "import tuner.kernel.build\n"
        "def refuse(*a, **k): raise SystemExit('built a kernel')\n"
        "tuner.kernel.build.build_config = refuse\n"
        "from tuner.cli import main\n"
        "main(['compare', '--preset', 'default'])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert "need torch" in _one_error_line(r.stderr)
    assert peers.DEFAULT_PEERS  # the peers package imported fine without torch too


def test_compare_study_with_a_problem_the_kernel_cannot_run_exit_2(tmp_path: Path) -> None:
    url = _study(tmp_path, "s", {"block_n": 112})
    r = runner.invoke(app, ["compare", "--study", "s", "--storage", url,
                            "--shape", "2x16/2x4096:d256", "--backends", "fa3"])
    assert r.exit_code == 2, r.output  # the study's block_n 112 does not fit D 256
    assert "head dim 256" in _one_error_line(r.output)
    r = runner.invoke(app, ["compare", "--study", "s", "--storage", url, "--shape",
                            "2x16/2x4096", "--shape", "2x16x4096:full", "--backends", "fa3"])
    assert r.exit_code == 2, r.output
    assert "mix causal and non-causal (:full) masks" in _one_error_line(r.output)


def test_compare_peers_only_accepts_a_gqa_problem_up_to_the_gpu_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No --study/--preset/--config: every problem is the peers'; it gets as far as the GPU."""
    from tuner.kernel import runtime

    opened: list[int] = []

    def no_gpu(index: int = 0, *_a: Any, **_k: Any) -> None:
        opened.append(index)
        raise runtime.GpuError("no GPU here (test)")

    # "torch is there"
    monkeypatch.setattr("tuner.measure.peers.base.module_missing", lambda name: None)
    monkeypatch.setattr(runtime.Device, "open", no_gpu)
    r = runner.invoke(app, ["compare", "--shape", "1x32/8x8192", "--shape", "4x32x8192:d64:full",
                            "--backends", "fa3,cudnn"])
    assert r.exit_code == 2, r.output
    assert "no GPU here (test)" in _one_error_line(r.output)
    assert opened == [0]


def test_compare_peers_only_passes_gqa_problems_through(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    payload = _peers_only_payload()
    _fake_gpu_path(monkeypatch, payload, calls, tmp_path)
    r = runner.invoke(app, ["compare", "--shape", "1x32/8x8192", "--shape", "2x16x4096:D64:FULL",
                            "--backends", "fa3,cudnn"])
    assert r.exit_code == 0, r.output
    [c] = calls
    assert c["so_path"] is None
    assert c["shapes"] == ["1x32/8x8192", "2x16x4096:d64:full"]  # canonical text forms


# ---- compare's payload and writers with problems other than the seeds' (no GPU) -------------
def _problem_payload(texts: list[str]) -> dict[str, Any]:
    """TEST FIXTURE: a compare payload over ``texts`` with invented timings (not measurements)."""
    from tuner.problem import Problem

    shapes = []
    for i, text in enumerate(texts):
        prob = Problem.parse(text)
        runs = []
        for name, label, ms in (("fa3", "FlashAttention-3", 1.0 + i), ("cudnn", "cuDNN", 1.1 + i)):
            runs.append({"backend": name, "label": label, "position": None, "status": "ok",
                         "reason": "", "gate": {"passed": True, "max_abs_err": 0.002},
                         "gate_after": None,
                         "timing": {"median_ms": ms, "min_ms": ms * 0.99, "max_ms": ms * 1.01,
                                    "tflops": prob.tflops(ms)}})
        shapes.append({**prob.to_dict(), "shape": str(prob), "flops": prob.flops, "runs": runs})
    payload = {"created_utc": "2026-01-01T00:00:00Z", "reference_peer": "fa3",
               "gpu": {"name": "TEST FIXTURE GPU"}, "protocol": {}, "backends": [],
               "shapes": shapes, "status": "passed"}
    payload["summary"] = compare_mod.summarize(payload)
    return payload


def test_compare_rows_carry_the_problem(tmp_path: Path) -> None:
    p = _problem_payload(["1x32/8x8192", "4x32x8192:d64:full"])
    gqa = next(r for r in p["summary"] if r["shape"] == "1x32/8x8192" and r["backend"] == "fa3")
    assert {k: gqa[k] for k in ("B", "H", "Hq", "Hkv", "S", "D", "causal")} == {
        "B": 1, "H": 32, "Hq": 32, "Hkv": 8, "S": 8192, "D": 128, "causal": True}
    full = next(r for r in p["summary"] if r["shape"] == "4x32x8192:d64:full")
    assert (full["D"], full["causal"]) == (64, False)
    # TFLOPS with the non-causal count: 4*B*Hq*S^2*D.
    assert full["tflops"] == pytest.approx(4 * 4 * 32 * 8192**2 * 64 / (2.0 * 1e9))
    md = compare_report.summary_markdown(p)
    assert "D=128, causal" not in md and "causal and non-causal, D=64/128" in md
    # Columns are whole problem names when more than S differs.
    assert "| implementation | 1x32/8x8192 ms / TFLOPS | 4x32x8192:d64:full ms / TFLOPS |" in md
    assert "non-causal 4*B*Hq*S^2*D" in md
    files = compare_report.write_outputs(p, tmp_path)
    import csv

    with open(files["csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["Hkv"] for r in rows} == {"8", "32"} and {r["causal"] for r in rows} == {
        "True", "False"}


def test_compare_titles_say_what_the_problems_are() -> None:
    assert compare_report.problems_title(_problem_payload(["4x32x4096", "4x32x8192"])) == (
        "causal, D=128, MHA, B=4, H=32")
    assert compare_report.problems_title(_problem_payload(["1x32/8x4096", "1x32/8x8192"])) == (
        "causal, D=128, GQA (Hq=32, Hkv=8), B=1")
    p = _problem_payload(["4x32x4096:d64", "4x32x8192:d64"])
    assert compare_report._shape_headers(p) == [("4x32x4096:d64", "S=4096"),
                                            ("4x32x8192:d64", "S=8192")]
    assert "non-causal" in compare_report.problems_title(_problem_payload(["4x32x4096:full"]))


def test_compare_reads_an_old_payload_as_mha_causal() -> None:
    """results.json of compare before problems: shape entries {B, H, S, D} only."""
    p = _problem_payload(["4x32x4096"])
    for s in p["shapes"]:
        for k in ("Hq", "Hkv", "causal"):
            del s[k]
    p["summary"] = compare_mod.summarize(p)
    assert p["summary"][0]["Hkv"] == 32 and p["summary"][0]["causal"] is True
    assert compare_report.problems_title(p) == "causal, D=128, MHA, B=4, H=32"


def test_compare_kernel_row_for_a_problem_it_cannot_run_is_unavailable() -> None:
    """Through the API (the CLI refuses earlier): the kernel gets no launch, peers still run."""
    from tuner.measure.timing import SCREEN
    from tuner.problem import Problem

    class Boom:
        def measure(self, *a: Any, **k: Any) -> None:
            raise AssertionError("the kernel was launched past the grid limit")

    launch = types.SimpleNamespace(details=lambda: {}, release=lambda: None)
    b = compare_mod.Backend("fa-tune", "fa-tune", "kernel", launch, True, "ok")
    run = compare_mod.measure(b, Boom(), Problem(1, 70000, 128), SCREEN)
    assert run["status"] == "unavailable" and "grid limit" in run["reason"]

    # GQA and non-causal D 128 problems are the kernel's: they reach the bench.
    measured: list[str] = []

    class Records:
        def measure(self, launch: Any, shape: Any, *a: Any, **k: Any) -> Any:
            measured.append(str(shape))
            return types.SimpleNamespace(
                status="unavailable", reason="test double",
                to_dict=lambda: {"gate": None, "gate_after": None, "timing": None})

    for text in ("1x32/8x8192", "4x32x8192:full"):
        run = compare_mod.measure(b, Records(), Problem.parse(text), SCREEN)
        assert run["reason"] == "test double", run
    assert measured == ["1x32/8x8192", "4x32x8192:full"]


def test_compare_rows_carry_the_key_length(tmp_path: Path) -> None:
    """A :k problem end to end through the payload: its dict (Sk), its shape text, TFLOPS from
    the pairs the bottom-right mask keeps, whole names as column titles, Sk in the CSV."""
    p = _problem_payload(["1x32/8x2048:k8192", "1x32/8x8192"])
    row = next(r for r in p["summary"]
               if r["shape"] == "1x32/8x2048:k8192" and r["backend"] == "fa3")
    assert (row["S"], row["Sk"], row["Hkv"]) == (2048, 8192, 8)
    prob = Problem.parse("1x32/8x2048:k8192")
    assert row["tflops"] == pytest.approx(prob.flops / (row["median_ms"] * 1e9))
    assert prob.flops == 4 * 32 * 128 * (2048 * 8192 - 2048**2 // 2)
    assert Problem.from_dict(p["shapes"][0]) == prob
    assert compare_report._shape_headers(p) == [("1x32/8x2048:k8192", "1x32/8x2048:k8192"),
                                            ("1x32/8x8192", "1x32/8x8192")]
    md = compare_report.summary_markdown(p)
    assert "BxHq[/Hkv]xS[:kSK][:dD][:full]" in md and "S_q*S_k - S_q^2/2" in md
    files = compare_report.write_outputs(p, tmp_path)
    import csv

    with open(files["csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["Sk"] for r in rows} == {"8192", ""}  # only where S_k != S_q
