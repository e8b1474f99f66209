"""``fa-tune profile``: Nsight Compute on one tuned kernel, or on two side by side.

One ncu run profiles every kernel of the comparison: ``ncu --set full --profile-from-start off
--launch-count N --kernel-name-base demangled --kernel-name regex:... --clock-control none -o
studies/profiles/<name>`` on ``python -m tuner.analysis.profile_driver``, which launches the trial's
kernel, then the other one (another trial's kernel or FlashAttention-3), once each, inside a
cuProfilerStart/Stop range, in that order. ncu numbers the results 0, 1 in launch order, which
is how two launches of ``attention_fwd_kernel`` (trial against trial) are told apart.

The report is read back with ``ncu --import R --csv --page details`` (one row per kernel x
metric, split by the ID column) and ``--page raw --print-units base`` (a header row, a units
row, one row per kernel). Every metric is looked up by name (raw metric name, or section and
metric name on the details page), never by position, so ncu versions that add or drop columns,
or end a metric row with a trailing comma (2025.3.1), read the same.

``--set full`` holds every section the rows below need (SpeedOfLight, ComputeWorkloadAnalysis,
MemoryWorkloadAnalysis(_Tables), WarpStateStats, SchedulerStats, InstructionStats, LaunchStats,
Occupancy) in ncu 2024.x and 2025.x; no ``--metrics`` are added, because a metric name that one
ncu version or chip lacks makes ncu refuse the whole run.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tuner import _paths
from tuner.errors import FaTuneError
from tuner.problem import Problem

NCU_TIMEOUT_S = 900
NCU_SET = ("--set", "full")
# fa-tune's kernel; FlashAttention-3's sm90 forward kernel: flash-attn-4's CuTe DSL names it
# kernel_cutlass_kernel_flash_attncuteflash_fwd...FlashAttentionForwardSm90_... (newer
# releases prefix flash_fwd_sm90_...), the C++ FA3 (flash_attn_interface) cutlass::
# device_kernel<...flash::FlashAttnFwdSm90<...>>, hence --kernel-name-base demangled (the C++
# kernel's function name alone is "device_kernel"). A split-KV combine kernel would match too,
# but it runs after the main kernel, and --launch-count stops at the main one.
KERNEL_PATTERN = "attention_fwd_kernel"
FA3_PATTERNS = ("FlashAttentionForward", "FlashAttnFwd", "flash_fwd")
KERNEL_REGEX = f"regex:{KERNEL_PATTERN}"
TOP_DIFFERENCES = 5  # rows highlighted in a side-by-side
TOP_STALLS = 3  # stall reasons per kernel shown (their union)


class ProfileError(FaTuneError):
    """ncu missing, counters not readable, nothing profiled, or the report could not be read."""


# ---- reading ncu's CSV ---------------------------------------------------------------------------
def _num(text: str | None) -> float | None:
    t = (text or "").strip().replace(",", "")
    try:
        v = float(t)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _csv_rows(text: str) -> list[list[str]]:
    # ncu prints "==PROF==" / "==WARNING==" lines around the CSV; keep only quoted CSV rows.
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    return list(csv.reader(io.StringIO("\n".join(lines))))


@dataclass
class KernelReport:
    """One profiled kernel: its details-page rows and its raw-page metrics (unit, value)."""

    id: str
    name: str
    launch: dict[str, str] = field(default_factory=dict)  # Grid Size, Block Size (details)
    details: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    raw: dict[str, tuple[str, str]] = field(default_factory=dict)

    def detail(self, section: str, name: str) -> tuple[str, str] | None:
        """(unit, value) of a details-page metric; by section and name, else by name alone
        (older ncu versions titled some sections differently)."""
        hit = self.details.get((section, name))
        if hit is not None:
            return hit
        return next((v for (_, n), v in self.details.items() if n == name), None)


def _id_key(kid: str) -> tuple[int, str]:
    return (int(kid), kid) if kid.isdigit() else (1 << 30, kid)


def parse_details(text: str) -> list[KernelReport]:
    """Kernels of ``ncu --import R --csv --page details``, in ID (= launch) order.

    One row per kernel x metric; the columns are found by name ("ID", "Kernel Name", "Section
    Name", "Metric Name", "Metric Unit", "Metric Value"), so a version with more or fewer
    columns (rule columns, "Kernel Time", "Block Size") reads the same. Rule rows (no metric
    name) are skipped; a metric row may end after its value (ncu 2025.3.1's trailing comma).
    """
    rows = _csv_rows(text)
    if not rows:
        raise ProfileError("the ncu report has no kernel rows (did the kernel-name filter match?)")
    head = rows[0]
    try:
        i_id, i_kernel = head.index("ID"), head.index("Kernel Name")
        i_sec, i_name = head.index("Section Name"), head.index("Metric Name")
        i_unit, i_val = head.index("Metric Unit"), head.index("Metric Value")
    except ValueError:
        raise ProfileError(
            "unexpected ncu CSV header (no ID/Kernel/Section/Metric columns)") from None
    launch_cols = {c: head.index(c) for c in ("Grid Size", "Block Size") if c in head}
    need = max(i_id, i_kernel, i_sec, i_name, i_unit, i_val)
    kernels: dict[str, KernelReport] = {}
    for r in rows[1:]:
        if len(r) <= need or r == head:
            continue
        k = kernels.get(r[i_id])
        if k is None:
            k = kernels[r[i_id]] = KernelReport(
                r[i_id], r[i_kernel], {c: r[i] for c, i in launch_cols.items() if i < len(r)})
        if r[i_name]:
            k.details.setdefault((r[i_sec], r[i_name]), (r[i_unit], r[i_val]))
    if not kernels:
        raise ProfileError("the ncu report has no kernel rows (did the kernel-name filter match?)")
    return [kernels[k] for k in sorted(kernels, key=_id_key)]


def parse_raw(text: str) -> dict[str, dict[str, tuple[str, str]]]:
    """``--page raw --csv``: {kernel ID: {metric: (unit, value)}} (header, units, one row per
    kernel; a short row leaves its missing metrics out)."""
    rows = _csv_rows(text)
    if len(rows) < 3 or "ID" not in rows[0]:
        return {}
    head, units = rows[0], rows[1]
    i_id = head.index("ID")
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for r in rows[2:]:
        if len(r) <= i_id or r == head:
            continue
        out[r[i_id]] = {name: (units[i] if i < len(units) else "", r[i])
                        for i, name in enumerate(head) if i < len(r) and r[i] != ""}
    return out


def parse_report(details: str, raw: str | None) -> list[KernelReport]:
    """The kernels of one report, details and raw pages joined by kernel ID."""
    kernels = parse_details(details)
    per_id = parse_raw(raw) if raw else {}
    for k in kernels:
        k.raw = per_id.get(k.id, {})
    return kernels


# ---- units ---------------------------------------------------------------------------------------
# ncu scales units itself ("ms", "Mbyte", "Ghz"; with --print-units base "nsecond", "byte",
# "hz" or "cycle/second"; older versions "usecond", "cycle/nsecond"). Everything is brought to
# base units (second, byte, hertz, byte/second, watt) before it is shown or compared.
_TIME = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3,
         "second": 1.0, "s": 1.0}
_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}  # ncu's byte and hz prefixes


def _bytes_scale(unit: str) -> float | None:
    m = re.fullmatch(r"([KMGT]?)byte", unit.strip(), flags=re.IGNORECASE)
    return None if m is None else _PREFIX[m.group(1).lower()]


def to_base(value: float, unit: str, kind: str) -> float | None:
    """``value`` in ``unit`` as base units of ``kind`` (time, bytes, freq, byte_rate, power;
    other kinds pass through); None when the unit is not one ncu is known to print."""
    u = unit.strip()
    if kind == "time":
        s = _TIME.get(u.lower())
    elif kind == "bytes":  # "Kbyte", "byte/block", "Kbyte/block"
        s = _bytes_scale(u.split("/")[0])
    elif kind == "freq":
        m = re.fullmatch(r"([kmgt]?)hz", u.lower())
        if m:
            s = _PREFIX[m.group(1)]
        elif u.lower().startswith("cycle/"):
            per = _TIME.get(u.lower()[len("cycle/"):])
            s = None if per is None else 1.0 / per
        else:
            s = None
    elif kind == "byte_rate":
        num, _, den = u.partition("/")
        b, t = _bytes_scale(num), _TIME.get(den.lower())
        s = None if b is None or t is None else b / t
    elif kind == "pct":  # a "%" row found by name alone must not be another unit's
        s = 1.0 if u == "%" else None
    elif kind == "power":
        s = {"w": 1.0, "watt": 1.0, "mw": 1e-3, "milliwatt": 1e-3}.get(u.lower())
    else:
        s = 1.0
    return None if s is None else value * s


# ---- the metric rows -----------------------------------------------------------------------------
SOL = "GPU Speed Of Light Throughput"
CWA = "Compute Workload Analysis"
MWA = "Memory Workload Analysis"
WSS = "Warp State Statistics"
LAUNCH = "Launch Statistics"
OCC = "Occupancy"
STALL_RE = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")


@dataclass(frozen=True)
class Metric:
    """A row: where its value is in the report and how it is shown.

    ``raw``: raw-page metric names, first found wins ("re:" starts a regex; "a+b" sums metrics,
    each converted on its own). ``details``: (section, metric name) on the details page, the
    fallback ("a+b" sums there too). ``scale`` takes base units to the shown unit. Differences
    where both values are below ``floor`` are not highlighted (noise, e.g. near-zero pipes).
    """

    key: str  # stored name, with its unit
    label: str
    unit: str
    kind: str = "plain"
    raw: tuple[str, ...] = ()
    details: tuple[tuple[str, str], ...] = ()
    scale: float = 1.0
    fmt: str = "{:.2f}"
    floor: float = 0.0
    absent: str = ""  # why it can be missing (said once, under the table)

    def format(self, v: float | None) -> str:
        return "n/a" if v is None else self.fmt.format(v)


TENSOR_PIPE_PATTERNS = (
    r"re:^sm__pipe_tensor_op_gmma_cycles_active\.avg\.pct_of_peak_sustained_active$",
    r"re:^sm__pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_active$",
    r"re:^sm__inst_executed_pipe_tensor.*\.avg\.pct_of_peak_sustained_active$",
)
_PCT = {"unit": "%", "fmt": "{:.1f}", "floor": 1.0}
M = Metric
METRICS: tuple[Metric, ...] = (
    M("duration_ms", "duration", "ms", "time", ("gpu__time_duration.sum",),
      ((SOL, "Duration"),), 1e3, "{:.3f}"),
    M("sm_clock_ghz", "SM clock", "GHz", "freq", ("sm__cycles_elapsed.avg.per_second",),
      ((SOL, "SM Frequency"),), 1e-9, "{:.3f}"),
    M("power_w", "board power", "W", "power", (r"re:^(gpu|pwr|sys)__\w*(power|pwr)\w*",),
      fmt="{:.0f}", absent="Nsight Compute reports no board power for a launch (and NVML's "
      "reading under ncu's replay would not be the launch's)"),
    M("sm_throughput_pct", "SM throughput", kind="pct",
      raw=("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
      details=((SOL, "Compute (SM) Throughput"),), **_PCT),
    M("tensor_pipe_pct", "tensor pipe (GMMA)", kind="pct", raw=TENSOR_PIPE_PATTERNS,
      absent="no tensor-pipe metric on the raw page", **_PCT),
    M("xu_pipe_pct", "XU pipe (MUFU: exp2, rcp)", kind="pct",
      raw=("sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",), **_PCT),
    M("fma_pipe_pct", "FMA pipe", kind="pct",
      raw=("sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",), **_PCT),
    M("alu_pipe_pct", "ALU pipe", kind="pct",
      raw=("sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active",), **_PCT),
    M("issued_ipc", "issued IPC (per active SM)", "inst/cycle",
      raw=("sm__inst_issued.avg.per_cycle_active",), details=((CWA, "Issued Ipc Active"),),
      floor=0.05),
    M("warp_cycles_per_issue", "warp cycles per issued instruction", "cycles",
      raw=("smsp__average_warp_latency_per_inst_issued.ratio",),
      details=((WSS, "Warp Cycles Per Issued Instruction"),), floor=0.1),
    # (the top stall reasons go here: stall_<reason>, cycles per issued instruction)
    M("achieved_occupancy_pct", "achieved occupancy", kind="pct",
      raw=("sm__warps_active.avg.pct_of_peak_sustained_active",),
      details=((OCC, "Achieved Occupancy"),), **_PCT),
    M("smem_bank_conflicts", "shared-memory bank conflicts", "", "count",
      ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",), fmt="{:,.0f}", floor=1000.0),
    M("l2_hit_rate_pct", "L2 hit rate", kind="pct", raw=("lts__t_sector_hit_rate.pct",),
      details=((MWA, "L2 Hit Rate"),), **_PCT),
    M("memory_throughput_pct", "memory throughput (of peak)", kind="pct",
      raw=("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",),
      details=((SOL, "Memory Throughput"),), **_PCT),
    M("dram_read_mb", "DRAM read", "MB", "bytes", ("dram__bytes_read.sum",), scale=1e-6,
      fmt="{:.1f}", floor=1.0),
    M("dram_write_mb", "DRAM write", "MB", "bytes", ("dram__bytes_write.sum",), scale=1e-6,
      fmt="{:.1f}", floor=1.0),
    M("dram_gbs", "DRAM throughput", "GB/s", "byte_rate", ("dram__bytes.sum.per_second",),
      ((MWA, "Memory Throughput"),), 1e-9, "{:.1f}", floor=10.0),
    M("registers_per_thread", "registers / thread", "", "count",
      ("launch__registers_per_thread",), ((LAUNCH, "Registers Per Thread"),), fmt="{:.0f}"),
    M("smem_per_cta_kib", "shared memory / CTA (static + dynamic)", "KiB", "bytes",
      ("launch__shared_mem_per_block_static+launch__shared_mem_per_block_dynamic",),
      ((LAUNCH, "Static Shared Memory Per Block+Dynamic Shared Memory Per Block"),),
      1 / 1024, "{:.1f}"),
)
del M
BY_KEY = {m.key: m for m in METRICS}
_STALLS_AFTER = "warp_cycles_per_issue"


def stall_metric(reason: str) -> Metric:
    """The row of one warp-stall reason: cycles per issued instruction a warp spends in it
    (the reasons, "selected" included, add up to the warp cycles per issued instruction)."""
    return Metric(f"stall_{reason}", f"stall: {reason.replace('_', ' ')}", "cycles/issue",
                  fmt="{:.2f}", floor=0.05)


def metric_for(key: str) -> Metric | None:
    if key in BY_KEY:
        return BY_KEY[key]
    return stall_metric(key[len("stall_"):]) if key.startswith("stall_") else None


def _raw_value(k: KernelReport, spec: str, kind: str) -> float | None:
    """One raw-page entry of a Metric (a name, "re:" regex, or "a+b") in base units."""
    if spec.startswith("re:"):
        pat = re.compile(spec[3:])
        names = [n for n in k.raw if pat.search(n)]
        for n in names:
            v = _raw_value(k, n, kind)
            if v is not None:
                return v
        return None
    total = 0.0
    for part in spec.split("+"):
        hit = k.raw.get(part)
        v = None if hit is None else _num(hit[1])
        b = None if v is None else to_base(v, hit[0] if hit else "", kind)
        if b is None:
            return None
        total += b
    return total


def _details_value(k: KernelReport, section: str, name: str, kind: str) -> float | None:
    total = 0.0
    for part in name.split("+"):
        hit = k.detail(section, part)
        v = None if hit is None else _num(hit[1])
        b = None if v is None or hit is None else to_base(v, hit[0], kind)
        if b is None:
            return None
        total += b
    return total


def metric_value(k: KernelReport, m: Metric) -> float | None:
    """The metric in its shown unit: the raw page first (full precision), then details."""
    for spec in m.raw:
        v = _raw_value(k, spec, m.kind)
        if v is not None:
            return v * m.scale
    for section, name in m.details:
        v = _details_value(k, section, name, m.kind)
        if v is not None:
            return v * m.scale
    return None


def stalls(k: KernelReport) -> dict[str, float]:
    """Warp-stall reasons (cycles per issued instruction, WarpStateStats), largest first;
    "selected" (the cycle a warp issues) is not a stall."""
    out: dict[str, float] = {}
    for name, (_, text) in k.raw.items():
        m = STALL_RE.match(name)
        v = _num(text)
        if m and v is not None and m.group(1) != "selected":
            out[m.group(1)] = v
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _dims(text: str) -> str:
    """ncu's "(132, 1, 1)" as "132", "(64, 32, 4)" as "64x32x4"."""
    parts = [p.strip() for p in text.strip("() ").split(",") if p.strip()]
    while len(parts) > 1 and parts[-1] == "1":
        parts.pop()
    return "x".join(parts) or "?"


def launch_text(k: KernelReport) -> str:
    """Grid x block (and the cluster, when the kernel has one) as ncu reports them."""
    grid, block = _dims(k.launch.get("Grid Size", "?")), _dims(k.launch.get("Block Size", "?"))
    cluster = (k.raw.get("launch__cluster_size") or ("", ""))[1] or (
        k.detail(LAUNCH, "Cluster Size") or ("", ""))[1]
    text = f"grid {grid} x block {block}"
    return text + (f", cluster {cluster}" if cluster not in ("", "0", "1") else "")


def headline(k: KernelReport) -> dict[str, float | None]:
    """Every row's value for one kernel (shown units; keys carry them), stalls included."""
    out: dict[str, float | None] = {m.key: metric_value(k, m) for m in METRICS}
    out.update({f"stall_{r}": v for r, v in stalls(k).items()})
    return out


# ---- the table -----------------------------------------------------------------------------------
@dataclass
class TableRow:
    label: str
    cells: list[str]
    ratio: str = ""
    highlight: bool = False
    rel: float | None = None  # |b - a| / max(|a|, |b|), the ranking of differences


@dataclass
class ProfileTable:
    rows: list[TableRow]
    notes: list[str]


def _row_keys(columns: Sequence[dict[str, float | None]]) -> list[str]:
    """METRICS' keys with the top stall reasons of every column after warp cycles/issue."""
    top: dict[str, float] = {}
    for col in columns:
        ranked = sorted(((k, v) for k, v in col.items() if k.startswith("stall_") and v),
                        key=lambda kv: -(kv[1] or 0.0))
        for k, v in ranked[:TOP_STALLS]:
            top[k] = max(top.get(k, 0.0), v or 0.0)
    stall_keys = sorted(top, key=lambda k: -top[k])
    keys: list[str] = []
    for m in METRICS:
        keys.append(m.key)
        if m.key == _STALLS_AFTER:
            keys += stall_keys
    return keys


def _unit_label(m: Metric) -> str:
    return f"{m.label} [{m.unit}]" if m.unit else m.label


def build_table(columns: Sequence[dict[str, float | None]],
                text_rows: Sequence[tuple[str, Sequence[str]]] = (),
                top: int = TOP_DIFFERENCES) -> ProfileTable:
    """Rows for one kernel, or two side by side with the ratio second / first; the ``top``
    rows that differ most (relative difference, at least 5%) are highlighted."""
    rows = [TableRow(label, list(cells)) for label, cells in text_rows]
    notes: list[str] = []
    partial = False
    for key in _row_keys(columns):
        m = metric_for(key)
        if m is None:
            continue
        vals = [c.get(key) for c in columns]
        if all(v is None for v in vals):
            why = m.absent or "not in this ncu report"
            notes.append(f"{m.label}: n/a, {why}")
            if m.key == "power_w":  # said once; no row of n/a's
                continue
        partial = partial or any(v is None for v in vals) and any(v is not None for v in vals)
        row = TableRow(_unit_label(m), [m.format(v) for v in vals])
        if len(vals) == 2 and vals[0] is not None and vals[1] is not None:
            a, b = vals
            row.ratio = f"{b / a:.2f}x" if a else ("=" if b == 0 else "-")
            big = max(abs(a), abs(b))
            if big >= max(m.floor, 1e-12):
                row.rel = abs(b - a) / big
        rows.append(row)
    ranked = sorted((r for r in rows if r.rel is not None and r.rel >= 0.05),
                    key=lambda r: -(r.rel or 0.0))
    for r in ranked[:top]:
        r.highlight = True
    if partial:
        notes.append("n/a in one column: that kernel's report lacks the metric")
    return ProfileTable(rows, notes)


# ---- compatibility: the single-kernel headline of earlier releases -------------------------------
@dataclass
class Headline:
    kernel_name: str | None = None
    duration_ms: float | None = None
    metrics: dict[str, float | None] = field(default_factory=dict)


def parse_details_csv(text: str) -> Headline:
    """Headline metrics of the first kernel of ``--page details`` (details page only)."""
    k = parse_details(text)[0]
    h = headline(k)
    return Headline(kernel_name=k.name, duration_ms=h.pop("duration_ms"), metrics=h)


def parse_raw_tensor_pipe(text: str) -> float | None:
    """The tensor-pipe utilization (%) of the first kernel of ``--page raw --csv``."""
    per_id = parse_raw(text)
    if not per_id:
        return None
    k = KernelReport("0", "", raw=next(iter(per_id.values())))
    return metric_value(k, BY_KEY["tensor_pipe_pct"])


# ---- running ncu ---------------------------------------------------------------------------------
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


def ncu_version(ncu: Path) -> str:
    """"2025.3.1.0" from ``ncu --version``; "unknown" when it does not say."""
    try:
        p = subprocess.run([str(ncu), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    m = re.search(r"Version\s+(\S+)", p.stdout + p.stderr)
    return m.group(1) if m else "unknown"


def explain_ncu_failure(output: str, rc: int, kernel_regex: str = KERNEL_REGEX) -> str:
    if "ERR_NVGPUCTRPERM" in output or "permission" in output.lower() and "counter" in output:
        return ("ncu cannot read the GPU performance counters (ERR_NVGPUCTRPERM): run as root "
                "or load the driver with NVreg_RestrictProfilingToAdminUsers=0")
    drv = [ln for ln in output.splitlines() if "profile_driver: error:" in ln]
    if drv:  # the launcher refused (no GPU, a peer that cannot run, ...): its own line
        return drv[0].split("profile_driver: error:", 1)[1].strip()[:300]
    err = [ln for ln in output.splitlines() if "==ERROR==" in ln]
    if err:
        return f"ncu failed: {err[0].replace('==ERROR==', '').strip()[:300]}"
    if "No kernels were profiled" in output:
        return (f"ncu profiled no kernel: the kernel-name filter {kernel_regex} matched nothing "
                "that was launched")
    return f"ncu failed with exit code {rc}"


@dataclass
class Subject:
    """One kernel of a profile: fa-tune's (a trial's .so) or a peer ("fa3")."""

    label: str  # column header
    target: str  # what profile_driver launches: a .so path, or "fa3"
    trial: int | None = None
    config_id: str | None = None


def kernel_regex(subjects: Sequence[Subject]) -> str:
    pats = [KERNEL_PATTERN]
    if any(s.target == "fa3" for s in subjects):
        pats += FA3_PATTERNS
    return "regex:" + "|".join(pats)


def ncu_command(ncu: Path, subjects: Sequence[Subject], shape: Problem,
                rep_base: Path) -> list[str]:
    driver = [sys.executable, "-m", "tuner.analysis.profile_driver", subjects[0].target, str(shape)]
    if len(subjects) > 1:
        driver += ["--vs", subjects[1].target]
    return [str(ncu), *NCU_SET, "--profile-from-start", "off",
            "--launch-count", str(len(subjects)), "--kernel-name-base", "demangled",
            "--kernel-name", kernel_regex(subjects), "--clock-control", "none",
            "--force-overwrite", "-o", str(rep_base), *driver]


def _import(ncu: Path, rep: Path, page: str, extra: Sequence[str] = ()) -> str:
    p = subprocess.run([str(ncu), "--import", str(rep), "--csv", "--page", page, *extra],
                       capture_output=True, text=True, timeout=NCU_TIMEOUT_S)
    if p.returncode != 0:
        why = explain_ncu_failure(p.stdout + p.stderr, p.returncode)
        raise ProfileError(f"cannot read {rep}: {why}")
    return p.stdout


def _import_raw(ncu: Path, rep: Path) -> str | None:
    # Base units: one units row serves every kernel on the raw page, and ncu's own scaling
    # ("Mbyte") could differ between two kernels. An ncu without --print-units reads as is.
    for extra in (("--print-units", "base"), ()):
        try:
            return _import(ncu, rep, "raw", extra)
        except ProfileError:
            continue
    return None


def report_name(*parts: object) -> str:
    """A file name from parts ("1x32/8x8192" has a slash): anything odd becomes '_'."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", "-".join(str(p) for p in parts))


def run_ncu(subjects: Sequence[Subject], shape: Problem, name: str,
            out_dir: Path | None = None) -> tuple[Path, list[KernelReport], str]:
    """Profile every subject in one ncu run; (report, one KernelReport per subject in order,
    ncu version)."""
    ncu = find_ncu()
    out_dir = out_dir or _paths.studies_root() / "profiles"
    out_dir.mkdir(parents=True, exist_ok=True)
    rep_base = out_dir / name
    cmd = ncu_command(ncu, subjects, shape, rep_base)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    rep = rep_base.with_name(rep_base.name + ".ncu-rep")
    if rep.exists():
        rep.unlink()  # a report left by an earlier run must not pass for this one's
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=NCU_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        raise ProfileError(f"ncu did not finish within {NCU_TIMEOUT_S} s") from None
    out = p.stdout + p.stderr
    regex = kernel_regex(subjects)
    if p.returncode != 0 or not rep.is_file() or "==ERROR==" in out:
        raise ProfileError(explain_ncu_failure(out, p.returncode, regex))
    kernels = parse_report(_import(ncu, rep, "details"), _import_raw(ncu, rep))
    if len(kernels) != len(subjects):
        got = ", ".join(k.name[:80] for k in kernels)
        raise ProfileError(
            f"ncu profiled {len(kernels)} kernel(s) for {len(subjects)} launches ({got}): the "
            f"kernel-name filter {regex} did not match every kernel; report {rep}")
    return rep, kernels, ncu_version(ncu)


# ---- a trial (and what it is compared with) ------------------------------------------------------
@dataclass
class Column:
    subject: Subject
    kernel: KernelReport
    metrics: dict[str, float | None]


@dataclass
class ProfileResult:
    report: Path
    shape: Problem
    ncu_version: str
    date: str
    columns: list[Column]
    stored: list[int] = field(default_factory=list)  # trials whose user attrs got the headline
    store_error: str | None = None

    def table(self) -> ProfileTable:
        text = [("kernel", [short_name(c.kernel.name) for c in self.columns]),
                ("launch", [launch_text(c.kernel) for c in self.columns])]
        return build_table([c.metrics for c in self.columns], text)


def short_name(name: str, width: int = 32) -> str:
    """A kernel name that fits a column: no "void ", no parameters, cut at ``width``."""
    n = name.removeprefix("void ").split("(")[0]
    return n if len(n) <= width else n[: width - 1] + "…"


def fa3_reason() -> str | None:
    """Why FlashAttention-3 is not installed here (one line), or None. Only whether its
    packages are there: importing torch here would hold a CUDA context beside the profiled
    process; the driver runs the peer's full check (tuner/measure/peers/fa3.py) and says why in one
    line when it fails."""
    from tuner.measure.peers.base import module_missing

    return module_missing("torch") or module_missing("flash_attn")


def _trial_subject(study: str, storage: str | None, number: int | None,
                   shape: Problem) -> tuple[Any, Any, Subject]:
    from tuner.kernel.config import KernelConfig
    from tuner.kernel.support import check_problem
    from tuner.search.trials import pick_trial

    _, t = pick_trial(study, storage, number)
    cfg = KernelConfig.from_dict(t.user_attrs.get("config") or {})
    check_problem(cfg, shape)
    return t, cfg, Subject(f"trial {t.number}", "", t.number, cfg.config_id())


def _check_vs(vs: str | None) -> None:
    if vs is not None and vs != "fa3":
        raise ProfileError(f"unknown --vs '{vs}': use --vs fa3, or --vs-trial N for a trial")


def _peer_subjects(vs: str | None) -> list[Subject]:
    """The peer column ``--vs`` asks for (none, or FA3 once it is known to be installed)."""
    _check_vs(vs)
    if vs is None:
        return []
    why = fa3_reason()
    if why:
        raise ProfileError(f"--vs fa3: FlashAttention-3 cannot run here ({why}); install "
                           "flash-attn-4 (pip install 'fa-tune[peers]')")
    from tuner.measure.peers import make_peer

    return [Subject(make_peer("fa3").label, "fa3")]


def _profile(subjects: Sequence[Subject], shape: Problem, name: str) -> ProfileResult:
    rep, kernels, version = run_ncu(subjects, shape, name)
    date = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    cols = [Column(s, k, headline(k)) for s, k in zip(subjects, kernels, strict=True)]
    return ProfileResult(rep, shape, version, date, cols)


def profile_config(cfg: Any, label: str, shape: Problem, *, vs: str | None = None) -> ProfileResult:
    """Profile a config that is no trial (``--preset`` / ``--config``), built for ``shape``'s
    class, alone or beside FA3; nothing is stored (there is no trial to keep the headline)."""
    from tuner.kernel.build import build_config
    from tuner.kernel.config import validate
    from tuner.kernel.support import check_problem

    check_problem(cfg, shape)
    pclass = shape.problem_class
    validate(cfg, pclass.head_dim, pclass.causal)  # a config the class refuses: its line first
    find_ncu()
    peers = _peer_subjects(vs)
    built = build_config(cfg, pclass=pclass)
    built.require_timeable()
    subjects = [Subject(label, str(built.so_path), None, cfg.config_id()), *peers]
    return _profile(subjects, shape,
                    report_name(label, cfg.config_id(), *(s.target for s in peers), shape))


def profile_trial(study: str, storage: str | None, trial: int | None, shape: Problem, *,
                  vs_trial: int | None = None, vs: str | None = None) -> ProfileResult:
    """Profile the trial's kernel on ``shape`` (alone, beside another trial's, or beside FA3's
    with ``vs="fa3"``), store the headline in the trial's user attrs, return the columns."""
    from tuner.ship.export import artifact_for

    _check_vs(vs)
    if vs is not None and vs_trial is not None:
        raise ProfileError("give --vs fa3 or --vs-trial N, not both")
    t, cfg, first = _trial_subject(study, storage, trial, shape)
    pairs = [(t, cfg, first)]
    if vs_trial is not None:
        if vs_trial == t.number:
            raise ProfileError(f"--vs-trial {vs_trial} is the trial being profiled; pick another")
        pairs.append(_trial_subject(study, storage, vs_trial, shape))
    find_ncu()  # before any rebuild: the clear line first
    subjects = [s for _, _, s in pairs] + _peer_subjects(vs)
    for tr, c, s in pairs:  # a library for this problem's class (head dim, mask)
        s.target = str(artifact_for(tr, c, shape.problem_class).so_path)
    name = report_name(study, *(f"trial{s.trial}" if s.trial is not None else s.target
                                for s in subjects), shape)
    res = _profile(subjects, shape, name)
    try:
        res.stored = store_profiles(study, storage, res)
    except Exception as exc:  # the profile stands without the study record; say so, once
        res.store_error = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
    return res


# ---- the headline in the study -------------------------------------------------------------------
PROFILE_ATTR = "profile"


def profile_record(res: ProfileResult, i: int) -> dict[str, Any]:
    """What column ``i``'s trial keeps: {metrics, report, date, ncu_version, kernel, launch, vs}
    (vs: the other column's label and metrics, so the side-by-side can be read back)."""
    col = res.columns[i]
    rec: dict[str, Any] = {
        "shape": str(res.shape), "date": res.date, "ncu_version": res.ncu_version,
        "report": str(res.report), "kernel": col.kernel.name, "launch": launch_text(col.kernel),
        "metrics": {k: v for k, v in col.metrics.items() if v is not None},
    }
    others = [c for j, c in enumerate(res.columns) if j != i]
    if others:
        o = others[0]
        rec["vs"] = {"label": o.subject.label, "kernel": o.kernel.name,
                     "metrics": {k: v for k, v in o.metrics.items() if v is not None}}
    return rec


def store_profiles(study: str, storage: str | None, res: ProfileResult) -> list[int]:
    """Write each profiled trial's record into its user attr ``profile`` ({problem: record},
    one per problem profiled, the latest kept); returns the trial numbers written."""
    from tuner.search.study import load_existing_study, open_storage, storage_url

    st = load_existing_study(study, storage)
    by_number = {t.number: t for t in st.get_trials(deepcopy=False)}
    engine = open_storage(storage_url(study, storage), create_dirs=False).engine
    done = []
    for i, col in enumerate(res.columns):
        t = by_number.get(col.subject.trial) if col.subject.trial is not None else None
        if t is None:
            continue
        prev = t.user_attrs.get(PROFILE_ATTR)
        merged = dict(prev) if isinstance(prev, dict) else {}
        merged[str(res.shape)] = profile_record(res, i)
        _set_user_attr(engine, t._trial_id, PROFILE_ATTR, merged)
        done.append(t.number)
    return done


def _set_user_attr(engine: Any, trial_id: int, key: str, value: Any) -> None:
    """Upsert one user attr of a finished trial. Optuna refuses to change a finished trial
    through its API (it guards the search's own bookkeeping); a profile is a note about the
    trial, not part of its result, so it goes into the same table directly."""
    from sqlalchemy import MetaData, Table, insert, select, update

    tbl = Table("trial_user_attributes", MetaData(), autoload_with=engine)
    where = (tbl.c.trial_id == trial_id) & (tbl.c.key == key)
    with engine.begin() as conn:
        hit = conn.execute(select(tbl.c.trial_user_attribute_id).where(where)).first()
        if hit is None:
            conn.execute(insert(tbl).values(trial_id=trial_id, key=key,
                                            value_json=json.dumps(value)))
        else:
            conn.execute(update(tbl).where(where).values(value_json=json.dumps(value)))


# ---- a stored record, as one line (fa-tune show) -------------------------------------------------
SHOW_KEYS = ("duration_ms", "sm_clock_ghz", "tensor_pipe_pct", "xu_pipe_pct", "issued_ipc",
             "l2_hit_rate_pct", "dram_gbs", "registers_per_thread", "smem_per_cta_kib")


def record_line(rec: dict[str, Any], keys: Sequence[str] = SHOW_KEYS) -> str:
    """"duration 2.987 ms, SM clock 1.688 GHz, ..." from a stored record's metrics."""
    metrics = rec.get("metrics") if isinstance(rec.get("metrics"), dict) else {}
    parts = []
    for key in keys:
        m, v = metric_for(key), metrics.get(key)
        if m is None or not isinstance(v, (int, float)):
            continue
        parts.append(f"{m.label} {m.format(float(v))}" + (f" {m.unit}" if m.unit else ""))
    return ", ".join(parts)
