"""The CLI as a user meets it: one clear line and exit 2 for every user error."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import one_error_line as _one_error_line
from prebuild import Artifact
from typer.testing import CliRunner

from tuner import _paths
from tuner.cli import app
from tuner.doctor import has_sm90_gpu
from tuner.kernel.config import load_preset
from tuner.problem import Problem

runner = CliRunner()


def test_presets_lists() -> None:
    r = runner.invoke(app, ["presets"])
    assert r.exit_code == 0, r.output
    assert "baseline" in r.output and "fa3" in r.output and "default" in r.output


@pytest.mark.parametrize(("shape", "needle"), [
    ("4x32", "malformed problem '4x32': write BxHq[/Hkv]xS[:dD][:full]"),
    ("4x32xS", "malformed problem"),
    ("0x1x128", "B must be a positive integer"),
    ("4x32/5x8192", "Hq=32 must be a multiple of Hkv=5"),
    ("4x32x8192:d96", "head dim D=96 is not supported"),
    ("4x32x8192:window", "unknown option ':window'"),
    ("1x8x256:d64:d128", "the head dim (:d) is given twice (:d64 and :d128)"),
    ("1x8x256:full:causal", "give one mask (:full and :causal)"),
    ("１x8x256", "is not a plain ASCII character"),
    ("1x8x256:w99999999999999999999999", "at most 1073741824"),
    ("1x8x256:cap1.23457e+06", "must be a plain decimal number"),
])
def test_bad_shape_exit_2(shape: str, needle: str) -> None:
    r = runner.invoke(app, ["run", "--preset", "baseline", "--shape", shape])
    assert r.exit_code == 2
    assert needle in _one_error_line(r.output)


@pytest.fixture()
def no_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any compile or GPU use is a test failure: the refusal must come first."""
    from tuner.kernel import build as build_mod
    from tuner.kernel import runtime

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("a kernel was built (or the GPU opened) for a problem it cannot run")

    monkeypatch.setattr(build_mod, "build_config", refuse)
    monkeypatch.setattr(build_mod, "build_many", refuse)
    monkeypatch.setattr(runtime.Device, "open", refuse)


@pytest.mark.parametrize(("shape", "needle"), [
    ("1x70000x128", "Hq=70000 exceeds the kernel's grid limit 65535"),
])
@pytest.mark.parametrize("command", ["run", "search", "profile"])
def test_kernel_problem_it_cannot_run_exit_2_before_building(
        no_builds: None, command: str, shape: str, needle: str, tmp_path: Path) -> None:
    argv = {"run": ["run", "--preset", "baseline"],
            "search": ["search", "--trials", "1", "--study", "x", "--storage",
                       f"sqlite:///{tmp_path / 'x.db'}"],
            "profile": ["profile", "--study", "x", "--storage",
                        f"sqlite:///{tmp_path / 'x.db'}"]}[command]
    r = runner.invoke(app, [*argv, "--shape", "4x32x4096", "--shape", shape]
                      if command != "profile" else [*argv, "--shape", shape])
    assert r.exit_code == 2, r.output
    line = _one_error_line(r.output)
    assert needle in line and shape in line
    assert not (tmp_path / "x.db").exists()  # search refused before opening its study


@pytest.mark.parametrize(("other", "needle"), [("4x32x8192:d64", "mix head dims"),
                                              ("4x32x4096:full", "mix causal and non-causal")])
@pytest.mark.parametrize("command", ["run", "search"])
def test_mixed_problem_classes_exit_2_before_building(no_builds: None, command: str, other: str,
                                                      needle: str, tmp_path: Path) -> None:
    """A kernel library serves one problem class (head dim and mask): problems of two classes
    in one invocation are one line, exit 2, before any compile or study."""
    argv = {"run": ["run", "--preset", "baseline"],
            "search": ["search", "--trials", "1", "--study", "x", "--storage",
                       f"sqlite:///{tmp_path / 'x.db'}"]}[command]
    r = runner.invoke(app, [*argv, "--shape", "1x32/8x4096", "--shape", other])
    assert r.exit_code == 2, r.output
    assert needle in _one_error_line(r.output)
    assert not (tmp_path / "x.db").exists()


