"""``fa-tune doctor``'s verdict: which checks are required for what, exit code, summary line."""

from __future__ import annotations

import sys
import types

import pytest
from typer.testing import CliRunner

from tuner import doctor
from tuner.cli import app
from tuner.doctor import BUILD, OPTIONAL, RUN, Check, summarize

BUILD_CHECKS = ("nvcc", "nvcc sm_90a", "cuobjdump", "kernel template")
RUN_CHECKS = ("cuda-python", "driver", "GPU (sm_90)", "NVML")


def checks(missing: set[str] = frozenset()) -> list[Check]:
    out = [Check(n, n not in missing, "-", "fix it", BUILD) for n in BUILD_CHECKS]
    out += [Check(n, n not in missing, "-", "fix it", RUN) for n in RUN_CHECKS]
    out.append(Check("Nsight Compute", "Nsight Compute" not in missing, "-", "fix", OPTIONAL))
    return out


def test_every_real_check_says_what_needs_it() -> None:
    got = {c.name: c.need for c in doctor.run_checks()}
    for name in RUN_CHECKS:
        assert got[name] == RUN
    for name in ("nvcc", "kernel template"):
        assert got[name] == BUILD
    if "nvcc sm_90a" in got:  # only probed when nvcc is there
        assert got["nvcc sm_90a"] == got["cuobjdump"] == BUILD
    assert set(got.values()) <= {BUILD, RUN, OPTIONAL}


@pytest.mark.parametrize("missing, build_only, code, line", [
    (set(), False, 0, "everything required is there"),
    ({"Nsight Compute"}, False, 0,
     "everything required is there; optional, missing: Nsight Compute (needed for profile)"),
    ({"GPU (sm_90)"}, False, 1,
     "missing: GPU (sm_90) (needed for run/search/compare/profile); build works"),
    ({"driver", "GPU (sm_90)", "NVML"}, True, 0,
     "build works; not needed to build: driver, GPU (sm_90), NVML"),
    ({"cuobjdump"}, False, 1, "missing: cuobjdump (needed for build and everything else)"),
    ({"cuobjdump"}, True, 1, "missing: cuobjdump (needed for build and everything else)"),
    ({"nvcc sm_90a", "NVML"}, False, 1,
     "missing: nvcc sm_90a (needed for build and everything else); "
     "missing: NVML (needed for run/search/compare/profile)"),
])
def test_summary(missing: set[str], build_only: bool, code: int, line: str) -> None:
    assert summarize(checks(missing), build_only=build_only) == (code, line)


def test_cli_exit_code_follows_the_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    monkeypatch.setattr(doctor, "run_checks", lambda: checks({"GPU (sm_90)"}))
    r = runner.invoke(app, ["doctor"], env={"COLUMNS": "50"})
    assert r.exit_code == 1, r.output
    assert "missing: GPU (sm_90) (needed for run/search/compare/profile); build works" \
        in r.output.splitlines()
    assert runner.invoke(app, ["doctor", "--build-only"]).exit_code == 0
    monkeypatch.setattr(doctor, "run_checks", lambda: checks())
    r = runner.invoke(app, ["doctor"])
    assert r.exit_code == 0 and "everything required is there" in r.output


def test_nvml_failing_with_the_binding_installed_names_the_driver(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-ml-py imports but NVML does not start: the fix is the driver, not a pip install."""
    def no_nvml() -> None:
        raise OSError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=no_nvml))
    c = doctor._nvml_check()
    assert not c.ok and "driver" in c.fix and "pip install" not in c.fix
