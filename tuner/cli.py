"""The ``fa-tune`` command line: parse, call the modules, print with rich.

Every command is wrapped by ``_user_errors``: a FaTuneError becomes ONE line on stderr and exit
code 2 (usage errors keep typer's own exit 2). Later commands (search, show, export, profile,
compare) are added the same way: ``@app.command()`` + ``@_user_errors``.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from tuner import _paths
from tuner.config import (
    KernelConfig,
    check_problem,
    check_problems,
    list_presets,
    load_preset,
    problem_class,
    smem_bytes,
)
from tuner.errors import BundleError, ConfigError, FaTuneError
from tuner.problem import Problem, parse_problems

app = typer.Typer(
    name="fa-tune",
    help="Autotuner for a FlashAttention forward kernel (BF16, sm_90a Hopper).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = 2) -> None:
    """One line on stderr, then exit (never a traceback for a user error)."""
    sys.stderr.write(f"fa-tune: error: {' '.join(str(message).split())}\n")
    sys.stderr.flush()
    raise typer.Exit(code)


def _user_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FaTuneError as e:
            fail(str(e), e.exit_code)

    return wrapper  # type: ignore[return-value]


# The problem syntax as typer's rich help shows it: "[/Hkv]" unescaped would be a closing tag.
PROBLEM_SYNTAX = r"BxHq\[/Hkv]xS\[:dD]\[:full]"
PROBLEM_HELP = (f"Problem {PROBLEM_SYNTAX}, e.g. 4x32x8192, 1x32/8x8192 (GQA), "
                "4x32x8192:d64, 4x32x8192:full (non-causal); repeatable (default: the 3 seed "
                "problems).")
ShapeOpt = Annotated[list[str] | None, typer.Option("--shape", "-s", help=PROBLEM_HELP)]
PresetOpt = Annotated[
    str | None, typer.Option("--preset", "-p", help="Preset name (see `fa-tune presets`).")
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="Config YAML/JSON file (knob: value).")
]


def load_config(preset: str | None, config: Path | None) -> tuple[KernelConfig, str]:
    """The config named by exactly one of --preset / --config, and a label for it."""
    if (preset is None) == (config is None):
        raise ConfigError("give exactly one of --preset NAME or --config FILE")
    if preset is not None:
        return load_preset(preset), preset
    assert config is not None
    return KernelConfig.load(config), str(config)


def _yes_no(v: bool | None) -> str:
    return "-" if v is None else ("yes" if v else "no")


# ---- build --------------------------------------------------------------------------------
@app.command()
@_user_errors
def build(
    preset: PresetOpt = None,
    config: ConfigOpt = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Parallel nvcc jobs.")] = 1,
) -> None:
    """Compile a config for sm_90a (no GPU needed) and print its ptxas/SASS report."""
    from tuner import build as build_mod

    cfg, label = load_config(preset, config)
    [outcome] = build_mod.build_many([cfg], jobs=jobs)
    if outcome.error is not None:
        raise outcome.error
    r = outcome.result
    assert r is not None
    e = r.main_entry
    sass = r.sass or {}
    t = Table(title=f"{label} ({cfg.config_id()})")
    t.add_column("resource")
    t.add_column("value", justify="right")
    spills = f"{e.get('spill_stores', '?')} B stores / {e.get('spill_loads', '?')} B loads"
    smem_dyn = r.smem_dynamic if r.smem_dynamic is not None else smem_bytes(cfg)
    rows = [
        ("registers / thread", str(e.get("registers", "?"))),
        ("spills", spills if not r.any_spills else f"[red]{spills}[/]"),
        ("stack frame", f"{e.get('stack_frame', '?')} B"),
        ("shared memory", f"{smem_dyn} B dynamic + {e.get('smem', 0)} B static"),
        ("compile time", f"{r.compile_seconds:.1f} s"),
        ("cache hit", _yes_no(r.cache_hit)),
        ("SASS has HGMMA", _yes_no(sass.get("has_hgmma")) if r.sass_checked else "unchecked"),
        ("SASS LDL / STL", f"{sass.get('ldl', 0)} / {sass.get('stl', 0)}"
         if r.sass_checked else "unchecked"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    if not r.sass_checked:
        console.print(f"[yellow]SASS not checked: {r.sass_note}[/]")
    for w in r.ptxas.get("warnings", []):
        console.print(f"[yellow]{w}[/]")
    console.print(f"artifact: {r.so_path}", soft_wrap=True)


# ---- run ----------------------------------------------------------------------------------
SettleOpt = Annotated[float, typer.Option(
    "--settle-s", help="Seconds of untimed launches before each round's warm-up, so every "
    "kernel is timed at the power-capped steady state (0: the seeds' protocol exactly).")]
@app.command()
@_user_errors
def run(
    preset: PresetOpt = None,
    config: ConfigOpt = None,
    shape: ShapeOpt = None,
    warmup: Annotated[int, typer.Option(min=0, help="Warm-up launches per round.")] = 50,
    repeat: Annotated[int, typer.Option(min=1, help="Timed launches per round.")] = 200,
    rounds: Annotated[int, typer.Option(min=1, help="Independently warmed rounds.")] = 3,
    settle_s: SettleOpt = 2.0,
    results_dir: Annotated[
        Path | None, typer.Option("--results-dir", help="Root of result folders.")
    ] = None,
    device: Annotated[int, typer.Option(min=0, help="CUDA device index.")] = 0,
) -> None:
    """Build, gate (vs the FP32 reference) and time a config; write a result folder."""
    cfg, label = load_config(preset, config)
    shapes = parse_problems(shape)
    check_problems(cfg, shapes)
    from tuner import runner
    from tuner.measure import timing

    protocol = timing.Protocol(warmup=warmup, repeat=repeat, rounds=rounds, settle_s=settle_s)
    report = runner.run_config(
        cfg,
        shapes,
        protocol,
        results_dir,
        preset=preset,
        config_file=str(config) if config else None,
        device_index=device,
        log=lambda m: console.print(f"[dim]{m}[/]"),
    )
    p = report.payload
    t = Table(title=f"{label} ({p['config_id']}) on {p['gpu'].get('name', '?')}")
    for col in ("shape", "gate", "max abs err", "median ms", "min / max ms", "TFLOPS"):
        t.add_column(col, justify="right")
    for s in p["shapes"]:
        g = s.get("gate") or {}
        tm = s.get("timing") or {}
        gate = {True: "[green]pass[/]", False: "[red]FAIL[/]"}.get(g.get("passed"), "[red]error[/]")
        err = g.get("max_abs_err")
        t.add_row(
            s["shape"],
            gate,
            f"{err:.3g}" if isinstance(err, float) else "-",
            f"{tm['median_ms']:.3f}" if tm else "-",
            f"{tm['min_ms']:.3f} / {tm['max_ms']:.3f}" if tm else "-",
            f"{tm['tflops']:.1f}" if tm else "-",
        )
    console.print(t)
    console.print(f"results: {report.result_dir}", soft_wrap=True)
    if not report.passed:
        sys.stderr.write(f"fa-tune: run FAILED: {p['failure']}\n")
        raise typer.Exit(1)


# ---- doctor -------------------------------------------------------------------------------
@app.command()
def doctor(
    build_only: Annotated[bool, typer.Option(
        "--build-only", help="Only the build requirements decide the exit code (a machine "
        "that compiles kernels but never runs them).")] = False,
) -> None:
    """Check what fa-tune needs and say how to fix gaps; exit 1 if something required is missing.

    To build: nvcc compiling sm_90a, cuobjdump (SASS check), the CUTLASS headers.

    To run (run, search, compare, profile): cuda-python, the NVIDIA driver, an sm_90 GPU, NVML.

    Optional: Nsight Compute (profile). Exit 0: all required there; 1: something missing; 2: usage.
    """
    from tuner import doctor as doc

    checks = doc.run_checks()
    t = Table(title="fa-tune doctor")
    t.add_column("check", no_wrap=True)  # names stay whole; found / to fix wrap instead
    t.add_column("needed for", no_wrap=True)
    t.add_column("ok", no_wrap=True)
    t.add_column("found")
    t.add_column("to fix")
    for c in checks:
        ok = "[green]yes[/]" if c.ok else ("[yellow]no[/]" if c.need == doc.OPTIONAL
                                            else "[red]no[/]")
        t.add_row(c.name, c.need, ok, c.detail, "" if c.ok else c.fix)
    console.print(t)
    code, line = doc.summarize(checks, build_only=build_only)
    # Plain and unwrapped (not in the table): scripts and narrow terminals read it whole.
    console.print(line, markup=False, highlight=False, soft_wrap=True)
    if code:
        raise typer.Exit(code)


# ---- presets ------------------------------------------------------------------------------
@app.command()
@_user_errors
def presets() -> None:
    """List the presets and how each differs from the defaults."""
    t = Table(title=f"presets ({_paths.presets_dir()})")
    t.add_column("name")
    t.add_column("id")
    t.add_column("differs from default")
    for name in list_presets():
        cfg = load_preset(name)
        diff = ", ".join(f"{k}={v}" for k, v in cfg.diff_from_default().items())
        t.add_row(name, cfg.config_id(), diff or "(all defaults)")
    console.print(t)


# ---- bundle -------------------------------------------------------------------------------
# Wheels for a GPU host without network: manylinux x86_64, glibc 2.17 .. 2.34.
BUNDLE_PLATFORMS = (
    "manylinux_2_34_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)


def _pip(args: list[str], what: str) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        lines = [ln for ln in (p.stderr + p.stdout).splitlines() if "ERROR" in ln] or [
            ln for ln in p.stderr.splitlines() if ln.strip()
        ]
        raise BundleError(f"{what} failed: {lines[0].strip() if lines else p.returncode}")


@app.command()
@_user_errors
def bundle(
    out: Annotated[Path, typer.Option("--out", "-o", help="Wheelhouse folder (new or empty).")],
    python: Annotated[
        str, typer.Option("--python", help="Target Python version, e.g. 3.12.")
    ] = f"{sys.version_info.major}.{sys.version_info.minor}",
) -> None:
    """Write a wheelhouse so `pip install --no-index --find-links DIR fa-tune` works offline."""
    import re

    if not re.fullmatch(r"3\.\d{1,2}", python):
        raise BundleError(f"--python must look like 3.12 (got '{python}')")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BundleError(f"{out} exists and is not an empty folder; choose a new --out")
    if not _paths.is_source_checkout() or not (_paths.data_root() / "pyproject.toml").is_file():
        raise BundleError("bundle builds fa-tune's wheel and needs a source checkout of fa-tune")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        console.print("building the fa-tune wheel ...")
        _pip(["wheel", str(_paths.data_root()), "--no-deps", "-w", tmp], "pip wheel")
        [whl] = list(Path(tmp).glob("fa_tune-*.whl"))
        shutil.copy2(whl, out / whl.name)
    console.print(f"downloading dependencies for CPython {python} manylinux x86_64 ...")
    plat = [a for p in BUNDLE_PLATFORMS for a in ("--platform", p)]
    _pip(
        ["download", str(out / whl.name), "-d", str(out), "--only-binary=:all:",
         "--python-version", python, "--implementation", "cp", *plat],
        "pip download",
    )
    n = len(list(out.glob("*.whl")))
    console.print(f"{n} wheels in {out}; on the GPU host: "
                  f"pip install --no-index --find-links {out} fa-tune")


# ---- compare ------------------------------------------------------------------------------
def _study_best(study: str, storage: str | None) -> tuple[KernelConfig, dict[str, Any] | None]:
    """The study's best config and what the search confirmed for it (None if unconfirmed)."""
    from tuner.study import best_trial

    t = best_trial(study, storage)
    if t is None or not isinstance(t.user_attrs.get("config"), dict):
        raise ConfigError(f"study '{study}' has no best config (no trial passed its gate yet)")
    cfg = KernelConfig.from_dict(t.user_attrs["config"], source=f"study '{study}'")
    conf = t.user_attrs.get("confirmed")
    return cfg, conf if isinstance(conf, dict) else None


