"""``fa-tune search``: the Optuna autotuner (ask/tell), with compile-ahead and a GPU worker.

One invocation::

    open/create the study (Optuna RDB storage; default sqlite:///<studies>/<study>.db)
    fail stale RUNNING trials left by a killed run; re-enqueue what an interrupted run never ran
    enqueue the known-good points (SEED_POINTS) the study has not seen yet
    loop:
        ask trials ahead (a batch); the sampler proposes only valid, unmeasured configs
            (tuner/sampler.py: checked in Python before Optuna stores a trial)
                                   -> static check (validate, check_shape) as a backstop:
            PRUNED with a violated constraint, no compile
                                   -> duplicates of a measured config: same verdict, no GPU
                                   -> the rest compile in a thread pool (--jobs nvcc at a time)
        the oldest candidate whose compile has finished goes to the GPU worker subprocess
        (while it measures, the parent asks the next trials: sampler and storage time overlap
        the GPU's instead of following it):
            local memory or serialized wgmma in the artifact -> FAIL
            gate + screen on the cheapest shape (SCREEN_PROTOCOL)
            slower than the incumbent's screen by > PRUNE_SLOWER_FRACTION -> PRUNED
            gate + time every shape (SURVEY_PROTOCOL) -> value = geometric-mean TFLOPS
            beats the best confirmed value -> re-measure every shape with the full seed
            protocol (CONFIRM_PROTOCOL): user attr ``confirmed`` (the only "best" ever shown)

Isolation: a worker reply that says CUDA fault, a worker that dies, or one that does not
answer before its watchdog deadline fails that trial with the reason stored; the worker is
replaced. Every trial this process asked is told before it exits (Ctrl-C, SIGTERM, timeout,
a bug): unfinished ones become FAIL with reason "interrupted" and are re-enqueued next time.

Trial user attrs: ``config`` (every knob), ``config_id``, ``owner`` (host:pid), ``source``
("preset:NAME" for enqueued points), ``build`` (key, so_path, compile seconds, cache hit),
``screen`` ({shape, median_ms, tflops}), ``shapes`` ({shape: {median_ms, min_ms, max_ms, tflops,
max_abs_err}}), ``confirmed`` ({geomean_tflops, shapes, results_dir}), ``fail_reason``,
``prune_reason``, ``duplicate_of``. Study user attrs: ``shapes`` (the objective's shapes),
``space`` (the space's dict) and ``sessions`` (per invocation: wall s, GPU-busy s, counts).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import re
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tuner import _paths
from tuner import build as build_mod
from tuner.config import KNOBS, KernelConfig, Shape, check_shape, load_preset, validate
from tuner.errors import ConfigError, FaTuneError, ShapeError
from tuner.gpu_worker import DEFAULT_ENTRY
from tuner.space import SearchSpace

# ---- the search's constants -------------------------------------------------------------------
# A candidate whose screening median is more than this fraction slower than the incumbent's
# screening median (same shape, same short protocol) is pruned.
PRUNE_SLOWER_FRACTION = 0.08
SCREEN_PROTOCOL = {"warmup": 10, "repeat": 30, "rounds": 1}
SURVEY_PROTOCOL = {"warmup": 20, "repeat": 100, "rounds": 1}
CONFIRM_PROTOCOL = {"warmup": 50, "repeat": 200, "rounds": 3}  # the seeds' protocol
# Temperature waits (tuner.measure.timing): short bounds while searching, the normal one to confirm.
SEARCH_TEMP_WAIT_S = 10.0
CONFIRM_TEMP_WAIT_S = 60.0
# The known-good points enqueued first, as (source, preset, changes): FA3's heuristic, the
# 3 K / 3 V stage variant, the static persistent kernel (lab run 6 on the H200, 2026-11-29:
# 1.02 / 1.03 / 1.01x FA3) and the same with K/V multicast and Q in registers (lab run 9,
# 2026-11-30: 1.048 / 1.065 / 1.057x). A study that lacks one (an older study) gets it on resume.
SEED_POINTS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("preset:default", "default", {}),
    ("preset:default+k3v3", "default", {"k_stages": 3, "v_stages": 3}),
    ("preset:static", "static", {}),
    ("preset:multicast", "multicast", {}),
)
# Watchdog: a request may take BASE + launches x (time at WATCHDOG_MIN_TFLOPS) + temp waits.
# BASE covers loading a kernel and the reference of a new shape (well under 5 s on the H200).
# It was 120 s until a hung candidate held the GPU idle for 36% of a 7-minute search
# (docs/PERF.md, 2026-11-29).
WATCHDOG_BASE_S = 30.0
WATCHDOG_MIN_TFLOPS = 20.0
WORKER_START_TIMEOUT_S = float(os.environ.get("FA_TUNE_NVCC_TIMEOUT", "1800")) + 120.0
# Recycle the worker after this many distinct kernels (each loaded .so stays mapped).
WORKER_MAX_KERNELS = 64
GRID_MAX_POINTS = 100_000
DEFAULT_STUDY = "default"
SAMPLERS = ("tpe", "random", "grid", "cmaes")
REQUEUE_REASONS = ("interrupted", "not run: search stopped")
# Stop when the sampler proposes this many invalid or already-measured configs in a row.
MAX_IDLE_ASKS = 300

Builder = Callable[[KernelConfig], Any]  # -> an object with so_path, local_memory, ...


class SearchError(FaTuneError):
    """A study, storage or search option is wrong (one line, exit 2)."""


# ---- small helpers ---------------------------------------------------------------------------
def parse_duration(text: str | None) -> float | None:
    """'90s', '10m', '1h', '1h30m', '45' (seconds) -> seconds; None stays None."""
    if text is None:
        return None
    s = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", s):
        v = float(s)
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)\s*(h|m|s)", s)
        if not parts or re.sub(r"(\d+(?:\.\d+)?)\s*(h|m|s)", "", s).strip():
            raise SearchError(f"bad duration '{text}': write e.g. 90s, 10m, 1h or 1h30m")
        v = sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)
    if v <= 0:
        raise SearchError(f"duration must be positive (got '{text}')")
    return v


def geomean(values: Sequence[float]) -> float:
    if not values or any(v <= 0 for v in values):
        raise ValueError("geometric mean needs positive values")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _study_name_ok(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", name or ""):
        raise SearchError(
            f"bad study name '{name}': use letters, digits, '.', '_' or '-' (at most 100)"
        )
    return name


def default_storage_url(study: str) -> str:
    return f"sqlite:///{_paths.studies_root() / f'{study}.db'}"


def storage_url(study: str, storage: str | None) -> str:
    return storage if storage else default_storage_url(_study_name_ok(study))


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _quiet_optuna() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def open_storage(url: str, *, create_dirs: bool = True) -> Any:
    """An Optuna RDBStorage for url; an unreachable or malformed URL is one SearchError line."""
    import optuna

    _quiet_optuna()
    if url.startswith("sqlite:///") and create_dirs:
        path = url[len("sqlite:///"):]
        if path and path != ":memory:":
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise SearchError(
                    f"cannot open study storage {url}: cannot create {Path(path).parent}: "
                    f"{e.strerror or e}"
                ) from None
    try:
        storage = optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url))
    except Exception as e:  # noqa: BLE001 - sqlalchemy / driver errors of every kind
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise SearchError(f"cannot open study storage {_redact(url)}: {first}") from None
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        _sqlite_wal(storage.engine)
    return storage


def _sqlite_wal(engine: Any) -> None:
    """Write-ahead log with synchronous=NORMAL on every connection of a SQLite study file.

    Optuna commits each suggested parameter and attribute separately (~30 commits per trial),
    and with SQLite's default rollback journal every commit is a full fsync. On the GPU host the
    ask/tell loop spent ~0.27 s per asked trial, during which the GPU is not fed; WAL took a
    local ask+tell from 74 to 47 ms (docs/PERF.md). WAL is safe for several processes on one
    machine and survives a crash of the tuner; a power loss can lose the last commits but not
    corrupt the file.
    """
    from sqlalchemy import event

    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
        finally:
            cur.close()

    event.listen(engine, "connect", on_connect)
    engine.dispose()  # connections opened during Optuna's setup reconnect with the pragmas


def _engine_kwargs(url: str) -> dict[str, Any]:
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": 60}}
    return {"pool_pre_ping": True}


def _redact(url: str) -> str:
    return re.sub(r"//([^:/@]+):[^@/]*@", r"//\1:***@", url)


def load_existing_study(study: str, storage: str | None) -> Any:
    """An existing study (for show/export/profile); unknown study -> one SearchError line."""
    import optuna

    url = storage_url(study, storage)
    if url.startswith("sqlite:///") and not storage:
        path = Path(url[len("sqlite:///"):])
        if not path.is_file():
            known = sorted(p.stem for p in _paths.studies_root().glob("*.db"))
            raise SearchError(
                f"unknown study '{study}' (no {path}); known studies: "
                f"{', '.join(known) or 'none'}"
            )
    st = open_storage(url, create_dirs=False)
    try:
        return optuna.load_study(study_name=study, storage=st)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(st)]
        raise SearchError(
            f"unknown study '{study}' in {_redact(url)}; "
            f"studies there: {', '.join(names) or 'none'}"
        ) from None


# ---- the space -> Optuna ------------------------------------------------------------------
def suggest_config(trial: Any, space: SearchSpace) -> KernelConfig:
    """Ask the trial for every free knob; fixed knobs take their single value."""
    params: dict[str, Any] = {}
    for knob in space.free_knobs:
        dim = space.dims.get(knob)
        if dim is not None and dim.int_range is not None:
            lo, hi, st = dim.int_range
            params[knob] = trial.suggest_int(knob, lo, hi, step=st)
        else:
            params[knob] = trial.suggest_categorical(knob, list(space.choices(knob)))
    return config_from_params(params, space)


def config_from_params(params: dict[str, Any], space: SearchSpace) -> KernelConfig:
    """The config a trial with these free-knob params measures (fixed knobs from the space)."""
    values = {knob: params[knob] if knob in params else space.choices(knob)[0] for knob in KNOBS}
    # Knobs that cannot matter under the others (e.g. fixed_cost with the grid scheduler) go to
    # their defaults, so such trials repeat an already-measured config instead of re-timing it.
    return KernelConfig.from_dict(values).effective()


def static_check(cfg: KernelConfig, shapes: Sequence[Shape]) -> None:
    """What the search refuses without compiling: ConfigError or ShapeError saying why."""
    validate(cfg)
    for s in shapes:
        check_shape(cfg, s)


def valid_config(params: dict[str, Any], space: SearchSpace,
                 shapes: Sequence[Shape] = ()) -> KernelConfig | None:
    """The config these params measure, or None if the static check refuses it."""
    try:
        cfg = config_from_params(params, space)
        static_check(cfg, shapes)
    except (ConfigError, ShapeError):
        return None
    return cfg


def seed_params(space: SearchSpace) -> list[tuple[str, dict[str, Any] | None]]:
    """(source, params) of every known-good point; params None when it lies outside space."""
    return [(source, params_for(load_preset(preset).replace(**changes), space))
            for source, preset, changes in SEED_POINTS]


def params_for(cfg: KernelConfig, space: SearchSpace) -> dict[str, Any] | None:
    """The free-knob params that make a trial suggest cfg; None if cfg lies outside the space."""
    if not space.contains(cfg):
        return None
    return {k: getattr(cfg, k) for k in space.free_knobs}


def make_sampler(name: str, seed: int | None, space: SearchSpace,
                 accept: Callable[[dict[str, Any]], bool] | None = None) -> Any:
    """The named sampler. With ``accept`` (the search's: valid and not yet measured), every
    sampler but grid proposes only configs it takes (tuner/sampler.py)."""
    import optuna

    def feasible(base: Any) -> Any:
        if accept is None:
            return base
        from tuner.sampler import FeasibleSampler

        return FeasibleSampler(base, space, accept, seed=seed)

    if name == "tpe":
        return feasible(optuna.samplers.TPESampler(seed=seed, multivariate=True,
                                                   constant_liar=True, n_startup_trials=10))
    if name == "random":
        return feasible(optuna.samplers.RandomSampler(seed=seed))
    if name == "grid":
        free = space.free_knobs
        n = math.prod(len(space.choices(k)) for k in free)
        if n > GRID_MAX_POINTS:
            raise SearchError(
                f"the grid sampler needs a space of at most {GRID_MAX_POINTS} points; "
                f"{space.source} has {n}: give a smaller --space"
            )
        return _AskTellGridSampler({k: list(space.choices(k)) for k in free}, seed=seed)
    if name == "cmaes":
        import importlib.util

        if importlib.util.find_spec("cmaes") is None:
            raise SearchError("the cmaes sampler needs the cmaes package: `pip install cmaes`")
        return feasible(optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False))
    raise SearchError(f"unknown sampler '{name}'; choose one of {', '.join(SAMPLERS)}")


def _grid_sampler_class() -> Any:
    import optuna

    class AskTellGridSampler(optuna.samplers.GridSampler):
        """GridSampler whose after_trial does not call study.stop() (which only works inside
        study.optimize); the search asks ``is_exhausted`` itself."""

        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            return None

    return AskTellGridSampler


def _AskTellGridSampler(*args: Any, **kw: Any) -> Any:  # noqa: N802 - a class factory
    return _grid_sampler_class()(*args, **kw)


# ---- the GPU worker, from the parent's side --------------------------------------------------
class WorkerFailure(Exception):
    """The worker died, hung, or reported a CUDA fault: the trial fails with ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class GpuWorker:
    """One worker subprocess (spawned); ``request`` with a watchdog; ``restart`` on failure.

    ``background``, when set, is called while a request is in flight and nothing has arrived
    yet; it does one short piece of the parent's own work (the search asks its next trial) and
    returns whether it did any. The parent's CPU work then overlaps the GPU's instead of
    holding it idle between requests.
    """

    def __init__(self, entry: str = DEFAULT_ENTRY, device_index: int = 0,
                 tick: Callable[[], None] | None = None,
                 background: Callable[[], bool] | None = None) -> None:
        self.entry = entry
        self.device_index = device_index
        self.tick = tick or (lambda: None)
        self.background = background
        self.proc: Any = None
        self.conn: Any = None
        self.gpu: dict[str, Any] = {}
        self.kernels: set[str] = set()
        self.restarts = 0
        self.busy_s = 0.0  # the worker's own time on requests (its "worker_s"), else wall time
        self.wall_s = 0.0  # wall time of requests as the parent saw them

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def start(self) -> None:
        from tuner.gpu_worker import bootstrap

        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=bootstrap, args=(self.entry, child, self.device_index),
                           name="fa-tune-gpu-worker", daemon=True)
        proc.start()
        child.close()  # so a dead worker reads as EOF here
        self.proc, self.conn, self.kernels = proc, parent, set()
        try:
            reply = self._wait(WORKER_START_TIMEOUT_S, "starting")
        except WorkerFailure as e:
            self.kill()
            raise SearchError(f"the GPU worker did not start: {e.reason}") from None
        if reply.get("status") != "ready":
            self.kill()
            raise SearchError(f"the GPU worker did not start: {reply.get('reason', reply)}")
        self.gpu = dict(reply.get("gpu") or {})

    def _wait(self, timeout_s: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise WorkerFailure(f"watchdog: the GPU worker did not answer within "
                                    f"{timeout_s:.0f} s while {what} (hung kernel?); killed")
            try:
                ready = self.conn.poll(0)
                if not ready and not (self.background is not None and self.background()):
                    ready = self.conn.poll(min(0.25, left))
            except (OSError, EOFError):
                ready = True
            if ready:
                try:
                    return self.conn.recv()
                except (EOFError, OSError):
                    code = self._reap()
                    raise WorkerFailure(
                        f"the GPU worker died while {what} ({_exit_text(code)})"
                    ) from None
            self.tick()

    def _reap(self) -> int | None:
        if self.proc is None:
            return None
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        code = self.proc.exitcode
        self._drop()
        return code

    def _drop(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except OSError:
                pass
        self.proc, self.conn = None, None

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(5)
        self._drop()

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            self.conn.send({"op": "stop"})
        except (OSError, ValueError):
            pass
        self.proc.join(5)
        self.kill()

    def request(self, msg: dict[str, Any], timeout_s: float, what: str) -> dict[str, Any]:
        if msg.get("so_path") not in self.kernels and len(self.kernels) >= WORKER_MAX_KERNELS:
            self.stop()  # recycle: every loaded .so stays mapped in the worker
        if not self.alive:
            if self.proc is not None:
                self._reap()
            self.start()
            self.restarts += 1
        t0 = time.monotonic()
        try:
            try:
                self.conn.send(msg)
            except (OSError, ValueError):
                code = self._reap()
                raise WorkerFailure(f"the GPU worker died ({_exit_text(code)})") from None
            reply = self._wait(timeout_s, what)
        except BaseException:
            self.busy_s += time.monotonic() - t0  # hung or dead: the GPU was held all along
            self.wall_s += time.monotonic() - t0
            raise
        wall = time.monotonic() - t0
        self.wall_s += wall
        own = reply.get("worker_s") if isinstance(reply, dict) else None
        self.busy_s += min(float(own), wall) if isinstance(own, (int, float)) else wall
        self.kernels.add(str(msg.get("so_path")))
        status = reply.get("status")
        if status == "cuda_error":
            self._reap()  # it exits after a CUDA fault; a fresh one comes on the next request
            raise WorkerFailure(str(reply.get("reason", "CUDA error")))
        return reply


def _exit_text(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def watchdog_s(shape: Shape, protocol: dict[str, int], gate: bool, temp_wait_s: float) -> float:
    launches = (protocol["warmup"] + protocol["repeat"]) * protocol["rounds"] + (4 if gate else 0)
    per_launch = shape.flops / (WATCHDOG_MIN_TFLOPS * 1e12)
    return WATCHDOG_BASE_S + launches * per_launch + protocol["rounds"] * temp_wait_s


# ---- progress --------------------------------------------------------------------------------
@dataclass
class Progress:
    """What the live view shows; the search updates it, the CLI renders it."""

    study: str
    shapes: list[str]
    n_trials: int | None
    deadline: float | None
    started: float = field(default_factory=time.monotonic)
    done: int = 0  # trials of this invocation that reached the compile stage and finished
    complete: int = 0
    pruned: int = 0
    failed: int = 0
    rejected: int = 0  # static check, no compile
    duplicates: int = 0
    compile_queue: int = 0
    compiling: int = 0
    current: str = ""
    best_value: float | None = None
    best_trial: int | None = None
    best_shapes: dict[str, float] = field(default_factory=dict)
    gpu_busy_s: float = 0.0
    worker_restarts: int = 0
    gpu_state: str = ""  # filled by the CLI from NVML (temperature, SM clock)
    last_events: list[str] = field(default_factory=list)

    def event(self, text: str) -> None:
        self.last_events = (self.last_events + [text])[-6:]


@dataclass
class SearchSummary:
    study: str
    storage: str
    trials_run: int
    complete: int
    pruned: int
    failed: int
    rejected: int
    duplicates: int
    best: dict[str, Any] | None
    wall_s: float
    gpu_busy_s: float
    stopped_by: str
    temp_wait_s: float = 0.0  # part of gpu_busy_s spent waiting for the GPU to cool

    @property
    def gpu_busy_fraction(self) -> float:
        return self.gpu_busy_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def trials_per_hour(self) -> float:
        return self.trials_run * 3600.0 / self.wall_s if self.wall_s > 0 else 0.0


class _Stop(Exception):
    """SIGTERM (or another requested stop) in the main thread."""


@dataclass
class _Candidate:
    trial: Any
    cfg: KernelConfig
    future: Future[Any]  # the compile, submitted when the trial is asked
    queued_at: float = field(default_factory=time.monotonic)


# ---- reading trials ---------------------------------------------------------------------------
def confirmed_value(t: Any) -> float | None:
    c = t.user_attrs.get("confirmed")
    if isinstance(c, dict) and isinstance(c.get("geomean_tflops"), (int, float)):
        return float(c["geomean_tflops"])
    return None


def best_confirmed(trials: Sequence[Any]) -> Any | None:
    from optuna.trial import TrialState

    cands = [t for t in trials if t.state == TrialState.COMPLETE and confirmed_value(t)]
    return max(cands, key=lambda t: confirmed_value(t) or 0.0, default=None)


# ---- the search ---------------------------------------------------------------------------
class Search:
    def __init__(
        self,
        *,
        study: str,
        space: SearchSpace,
        shapes: Sequence[Shape],
        storage: str | None = None,
        n_trials: int | None = None,
        timeout_s: float | None = None,
        sampler: str = "tpe",
        seed: int | None = None,
        jobs: int | None = None,
        device_index: int = 0,
        builder: Builder | None = None,
        worker_entry: str = DEFAULT_ENTRY,
        gate_seed: int = 42,
        results_root: Path | None = None,
        progress_cb: Callable[[Progress], None] | None = None,
    ) -> None:
        import optuna

        _quiet_optuna()
        if not shapes:
            raise ShapeError("give at least one --shape")
        if len({str(s) for s in shapes}) != len(shapes):
            raise ShapeError("a --shape is given twice")
        if n_trials is not None and n_trials < 1:
            raise SearchError(f"--trials must be at least 1 (got {n_trials})")
        self.study_name = _study_name_ok(study)
        self.space = space
        self.shapes = list(shapes)
        self.screen_shape = min(self.shapes, key=lambda s: (s.flops, str(s)))
        self.url = storage_url(study, storage)
        self.n_trials = n_trials
        self.timeout_s = timeout_s
        self.jobs = max(1, jobs or build_mod.usable_cpus())
        self.lookahead = max(2, self.jobs)
        if builder is None:
            from tuner.build import build_config

            builder = build_config
        self.builder = builder
        self.gate_seed = gate_seed
        self.results_root = results_root
        self.progress_cb = progress_cb
        self.owner = _owner()
        self.t_start = time.monotonic()
        self.started_utc = datetime.now(timezone.utc)

        self.storage = open_storage(self.url)
        samp = make_sampler(sampler, seed, space, accept=self._acceptable)
        try:
            self.study = optuna.create_study(
                study_name=self.study_name, storage=self.storage, sampler=samp,
                direction="maximize", load_if_exists=True,
            )
        except Exception as e:  # noqa: BLE001
            raise SearchError(f"cannot create study '{study}': {e}") from None
        self._check_study_attrs()
        self.worker = GpuWorker(worker_entry, device_index, tick=self._tick,
                                background=self._ask_while_gpu_works)
        self.progress = Progress(study, [str(s) for s in self.shapes], n_trials,
                                 None if timeout_s is None else self.t_start + timeout_s)
        self.open: dict[int, Any] = {}  # trial number -> Trial asked and not yet told
        self.known: dict[str, Any] = {}  # config_id -> finished FrozenTrial (dedupe)
        self.pending: dict[str, int] = {}  # config_id -> trial number in the pipeline
        self.dups: dict[int, list[Any]] = {}  # trial number -> trials asked with its config
        self.incumbent: Any | None = None
        self._last_tick = 0.0
        self._avg_compile_s = 60.0
        self._exhausted: str | None = None
        # The ask loop's state lives here: run() and the asks made while the GPU works share it.
        self.queue: deque[_Candidate] = deque()  # compiling or compiled, not yet measured
        self.pool: ThreadPoolExecutor | None = None
        self._asking = False  # asks may run inside GPU waits (only inside run()'s loop)
        self._asked = 0  # candidates sent to compile by this invocation
        self._idle = 0  # asks in a row that gave no candidate
        self.temp_wait_s = 0.0  # of the GPU-busy time, spent waiting for the GPU to cool

    def _acceptable(self, params: dict[str, Any]) -> bool:
        """The sampler's filter: a config the static check takes and no trial has measured or
        is measuring (a duplicate would only repeat a verdict)."""
        cfg = valid_config(params, self.space, self.shapes)
        if cfg is None:
            return False
        cid = cfg.config_id()
        return cid not in self.known and cid not in self.pending

    # -- study metadata
    def _check_study_attrs(self) -> None:
        attrs = self.study.user_attrs
        shapes = [str(s) for s in self.shapes]
        space = self.space.to_dict()
        if "shapes" in attrs and list(attrs["shapes"]) != shapes:
            raise SearchError(
                f"study '{self.study_name}' searches shapes {', '.join(attrs['shapes'])}; give "
                f"the same --shape options or a new --study name"
            )
        if "space" in attrs and attrs["space"] != _jsonable(space):
            raise SearchError(
                f"study '{self.study_name}' was created with another search space; give the "
                f"same --space or a new --study name"
            )
        if "shapes" not in attrs:
            self.study.set_user_attr("shapes", shapes)
            self.study.set_user_attr("space", _jsonable(space))
            self.study.set_user_attr("space_source", self.space.source)

    def _tick(self) -> None:
        now = time.monotonic()
        if self.progress_cb is not None and now - self._last_tick >= 0.25:
            self._last_tick = now
            self.progress.gpu_busy_s = self.worker.busy_s
            self.progress.worker_restarts = self.worker.restarts
            self.progress_cb(self.progress)

    def _emit(self, text: str | None = None) -> None:
        if text:
            self.progress.event(text)
        self._last_tick = 0.0
        self._tick()

    # -- resume
    def recover(self) -> list[int]:
        """Fail RUNNING trials of dead owners (this host) or of no owner older than us."""
        from optuna.trial import TrialState

        failed: list[int] = []
        host = socket.gethostname()
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            owner = str(t.user_attrs.get("owner", ""))
            o_host, _, o_pid = owner.rpartition(":")
            stale = False
            if o_host == host and o_pid.isdigit():
                stale = int(o_pid) != os.getpid() and not _pid_alive(int(o_pid))
            elif not owner:
                start = t.datetime_start
                if start is not None and start.tzinfo is None:
                    start = start.replace(tzinfo=timezone.utc)
                stale = start is None or start < self.started_utc
            if stale:
                self.storage.set_trial_user_attr(t._trial_id, "fail_reason", "interrupted")
                self.storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
                failed.append(t.number)
        return failed

    def _enqueue_start_points(self) -> None:
        from optuna.trial import TrialState

        trials = self.study.get_trials(deepcopy=False)
        requeued = {t.user_attrs.get("requeued_from") for t in trials}
        done_ids = {t.user_attrs.get("config_id") for t in trials
                    if t.state in (TrialState.COMPLETE, TrialState.PRUNED)}
        waiting = {t.user_attrs.get("config_id") for t in trials
                   if t.state == TrialState.WAITING}
        # What an interrupted run asked but never measured goes first (its build is cached).
        for t in trials:
            if (t.state == TrialState.FAIL
                    and t.user_attrs.get("fail_reason") in REQUEUE_REASONS
                    and t.number not in requeued and t.params
                    and t.user_attrs.get("config_id") not in done_ids | waiting):
                self.study.enqueue_trial(dict(t.params), user_attrs={"requeued_from": t.number})
                waiting.add(t.user_attrs.get("config_id"))
        sources = {t.user_attrs.get("source") for t in trials}
        for source, params in seed_params(self.space):
            if source in sources:
                continue
            if params is None:
                self.progress.event(f"{source} lies outside {self.space.source}: not enqueued")
                continue
            self.study.enqueue_trial(params, user_attrs={"source": source},
                                     skip_if_exists=True)

    def _load_known(self) -> None:
        from optuna.trial import TrialState

        trials = self.study.get_trials(deepcopy=False)
        for t in trials:
            cid = t.user_attrs.get("config_id")
            if not cid:
                continue
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED) or (
                t.state == TrialState.FAIL
                and t.user_attrs.get("fail_reason") not in REQUEUE_REASONS
                and not t.user_attrs.get("transient")
            ):
                self.known.setdefault(cid, t)
        self.incumbent = best_confirmed(trials)
        if self.incumbent is not None:
            self._show_best(self.incumbent)

    def _show_best(self, t: Any) -> None:
        c = t.user_attrs["confirmed"]
        self.progress.best_value = float(c["geomean_tflops"])
        self.progress.best_trial = t.number
        self.progress.best_shapes = {s: float(v["tflops"]) for s, v in c["shapes"].items()}

    # -- main loop
    def run(self) -> SearchSummary:
        self.progress.event(f"stale RUNNING trials failed: {self.recover() or 'none'}")
        # The GPU worker first: no GPU (or no oracle) is one line before any compile starts.
        self.progress.current = "starting the GPU worker"
        self._emit()
        self.worker.start()
        self._enqueue_start_points()
        self._load_known()
        stopped_by = "finished"
        self.pool = ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="fa-tune-nvcc")
        old_term = None
        if threading.current_thread() is threading.main_thread():
            old_term = signal.signal(signal.SIGTERM, _raise_stop)
        try:
            self._asking = True
            while True:
                why = self._should_stop()
                # Keep the compile queue full (a batch of asks ahead of the GPU). When a
                # compiled candidate is ready, the GPU gets it first; the asks then run while it
                # measures (_ask_while_gpu_works), not before.
                if not why and not any(c.future.done() for c in self.queue):
                    self._fill()
                if why and stopped_by == "finished":
                    stopped_by = why
                if not self.queue:
                    if self._exhausted and stopped_by == "finished":
                        stopped_by = self._exhausted
                    break
                if why:
                    break  # the rest is told "not run" in finally
                cand = self._next_ready()
                if cand is None:
                    continue  # the deadline passed while every compile was still running
                self._sync_queue()
                self._evaluate(cand)
                self._emit()
        except KeyboardInterrupt:
            stopped_by = "interrupted (Ctrl-C)"
        except _Stop:
            stopped_by = "interrupted (SIGTERM)"
        finally:
            self._asking = False
            reason = "interrupted" if stopped_by.startswith("interrupted") else \
                "not run: search stopped"
            self.pool.shutdown(wait=False, cancel_futures=True)
            self._tell_open(reason)
            self.worker.stop()
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
            summary = self._summary(stopped_by)
            self._record_session(summary)
        return summary

    def _fill(self, max_asks: int | None = None) -> int:
        """Ask until ``lookahead`` trials are in the pipeline (or ``max_asks`` asks); returns
        how many asks were made. A static reject or a duplicate is told at once."""
        n = 0
        while (max_asks is None or n < max_asks) and self.pool is not None \
                and len(self.open) < self.lookahead and self._may_ask(self._asked):
            n += 1
            cand = self._ask(self.pool)
            if cand is None:
                self._idle += 1
                if getattr(self.study.sampler, "starved", False):
                    self._exhausted = ("no valid config that is not yet measured turned up in "
                                       f"{self.study.sampler.random_tries} random draws "
                                       "(space exhausted?)")
                elif self._idle >= MAX_IDLE_ASKS:
                    self._exhausted = (f"the sampler proposed {self._idle} invalid or already "
                                       "measured configs in a row (space exhausted?)")
                continue
            self._idle = 0
            self._asked += 1
            self.queue.append(cand)
            self._sync_queue()
        return n

    def _ask_while_gpu_works(self) -> bool:
        """The GPU worker's background job: one ask, so that the sampler's and the storage's
        time (tens to hundreds of ms per ask, mostly static rejects) overlaps the GPU's work
        instead of following it. Only inside run()'s loop (the seed points are enqueued by
        then), never past the deadline."""
        if not self._asking or self._should_stop():
            return False
        return self._fill(max_asks=1) > 0

    def _next_ready(self) -> _Candidate | None:
        """Take the oldest candidate whose compile has finished, waiting for the first one.

        Compile times differ 2x between tiles (~30 s vs ~65 s on the 16-core H200 host), so
        taking the queue strictly in order let one slow compile hold the GPU idle while faster
        ones behind it were ready; the queue then refilled in waves (H200 search, 2026-11-29:
        GPU busy 28%). Known-good points are asked first, so they still go first when their
        compiles finish first. Returns None when the search should stop before any is ready.
        """
        while True:
            for cand in self.queue:
                if cand.future.done():
                    self.queue.remove(cand)
                    return cand
            if self._should_stop():
                return None
            if self._fill(max_asks=1):
                continue  # a free slot got a candidate (or a reject): look again
            wait_futures([c.future for c in self.queue], timeout=0.25, return_when=FIRST_COMPLETED)
            self._tick()

    def _should_stop(self) -> str | None:
        if self.progress.deadline is not None and time.monotonic() >= self.progress.deadline:
            return "timeout"
        return None

    def _may_ask(self, asked: int) -> bool:
        if self._exhausted:
            return False
        exhausted = getattr(self.study.sampler, "is_exhausted", None)
        if callable(exhausted) and exhausted(self.study):
            self._exhausted = "every point of the grid has been asked"
            return False
        if self.n_trials is not None and asked >= self.n_trials:
            return False
        if self.progress.deadline is not None:
            # Do not start a compile that cannot finish (and be measured) before the deadline.
            left = self.progress.deadline - time.monotonic()
            if left < 0.5 * self._avg_compile_s:
                return False
        return True

    def _sync_queue(self) -> None:
        self.progress.compile_queue = sum(1 for c in self.queue if not c.future.done())
        self.progress.compiling = sum(1 for c in self.queue if c.future.running())

    def _ask(self, pool: ThreadPoolExecutor) -> _Candidate | None:
        """Ask one trial; a static reject or a duplicate is told at once (returns None)."""

        trial = self.study.ask()
        self.open[trial.number] = trial
        trial.set_user_attr("owner", self.owner)
        try:
            cfg = suggest_config(trial, self.space)
        except ConfigError as e:
            self._reject(trial, e)
            return None
        cid = cfg.config_id()
        trial.set_user_attr("config", cfg.to_dict())
        trial.set_user_attr("config_id", cid)
        try:
            static_check(cfg, self.shapes)
        except (ConfigError, ShapeError) as e:
            self._reject(trial, e)
            return None
        first = self.pending.get(cid)
        if first is not None:
            # Same config as a candidate still in the pipeline: it gets that one's verdict.
            self.dups.setdefault(first, []).append(trial)
            return None
        prev = self.known.get(cid)
        if prev is not None:
            self._tell_duplicate(trial, prev)
            return None
        self.pending[cid] = trial.number
        return _Candidate(trial, cfg, pool.submit(self.builder, cfg))

    def _tell_duplicate(self, trial: Any, prev: Any) -> None:
        from optuna.trial import TrialState

        self.progress.duplicates += 1
        trial.set_user_attr("duplicate_of", prev.number)
        for k in ("build", "screen", "shapes", "prune_reason", "fail_reason"):
            if k in prev.user_attrs:
                trial.set_user_attr(k, prev.user_attrs[k])
        if prev.state == TrialState.COMPLETE:
            self._tell(trial, TrialState.COMPLETE, prev.value)
            self.progress.complete += 1
        elif prev.state == TrialState.PRUNED:
            self._tell(trial, TrialState.PRUNED)
            self.progress.pruned += 1
        else:
            self._tell(trial, TrialState.FAIL)
            self.progress.failed += 1
        self.progress.done += 1

    def _tell(self, trial: Any, state: Any, value: float | None = None) -> Any:
        from optuna.trial import TrialState

        if state == TrialState.COMPLETE:
            ft = self.study.tell(trial, value)
        else:
            ft = self.study.tell(trial, state=state)
        self.open.pop(trial.number, None)
        cid = ft.user_attrs.get("config_id")
        if cid and not ft.user_attrs.get("transient") and (
            ft.state != TrialState.FAIL
            or ft.user_attrs.get("fail_reason") not in REQUEUE_REASONS
        ):
            self.known.setdefault(cid, ft)
        if cid and self.pending.get(cid) == trial.number:
            del self.pending[cid]
        for dup in self.dups.pop(trial.number, []):
            if ft.state == TrialState.FAIL and (
                ft.user_attrs.get("transient")
                or ft.user_attrs.get("fail_reason") in REQUEUE_REASONS
            ):
                dup.set_user_attr("fail_reason", "not run: duplicate of a trial that could not "
                                  "be measured")
                dup.set_user_attr("transient", True)
                self.study.tell(dup, state=TrialState.FAIL)
                self.open.pop(dup.number, None)
            else:
                self._tell_duplicate(dup, ft)
        return ft

    def _reject(self, trial: Any, why: Exception) -> None:
        """A config the static check refuses: told PRUNED with a violated constraint, so a
        sampler that reads constraints sees it as infeasible. Rare since the sampler's filter
        (tuner/sampler.py) checks proposals first; alone, this made TPE stall on the H200
        (docs/PERF.md, steps 17 and 19)."""
        from optuna.trial import TrialState

        trial.set_user_attr("prune_reason", f"static check: {' '.join(str(why).split())}"[:2000])
        trial.set_constraint("static_check", 1.0)
        self._tell(trial, TrialState.PRUNED)
        self.progress.rejected += 1

    def _fail(self, trial: Any, reason: str, *, counted: bool = True,
              transient: bool = False) -> None:
        from optuna.trial import TrialState

        trial.set_user_attr("fail_reason", " ".join(str(reason).split())[:2000])
        if transient:
            trial.set_user_attr("transient", True)
        self._tell(trial, TrialState.FAIL)
        if counted:
            self.progress.failed += 1
            self.progress.done += 1
            self.progress.event(f"trial {trial.number} failed: {reason}"[:160])

    def _tell_open(self, reason: str) -> None:
        from optuna.trial import TrialState

        for trial in list(self.open.values()):
            try:
                trial.set_user_attr("fail_reason", reason)
                self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
            except Exception:  # noqa: BLE001 - keep failing the others
                pass
            self.open.pop(trial.number, None)

    # -- one candidate
    def _measure(self, so: str, shape: Shape, protocol: dict[str, int], gate: bool,
                 temp_wait_s: float) -> dict[str, Any]:
        msg = {"op": "measure", "so_path": so, "shape": [shape.B, shape.H, shape.S],
               "gate": gate, "seed": self.gate_seed, "protocol": dict(protocol),
               "temp_wait_s": temp_wait_s}
        what = f"{'gating and ' if gate else ''}timing {shape}"
        reply = self.worker.request(msg, watchdog_s(shape, protocol, gate, temp_wait_s), what)
        self.temp_wait_s += _temp_wait_s(reply)
        return reply

    def _evaluate(self, cand: _Candidate) -> None:
        from optuna.trial import TrialState

        trial, cfg = cand.trial, cand.cfg
        try:
            built = cand.future.result()  # done: _next_ready hands out finished compiles only
        except FaTuneError as e:
            self._fail(trial, f"build: {e}", transient=_is_transient_build(e))
            return
        except Exception as e:  # noqa: BLE001 - a builder bug fails one trial, not all
            self._fail(trial, f"build: {type(e).__name__}: {e}", transient=True)
            return
        secs = float(getattr(built, "compile_seconds", 0.0) or 0.0)
        if not getattr(built, "cache_hit", False) and secs > 0:
            self._avg_compile_s = 0.7 * self._avg_compile_s + 0.3 * secs
        trial.set_user_attr("build", {
            "key": getattr(built, "key", None), "so_path": str(built.so_path),
            "compile_seconds": secs, "cache_hit": bool(getattr(built, "cache_hit", False)),
        })
        why = built.unfit
        if why:
            self._fail(trial, f"artifact unfit to time: {why}")
            return
        so = str(built.so_path)
        self.progress.current = f"trial {trial.number}: gate + screen on {self.screen_shape}"
        self._emit()
        rows: dict[str, dict[str, Any]] = {}
        gates: dict[str, Any] = {}
        try:
            r = self._measure(so, self.screen_shape, SCREEN_PROTOCOL, True, SEARCH_TEMP_WAIT_S)
            if r.get("status") != "ok":
                self._fail(trial, str(r.get("reason")))
                return
            gates[str(self.screen_shape)] = r.get("gate")
            scr = _row(r)
            trial.set_user_attr("screen", {"shape": str(self.screen_shape), **scr})
            trial.report(scr["tflops"], 0)
            inc = self.incumbent
            inc_scr = (inc.user_attrs.get("screen") or {}) if inc is not None else {}
            if inc_scr.get("median_ms") and scr["median_ms"] > inc_scr["median_ms"] * (
                1.0 + PRUNE_SLOWER_FRACTION
            ):
                slower = scr["median_ms"] / inc_scr["median_ms"] - 1.0
                trial.set_user_attr(
                    "prune_reason",
                    f"screen {scr['median_ms']:.4f} ms on {self.screen_shape} is "
                    f"{100 * slower:.1f}% slower than trial {inc.number}'s "
                    f"{inc_scr['median_ms']:.4f} ms (limit {100 * PRUNE_SLOWER_FRACTION:.0f}%)",
                )
                self._tell(trial, TrialState.PRUNED)
                self.progress.pruned += 1
                self.progress.done += 1
                self.progress.event(f"trial {trial.number} pruned ({100 * slower:.0f}% slower)")
                return
            for shape in self.shapes:
                self.progress.current = f"trial {trial.number}: timing {shape}"
                self._emit()
                gate = shape != self.screen_shape
                r = self._measure(so, shape, SURVEY_PROTOCOL, gate, SEARCH_TEMP_WAIT_S)
                if r.get("status") != "ok":
                    self._fail(trial, str(r.get("reason")))
                    return
                if gate:
                    gates[str(shape)] = r.get("gate")
                rows[str(shape)] = _row(r, gates.get(str(shape)))
            trial.set_user_attr("shapes", rows)
            value = geomean([rows[str(s)]["tflops"] for s in self.shapes])
            best = confirmed_value(self.incumbent) if self.incumbent is not None else None
            if best is None or value > best:
                self._confirm(trial, cfg, built, so, gates)
        except WorkerFailure as e:
            self._fail(trial, e.reason)
            return
        ft = self._tell(trial, TrialState.COMPLETE, value)
        self.progress.complete += 1
        self.progress.done += 1
        self.progress.event(f"trial {trial.number}: {value:.1f} TFLOPS (geomean)")
        if confirmed_value(ft) is not None and (
            self.incumbent is None or confirmed_value(ft) > (confirmed_value(self.incumbent) or 0)
        ):
            self.incumbent = ft
            self._show_best(ft)
            self.progress.event(f"new best: trial {ft.number}, "
                                f"{confirmed_value(ft):.1f} TFLOPS confirmed")

    def _confirm(self, trial: Any, cfg: KernelConfig, built: Any, so: str,
                 gates: dict[str, Any]) -> None:
        """Noise guard: the full seed protocol on every shape; stored as ``confirmed``."""
        timings: dict[str, dict[str, Any]] = {}
        for shape in self.shapes:
            self.progress.current = f"trial {trial.number}: confirming on {shape} (full protocol)"
            self._emit()
            r = self._measure(so, shape, CONFIRM_PROTOCOL, False, CONFIRM_TEMP_WAIT_S)
            if r.get("status") != "ok":
                raise WorkerFailure(str(r.get("reason")))
            timings[str(shape)] = r
        shapes = {s: _row(r, gates.get(s)) for s, r in timings.items()}
        conf: dict[str, Any] = {
            "geomean_tflops": geomean([shapes[str(s)]["tflops"] for s in self.shapes]),
            "protocol": dict(CONFIRM_PROTOCOL),
            "shapes": shapes,
        }
        try:
            conf["results_dir"] = str(self._write_results(trial, cfg, built, timings, gates))
        except (OSError, FaTuneError) as e:
            conf["results_error"] = str(e)
        trial.set_user_attr("confirmed", conf)

    def _write_results(self, trial: Any, cfg: KernelConfig, built: Any,
                       timings: dict[str, dict[str, Any]], gates: dict[str, Any]) -> Path:
        from tuner import __version__, store
        from tuner.runner import build_summary

        rows = []
        for shape in self.shapes:
            r = timings[str(shape)]
            g = gates.get(str(shape))
            rows.append({"shape": str(shape), **shape.to_dict(), "flops": shape.flops,
                         "status": "passed", "error": None, "gate": g,
                         "timing": r.get("timing")})
        try:
            bsum = build_summary(built)
        except Exception:  # noqa: BLE001 - a test builder's stand-in lacks the fields
            bsum = {"so_path": str(built.so_path), "key": getattr(built, "key", None)}
        payload = {
            "schema": store.SCHEMA_VERSION, "status": "passed", "failure": None,
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "fa_tune_version": __version__, "config": cfg.to_dict(),
            "config_id": cfg.config_id(), "preset": None, "config_file": None,
            "protocol": dict(CONFIRM_PROTOCOL), "seed": self.gate_seed,
            "gpu": self.worker.gpu, "build": bsum, "shapes": rows,
            "study": {"name": self.study_name, "storage": _redact(self.url),
                      "trial": trial.number},
        }
        out = store.new_result_dir(self.results_root or _paths.results_root())
        store.write_results(out, payload)
        return out

    # -- the end
    def _summary(self, stopped_by: str) -> SearchSummary:
        best = None
        if self.incumbent is not None:
            t = self.incumbent
            best = {"trial": t.number, "config_id": t.user_attrs.get("config_id"),
                    "confirmed": t.user_attrs.get("confirmed")}
        p = self.progress
        return SearchSummary(
            study=self.study_name, storage=_redact(self.url), trials_run=p.done,
            complete=p.complete, pruned=p.pruned, failed=p.failed, rejected=p.rejected,
            duplicates=p.duplicates, best=best, wall_s=time.monotonic() - self.t_start,
            gpu_busy_s=self.worker.busy_s, stopped_by=stopped_by, temp_wait_s=self.temp_wait_s,
        )

    def _record_session(self, s: SearchSummary) -> None:
        try:
            sessions = list(self.study.user_attrs.get("sessions", []))
            sessions.append({
                "started_utc": self.started_utc.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "owner": self.owner, "wall_s": round(s.wall_s, 2),
                "gpu_busy_s": round(s.gpu_busy_s, 2), "temp_wait_s": round(s.temp_wait_s, 2),
                "trials": s.trials_run,
                "complete": s.complete, "pruned": s.pruned, "failed": s.failed,
                "rejected": s.rejected, "stopped_by": s.stopped_by,
            })
            self.study.set_user_attr("sessions", sessions[-200:])
        except Exception:  # noqa: BLE001 - bookkeeping must not mask the search's outcome
            pass


def _row(reply: dict[str, Any], gate: dict[str, Any] | None = None) -> dict[str, Any]:
    t = reply.get("timing") or {}
    g = gate if gate is not None else reply.get("gate")
    st = t.get("state_after") or {}
    return {
        "median_ms": float(t["median_ms"]), "min_ms": float(t.get("min_ms", t["median_ms"])),
        "max_ms": float(t.get("max_ms", t["median_ms"])), "tflops": float(t["tflops"]),
        "max_abs_err": (g or {}).get("max_abs_err"),
        "temperature_c": st.get("temperature_c"), "sm_clock_mhz": st.get("sm_clock_mhz"),
    }


def _temp_wait_s(reply: dict[str, Any]) -> float:
    """Seconds a measure reply's rounds waited for the GPU to cool (0 when not reported)."""
    rounds = (reply.get("timing") or {}).get("rounds") or []
    total = 0.0
    for r in rounds:
        waited = (r.get("temp_wait") or {}).get("waited_s") if isinstance(r, dict) else None
        if isinstance(waited, (int, float)):
            total += float(waited)
    return total


def _is_transient_build(e: FaTuneError) -> bool:
    """nvcc missing or timed out: not a property of the config, so never deduplicated."""
    text = str(e)
    return "nvcc not found" in text or "timed out" in text or "CUTLASS headers" in text


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop()


def _jsonable(d: Any) -> Any:
    import json

    return json.loads(json.dumps(d))


def best_config(study: str, storage: str | None = None) -> KernelConfig | None:
    """The study's best config: highest confirmed number, else highest search value; None if
    no trial completed. (``fa-tune compare --study`` and export use this.)"""
    from optuna.trial import TrialState

    st = load_existing_study(study, storage)
    trials = st.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    t = best_confirmed(trials) or max(
        (t for t in trials if t.value is not None), key=lambda t: t.value, default=None
    )
    if t is None or not isinstance(t.user_attrs.get("config"), dict):
        return None
    return KernelConfig.from_dict(t.user_attrs["config"])
