"""The ``fa-tune`` command line: parse, call the modules, print with rich.

Every command is wrapped by ``_user_errors``: a FaTuneError becomes ONE line on stderr and exit
code 2 (usage errors keep typer's own exit 2). Later commands (search, show, export, profile,
compare) are added the same way: ``@app.command()`` + ``@_user_errors``.
"""

from __future__ import annotations

import functools
import shlex
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
from tuner.errors import BundleError, ConfigError, FaTuneError
from tuner.kernel.config import KernelConfig, list_presets, load_preset, smem_bytes
from tuner.kernel.support import check_problems, check_runnable
from tuner.problem import HEAD_DIMS, Problem, ProblemClass, class_of, parse_problems
from tuner.search.trials import best_rows, study_best, study_trials

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
PROBLEM_SYNTAX = r"BxHq\[/Hkv]xS\[:kSK]\[:dD]\[:full]\[:qkv|:bhsd]"
PROBLEM_HELP = (f"Problem {PROBLEM_SYNTAX}, e.g. 4x32x8192, 1x32/8x8192 (GQA), "
                "4x32x8192:d64, 4x32x8192:full (non-causal); :kSK: S queries over SK keys, e.g. "
                "1x32/8x2048:k8192; :qkv: q, k, v as views of one fused QKV tensor, e.g. "
                "1x32/8x8192:qkv; :bhsd: k, v as views of \\[B, Hkv, SK, D] memory (a KV cache), "
                "e.g. 1x32/8x2048:k8192:bhsd; repeatable (default: the 3 seed problems).")
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
    head_dim: Annotated[int, typer.Option(
        "--head-dim", help="Head dim compiled in: 64, 128 or 256.")] = 128,
    full: Annotated[bool, typer.Option(
        "--full", help="Build the non-causal kernel (default: causal).")] = False,
) -> None:
    """Compile a config for sm_90a (no GPU needed) and print its ptxas/SASS report."""
    from tuner.kernel import build as build_mod

    if head_dim not in HEAD_DIMS:
        raise ConfigError(f"--head-dim must be one of {', '.join(map(str, HEAD_DIMS))} "
                          f"(got {head_dim})")
    pclass = ProblemClass(head_dim, not full)
    cfg, label = load_config(preset, config)
    [outcome] = build_mod.build_many([cfg], jobs=jobs, pclass=pclass)
    if outcome.error is not None:
        raise outcome.error
    r = outcome.result
    assert r is not None
    e = r.main_entry
    sass = r.sass or {}
    t = Table(title=f"{label} ({cfg.config_id()}), {pclass}")
    t.add_column("resource")
    t.add_column("value", justify="right")
    spills = f"{e.get('spill_stores', '?')} B stores / {e.get('spill_loads', '?')} B loads"
    smem_dyn = r.smem_dynamic if r.smem_dynamic is not None else smem_bytes(cfg, head_dim)
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
    from tuner.measure import runner, timing

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


# Extras a wheelhouse may carry (pyproject's optional dependencies that GPU hosts run with).
BUNDLE_EXTRAS = ("postgres", "peers", "torch", "hf")


@app.command()
@_user_errors
def bundle(
    out: Annotated[Path, typer.Option("--out", "-o", help="Wheelhouse folder (new or empty).")],
    python: Annotated[
        str, typer.Option("--python", help="Target Python version, e.g. 3.12.")
    ] = f"{sys.version_info.major}.{sys.version_info.minor}",
    extra: Annotated[list[str] | None, typer.Option(
        "--extra", help="Also bundle an optional extra's dependencies, e.g. postgres (a worker "
        "on a PostgreSQL study).")] = None,
) -> None:
    """Write a wheelhouse so `pip install --no-index --find-links DIR fa-tune` works offline."""
    import re

    if not re.fullmatch(r"3\.\d{1,2}", python):
        raise BundleError(f"--python must look like 3.12 (got '{python}')")
    extras = sorted(set(extra or []))
    for e in extras:
        if e not in BUNDLE_EXTRAS:
            raise BundleError(f"unknown --extra '{e}'; choose from {', '.join(BUNDLE_EXTRAS)}")
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
    req = str(out / whl.name) + (f"[{','.join(extras)}]" if extras else "")
    _pip(
        ["download", req, "-d", str(out), "--only-binary=:all:",
         "--python-version", python, "--implementation", "cp", *plat],
        "pip download",
    )
    n = len(list(out.glob("*.whl")))
    what = "fa-tune" + (f"[{','.join(extras)}]" if extras else "")
    console.print(f"{n} wheels in {out}; on the GPU host: "
                  f"pip install --no-index --find-links {out} '{what}'")