@app.command()
@_user_errors
def compare(
    study: Annotated[
        str | None, typer.Option("--study", help="Compare the best config of this study.")
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option("--storage", help="The study's Optuna RDB URL (default "
                     "sqlite:///studies/<study>.db)."),
    ] = None,
    preset: PresetOpt = None,
    config: ConfigOpt = None,
    shape: ShapeOpt = None,
    backends: Annotated[
        str | None,
        typer.Option("--backends", "-b", help="Peers, comma-separated: fa3,cudnn,fa2,triton,"
                     "mem_efficient, all or none (default: fa3,cudnn,fa2,triton)."),
    ] = None,
    warmup: Annotated[int, typer.Option(min=0, help="Warm-up launches per round.")] = 50,
    repeat: Annotated[int, typer.Option(min=1, help="Timed launches per round.")] = 200,
    rounds: Annotated[int, typer.Option(min=1, help="Independently warmed rounds.")] = 3,
    settle_s: SettleOpt = 2.0,
    results_dir: Annotated[
        Path | None, typer.Option("--results-dir", help="Root of result folders.")
    ] = None,
) -> None:
    """Time fa-tune's kernel beside FA3, cuDNN, FA2 and Triton on the same inputs (gated)."""
    from tuner import compare as compare_mod
    from tuner.config import validate
    from tuner.peers.base import module_missing

    given = [n for n, v in (("--study", study), ("--preset", preset), ("--config", config))
             if v is not None]
    if len(given) > 1:
        raise ConfigError(f"give at most one of --study, --preset or --config (got "
                          f"{' and '.join(given)})")
    # Every cheap check before a compile that can take a minute.
    problems = parse_problems(shape)
    shapes = [str(p) for p in problems] if shape else None
    peers = compare_mod.parse_backends(backends)
    from tuner.measure.timing import Protocol

    Protocol(warmup=warmup, repeat=repeat, rounds=rounds, settle_s=settle_s)
    cfg: KernelConfig | None = None
    confirmed = None
    if storage is not None and study is None:
        raise ConfigError("--storage goes with --study")
    if study is not None:
        (cfg, confirmed), label = _study_best(study, storage), f"study {study}"
    elif given:
        cfg, label = load_config(preset, config)
    if cfg is not None:
        validate(cfg)
        check_problems(cfg, problems)  # head dim 128 so far; one mask per kernel library
    if peers and module_missing("torch"):
        raise FaTuneError("fa-tune compare's peers need torch with CUDA: pip install "
                          "'fa-tune[peers]' (or --backends none for fa-tune's kernel alone)")
    if cfg is None and not peers:
        raise ConfigError("nothing to compare: give --study, --preset or --config, or peers")
    # No GPU: say so before spending a minute compiling.
    from tuner import runtime

    runtime.Device.open(0)
    so_path: Path | None = None
    if cfg is not None:
        from tuner import build as build_mod

        console.print(f"[dim]building {label} ({cfg.config_id()}) ...[/]")
        built = build_mod.build_config(cfg, causal=problem_class(problems))
        built.require_timeable()
        so_path = Path(built.so_path)
    else:
        console.print("[dim]no --study/--preset/--config: comparing the peers only[/]")
    payload = compare_mod.compare_command(
        so_path, shapes, backends, warmup=warmup, repeat=repeat, rounds=rounds,
        results_root=results_dir, console=console, settle_s=settle_s, confirmed=confirmed,
    )
    kernel_names = {b["name"] for b in payload.get("backends", []) if b.get("role") == "kernel"}
    for b in payload.get("backends", []):
        if b["name"] in kernel_names and not b.get("available"):
            fail(f"fa-tune's kernel could not run: {b.get('reason')}")
    bad = [r for r in payload.get("summary", [])
           if r["backend"] in kernel_names and r["status"] != "ok"]
    if bad:
        sys.stderr.write("fa-tune: compare FAILED: " + "; ".join(
            f"{r['shape']}: {r['status']} ({r['reason']})" for r in bad) + "\n")
        raise typer.Exit(1)


