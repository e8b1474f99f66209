"""``fa-tune search``: the Optuna autotuner (ask/tell), with compile-ahead and a GPU worker.

One invocation::

    open/create the study (tuner/search/study.py; default sqlite:///<studies>/<study>.db)
    settle RUNNING trials a killed run left (as a stop settles its own, below); re-enqueue
    what an interrupted run cut mid-measurement
    enqueue the known-good points (the space's seeds) the study has not seen yet
    loop:
        ask trials ahead (a batch; near the deadline only as many as the GPU can still take);
            the sampler proposes only valid, unmeasured configs (tuner/search/sampler.py)
                                   -> static check (validate, check_problem) as a backstop:
            PRUNED with a violated constraint, no compile
                                   -> duplicates of a measured config: same verdict, no GPU
                                   -> the rest compile in a thread pool (--jobs nvcc at a time)
        the oldest candidate whose compile has finished goes to the GPU worker subprocess
        (tuner/search/worker_client.py; while it measures, the parent asks the next trials: sampler
        and storage time overlap the GPU's instead of following it):
            local memory or serialized wgmma in the artifact -> FAIL
            gate + screen on the cheapest shape, then time every shape, then confirm a possible
            new best with the full protocol: tuner/search/policy.py decides protocols and pruning;
            value = geometric-mean TFLOPS of the survey; ``confirmed`` = the only "best" shown

Isolation: a worker reply that says CUDA fault, a worker that dies, or one that does not
answer before its watchdog deadline fails that trial with the reason stored; the worker is
replaced. Every trial this process asked is settled before it exits (deadline, Ctrl-C,
SIGTERM, a bug): one cut mid-measurement fails as "interrupted" and is re-enqueued next time;
the ones that never reached the GPU go back to WAITING (params fixed, user attr ``not_run``),
so the next search measures them first and no one reads them as failures.

Several workers, one study: every worker (a process per GPU with ``--gpus``, tuner/search/fleet.py;
``fa-tune worker`` on other hosts) runs this loop against the same storage. Dedupe spans them:
the sampler skips configs another worker is measuring (RUNNING trials with that
``config_id``), a finished trial of any worker is a verdict for all, and a trial asked with a
config another worker is measuring at that moment waits for that trial's verdict (``waits_for``;
when two wait for each other, the lower trial number measures). Each trial this process holds
is kept alive by a heartbeat (tuner/search/rdb.py); a worker that dies (kill -9, host lost) stops
beating, and after the grace period another worker fails its trials and Optuna enqueues each
again. A worker whose GPU model differs from the study's refuses to join (``gpu_model`` study
attr) unless ``allow_mixed_gpus``; each measured trial records its ``gpu``.

Trial user attrs: ``config`` (every knob), ``config_id``, ``owner`` (host:pid), ``source``
("preset:NAME" for enqueued points), ``build`` (key, so_path, compile seconds, cache hit),
``screen`` ({shape, median_ms, tflops}), ``shapes`` ({shape: {median_ms, min_ms, max_ms, tflops,
max_abs_err}}), ``confirmed`` ({geomean_tflops, protocol, shapes, results_dir}),
``fail_reason``, ``prune_reason``, ``duplicate_of``, ``not_run``, ``gpu`` ({name, sm_count,
driver_version, nvcc_version, host, device}), ``waits_for``, ``retry_of`` (a heartbeat retry).
Study user attrs: ``shapes``
(the objective's problems, as their text forms ``str(Problem)``: ``4x32x8192``, ``1x32/8x8192``;
an MHA, D 128, causal problem keeps the name it had before problems, so old studies read the
same), ``space`` (the space's dict), ``gpu_model`` ({name, sm_count} of the first worker's
GPU) and ``sessions`` (per invocation: wall s, GPU-busy s, counts, device, GPU; each also under
its own key ``session <UTC> <owner>``, which concurrent workers cannot overwrite).
"""

from __future__ import annotations

import functools
import math
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
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from tuner import _paths
from tuner.errors import ConfigError, FaTuneError, SearchError, ShapeError
from tuner.kernel import build as build_mod
from tuner.kernel.config import KernelConfig, load_preset
from tuner.kernel.support import check_runnable
from tuner.measure.timing import Protocol
from tuner.problem import Problem
from tuner.search import rdb
from tuner.search.gpu_worker import DEFAULT_ENTRY
from tuner.search.policy import SearchPolicy
from tuner.search.sampler import make_sampler, static_check, suggest_config, valid_config
from tuner.search.space import SearchSpace
from tuner.search.study import check_study_name, open_storage, quiet_optuna, redact, storage_url
from tuner.search.trials import best_confirmed, confirmed_value
from tuner.search.worker_client import GpuWorker, WorkerFailure

