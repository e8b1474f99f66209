"""`fa-tune search`, `worker` and `tune`: the search (one GPU, several, or a workload's
buckets) with its live view."""

from __future__ import annotations

import signal
import time
from typing import Annotated, Any

import typer
from rich.live import Live
from rich.table import Table

from tuner.cli.common import (
    ArtifactsOpt,
    DeviceOpt,
    GpusOpt,
    JobsOpt,
    MixedOpt,
    SamplerOpt,
    SeedOpt,
    ShapeOpt,
    StorageOpt,
    StudyOpt,
    TimeoutOpt,
    TrialsOpt,
    WorkerEntryOpt,
    check_search_problems,
    console,
    user_errors,
)
from tuner.errors import FaTuneError, SearchError
from tuner.measure.timing import Nvml
from tuner.problem import Problem, ProblemClass, class_of, parse_problems
from tuner.search import fleet
from tuner.search import loop as search_mod
from tuner.search import space as space_mod
from tuner.search.gpu_worker import DEFAULT_ENTRY
from tuner.search.sampler import SAMPLERS
from tuner.search.session import TIMEOUT_TOO_SHORT, EventLog, parse_duration
from tuner.search.study import redact
from tuner.ship import workload as workload_mod


def _counts(s: Any, timed: bool = True) -> str:
    """A search summary's trial outcomes, in the order the live view lists them (a
    compile-only worker times nothing: no complete or pruned)."""
    head = f"complete {s.complete}, pruned {s.pruned}, " if timed else ""
    return (f"{head}spilled {s.spilled}, failed {s.failed}, static rejects {s.rejected}, "
            f"duplicates {s.duplicates}")


def _live_table(p: Any) -> Any:

    t = Table(title=f"fa-tune search: study {p.study}", show_header=False)
    t.add_column("what")
    t.add_column("value")
    n = f" of {p.n_trials}" if p.n_trials else ""
    left = ""
    if p.deadline is not None:
        left = f", {max(0.0, p.deadline - time.monotonic()):.0f} s left"
    elapsed = time.monotonic() - p.started
    t.add_row("trial", f"{p.done}{n} ({elapsed:.0f} s{left})")
    t.add_row("complete / pruned / spilled / failed",
              f"{p.complete} / {p.pruned} / {p.spilled} / {p.failed}")
    t.add_row("static rejects / duplicates", f"{p.rejected} / {p.duplicates}")
    t.add_row("compile queue", f"{p.compile_queue} waiting or compiling")
    busy = 100.0 * p.gpu_busy_s / elapsed if elapsed > 0 else 0.0
    t.add_row("GPU busy", f"{busy:.0f} % (worker restarts {p.worker_restarts}, recycled "
              f"{p.worker_recycles})")
    gs = getattr(p, "gpu_state", None)
    if gs:
        t.add_row("GPU", gs)
    if p.best_value is not None:
        per = ", ".join(f"{s} {v:.1f}" for s, v in p.best_shapes.items())
        t.add_row("best (confirmed)", f"trial {p.best_trial}: {p.best_value:.1f} TFLOPS ({per})")
    else:
        t.add_row("best (confirmed)", "-")
    t.add_row("now", p.current or "-")
    for _, e in p.events.items[-4:]:
        t.add_row("", f"[dim]{e}[/]")
    return t


class _EventLines:
    """Piped (a log file, nohup), rich draws the live view once, at the end: there each event
    is also printed as a line when it comes, with the search's seconds, so a log shows where a
    long search's time went. Nothing on a terminal, where the view shows the newest, and
    nothing before the search is ready (Progress.ready): a refusal is its one line alone."""

    def __init__(self) -> None:
        self.on = not console.is_terminal
        self.printed: dict[int, int] = {}  # per worker (device): the events printed so far

    def show(self, log: EventLog, ready: bool, key: int = -1, prefix: str = "") -> None:
        new = log.count - self.printed.get(key, 0)
        if not self.on or not ready or new <= 0:
            return
        self.printed[key] = log.count
        if new > len(log.items):
            console.print(f"{prefix}({new - len(log.items)} events not kept)", highlight=False)
        for t, text in log.items[-new:]:
            console.print(f"[{t:5.0f} s] {prefix}{text}", markup=False, highlight=False,
                          soft_wrap=True)


