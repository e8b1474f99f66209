"""A lab build's task clocks (FA_TUNE_LAB_TASK_CLOCKS, cuda_src/lab/hooks.cuh): read back and
summed up per launch. Each CTA's first consumer thread stamps %globaltimer as each of its tasks
starts and as the CTA ends; these say whether a schedule loses time to its tail (CTAs idle while
others finish), to its tasks (each slower), or to its start (CTAs that begin late).

scripts/kernel_lab.py --task-clocks calls `reset` before a variant is timed and `read` after;
`summary` is the report (pure NumPy: tests/test_task_clocks.py feeds it made-up stamps)."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np

CTAS, SLOTS = 1024, 256  # kLabClockCtas, kLabClockSlots in cuda_src/lab/hooks.cuh
DEFINE = "FA_TUNE_LAB_TASK_CLOCKS"


def _fn(so: Path) -> Any:
    fn = ctypes.CDLL(str(so)).fa_tune_lab_task_clocks
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    return fn


def reset(so: Path) -> None:
    """Zero the stamps, so rows of CTAs outside the next launch's grid read as absent."""
    if (e := _fn(so)(None, None, 1)) != 0:
        raise RuntimeError(f"fa_tune_lab_task_clocks: CUDA error {e}")


def read(so: Path) -> tuple[np.ndarray, np.ndarray]:
    """The last launch's stamps: clocks [CTAS, SLOTS] uint64 and tasks [CTAS, SLOTS] uint32."""
    clocks = np.zeros((CTAS, SLOTS), dtype=np.uint64)
    tasks = np.zeros((CTAS, SLOTS), dtype=np.uint32)
    if (e := _fn(so)(clocks.ctypes.data, tasks.ctypes.data, 0)) != 0:
        raise RuntimeError(f"fa_tune_lab_task_clocks: CUDA error {e}")
    return clocks, tasks


def summary(clocks: np.ndarray, tasks: np.ndarray) -> dict[str, Any]:
    """Per launch, in microseconds from the first task's start: the CTAs' ends (min, median,
    max), the share of CTA time spent idle after a CTA's last task while others still run
    (the tail), the latest first start (the launch's skew), and the time per task."""
    rows = np.flatnonzero(clocks[:, SLOTS - 1])
    if rows.size == 0:
        return {"ctas": 0}
    n = (clocks[rows, 0] & np.uint64(0xFFFFFFFF)).astype(np.int64)
    first = clocks[rows, 1].astype(np.int64)
    end = clocks[rows, SLOTS - 1].astype(np.int64)
    t0 = int(first[n > 0].min()) if (n > 0).any() else int(end.min())
    end_us = (end - t0) / 1e3
    makespan = float(end_us.max())
    per_task: list[float] = []
    for i, r in enumerate(rows):
        k = int(min(n[i], SLOTS - 2))
        if k == 0:
            continue
        stamps = np.append(clocks[r, 1:1 + k].astype(np.int64), end[i])
        per_task.extend((np.diff(stamps) / 1e3).tolist())
    pt = np.array(per_task) if per_task else np.zeros(1)
    return {
        "ctas": int(rows.size),
        "tasks": int(n.sum()),
        "makespan_us": makespan,
        "end_us": [float(end_us.min()), float(np.median(end_us)), makespan],
        "tail_idle": float(1 - end_us.mean() / makespan) if makespan > 0 else 0.0,
        "last_first_start_us": float((first[n > 0] - t0).max() / 1e3) if (n > 0).any() else 0.0,
        "task_us": [float(pt.min()), float(np.median(pt)), float(pt.max())],
        "sms": int(np.unique(clocks[rows, 0] >> np.uint64(32)).size),
    }


def line(s: dict[str, Any]) -> str:
    if not s.get("ctas"):
        return "task clocks: no stamps (not a FA_TUNE_LAB_TASK_CLOCKS build?)"
    e, t = s["end_us"], s["task_us"]
    return (f"task clocks: {s['ctas']} CTAs on {s['sms']} SMs, {s['tasks']} tasks, makespan "
            f"{s['makespan_us']:.1f} us; CTA ends {e[0]:.1f} / {e[1]:.1f} / {e[2]:.1f} us "
            f"(tail idle {s['tail_idle']:.1%}); last first start {s['last_first_start_us']:.1f} "
            f"us; per task {t[0]:.1f} / {t[1]:.1f} / {t[2]:.1f} us")