# ---- compare ------------------------------------------------------------------------------
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
    from tuner.analysis import compare as compare_mod
    from tuner.measure.peers.base import module_missing

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
        cfg, confirmed, measured = study_best(study, storage)
        label = f"study {study}"
        if not shape and measured:  # the study's own problems (a D 256 study: D 256 ones)
            problems, shapes = measured, [str(p) for p in measured]
    elif given:
        cfg, label = load_config(preset, config)
    if cfg is not None:
        pclass = check_problems(cfg, problems)  # one problem class per kernel library
    if peers and module_missing("torch"):
        raise FaTuneError("fa-tune compare's peers need torch with CUDA: pip install "
                          "'fa-tune[peers]' (or --backends none for fa-tune's kernel alone)")
    if cfg is None and not peers:
        raise ConfigError("nothing to compare: give --study, --preset or --config, or peers")
    # No GPU: say so before spending a minute compiling.
    from tuner.kernel import runtime

    runtime.Device.open(0)
    so_path: Path | None = None
    if cfg is not None:
        from tuner.kernel import build as build_mod

        console.print(f"[dim]building {label} ({cfg.config_id()}) ...[/]")
        built = build_mod.build_config(cfg, pclass=pclass)
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
    """The search tunes fa-tune's kernel: every problem must be one the kernel runs, all of one
    problem class (head dim and mask: one kernel library serves one)."""
    check_runnable(problems)


StudyOpt = Annotated[str, typer.Option("--study", help="Study name.")]
TrialsOpt = Annotated[int | None, typer.Option(
    "--trials", "-n", help="Trials to run (compiled ones); with --gpus, for all GPUs together.")]
TimeoutOpt = Annotated[
    str | None, typer.Option("--timeout", help="Wall-time budget, e.g. 90s, 10m, 1h.")
]
SamplerOpt = Annotated[str, typer.Option("--sampler", help="tpe | random | grid | cmaes.")]
SeedOpt = Annotated[int | None, typer.Option(
    "--seed", help="Sampler seed (with --gpus, GPU i's worker samples with seed + i).")]
JobsOpt = Annotated[int | None, typer.Option(
    "--jobs", "-j", min=1, help="Parallel nvcc (default: cores; with --gpus, split evenly).")]
DeviceOpt = Annotated[int | None, typer.Option(min=0, help="CUDA device index (default 0).")]
GpusOpt = Annotated[str | None, typer.Option(
    "--gpus", help="Several GPUs of this host, one worker each, all on the study: 0,1,... or "
    "all.")]
MixedOpt = Annotated[bool, typer.Option(
    "--allow-mixed-gpus", help="Join a study measured on another GPU model anyway (its "
    "timings will not compare).")]
WorkerEntryOpt = Annotated[str | None, typer.Option(
    "--worker", hidden=True, help="GPU worker entry point (module:function).")]
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
    for e in p.last_events[-4:]:
        t.add_row("", f"[dim]{e}[/]")
    return t


@app.command()
@_user_errors
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
    create_only: Annotated[bool, typer.Option(
        "--create-only", help="Create the study (problems, space, known-good points) and "
        "exit; workers join it with `fa-tune worker`. No GPU needed.")] = False,
    worker: WorkerEntryOpt = None,
) -> None:
    """Search the kernel's knobs with Optuna; resumable (same --study continues)."""
    from tuner.search import loop as search_mod
    from tuner.search import space as space_mod

    shapes = parse_problems(shape)
    _check_search_problems(shapes)
    sp = space_mod.load_space(space or space_mod.default_space_name(class_of(shapes).head_dim))
    if create_only:
        s = search_mod.Search(study=study, space=sp, shapes=shapes, storage=storage,
                              heartbeat_s=None)
        s.prepare()
        console.print(f"study {s.study_name} ready ({', '.join(map(str, shapes))}; space "
                      f"{sp.source}); storage: {search_mod.redact(s.url)}", soft_wrap=True)
        console.print(f"join it from each GPU host: fa-tune worker --study {s.study_name} "
                      f"--storage URL --gpus all --timeout DURATION", soft_wrap=True)
        return
    _run_search(study=study, space=sp, shapes=shapes, storage=storage, trials=trials,
                timeout=timeout, sampler=sampler, seed=seed, jobs=jobs, device=device,
                gpus=gpus, allow_mixed_gpus=allow_mixed_gpus, worker=worker)