def _exit_if_stopped(stopped_by: str) -> None:
    """A search stopped by a signal exits as the signal says (the shell's 128 + N): Ctrl-C 130,
    SIGTERM 143, SIGHUP 129, after its summary; one whose --timeout was too short for a
    compile exits 2, as other bad input does."""
    if stopped_by.startswith(TIMEOUT_TOO_SHORT):
        raise typer.Exit(2)
    if stopped_by.startswith("interrupted"):
        code = {"(SIGTERM)": 128 + signal.SIGTERM, "(SIGHUP)": 128 + signal.SIGHUP}
        raise typer.Exit(next((c for k, c in code.items() if stopped_by.endswith(k)), 130))


@user_errors
def search(
    study: StudyOpt = "default",
    space: Annotated[str | None, typer.Option(
        "--space", help="Search space name or YAML file (default: the one for the problems' "
        "head dim: default (D 128), d64, d256).")] = None,
    shape: ShapeOpt = None,
    trials: TrialsOpt = None,
    timeout: TimeoutOpt = None,
    storage: StorageOpt = None,
    sampler: SamplerOpt = "tpe",
    seed: SeedOpt = None,
    jobs: JobsOpt = None,
    device: DeviceOpt = None,
    gpus: GpusOpt = None,
    allow_mixed_gpus: MixedOpt = False,
    artifacts: ArtifactsOpt = None,
    create_only: Annotated[bool, typer.Option(
        "--create-only", help="Create the study (problems, space, known-good points) and "
        "exit; workers join it with `fa-tune worker`. No GPU needed.")] = False,
    worker: WorkerEntryOpt = None,
    max_error_ratio: Annotated[float | None, typer.Option(
        "--max-error-ratio", metavar="X",
        help="Reject a candidate whose max|err| is more than X times the default config's on "
        "the same inputs (err_vs_default), like a failed gate: it never becomes the best.",
    )] = None,
) -> None:
    """Search the kernel's knobs with Optuna; resumable (same --study continues)."""
    shapes = parse_problems(shape)
    check_search_problems(shapes)
    pclass = class_of(shapes)
    sp = space_mod.load_space(space or space_mod.default_space_name(pclass.head_dim)).for_class(
        pclass)
    if create_only:
        given = [name for name, v in (
            ("--trials", trials), ("--timeout", timeout), ("--seed", seed), ("--jobs", jobs),
            ("--device", device), ("--gpus", gpus), ("--worker", worker),
            ("--artifacts", artifacts), ("--max-error-ratio", max_error_ratio),
            ("--allow-mixed-gpus", allow_mixed_gpus or None),
            ("--sampler", None if sampler == "tpe" else sampler)) if v is not None]
        if given:
            raise SearchError(f"--create-only makes the study and exits; {', '.join(given)} "
                              "belong to the workers that join it (fa-tune worker)")
        s = search_mod.Search(study=study, space=sp, shapes=shapes, storage=storage,
                              heartbeat_s=None)
        s.prepare()
        console.print(f"study {s.study_name} ready ({', '.join(map(str, shapes))}; space "
                      f"{sp.source}); storage: {redact(s.url)}", soft_wrap=True)
        console.print(f"join it from each GPU host: fa-tune worker --study {s.study_name} "
                      f"--storage URL --gpus all --timeout DURATION", soft_wrap=True)
        return
    _run_search(study=study, space=sp, shapes=shapes, storage=storage, trials=trials,
                timeout=timeout, sampler=sampler, seed=seed, jobs=jobs, device=device,
                gpus=gpus, allow_mixed_gpus=allow_mixed_gpus, worker=worker,
                max_error_ratio=max_error_ratio, artifacts=artifacts)


@user_errors
def worker_cmd(
    study: Annotated[str, typer.Option("--study", help="The study to join (it must exist).")],
    storage: StorageOpt = None,
    trials: TrialsOpt = None,
    timeout: TimeoutOpt = None,
    sampler: SamplerOpt = "tpe",
    seed: SeedOpt = None,
    jobs: JobsOpt = None,
    device: DeviceOpt = None,
    gpus: GpusOpt = None,
    allow_mixed_gpus: MixedOpt = False,
    worker: WorkerEntryOpt = None,
    artifacts: ArtifactsOpt = None,
    compile_only: Annotated[bool, typer.Option(
        "--compile-only", help="No GPU here: compile the candidates the sampler asks for and "
        "hand them to the GPU workers (they pop them first and fetch the kernels from "
        "--artifacts, which this needs).")] = False,
) -> None:
    """Join an existing study as one more worker (this host's GPUs), from any host."""
    if compile_only and not artifacts:
        raise SearchError("--compile-only needs --artifacts URL: the store the GPU hosts fetch "
                          "its kernels from")
    if compile_only and (device is not None or gpus is not None):
        raise SearchError("--compile-only uses no GPU: leave out --device and --gpus")
    space, shapes = fleet.study_spec(study, storage)
    check_search_problems(shapes)
    if compile_only:
        assert artifacts is not None  # --compile-only needs it (checked above)
        _run_compile_only(study=study, space=space, shapes=shapes, storage=storage,
                          trials=trials, timeout=timeout, sampler=sampler, seed=seed, jobs=jobs,
                          artifacts=artifacts)
        return
    _run_search(study=study, space=space, shapes=shapes, storage=storage, trials=trials,
                timeout=timeout, sampler=sampler, seed=seed, jobs=jobs, device=device,
                gpus=gpus, allow_mixed_gpus=allow_mixed_gpus, worker=worker,
                artifacts=artifacts)


