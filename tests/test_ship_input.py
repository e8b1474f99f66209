"""Bad input to the shipping commands is one `fa-tune: error:` line, never a traceback, and
loses nothing: `fa-tune export --table` checks every field of the table it loads (names that
would leave --out or reach build.sh, heads, head dims, problems, configs, the ABI), an export
stages in a fresh folder of its own (a user's `.NAME.tmp` survives), an --out that cannot be
made is refused before anything compiles, `bundle --out` alike, and `--artifacts` takes only the
stores it supports. CPU only: every export here is --no-build (no nvcc)."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from cli_helpers import one_error_line
from dispatch_stub import TWO
from typer.testing import CliRunner

from tuner.cli import app
from tuner.errors import FaTuneError, SearchError
from tuner.search.artifacts import open_store
from tuner.ship import dispatch
from tuner.ship.dispatch import DispatchTable
from tuner.ship.export_workload import sh_word, workload_build_script
from tuner.ship.workload import workload_from_dict

runner = CliRunner()


def _table_dict() -> dict[str, Any]:
    w = workload_from_dict(TWO)
    return dispatch.table_for_workload(w, dispatch.bucket_sources(w, default="preset:default")
                                       ).to_dict()


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _refused(argv: list[str]) -> str:
    r = runner.invoke(app, argv)
    assert r.exit_code == 2, r.output
    return one_error_line(r.output)


def _entry(**kw: Any) -> Any:
    return lambda d: d["entries"][0].update(**kw)


BAD_TABLES = [
    (_entry(bucket="../../escaped_by_bucket"), "bucket must be letters, digits"),
    (_entry(bucket='s1k"; echo INJECT; "'), "bucket must be letters, digits"),
    (_entry(head_dim=96), "(bucket short): head_dim 96 is not one the kernel builds"),
    (_entry(Hq=0), "(bucket short): Hq must be a positive integer"),
    (_entry(Hkv=3), "(bucket short): Hq 32 must be a multiple of Hkv 3"),
    (_entry(s_min=0), "(bucket short): s_min must be a positive integer"),
    (_entry(causal="yes"), "(bucket short): causal: expected true or false"),
    (_entry(problems=["garbage"]), "(bucket short): problems[0]: malformed problem 'garbage'"),
    (_entry(problems="1x32/8x1024"), "(bucket short): problems must be a list"),
    (_entry(config=None), "(bucket short): config must be a mapping"),
    (_entry(config={"block_n": 72}), "knob 'block_n'"),
    (_entry(config={"write_lse": False}, config_id=None), "has write_lse: false"),
    (_entry(measured={"1x32/8x1024": {"median_ms": "fast"}}), "measured['1x32/8x1024']"),
    (_entry(source="preset:default"), "(bucket short): source must be a mapping"),
    (_entry(source={"kind": "shell", "cmd": "rm"}), "source kind must be one of"),
    (_entry(window=4096), "window 4096 needs 'window' in masks"),
    (_entry(masks="window"), "masks must be a list"),
    (lambda d: d.update(problem_class="x"), "problem_class must be a mapping"),
    (lambda d: d.update(problem_class={"head_dim": 64, "causal": True}),
     "is not its entries'"),
    (lambda d: d.update(name="../../evil"), "'name' must be letters, digits"),
    (lambda d: d.update(name="a..b"), "(not '..'"),
    (lambda d: d.update(abi_version=99), "abi_version 99: this fa-tune reads tables of ABI 1.."),
    (lambda d: d.update(abi_version="5"), "abi_version '5'"),
    (lambda d: d.update(workload="llama"), "'workload' must be a mapping or null"),
]


@pytest.mark.parametrize("mutate, needle", BAD_TABLES)
def test_a_bad_table_is_one_line_and_writes_nothing(tmp_path: Path, mutate, needle: str) -> None:
    d = _table_dict()
    mutate(d)
    table = tmp_path / "work" / "dispatch.json"
    table.parent.mkdir()
    table.write_text(json.dumps(d))
    before = _tree(tmp_path)
    line = _refused(["export", "--table", str(table), "--no-build",
                     "--out", str(tmp_path / "work" / "lib")])
    assert needle in line and str(table) in line, line
    assert _tree(tmp_path) == before  # nothing in --out, nothing beside or above it


def test_a_valid_table_still_loads_and_older_abis_and_schemas_too() -> None:
    d = _table_dict()
    t = DispatchTable.from_dict(d)
    assert DispatchTable.from_dict(json.loads(t.dumps())) == t
    d["abi_version"] = dispatch.ABI_VERSION - 1  # an older export: re-exported at this ABI
    assert DispatchTable.from_dict(d) == t
    del d["abi_version"], d["problem_class"]  # tables of schema 1 may lack both
    assert DispatchTable.from_dict(d) == t


def test_a_table_made_in_code_gets_its_names_checked_too() -> None:
    t = DispatchTable.from_dict(_table_dict())
    bad = dispatch.DispatchEntry(**{**t.entries[0].__dict__, "bucket": "../x"})
    with pytest.raises(dispatch.DispatchError, match="bucket name '../x'"):
        DispatchTable("two", (bad,))
    with pytest.raises(dispatch.DispatchError, match="not '..'"):
        DispatchTable("../two", t.entries)


def test_build_sh_quotes_every_value(tmp_path: Path) -> None:
    """Defense in depth: even a bucket name that got past the checks is one shell word."""
    assert sh_word("short fa_tune_b0_") == '"short fa_tune_b0_"'  # the scripts as they were
    assert sh_word("short.o", "$OBJ/") == '"$OBJ/short.o"'
    evil = 's1k"; touch PWNED; "'
    assert sh_word(evil) == shlex.quote(evil)
    assert sh_word(f"{evil}.o", "$OBJ/") == f'"$OBJ/"{shlex.quote(evil + ".o")}'
    fake = SimpleNamespace(entries=[SimpleNamespace(bucket=evil), SimpleNamespace(bucket="$(id)")])
    script = workload_build_script(fake)
    (tmp_path / "build.sh").write_text(script)
    assert subprocess.run(["bash", "-n", str(tmp_path / "build.sh")]).returncode == 0
    loop = next(ln for ln in script.splitlines() if ln.startswith("for spec in "))
    words = loop[len("for spec in "):-len("; do")]
    out = subprocess.run(["bash", "-c", f"printf '%s\\n' {words}"], cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == [f"{evil} fa_tune_b0_", "$(id) fa_tune_b1_"]
    assert not (tmp_path / "PWNED").exists()


@pytest.fixture
def two_file(tmp_path: Path) -> Path:
    p = tmp_path / "two.yaml"
    p.write_text(yaml.safe_dump(TWO))
    return p


def _export_wl(two_file: Path, out: Path) -> Any:
    return runner.invoke(app, ["export", "--workload", str(two_file), "--no-build",
                               "--default", "preset:default", "--out", str(out)])


def test_export_never_touches_a_users_tmp_folder(two_file: Path, tmp_path: Path) -> None:
    a = tmp_path / "a"
    (a / ".mylib.tmp").mkdir(parents=True)
    (a / ".mylib.tmp" / "notes.txt").write_text("mine")
    r = _export_wl(two_file, a / "mylib")
    assert r.exit_code == 0, r.output
    assert (a / ".mylib.tmp" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in a.iterdir()) == [".mylib.tmp", "mylib"]  # no staging left
    # A plain folder's mode (the staging folder was 0700), and its build.sh is valid bash.
    mask = os.umask(0o022)
    os.umask(mask)
    assert stat.S_IMODE((a / "mylib").stat().st_mode) == 0o777 & ~mask
    sh = a / "mylib" / "build.sh"
    assert '"short fa_tune_b0_" "long fa_tune_b1_"' in sh.read_text()
    assert subprocess.run(["bash", "-n", str(sh)]).returncode == 0
    # Exporting again to the same --out is refused, and both folders stay as they are.
    before = _tree(a)
    assert "already exists" in _refused(["export", "--workload", str(two_file), "--no-build",
                                         "--default", "preset:default", "--out", str(a / "mylib")])
    assert _tree(a) == before


def test_a_failed_export_leaves_nothing(two_file: Path, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An OSError while writing is one line naming the file; the staging folder and the parents
    the export made are gone, the user's files are not."""
    from tuner.ship import export_workload

    def full_disk(*a: Any, **k: Any) -> str:
        raise OSError(28, "No space left on device", "README.md")

    monkeypatch.setattr(export_workload, "workload_readme", full_disk)
    (tmp_path / "keep.txt").write_text("x")
    before = _tree(tmp_path)
    line = _refused(["export", "--workload", str(two_file), "--no-build", "--default",
                     "preset:default", "--out", str(tmp_path / "new" / "deeper" / "lib")])
    assert "No space left on device: README.md" in line and "new/deeper/lib" in line
    assert _tree(tmp_path) == before


