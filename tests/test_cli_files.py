"""The user's files, paths and numbers as the CLI meets them: one `fa-tune: error:` line, exit 2.

Cases from a bad-input audit of every command (2026-12-06): each of these was a traceback, a
message without a fix, or a study made before the bad option was seen."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import one_error_line
from typer.testing import CliRunner

from tuner.cli import app
from tuner.doctor import has_sm90_gpu

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def fa_tune(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The console entry point in a process of its own (click's own errors come from main)."""
    return subprocess.run([sys.executable, "-c", "from tuner.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def test_create_only_refuses_the_workers_options(tmp_path: Path) -> None:
    """--create-only ignored a bad --timeout ('5x') and exited 0: run options are the workers'."""
    p = fa_tune("search", "--study", "s", "--storage", f"sqlite:///{tmp_path / 's.db'}",
                "--create-only", "--timeout", "5x", "--trials", "3")
    assert p.returncode == 2
    line = one_error_line(p.stderr)
    assert "--trials, --timeout belong to the workers that join it" in line, line
    assert not (tmp_path / "s.db").exists()


@pytest.mark.skipif(has_sm90_gpu(), reason="a first search that stops at the missing GPU")
def test_a_study_never_asked_anything_takes_new_problems(tmp_path: Path) -> None:
    """A first search on a host without a driver created the study and stopped at the GPU
    worker: the study, with no trial, used to refuse every later --shape but its first."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    for shape in ("1x32x8192", "1x32/8x8192"):
        p = fa_tune("search", "--study", "s", "--storage", url, "--shape", shape, "--trials", "1")
        assert p.returncode == 2
        assert "the GPU worker did not start" in one_error_line(p.stderr), p.stderr


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_a_seed_outside_the_samplers_range_is_one_line(tmp_path: Path, seed: str) -> None:
    p = fa_tune("search", "--study", "s", "--storage", f"sqlite:///{tmp_path / 's.db'}",
                "--shape", "1x32x8192", "--trials", "1", "--seed", seed)
    assert p.returncode == 2
    assert "--seed" in one_error_line(p.stderr)
    assert not (tmp_path / "s.db").exists()


@pytest.mark.parametrize("cmd", [["search", "--study", "s", "--trials", "1"],
                                 ["build", "--preset", "baseline"]])
def test_a_jobs_count_no_host_can_run_is_one_line(tmp_path: Path, cmd: list[str]) -> None:
    """A mistyped --jobs would start thousands of nvcc (1-2 GB each): refused before any."""
    if cmd[0] == "search":
        cmd += ["--storage", f"sqlite:///{tmp_path / 's.db'}"]
    p = fa_tune(*cmd, "--jobs", "100000")
    assert p.returncode == 2
    assert "--jobs 100000 is outside 1.." in one_error_line(p.stderr)
    assert not (tmp_path / "s.db").exists()


@pytest.mark.parametrize(("data", "needle"), [
    (b"\xff\xfe\x00b", "is not UTF-8 text (byte 0: 0xff); save it as UTF-8"),
    ("block_n: 128  # caf\u00e9\n".encode("latin-1"), "is not UTF-8 text"),
    (b"block_m: 128\nblock_m: 64\n", "line 2: key 'block_m' is given twice (lines 1 and 2)"),
    (b'block_m: "128"\n', "(got 128, a str: write it without quotes)"),
])
def test_a_config_file_the_parser_cannot_take_is_one_line(tmp_path: Path, data: bytes,
                                                          needle: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(data)
    for cmd in (["build", "--config", str(cfg)], ["run", "--config", str(cfg)]):
        r = runner.invoke(app, cmd)
        assert r.exit_code == 2
        assert needle in one_error_line(r.output)


def test_a_search_space_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_bytes(b"block_n: [128]\n# \xe9\n")
    r = runner.invoke(app, ["search", "--study", "s", "--storage",
                            f"sqlite:///{tmp_path / 's.db'}", "--space", str(space),
                            "--trials", "1"])
    assert r.exit_code == 2
    assert "search space" in one_error_line(r.output)


def test_a_studies_home_that_is_a_file_is_named_in_one_line(tmp_path: Path) -> None:
    home = tmp_path / "not-a-folder"
    home.write_text("x")
    p = fa_tune("build", "--preset", "default", env={"FA_TUNE_STUDIES": str(home)})
    assert p.returncode == 2
    line = one_error_line(p.stderr)
    assert f"FA_TUNE_STUDIES={home}" in line and "Not a directory" in line


def test_a_preset_for_another_head_dim_names_the_one_it_fits() -> None:
    for cmd in (["build", "--preset", "d64"], ["run", "--preset", "d64", "--shape", "1x32x8192"]):
        r = runner.invoke(app, cmd)
        assert r.exit_code == 2
        assert "this config fits head dim 64: give --head-dim 64 or :d64 problems" in \
            one_error_line(r.output)


def test_tune_checks_its_options_before_any_bucket(tmp_path: Path) -> None:
    p = fa_tune("tune", "--workload", "llama3-8b", "--trials", "1", "--sampler", "nope",
                env={"FA_TUNE_STUDIES": str(tmp_path)})
    assert p.returncode == 2
    assert "unknown sampler 'nope'" in one_error_line(p.stderr)
    assert "bucket" not in p.stdout
    assert not list(tmp_path.rglob("*.db"))


def test_show_refuses_a_shape_it_would_ignore() -> None:
    r = runner.invoke(app, ["show", "trials", "--study", "s", "--shape", "1x32x8192"])
    assert r.exit_code == 2
    assert "--shape ranks `show best`; `show trials` takes none" in one_error_line(r.output)


def test_a_search_with_a_store_it_cannot_use_leaves_no_database(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    p = fa_tune("search", "--study", "s", "--storage", f"sqlite:///{db}", "--artifacts",
                "ftp://x", "--trials", "1", env={"FA_TUNE_STUDIES": str(tmp_path / "home")})
    assert p.returncode == 2
    assert "ftp:// scheme is not supported" in one_error_line(p.stderr)
    assert not db.exists()
