"""The Optuna RDB storage several search workers share: connection-loss retry and heartbeat.

A study is a plain Optuna study in an RDBStorage (SQLite on one host, PostgreSQL for several),
so ``optuna.load_study`` and optuna-dashboard open it as they open any other. What fa-tune adds
on top, for workers that run for hours against one database:

* **Retry.** Every storage call that fails because the database cannot be reached (server
  restarted, network cut, connection killed, SQLite still locked past its busy timeout) is
  retried every ``RETRY_EVERY_S`` seconds for up to ``retry_s`` (``FA_TUNE_STORAGE_RETRY_S``,
  default 600). One line goes to ``notify`` when the outage starts and one when the storage
  answers again; past the budget the call raises SearchError (one line, exit 2) and later calls
  fail at once, so a stopping search settles what it can without waiting again. A search
  asked to stop (SIGTERM, Ctrl-C) gives up on the outage at once, the same way. Nothing that
  was committed is lost: a failed call rolled back, and a state change whose commit may have
  reached the server before the connection died is recognised on retry (the trial is already
  in that state). Only a storage that opened once retries: a wrong URL is one line at once.
  An SQLite error that is not about reaching the file (no such table or column, not a
  database, read-only, malformed) is no outage either: one SearchError line at once.
* **Heartbeat.** ``TrialHeartbeat`` records a heartbeat for every trial its process holds open
  (Optuna's RDB heartbeat, the one ``study.optimize`` uses) and, each beat, fails the study's
  stale trials, whose worker stopped beating for ``grace_period`` seconds (kill -9, host lost),
  through Optuna's ``fail_stale_trials``. Its callback, ``RequeueStaleTrial`` (Optuna's
  ``RetryHeartbeatStaleTrialCallback``), enqueues each such trial again as a WAITING trial with
  the same params, so its config is measured later by whichever worker asks next.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from tuner.errors import SearchError

RETRY_EVERY_S = 2.0
DEFAULT_RETRY_S = float(os.environ.get("FA_TUNE_STORAGE_RETRY_S", "600"))
# A stale trial is retried this often at most: a config whose measurement kills its worker's
# host every time must not take every host down in turn.
MAX_RETRY = 2

Notify = Callable[[str], None]
_local = threading.local()  # .no_retry: this thread's storage calls fail at once


def notify_stderr(text: str) -> None:
    sys.stderr.write(f"fa-tune: {text}\n")
    sys.stderr.flush()


# SQLite errors worth waiting out: another process holds the lock past the busy timeout, or
# the file (which opened before: only a ready storage retries) is briefly out of reach.
SQLITE_TRANSIENT = ("database is locked", "database table is locked", "database is busy",
                    "unable to open database file", "disk i/o error", "locking protocol")


def first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return (lines[0] if lines else type(e).__name__)[:200]


def error_chain(e: BaseException | None) -> list[BaseException]:
    """e and the exceptions it chains from, outermost first."""
    out: list[BaseException] = []
    while e is not None and all(e is not x for x in out):
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def connection_lost(e: BaseException | None) -> str | None:
    """The first line of why the database could not be reached, if that is what ``e`` (or an
    exception it chains from) says; None for any other error. An SQLite error counts only if
    it is one of SQLITE_TRANSIENT: "no such table" on a wrong file would never heal."""
    from sqlalchemy import exc as sa

    for x in error_chain(e):
        if isinstance(x, (sa.OperationalError, sa.InterfaceError, sa.DisconnectionError)) or (
                isinstance(x, sa.DBAPIError) and x.connection_invalidated):
            orig = getattr(x, "orig", None) or x
            why = first_line(orig)
            if isinstance(orig, sqlite3.Error) and \
                    not any(t in why.lower() for t in SQLITE_TRANSIENT):
                return None
            return why
    return None


def sqlite_unusable(e: BaseException | None) -> str | None:
    """The first line of an SQLite error that says the file is no study database fa-tune can
    use (wrong schema, not a database, read-only, corrupt), if ``e`` is, or wraps, one; None
    for any other error. Optuna's own exceptions (a duplicated study: an IntegrityError
    underneath) and the transient ones are not."""
    import optuna.exceptions
    from sqlalchemy import exc as sa

    if not isinstance(e, (sa.SQLAlchemyError, optuna.exceptions.StorageInternalError)):
        return None
    for x in error_chain(e):
        orig = getattr(x, "orig", None)
        if isinstance(x, sa.DBAPIError) and isinstance(orig, sqlite3.DatabaseError) \
                and not isinstance(orig, sqlite3.IntegrityError):
            why = first_line(orig)
            return None if any(t in why.lower() for t in SQLITE_TRANSIENT) else why
    return None


def db_refused(e: BaseException) -> str | None:
    """The database's own first line when it refused a statement (Optuna wraps it in a
    StorageInternalError about "invalid data in the commit"); None for other errors."""
    import optuna.exceptions
    from sqlalchemy import exc as sa

    if not isinstance(e, (sa.SQLAlchemyError, optuna.exceptions.StorageInternalError)):
        return None
    db = next((x for x in error_chain(e) if isinstance(x, sa.DBAPIError)), None)
    return None if db is None else first_line(getattr(db, "orig", None) or db)


def unusable_hint(why: str) -> str:
    """What to do about a sqlite_unusable error."""
    low = why.lower()
    if "readonly" in low or "read-only" in low:
        return "fa-tune must write to it: check the file's and its folder's permissions"
    if "full" in low:
        return ("the disk is full: free space and run the command again (what was told before "
                "is stored)")
    if "malformed" in low:
        return ("the database file is damaged: restore it from a copy, or start a new study in "
                "a new file")
    if "not a database" in low:
        return "it is not an SQLite study database: give the URL of a study fa-tune created"
    return ("it is not an Optuna study database fa-tune created: give the URL of one, or a new "
            "file such as sqlite:////abs/path/study.db")


def _retrying(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(self: ResilientRDBStorage, *args: Any, **kwargs: Any) -> Any:
        if not self._ready or getattr(_local, "no_retry", False):
            return fn(self, *args, **kwargs)
        t0: float | None = None
        why = ""
        while True:
            try:
                out = fn(self, *args, **kwargs)
            except optuna.exceptions.UpdateFinishedTrialError:
                # The state change of an earlier attempt was committed, only its answer lost.
                if t0 is not None and fn.__name__ == "set_trial_state_values" and \
                        self._state_is(args, kwargs):
                    self._back(t0)
                    return True
                raise
            except Exception as e:
                lost = connection_lost(e)
                if lost is None:
                    bad = sqlite_unusable(e)
                    if bad is not None:
                        raise SearchError(f"storage {self.display_url} cannot be used ({bad}); "
                                          f"{unusable_hint(bad)}") from None
                    refused = db_refused(e)
                    if refused is not None:  # e.g. a database switched to read-only
                        raise SearchError(
                            f"storage {self.display_url} refused the call ({refused}); what "
                            "was told before is stored: run the command again when the "
                            "database takes it") from None
                    raise
                why = lost
                now = time.monotonic()
                if self._down:
                    raise self._gone(why, 0.0) from None
                if t0 is None:
                    t0 = now
                    self.notify(f"storage {self.display_url} unreachable ({why}); retrying every "
                                f"{RETRY_EVERY_S:g} s for up to {self.retry_s:g} s")
                if now - t0 >= self.retry_s or self.stop_requested():
                    self._down = True
                    raise self._gone(why, now - t0) from None
                try:
                    self.remove_session()  # a session that saw the error starts afresh
                except Exception:  # noqa: BLE001 - the retry decides
                    pass
                time.sleep(RETRY_EVERY_S)
                continue
            if t0 is not None:
                self._back(t0)
            return out

    return call


class ResilientRDBStorage(RDBStorage):
    """Optuna's RDBStorage whose calls outlive a lost database connection (module docstring).

    It stays an RDBStorage, so Optuna caches it, heartbeats through it and fails stale trials
    with it as with its own."""

    def __init__(self, url: str, *, display_url: str | None = None,
                 retry_s: float = DEFAULT_RETRY_S, notify: Notify | None = None,
                 **kwargs: Any) -> None:
        self._ready = False  # the constructor's own calls fail at once (a wrong URL: one line)
        self._down = False
        # A search that was asked to stop does not wait out an outage (set by the search).
        self.stop_requested: Callable[[], bool] = lambda: False
        self.display_url = display_url or url
        self.retry_s = float(retry_s)
        self.notify: Notify = notify or notify_stderr
        super().__init__(url, **kwargs)
        self._ready = True

    def _gone(self, why: str, waited_s: float) -> Exception:
        return SearchError(
            f"storage {self.display_url} unreachable ({why})"
            + (f" for {waited_s:.0f} s" if waited_s else "")
            + "; every trial told before is stored; run the command again when it is back"
        )

    def _back(self, t0: float) -> None:
        self.notify(f"storage {self.display_url} answers again after "
                    f"{time.monotonic() - t0:.0f} s")

    def _state_is(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        trial_id = args[0] if args else kwargs.get("trial_id")
        state = args[1] if len(args) > 1 else kwargs.get("state")
        if trial_id is None:  # get_trial(None) raises: not known
            return False
        try:
            return RDBStorage.get_trial(self, trial_id).state == state
        except Exception:  # noqa: BLE001 - unknown: report the original error
            return False

    def forget_heartbeat(self, trial_id: int) -> None:
        """Drop a trial's heartbeat record (a trial going back to WAITING): when it is asked
        again, hours later maybe, its old heartbeat must not read as a dead worker's."""
        from optuna.storages._rdb import models

        table = models.TrialHeartbeatModel.__table__
        with self.engine.begin() as conn:
            conn.execute(table.delete().where(table.c.trial_id == trial_id))