def _out_cases(tmp_path: Path) -> list[tuple[Path, str]]:
    f = tmp_path / "existing.txt"
    f.write_text("x")
    cases = [(f / "sub", "existing.txt is not a folder"), (f, "already exists")]
    if Path("/proc").is_dir():
        cases.append((Path("/proc/ewx"), "/proc"))
    if os.geteuid() != 0:  # root writes anywhere: a read-only folder refuses nobody
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        cases.append((ro / "lib", "is not writable"))
    return cases


def test_an_out_that_cannot_be_made_is_one_line(two_file: Path, tmp_path: Path) -> None:
    for out, needle in _out_cases(tmp_path):
        before = _tree(tmp_path)
        line = _refused(["export", "--workload", str(two_file), "--no-build", "--default",
                         "preset:default", "--out", str(out)])
        assert needle in line and str(out) in line, line
        assert _tree(tmp_path) == before
        # The table export alike.
        tfile = tmp_path / "t.json"
        tfile.write_text(json.dumps(_table_dict()))
        before = _tree(tmp_path)
        assert needle in _refused(["export", "--table", str(tfile), "--no-build",
                                   "--out", str(out)])
        assert _tree(tmp_path) == before
        tfile.unlink()


def test_the_single_kernel_export_checks_out_before_the_study(tmp_path: Path) -> None:
    (tmp_path / "existing.txt").write_text("x")
    line = _refused(["export", "--study", "no-such-study", "--out",
                     str(tmp_path / "existing.txt" / "sub")])
    assert "existing.txt is not a folder" in line  # refused before the study, so before nvcc


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc (a folder none can write)")
def test_the_single_kernel_export_fails_on_out_before_compiling(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.problem import ProblemClass
    from tuner.search import study, trials
    from tuner.ship import export

    trial = SimpleNamespace(number=3, user_attrs={"config": {}})
    monkeypatch.setattr(trials, "pick_trial", lambda *a: (None, trial))
    monkeypatch.setattr(study, "trial_class", lambda t: ProblemClass())

    def no_compile(*a: Any, **k: Any) -> Any:
        raise AssertionError("compiled before checking --out")

    monkeypatch.setattr(export, "varlen_why_not", no_compile)
    line = _refused(["export", "--study", "s", "--out", "/proc/ewx"])
    assert "/proc/ewx" in line


def test_bundle_out_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "existing.txt").write_text("x")
    assert "is not a folder" in _refused(["bundle", "--out",
                                          str(tmp_path / "existing.txt" / "sub")])
    if Path("/proc").is_dir():
        assert "/proc/x" in _refused(["bundle", "--out", "/proc/x"])
    assert not Path("/proc/x").exists()


