"""Shared test setup.

* Tests marked ``gpu`` are skipped unless cuda-python sees an sm_90 GPU.
* Every test session builds into its own studies folder (FA_TUNE_STUDIES), shared by all tests
  of the session so a config compiled once is a cache hit afterwards; set FA_TUNE_STUDIES
  yourself to keep the cache between sessions.
* Tests marked ``builds(...)`` name the real kernels they compile (tests/prebuild.py): those of
  the selected tests are compiled into the session's cache by background processes from the
  start of the run, and each marked test waits for its own before it runs. Modules with such
  tests run last, so the compiles overlap the other tests. FA_TUNE_TEST_PREBUILD=0: no
  background builds (each test compiles what it needs when it runs, in collection order).
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import pytest

_SESSION_STUDIES: tempfile.TemporaryDirectory[str] | None = None
_SESSION_CACHE: Path | None = None  # the session's build cache (set in pytest_configure)
_PREBUILD: dict[object, Future] = {}  # Artifact -> its background build
_POOL: ProcessPoolExecutor | None = None


def _sm90_visible() -> bool:
    try:
        from tuner.doctor import has_sm90_gpu

        return has_sm90_gpu()
    except Exception:  # no driver, no cuda-python, broken bindings: no GPU
        return False


def pytest_configure(config: pytest.Config) -> None:
    global _SESSION_STUDIES
    if not os.environ.get("FA_TUNE_STUDIES"):
        _SESSION_STUDIES = tempfile.TemporaryDirectory(prefix="fa-tune-tests-")
        os.environ["FA_TUNE_STUDIES"] = _SESSION_STUDIES.name
    global _SESSION_CACHE
    from tuner import _paths

    _SESSION_CACHE = _paths.cache_root()


def pytest_unconfigure(config: pytest.Config) -> None:
    _stop_prebuild()
    if _SESSION_STUDIES is not None:
        _SESSION_STUDIES.cleanup()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Modules that compile real kernels last (stable otherwise): their compiles, started in
    # the background when the run starts, overlap every other test.
    compiling = {item.module for item in items if item.get_closest_marker("builds")}
    items.sort(key=lambda item: getattr(item, "module", None) in compiling)
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    if _sm90_visible():
        return
    skip = pytest.mark.skip(reason="needs an sm_90 GPU (none visible to cuda-python)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture
def session_cache(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Builds go to the session-wide build cache, whatever FA_TUNE_STUDIES the test has set (a
    test whose studies folder is its own, building kernels other tests build too)."""
    from tuner import _paths

    assert _SESSION_CACHE is not None
    monkeypatch.setattr(_paths, "cache_root", lambda: _SESSION_CACHE)
    return _SESSION_CACHE


def _artifacts(item: pytest.Item) -> list:
    from prebuild import artifacts_of

    return [a for m in item.iter_markers("builds") for a in artifacts_of(m.args)]


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """Start the background builds of every selected test's builds marker, in test order."""
    global _POOL
    if (session.config.option.collectonly or os.environ.get("FA_TUNE_TEST_PREBUILD") == "0"
            or _SESSION_CACHE is None):
        return
    todo: dict[object, None] = {}
    for item in session.items:
        if item.get_closest_marker("skip") is None:
            todo.update(dict.fromkeys(_artifacts(item)))
    if not todo:
        return
    try:
        from tuner.kernel import toolchain

        toolchain.find_nvcc()
    except Exception:  # no nvcc: the tests say so themselves
        return
    from prebuild import build_one, start_worker

    # spawn: the workers start now, with the session's environment (tests may change it later)
    _POOL = ProcessPoolExecutor(max_workers=toolchain.usable_cpus(),
                                mp_context=multiprocessing.get_context("spawn"),
                                initializer=start_worker)
    for a in todo:
        _PREBUILD[a] = _POOL.submit(build_one, a, str(_SESSION_CACHE))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A marked test waits for its background builds (the test then finds them cached)."""
    if not _PREBUILD or item.get_closest_marker("builds") is None:
        return
    for a in _artifacts(item):
        f = _PREBUILD.get(a)
        if f is not None:
            try:
                f.result()
            except Exception:  # a broken pool: the test builds it itself
                pass


def pytest_sessionfinish(session: pytest.Session) -> None:
    _stop_prebuild()


def _stop_prebuild() -> None:
    global _POOL
    if _POOL is not None:
        _POOL.shutdown(wait=True, cancel_futures=True)
        _POOL = None


@pytest.fixture
def data_dir() -> Path:
    return Path(__file__).parent / "data"


@pytest.fixture
def studies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private, empty studies folder for tests that count compiles or cache entries."""
    root = tmp_path / "studies"
    monkeypatch.setenv("FA_TUNE_STUDIES", str(root))
    return root