# Every storage call Optuna makes, through its cache too (_CachedStorage calls the private ones).
_RETRIED = (
    "create_new_study", "delete_study", "set_study_user_attr", "set_study_system_attr",
    "get_study_id_from_name", "get_study_name_from_id", "get_study_directions",
    "get_study_user_attrs", "get_study_system_attrs", "get_all_studies", "create_new_trial",
    "_create_new_trial", "set_trial_param", "_set_trial_param", "get_trial_param",
    "set_trial_state_values", "set_trial_intermediate_value", "set_trial_user_attr",
    "set_trial_system_attr", "get_trial_id_from_study_id_trial_number", "get_trial",
    "get_trial_user_attrs", "get_trial_system_attrs", "get_all_trials", "_get_trials",
    "get_best_trial", "_get_best_trial_id", "record_heartbeat", "_get_stale_trial_ids",
)
for _name in _RETRIED:
    setattr(ResilientRDBStorage, _name, _retrying(getattr(RDBStorage, _name)))
ResilientRDBStorage.forget_heartbeat = _retrying(  # type: ignore[method-assign]
    ResilientRDBStorage.forget_heartbeat)


class RequeueStaleTrial(RetryHeartbeatStaleTrialCallback):
    """Optuna's retry of a heartbeat-stale trial: a WAITING copy with the same params.

    The copy keeps only the user attrs that say which config it is (and where it came from);
    the dead worker's partial measurement (build on its host, screen, owner) stays with the
    failed original. ``retry_of`` names the original."""

    KEEP = ("config", "config_id", "source", "requeued_from")

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        attrs = {k: v for k, v in trial.user_attrs.items() if k in self.KEEP}
        attrs["retry_of"] = trial.number
        owner = trial.user_attrs.get("owner")
        attrs["retry_reason"] = f"no heartbeat from {owner or 'its worker'}"
        trial.user_attrs = attrs
        super().__call__(study, trial)


