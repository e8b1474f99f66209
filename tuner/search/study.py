"""Study storage and reading: Optuna RDB URLs, opening storage, loading a study, its best trial.

Shared by ``fa-tune search`` (tuner/search/loop.py) and the commands that read a study back
(show, export, profile, ``compare --study``), which import only this module: reading a study
needs neither the search loop nor the GPU worker.

Default storage is ``sqlite:///<studies>/<study>.db`` (SQLite in WAL mode, a 60 s busy
timeout: several writer processes of one host, ``fa-tune search --gpus``, share it); any
SQLAlchemy URL Optuna's RDBStorage takes works (PostgreSQL for several hosts; ``postgresql://``
uses the installed driver). Every storage opened here retries its calls while the database is
unreachable, and a search's also heartbeats its trials (tuner/search/rdb.py). "Best" always means
the highest ``confirmed`` number (the full protocol, tuner/search/policy.py) over COMPLETE trials.

A storage URL is checked before Optuna sees it (check_storage_url): a bare path, an in-memory
SQLite database (a study there is lost at exit) and URL arguments pysqlite would ignore are one
line. Commands that only read a study (load_existing_study) never write to the database they
are pointed at: an SQLite file is read first, read-only, and one that is missing, empty, no
SQLite database or without Optuna's tables is one line naming the file, left as it was.
"""

from __future__ import annotations

import logging
import os
import random
import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuner import _paths
from tuner.errors import FaTuneError, SearchError
from tuner.problem import DEFAULT_CLASS, Problem, ProblemClass

DEFAULT_STUDY = "default"


def check_study_name(name: str) -> str:
    """The name itself (it becomes a file name under studies/), else one SearchError line."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", name or ""):
        raise SearchError(
            f"bad study name '{name}': use letters, digits, '.', '_' or '-' (at most 100)"
        )
    return name


def default_storage_url(study: str) -> str:
    return f"sqlite:///{_paths.studies_root() / f'{study}.db'}"


def storage_url(study: str, storage: str | None) -> str:
    return storage if storage else default_storage_url(check_study_name(study))


def redact(url: str) -> str:
    """The URL without its password (for messages and stored records)."""
    return re.sub(r"//([^:/@]+):[^@/]*@", r"//\1:***@", url)


def quiet_optuna() -> None:
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # The heartbeat (tuner/search/rdb.py) is Optuna's, used through ask/tell: its "experimental"
    # notes and its advice to use study.optimize would print on every ask and every beat.
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
    # RDBStorage logs any error of its batched trial read (with the SQL, several lines) before
    # its slower fallback, which raises the same error again if it is real: one line is ours.
    rdb_log = logging.getLogger("optuna.storages._rdb.storage")
    if _drop_fallback_note not in rdb_log.filters:
        rdb_log.addFilter(_drop_fallback_note)


def _drop_fallback_note(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Caught an error from sqlalchemy")


def driver_url(url: str) -> str:
    """The SQLAlchemy URL with the PostgreSQL driver named: a plain ``postgresql://`` means
    psycopg 3 to SQLAlchemy 2.1 but psycopg2 to 2.0; fa-tune's ``postgres`` extra installs
    psycopg2, so that one is taken when present."""
    import importlib.util

    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("postgresql", "postgres"):
        return url
    for module, driver in (("psycopg2", "psycopg2"), ("psycopg", "psycopg")):
        if importlib.util.find_spec(module) is not None:
            return f"postgresql+{driver}://{rest}"
    raise SearchError(f"cannot open study storage {redact(url)}: no PostgreSQL driver; "
                      "pip install 'fa-tune[postgres]'")


# ---- checking a storage URL before Optuna opens it --------------------------------------------
URL_FORMS = ("sqlite:////abs/path/study.db (SQLite: four slashes before an absolute path) or "
             "postgresql://user:password@host/db")
# Query arguments pysqlite itself takes; any other is ignored (with a SAWarning) unless uri=true.
_PYSQLITE_ARGS = {"timeout", "isolation_level", "detect_types", "check_same_thread",
                  "cached_statements", "uri"}
# Tables an Optuna storage has once RDBStorage set it up (create_all, then its version
# records): with all three, opening it writes nothing.
_OPTUNA_TABLES = {"studies", "version_info", "alembic_version"}


def check_storage_url(url: str) -> Any:
    """The parsed SQLAlchemy URL, else one SearchError line: not a URL (a bare path), an
    in-memory SQLite database, or SQLite URL arguments pysqlite would ignore."""
    from sqlalchemy.engine import make_url

    try:
        u = make_url(url) if "://" in url else None
    except Exception:  # noqa: BLE001 - sqlalchemy's ArgumentError and friends
        u = None
    if u is None:
        hint = (f"for the SQLite file {os.path.abspath(url)} give "
                f"sqlite:///{os.path.abspath(url)}" if url and "://" not in url else
                f"give {URL_FORMS}")
        raise SearchError(f"storage '{redact(url)}' is not a database URL: {hint}")
    if u.get_backend_name() != "sqlite":
        return u
    uri = str(u.query.get("uri", "")).lower() in ("1", "true")
    db = u.database or ""
    if db in ("", ":memory:") or (uri and (db.startswith("file::memory:") or
                                          u.query.get("mode") == "memory")):
        raise SearchError(f"storage {url} is an in-memory SQLite database: a study there is lost "
                          "when fa-tune exits; give a file, e.g. sqlite:////abs/path/study.db")
    ignored = sorted(set(u.query) - _PYSQLITE_ARGS)
    if ignored and not uri:
        raise SearchError(
            f"storage {url}: SQLite URL argument(s) {', '.join(ignored)} would be ignored "
            f"without uri=true; give sqlite:///{os.path.abspath(db)} (commands that only read "
            "a study never write to it), or the SQLite URI form sqlite:///file:/abs/path.db"
            "?mode=ro&uri=true")
    return u


def sqlite_path(url: str) -> Path | None:
    """The file an SQLite storage URL names, as given (relative to the current folder when
    the URL has three slashes); None for any other database."""
    from urllib.parse import unquote, urlsplit

    u = check_storage_url(url)
    if u.get_backend_name() != "sqlite":
        return None
    db = u.database or ""
    if db.startswith("file:") and str(u.query.get("uri", "")).lower() in ("1", "true"):
        db = unquote(urlsplit(db).path)
    return Path(db)


def _where(path: Path) -> str:
    """The file's absolute path, and how a relative one came about."""
    if path.is_absolute():
        return str(path)
    return (f"{os.path.abspath(path)} (sqlite:/// then a relative path is relative to the "
            f"current folder; four slashes for an absolute path: sqlite:////abs/path.db)")