# ---- search, show, export, profile (issue 5) -------------------------------------------------
def _check_search_problems(problems: list[Problem]) -> None:
    """The search tunes fa-tune's kernel: every problem must be one the kernel runs."""
    check_problems(KernelConfig(), problems)


StudyOpt = Annotated[str, typer.Option("--study", help="Study name.")]
StorageOpt = Annotated[
    str | None,
    typer.Option("--storage", help="Optuna RDB URL (default sqlite:///studies/<study>.db)."),
]
TrialOpt = Annotated[int | None, typer.Option("--trial", help="Trial number (default: best).")]


def _live_table(p: Any) -> Any:
    import time as _time

    t = Table(title=f"fa-tune search: study {p.study}", show_header=False)
    t.add_column("what")
    t.add_column("value")
    n = f" of {p.n_trials}" if p.n_trials else ""
    left = ""
    if p.deadline is not None:
        left = f", {max(0.0, p.deadline - _time.monotonic()):.0f} s left"
    elapsed = _time.monotonic() - p.started
    t.add_row("trial", f"{p.done}{n} ({elapsed:.0f} s{left})")
    t.add_row("complete / pruned / failed", f"{p.complete} / {p.pruned} / {p.failed}")
    t.add_row("static rejects / duplicates", f"{p.rejected} / {p.duplicates}")
    t.add_row("compile queue", f"{p.compile_queue} waiting or compiling")
    busy = 100.0 * p.gpu_busy_s / elapsed if elapsed > 0 else 0.0
    t.add_row("GPU busy", f"{busy:.0f} % (worker restarts {p.worker_restarts})")
    gs = getattr(p, "gpu_state", None)
    if gs:
        t.add_row("GPU", gs)
    if p.best_value is not None:
        per = ", ".join(f"{s} {v:.1f}" for s, v in p.best_shapes.items())
        t.add_row("best (confirmed)", f"trial {p.best_trial}: {p.best_value:.1f} TFLOPS ({per})")
    else:
        t.add_row("best (confirmed)", "-")
    t.add_row("now", p.current or "-")
    for e in p.last_events[-4:]:
        t.add_row("", f"[dim]{e}[/]")
    return t


