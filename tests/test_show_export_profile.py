"""show / export / profile on a real SQLite study made with the fixture builder and worker;
wrong input everywhere is one line and exit code 2. The ncu CSV fixtures in tests/data/ are
written from Nsight Compute's documented ``--csv --page details`` / ``--page raw`` format."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from prebuild import Artifact
from typer.testing import CliRunner

from tuner.analysis import ncu_report, profile
from tuner.cli import app
from tuner.kernel.config import KernelConfig, load_preset
from tuner.problem import Problem, ProblemClass
from tuner.search import loop as search
from tuner.search.space import space_from_dict
from tuner.search.study import default_storage_url, open_storage
from tuner.search.trials import study_best

FIX = Path(__file__).resolve().parent / "fixtures"
DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(FIX))
from fake_builder import FakeBuilder  # noqa: E402

runner = CliRunner()


def one_line_exit2(res) -> str:
    assert res.exit_code == 2, res.output
    err = res.stderr if hasattr(res, "stderr") else res.output
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("fa-tune: error:"), err
    return lines[0]


@pytest.fixture(scope="module")
def _module_study(tmp_path_factory: pytest.TempPathFactory):
    """One study for the module (the fixture worker makes it in ~3 s)."""
    root = tmp_path_factory.mktemp("show")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FA_TUNE_STUDIES", str(root / "studies"))
        mp.delenv("FAKE_GPU_WORKER_PLAN", raising=False)
        s = search.Search(
            study="s",
            # All 8 configs: the four with block_n 128 complete (the fixture worker's timings
            # differ by <= 4%), the four with 112 are pruned (12.5% slower), so importances
            # have enough completed trials and export has a pruned one to refuse.
            space=space_from_dict({"block_n": [112, 128], "k_stages": [2, 3],
                                   "v_stages": [2, 3]}),
            shapes=[Problem(1, 2, 256), Problem(1, 2, 512)], n_trials=8, sampler="random", seed=1,
            builder=FakeBuilder(root / "art"),
            worker_entry=f"{FIX / 'fake_gpu_worker.py'}:main",
        )
        s.run()
    return root / "studies"


@pytest.fixture
def studies(_module_study: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FA_TUNE_STUDIES", str(_module_study))
    monkeypatch.delenv("FAKE_GPU_WORKER_PLAN", raising=False)
    return _module_study


@pytest.fixture
def study(studies: Path) -> str:
    return "s"


def test_show_best_trials_importance_plots(study: str, studies: Path) -> None:
    r = runner.invoke(app, ["show", "best", "--study", study, "--top", "3"])
    assert r.exit_code == 0, r.output
    assert "study s: best" in r.output and "yes" in r.output  # the best is confirmed
    r = runner.invoke(app, ["show", "best", "--study", study, "--shape", "1x2x512"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["show", "trials", "--study", study])
    assert r.exit_code == 0 and "COMPLETE" in r.output
    r = runner.invoke(app, ["show", "importance", "--study", study])
    assert r.exit_code == 0, r.output
    assert "importances (fANOVA)" in r.output or "need scikit-learn" in r.output
    if "need scikit-learn" in r.output:  # the install hint survives rich (no markup eaten)
        assert "fa-tune[plots]" in r.output
    r = runner.invoke(app, ["show", "plots", "--study", study])
    assert r.exit_code == 0, r.output
    pngs = sorted(p.name for p in (studies / "plots" / study).glob("*.png"))
    assert "best_so_far.png" in pngs and any(p.startswith("tflops_by_") for p in pngs)


def test_show_best_prints_the_winner_as_yaml_when_narrow(study: str) -> None:
    # Piped (CliRunner is not a terminal) and 40 columns: rich cuts the table's cells, but the
    # winner's every knob comes whole, as plain YAML under it, usable as --config.
    r = runner.invoke(app, ["show", "best", "--study", study], env={"COLUMNS": "40"})
    assert r.exit_code == 0, r.output
    assert "…" in r.output  # the table was squeezed to 40 columns
    lines = r.output.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("# best: trial"))
    assert "confirmed" in lines[start]
    end = lines.index("", start)  # the YAML ends with a blank line
    block = lines[start:end]
    cfg = KernelConfig.from_yaml_text("\n".join(block))
    assert cfg == study_best(study, None)[0]
    assert len([ln for ln in block if not ln.startswith("#")]) == len(cfg.to_dict())


def test_reading_a_study_does_not_import_the_search(study: str, studies: Path) -> None:
    # show / export / profile read a study through tuner.search.study alone: no search loop, no
    # GPU worker client. (A fresh interpreter: this test module imports tuner.search.loop itself.)
    # (The CLI imports every command's module, the search's too: the modules are what must not.)
    code = (
        "import sys\n"
        "import tuner.analysis.show, tuner.ship.export, tuner.analysis.profile\n"
        "bad = sorted(m for m in ('tuner.search.loop', 'tuner.search.worker_client',\n"
        "                         'tuner.search.policy')\n"
        "             if m in sys.modules)\n"
        "assert not bad, bad\n"
        "from typer.testing import CliRunner\n"
        "from tuner.cli import app\n"
        "r = CliRunner().invoke(app, ['show', 'best', '--study', 's'])\n"
        "assert r.exit_code == 0, r.output\n"
        "r = CliRunner().invoke(app, ['export', '--study', 's', '--trial', '999', '--out', 'x'])\n"
        "assert r.exit_code == 2, r.output\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**__import__("os").environ, "FA_TUNE_STUDIES": str(studies)})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]


def test_importance_too_few_trials(studies: Path, tmp_path: Path) -> None:
    search.Search(study="few", space=space_from_dict({"block_n": [128]}),
                  shapes=[Problem(1, 2, 256)], n_trials=1, builder=FakeBuilder(tmp_path / "a"),
                  worker_entry=f"{FIX / 'fake_gpu_worker.py'}:main").run()
    r = runner.invoke(app, ["show", "importance", "--study", "few"])
    assert r.exit_code == 0 and "at least" in r.output


# The study's best trial is the default config, which the export builds with the varlen kernel
# (as tests/test_kernel_build.py's varlen test does): built ahead, in the session's cache.
@pytest.mark.builds(lambda: [Artifact(load_preset("default"), ProblemClass(varlen=True))])
def test_export_package(study: str, tmp_path: Path, session_cache: Path) -> None:
    out = tmp_path / "pkg"
    r = runner.invoke(app, ["export", "--study", study, "--out", str(out)])
    assert r.exit_code == 0, r.output
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    for need in ("kernel.cu", "build.sh", "lib/libfa_tune_fwd.so", "config.yaml",
                 "results.json", "README.md", "fa_tune/entry.cuh", "fa_tune/kernel.cuh"):
        assert need in names, need
    sh = (out / "build.sh").read_text()
    assert "--use_fast_math" in sh and "-fvisibility=hidden" in sh and "sm_90a" in sh
    readme = (out / "README.md").read_text()
    assert "fa_tune_forward" in readme and "ctypes" in readme and "```cpp" in readme
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "passed" and res["shapes"]
    # The error ratios the search recorded (the fixture worker: 0.4x the BF16 implementation,
    # every config as accurate as the default): the results and every problem's gate.
    assert res["accuracy"]["fa_ratio"] == pytest.approx(0.4)
    assert res["accuracy"]["err_vs_default"] == pytest.approx(1.0)
    assert all(s["gate"]["err_vs_default"] == pytest.approx(1.0) for s in res["shapes"])
    # An existing folder is refused, and nothing is touched.
    r = runner.invoke(app, ["export", "--study", study, "--out", str(out)])
    assert "already exists" in one_line_exit2(r)


def _export_with_fake_builds(study: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             varlen_unfit: str | None) -> tuple[Path, list[tuple]]:
    """`fa-tune export` with test doubles for nvcc: build_many gives the varlen build's verdict
    (``varlen_unfit``, ptxas' local-memory line or None), build_config the library. Returns the
    export folder and the calls, ("verdict" | "build", pclass, positional args)."""
    from types import SimpleNamespace

    from tuner.kernel import build

    calls: list[tuple] = []
    so = tmp_path / "lib.so"
    so.write_text("a library")

    def fake_build(cfg: KernelConfig, *args, pclass: ProblemClass, **kw) -> SimpleNamespace:
        calls.append(("build", pclass, args))
        return SimpleNamespace(so_path=str(so), key="k", unfit=None)

    def fake_many(cfgs: list[KernelConfig], *args, pclass: ProblemClass, **kw) -> list:
        calls.append(("verdict", pclass, args))
        res = SimpleNamespace(unfit=varlen_unfit)
        return [build.BuildOutcome(c, res, None) for c in cfgs]  # type: ignore[arg-type]

    monkeypatch.setattr(build, "build_config", fake_build)
    monkeypatch.setattr(build, "build_many", fake_many)
    out = tmp_path / "pkg"
    r = runner.invoke(app, ["export", "--study", study, "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out, calls


def test_export_builds_the_library_with_varlen(study: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The export ships the config built for its class with the varlen kernel (the class's
    varlen flag: kernel.cu defines FA_TUNE_VARLEN 1), not the search's artifact (built
    without)."""
    out, calls = _export_with_fake_builds(study, tmp_path, monkeypatch, None)
    # export.varlen_why_not's varlen build, then the library's: one kernel, cached.
    assert calls == [("verdict", ProblemClass(varlen=True), ()),
                     ("build", ProblemClass(varlen=True), ())]
    assert (out / "lib" / "libfa_tune_fwd.so").read_text() == "a library"
    assert "#define FA_TUNE_VARLEN 1" in (out / "kernel.cu").read_text()
    readme = (out / "README.md").read_text()
    assert "fa_tune_forward_varlen" in readme
    assert '{"head_dim":128,"causal":true,"varlen":true}' in readme


def test_export_leaves_out_a_varlen_kernel_that_spills(study: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the static check fits but the varlen build has local memory (d256 with a softcap,
    docs/PERF.md step 61), the export ships the library without the varlen kernel and its
    README says why (a test double stands in for ptxas' verdict)."""
    out, calls = _export_with_fake_builds(
        study, tmp_path, monkeypatch, "local memory (stack frame 0 B, 12 LDL/STL instructions)")
    assert [(kind, pc) for kind, pc, _ in calls] == [("verdict", ProblemClass(varlen=True)),
                                                     ("build", ProblemClass(varlen=False))]
    assert "#define FA_TUNE_VARLEN 0" in (out / "kernel.cu").read_text()
    readme = (out / "README.md").read_text()
    assert '"varlen":false' in readme
    assert "its varlen kernel compiles with local memory (stack frame 0 B" in readme


@pytest.mark.parametrize("argv, expect", [
    (["show", "best", "--study", "nope"], "unknown study"),
    (["show", "trials", "--study", "nope"], "unknown study"),
    (["show", "sideways", "--study", "s"], "unknown `show sideways`"),
    (["export", "--study", "s", "--trial", "999", "--out", "X"], "no trial 999"),
    (["export", "--study", "nope", "--out", "X"], "unknown study"),
    (["profile", "--study", "s", "--trial", "999", "--shape", "1x2x256"], "no trial 999"),
    (["profile", "--study", "s", "--shape", "1x2"], "malformed problem"),
    (["show", "best", "--study", "s", "--storage", "nosuchdb://x"], "cannot open study storage"),
])
def test_wrong_input_show_export_profile(study: str, argv, expect, tmp_path: Path) -> None:
    argv = [str(tmp_path / a) if a == "X" else a for a in argv]
    assert expect in one_line_exit2(runner.invoke(app, argv))
    # No stored trial lost.
    url = default_storage_url("s")
    assert len(optuna.load_study(study_name="s", storage=url).get_trials()) >= 6


def test_failed_trial_is_not_exported(study: str, tmp_path: Path) -> None:
    url = default_storage_url(study)
    bad = [t for t in optuna.load_study(study_name=study, storage=url).get_trials()
           if t.state.name != "COMPLETE"]
    if not bad:
        pytest.skip("every trial completed")
    r = runner.invoke(app, ["export", "--study", study, "--trial", str(bad[0].number),
                            "--out", str(tmp_path / "o")])
    assert "pick a COMPLETE trial" in one_line_exit2(r)


def test_empty_study(studies: Path) -> None:
    open_storage(default_storage_url("empty"))
    optuna.create_study(study_name="empty", storage=default_storage_url("empty"))
    assert "no trials yet" in one_line_exit2(runner.invoke(app, ["show", "best",
                                                                 "--study", "empty"]))
    assert "no trials yet" in one_line_exit2(
        runner.invoke(app, ["export", "--study", "empty", "--out", str(studies / "o")]))


def test_search_wrong_input(studies: Path, tmp_path: Path) -> None:
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("block_n: [64, 128\n")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("blok_n: [64]\n")
    cases = [
        (["search", "--space", str(bad_yaml), "--trials", "1"], "cannot parse YAML"),
        (["search", "--space", str(unknown), "--trials", "1"], "unknown knob 'blok_n'"),
        (["search", "--space", "nosuchspace", "--trials", "1"], "cannot read search space"),
        (["search", "--trials", "1", "--storage", "nosuchdb://x"], "cannot open study storage"),
        (["search", "--timeout", "soon"], "bad duration"),
        (["search"], "--trials N and/or --timeout"),
        (["search", "--trials", "1", "--sampler", "annealing"], "unknown sampler"),
        (["search", "--trials", "1", "--study", "a/b"], "bad study name"),
        (["search", "--trials", "1", "--shape", "4x32"], "malformed problem"),
        (["search", "--trials", "1", "--shape", "4x32x4096", "--shape", "4x32x8192:d256"],
         "mix head dims"),
        (["search", "--trials", "1", "--shape", "4x32x4096", "--shape", "4x32x8192:full"],
         "mix causal and non-causal (:full) masks"),
    ]
    for argv, expect in cases:
        assert expect in one_line_exit2(runner.invoke(app, argv)), argv
    if shutil.which("nvidia-smi"):
        return  # a GPU may be present: the accepted problems below would really be searched
    # GQA and non-causal D 128 problems are the kernel's: refused only later, for want of a GPU.
    for i, shapes in enumerate((["1x32/8x8192"], ["4x32x8192:full"],
                                ["1x32/8x8192:full", "4x32x4096:full"], ["1x32/8x8192:d64"],
                                ["4x16x8192:d256:full"])):
        argv = ["search", "--trials", "1", "--jobs", "1", "--study", f"accepted{i}",
                "--storage", f"sqlite:///{tmp_path / f'accepted{i}.db'}"]
        for t in shapes:
            argv += ["--shape", t]
        line = one_line_exit2(runner.invoke(app, argv))
        assert "mix" not in line and "head dim" not in line, line
        assert "GPU" in line or "driver" in line, line


def test_search_cli_with_fixture_worker_missing_gpu_is_one_line(studies: Path) -> None:
    # The real worker on a machine without a GPU: the worker's init failure is one line.
    if shutil.which("nvidia-smi"):
        pytest.skip("a GPU may be present")
    r = runner.invoke(app, ["search", "--trials", "1", "--space", str(DATA.parent.parent /
                            "search_spaces" / "default.yaml"), "--study", "nogpu", "--jobs", "1"])
    assert r.exit_code == 2, r.output


def test_parse_ncu_details_fixture() -> None:
    h = ncu_report.parse_details_csv((DATA / "ncu_details_fixture.csv").read_text())
    assert "attention_fwd_kernel" in (h.kernel_name or "")
    assert h.duration_ms == pytest.approx(1.23456)
    assert h.metrics["sm_throughput_pct"] == pytest.approx(78.9)
    assert h.metrics["achieved_occupancy_pct"] == pytest.approx(18.4)
    assert h.metrics["l2_hit_rate_pct"] == pytest.approx(88.12)
    raw = ncu_report.parse_raw_tensor_pipe((DATA / "ncu_raw_fixture.csv").read_text())
    assert raw == pytest.approx(71.25)
    with pytest.raises(ncu_report.ProfileError):
        ncu_report.parse_details_csv("==PROF== nothing here\n")


def test_ncu_failures_are_one_line() -> None:
    msg = profile.explain_ncu_failure(
        "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
        "Performance Counters", 1)
    assert "counters" in msg and "\n" not in msg


def test_profile_without_ncu(study: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    if Path("/usr/local/cuda/bin/ncu").exists():
        pytest.skip("ncu installed in /usr/local/cuda")
    r = runner.invoke(app, ["profile", "--study", study, "--shape", "1x2x256"])
    assert "ncu) not found" in one_line_exit2(r)


def test_best_config_for_compare(study: str) -> None:
    cfg = study_best(study, None)[0]
    assert cfg is not None and cfg.block_n == 128


@pytest.mark.slow
@pytest.mark.builds(lambda: [Artifact(load_preset("default")),  # the trial's, and the export's:
                             Artifact(load_preset("default"), ProblemClass(varlen=True))])
def test_export_builds_standalone(studies: Path, tmp_path: Path, session_cache: Path) -> None:
    """The export's own build.sh compiles the kernel from scratch (no fa-tune involved); the
    trial's library and the export's prebuilt one come from the session's cache."""
    from tuner.kernel import build, toolchain
    from tuner.kernel.config import load_preset

    cfg = load_preset("default")
    b = build.build_config(cfg)
    url = default_storage_url("real")
    open_storage(url)
    st = optuna.create_study(study_name="real", storage=url, direction="maximize")
    t = st.ask()
    t.set_user_attr("config", cfg.to_dict())
    t.set_user_attr("config_id", cfg.config_id())
    t.set_user_attr("build", {"so_path": b.so_path, "key": b.key})
    st.tell(t, 500.0)
    out = tmp_path / "pkg"
    r = runner.invoke(app, ["export", "--study", "real", "--out", str(out)])
    assert r.exit_code == 0, r.output
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
    # build.sh needs nvcc alone: no python, no CUTLASS headers.
    env["PATH"] = ":".join(p for p in env.get("PATH", "").split(":")
                           if p != str(Path(sys.executable).parent))
    env["NVCC"] = str(toolchain.find_nvcc())
    p = subprocess.run(["bash", str(out / "build.sh")], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=1800)
    assert p.returncode == 0, p.stderr[-3000:]
    so = out / "build" / "libfa_tune_fwd.so"
    syms = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True,
                          text=True).stdout
    for name in ("fa_tune_forward", "fa_tune_prepare", "fa_tune_last_error",
                 "fa_tune_config_json"):
        assert name in syms
    import ctypes

    lib = ctypes.CDLL(str(so))
    lib.fa_tune_config_json.restype = ctypes.c_char_p
    assert json.loads(lib.fa_tune_config_json().decode()) == json.loads(cfg.canonical_json())


def test_profile_driver_takes_a_problem_and_refuses_what_the_kernel_cannot_run(
        capsys: pytest.CaptureFixture[str]) -> None:
    from tuner.analysis import profile_driver

    assert profile_driver.main(["k.so", "1", "2"]) == 2  # neither PROBLEM nor B H S
    assert "usage:" in capsys.readouterr().err
    assert profile_driver.main(["k.so", "1x2x256", "--vs"]) == 2  # --vs without a kernel
    assert "usage:" in capsys.readouterr().err
    assert profile_driver.main(["k.so", "1x70000x128"]) == 2  # before opening a GPU
    assert "exceeds the kernel's grid limit" in capsys.readouterr().err
    for argv in (["k.so", "1x32/8x8192"], ["k.so", "4x32x8192:full"],
                 ["k.so", "4", "32", "8192"], ["k.so", "4x32x8192", "--vs", "fa3"],
                 ["k.so", "4x32x8192", "--vs", "other.so"]):
        assert profile_driver.main(argv) == 2  # no GPU here, or no k.so: one line
        err = capsys.readouterr().err
        assert err.startswith("profile_driver: error:") and "Traceback" not in err, err
    assert profile_driver.main(["k.so", "4x32"]) == 2
    assert "malformed problem" in capsys.readouterr().err
    assert profile_driver.parse_args(["a.so", "4x32x8192", "--vs", "fa3"]) == (
        "a.so", "4x32x8192", "fa3")
    assert profile_driver.parse_args(["a.so", "--vs", "b.so", "4", "32", "8192"]) == (
        "a.so", "4x32x8192", "b.so")


# ---- fa-tune profile through the CLI, with tests/fixtures/fake_ncu.py as `ncu` ----------------
@pytest.fixture
def fake_ncu(studies: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """`ncu` on PATH is the test fixture tests/fixtures/fake_ncu.py (a two-line wrapper, so the
    checkout's file mode does not matter); the trial's library is not built (a placeholder
    path: the fake ncu never runs the profiled program)."""
    from types import SimpleNamespace

    from tuner.ship import export

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "ncu"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FIX / "fake_ncu.py"}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    log = tmp_path / "ncu_calls.jsonl"
    monkeypatch.setenv("FAKE_NCU_LOG", str(log))
    monkeypatch.setattr(export, "artifact_for", lambda trial, cfg, *a, **k: SimpleNamespace(
        so_path=str(tmp_path / f"trial{trial.number}.so")))
    details, raw = tmp_path / "details.csv", tmp_path / "raw.csv"
    monkeypatch.setenv("FAKE_NCU_DETAILS", str(details))
    monkeypatch.setenv("FAKE_NCU_RAW", str(raw))
    return {"log": log, "details": details, "raw": raw}


def _ncu_calls(log: Path) -> list[list[str]]:
    return [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []


def _complete(study: str) -> list[int]:
    st = optuna.load_study(study_name=study, storage=default_storage_url(study))
    return [t.number for t in st.get_trials() if t.state.name == "COMPLETE"]


@pytest.mark.parametrize("mode, expect", [
    ("noperm", "cannot read the GPU performance counters (ERR_NVGPUCTRPERM)"),
    ("nokernels", "ncu profiled no kernel: the kernel-name filter "
                  "regex:attention_fwd_kernel matched nothing"),
])
def test_profile_ncu_failures_are_one_line(study: str, fake_ncu: dict[str, Path], mode: str,
                                           expect: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NCU_MODE", mode)
    r = runner.invoke(app, ["profile", "--study", study, "--shape", "1x2x256"])
    line = one_line_exit2(r)
    assert expect in line, line
    assert "Traceback" not in r.output


def test_profile_one_kernel_prints_and_stores_the_headline(
        study: str, fake_ncu: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(FIX))
    import ncu_two_kernels as two

    monkeypatch.setenv("FAKE_NCU_MODE", "ok")
    fake_ncu["details"].write_text(two.real_details())  # the H200 capture, as ncu prints it
    fake_ncu["raw"].write_text(two.real_raw())
    best = _complete(study)[0]
    r = runner.invoke(app, ["profile", "--study", study, "--trial", str(best),
                            "--shape", "1x2x256"], env={"COLUMNS": "160"})
    assert r.exit_code == 0, r.output
    for need in ("duration [ms]", "2.987", "SM clock [GHz]", "1.688", "tensor pipe (GMMA)",
                 "82.8", "XU pipe", "42.7", "stall: wait", "shared-memory bank conflicts",
                 "288,944", "L2 hit rate", "86.3", "DRAM throughput", "358.7",
                 "registers / thread", "168", "193.0", "ncu 2025.3.1.0",
                 "board power: n/a", f"report: {Path(os.environ['FA_TUNE_STUDIES'])}"):
        assert need in r.output, need
    assert "n/a in one column" not in r.output
    prof_run = next(c for c in _ncu_calls(fake_ncu["log"]) if "-o" in c)
    joined = " ".join(prof_run)
    for need in ("--set full", "--profile-from-start off", "--launch-count 1",
                 "--kernel-name-base demangled", "--kernel-name regex:attention_fwd_kernel",
                 "--clock-control none", "-m tuner.analysis.profile_driver"):
        assert need in joined, need
    assert prof_run[-1] == "1x2x256" and prof_run[-2].endswith(f"trial{best}.so")
    # The headline is stored with the trial, and `fa-tune show` lists it.
    t = optuna.load_study(study_name=study, storage=default_storage_url(study)).trials[best]
    rec = t.user_attrs["profile"]["1x2x256"]
    assert rec["metrics"]["duration_ms"] == pytest.approx(2.9872)
    assert rec["ncu_version"] == "2025.3.1.0" and rec["report"].endswith(".ncu-rep")
    assert rec["kernel"].startswith("void attention_fwd_kernel") and "vs" not in rec
    assert t.state.name == "COMPLETE" and t.user_attrs.get("config")  # nothing else changed
    for what in ("trials", "best"):
        r = runner.invoke(app, ["show", what, "--study", study], env={"COLUMNS": "200"})
        assert r.exit_code == 0, r.output
        assert "profiles (fa-tune profile):" in r.output
        assert f"trial {best} on 1x2x256" in r.output and "duration 2.987 ms" in r.output


def test_profile_vs_trial_side_by_side(study: str, fake_ncu: dict[str, Path],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(FIX))
    import ncu_two_kernels as two

    monkeypatch.setenv("FAKE_NCU_MODE", "ok")
    # Two results of attention_fwd_kernel (relabelled capture rows): the second one slower,
    # with fewer registers and no bank conflicts.
    fake_ncu["details"].write_text(two.details_two(changes={
        ("GPU Speed Of Light Throughput", "Duration"): "3.20"}))
    fake_ncu["raw"].write_text(two.raw_two(changes={
        "gpu__time_duration.sum": "3.200000", "launch__registers_per_thread": "128",
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum": "0"}))
    a, b = _complete(study)[:2]
    r = runner.invoke(app, ["profile", "--study", study, "--trial", str(a), "--vs-trial",
                            str(b), "--shape", "1x2x256"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert f"trial {a}" in r.output and f"trial {b}" in r.output
    assert f"trial {b} / trial {a}" in r.output  # the ratio column
    assert "3.200" in r.output and "1.07x *" in r.output and "0.76x *" in r.output
    assert "* the rows that differ most" in r.output
    assert r.output.count("kernel 0: void attention_fwd_kernel") == 1
    assert r.output.count("kernel 1: void attention_fwd_kernel") == 1
    prof_run = next(c for c in _ncu_calls(fake_ncu["log"]) if "-o" in c)
    assert "--launch-count" in prof_run and prof_run[prof_run.index("--launch-count") + 1] == "2"
    assert prof_run[-3:-1] == ["1x2x256", "--vs"] and prof_run[-1].endswith(f"trial{b}.so")
    assert prof_run[-4].endswith(f"trial{a}.so")
    trials = optuna.load_study(study_name=study, storage=default_storage_url(study)).trials
    ra, rb = (trials[n].user_attrs["profile"]["1x2x256"] for n in (a, b))
    assert ra["metrics"]["duration_ms"] == pytest.approx(2.9872)
    assert rb["metrics"]["duration_ms"] == pytest.approx(3.2)
    assert ra["vs"]["label"] == f"trial {b}" and rb["vs"]["label"] == f"trial {a}"
    assert ra["vs"]["metrics"]["registers_per_thread"] == 128


def test_profile_filter_matching_one_of_two_kernels(study: str, fake_ncu: dict[str, Path],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(FIX))
    import ncu_two_kernels as two

    monkeypatch.setenv("FAKE_NCU_MODE", "ok")
    fake_ncu["details"].write_text(two.real_details())  # one result for two launches
    fake_ncu["raw"].write_text(two.real_raw())
    a, b = _complete(study)[:2]
    line = one_line_exit2(runner.invoke(app, ["profile", "--study", study, "--trial", str(a),
                                              "--vs-trial", str(b), "--shape", "1x2x256"]))
    assert "ncu profiled 1 kernel(s) for 2 launches" in line
    assert "regex:attention_fwd_kernel did not match every kernel" in line


def test_profile_vs_fa3_without_flash_attn(study: str, fake_ncu: dict[str, Path],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    if importlib.util.find_spec("flash_attn") and importlib.util.find_spec("torch"):
        pytest.skip("flash-attn is installed here")
    monkeypatch.setenv("FAKE_NCU_MODE", "ok")
    line = one_line_exit2(runner.invoke(app, ["profile", "--study", study, "--vs", "fa3",
                                              "--shape", "1x2x256"]))
    assert "--vs fa3: FlashAttention-3 cannot run here" in line
    assert "is not installed" in line and "flash-attn-4" in line
    assert not any("-o" in c for c in _ncu_calls(fake_ncu["log"]))  # refused before ncu ran


@pytest.mark.parametrize("extra, expect", [
    (["--vs", "cudnn"], "unknown --vs 'cudnn'"),
    (["--vs", "fa3", "--vs-trial", "1"], "give --vs fa3 or --vs-trial N, not both"),
    (["--trial", "{a}", "--vs-trial", "{a}"], "is the trial being profiled"),
    (["--vs-trial", "999"], "no trial 999"),
])
def test_profile_side_by_side_wrong_input(study: str, fake_ncu: dict[str, Path], extra: list[str],
                                          expect: str) -> None:
    a = _complete(study)[0]
    argv = [x.format(a=a) for x in extra]
    line = one_line_exit2(runner.invoke(app, ["profile", "--study", study, "--shape",
                                              "1x2x256", *argv]))
    assert expect in line, line


@pytest.fixture
def fake_preset_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """``fa-tune profile --preset``'s build, a test fixture: the fake ncu never runs the
    library, so no nvcc compile (tests/test_kernel_build.py compiles every preset)."""
    from types import SimpleNamespace

    from tuner.kernel import build

    calls: list[tuple] = []

    def fake(cfg, *a, pclass=None, **k):
        calls.append((cfg, pclass))
        return SimpleNamespace(so_path=str(tmp_path / "preset.so"), require_timeable=lambda: None)

    monkeypatch.setattr(build, "build_config", fake)
    return calls


def test_profile_a_preset_builds_it_for_the_problem_and_stores_nothing(
        study: str, fake_ncu: dict[str, Path], fake_preset_build: list[tuple],
        monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(FIX))
    import ncu_two_kernels as two

    from tuner.kernel.config import load_preset

    monkeypatch.setenv("FAKE_NCU_MODE", "ok")
    fake_ncu["details"].write_text(two.real_details())
    fake_ncu["raw"].write_text(two.real_raw())
    before = {t.number: dict(t.user_attrs) for t in optuna.load_study(
        study_name=study, storage=default_storage_url(study)).trials}
    r = runner.invoke(app, ["profile", "--preset", "d64-static128", "--shape", "1x2x256:d64"],
                      env={"COLUMNS": "160"})
    assert r.exit_code == 0, r.output
    cfg = load_preset("d64-static128")
    assert f"preset d64-static128 ({cfg.config_id()})" in r.output and "2.987" in r.output
    assert "headline stored" not in r.output
    [(built, pclass)] = fake_preset_build
    assert built == cfg and (pclass.head_dim, pclass.causal) == (64, True)
    prof_run = next(c for c in _ncu_calls(fake_ncu["log"]) if "-o" in c)
    assert prof_run[-1] == "1x2x256:d64" and prof_run[-2].endswith("preset.so")
    after = {t.number: dict(t.user_attrs) for t in optuna.load_study(
        study_name=study, storage=default_storage_url(study)).trials}
    assert after == before  # no study touched


@pytest.mark.parametrize("extra, expect", [
    (["--preset", "default", "--trial", "1"], "--preset/--config profile a config, not a "
                                              "study's trial: drop --trial"),
    (["--preset", "default", "--study", "s"], "drop --study"),
    (["--preset", "default", "--config", "x.yaml"], "give exactly one of --preset NAME or "
                                                    "--config FILE"),
    (["--preset", "nosuch"], "nosuch"),
    (["--preset", "default", "--vs", "cudnn"], "unknown --vs 'cudnn'"),
    # A D 64 preset on a D 128 problem: validate's reason, before ncu or any build.
    (["--preset", "d64-sumpv"], "sum_in_pv (row sums as 8 extra columns of ones in the PV "
                                "GEMM) needs head dim 64; got 128"),
])
def test_profile_preset_wrong_input(studies: Path, fake_ncu: dict[str, Path],
                                    fake_preset_build: list[tuple], extra: list[str],
                                    expect: str) -> None:
    line = one_line_exit2(runner.invoke(app, ["profile", "--shape", "1x2x256", *extra]))
    assert expect in line, line
    assert not fake_preset_build  # refused before any build


def test_show_profile_lines_skip_malformed_records() -> None:
    from types import SimpleNamespace

    from tuner.analysis import show

    good = {"date": "2026-12-01T00:00:00Z", "ncu_version": "2025.3.1.0", "report": "r.ncu-rep",
            "metrics": {"duration_ms": 2.9872, "tensor_pipe_pct": 82.77, "bogus": 1.0,
                        "issued_ipc": "high"},
            "vs": {"label": "FlashAttention-3", "metrics": {"duration_ms": 3.16}}}
    trials = [SimpleNamespace(number=2, user_attrs={"profile": {"1x2x256": good,
                                                                "1x2x512": "junk"}}),
              SimpleNamespace(number=1, user_attrs={"profile": ["junk"]}),
              SimpleNamespace(number=0, user_attrs={})]
    [line] = show.profile_lines(trials)
    assert line == ("trial 2 on 1x2x256 (2026-12-01T00:00:00Z, ncu 2025.3.1.0): duration 2.987 ms, "
                    "tensor pipe (GMMA) 82.8 %; beside FlashAttention-3: duration 3.160 ms; "
                    "report r.ncu-rep")


def test_show_says_why_a_heartbeat_failed_trial_failed() -> None:
    """A trial Optuna's heartbeat failed carries no fail_reason (no worker told it): show names
    the dead worker instead of an empty reason; a told failure keeps its own reason."""
    import optuna
    from optuna.trial import TrialState

    from tuner.analysis.show import trial_rows

    st = optuna.create_study()
    dead = st.ask()
    st.tell(dead, state=TrialState.FAIL)
    told = st.ask()
    told.set_user_attr("fail_reason", "gate failed: 7 elements outside tolerance")
    st.tell(told, state=TrialState.FAIL)
    rows = trial_rows(st.get_trials())
    why = [str(r) for r in rows]
    assert "no heartbeat" in why[0] and "measured again" in why[0]
    assert "gate failed" in why[1] and "heartbeat" not in why[1]
