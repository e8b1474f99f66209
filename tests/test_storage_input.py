"""A wrong --storage is one line, at once, and leaves whatever it points at as it was.

Each case runs the real CLI in a fresh process against real files in tmp_path: an in-memory
SQLite URL, a bare path, another application's SQLite file, an empty or text file, a missing
file, an Optuna file with a wrong schema, a driver that is not installed. The storage retry is
left at 120 s and the process given 60 s, so a case that fell into the outage retry (the
10-minute hang the audit found) fails instead of passing slowly.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from cli_helpers import one_error_line

from tuner.errors import SearchError
from tuner.search import rdb
from tuner.search.study import load_existing_study, open_storage

TIMEOUT_S = 60


def fa_tune(*args: str, cwd: Path, studies: Path) -> tuple[int, str, float]:
    env = {**os.environ, "FA_TUNE_STUDIES": str(studies), "FA_TUNE_STORAGE_RETRY_S": "120"}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", "from tuner.cli import main; main()", *args],
                       capture_output=True, text=True, timeout=TIMEOUT_S, cwd=cwd, env=env)
    return p.returncode, p.stdout + p.stderr, time.monotonic() - t0


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sql(path: Path, *statements: str) -> None:
    """Run statements on an SQLite file and close it (the last connection of a WAL-mode file
    checkpoints it: every byte is in the file itself afterwards)."""
    con = sqlite3.connect(path)
    try:
        for stmt in statements:
            con.execute(stmt)
        con.commit()
    finally:
        con.close()


def make_study(path: Path, name: str = "s1") -> None:
    """A study the way fa-tune search stores it (open_storage: WAL), with one told trial."""
    storage = open_storage(f"sqlite:///{path}")
    st = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    t = st.ask()
    st.tell(t, 1.0)
    storage.engine.dispose()  # closed: the WAL is checkpointed into the file


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """Files a --storage may point at by mistake, none of them an fa-tune study database."""
    d = tmp_path / "files"
    d.mkdir()
    out = {"other": d / "other.db", "app": d / "app.db", "empty": d / "empty.db",
           "text": d / "text.db", "wal": d / "wal.db"}
    sql(out["other"], "CREATE TABLE studies (id INTEGER PRIMARY KEY, label TEXT)",
        "INSERT INTO studies VALUES (1, 'mine')")  # another application's own `studies`
    sql(out["app"], "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    # A WAL-mode file: a plain reader would add -wal and -shm files next to it.
    sql(out["wal"], "PRAGMA journal_mode=WAL", "CREATE TABLE events (id INTEGER)")
    out["empty"].write_bytes(b"")
    out["text"].write_text("name,value\nblock_n,128\n" * 20)
    return out


def check_refused(argv: list[str], expect: str, tmp_path: Path) -> str:
    rc, out, took = fa_tune(*argv, cwd=tmp_path, studies=tmp_path / "studies")
    assert rc == 2, out
    line = one_error_line(out)
    assert len([ln for ln in out.splitlines() if ln.strip()]) == 1, out
    assert "unreachable" not in out and "retrying" not in out, out
    assert expect in line, line
    assert took < TIMEOUT_S / 2, f"{took:.0f} s: {line}"
    return line


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite:///?x=1", "sqlite://",
                                 "sqlite:///:memory:", "sqlite:///file::memory:?uri=true"])
def test_in_memory_sqlite_is_refused_at_once(url: str, tmp_path: Path) -> None:
    line = check_refused(["show", "best", "--study", "s1", "--storage", url],
                         "in-memory SQLite database", tmp_path)
    assert "sqlite:////" in line  # what to give instead


@pytest.mark.parametrize("name, expect", [
    ("other", "is not an Optuna study database"),
    ("app", "is not an Optuna study database"),
    ("wal", "is not an Optuna study database"),
    ("empty", "is empty, no fa-tune study database"),
    ("text", "is not an SQLite database"),
])
def test_read_commands_leave_a_foreign_file_as_it_was(
        name: str, expect: str, files: dict[str, Path], tmp_path: Path) -> None:
    path = files[name]
    before = {p.name: digest(p) for p in path.parent.iterdir()}
    url = f"sqlite:///{path}"
    line = check_refused(["show", "best", "--study", "s1", "--storage", url], expect, tmp_path)
    assert str(path) in line
    # Every command that opens an existing study for reading, on the same file.
    if name == "other":
        for argv in (["show", "trials", "--study", "s1"],
                     ["export", "--study", "s1", "--out", str(tmp_path / "pkg")],
                     ["compare", "--study", "s1", "--shape", "1x2x256"],
                     ["profile", "--study", "s1", "--shape", "1x2x256"],
                     ["worker", "--study", "s1", "--trials", "1"]):
            check_refused([*argv, "--storage", url], expect, tmp_path)
        assert not (tmp_path / "pkg").exists()
    # Byte for byte, and no -wal/-shm/-journal file next to it.
    assert {p.name: digest(p) for p in path.parent.iterdir()} == before


def test_missing_file_is_not_created(tmp_path: Path) -> None:
    path = tmp_path / "none" / "s1.db"
    line = check_refused(["show", "best", "--study", "s1", "--storage", f"sqlite:///{path}"],
                         f"no fa-tune study database at {path}", tmp_path)
    assert "fa-tune search --study s1" in line
    assert not path.parent.exists()


def test_relative_sqlite_url_names_the_resolved_path(tmp_path: Path) -> None:
    line = check_refused(["show", "best", "--study", "s1", "--storage", "sqlite:///sub/s1.db"],
                         f"no fa-tune study database at {tmp_path / 'sub' / 's1.db'}", tmp_path)
    assert "relative to the current folder" in line and "four slashes" in line
    assert not (tmp_path / "sub").exists()


def test_bare_path_says_how_to_write_the_url(tmp_path: Path) -> None:
    path = tmp_path / "s1.db"
    line = check_refused(["show", "best", "--study", "s1", "--storage", str(path)],
                         "is not a database URL", tmp_path)
    assert f"sqlite:///{path}" in line  # the four-slash form of this very file
    assert not path.exists()


def test_sqlite_url_arguments_pysqlite_ignores_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    make_study(path)
    before = digest(path)
    line = check_refused(["show", "best", "--study", "s1", "--storage",
                          f"sqlite:///{path}?mode=ro"], "would be ignored", tmp_path)
    assert "SAWarning" not in line and "uri=true" in line
    assert digest(path) == before


def test_missing_driver_names_what_fa_tune_supports(tmp_path: Path) -> None:
    pytest.importorskip("sqlalchemy")
    try:
        import MySQLdb  # noqa: F401
        pytest.skip("a MySQL driver is installed here")
    except ImportError:
        pass
    line = check_refused(["show", "best", "--study", "s1", "--storage", "mysql://u@h/db"],
                         "no driver installed for 'mysql'", tmp_path)
    assert "SQLite" in line and "PostgreSQL" in line and "pip install" in line


def test_optuna_table_names_with_another_schema_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "foreign.db"
    make_study(path)
    sql(path, "DROP TABLE studies", "CREATE TABLE studies (id INTEGER PRIMARY KEY, label TEXT)")
    before = digest(path)
    check_refused(["show", "best", "--study", "s1", "--storage", f"sqlite:///{path}"],
                  "its studies table is not Optuna's", tmp_path)
    assert digest(path) == before


def test_a_schema_error_past_the_checks_fails_at_once(tmp_path: Path) -> None:
    # The file check passes (Optuna's studies, version_info, alembic_version are there), the
    # trials cannot be read: "no such table" is no outage, so one line, no retry.
    path = tmp_path / "broken.db"
    make_study(path)
    sql(path, "DROP TABLE trial_values")
    before = digest(path)
    line = check_refused(["show", "best", "--study", "s1", "--storage", f"sqlite:///{path}"],
                         "no such table: trial_values", tmp_path)
    assert "cannot be used" in line
    assert digest(path) == before


def test_a_normal_study_still_opens_for_reading(tmp_path: Path) -> None:
    path = tmp_path / "ok.db"
    make_study(path)
    for url, cwd in ((f"sqlite:///{path}", tmp_path), ("sqlite:///ok.db", tmp_path),
                     (f"sqlite:///file:{path}?mode=ro&uri=true", tmp_path)):
        rc, out, _ = fa_tune("show", "trials", "--study", "s1", "--storage", url, cwd=cwd,
                             studies=tmp_path / "studies")
        assert rc == 0, out
        assert "1 complete" in out and "Warning" not in out, out
    rc, out, _ = fa_tune("show", "trials", "--study", "nope", "--storage", f"sqlite:///{path}",
                         cwd=tmp_path, studies=tmp_path / "studies")
    assert "unknown study 'nope'" in one_error_line(out) and "studies there: s1" in out
    assert load_existing_study("s1", f"sqlite:///{path}").trials[0].value == 1.0


# ---- the storage underneath: creating paths, and what the retry retries -----------------------
def test_creating_a_study_refuses_another_applications_file(files: dict[str, Path],
                                                            tmp_path: Path) -> None:
    for name in ("other", "app", "text"):
        before = digest(files[name])
        with pytest.raises(SearchError) as e:
            open_storage(f"sqlite:///{files[name]}")
        assert "\n" not in str(e.value) and str(files[name]) in str(e.value)
        assert digest(files[name]) == before
    # A new file, an empty one and a study database are what a search may create a study in.
    for path in (tmp_path / "new" / "n.db", files["empty"]):
        st = optuna.create_study(study_name="n", storage=open_storage(f"sqlite:///{path}"))
        assert st.study_name == "n" and path.stat().st_size > 0
    open_storage(f"sqlite:///{files['empty']}")  # now an Optuna storage: opens again


def _sa_error(msg: str, orig: Exception) -> Exception:
    from sqlalchemy import exc as sa

    cls = sa.OperationalError if isinstance(orig, sqlite3.OperationalError) else sa.DatabaseError
    return cls("SELECT 1", {}, orig)


@pytest.mark.parametrize("msg, transient", [
    ("database is locked", True),
    ("unable to open database file", True),
    ("disk I/O error", True),
    ("no such table: studies", False),
    ("no such column: studies.study_name", False),
    ('near "FROM": syntax error', False),
    ("attempt to write a readonly database", False),
])
def test_only_transient_sqlite_errors_are_an_outage(msg: str, transient: bool) -> None:
    err = _sa_error(msg, sqlite3.OperationalError(msg))
    wrapped = optuna.exceptions.StorageInternalError("commit failed")
    wrapped.__cause__ = err
    for e in (err, wrapped):
        assert (rdb.connection_lost(e) == msg) is transient
        assert (rdb.sqlite_unusable(e) is None) is transient
    not_db = _sa_error("file is not a database", sqlite3.DatabaseError("file is not a database"))
    assert rdb.connection_lost(not_db) is None
    assert rdb.sqlite_unusable(not_db) == "file is not a database"


def test_a_ready_storage_raises_a_schema_error_at_once(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    make_study(path)
    st = open_storage(f"sqlite:///{path}", create_dirs=False)
    st.retry_s = 120.0
    sql(path, "DROP TABLE trial_values")
    t0 = time.monotonic()
    with pytest.raises(SearchError, match="cannot be used .no such table: trial_values"):
        optuna.load_study(study_name="s1", storage=st).get_trials()
    assert time.monotonic() - t0 < 10


def test_a_file_this_process_holds_open_is_never_read_beside_its_connection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """POSIX drops every lock a process holds on a file when any of its descriptors of that
    file closes: the file check's open() beside a live connection let a second worker corrupt
    the study. The check runs once, before this process's first connection."""
    from tuner.search import study as study_mod

    url = f"sqlite:///{tmp_path / 'held.db'}"
    optuna.create_study(study_name="s", storage=open_storage(url))
    load_existing_study("s", url)  # as `fa-tune worker` does before its search opens it again

    def refuse(path: Path) -> None:
        raise AssertionError(f"{path} read beside this process's live connection")

    monkeypatch.setattr(study_mod, "_sqlite_tables", refuse)
    open_storage(url)
    assert load_existing_study("s", url).study_name == "s"