@app.command()
@_user_errors
def search(
    study: StudyOpt = "default",
    space: Annotated[str, typer.Option("--space", help="Search space name or YAML file.")] = (
        "default"
    ),
    shape: ShapeOpt = None,
    trials: Annotated[
        int | None, typer.Option("--trials", "-n", help="Trials to run (compiled ones).")
    ] = None,
    timeout: Annotated[
        str | None, typer.Option("--timeout", help="Wall-time budget, e.g. 90s, 10m, 1h.")
    ] = None,
    storage: StorageOpt = None,
    sampler: Annotated[str, typer.Option("--sampler", help="tpe | random | grid | cmaes.")] = (
        "tpe"
    ),
    seed: Annotated[int | None, typer.Option("--seed", help="Sampler seed.")] = None,
    jobs: Annotated[
        int | None, typer.Option("--jobs", "-j", min=1, help="Parallel nvcc (default: cores).")
    ] = None,
    device: Annotated[int, typer.Option(min=0, help="CUDA device index.")] = 0,
    worker: Annotated[
        str | None,
        typer.Option("--worker", hidden=True, help="GPU worker entry point (module:function)."),
    ] = None,
) -> None:
    """Search the kernel's knobs with Optuna; resumable (same --study continues)."""
    from rich.live import Live

    from tuner import search as search_mod
    from tuner import space as space_mod
    from tuner.gpu_worker import DEFAULT_ENTRY
    from tuner.sampler import SAMPLERS
    from tuner.study import SearchError

    sp = space_mod.load_space(space)
    shapes = parse_problems(shape)
    _check_search_problems(shapes)
    budget = search_mod.parse_duration(timeout)
    if trials is None and budget is None:
        raise SearchError("give --trials N and/or --timeout DURATION")
    if sampler not in SAMPLERS:
        raise SearchError(f"unknown sampler '{sampler}'; choose one of {', '.join(SAMPLERS)}")
    nvml = None
    try:
        from tuner.measure.timing import Nvml

        nvml = Nvml(index=device)
    except Exception:  # noqa: BLE001 - NVML is optional
        nvml = None
    live = Live(console=console, refresh_per_second=4, transient=False)

    def on_progress(p: Any) -> None:
        if nvml is not None and getattr(nvml, "available", False):
            st = nvml.state()
            p.gpu_state = f"{st.temperature_c} C, SM clock {st.sm_clock_mhz} MHz"
        live.update(_live_table(p))

    s = search_mod.Search(
        study=study, space=sp, shapes=shapes, storage=storage, n_trials=trials,
        timeout_s=budget, sampler=sampler, seed=seed, jobs=jobs, device_index=device,
        worker_entry=worker or DEFAULT_ENTRY, progress_cb=on_progress,
    )
    with live:
        summary = s.run()
    console.print(
        f"study {summary.study}: {summary.trials_run} trials in {summary.wall_s:.0f} s "
        f"({summary.trials_per_hour:.0f}/h; complete {summary.complete}, pruned "
        f"{summary.pruned}, failed {summary.failed}, static rejects {summary.rejected}); "
        f"GPU busy {100 * summary.gpu_busy_fraction:.0f} %"
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
        console.print(f"best: trial {summary.best['trial']} ({summary.best['config_id']}): "
                      f"{c.get('geomean_tflops', 0):.1f} TFLOPS geomean, confirmed ({per})")
    console.print(f"storage: {summary.storage}", soft_wrap=True)
    if summary.stopped_by.startswith("interrupted"):
        raise typer.Exit(130)


def _show_best(study: str, storage: str | None, shape: str | None, top: int) -> None:
    from tuner import show as show_mod
    from tuner.study import SearchError

    if shape is not None:
        shape = str(Problem.parse(shape))
    _, trials = show_mod.study_trials(study, storage)
    rows = show_mod.best_rows(trials, shape, top)
    if not rows:
        raise SearchError(f"study '{study}' has no completed trial"
                          + (f" measured on {shape}" if shape else ""))
    shapes = list(rows[0]["shapes"])
    t = Table(title=f"study {study}: best {len(rows)}" + (f" on {shape}" if shape else ""))
    for col in ("trial", "config", "geomean TFLOPS", "confirmed", *shapes, "differs from default"):
        t.add_column(col, justify="right" if col not in ("config", "differs from default")
                     else "left")
    for r in rows:
        cfg = KernelConfig.from_dict(r["config"]) if r["config"] else KernelConfig()
        diff = ", ".join(f"{k}={v}" for k, v in cfg.diff_from_default().items())
        t.add_row(str(r["trial"]), r["config_id"], f"{r['value']:.1f}",
                  "yes" if r["confirmed"] else "[yellow]no[/]",
                  *[f"{r['shapes'].get(s, float('nan')):.1f}" for s in shapes], diff or "-")
    console.print(t)
    # The winner's every knob as YAML, outside the table: rich shrinks and cuts table cells to
    # the terminal (80 columns when piped), the config must survive whole and be usable as is.
    best = rows[0]
    cfg = KernelConfig.from_dict(best["config"]) if best["config"] else KernelConfig()
    confirmed = "confirmed" if best["confirmed"] else "NOT confirmed (search protocol only)"
    console.print(
        f"# best: trial {best['trial']} ({best['config_id']}), {best['value']:.1f} TFLOPS "
        f"geomean, {confirmed}\n# save as best.yaml; `fa-tune run --config best.yaml` "
        f"times it\n{cfg.to_yaml()}",
        markup=False, highlight=False, soft_wrap=True,  # ends with a blank line
    )


@app.command()
@_user_errors
def show(
    what: Annotated[str, typer.Argument(help="best | trials | importance | plots")] = "best",
    study: StudyOpt = "default",
    storage: StorageOpt = None,
    shape: Annotated[str | None, typer.Option(
        "--shape", help=f"Rank by this problem ({PROBLEM_SYNTAX}).")] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="How many configs.")] = 5,
) -> None:
    """Read a study: best configs, all trials, knob importances (fANOVA), PNG plots."""
    from tuner import show as show_mod
    from tuner.study import SearchError

    if what == "best":
        _show_best(study, storage, shape, top)
        what = "importance+plots"
    elif what == "trials":
        _, trials = show_mod.study_trials(study, storage)
        counts = ", ".join(f"{n} {state}" for state, n in show_mod.state_counts(trials).items())
        t = Table(title=f"study {study}: {len(trials)} trials ({counts})")
        for col in ("trial", "state", "value", "confirmed", "config", "reason"):
            t.add_column(col)
        for r in show_mod.trial_rows(trials):
            t.add_row(str(r["trial"]), r["state"],
                      "-" if r["value"] is None else f"{r['value']:.1f}",
                      "-" if r["confirmed"] is None else f"{r['confirmed']:.1f}",
                      r["config_id"], r["reason"][:120])
        console.print(t)
        return
    elif what not in ("importance", "plots"):
        raise SearchError(f"unknown `show {what}`; use best, trials, importance or plots")
    st, trials = show_mod.study_trials(study, storage)
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


