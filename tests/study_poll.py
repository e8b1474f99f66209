"""Polling a study that another process is still creating, without racing it.

Plain `optuna.load_study` on a database that does not have Optuna's tables yet creates them
and stamps the schema version: done from a test while the search under test creates the same
database, one of the two inserts the version row twice and fails (seen in CI). These helpers
only read until the study's row is there; by then its creator has finished the schema.
"""
from __future__ import annotations

import sqlite3

import optuna
import sqlalchemy

from tuner.search.study import driver_url, sqlite_path


def study_exists(url: str, study: str) -> bool:
    """True once `study` has its row, read without creating a file, a table or a row."""
    query = "SELECT 1 FROM studies WHERE study_name = :name"
    path = sqlite_path(url)  # the product's reading of the URL
    if path is not None:
        if not path.exists():
            return False
        try:
            con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
        except sqlite3.Error:
            return False
        try:
            return con.execute(query.replace(":name", "?"), (study,)).fetchone() is not None
        except sqlite3.Error:  # no table yet, or the creator holds a write lock
            return False
        finally:
            con.close()
    engine = sqlalchemy.create_engine(driver_url(url))
    try:
        with engine.connect() as con:
            return con.execute(sqlalchemy.text(query), {"name": study}).first() is not None
    except sqlalchemy.exc.SQLAlchemyError:
        return False
    finally:
        engine.dispose()


def trials_if_created(url: str, study: str) -> list[optuna.trial.FrozenTrial]:
    """The study's trials, or [] while its creator has not made it yet."""
    if not study_exists(url, study):
        return []
    storage = optuna.storages.RDBStorage(driver_url(url))
    try:
        return optuna.load_study(study_name=study, storage=storage).get_trials()
    finally:
        storage.engine.dispose()
