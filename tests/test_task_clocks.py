"""The lab's task clocks (FA_TUNE_LAB_TASK_CLOCKS): the build exports its reader and keeps the
kernel free of local memory; the summary reads CTA ends, the tail and the time per task right.
The GPU reads real stamps through scripts/kernel_lab.py (lab/h200/s32.sh clocks)."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import task_clocks  # noqa: E402

DEFINES = {task_clocks.DEFINE: 1}


def _artifacts() -> list:
    from prebuild import Artifact

    from tuner.kernel.config import load_preset
    from tuner.problem import ProblemClass

    return [Artifact.of(load_preset("llama3"), ProblemClass(varlen=True), defines=DEFINES)]


@pytest.mark.builds(lambda: _artifacts())
def test_the_lab_build_exports_its_reader_and_the_product_not(session_cache: Path) -> None:
    from tuner.kernel import build
    from tuner.kernel.config import load_preset
    from tuner.problem import ProblemClass

    cfg, pclass = load_preset("llama3"), ProblemClass(varlen=True)
    lab = build.build_config(cfg, defines=DEFINES, pclass=pclass)
    assert lab.sass_checked and lab.sass["ldl"] == 0 and lab.sass["stl"] == 0
    assert lab.wgmma_serialized is None
    assert hasattr(ctypes.CDLL(lab.so_path), "fa_tune_lab_task_clocks")
    product = build.build_config(cfg, pclass=pclass)
    assert product.key != lab.key
    assert not hasattr(ctypes.CDLL(product.so_path), "fa_tune_lab_task_clocks")


def made_up_stamps() -> tuple[np.ndarray, np.ndarray]:
    """A test fixture, not a GPU's: three CTAs on SMs 0-2 starting at t = 1000 ns. CTA 0 runs
    tasks of 10 and 20 us, CTA 1 one of 40 us, CTA 2 two of 5 us and one of 10 us."""
    clocks = np.zeros((task_clocks.CTAS, task_clocks.SLOTS), dtype=np.uint64)
    tasks = np.zeros((task_clocks.CTAS, task_clocks.SLOTS), dtype=np.uint32)
    end = task_clocks.SLOTS - 1
    for cta, starts_us, end_us in ((0, [0, 10], 30), (1, [0], 40), (2, [2, 7, 12], 22)):
        clocks[cta, 0] = len(starts_us) | (cta << 32)
        for k, s in enumerate(starts_us):
            clocks[cta, 1 + k] = 1000 + s * 1000
        clocks[cta, end] = 1000 + end_us * 1000
    return clocks, tasks


def test_the_summary_reads_ends_tail_and_tasks() -> None:
    s = task_clocks.summary(*made_up_stamps())
    assert s["ctas"] == 3 and s["tasks"] == 6 and s["sms"] == 3
    assert s["makespan_us"] == pytest.approx(40.0)
    assert s["end_us"] == pytest.approx([22.0, 30.0, 40.0])
    assert s["tail_idle"] == pytest.approx(1 - (30 + 40 + 22) / 3 / 40)
    assert s["last_first_start_us"] == pytest.approx(2.0)
    assert s["task_us"] == pytest.approx([5.0, 10.0, 40.0])
    assert "3 CTAs on 3 SMs, 6 tasks, makespan 40.0 us" in task_clocks.line(s)


def test_no_stamps_is_said_plainly() -> None:
    empty = np.zeros((task_clocks.CTAS, task_clocks.SLOTS), dtype=np.uint64)
    s = task_clocks.summary(empty, empty.astype(np.uint32))
    assert s == {"ctas": 0}
    assert "no stamps" in task_clocks.line(s)
