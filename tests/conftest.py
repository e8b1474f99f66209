"""Shared test setup.

* Tests marked ``gpu`` are skipped unless cuda-python sees an sm_90 GPU.
* Every test session builds into its own studies folder (FA_TUNE_STUDIES), shared by all tests
  of the session so a config compiled once is a cache hit afterwards; set FA_TUNE_STUDIES
  yourself to keep the cache between sessions.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

_SESSION_STUDIES: tempfile.TemporaryDirectory[str] | None = None


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


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SESSION_STUDIES is not None:
        _SESSION_STUDIES.cleanup()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    if _sm90_visible():
        return
    skip = pytest.mark.skip(reason="needs an sm_90 GPU (none visible to cuda-python)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture
def data_dir() -> Path:
    return Path(__file__).parent / "data"


@pytest.fixture
def studies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private, empty studies folder for tests that count compiles or cache entries."""
    root = tmp_path / "studies"
    monkeypatch.setenv("FA_TUNE_STUDIES", str(root))
    return root
