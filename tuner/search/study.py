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
"""

from __future__ import annotations

import re
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


def open_storage(url: str, *, create_dirs: bool = True, heartbeat_s: int | None = None,
                 grace_s: int | None = None, notify: Callable[[str], None] | None = None) -> Any:
    """An Optuna RDBStorage for url (tuner/search/rdb.py: calls retried while the database is
    unreachable); an unreachable or malformed URL is one SearchError line. With
    ``heartbeat_s``, trials of workers that stop beating for ``grace_s`` fail and are
    re-enqueued (rdb.TrialHeartbeat, rdb.RequeueStaleTrial)."""
    from tuner.search import rdb

    quiet_optuna()
    if url.startswith("sqlite:///") and create_dirs:
        path = url[len("sqlite:///"):]
        if path and path != ":memory:":
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise SearchError(
                    f"cannot open study storage {url}: cannot create {Path(path).parent}: "
                    f"{e.strerror or e}"
                ) from None
    beat: dict[str, Any] = {}
    if heartbeat_s:
        beat = {"heartbeat_interval": int(heartbeat_s),
                "grace_period": int(grace_s or 6 * heartbeat_s),
                "heartbeat_stale_trial_callback": rdb.RequeueStaleTrial(max_retry=rdb.MAX_RETRY)}
    try:
        storage = rdb.ResilientRDBStorage(driver_url(url), display_url=redact(url),
                                          notify=notify, engine_kwargs=_engine_kwargs(url),
                                          **beat)
    except SearchError:
        raise
    except Exception as e:  # noqa: BLE001 - sqlalchemy / driver errors of every kind
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise SearchError(f"cannot open study storage {redact(url)}: {first}") from None
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        _sqlite_wal(storage.engine)
    return storage


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
    """An existing study (for show/export/profile); unknown study -> one SearchError line."""
    import optuna

    url = storage_url(study, storage)
    if url.startswith("sqlite:///") and not storage:
        path = Path(url[len("sqlite:///"):])
        if not path.is_file():
            known = sorted(p.stem for p in _paths.studies_root().glob("*.db"))
            raise SearchError(
                f"unknown study '{study}' (no {path}); known studies: "
                f"{', '.join(known) or 'none'}"
            )
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