def stale_failed(t: FrozenTrial) -> bool:
    """A FAIL that no worker told: its worker stopped beating (the heartbeat failed it)."""
    return t.state == TrialState.FAIL and "fail_reason" not in t.user_attrs


class TrialHeartbeat:
    """A daemon thread: every ``interval_s``, a heartbeat for each of ``trial_ids()`` (the
    trials this process holds open), then Optuna's ``fail_stale_trials`` on the study (other
    workers' trials whose heartbeats stopped). Its storage calls never wait out an outage: a
    missed beat is retried on the next one."""

    def __init__(self, study: optuna.Study, storage: RDBStorage, interval_s: float,
                 trial_ids: Callable[[], list[int]]) -> None:
        self.study = study
        self.storage = storage
        self.interval_s = float(interval_s)
        self.trial_ids = trial_ids
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self, trial_id: int) -> None:
        """One heartbeat now (a trial just asked: before anyone can read it as stale)."""
        self.storage.record_heartbeat(trial_id)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fa-tune-heartbeat",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        _local.no_retry = True
        while not self._stop.wait(self.interval_s):
            try:
                for tid in self.trial_ids():
                    self.storage.record_heartbeat(tid)
                # Own beats first: after an outage, this process's trials are fresh again
                # before it looks for stale ones. (Its ExperimentalWarning: study.quiet_optuna.)
                optuna.storages.fail_stale_trials(self.study)
            except Exception:  # noqa: BLE001 - storage away: the next beat tries again
                continue
