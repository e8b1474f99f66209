"""`fa-tune show`, `export`, `workload` and `profile`: reading a study and shipping its kernels."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from tuner.analysis import profile as profile_mod
from tuner.analysis import show as show_mod
from tuner.cli.common import (
    PROBLEM_SYNTAX,
    ConfigOpt,
    StorageOpt,
    StudyOpt,
    TrialOpt,
    console,
    user_errors,
)
from tuner.errors import ConfigError, FaTuneError, SearchError
from tuner.kernel.config import KernelConfig, load_config
from tuner.kernel.support import check_runnable
from tuner.measure.accuracy import ratio_text
from tuner.problem import Problem
from tuner.search.trials import best_rows, study_trials, with_final
from tuner.ship import dispatch as dispatch_mod
from tuner.ship import export as export_mod
from tuner.ship import export_workload
from tuner.ship import workload as workload_mod

# max|err| / the BF16 implementation's and / the default config's (tuner.measure.accuracy), and
# the LSE's max|err| / its gate bound's 2^-9 (near 1: a config the gate may refuse elsewhere),
# worst over the trial's gated problems. Short headers: show trials fits 80 columns.
ERR_COLUMNS = ("err/BF16", "err/def", "LSE/tol")


def _err_cells(r: dict[str, Any]) -> tuple[str, str, str]:
    fa = ratio_text(r.get("fa_ratio"))
    if r.get("fa_rule_ok") is False:
        fa = f"[red]{fa}[/]"
    lse = ratio_text(r.get("lse_ratio"))
    if (r.get("lse_ratio") or 0.0) > 0.5:
        lse = f"[yellow]{lse}[/]"
    return fa, ratio_text(r.get("err_vs_default")), lse


def _show_best(study: str, storage: str | None, shape: str | None, top: int) -> None:

    if shape is not None:
        shape = str(Problem.parse(shape))
    st, trials = study_trials(study, storage)
    if shape is None:  # the final ranks on every problem: not on one
        ranked, verdict = with_final(st, trials, best_rows(trials, None, len(trials)))
        rows = ranked[:top]
    else:
        rows, verdict = best_rows(trials, shape, top), None
    if not rows:
        raise SearchError(f"study '{study}' has no completed trial"
                          + (f" measured on {shape}" if shape else "")
                          + f"; `fa-tune show trials --study {study}` says why, `fa-tune search "
                          f"--study {study}` measures more")
    shapes = list(rows[0]["shapes"])
    t = Table(title=f"study {study}: best {len(rows)}" + (f" on {shape}" if shape else ""))
    for col in ("trial", "config", "geomean TFLOPS", "confirmed", *shapes, *ERR_COLUMNS,
                "differs from default"):
        t.add_column(col, justify="right" if col not in ("config", "differs from default")
                     else "left")
    for r in rows:
        cfg = KernelConfig.from_dict(r["config"]) if r["config"] else KernelConfig()
        diff = ", ".join(f"{k}={v}" for k, v in cfg.diff_from_default().items())
        t.add_row(str(r["trial"]), r["config_id"], f"{r['value']:.1f}",
                  "yes" if r["confirmed"] else "[yellow]no[/]",
                  *[f"{r['shapes'].get(s, float('nan')):.1f}" for s in shapes], *_err_cells(r),
                  diff or "-")
    console.print(t)
    if verdict is not None:
        console.print(f"final: {verdict.text()}\n       {verdict.standings()}", soft_wrap=True,
                      markup=False)
    # The winner's every knob as YAML, outside the table: rich shrinks and cuts table cells to
    # the terminal (80 columns when piped), the config must survive whole and be usable as is.
    best = rows[0]
    cfg = KernelConfig.from_dict(best["config"]) if best["config"] else KernelConfig()
    confirmed = "confirmed" if best["confirmed"] else "NOT confirmed (search protocol only)"
    console.print(
        f"# best: trial {best['trial']} ({best['config_id']}), {best['value']:.1f} TFLOPS "
        f"geomean, {confirmed}\n# max|err|: {ratio_text(best['fa_ratio'])}x the BF16 "
        f"implementation's (FlashAttention's rule allows 2), {ratio_text(best['err_vs_default'])}x"
        f" the default config's; LSE max|err| {ratio_text(best.get('lse_ratio'))}x the gate's "
        f"2^-9\n# save as best.yaml; `fa-tune run --config best.yaml` "
        f"times it\n{cfg.to_yaml()}",
        markup=False, highlight=False, soft_wrap=True,  # ends with a blank line
    )


@user_errors
def show(
    what: Annotated[str, typer.Argument(help="best | trials | importance | plots")] = "best",
    study: StudyOpt = "default",
    storage: StorageOpt = None,
    shape: Annotated[str | None, typer.Option(
        "--shape", help=f"Rank by this problem ({PROBLEM_SYNTAX}).")] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="How many configs.")] = 5,
) -> None:
    """Read a study: best configs, all trials, knob importances (fANOVA), PNG plots."""
    if shape is not None and what != "best":
        raise SearchError(f"--shape ranks `show best`; `show {what}` takes none")
    if what == "best":
        _show_best(study, storage, shape, top)
        _print_profiles(study_trials(study, storage)[1])
        what = "importance+plots"
    elif what == "trials":
        _, trials = study_trials(study, storage)
        counts = ", ".join(f"{n} {state}" for state, n in show_mod.state_counts(trials).items())
        t = Table(title=f"study {study}: {len(trials)} trials ({counts})")
        for col in ("trial", "state", "value", "confirmed", *ERR_COLUMNS, "config", "reason"):
            # The state whole (COMPLETE, PRUNED) where 80 columns squeeze the table.
            t.add_column(col, min_width=8 if col == "state" else None)
        for r in show_mod.trial_rows(trials):
            t.add_row(str(r["trial"]), r["state"],
                      "-" if r["value"] is None else f"{r['value']:.1f}",
                      "-" if r["confirmed"] is None else f"{r['confirmed']:.1f}",
                      *_err_cells(r), r["config_id"], r["reason"][:120])
        console.print(t)
        _print_profiles(trials)
        return
    elif what not in ("importance", "plots"):
        raise SearchError(f"unknown `show {what}`; use best, trials, importance or plots")
    st, trials = study_trials(study, storage)
    if "importance" in what:
        imp, why = show_mod.importances(st, trials)
        if imp is None:
            console.print(why, markup=False)  # plain text: "fa-tune[plots]" is not markup
        else:
            t = Table(title="knob importances (fANOVA)")
            t.add_column("knob")
            t.add_column("importance", justify="right")
            for k, v in imp.items():
                t.add_row(k, f"{v:.3f}")
            console.print(t)
    if "plots" in what:
        try:
            paths = show_mod.write_plots(study, trials)
        except SearchError as e:
            if what == "plots":
                raise
            console.print(f"plots skipped: {e}", markup=False)
            return
        if paths:
            console.print(f"plots: {paths[0].parent} ({len(paths)} PNG files)", soft_wrap=True)
        elif what == "plots":
            console.print(f"no plots: study {study} has no completed trial yet", markup=False)


@user_errors
def export(
    out: Annotated[Path, typer.Option("--out", "-o", help="New folder for the package.")],
    study: Annotated[str | None, typer.Option(
        "--study", help="Study name (default: default).")] = None,
    storage: StorageOpt = None,
    trial: TrialOpt = None,
    workload: Annotated[str | None, typer.Option(
        "--workload", "-w", help="Export one library for this workload (a file, or a name from "
        "workloads/): every bucket's kernel behind a dispatcher, and the PyTorch op.")] = None,
    bucket: Annotated[list[str] | None, typer.Option(
        "--bucket", "-b", help="With --workload: NAME=SOURCE, SOURCE = study:NAME[:TRIAL], "
        "preset:NAME or a config file; repeatable.")] = None,
    study_prefix: Annotated[str | None, typer.Option(
        "--study-prefix", help="With --workload: a bucket without --bucket takes the best "
        "trial of study PREFIX<bucket> when it exists.")] = None,
    default: Annotated[str | None, typer.Option(
        "--default", help="With --workload: SOURCE for the buckets left.")] = None,
    table: Annotated[Path | None, typer.Option(
        "--table", help="Export the library of a dispatch table (a workload export's "
        "dispatch.json) instead.")] = None,
    no_build: Annotated[bool, typer.Option(
        "--no-build", help="Workload library: write the sources only (no nvcc).")] = False,
    jobs: Annotated[int | None, typer.Option(
        "--jobs", "-j", min=1, help="Workload library: kernels compiled at once (default: "
        "cores).")] = None,
) -> None:
    """Write a standalone package of a tuned kernel (source, build.sh, .so, README), or with
    --workload one library serving every length bucket of a workload."""

    if workload is None and table is None:
        if bucket or study_prefix or default or no_build or jobs:
            raise FaTuneError("--bucket, --study-prefix, --default, --no-build and --jobs go "
                              "with --workload or --table")
        r = export_mod.export_trial(study or "default", storage, trial, out)
        console.print(f"exported trial {r['trial']} ({r['config_id']}) to {r['out']}",
                      soft_wrap=True)
        return

    if study is not None or trial is not None:
        raise FaTuneError("--study/--trial export one kernel; --workload/--table export a "
                          "workload library (name its buckets' studies with --bucket or "
                          "--study-prefix)")
    wfile, resolved = None, None
    if table is not None:
        if workload is not None or bucket or study_prefix or default:
            raise FaTuneError("--table holds every bucket's config already: give it alone, or "
                              "--workload with --bucket/--study-prefix/--default")
        t = dispatch_mod.DispatchTable.load(table)
    else:
        assert workload is not None
        wfile = workload_mod.workload_path(workload)
        w = workload_mod.load_workload(wfile)
        resolved = dispatch_mod.bucket_sources(w, bucket, study_prefix, default, storage)
        t = dispatch_mod.table_for_workload(w, resolved)
    r = export_workload.export_workload(
        t, out, resolved=resolved, workload_file=wfile, build=not no_build, jobs=jobs,
        say=lambda line: console.print(line, markup=False, soft_wrap=True))
    for e in t.entries:
        console.print(f"  {e.bucket}: S {e.range_text()}, {e.config.config_id()} "
                      f"({e.source_text()})", markup=False, soft_wrap=True)
    what = f"library {r['so']}" if r["so"] else "sources (not built: run build.sh)"
    console.print(f"exported workload {t.name} ({len(t.entries)} buckets) to {r['out']}: {what}",
                  markup=False, soft_wrap=True)


@user_errors
def workload_cmd(
    workload: Annotated[str, typer.Argument(
        help="A workload file, or a name from workloads/ (e.g. llama3-8b).")],
    max_problems: Annotated[int | None, typer.Option(
        "--max-problems", min=1, help="Problems per bucket (default: the file's, else 3).")] = None,
) -> None:
    """Show a workload's buckets and the problems to tune each on (most attention time first),
    with the search and export commands."""

    w = workload_mod.load_workload(workload)
    a = w.attention
    masks = (f", window {a.window}" if a.window else "") + (
        f", softcap {a.softcap:g}" if a.softcap else "") + (", sinks" if a.sinks else "")
    kinds = "; layers: " + ", ".join(
        f"{k.count} {k.name} ({f'window {k.window}' if k.window else 'no window'})"
        for k in w.kinds) if w.kinds else ""
    t = Table(title=f"workload {w.name}: Hq {a.Hq}, Hkv {a.Hkv}, D {a.head_dim}, "
              f"{'causal' if a.causal else 'non-causal'}{masks}{kinds}")
    for col in ("bucket", "S", "calls", "attention time", "problems (share of bucket time)"):
        t.add_column(col)
    plans = w.plan(max_problems)
    for p in plans:
        probs = ", ".join(f"{x.problem} ({100 * x.time_share:.0f}%)" for x in p.problems)
        t.add_row(p.bucket.name, p.bucket.range_text(), f"{100 * p.call_share:.1f}%",
                  f"{100 * p.time_share:.1f}%", probs)
    console.print(t)
    console.print("tune each bucket (one study each; the same command resumes):", markup=False)
    for p in plans:
        shapes = " ".join(f"--shape {shlex.quote(s)}" for s in p.shapes)  # [..] and * in varlen
        console.print(f"  fa-tune search --study {w.name}-{p.bucket.name} {shapes} --timeout 30m",
                      markup=False, soft_wrap=True)
    console.print(f"then: fa-tune export --workload {workload} --study-prefix {w.name}- "
                  f"--out {w.name}-lib", markup=False, soft_wrap=True)


@user_errors
def profile(
    shape: Annotated[str, typer.Option(
        "--shape", "-s", help=f"Problem to profile: {PROBLEM_SYNTAX}, e.g. 4x32x8192.")],
    study: StudyOpt = "default",
    storage: StorageOpt = None,
    trial: TrialOpt = None,
    vs_trial: Annotated[int | None, typer.Option(
        "--vs-trial", help="Profile this trial's kernel beside it, in the same ncu run.")] = None,
    vs: Annotated[str | None, typer.Option(
        "--vs", help="Profile a peer beside it, in the same ncu run: fa3 (FlashAttention-3's "
        "sm90 kernel; needs flash-attn-4).")] = None,
    preset: Annotated[str | None, typer.Option(
        "--preset", "-p", help="Profile this preset instead of a trial (nothing is stored).")
    ] = None,
    config: ConfigOpt = None,
) -> None:
    """Nsight Compute on one tuned kernel (one launch, --set full), alone or beside another
    trial's or FA3's: the metrics that explain time on Hopper, the rows that differ most
    highlighted; the headline is stored with the trial (fa-tune show lists it). --preset or
    --config profiles a config that is no trial."""

    sh = Problem.parse(shape)
    if preset is not None or config is not None:
        trial_opts = [n for n, v in (("--trial", trial), ("--vs-trial", vs_trial),
                                     ("--storage", storage)) if v is not None]
        if trial_opts or study != "default":
            raise ConfigError(f"--preset/--config profile a config, not a study's trial: drop "
                              f"{' and '.join(trial_opts or ['--study'])}")
        cfg, label = load_config(preset, config)
        _print_profile(profile_mod.profile_config(cfg, label if config else f"preset {label}",
                                                  sh, vs=vs))
        return
    check_runnable([sh])
    _print_profile(profile_mod.profile_trial(study, storage, trial, sh, vs_trial=vs_trial, vs=vs))


def _column_name(c: Any, long: bool = True) -> str:
    s = c.subject
    if s.trial is None:  # a peer (short: "fa3"), or a preset / config file (its label)
        if s.target == "fa3":
            return s.label if long else s.target
        return f"{s.label} ({s.config_id})" if long and s.config_id else s.label
    return f"trial {s.trial} ({s.config_id})" if long and s.config_id else f"trial {s.trial}"


def _print_profile(r: Any) -> None:
    """A profile's table (one column per kernel, and their ratio) and where it went."""
    tab = r.table()
    cols = r.columns
    pair = len(cols) == 2
    t = Table(title=" vs ".join(_column_name(c) for c in cols) + f" on {r.shape}",
              caption=f"ncu {r.ncu_version}, one launch{' each' if pair else ''}, clocks not "
              "locked")
    t.add_column("metric")
    for c in cols:
        t.add_column(_column_name(c), justify="right")
    if pair:
        t.add_column(f"{_column_name(cols[1], False)} / {_column_name(cols[0], False)}",
                     justify="right")
    for row in tab.rows:  # Text cells: labels hold "[ms]", not rich markup
        cells = [row.label, *row.cells] + ([row.ratio + (" *" if row.highlight else "")]
                                           if pair else [])
        t.add_row(*(Text(c) for c in cells), style="bold yellow" if row.highlight else None)
    console.print(t)
    if pair:
        console.print("* the rows that differ most (relative difference)", markup=False)
    for note in tab.notes:
        console.print(note, markup=False, soft_wrap=True)
    for i, c in enumerate(cols):
        console.print(f"kernel {i}: {c.kernel.name}", markup=False, soft_wrap=True)
    console.print(f"report: {r.report}", markup=False, soft_wrap=True)
    if r.stored:
        console.print("headline stored with trial " + ", ".join(map(str, r.stored))
                      + " (user attr 'profile'; `fa-tune show` lists it)", markup=False)
    if r.store_error:
        sys.stderr.write(f"fa-tune: warning: headline not stored in the study: "
                         f"{r.store_error}\n")


def _print_profiles(trials: list[Any]) -> None:
    """The headlines `fa-tune profile` stored with trials, one line each (none: nothing)."""
    lines = show_mod.profile_lines(trials)
    if lines:
        console.print("profiles (fa-tune profile):", markup=False)
        for line in lines:
            console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