def _run_compile_only(*, study: str, space: Any, shapes: list[Problem], storage: str | None,
                      trials: int | None, timeout: str | None, sampler: str,
                      seed: int | None, jobs: int | None, artifacts: str) -> None:
    budget = parse_duration(timeout)
    if trials is None and budget is None:
        raise SearchError("give --trials N and/or --timeout DURATION")
    s = search_mod.Search(study=study, space=space, shapes=shapes, storage=storage,
                          n_trials=trials, timeout_s=budget, sampler=sampler, seed=seed,
                          jobs=jobs, artifacts=artifacts,
                          progress_cb=lambda p: None)
    with console.status("compile-only worker: compiling for the GPU workers"):
        summary = s.run_compile_only()
    shared = s.artifacts.published if s.artifacts is not None else 0
    console.print(f"study {summary.study}: {summary.trials_run} candidates compiled and handed "
                  f"to the GPU workers in {summary.wall_s:.0f} s ({shared} kernels published; "
                  f"{_counts(summary, timed=False)}); stopped: {summary.stopped_by}",
                  soft_wrap=True)
    _exit_if_stopped(summary.stopped_by)


def _check_options(trials: int | None, timeout: str | None, sampler: str, device: int | None,
                   gpus: str | None) -> tuple[float | None, list[int]]:
    """The budget and the devices, or the first bad option's one line (before any study)."""
    budget = parse_duration(timeout)
    if trials is None and budget is None:
        raise SearchError("give --trials N and/or --timeout DURATION")
    if sampler not in SAMPLERS:
        raise SearchError(f"unknown sampler '{sampler}'; choose one of {', '.join(SAMPLERS)}")
    if gpus is not None and device is not None:
        raise SearchError("give --device or --gpus, not both")
    return budget, fleet.parse_gpus(gpus) if gpus is not None else [device or 0]


def _run_search(*, study: str, space: Any, shapes: list[Problem], storage: str | None,
                trials: int | None, timeout: str | None, sampler: str, seed: int | None,
                jobs: int | None, device: int | None, gpus: str | None,
                allow_mixed_gpus: bool, worker: str | None,
                max_error_ratio: float | None = None,
                problem_class: ProblemClass | None = None,
                artifacts: str | None = None) -> None:
    """One worker in this process (one GPU), or a fleet of them (--gpus with several)."""
    budget, devices = _check_options(trials, timeout, sampler, device, gpus)
    kwargs: dict[str, Any] = dict(
        study=study, space=space, shapes=shapes, storage=storage, n_trials=trials,
        timeout_s=budget, sampler=sampler, seed=seed, jobs=jobs,
        worker_entry=worker or DEFAULT_ENTRY, allow_mixed_gpus=allow_mixed_gpus,
    )
    if max_error_ratio is not None:
        kwargs["max_error_ratio"] = max_error_ratio
    if problem_class is not None:
        kwargs["problem_class"] = problem_class
    if artifacts is not None:
        kwargs["artifacts"] = artifacts
    if len(devices) > 1:
        _run_fleet(devices, kwargs)
        return
    nvml = None
    try:
        nvml = Nvml(index=devices[0])
    except Exception:  # noqa: BLE001 - NVML is optional
        nvml = None
    live = Live(console=console, refresh_per_second=4, transient=False)
    lines = _EventLines()

    def on_progress(p: Any) -> None:
        if nvml is not None and getattr(nvml, "available", False):
            st = nvml.state()
            p.gpu_state = f"{st.temperature_c} C, SM clock {st.sm_clock_mhz} MHz"
        lines.show(p.events, p.ready)
        live.update(_live_table(p))

    s = search_mod.Search(**kwargs, device_index=devices[0], progress_cb=on_progress)
    live.start()
    try:
        summary = s.run()
    except FaTuneError:
        live.transient = True  # a refusal (no GPU, another GPU model) is its one line alone
        raise
    finally:
        live.stop()
        if not live.transient:
            _end_live()
    console.print(
        f"study {summary.study}: {summary.trials_run} trials in {summary.wall_s:.0f} s "
        f"({summary.trials_per_hour:.0f}/h; {_counts(summary)}); GPU busy "
        f"{100 * summary.gpu_busy_fraction:.0f} %"
        + (f" (of which {summary.temp_wait_s:.0f} s waiting for the GPU to cool)"
           if summary.temp_wait_s >= 0.5 else "")
        + f"; stopped: {summary.stopped_by}"
        + (f"; {summary.not_run} asked but not measured wait in the study (the next search "
           "measures them first)" if summary.not_run else ""),
        soft_wrap=True,
    )
    if summary.best:
        c = summary.best["confirmed"] or {}
        per = ", ".join(f"{k} {v['tflops']:.1f}" for k, v in (c.get("shapes") or {}).items())
        near = (f"; within 1 % of it from {summary.near_best[1]:.0f} s (trial "
                f"{summary.near_best[0]})" if summary.near_best else "")
        console.print(f"best: trial {summary.best['trial']} ({summary.best['config_id']}): "
                      f"{c.get('geomean_tflops', 0):.1f} TFLOPS geomean, confirmed ({per}){near}",
                      soft_wrap=True)
    if summary.final:
        console.print(f"final: {summary.final}", soft_wrap=True)
    console.print(f"storage: {summary.storage}", soft_wrap=True)
    _exit_if_stopped(summary.stopped_by)


