"""`fa-tune build`, `run`, `doctor`, `presets`, `bundle`: the kernel and its environment."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from tuner import _paths
from tuner import doctor as doc
from tuner.cli.common import (
    ConfigOpt,
    PresetOpt,
    RepeatOpt,
    ResultsDirOpt,
    RoundsOpt,
    SettleOpt,
    ShapeOpt,
    WarmupOpt,
    console,
    user_errors,
    yes_no,
)
from tuner.errors import ConfigError
from tuner.kernel import build as build_mod
from tuner.kernel.config import list_presets, load_config, load_preset, smem_bytes
from tuner.kernel.support import check_class, check_problems
from tuner.measure import runner, timing
from tuner.problem import DEFAULT_HEAD_DIM, HEAD_DIMS, ProblemClass, parse_problems
from tuner.ship.bundle import write_bundle


@user_errors
def build(
    preset: PresetOpt = None,
    config: ConfigOpt = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="Parallel nvcc jobs.")] = 1,
    head_dim: Annotated[int | None, typer.Option(
        "--head-dim", help="Head dim compiled in: 64, 128 or 256 (default 128).")] = None,
    full: Annotated[bool, typer.Option(
        "--full", help="Build the non-causal kernel (default: causal).")] = False,
    shape: Annotated[str | None, typer.Option(
        "--shape", "-s", metavar="PROBLEM",
        help="Build the kernel that runs this problem (its head dim, mask, window, softcap, "
             "sinks, pages, packed batch), e.g. 1x16/8x8192:d256:w4096:cap50; instead of "
             "--head-dim and --full.")] = None,
) -> None:
    """Compile a config for sm_90a (no GPU needed) and print its ptxas/SASS report."""
    if head_dim is not None and head_dim not in HEAD_DIMS:
        raise ConfigError(f"--head-dim must be one of {', '.join(map(str, HEAD_DIMS))} "
                          f"(got {head_dim})")
    if shape is not None and (full or head_dim is not None):
        raise ConfigError("give --shape or --head-dim/--full, not both: the problem names its "
                          "head dim and mask (e.g. 4x32x8192:d64:full)")
    cfg, label = load_config(preset, config)
    if shape is not None:
        pclass = check_problems(cfg, parse_problems([shape]))
    else:
        pclass = ProblemClass(head_dim or DEFAULT_HEAD_DIM, not full)
        check_class(cfg, pclass)
    head_dim = pclass.head_dim
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
        ("cache hit", yes_no(r.cache_hit)),
        ("SASS has HGMMA", yes_no(sass.get("has_hgmma")) if r.sass_checked else "unchecked"),
        ("SASS LDL / STL", f"{sass.get('ldl', 0)} / {sass.get('stl', 0)}"
         if r.sass_checked else "unchecked"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    if r.unfit is not None:
        console.print(f"[red]not timeable: {r.unfit}[/] (the search and run refuse it; try "
                      "a smaller block_n or another register split)")
    if not r.sass_checked:
        console.print(f"[yellow]SASS not checked: {r.sass_note}[/]")
    for w in r.ptxas.get("warnings", []):
        console.print(f"[yellow]{w}[/]")
    console.print(f"artifact: {r.so_path}", soft_wrap=True)


@user_errors
def run(
    preset: PresetOpt = None,
    config: ConfigOpt = None,
    shape: ShapeOpt = None,
    warmup: WarmupOpt = 50,
    repeat: RepeatOpt = 200,
    rounds: RoundsOpt = 3,
    settle_s: SettleOpt = 2.0,
    results_dir: ResultsDirOpt = None,
    device: Annotated[int, typer.Option(min=0, help="CUDA device index.")] = 0,
) -> None:
    """Build, gate (vs the FP32 reference) and time a config; write a result folder."""
    cfg, label = load_config(preset, config)
    shapes = parse_problems(shape)
    check_problems(cfg, shapes)

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
        verdicts: dict[object, str] = {True: "[green]pass[/]", False: "[red]FAIL[/]"}
        gate = verdicts.get(g.get("passed"), "[red]error[/]")
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


def doctor(
    build_only: Annotated[bool, typer.Option(
        "--build-only", help="Only the build requirements decide the exit code (a machine "
        "that compiles kernels but never runs them).")] = False,
) -> None:
    """Check what fa-tune needs and say how to fix gaps; exit 1 if something required is missing.

    To build: nvcc compiling sm_90a and cuobjdump (SASS check).

    To run (run, search, compare, profile): cuda-python, the NVIDIA driver, an sm_90 GPU, NVML.

    Optional: Nsight Compute (profile). Exit 0: all required there; 1: something missing; 2: usage.
    """

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


@user_errors
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


@user_errors
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
    n, what = write_bundle(out, python, extra or [],
                           say=lambda line: console.print(line, markup=False))
    console.print(f"{n} wheels in {out}; on the GPU host: "
                  f"pip install --no-index --find-links {out} '{what}'", markup=False,
                  soft_wrap=True)
