"""``fa-tune profile``: Nsight Compute on exactly one tuned kernel, and its headline metrics.

Runs ``ncu --set full --launch-count 1 --kernel-name regex:attention_fwd_kernel --clock-control
none -o studies/profiles/<name>`` on ``python -m tuner.profile_driver`` (one launch of the
trial's cached ``.so``), then reads the report back with ``ncu --import --csv --page details``
(and ``--page raw`` for the tensor-pipe metric, which the details page does not list).
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner import _paths
from tuner.errors import FaTuneError
from tuner.problem import Problem

KERNEL_REGEX = "regex:attention_fwd_kernel"
NCU_TIMEOUT_S = 900

# (label, section, metric name) rows of the details page.
DETAILS_METRICS: tuple[tuple[str, str, str], ...] = (
    ("duration", "GPU Speed Of Light Throughput", "Duration"),
    ("sm_throughput_pct", "GPU Speed Of Light Throughput", "Compute (SM) Throughput"),
    ("memory_throughput_pct", "GPU Speed Of Light Throughput", "Memory Throughput"),
    ("achieved_occupancy_pct", "Occupancy", "Achieved Occupancy"),
    ("l2_hit_rate_pct", "Memory Workload Analysis", "L2 Hit Rate"),
)
# Raw-page metric names for the tensor pipe, most specific first (Hopper's GMMA first).
TENSOR_PIPE_PATTERNS = (
    r"^sm__pipe_tensor_op_gmma_cycles_active\.avg\.pct_of_peak_sustained_active$",
    r"^sm__pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_active$",
    r"^sm__inst_executed_pipe_tensor.*\.avg\.pct_of_peak_sustained_active$",
)
_TIME_UNITS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0,
               "ms": 1.0, "second": 1e3, "s": 1e3}


class ProfileError(FaTuneError):
    """ncu missing, counters not readable, or the report could not be read."""


@dataclass
class Headline:
    kernel_name: str | None = None
    duration_ms: float | None = None
    metrics: dict[str, float | None] = field(default_factory=dict)

    def rows(self) -> list[tuple[str, str]]:
        def pct(key: str) -> str:
            v = self.metrics.get(key)
            return "n/a" if v is None else f"{v:.1f} %"

        return [
            ("kernel", self.kernel_name or "?"),
            ("duration", "n/a" if self.duration_ms is None else f"{self.duration_ms:.4f} ms"),
            ("SM throughput", pct("sm_throughput_pct")),
            ("tensor pipe utilization", pct("tensor_pipe_pct")),
            ("achieved occupancy", pct("achieved_occupancy_pct")),
            ("L2 hit rate", pct("l2_hit_rate_pct")),
            ("memory throughput", pct("memory_throughput_pct")),
        ]


def _num(text: str) -> float | None:
    t = (text or "").strip().replace(",", "")
    try:
        return float(t)
    except ValueError:
        return None


def _csv_rows(text: str) -> list[list[str]]:
    # ncu prints "==PROF==" / "==WARNING==" lines around the CSV; keep only quoted CSV rows.
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    return list(csv.reader(io.StringIO("\n".join(lines))))


def parse_details_csv(text: str) -> Headline:
    """Headline metrics from ``ncu --import R --csv --page details`` (first kernel in it)."""
    rows = _csv_rows(text)
    if not rows:
        raise ProfileError("the ncu report has no kernel rows (did the kernel-name filter match?)")
    head = rows[0]
    try:
        i_kernel = head.index("Kernel Name")
        i_sec = head.index("Section Name")
        i_name = head.index("Metric Name")
        i_unit = head.index("Metric Unit")
        i_val = head.index("Metric Value")
        i_id = head.index("ID")
    except ValueError:
        raise ProfileError("unexpected ncu CSV header (no Section/Metric columns)") from None
    # A metric row ends after its value with a trailing comma (no rule columns): ncu 2025.3.1
    # prints 16 fields under a 20-field header. Keep every row that reaches the value column.
    need = max(i_kernel, i_sec, i_name, i_unit, i_val, i_id)
    body = [r for r in rows[1:] if len(r) > need]
    if not body:
        raise ProfileError("the ncu report has no kernel rows (did the kernel-name filter match?)")
    first = body[0][i_id]
    body = [r for r in body if r[i_id] == first]
    h = Headline(kernel_name=body[0][i_kernel])
    for label, section, name in DETAILS_METRICS:
        match = [r for r in body if r[i_sec] == section and r[i_name] == name] or [
            r for r in body if r[i_name] == name
        ]
        if not match:
            h.metrics[label] = None
            continue
        r = match[0]
        v = _num(r[i_val])
        if label == "duration":
            scale = _TIME_UNITS.get(r[i_unit].strip().lower())
            h.duration_ms = None if v is None or scale is None else v * scale
        else:
            h.metrics[label] = v
    h.metrics.setdefault("tensor_pipe_pct", None)
    return h


def parse_raw_tensor_pipe(text: str) -> float | None:
    """The tensor-pipe utilization (%) from ``--page raw --csv`` (header, units, values)."""
    rows = _csv_rows(text)
    if len(rows) < 3:
        return None
    head, values = rows[0], rows[2]
    for pat in TENSOR_PIPE_PATTERNS:
        for i, name in enumerate(head):
            if re.match(pat, name) and i < len(values):
                v = _num(values[i])
                if v is not None:
                    return v
    return None


def find_ncu() -> Path:
    cands: list[Path] = []
    if shutil.which("ncu"):
        cands.append(Path(shutil.which("ncu") or ""))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            cands.append(Path(os.environ[var]) / "bin" / "ncu")
    cands.append(Path("/usr/local/cuda/bin/ncu"))
    cands += sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu"), reverse=True)
    cands += sorted(Path("/usr/local/cuda").glob("nsight-compute*/ncu"), reverse=True)
    for c in cands:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise ProfileError(
        "Nsight Compute (ncu) not found on PATH, in CUDA_HOME/bin or /opt/nvidia/nsight-compute; "
        "install Nsight Compute (part of the CUDA toolkit) and put ncu on PATH"
    )


def explain_ncu_failure(output: str, rc: int) -> str:
    if "ERR_NVGPUCTRPERM" in output or "permission" in output.lower() and "counter" in output:
        return ("ncu cannot read the GPU performance counters (ERR_NVGPUCTRPERM): run as root "
                "or load the driver with NVreg_RestrictProfilingToAdminUsers=0")
    err = [ln for ln in output.splitlines() if "==ERROR==" in ln]
    if err:
        return f"ncu failed: {err[0].replace('==ERROR==', '').strip()[:300]}"
    if "No kernels were profiled" in output:
        return "ncu profiled no kernel: the kernel-name filter matched nothing"
    return f"ncu failed with exit code {rc}"


def profile_artifact(so_path: str | Path, shape: Problem, name: str,
                     out_dir: Path | None = None) -> tuple[Path, Headline]:
    ncu = find_ncu()
    out_dir = out_dir or _paths.studies_root() / "profiles"
    out_dir.mkdir(parents=True, exist_ok=True)
    rep_base = out_dir / name
    cmd = [str(ncu), "--set", "full", "--launch-count", "1", "--kernel-name", KERNEL_REGEX,
           "--clock-control", "none", "--force-overwrite", "-o", str(rep_base),
           sys.executable, "-m", "tuner.profile_driver", str(so_path),
           str(shape)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=NCU_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        raise ProfileError(f"ncu did not finish within {NCU_TIMEOUT_S} s") from None
    out = p.stdout + p.stderr
    rep = rep_base.with_name(rep_base.name + ".ncu-rep")
    if p.returncode != 0 or not rep.is_file() or "==ERROR==" in out:
        raise ProfileError(explain_ncu_failure(out, p.returncode))
    details = _import(ncu, rep, "details")
    head = parse_details_csv(details)
    try:
        head.metrics["tensor_pipe_pct"] = parse_raw_tensor_pipe(_import(ncu, rep, "raw"))
    except ProfileError:
        pass
    return rep, head


def _import(ncu: Path, rep: Path, page: str) -> str:
    p = subprocess.run([str(ncu), "--import", str(rep), "--csv", "--page", page],
                       capture_output=True, text=True, timeout=NCU_TIMEOUT_S)
    if p.returncode != 0:
        why = explain_ncu_failure(p.stdout + p.stderr, p.returncode)
        raise ProfileError(f"cannot read {rep}: {why}")
    return p.stdout


def profile_trial(study: str, storage: str | None, trial: int | None,
                  shape: Problem) -> dict[str, Any]:
    from tuner.config import KernelConfig, check_problem
    from tuner.export import artifact_for
    from tuner.show import pick_trial

    _, t = pick_trial(study, storage, trial)
    cfg = KernelConfig.from_dict(t.user_attrs.get("config") or {})
    check_problem(cfg, shape)
    find_ncu()  # before any rebuild: the clear line first
    built = artifact_for(t, cfg, shape.causal)  # a library for this problem's mask
    name = f"{study}-trial{t.number}-{shape}"
    rep, head = profile_artifact(built.so_path, shape, name)
    return {"report": rep, "headline": head, "trial": t.number, "config_id": cfg.config_id()}