def _end_live() -> None:
    """Piped (a log file), rich leaves the live view's last line open: end it."""
    if not console.is_terminal:
        console.print()


def _fleet_table(fp: Any) -> Any:
    """The live view of a fleet: one row per GPU, the study's best, recent events."""
    elapsed = time.monotonic() - fp.started
    left = "" if fp.deadline is None else \
        f", {max(0.0, fp.deadline - time.monotonic()):.0f} s left"
    t = Table(title=f"fa-tune search: study {fp.study} on {len(fp.workers)} GPUs "
                    f"({elapsed:.0f} s{left})")
    for col in ("GPU", "trials", "complete / pruned / failed", "dups / waiting", "compile queue",
                "GPU busy", "now"):
        t.add_column(col)
    best = None
    for dev, w in fp.workers.items():
        p = w.progress
        name = f"{dev}" + (f" {p.gpu_name}" if p is not None and p.gpu_name else "")
        if p is None:
            t.add_row(name, "-", "-", "-", "-", "-", w.error or "starting")
            continue
        run_s = time.monotonic() - p.started
        busy = 100.0 * p.gpu_busy_s / run_s if run_s > 0 else 0.0
        now = w.error or (f"stopped: {w.summary.stopped_by}" if w.summary else p.current or "-")
        t.add_row(name, str(p.done), f"{p.complete} / {p.pruned} / {p.failed}",
                  f"{p.duplicates} / {p.waiting}", str(p.compile_queue), f"{busy:.0f} %",
                  now[:60])
        if p.best_value is not None and (best is None or p.best_value > best.best_value):
            best = p
    if best is not None:
        per = ", ".join(f"{s} {v:.1f}" for s, v in best.best_shapes.items())
        t.add_row("best", "", "", "", "", "", f"trial {best.best_trial} (confirmed): "
                  f"{best.best_value:.1f} TFLOPS ({per})")
    for _, e in fp.events.items[-4:]:
        t.add_row("", "", "", "", "", "", f"[dim]{e[:60]}[/]")
    return t


