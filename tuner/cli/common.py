"""What every command module of the CLI shares: the typer app, the console, the one-line error
(``fail``, ``user_errors``) and the options several commands take."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from tuner.errors import FaTuneError, say_interrupted
from tuner.kernel.support import check_runnable
from tuner.problem import Problem

# What --help shows after an option that takes a value (typer's default is its Python type:
# <str>, <list[str]>, <int range>); flags (and --help itself) show nothing.
METAVARS = {
    "shape": "PROBLEM", "preset": "NAME", "config": "FILE", "results_dir": "DIR", "out": "DIR",
    "storage": "URL", "study": "NAME", "trials": "N", "trial": "N", "vs_trial": "N",
    "timeout": "DURATION", "sampler": "NAME", "seed": "N", "jobs": "N", "device": "INDEX",
    "gpus": "LIST", "worker": "MODULE:FUNC", "backends": "LIST", "warmup": "N", "repeat": "N",
    "rounds": "N", "settle_s": "SECONDS", "top": "N", "space": "NAME|FILE", "head_dim": "D",
    "workload": "NAME|FILE", "table": "FILE", "default": "SOURCE", "vs": "PEER",
    "python": "VERSION", "platform": "TAG", "extra": "NAME", "what": "WHAT", "bucket": "NAME",
    "study_prefix": "PREFIX", "max_problems": "N",
}


class _Metavars:
    """Gives every parameter of a command a metavar (METAVARS, else its name in capitals) and
    every flag none, in --help and in the usage line."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        for p in params:
            if getattr(p, "is_flag", False):
                p.metavar = ""
            elif p.param_type_name == "argument":
                p.metavar = p.metavar or METAVARS.get(p.name, p.name.upper())
                p.display_type_rich = lambda ctx: None  # the metavar already names it
            elif p.metavar is None:
                p.metavar = METAVARS.get(p.name, p.name.upper())
        return params


class Command(_Metavars, TyperCommand):
    pass


def interrupted() -> typer.Exit:
    """Ctrl-C outside a command that takes it itself (search settles its trials first): one
    line and exit 130, where typer would exit 130 without a word."""
    say_interrupted()
    return typer.Exit(130)


class Group(_Metavars, TyperGroup):
    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt:
            raise interrupted() from None

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise interrupted() from None


app = typer.Typer(
    cls=Group,
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


def user_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FaTuneError as e:
            fail(str(e), e.exit_code)
        except OSError as e:  # a path the user gave (or set in the environment) that won't do
            where = f"{e.filename}: " if e.filename else ""
            home = os.environ.get("FA_TUNE_STUDIES")
            if home and str(e.filename or "").startswith(str(Path(home).expanduser())):
                where = f"FA_TUNE_STUDIES={home}: {where}"  # the user may not know it is set
            fail(f"{where}{e.strerror or e}; check the path and its permissions", 2)

    return wrapper  # type: ignore[return-value]


# The problem syntax as typer's rich help shows it: "[/Hkv]" unescaped would be a closing tag.
PROBLEM_SYNTAX = r"BxHq\[/Hkv]xS\[:kSK]\[:dD]\[:full]\[:wW]\[:capC]\[:sinks]\[:pP]\[:qkv|:bhsd]"
PROBLEM_HELP = (f"Problem {PROBLEM_SYNTAX}, e.g. 4x32x8192, 1x32/8x8192 (GQA), "
                "4x32x8192:d64, 4x32x8192:full (non-causal); :kSK: S queries over SK keys, e.g. "
                "1x32/8x2048:k8192; :wW a sliding window of W keys, :capC logit softcapping, "
                ":sinks attention sinks, e.g. 1x64/8x8192:d64:w128:sinks; "
                ":qkv: q, k, v as views of one fused QKV tensor, e.g. "
                "1x32/8x8192:qkv; :bhsd: k, v as views of \\[B, Hkv, SK, D] memory (a KV cache), "
                "e.g. 1x32/8x2048:k8192:bhsd; :pP: K/V in a paged cache of P-row pages, e.g. "
                "4x32/8x2048:k8192:p64; packed batches: 32/8x[2048:8192,512*2]; repeatable "
                "(default: the 3 seed problems).")
ShapeOpt = Annotated[list[str] | None, typer.Option("--shape", "-s", help=PROBLEM_HELP)]
PresetOpt = Annotated[
    str | None, typer.Option("--preset", "-p", help="Preset name (see `fa-tune presets`).")
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="Config YAML/JSON file (knob: value).")
]


def yes_no(v: bool | None) -> str:
    return "-" if v is None else ("yes" if v else "no")




WarmupOpt = Annotated[int, typer.Option(min=0, help="Warm-up launches per round.")]
RepeatOpt = Annotated[int, typer.Option(min=1, help="Timed launches per round.")]
RoundsOpt = Annotated[int, typer.Option(min=1, help="Independently warmed rounds.")]
ResultsDirOpt = Annotated[
    Path | None, typer.Option("--results-dir", help="Root of result folders.")]
SettleOpt = Annotated[float, typer.Option(
    "--settle-s", help="Seconds of untimed launches before each round's warm-up, so every "
    "kernel is timed at the power-capped steady state (0: the seeds' protocol exactly).")]










# ---- the study commands' options ----------------------------------------------------------
def check_search_problems(problems: list[Problem]) -> None:
    """The search tunes fa-tune's kernel: every problem must be one the kernel runs, all of one
    problem class (head dim and mask: one kernel library serves one)."""
    check_runnable(problems)


StudyOpt = Annotated[str, typer.Option("--study", help="Study name.")]
TrialsOpt = Annotated[int | None, typer.Option(
    "--trials", "-n", help="Trials to run (compiled ones); with --gpus, for all GPUs together.")]
TimeoutOpt = Annotated[
    str | None, typer.Option("--timeout", help=(
        "Wall-time budget for the trials, e.g. 90s, 10m, 1h; the final (the top configs timed "
        "against each other, about a minute) follows it."))
]
SamplerOpt = Annotated[str, typer.Option("--sampler", help="tpe | random | grid | cmaes.")]
SeedOpt = Annotated[int | None, typer.Option(
    "--seed", min=0, max=2**32 - 1,
    help="Sampler seed (with --gpus, GPU i's worker samples with seed + i).")]
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
ArtifactsOpt = Annotated[str | None, typer.Option(
    "--artifacts", metavar="URL",
    help="Share compiled kernels with the study's other hosts through Optuna's artifact store: "
    "a folder every host mounts (a path or file:///path) or s3://bucket; each config is then "
    "compiled once over all of them, and a download is used only if its sha256 checks.")]
StorageOpt = Annotated[
    str | None,
    typer.Option("--storage", help="Optuna RDB URL (default sqlite:///studies/<study>.db)."),
]
TrialOpt = Annotated[int | None, typer.Option("--trial", help="Trial number (default: best).")]
