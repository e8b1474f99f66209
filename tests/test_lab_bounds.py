"""The lab's bounds on a window kernel (cuda_src/lab/hooks.cuh; docs/PERF.md step 77): Q loaded
once and O never stored, and a window's masked tiles taking both masks as before. Each lab build
compiles clean (no local memory, wgmma asynchronous) and changes the kernel it is built from, so
a kernel_lab A/B measures what it says; the product build has its own cache entry. The GPU runs
them through scripts/kernel_lab.py (lab/h200/s43.sh decomp, ab)."""

from __future__ import annotations

from pathlib import Path

import pytest

TRAFFIC = {"FA_TUNE_LAB_Q_LOAD_ONCE": 1, "FA_TUNE_LAB_NO_O_STORE": 1}
BOTH_MASKS = {"FA_TUNE_LAB_WINDOW_BOTH_MASKS": 1}


def _case() -> tuple:
    from tuner.kernel.config import load_preset
    from tuner.problem import ProblemClass

    return load_preset("d64-window-packed"), ProblemClass(head_dim=64, window=True)


def _artifacts() -> list:
    from prebuild import Artifact

    cfg, pclass = _case()
    return [Artifact.of(cfg, pclass, defines=d) for d in (None, TRAFFIC, BOTH_MASKS)]


@pytest.mark.builds(lambda: _artifacts())
def test_each_bound_builds_clean_and_changes_the_kernel(session_cache: Path) -> None:
    from tuner.kernel import build

    cfg, pclass = _case()
    product = build.build_config(cfg, pclass=pclass)
    for defines in (TRAFFIC, BOTH_MASKS):
        lab = build.build_config(cfg, defines=defines, pclass=pclass)
        assert lab.key != product.key, defines
        assert lab.sass_checked and lab.sass["ldl"] == 0 and lab.sass["stl"] == 0, defines
        assert lab.wgmma_serialized is None, defines
        assert lab.sass["instructions"] != product.sass["instructions"], defines
