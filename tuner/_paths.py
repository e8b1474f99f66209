"""Where fa-tune's non-Python files live.

The kernel templates, the shared CUDA sources, the search spaces and the workload files are
top-level folders of the source checkout (``templates/``, ``cuda_src/``, ``search_spaces/``,
``workloads/``). A wheel cannot ship
top-level folders, so ``setup.py`` copies them into ``tuner/_data/`` at build time. We look at
the checkout first (editable installs and ``python -m`` from the repo see the live files), then
at the packaged copy.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

DATA_DIRS = ("templates", "cuda_src", "search_spaces", "workloads")

_PKG_DIR = Path(__file__).resolve().parent


@lru_cache(maxsize=1)
def data_root() -> Path:
    """Folder holding templates/, cuda_src/ and search_spaces/."""
    checkout = _PKG_DIR.parent
    if (checkout / "templates").is_dir() and (checkout / "search_spaces").is_dir():
        return checkout
    packaged = _PKG_DIR / "_data"
    if (packaged / "search_spaces").is_dir():
        return packaged
    # Neither exists: return the checkout so error messages name a sensible path.
    return checkout


def is_source_checkout() -> bool:
    return data_root() == _PKG_DIR.parent


def templates_dir() -> Path:
    return data_root() / "templates"


def cuda_src_dir() -> Path:
    return data_root() / "cuda_src"


def search_spaces_dir() -> Path:
    return data_root() / "search_spaces"


def presets_dir() -> Path:
    return search_spaces_dir() / "presets"


def workloads_dir() -> Path:
    return data_root() / "workloads"


def kernel_template() -> Path:
    return templates_dir() / "fa_fwd_sm90.cu"


def studies_root() -> Path:
    """Default home of caches and results.

    ``FA_TUNE_STUDIES`` wins; a source checkout uses its own ``studies/``; an installed copy uses
    ``./studies`` (the package folder may be read-only).
    """
    env = os.environ.get("FA_TUNE_STUDIES")
    if env:
        return Path(env).expanduser().resolve()
    if is_source_checkout():
        return _PKG_DIR.parent / "studies"
    return Path.cwd() / "studies"


def cache_root() -> Path:
    return studies_root() / "cache"


def results_root() -> Path:
    return studies_root() / "results"
