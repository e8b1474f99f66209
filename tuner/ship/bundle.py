"""`fa-tune bundle`: a wheelhouse for a GPU host without network (fa-tune's wheel, built from a
copy of the checkout, and every dependency's for the target Python and manylinux x86_64)."""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from tuner import _paths, child_process
from tuner.errors import BundleError
from tuner.ship.export import out_problem

# Wheels for a GPU host without network: manylinux x86_64, glibc 2.17 .. 2.34.
BUNDLE_PLATFORMS = (
    "manylinux_2_34_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)


def _pip(args: list[str], what: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    p = child_process.run(cmd)
    if p.returncode != 0:
        lines = [ln for ln in (p.stderr + p.stdout).splitlines() if "ERROR" in ln] or [
            ln for ln in p.stderr.splitlines() if ln.strip()
        ]
        raise BundleError(f"{what} failed: {lines[0].strip() if lines else p.returncode}")


# What the wheel is built from (pyproject.toml, setup.py and the data folders setup.py copies).
WHEEL_SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "tuner", "templates",
                 "cuda_src", "search_spaces", "workloads")


def _wheel_sources(dest: Path) -> Path:
    """A copy of the checkout's wheel sources in ``dest`` (no caches, no build leftovers)."""
    root = _paths.data_root()
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "*.so")
    dest.mkdir(parents=True)
    for name in WHEEL_SOURCES:
        p = root / name
        if p.is_dir():
            shutil.copytree(p, dest / name, ignore=skip)
        elif p.is_file():
            shutil.copy2(p, dest / name)
    return dest


# Extras a wheelhouse may carry (pyproject's optional dependencies that GPU hosts run with).
BUNDLE_EXTRAS = ("postgres", "peers", "torch", "hf")


def write_bundle(out: Path, python: str, extras: list[str],
                 say: Callable[[str], None] = lambda _line: None) -> tuple[int, str]:
    """Fill the new or empty folder ``out``; returns how many wheels it holds and the
    requirement to install on the GPU host (``fa-tune[postgres]``)."""
    if not re.fullmatch(r"3\.\d{1,2}", python):
        raise BundleError(f"--python must look like 3.12 (got '{python}')")
    extras = sorted(set(extras))
    for e in extras:
        if e not in BUNDLE_EXTRAS:
            raise BundleError(f"unknown --extra '{e}'; choose from {', '.join(BUNDLE_EXTRAS)}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BundleError(f"{out} exists and is not an empty folder; choose a new --out")
    if not _paths.is_source_checkout() or not (_paths.data_root() / "pyproject.toml").is_file():
        raise BundleError("bundle builds fa-tune's wheel and needs a source checkout of fa-tune")
    if not out.exists():
        why = out_problem(out)
        if why is not None:
            raise BundleError(f"{why}; choose another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BundleError(f"cannot create {out}: {e.strerror or e}; choose another --out"
                          ) from None
    with tempfile.TemporaryDirectory(prefix="fa-tune-bundle-") as tmp:
        say("building the fa-tune wheel ...")
        # From a copy: a build in the checkout would leave build/ and fa_tune.egg-info there.
        src = _wheel_sources(Path(tmp) / "src")
        _pip(["wheel", str(src), "--no-deps", "-w", str(Path(tmp) / "wheel")], "pip wheel")
        [whl] = list((Path(tmp) / "wheel").glob("fa_tune-*.whl"))
        try:
            shutil.copy2(whl, out / whl.name)
        except OSError as e:
            raise BundleError(f"cannot write {out / whl.name}: {e.strerror or e}") from None
    say(f"downloading dependencies for CPython {python} manylinux x86_64 ...")
    plat = [a for p in BUNDLE_PLATFORMS for a in ("--platform", p)]
    req = str(out / whl.name) + (f"[{','.join(extras)}]" if extras else "")
    _pip(
        ["download", req, "-d", str(out), "--only-binary=:all:",
         "--python-version", python, "--implementation", "cp", *plat],
        "pip download",
    )
    n = len(list(out.glob("*.whl")))
    return n, "fa-tune" + (f"[{','.join(extras)}]" if extras else "")
