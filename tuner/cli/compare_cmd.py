"""`fa-tune compare`: parse, hand the options to tuner.analysis.compare, print its verdict."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from tuner.analysis import compare as compare_mod
from tuner.cli.common import (
    ConfigOpt,
    PresetOpt,
    RepeatOpt,
    ResultsDirOpt,
    RoundsOpt,
    SettleOpt,
    ShapeOpt,
    TrialOpt,
    WarmupOpt,
    console,
    fail,
    user_errors,
)


@user_errors
def compare(
    study: Annotated[
        str | None, typer.Option("--study", help="Compare this study's pick (the config `fa-tune "
                                    "export` ships, or --trial N's).")
    ] = None,
    trial: TrialOpt = None,
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
                     "mem_efficient,flashinfer, all or none (default: fa3,cudnn,fa2,triton)."),
    ] = None,
    warmup: WarmupOpt = 50,
    repeat: RepeatOpt = 200,
    rounds: RoundsOpt = 3,
    settle_s: SettleOpt = 2.0,
    results_dir: ResultsDirOpt = None,
) -> None:
    """Time fa-tune's kernel beside FA3, cuDNN, FA2 and Triton on the same inputs (gated)."""
    payload = compare_mod.compare_options(
        study=study, storage=storage, trial=trial, preset=preset, config=config, shape=shape,
        backends=backends, warmup=warmup, repeat=repeat, rounds=rounds, settle_s=settle_s,
        results_dir=results_dir, console=console)
    unavailable, bad = compare_mod.kernel_outcome(payload)
    if unavailable is not None:
        fail(f"fa-tune's kernel could not run: {unavailable}")
    if bad:
        sys.stderr.write("fa-tune: compare FAILED: " + "; ".join(
            f"{r['shape']}: {r['status']} ({r['reason']})" for r in bad) + "\n")
        raise typer.Exit(1)