# ---- the search's constants -------------------------------------------------------------------
# FAIL reasons of trials whose measurement was cut, not judged: re-enqueued on resume.
# "not run: search stopped" is what earlier versions told trials they never started.
REQUEUE_REASONS = ("interrupted", "not run: search stopped")
# Stop when the sampler proposes this many invalid or already-measured configs in a row.
MAX_IDLE_ASKS = 300
# Heartbeat of the trials a worker holds (tuner/search/rdb.py): a beat every HEARTBEAT_S; a trial
# without one for GRACE_S belongs to a dead worker and is failed and enqueued again. The grace
# outlasts a storage hiccup; a dead worker's config waits that long for its retry.
HEARTBEAT_S = 10
GRACE_S = 60
# A RUNNING trial without an owner (versions before owners) counts as killed only when it
# started this long before us: a trial another worker asked a moment ago has no owner yet.
OWNERLESS_GRACE_S = 120.0
# A worker with nothing left to ask waits this long after the others' last trial ended, for
# the retries of a dead worker's trials to be enqueued (rdb.RequeueStaleTrial).
LINGER_TAIL_S = 3.0

Builder = Callable[[KernelConfig], Any]  # -> an object with so_path, local_memory, ...


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


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def seed_params(space: SearchSpace, head_dim: int = 128
                ) -> list[tuple[str, dict[str, Any] | None]]:
    """(source, params) of every known-good point (the space file's ``seeds``; a file without
    them gets those of its head dim's default space); params None when it lies outside space.
    A study that lacks one (an older study) gets it on resume."""
    from tuner.search.space import default_space_name, load_space

    seeds = space.seeds or load_space(default_space_name(head_dim)).seeds
    return [(s.source, params_for(load_preset(s.preset).replace(**dict(s.changes)), space))
            for s in seeds]


def params_for(cfg: KernelConfig, space: SearchSpace) -> dict[str, Any] | None:
    """The free-knob params that make a trial suggest cfg; None if cfg lies outside the space."""
    if not space.contains(cfg):
        return None
    return {k: getattr(cfg, k) for k in space.free_knobs}


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
    worker_restarts: int = 0  # after a worker died, hung or faulted
    worker_recycles: int = 0  # planned, after worker_client.WORKER_MAX_KERNELS libraries
    gpu_state: str = ""  # filled by the CLI from NVML (temperature, SM clock)
    last_events: list[str] = field(default_factory=list)
    device: int = 0  # the CUDA device this worker measures on
    gpu_name: str = ""  # as its GPU worker reports it
    waiting: int = 0  # trials waiting for another worker's verdict on their config

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
    not_run: int = 0  # asked, never measured: back to WAITING, measured first next time
    device: int = 0
    gpu_name: str = ""
    owner: str = ""  # host:pid of this worker

    @property
    def gpu_busy_fraction(self) -> float:
        return self.gpu_busy_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def trials_per_hour(self) -> float:
        return self.trials_run * 3600.0 / self.wall_s if self.wall_s > 0 else 0.0


class _Stop(Exception):
    """SIGTERM (or another requested stop) in the main thread."""


class _TrialLost(Exception):
    """A trial this process holds was finished by another worker (its heartbeat sweep)."""


@dataclass
class _Candidate:
    trial: Any
    cfg: KernelConfig
    future: Future[Any]  # the compile, submitted when the trial is asked
    queued_at: float = field(default_factory=time.monotonic)