@app.command("worker")
@_user_errors
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
) -> None:
    """Join an existing study as one more worker (this host's GPUs), from any host."""
    from tuner.search import fleet

    space, shapes = fleet.study_spec(study, storage)
    _check_search_problems(shapes)
    _run_search(study=study, space=space, shapes=shapes, storage=storage, trials=trials,
                timeout=timeout, sampler=sampler, seed=seed, jobs=jobs, device=device,
                gpus=gpus, allow_mixed_gpus=allow_mixed_gpus, worker=worker)


def _run_search(*, study: str, space: Any, shapes: list[Problem], storage: str | None,
                trials: int | None, timeout: str | None, sampler: str, seed: int | None,
                jobs: int | None, device: int | None, gpus: str | None,
                allow_mixed_gpus: bool, worker: str | None) -> None:
    """One worker in this process (one GPU), or a fleet of them (--gpus with several)."""
    from rich.live import Live

    from tuner.errors import SearchError
    from tuner.search import fleet
    from tuner.search import loop as search_mod
    from tuner.search.gpu_worker import DEFAULT_ENTRY
    from tuner.search.sampler import SAMPLERS

    budget = search_mod.parse_duration(timeout)
    if trials is None and budget is None:
        raise SearchError("give --trials N and/or --timeout DURATION")
    if sampler not in SAMPLERS:
        raise SearchError(f"unknown sampler '{sampler}'; choose one of {', '.join(SAMPLERS)}")
    if gpus is not None and device is not None:
        raise SearchError("give --device or --gpus, not both")
    devices = fleet.parse_gpus(gpus) if gpus is not None else [device or 0]
    kwargs: dict[str, Any] = dict(
        study=study, space=space, shapes=shapes, storage=storage, n_trials=trials,
        timeout_s=budget, sampler=sampler, seed=seed, jobs=jobs,
        worker_entry=worker or DEFAULT_ENTRY, allow_mixed_gpus=allow_mixed_gpus,
    )
    if len(devices) > 1:
        _run_fleet(devices, kwargs)
        return
    nvml = None
    try:
        from tuner.measure.timing import Nvml

        nvml = Nvml(index=devices[0])
    except Exception:  # noqa: BLE001 - NVML is optional
        nvml = None
    live = Live(console=console, refresh_per_second=4, transient=False)

    def on_progress(p: Any) -> None:
        if nvml is not None and getattr(nvml, "available", False):
            st = nvml.state()
            p.gpu_state = f"{st.temperature_c} C, SM clock {st.sm_clock_mhz} MHz"
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
        f"({summary.trials_per_hour:.0f}/h; complete {summary.complete}, pruned "
        f"{summary.pruned}, failed {summary.failed}, static rejects {summary.rejected}, "
        f"duplicates {summary.duplicates}); GPU busy {100 * summary.gpu_busy_fraction:.0f} %"
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


def _end_live() -> None:
    """Piped (a log file), rich leaves the live view's last line open: end it."""
    if not console.is_terminal:
        console.print()


def _fleet_table(fp: Any) -> Any:
    """The live view of a fleet: one row per GPU, the study's best, recent events."""
    import time as _time

    elapsed = _time.monotonic() - fp.started
    left = "" if fp.deadline is None else \
        f", {max(0.0, fp.deadline - _time.monotonic()):.0f} s left"
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
        run_s = _time.monotonic() - p.started
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
    for e in fp.events[-4:]:
        t.add_row("", "", "", "", "", "", f"[dim]{e[:60]}[/]")
    return t


def _run_fleet(devices: list[int], kwargs: dict[str, Any]) -> None:
    from rich.live import Live

    from tuner.search import fleet

    live = Live(console=console, refresh_per_second=4, transient=False)
    f = fleet.Fleet(devices, kwargs, progress_cb=lambda fp: live.update(_fleet_table(fp)))
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
            f"  GPU {w.device} ({s.gpu_name or '?'}): {s.trials_run} trials (complete "
            f"{s.complete}, pruned {s.pruned}, failed {s.failed}, static rejects {s.rejected}, "
            f"duplicates {s.duplicates}); GPU busy {100 * s.gpu_busy_fraction:.0f} %"
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
    if summary.stopped_by.startswith("interrupted"):
        raise typer.Exit(130)
    if any(w.error for w in summary.workers):
        raise typer.Exit(1)