def test_config_that_cannot_fit_the_head_dim_exit_2_before_building(no_builds: None) -> None:
    """The static check is per head dim; the line names that head dim's default preset."""
    r = runner.invoke(app, ["run", "--preset", "default", "--shape", "4x16x8192:d256"])
    assert r.exit_code == 2, r.output
    line = _one_error_line(r.output)
    assert "shared memory" in line and "head dim 256" in line and "'d256'" in line


def test_unknown_preset_exit_2() -> None:
    r = runner.invoke(app, ["build", "--preset", "nope"])
    assert r.exit_code == 2
    assert "unknown preset 'nope'" in _one_error_line(r.output)


def test_preset_and_config_both_or_neither(tmp_path: Path) -> None:
    r = runner.invoke(app, ["build"])
    assert r.exit_code == 2 and "exactly one" in _one_error_line(r.output)


def test_config_unknown_knob_exit_2(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("block_m: 128\nwarps: 8\n")
    r = runner.invoke(app, ["build", "--config", str(p)])
    assert r.exit_code == 2
    assert "unknown knob 'warps'" in _one_error_line(r.output)


def test_config_unparseable_exit_2(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("block_m: [128\n")
    r = runner.invoke(app, ["run", "--config", str(p)])
    assert r.exit_code == 2 and "cannot parse YAML" in _one_error_line(r.output)


def test_config_invalid_exit_2(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("block_m: 64\npingpong: true\n")
    r = runner.invoke(app, ["build", "--config", str(p)])
    assert r.exit_code == 2 and "pingpong needs" in _one_error_line(r.output)


def test_missing_config_file_exit_2(tmp_path: Path) -> None:
    r = runner.invoke(app, ["build", "--config", str(tmp_path / "none.yaml")])
    assert r.exit_code == 2 and "cannot read config file" in _one_error_line(r.output)


def test_usage_error_exit_2() -> None:
    r = runner.invoke(app, ["run", "--warmup", "many"])
    assert r.exit_code == 2


@pytest.mark.skipif(has_sm90_gpu(), reason="checks the doctor on a machine without a GPU")
def test_doctor_without_gpu_exits_1() -> None:
    # A narrow terminal: the table is squeezed, check names and the summary line stay whole.
    r = runner.invoke(app, ["doctor"], env={"COLUMNS": "60"})
    assert r.exit_code == 1, r.output
    for what in ("cuda-python", "driver", "GPU", "nvcc", "sm_90a", "cuobjdump", "NVML"):
        assert what in r.output
    [line] = [ln for ln in r.output.splitlines() if ln.startswith("missing: ")]
    assert "GPU (sm_90)" in line and "(needed for run/search/compare/profile)" in line
    build_ok = "(needed for build" not in line
    assert ("build works" in line) == build_ok
    # --build-only: the same machine passes when it can build.
    r = runner.invoke(app, ["doctor", "--build-only"], env={"COLUMNS": "60"})
    assert r.exit_code == (0 if build_ok else 1), r.output


def test_doctor_usage_error_exit_2() -> None:
    assert runner.invoke(app, ["doctor", "--gpu-please"]).exit_code == 2


def test_bundle_refuses_non_empty_dir(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("x")
    r = runner.invoke(app, ["bundle", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "not an empty folder" in _one_error_line(r.output)
    r = runner.invoke(app, ["bundle", "--out", str(tmp_path / "new"), "--python", "three"])
    assert r.exit_code == 2 and "--python" in _one_error_line(r.output)
    r = runner.invoke(app, ["bundle", "--out", str(tmp_path / "new2"), "--extra", "postgress"])
    assert r.exit_code == 2
    assert "unknown --extra 'postgress'; choose from postgres" in _one_error_line(r.output)


@pytest.mark.skipif(has_sm90_gpu(), reason="checks the no-GPU message")
def test_run_without_gpu_exit_2() -> None:
    pytest.importorskip("tuner.kernel.runtime")
    r = runner.invoke(app, ["run", "--preset", "baseline", "--shape", "1x1x128"])
    assert r.exit_code == 2, r.output
    _one_error_line(r.output)


def test_console_script_one_line() -> None:
    """The installed entry point (not only CliRunner) prints one line and exits 2."""
    r = subprocess.run(
        [sys.executable, "-c", "from tuner.cli import main; main()", "run", "--shape", "4x32",
         "--preset", "baseline"],
        capture_output=True, text=True, env={**os.environ, "COLUMNS": "80"},
    )
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "malformed problem '4x32'" in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_during_a_build_is_one_line_and_leaves_no_compiler(
        tmp_path: Path, sig: signal.Signals) -> None:
    """systemd's SIGTERM or a closed terminal's SIGHUP while nvcc runs: the command unwinds
    (its compiler goes with it) and says one line, exit 128 + the signal."""
    p = subprocess.Popen([sys.executable, "-c", "from tuner.entry import main; main()", "build",
                          "--preset", "baseline"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "FA_TUNE_STUDIES": str(tmp_path)})
    out, err = _signal_once_compiling(p, tmp_path, sig)
    assert err == f"fa-tune: stopped ({sig.name})\n", err
    assert p.returncode == 128 + sig
    time.sleep(0.5)
    assert not _compilers_under(tmp_path)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_during_a_compile_only_worker_settles_and_exits_by_the_signal(
        tmp_path: Path, sig: signal.Signals) -> None:
    """A search or worker takes SIGTERM and SIGHUP as its own stop (settles its trials, prints
    its summary), not the CLI's plain unwinding; it exits 128 + the signal."""
    env = {**os.environ, "FA_TUNE_STUDIES": str(tmp_path)}
    url = f"sqlite:///{tmp_path / 'h.db'}"
    cli = [sys.executable, "-c", "from tuner.entry import main; main()"]
    made = subprocess.run([*cli, "search", "--study", "h", "--storage", url, "--create-only"],
                          capture_output=True, text=True, env=env)
    assert made.returncode == 0, made.stderr
    (tmp_path / "art").mkdir()
    p = subprocess.Popen([*cli, "worker", "--study", "h", "--storage", url, "--compile-only",
                          "--timeout", "5m", "--artifacts", str(tmp_path / "art")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, err = _signal_once_compiling(p, tmp_path, sig)
    assert p.returncode == 128 + sig, (p.returncode, out[-2000:], err[-2000:])
    assert f"stopped: interrupted ({sig.name})" in out, out[-2000:]
    assert "Traceback" not in err, err
    time.sleep(0.5)
    assert not _compilers_under(tmp_path)


def _signal_once_compiling(p: subprocess.Popen, folder: Path,
                           sig: signal.Signals) -> tuple[str, str]:
    """Send ``sig`` once a compiler runs under ``folder``; the command's (stdout, stderr)."""
    deadline = time.time() + 120
    while not _compilers_under(folder) and time.time() < deadline and p.poll() is None:
        time.sleep(0.05)
    assert _compilers_under(folder), "no compile started"
    p.send_signal(sig)
    return p.communicate(timeout=120)


def _compilers_under(folder: Path) -> list[int]:
    """Processes whose command line names `folder` (nvcc and the tools it runs build there)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(folder) in cmd and "tuner.entry" not in cmd:
                found.append(int(d.name))
    return found


def test_after_a_command_ctrl_c_ends_the_process_without_a_trace() -> None:
    """Once main() is done only the interpreter's exit is left: SIGINT goes back to its default
    action, so a Ctrl-C in threading's shutdown is no "Exception ignored" trace (it was, at
    0.6 s into test_ctrl_c_while_the_cli_loads_is_one_line, once in a CI run)."""
    code = ("import signal, sys, tuner.entry as e\ntry:\n    e.main()\n"
            "except SystemExit:\n    pass\n"
            "print(signal.getsignal(signal.SIGINT) is signal.SIG_DFL)")
    p = subprocess.run([sys.executable, "-c", code, "presets"], capture_output=True, text=True,
                       timeout=60)
    assert p.stdout.strip().endswith("True"), (p.stdout[-200:], p.stderr)


@pytest.mark.parametrize("after_s", [0.05, 0.15, 0.3, 0.45, 0.6])
def test_ctrl_c_while_the_cli_loads_is_one_line(after_s: float) -> None:
    """The console script's entry (tuner.entry) imports the CLI itself: a Ctrl-C during those
    imports (about half a second) is the same line and exit as one during a command. The child
    says when it enters main(), so the signal never lands in the interpreter's own start-up."""
    code = ("import sys, tuner.entry as e; sys.stdout.write('in main\\n'); sys.stdout.flush(); "
            "e.main()")
    p = subprocess.Popen([sys.executable, "-c", code, "presets"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "in main\n"
    time.sleep(after_s)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert "Traceback" not in err and "Exception ignored" not in err, err
    # Once the command has finished there is nothing to interrupt (at the interpreter's exit
    # SIGINT's default action ends it, silently).
    assert p.returncode in (130, 0, -signal.SIGINT), (p.returncode, err)
    if p.returncode != 130:
        assert "baseline" in out and err == "", err  # the whole list was printed
    if p.returncode == 130:
        assert err == "fa-tune: interrupted\n", err


@pytest.mark.slow
@pytest.mark.skipif(not _paths.kernel_template().is_file(), reason="kernel template not written")
@pytest.mark.builds(lambda: [load_preset("baseline")])  # D 128, causal: the CLI's default class
def test_build_preset_prints_resources() -> None:
    r = runner.invoke(app, ["build", "--preset", "baseline"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    for col in ("registers", "spills", "stack frame", "shared memory", "compile time",
                "cache hit", "HGMMA", "LDL / STL"):
        assert col in r.output
    assert "artifact:" in r.output


# D 256 with a window, a cap and sinks: the d256-multicast preset spills there (8 B of stack),
# d256-window does not (nvcc 13.0).
_LOCAL = "1x16/8x8192:d256:w4096:cap50:sinks"


def _local_build(preset: str) -> Artifact:
    return Artifact.of(load_preset(preset), Problem.parse(_LOCAL).problem_class)


@pytest.mark.slow
@pytest.mark.skipif(not _paths.kernel_template().is_file(), reason="kernel template not written")
@pytest.mark.builds(lambda: [_local_build("d256-multicast"), _local_build("d256-window")])
def test_build_shape_builds_the_problems_class_and_says_when_it_spills() -> None:
    """--shape compiles the class the problem needs (its mask included), and a kernel with
    local memory is named not timeable, the reason search and run refuse it."""
    r = runner.invoke(app, ["build", "-p", "d256-multicast", "--shape", _LOCAL],
                      env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "window" in r.output and "softcap" in r.output  # the class, in the title
    assert "not timeable: local memory" in r.output
    assert load_preset("d256-window") == load_preset("d256").replace(block_n=64)
    r = runner.invoke(app, ["build", "-p", "d256-window", "-s", _LOCAL], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "not timeable" not in r.output and "LDL / STL" in r.output


@pytest.mark.parametrize("extra", [["--head-dim", "64"], ["--head-dim", "128"], ["--full"]])
def test_build_shape_with_head_dim_is_one_line(extra: list[str]) -> None:
    r = runner.invoke(app, ["build", "-p", "d64", "-s", "1x8x512:d64", *extra])
    assert r.exit_code == 2 and "not both" in _one_error_line(r.output)


@pytest.mark.parametrize("command", ["run", "compare", "search", "show", "profile"])
def test_help_shows_the_problem_syntax(command: str) -> None:
    """The --shape help names the syntax (rich must not read '[/Hkv]' as a closing tag)."""
    r = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "BxHq[/Hkv]xS[:kSK][:dD][:full][:wW][:capC][:sinks][:pP][:qkv|:bhsd]" in r.output


@pytest.mark.parametrize("args", [["run", "--bogus"], ["show", "--top"], ["frob"],
                                  ["workload"], ["show", "--top", "x"]])
def test_usage_errors_are_one_line(args: list[str]) -> None:
    """click's own errors through the entry point: one line on stderr naming the command's
    --help, exit 2, no usage dump and no box."""
    r = subprocess.run([sys.executable, "-c", "from tuner.cli import main; main()", *args],
                       capture_output=True, text=True, env={**os.environ, "COLUMNS": "80"})
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("fa-tune: error: ") and "--help`)" in r.stderr
    assert "╭" not in r.stderr and "Usage:" not in r.stderr


@pytest.mark.parametrize("command", ["", "build", "run", "doctor", "presets", "bundle", "compare",
                                     "search", "worker", "show", "export", "workload", "tune",
                                     "profile"])
def test_help_shows_no_type_placeholders(command: str) -> None:
    """Options that take a value show a metavar (PROBLEM, NAME, N, ...), flags none: no
    <bool>, <str>, <list[str]>, <int range>."""
    r = runner.invoke(app, [*command.split(), "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert not re.findall(r"<(bool|str|int|float|path|list\[\w+\]|int range|float range)>",
                          r.output), r.output