# ---- the search ---------------------------------------------------------------------------
class Search:
    def __init__(
        self,
        *,
        study: str,
        space: SearchSpace,
        shapes: Sequence[Problem],
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
        policy: SearchPolicy | None = None,
        heartbeat_s: int | None = HEARTBEAT_S,
        grace_s: int | None = GRACE_S,
        allow_mixed_gpus: bool = False,
    ) -> None:
        import optuna

        quiet_optuna()
        if not shapes:
            raise ShapeError("give at least one --shape")
        if len({str(s) for s in shapes}) != len(shapes):
            raise ShapeError("a --shape is given twice")
        # The search tunes fa-tune's kernel: a problem it cannot run (past the grid limits, or
        # a mix of head dims or masks: one library serves one class) is refused here, once, not
        # as a static reject of every trial. A caller's own builder must build for the class.
        self.pclass = check_runnable(shapes)  # the head dim and mask every candidate is built for
        if n_trials is not None and n_trials < 1:
            raise SearchError(f"--trials must be at least 1 (got {n_trials})")
        self.study_name = check_study_name(study)
        self.space = space
        self.shapes = list(shapes)
        self.screen_shape = min(self.shapes, key=lambda s: (s.flops, str(s)))
        self.url = storage_url(study, storage)
        self.n_trials = n_trials
        self.timeout_s = timeout_s
        self.jobs = max(1, jobs or build_mod.usable_cpus())
        self.lookahead = max(2, self.jobs)
        if builder is None:
            from tuner.kernel.build import build_config

            builder = functools.partial(build_config, pclass=self.pclass)
        self.builder = builder
        self.policy = policy or SearchPolicy()
        self.gate_seed = gate_seed
        self.results_root = results_root
        self.progress_cb = progress_cb
        self.owner = _owner()
        self.t_start = time.monotonic()
        self.started_utc = datetime.now(timezone.utc)

        self.allow_mixed_gpus = allow_mixed_gpus
        self.grace_s = grace_s or GRACE_S
        self.storage = open_storage(self.url, heartbeat_s=heartbeat_s, grace_s=grace_s,
                                    notify=self._storage_note)
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
                                 None if timeout_s is None else self.t_start + timeout_s,
                                 device=device_index)
        self.heartbeat = rdb.TrialHeartbeat(self.study, self.storage, heartbeat_s,
                                            self._open_ids) if heartbeat_s else None
        self.open: dict[int, Any] = {}  # trial number -> Trial asked and not yet told
        self.known: dict[str, Any] = {}  # config_id -> finished FrozenTrial (dedupe)
        self.pending: dict[str, int] = {}  # config_id -> trial number in the pipeline
        self.dups: dict[int, list[Any]] = {}  # trial number -> trials asked with its config
        # Other workers: config_ids they are measuring now (the sampler skips them), and our
        # trials waiting for one of theirs (number -> (trial, config, their trial number)).
        self.foreign: set[str] = set()
        self.waiting: dict[int, tuple[Any, KernelConfig, int]] = {}
        self._last_sync = 0.0
        self._study_waiting = False  # the study holds WAITING trials (as of the last _sync)
        self._foreign_seen = 0.0  # when _sync last saw another worker measuring
        self._nvcc: str | None | bool = False  # False: not looked up yet
        self.incumbent: Any | None = None
        self._last_tick = 0.0
        self._avg_compile_s = 60.0
        self._avg_eval_s = 0.0  # GPU wall time per candidate (0: none measured yet)
        self._in_flight: int | None = None  # the trial on the GPU right now
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
        return cid not in self.known and cid not in self.pending and cid not in self.foreign

    def _open_ids(self) -> list[int]:
        """Storage ids of the trials this process holds (the heartbeat thread beats them)."""
        while True:
            try:
                return [t._trial_id for t in list(self.open.values())]
            except RuntimeError:  # the main thread changed the dict meanwhile
                continue

    def _storage_note(self, text: str) -> None:
        """The storage lost its database, or has it again (tuner/search/rdb.py): one line on stderr,
        and in the live view."""
        rdb.notify_stderr(text)
        prog = getattr(self, "progress", None)
        if prog is not None:
            prog.event(text[:160])

    # -- study metadata
    def _check_study_attrs(self) -> None:
        attrs = self.study.user_attrs
        shapes = [str(s) for s in self.shapes]
        space = self.space.to_dict()
        if "shapes" in attrs and _canonical(attrs["shapes"]) != shapes:
            raise SearchError(
                f"study '{self.study_name}' searches shapes {', '.join(attrs['shapes'])}; give "
                f"the same --shape options or a new --study name"
            )
        if "space" in attrs and not _same_space(attrs["space"], _jsonable(space)):
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
            self.progress.worker_recycles = self.worker.recycles
            self.progress_cb(self.progress)

    def _emit(self, text: str | None = None) -> None:
        if text:
            self.progress.event(text)
        self._last_tick = 0.0
        self._tick()

    # -- resume
    def recover(self) -> tuple[list[int], list[int]]:
        """Settle RUNNING trials of dead owners (this host) or of no owner older than us, as a
        search settles its own when it stops: one that reached the GPU (it has a ``build``)
        fails as "interrupted", one that never did goes back to WAITING. Returns the trial
        numbers (failed, put back)."""
        import optuna
        from optuna.trial import TrialState

        failed: list[int] = []
        put_back: list[int] = []
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
                stale = start is None or start < self.started_utc - timedelta(
                    seconds=OWNERLESS_GRACE_S)
            # Another host's trials are the heartbeat's (rdb.TrialHeartbeat): no pid to check.
            try:
                if stale and "build" not in t.user_attrs:
                    self._put_back(t._trial_id, t.params, "killed")
                    put_back.append(t.number)
                elif stale:
                    self.storage.set_trial_user_attr(t._trial_id, "fail_reason", "interrupted")
                    self.storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
                    failed.append(t.number)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # another worker settled it first
        return failed, put_back

    def prepare(self) -> None:
        """Settle what killed runs left and enqueue the known-good points: what every run does
        first, and what ``fa-tune search --create-only`` and a fleet's parent do once before
        any worker starts (so simultaneous workers do not enqueue the seeds twice)."""
        failed, put_back = self.recover()
        self.progress.event(f"stale RUNNING trials: failed {failed or 'none'}, "
                            f"back to waiting {put_back or 'none'}")
        self._enqueue_start_points()

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
        for source, params in seed_params(self.space, self.pclass.head_dim):
            if source in sources:
                continue
            if params is None:
                self.progress.event(f"{source} lies outside {self.space.source}: not enqueued")
                continue
            self.study.enqueue_trial(params, user_attrs={"source": source},
                                     skip_if_exists=True)

    def _load_known(self) -> None:
        trials = self.study.get_trials(deepcopy=False)
        for t in trials:
            cid = t.user_attrs.get("config_id")
            if cid and _is_verdict(t):
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
        import optuna

        failed, put_back = self.recover()
        self.progress.event(f"stale RUNNING trials: failed {failed or 'none'}, "
                            f"back to waiting {put_back or 'none'}")
        # The GPU worker first: no GPU (or no oracle) is one line before any compile starts.
        self.progress.current = "starting the GPU worker"
        self._emit()
        self.worker.start()
        try:
            self._check_gpu_model()  # before any trial: a refused worker leaves no trace
        except BaseException:
            self.worker.stop()
            raise
        self._enqueue_start_points()
        self._load_known()
        stopped_by = "finished"
        self.pool = ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="fa-tune-nvcc")
        old_term = None
        if threading.current_thread() is threading.main_thread():
            old_term = signal.signal(signal.SIGTERM, _raise_stop)
        if self.heartbeat is not None:
            self.heartbeat.start()
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
                if not self.queue and not self.waiting and not why and self._linger():
                    continue
                if not self.queue and not self.waiting:
                    if self._exhausted and stopped_by == "finished":
                        stopped_by = self._exhausted
                    break
                if why:
                    break  # the rest goes back to WAITING in finally
                cand = self._next_ready()
                if cand is None:
                    continue  # the deadline passed while every compile was still running
                self._sync_queue()
                gpu_s = self.worker.wall_s
                self._in_flight = cand.trial.number
                try:
                    self._evaluate(cand)
                except (_TrialLost, optuna.exceptions.UpdateFinishedTrialError):
                    self._lost(cand.trial)
                self._in_flight = None
                gpu_s = self.worker.wall_s - gpu_s
                if gpu_s > 0:  # it reached the GPU
                    self._avg_eval_s = gpu_s if not self._avg_eval_s else \
                        0.7 * self._avg_eval_s + 0.3 * gpu_s
                self._emit()
        except KeyboardInterrupt:
            stopped_by = "interrupted (Ctrl-C)"
        except _Stop:
            stopped_by = "interrupted (SIGTERM)"
        except BaseException as e:
            stopped_by = f"error ({type(e).__name__})"
            raise
        finally:
            self._asking = False
            self.pool.shutdown(wait=False, cancel_futures=True)
            not_run = self._settle_open(stopped_by)
            if self.heartbeat is not None:
                self.heartbeat.stop()
            self.worker.stop()
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
            summary = self._summary(stopped_by, not_run)
            self._record_session(summary)
        return summary

    def _linger(self) -> bool:
        """Nothing left to ask here (the space looks exhausted) while other workers still
        measure: wait, since a trial of theirs may come back (a dead worker's, enqueued again
        by the heartbeat) and be ours to measure. True while lingering. (Without a heartbeat
        a dead worker's trial never comes back: no lingering then.)"""
        if self.heartbeat is None or not self._exhausted or (
                self.n_trials is not None and self._asked >= self.n_trials):
            return False
        # A sweep fails a dead worker's trials first and enqueues their retries after: a
        # moment with neither, which a few seconds' tail outlasts.
        if not self.foreign and time.monotonic() - self._foreign_seen > LINGER_TAIL_S:
            return False
        self.progress.current = (f"nothing left to ask; {len(self.foreign)} configs still "
                                 "measured by other workers")
        self._tick()
        time.sleep(0.5)
        self._sync()
        if self._study_waiting:  # enqueued (a retry): ask again
            self._exhausted = None
            self._idle = 0
        return True

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
        compiles finish first. Returns None when the search should stop before any is ready,
        or when nothing is left in the pipeline (trials that waited for another worker's
        verdict got it).
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
            if self.waiting:
                self._sync(min_age_s=0.5)  # another worker's verdict, or ours to measure
            if not self.queue:
                if not self.waiting:
                    return None
                time.sleep(0.25)
            else:
                wait_futures([c.future for c in self.queue], timeout=0.25,
                             return_when=FIRST_COMPLETED)
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
            # Do not start a compile that cannot finish (and be measured) before the deadline,
            # nor ask beyond what the GPU can measure in the time left: such trials would only
            # go back to WAITING unmeasured.
            left = self.progress.deadline - time.monotonic()
            if left < 0.5 * self._avg_compile_s:
                return False
            if self._avg_eval_s and len(self.queue) * self._avg_eval_s >= left:
                return False
        return True

    def _sync_queue(self) -> None:
        self.progress.compile_queue = sum(1 for c in self.queue if not c.future.done())
        self.progress.compiling = sum(1 for c in self.queue if c.future.running())

    def _ask(self, pool: ThreadPoolExecutor) -> _Candidate | None:
        """Ask one trial; a static reject or a duplicate is told at once (returns None)."""
        import optuna

        self._sync()  # the sampler's filter and the dedupe see what other workers did
        trial = self.study.ask()
        self.open[trial.number] = trial
        try:
            return self._take(trial, pool)
        except (_TrialLost, optuna.exceptions.UpdateFinishedTrialError):
            self._lost(trial)
            return None

    def _take(self, trial: Any, pool: ThreadPoolExecutor) -> _Candidate | None:
        """A trial just asked: its verdict at once (static reject, duplicate), a wait for
        another worker's verdict, or a candidate whose compile starts now."""
        if self.heartbeat is not None:
            # Beat before anything else: a trial put back and asked again must not read as
            # stale to another worker's sweep.
            self.heartbeat.beat(trial._trial_id)
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
        verdict, other = self._elsewhere(trial.number, cid)
        if verdict is not None:  # another worker told it since our last look
            self.known.setdefault(cid, verdict)
            self._tell_duplicate(trial, verdict)
            return None
        if other is not None:
            # Another worker measures this config right now: its verdict, not a second timing.
            trial.set_user_attr("waits_for", other)
            self.waiting[trial.number] = (trial, cfg, other)
            self.progress.waiting = len(self.waiting)
            self.progress.event(f"trial {trial.number}: trial {other} (another worker) "
                                "measures this config; waiting for its verdict")
            return None
        self.pending[cid] = trial.number
        return _Candidate(trial, cfg, pool.submit(self.builder, cfg))

    # -- other workers
    def _elsewhere(self, number: int, cid: str) -> tuple[Any | None, int | None]:
        """Another worker's trial of this config, read afresh: (a finished trial that judged
        it, else None; else the lowest-numbered RUNNING one, else None).

        Our ``config_id`` is stored before this read, so of two workers that take the same
        config at the same moment at least one sees the other; one that sees waits (``waits_for``)
        and two that see each other are settled in ``_sync`` (the lower number measures). A
        verdict told since the last ``_sync`` is seen here too (Optuna's cache re-reads every
        trial that was unfinished)."""
        from optuna.trial import TrialState

        running: list[int] = []
        for t in self.study.get_trials(deepcopy=False):
            if t.number == number or t.number in self.open or \
                    t.user_attrs.get("config_id") != cid:
                continue
            if t.state.is_finished() and _is_verdict(t):
                return t, None
            if t.state == TrialState.RUNNING:
                running.append(t.number)
        return None, (min(running) if running else None)

    def _sync(self, min_age_s: float = 0.0) -> None:
        """Read what other workers did: their finished trials become verdicts here (dedupe),
        their RUNNING configs are skipped by the sampler, a better confirmed trial becomes the
        incumbent (pruning and confirming compare against the study's best, not this worker's),
        and trials that wait for another worker's verdict take it or, when that trial ends
        without one (its worker died) or waits for ours, are measured here."""
        from optuna.trial import TrialState

        now = time.monotonic()
        if now - self._last_sync < min_age_s:
            return
        self._last_sync = now
        trials = self.study.get_trials(deepcopy=False)
        foreign: set[str] = set()
        by_number: dict[int, Any] = {}
        self._study_waiting = False
        for t in trials:
            by_number[t.number] = t
            if t.state == TrialState.WAITING:
                self._study_waiting = True
            cid = t.user_attrs.get("config_id")
            if t.number in self.open or not cid:
                continue
            if t.state == TrialState.RUNNING:
                foreign.add(cid)
            elif _is_verdict(t):
                self.known.setdefault(cid, t)
        self.foreign = foreign
        if foreign:
            self._foreign_seen = now
        best = best_confirmed(trials)
        if best is not None and self.policy.is_new_best(best, self.incumbent) and (
                self.incumbent is None or best.number != self.incumbent.number):
            self.incumbent = best
            self._show_best(best)
        for number, (trial, cfg, other) in list(self.waiting.items()):
            o = by_number.get(other)
            if o is None:
                continue
            if o.state.is_finished() and _is_verdict(o):
                del self.waiting[number]
                self._tell_duplicate(trial, o)
            elif o.state != TrialState.RUNNING or (
                    o.user_attrs.get("waits_for") == number and number < other):
                del self.waiting[number]
                self._promote(trial, cfg)
        self.progress.waiting = len(self.waiting)

    def _promote(self, trial: Any, cfg: KernelConfig) -> None:
        """A waiting trial is measured here after all (as if just asked, without the wait)."""
        trial.set_user_attr("waits_for", None)
        cid = cfg.config_id()
        first = self.pending.get(cid)
        if first is not None:
            self.dups.setdefault(first, []).append(trial)
        elif cid in self.known:
            self._tell_duplicate(trial, self.known[cid])
        elif self.pool is not None:
            self.pending[cid] = trial.number
            self.queue.append(_Candidate(trial, cfg, self.pool.submit(self.builder, cfg)))
            self._asked += 1
            self._sync_queue()

    def _lost(self, trial: Any) -> None:
        """Another worker failed this trial while we held it: no heartbeat of ours reached the
        storage for the grace period (an outage, a stalled host). Optuna enqueued it again, and
        that copy measures the config; here it is only dropped."""
        import optuna

        self.open.pop(trial.number, None)
        self.waiting.pop(trial.number, None)
        for cid, n in list(self.pending.items()):
            if n == trial.number:
                del self.pending[cid]
        for dup in self.dups.pop(trial.number, []):
            try:
                self._fail(dup, "not run: duplicate of a trial that could not be measured",
                           counted=False, transient=True)
            except (_TrialLost, optuna.exceptions.UpdateFinishedTrialError):
                self.open.pop(dup.number, None)  # lost as well
        self.progress.event(f"trial {trial.number} was failed by another worker (no heartbeat "
                            f"from this one for {self.grace_s} s); its retry measures it")

    def _check_gpu_model(self) -> None:
        """The heterogeneity guard: timings of two GPU models do not compare, so a worker
        joins only a study made on its own model (name and SM count), unless allowed."""
        mine = gpu_model(self.worker.gpu)
        self.progress.gpu_name = str(mine.get("name") or "")
        theirs = self.study.user_attrs.get("gpu_model")
        if not isinstance(theirs, dict):
            self.study.set_user_attr("gpu_model", mine)
            return
        if _same_model(mine, theirs):
            return
        what = f"GPU {self.worker.device_index} is {_model_text(mine)}"
        if not self.allow_mixed_gpus:
            raise SearchError(
                f"{what}, but study '{self.study_name}' was measured on {_model_text(theirs)}; "
                "timings would not compare: use another --study, or --allow-mixed-gpus to "
                "join anyway"
            )
        self.progress.event(f"mixed GPUs: {what}, the study's is {_model_text(theirs)}")

    def _gpu_record(self, built: Any) -> dict[str, Any]:
        """What a trial records about where it was measured (the heterogeneity record)."""
        g = self.worker.gpu
        nvcc = getattr(built, "nvcc_version", None)
        if not nvcc:
            if self._nvcc is False:
                try:
                    self._nvcc = build_mod.nvcc_version()
                except FaTuneError:
                    self._nvcc = None
            nvcc = self._nvcc
        return {"name": g.get("name"), "sm_count": g.get("sm_count"),
                "driver_version": g.get("driver_version") or g.get("nvidia_driver_version"),
                "nvcc_version": nvcc, "host": socket.gethostname(),
                "device": self.worker.device_index}

    def _tell_duplicate(self, trial: Any, prev: Any) -> None:
        from optuna.trial import TrialState

        self.progress.duplicates += 1
        trial.set_user_attr("duplicate_of", prev.number)
        for k in ("build", "screen", "shapes", "prune_reason", "fail_reason", "gpu"):
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

        try:
            if state == TrialState.COMPLETE:
                ft = self.study.tell(trial, value)
            else:
                ft = self.study.tell(trial, state=state)
        except ValueError as e:
            if "Cannot tell a" in str(e):  # finished by another worker (a heartbeat sweep)
                raise _TrialLost(trial.number) from None
            raise
        self.open.pop(trial.number, None)
        cid = ft.user_attrs.get("config_id")
        if cid and _is_verdict(ft):
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
        (tuner/search/sampler.py) checks proposals first; alone, this made TPE stall on the H200
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

    def _settle_open(self, stopped_by: str) -> int:
        """Settle every trial this process asked and did not tell; returns how many went back
        to WAITING.

        The trial the GPU was measuring when an interrupt came fails as "interrupted" (its
        measurement was cut; it is re-enqueued next time). The others never reached the GPU:
        they go back to WAITING with their params fixed, as an enqueued trial, so the next
        search pops them before anything new (their builds are cached) and ``fa-tune show``
        lists them as waiting, not failed. (Telling them FAIL and re-enqueueing copies, as
        before, left a failure behind for every trial asked ahead of a deadline.)
        """
        from optuna.trial import TrialState

        put_back = 0
        for trial in list(self.open.values()):
            try:
                if trial.number == self._in_flight:
                    trial.set_user_attr("fail_reason", "interrupted")
                    self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
                else:
                    self._put_back(trial._trial_id, trial.params, stopped_by)
                    put_back += 1
            except Exception:  # noqa: BLE001 - keep settling the others
                pass
            self.open.pop(trial.number, None)
        return put_back

    def _put_back(self, trial_id: int, params: dict[str, Any], why: str) -> None:
        """RUNNING -> WAITING, params kept: study.ask() pops WAITING trials oldest first."""
        from optuna.trial import TrialState

        self.storage.set_trial_user_attr(trial_id, "not_run", why)
        if params:
            # As study.enqueue_trial stores them: the sampler leaves such a trial alone.
            self.storage.set_trial_system_attr(trial_id, "fixed_params", dict(params))
        self.storage.set_trial_state_values(trial_id, TrialState.WAITING)
        self.storage.forget_heartbeat(trial_id)

    # -- one candidate
    def _measure(self, so: str, shape: Problem, protocol: Protocol, gate: bool) -> dict[str, Any]:
        reply = self.worker.measure(so, shape, protocol, gate=gate, seed=self.gate_seed)
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
        trial.set_user_attr("gpu", self._gpu_record(built))
        why = built.unfit
        if why:
            self._fail(trial, f"artifact unfit to time: {why}")
            return
        so = str(built.so_path)
        self.progress.current = f"trial {trial.number}: gate + screen on {self.screen_shape}"
        self._emit()
        rows: dict[str, dict[str, Any]] = {}
        gates: dict[str, Any] = {}
        pol = self.policy
        try:
            r = self._measure(so, self.screen_shape, pol.screen, True)
            if r.get("status") != "ok":
                self._fail(trial, str(r.get("reason")))
                return
            gates[str(self.screen_shape)] = r.get("gate")
            scr = {"shape": str(self.screen_shape), **_row(r)}
            trial.set_user_attr("screen", scr)
            trial.report(scr["tflops"], 0)
            why = pol.prune_reason(scr, self.incumbent)
            if why:
                trial.set_user_attr("prune_reason", why)
                self._tell(trial, TrialState.PRUNED)
                self.progress.pruned += 1
                self.progress.done += 1
                self.progress.event(f"trial {trial.number} pruned (screen slower than trial "
                                    f"{self.incumbent.number})")
                return
            for shape in self.shapes:
                self.progress.current = f"trial {trial.number}: timing {shape}"
                self._emit()
                gate = shape != self.screen_shape
                r = self._measure(so, shape, pol.survey, gate)
                if r.get("status") != "ok":
                    self._fail(trial, str(r.get("reason")))
                    return
                if gate:
                    gates[str(shape)] = r.get("gate")
                rows[str(shape)] = _row(r, gates.get(str(shape)))
            trial.set_user_attr("shapes", rows)
            value = geomean([rows[str(s)]["tflops"] for s in self.shapes])
            if pol.needs_confirming(value, self.incumbent):
                self._confirm(trial, cfg, built, so, gates)
        except WorkerFailure as e:
            self._fail(trial, e.reason)
            return
        ft = self._tell(trial, TrialState.COMPLETE, value)
        self.progress.complete += 1
        self.progress.done += 1
        self.progress.event(f"trial {trial.number}: {value:.1f} TFLOPS (geomean)")
        if pol.is_new_best(ft, self.incumbent):
            self.incumbent = ft
            self._show_best(ft)
            self.progress.event(f"new best: trial {ft.number}, "
                                f"{confirmed_value(ft):.1f} TFLOPS confirmed")

    def _confirm(self, trial: Any, cfg: KernelConfig, built: Any, so: str,
                 gates: dict[str, Any]) -> None:
        """Noise guard: the policy's confirm protocol (FULL, as `fa-tune run` and `compare`
        time) on every shape; stored as ``confirmed``."""
        proto = self.policy.confirm
        timings: dict[str, dict[str, Any]] = {}
        for shape in self.shapes:
            self.progress.current = f"trial {trial.number}: confirming on {shape} (full protocol)"
            self._emit()
            r = self._measure(so, shape, proto, False)
            if r.get("status") != "ok":
                raise WorkerFailure(str(r.get("reason")))
            timings[str(shape)] = r
        shapes = {s: _row(r, gates.get(s)) for s, r in timings.items()}
        conf: dict[str, Any] = {
            "geomean_tflops": geomean([shapes[str(s)]["tflops"] for s in self.shapes]),
            "protocol": proto.to_dict(),
            "shapes": shapes,
        }
        try:
            conf["results_dir"] = str(self._write_results(trial, cfg, built, timings, gates))
        except (OSError, FaTuneError) as e:
            conf["results_error"] = str(e)
        trial.set_user_attr("confirmed", conf)

    def _write_results(self, trial: Any, cfg: KernelConfig, built: Any,
                       timings: dict[str, dict[str, Any]], gates: dict[str, Any]) -> Path:
        from tuner.measure import store

        rows = [store.shape_row(shape, status="passed", gate=gates.get(str(shape)),
                                timing=timings[str(shape)].get("timing"))
                for shape in self.shapes]
        try:
            bsum = store.build_summary(built)
        except Exception:  # noqa: BLE001 - a test builder's stand-in lacks the fields
            bsum = {"so_path": str(built.so_path), "key": getattr(built, "key", None)}
        payload = store.results_payload(
            cfg=cfg, rows=rows, protocol=self.policy.confirm.to_dict(), seed=self.gate_seed,
            gpu=self.worker.gpu, build=bsum,
            study={"name": self.study_name, "storage": redact(self.url), "trial": trial.number})
        out = store.new_result_dir(self.results_root or _paths.results_root())
        store.write_results(out, payload)
        return out

    # -- the end
    def _summary(self, stopped_by: str, not_run: int = 0) -> SearchSummary:
        best = None
        if self.incumbent is not None:
            t = self.incumbent
            best = {"trial": t.number, "config_id": t.user_attrs.get("config_id"),
                    "confirmed": t.user_attrs.get("confirmed")}
        p = self.progress
        return SearchSummary(
            study=self.study_name, storage=redact(self.url), trials_run=p.done,
            complete=p.complete, pruned=p.pruned, failed=p.failed, rejected=p.rejected,
            duplicates=p.duplicates, best=best, wall_s=time.monotonic() - self.t_start,
            gpu_busy_s=self.worker.busy_s, stopped_by=stopped_by, temp_wait_s=self.temp_wait_s,
            not_run=not_run, device=self.worker.device_index, gpu_name=p.gpu_name,
            owner=self.owner,
        )

    def _record_session(self, s: SearchSummary) -> None:
        """The session's record, under a key of its own (``session <UTC> <owner>``: workers
        that stop together cannot overwrite each other's) and appended to ``sessions``
        (read-modify-write: with several workers a record may miss that list, never its key)."""
        try:
            started = self.started_utc.strftime("%Y-%m-%dT%H:%M:%SZ")
            rec = {
                "started_utc": started,
                "owner": self.owner, "wall_s": round(s.wall_s, 2),
                "gpu_busy_s": round(s.gpu_busy_s, 2), "temp_wait_s": round(s.temp_wait_s, 2),
                "trials": s.trials_run,
                "complete": s.complete, "pruned": s.pruned, "failed": s.failed,
                "rejected": s.rejected, "not_run": s.not_run, "stopped_by": s.stopped_by,
                "device": s.device, "gpu": s.gpu_name,
            }
            self.study.set_user_attr(f"session {started} {self.owner}", rec)
            sessions = list(self.study.user_attrs.get("sessions", []))
            sessions.append(rec)
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


