"""Copies the top-level data folders into the wheel (tuner/_data/...).

Everything else lives in pyproject.toml. A wheel cannot carry top-level folders, and
templates/, cuda_src/, search_spaces/ and workloads/ must stay top-level in the checkout (docs/
ARCHITECTURE.md), so build_py copies them; tuner/_paths.py looks in the checkout first, then
in tuner/_data.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DATA_DIRS = ("templates", "cuda_src", "search_spaces", "workloads")


class BuildPyWithData(build_py):
    def run(self) -> None:
        super().run()
        here = Path(__file__).resolve().parent
        dest = Path(self.build_lib) / "tuner" / "_data"
        for name in DATA_DIRS:
            src = here / name
            if src.is_dir():
                shutil.rmtree(dest / name, ignore_errors=True)
                shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))


setup(cmdclass={"build_py": BuildPyWithData})