# SQLite files this process has checked and opened. A file is read (its header, with open())
# only before this process holds a connection to it: POSIX drops all of a process's locks on a
# file when any of its descriptors of that file closes, so reading it beside a live connection
# let another process's writer corrupt the database (two workers on one study, 2026-12-06).
_OPENED: set[str] = set()


def _opened(path: Path) -> bool:
    return str(path.resolve()) in _OPENED


def _sqlite_tables(path: Path) -> dict[str, set[str]]:
    """The tables of an SQLite file and their column names, read without writing anything
    (not even the -wal/-shm files a WAL-mode file gets from a plain reader); SearchError if
    the file is no SQLite database or cannot be read. Never for a file this process holds
    open (_OPENED)."""
    from urllib.parse import quote

    assert not _opened(path), path
    try:
        with path.open("rb") as f:
            head = f.read(100)
    except OSError as e:
        raise SearchError(f"cannot read {_where(path)}: {e.strerror or e}") from None
    if not head.startswith(b"SQLite format 3\x00"):
        raise SearchError(f"{_where(path)} is not an SQLite database; give the URL of a study "
                          "database (sqlite:////abs/path/study.db)")
    # A WAL-mode file without a -wal file has no open connection and all its data in the file
    # itself: read it as immutable (a mode=ro reader would create -wal and -shm next to it).
    idle_wal = len(head) > 18 and head[18] == 2 and not Path(f"{path}-wal").exists()
    uri = f"file:{quote(str(path.resolve()))}?mode=ro" + ("&immutable=1" if idle_wal else "")
    try:
        con = sqlite3.connect(uri, uri=True, timeout=10)
        try:
            names = [str(r[0]) for r in con.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")]
            return {n: {str(c[1]) for c in con.execute("SELECT * FROM pragma_table_info(?)",
                                                       (n,))} for n in names}
        finally:
            con.close()
    except sqlite3.Error as e:
        raise SearchError(f"cannot read the SQLite database {_where(path)} ({e}); give the URL "
                          "of a study database fa-tune created") from None


def _not_optunas(tables: dict[str, set[str]]) -> list[str]:
    """Tables named as Optuna's but without the key columns Optuna's have always had (another
    application's ``studies``, say)."""
    from optuna.storages._rdb import models

    keys = {name: {c.name for c in t.primary_key.columns}
            for name, t in models.BaseModel.metadata.tables.items()}
    keys["alembic_version"] = {"version_num"}
    return sorted(n for n, cols in tables.items() if n in keys and not keys[n] <= cols)


def check_study_file(url: str, study: str | None = None) -> None:
    """For an SQLite URL, that its file holds an Optuna storage: it exists, is an SQLite
    database and has Optuna's tables; else one SearchError line naming the file. Read-only:
    the file is left exactly as it was. Other databases are not checked here."""
    path = sqlite_path(url)
    if path is None or _opened(path):
        return
    make = (f"run `fa-tune search --study {study} --storage {url}` first" if study else
            "create a study there with `fa-tune search --storage URL` first")
    if not path.exists():
        raise SearchError(f"no fa-tune study database at {_where(path)}; {make}")
    if path.is_dir():
        raise SearchError(f"{_where(path)} is a folder; give the URL of a study database file "
                          "(sqlite:////abs/path/study.db)")
    if path.stat().st_size == 0:
        raise SearchError(f"{_where(path)} is empty, no fa-tune study database; {make}")
    tables = _sqlite_tables(path)
    missing = sorted(_OPTUNA_TABLES - set(tables))
    if missing:
        why = f"it has no {' or '.join(missing)} table"
    elif wrong := _not_optunas(tables):
        why = f"its {', '.join(wrong)} table is not Optuna's"
    else:
        return
    raise SearchError(f"{_where(path)} is not an Optuna study database ({why}); give the URL "
                      "of a study database fa-tune created")


def _check_new_sqlite_file(path: Path) -> None:
    """A study may be created in an SQLite file that is new, empty, or an Optuna storage
    already; another application's database is refused, so its file is never changed."""
    if _opened(path) or not path.is_file() or path.stat().st_size == 0:
        return
    from optuna.storages._rdb import models

    # Any table but Optuna's: a storage Optuna is still setting up (its tables come one by
    # one, another worker of the fleet may be at it) is not refused.
    tables = _sqlite_tables(path)
    foreign = sorted(t for t in set(tables) - set(models.BaseModel.metadata.tables)
                     if t != "alembic_version" and not t.startswith("sqlite_"))
    foreign += _not_optunas(tables)
    if foreign:
        raise SearchError(f"{_where(path)} is another application's SQLite database (tables "
                          f"{', '.join(foreign[:5])}); give a new file for the study, e.g. "
                          "sqlite:////abs/path/study.db")


# ---- opening a storage ------------------------------------------------------------------------
def open_storage(url: str, *, create_dirs: bool = True, heartbeat_s: int | None = None,
                 grace_s: int | None = None, notify: Callable[[str], None] | None = None) -> Any:
    """An Optuna RDBStorage for url (tuner/search/rdb.py: calls retried while the database is
    unreachable); an unreachable or malformed URL is one SearchError line. With
    ``heartbeat_s``, trials of workers that stop beating for ``grace_s`` fail and are
    re-enqueued (rdb.TrialHeartbeat, rdb.RequeueStaleTrial).

    ``create_dirs=False`` opens a storage that must exist: no folder, file or table is created
    (an SQLite file is checked read-only first, check_study_file)."""
    from tuner.search import rdb

    quiet_optuna()
    path = sqlite_path(url)
    if path is not None and create_dirs:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SearchError(
                f"cannot open study storage {url}: cannot create {path.parent}: "
                f"{e.strerror or e}"
            ) from None
        _check_new_sqlite_file(path)
    elif path is not None:
        check_study_file(url)
    beat: dict[str, Any] = {}
    if heartbeat_s:
        beat = {"heartbeat_interval": int(heartbeat_s),
                "grace_period": int(grace_s or 6 * heartbeat_s),
                "heartbeat_stale_trial_callback": rdb.RequeueStaleTrial(max_retry=rdb.MAX_RETRY)}
    for attempt in range(CREATE_TRIES):
        try:
            storage = rdb.ResilientRDBStorage(driver_url(url), display_url=redact(url),
                                              notify=notify, engine_kwargs=_engine_kwargs(url),
                                              skip_table_creation=not create_dirs, **beat)
            break
        except SearchError:
            raise
        except Exception as e:  # noqa: BLE001 - sqlalchemy / driver errors of every kind
            # Workers started together on a new database race to create its tables: the
            # loser's CREATE or version row fails; a moment later the tables are there.
            if create_dirs and attempt + 1 < CREATE_TRIES and _creation_race(e):
                time.sleep(random.uniform(0.2, 1.0))
                continue
            raise SearchError(f"cannot open study storage {redact(url)}: "
                              f"{_open_failure(e, url, path, create_dirs)}") from None
    if path is not None:
        _sqlite_wal(storage.engine)
        _OPENED.add(str(path.resolve()))
    return storage


CREATE_TRIES = 5
_RACE_WORDS = ("already exists", "unique constraint failed", "duplicate key value")


def _creation_race(e: BaseException) -> bool:
    from tuner.search.rdb import error_chain

    return any(w in str(x).lower() for x in error_chain(e) for w in _RACE_WORDS)


def _open_failure(e: BaseException, url: str, path: Path | None, create: bool) -> str:
    """Why RDBStorage could not open url, and what to do, in one line."""
    from sqlalchemy import exc as sa

    from tuner.search.rdb import db_refused, error_chain, first_line

    chain = error_chain(e)
    if any(isinstance(x, (ImportError, sa.NoSuchModuleError)) for x in chain):
        scheme = url.partition("://")[0]
        what = ("unknown database kind" if any(isinstance(x, sa.NoSuchModuleError)
                                               for x in chain) else "no driver installed for")
        return (f"{what} '{scheme}'; fa-tune supports SQLite "
                "(sqlite:////abs/path/study.db, nothing to install) and PostgreSQL "
                "(postgresql://user:password@host/db: pip install 'fa-tune[postgres]'); another "
                "database Optuna supports needs its driver, e.g. mysql+pymysql:// with "
                "pip install pymysql")
    why = db_refused(e) or first_line(e)  # the database's own words where it gave some
    low = why.lower()
    if path is not None and "unable to open database file" in low:
        return f"cannot open the SQLite file {_where(path)} ({why})"
    if path is not None and "not a database" in low:
        return f"{_where(path)} is not an SQLite database ({why})"
    if not create and ("no such table" in low or ("relation" in low and "does not exist" in low)):
        return (f"{why}: no fa-tune study there; run `fa-tune search --study NAME --storage "
                "URL` first")
    return why


def _sqlite_wal(engine: Any) -> None:
    """Write-ahead log with synchronous=NORMAL on every connection of a SQLite study file.

    Optuna commits each suggested parameter and attribute separately (~30 commits per trial),
    and with SQLite's default rollback journal every commit is a full fsync. On the GPU host the
    ask/tell loop spent ~0.27 s per asked trial, during which the GPU is not fed; WAL took a
    local ask+tell from 74 to 47 ms (docs/PERF.md). WAL is safe for several processes on one
    machine and survives a crash of the tuner; a power loss can lose the last commits but not
    corrupt the file.

    Every transaction starts with BEGIN IMMEDIATE (the write lock, waited for up to the busy
    timeout), not pysqlite's deferred BEGIN at the first write: Optuna reads a row, then writes
    it, in one transaction (a WAITING trial is popped by checking its state, then setting it
    RUNNING), and with the read outside the lock two worker processes popped the same enqueued
    trial and measured it twice (PostgreSQL locks the row: SELECT ... FOR UPDATE).
    """
    from sqlalchemy import event

    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # pysqlite emits no BEGIN of its own: on_begin does
        cur = dbapi_conn.cursor()
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
        finally:
            cur.close()

    def on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    event.listen(engine, "connect", on_connect)
    event.listen(engine, "begin", on_begin)
    engine.dispose()  # connections opened during Optuna's setup reconnect with the pragmas


def _engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": 60}}  # the busy timeout: writers wait their turn
    kw: dict[str, Any] = {"pool_pre_ping": True}
    if driver_url(url).startswith("postgresql+psycopg2://"):
        # An unreachable server fails a connect in 10 s (then rdb retries), and a connection
        # to a host that vanished is found dead in about a minute, not at TCP's two hours.
        kw["connect_args"] = {"connect_timeout": 10, "keepalives": 1, "keepalives_idle": 30,
                              "keepalives_interval": 10, "keepalives_count": 3}
    return kw


def load_existing_study(study: str, storage: str | None) -> Any:
    """An existing study (for show/export/profile/compare/worker --join); unknown study, or a
    storage that holds no Optuna study database, -> one SearchError line, nothing written."""
    import optuna

    url = storage_url(study, storage)
    if not storage:
        path = Path(url[len("sqlite:///"):])
        if not path.is_file():
            known = sorted(p.stem for p in _paths.studies_root().glob("*.db"))
            raise SearchError(
                f"unknown study '{study}' (no {path}); known studies: "
                f"{', '.join(known) or 'none'}"
            )
    check_study_file(url, study)  # before RDBStorage, which would set up tables in any file
    st = open_storage(url, create_dirs=False)
    try:
        return optuna.load_study(study_name=study, storage=st)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(st)]
        raise SearchError(
            f"unknown study '{study}' in {redact(url)}; "
            f"studies there: {', '.join(names) or 'none'}"
        ) from None


# ---- reading trials ---------------------------------------------------------------------------
def trial_problems(t: Any) -> list[Problem]:
    """The problems a trial was measured on (its confirmed ones, else its search's), in order;
    names this fa-tune cannot read are left out."""
    from tuner.problem import as_problem

    conf = t.user_attrs.get("confirmed") or {}
    out = []
    for name in (conf.get("shapes") or t.user_attrs.get("shapes") or {}):
        try:
            out.append(as_problem(name))
        except FaTuneError:
            continue
    return out


def trial_class(t: Any) -> ProblemClass:
    """The problem class (head dim, mask) of the problems a trial was measured on: its kernel
    library's class. D 128, causal when it names none (every study before the kernel family)."""
    classes = {p.problem_class for p in trial_problems(t)}
    return classes.pop() if len(classes) == 1 else DEFAULT_CLASS