def _show_best(study: str, storage: str | None, shape: str | None, top: int) -> None:
    from tuner.errors import SearchError

    if shape is not None:
        shape = str(Problem.parse(shape))
    _, trials = study_trials(study, storage)
    rows = best_rows(trials, shape, top)
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
    from tuner.analysis import show as show_mod
    from tuner.errors import SearchError

    if what == "best":
        _show_best(study, storage, shape, top)
        _print_profiles(study_trials(study, storage)[1])
        what = "importance+plots"
    elif what == "trials":
        _, trials = study_trials(study, storage)
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


@app.command()
@_user_errors
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
    from tuner.ship import export as export_mod

    if workload is None and table is None:
        if bucket or study_prefix or default or no_build or jobs:
            raise FaTuneError("--bucket, --study-prefix, --default, --no-build and --jobs go "
                              "with --workload or --table")
        r = export_mod.export_trial(study or "default", storage, trial, out)
        console.print(f"exported trial {r['trial']} ({r['config_id']}) to {r['out']}",
                      soft_wrap=True)
        return
    from tuner.ship import dispatch as dispatch_mod
    from tuner.ship import workload as workload_mod

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
    r = export_mod.export_workload(t, out, resolved=resolved, workload_file=wfile,
                                   build=not no_build, jobs=jobs)
    for e in t.entries:
        console.print(f"  {e.bucket}: S {e.range_text()}, {e.config.config_id()} "
                      f"({e.source_text()})", markup=False, soft_wrap=True)
    what = f"library {r['so']}" if r["so"] else "sources (not built: run build.sh)"
    console.print(f"exported workload {t.name} ({len(t.entries)} buckets) to {r['out']}: {what}",
                  markup=False, soft_wrap=True)


@app.command("workload")
@_user_errors
def workload_cmd(
    workload: Annotated[str, typer.Argument(
        help="A workload file, or a name from workloads/ (e.g. llama3-8b).")],
    max_problems: Annotated[int | None, typer.Option(
        "--max-problems", min=1, help="Problems per bucket (default: the file's, else 3).")] = None,
) -> None:
    """Show a workload's buckets and the problems to tune each on (most attention time first),
    with the search and export commands."""
    from tuner.ship import workload as workload_mod

    w = workload_mod.load_workload(workload)
    a = w.attention
    t = Table(title=f"workload {w.name}: Hq {a.Hq}, Hkv {a.Hkv}, D {a.head_dim}, "
              f"{'causal' if a.causal else 'non-causal'}")
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


@app.command()
@_user_errors
def tune(
    workload: Annotated[str, typer.Option(
        "--workload", help="A workload file, or a name from workloads/ (e.g. llama3-8b).")],
    trials: TrialsOpt = None,
    timeout: Annotated[str | None, typer.Option(
        "--timeout", help="Wall-time budget PER BUCKET, e.g. 30m.")] = None,
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
    from tuner.search import space as space_mod
    from tuner.search.study import redact
    from tuner.ship import workload as workload_mod

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
        _check_search_problems(problems)
        study = f"{w.name}-{p.bucket.name}"
        console.print(f"[bold]bucket {i}/{len(plans)}: {p.bucket.name} "
                      f"(S {p.bucket.range_text()}), study {study}: "
                      f"{', '.join(map(str, problems))}[/]", soft_wrap=True)
        _run_search(study=study, space=sp, shapes=problems, storage=storage, trials=trials,
                    timeout=timeout, sampler=sampler, seed=seed, jobs=jobs, device=device,
                    gpus=gpus, allow_mixed_gpus=allow_mixed_gpus, worker=worker)
    console.print(f"export the library: fa-tune export --workload {workload} --study-prefix "
                  f"{w.name}- --out {w.name}-lib"
                  + (f" --storage {redact(storage)}" if storage else ""), markup=False,
                  soft_wrap=True)


@app.command()
@_user_errors
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
    from tuner.analysis import profile as profile_mod

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
    from rich.text import Text

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
    from tuner.analysis import show as show_mod

    lines = show_mod.profile_lines(trials)
    if lines:
        console.print("profiles (fa-tune profile):", markup=False)
        for line in lines:
            console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)


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