def _is_verdict(t: Any) -> bool:
    """Whether a finished trial judged its config (so another trial of it is a duplicate):
    COMPLETE or PRUNED, or FAIL with a reason that is the config's (not an interruption, not
    a missing tool, not a worker that died without telling: rdb.stale_failed)."""
    from optuna.trial import TrialState

    if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    return (t.state == TrialState.FAIL and not rdb.stale_failed(t)
            and t.user_attrs.get("fail_reason") not in REQUEUE_REASONS
            and not t.user_attrs.get("transient"))


def gpu_model(gpu: dict[str, Any]) -> dict[str, Any]:
    """What makes two GPUs time alike (the heterogeneity guard): model name and SM count."""
    return {"name": gpu.get("name"), "sm_count": gpu.get("sm_count")}


def _same_model(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.get("name") == b.get("name") and a.get("sm_count") == b.get("sm_count")


def _model_text(m: dict[str, Any]) -> str:
    sms = f", {m['sm_count']} SMs" if m.get("sm_count") else ""
    return f"{m.get('name') or 'an unnamed GPU'}{sms}"


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


def _same_space(stored: Any, current: dict[str, Any]) -> bool:
    """Whether a study's recorded space searches what ``current`` does. A knob added to fa-tune
    after the study was created, and pinned to its default in ``current``, changes nothing the
    study searched (its trials ran that default), so the study still resumes."""
    if not isinstance(stored, dict):
        return False
    defaults = KernelConfig().to_dict()
    added = set(current) - set(stored)
    return (set(stored) <= set(current)
            and all(stored[k] == current[k] for k in stored)
            and all(current[k] == [defaults[k]] for k in added))


def _canonical(texts: Any) -> list[str]:
    """A study's stored problem names in today's canonical form (unparseable ones as they are)."""
    out = []
    for s in list(texts or []):
        try:
            out.append(str(Problem.parse(str(s))))
        except ShapeError:
            out.append(str(s))
    return out


def _jsonable(d: Any) -> Any:
    import json

    return json.loads(json.dumps(d))

