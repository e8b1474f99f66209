"""Reading an Nsight Compute report back (``fa-tune profile``'s second half): the CSV of its
details and raw pages split by kernel, every metric found by name and brought to base units,
the side-by-side table (one column per kernel, the rows that differ most marked) and the
headline stored with a trial. No ncu needed: tests/data/ncu_h200/ is its test data."""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from tuner.errors import FaTuneError

TOP_DIFFERENCES = 5  # rows highlighted in a side-by-side
TOP_STALLS = 3  # stall reasons per kernel shown (their union)


class ProfileError(FaTuneError):
    """ncu missing, counters not readable, nothing profiled, or the report could not be read."""


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


class _PctFields(TypedDict):
    """The keyword arguments the percentage rows share (``**_PCT``)."""

    unit: str
    fmt: str
    floor: float


_PCT: _PctFields = {"unit": "%", "fmt": "{:.1f}", "floor": 1.0}
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
            a, b = vals[0], vals[1]
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