# ---- --artifacts ---------------------------------------------------------------------------
def test_open_store_takes_only_what_it_supports(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file.txt").write_text("x")
    cases = [
        ("ftp://x", "the ftp:// scheme is not supported; give a folder every host mounts"),
        ("https://host/store", "the https:// scheme is not supported"),
        ("/nonexistent/dir", "/nonexistent/dir does not exist: the store is a folder every host"),
        (str(tmp_path / "missing"), "create it (or mount the share)"),
        ("missing", "missing does not exist"),
        (f"file://{tmp_path / 'missing'}", "does not exist"),
        ("file://relative/dir", "a file URL names an absolute path"),
        (str(tmp_path / "file.txt"), "is not a folder"),
        ("s3://", "give s3://BUCKET"),
        ("s3://bucket/prefix", "give s3://BUCKET"),
    ]
    for url, needle in cases:
        with pytest.raises(SearchError) as e:
            open_store(url)
        assert needle in str(e.value) and "\n" not in str(e.value), (url, str(e.value))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]  # no ./ftp:/x, ...
    assert not Path("/nonexistent").exists()
    (tmp_path / "store").mkdir()
    for url in (str(tmp_path / "store"), f"file://{tmp_path / 'store'}", "store"):
        assert type(open_store(url)).__name__ == "FileSystemArtifactStore"


def test_a_compile_only_worker_refuses_an_unsupported_store(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_search import make, url_for

    make(tmp_path, {"block_n": [64, 128]}, trials=1)  # a study a worker can join
    monkeypatch.chdir(tmp_path)
    for url, needle in (("ftp://nope", "ftp:// scheme is not supported"),
                        (str(tmp_path / "nope"), "does not exist")):
        line = _refused(["worker", "--study", "t", "--storage", url_for(tmp_path),
                         "--compile-only", "--artifacts", url, "--trials", "1"])
        assert needle in line, line
    assert not (tmp_path / "ftp:").exists() and not (tmp_path / "nope").exists()


def test_errors_here_are_user_errors() -> None:
    assert issubclass(dispatch.DispatchError, FaTuneError)
