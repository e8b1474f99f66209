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

import json
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

from tuner import _paths, child_process
from tuner.analysis.ncu_report import (
    KernelReport,
    M,
    ProfileError,
    ProfileTable,
    build_table,
    headline,
    launch_text,
    metric_for,
    parse_report,
)
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


# ---- reading ncu's CSV ---------------------------------------------------------------------------


# ---- units ---------------------------------------------------------------------------------------


# ---- the metric rows -----------------------------------------------------------------------------


del M


# ---- the table -----------------------------------------------------------------------------------


# ---- compatibility: the single-kernel headline of earlier releases -------------------------------


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
        [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    rep = rep_base.with_name(rep_base.name + ".ncu-rep")
    if rep.exists():
        rep.unlink()  # a report left by an earlier run must not pass for this one's
    try:
        p = child_process.run(cmd, timeout=NCU_TIMEOUT_S, env=env)  # the profiled process too
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
    metrics = got if isinstance(got := rec.get("metrics"), dict) else {}
    parts = []
    for key in keys:
        m, v = metric_for(key), metrics.get(key)
        if m is None or not isinstance(v, (int, float)):
            continue
        parts.append(f"{m.label} {m.format(float(v))}" + (f" {m.unit}" if m.unit else ""))
    return ", ".join(parts)
