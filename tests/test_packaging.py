"""The wheel carries templates/, cuda_src/ and search_spaces/, and an installed copy finds them."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    p = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(out)],
        capture_output=True, text=True,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    [whl] = out.glob("fa_tune-*.whl")
    return whl


def test_wheel_contains_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for rel in ("search_spaces/default.yaml", "search_spaces/presets/baseline.yaml",
                "workloads/llama3-8b.yaml", "workloads/llama3-70b.yaml"):
        assert f"tuner/_data/{rel}" in names
    # The package a workload export ships is copied from the installed tuner/ship/fa_tune_ops.
    assert {"tuner/ship/fa_tune_ops/op.py", "tuner/ship/fa_tune_ops/hf.py",
            "tuner/ship/fa_tune_ops/csrc/attention_op.cpp"} <= names
    for d in ("templates", "cuda_src"):
        src = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / d).rglob("*") if p.is_file()
                     and "__pycache__" not in p.parts)
        assert src and all(f"tuner/_data/{s}" in names for s in src), d
    assert "tuner/cli/__init__.py" in names
    meta = next(n for n in names if n.endswith("entry_points.txt"))
    assert "fa-tune = tuner.entry:main" in zipfile.ZipFile(wheel).read(meta).decode()


def test_installed_copy_finds_its_data(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "from tuner import _paths; from tuner.kernel import config, build; "
        "assert _paths.data_root() == _paths._PKG_DIR / '_data', _paths.data_root(); "
        "assert not _paths.is_source_checkout(); "
        "assert {'baseline', 'default', 'fa3'} <= set(config.list_presets()); "
        "from tuner.ship import workload; "
        "assert workload.load_workload('llama3-8b').attention.Hq == 32; "
        "print(len(build.render(config.load_preset('baseline'))))"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("FA_TUNE_STUDIES", None)
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert int(p.stdout.strip()) > 0