@app.command()
@_user_errors
def export(
    out: Annotated[Path, typer.Option("--out", "-o", help="New folder for the package.")],
    study: StudyOpt = "default",
    storage: StorageOpt = None,
    trial: TrialOpt = None,
) -> None:
    """Write a standalone package of a tuned kernel (source, build.sh, .so, README)."""
    from tuner import export as export_mod

    r = export_mod.export_trial(study, storage, trial, out)
    console.print(f"exported trial {r['trial']} ({r['config_id']}) to {r['out']}", soft_wrap=True)


@app.command()
@_user_errors
def profile(
    shape: Annotated[str, typer.Option(
        "--shape", "-s", help=f"Problem to profile: {PROBLEM_SYNTAX} (the kernel runs "
        "D 128; MHA/GQA/MQA, causal or :full).")],
    study: StudyOpt = "default",
    storage: StorageOpt = None,
    trial: TrialOpt = None,
) -> None:
    """Nsight Compute on one tuned kernel (one launch, --set full); print headline metrics."""
    from tuner import profile as profile_mod

    sh = Problem.parse(shape)
    check_problem(KernelConfig(), sh)
    r = profile_mod.profile_trial(study, storage, trial, sh)
    t = Table(title=f"trial {r['trial']} ({r['config_id']}) on {sh}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in r["headline"].rows():
        t.add_row(k, v)
    console.print(t)
    console.print(f"report: {r['report']}", soft_wrap=True)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    try:
        app(args=argv, prog_name="fa-tune")
    except FaTuneError as e:  # a command without the decorator; still one line
        sys.stderr.write(f"fa-tune: error: {e}\n")
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("fa-tune: interrupted\n")
        sys.exit(130)


if __name__ == "__main__":
    main()
