"""The package type-checks: `mypy tuner` reports nothing. mypy is a developer tool, not one of
the test extra's dependencies (the CI machine installs only those), so this skips without it;
`pip install mypy` to run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_finds_nothing_in_the_package() -> None:
    pytest.importorskip("mypy", reason="mypy is not installed (pip install mypy)")
    p = subprocess.run([sys.executable, "-m", "mypy", "tuner", "--ignore-missing-imports",
                        "--no-error-summary", "--cache-dir", str(ROOT / ".mypy_cache")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