def _run_fleet(devices: list[int], kwargs: dict[str, Any]) -> None:


    live = Live(console=console, refresh_per_second=4, transient=False)
    lines = _EventLines()

    def on_progress(fp: Any) -> None:
        workers = [(dev, w.progress) for dev, w in fp.workers.items() if w.progress is not None]
        lines.show(fp.events, any(p.ready for _, p in workers))
        for dev, p in workers:
            lines.show(p.events, p.ready, dev, f"GPU {dev}: ")
        live.update(_fleet_table(fp))

    f = fleet.Fleet(devices, kwargs, progress_cb=on_progress)
    live.start()
    try:
        summary = f.run()
    except FaTuneError:
        live.transient = True  # the same refusal from every worker: its one line alone
        raise
    finally:
        live.stop()
        if not live.transient:
            _end_live()
    console.print(
        f"study {summary.study}: {summary.trials_run} trials in {summary.wall_s:.0f} s "
        f"({summary.trials_per_hour:.0f}/h) on {len(devices)} GPUs; stopped: "
        f"{summary.stopped_by}", soft_wrap=True)
    for w in summary.workers:
        s = w.summary
        if s is None:
            console.print(f"  GPU {w.device}: {w.error or 'no summary'}", soft_wrap=True)
            continue
        console.print(
            f"  GPU {w.device} ({s.gpu_name or '?'}): {s.trials_run} trials ({_counts(s)}); "
            f"GPU busy {100 * s.gpu_busy_fraction:.0f} %"
            + (f" (of which {s.temp_wait_s:.0f} s cooling)" if s.temp_wait_s >= 0.5 else "")
            + f"; stopped: {s.stopped_by}"
            + (f"; {s.not_run} not measured wait in the study" if s.not_run else ""),
            soft_wrap=True)
    if summary.best:
        c = summary.best["confirmed"] or {}
        per = ", ".join(f"{k} {v['tflops']:.1f}" for k, v in (c.get("shapes") or {}).items())
        where = (summary.best.get("gpu") or {}).get("device")
        console.print(f"best: trial {summary.best['trial']} ({summary.best['config_id']}): "
                      f"{c.get('geomean_tflops', 0):.1f} TFLOPS geomean, confirmed ({per})"
                      + (f" on GPU {where}" if where is not None else ""), soft_wrap=True)
    console.print(f"storage: {summary.storage}", soft_wrap=True)
    _exit_if_stopped(summary.stopped_by)
    if any(w.error for w in summary.workers):
        raise typer.Exit(1)


@user_errors
def tune(
    workload: Annotated[str, typer.Option(
        "--workload", help="A workload file, or a name from workloads/ (e.g. llama3-8b).")],
    trials: TrialsOpt = None,
    timeout: Annotated[str | None, typer.Option(
        "--timeout", help=("Wall-time budget PER BUCKET, e.g. 30m; each bucket's final (about "
                           "a minute) follows it."))] = None,
    bucket: Annotated[list[str] | None, typer.Option(
        "--bucket", help="Only these buckets (default: all of the workload's).")] = None,
    max_problems: Annotated[int | None, typer.Option(
        "--max-problems", min=1, help="Problems per bucket (default: the file's, else 3).")] = None,
    storage: StorageOpt = None,
    sampler: SamplerOpt = "tpe",
    seed: SeedOpt = None,
    jobs: JobsOpt = None,
    device: DeviceOpt = None,
    gpus: GpusOpt = None,
    allow_mixed_gpus: MixedOpt = False,
    worker: WorkerEntryOpt = None,
) -> None:
    """Search every bucket of a workload, one study each (<workload>-<bucket>), in turn; the
    same command resumes them. Then export the workload's library from those studies."""

    _check_options(trials, timeout, sampler, device, gpus)  # one line before any bucket starts
    w = workload_mod.load_workload(workload)
    plans = w.plan(max_problems)
    names = [p.bucket.name for p in plans]
    for b in bucket or []:
        if b not in names:
            raise workload_mod.WorkloadError(
                f"workload {w.name} has no bucket '{b}'; its buckets: {', '.join(names)}")
    plans = [p for p in plans if not bucket or p.bucket.name in bucket]
    # One shared storage holds every bucket's study only when given; else each study gets its
    # own default file (studies/<workload>-<bucket>.db), as `fa-tune search` would.
    sp = space_mod.load_space(space_mod.default_space_name(w.attention.head_dim))
    for i, p in enumerate(plans, 1):
        problems = [x.problem for x in p.problems]
        check_search_problems(problems)
        # The knobs that change the bucket's own problems (a kind without a softcap keeps
        # softcap_tanh exact).
        bucket_space = sp.for_class(class_of(problems))
        study = f"{w.name}-{p.bucket.name}"
        console.print(f"[bold]bucket {i}/{len(plans)}: {p.bucket.name} "
                      f"(S {p.bucket.range_text()}), study {study}: "
                      f"{', '.join(map(str, problems))}[/]", soft_wrap=True)
        # The bucket's kind's class: its candidates are built as the export builds them.
        _run_search(study=study, space=bucket_space, shapes=problems, storage=storage,
                    trials=trials, timeout=timeout, sampler=sampler, seed=seed, jobs=jobs,
                    device=device, gpus=gpus, allow_mixed_gpus=allow_mixed_gpus, worker=worker,
                    problem_class=w.bucket_class(p.bucket))
    console.print(f"export the library: fa-tune export --workload {workload} --study-prefix "
                  f"{w.name}- --out {w.name}-lib"
                  + (f" --storage {redact(storage)}" if storage else ""), markup=False,
                  soft_wrap=True)
