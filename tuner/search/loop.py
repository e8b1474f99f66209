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
            every gate also records the error ratios (tuner.measure.accuracy): against the BF16
            implementation, and against the default config's error on the same inputs (its
            library built once, the worker gates it once per problem); with
            ``max_error_ratio`` (--max-error-ratio) a candidate whose error is more than that
            many times the default's fails, as a failed gate does

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
max_abs_err, fa_ratio, err_vs_default, rms_vs_default}}), ``accuracy`` ({shape: {fa_ratio,
fa_rule_ok, err_vs_default, rms_vs_default}}: each gate's error ratios), ``confirmed``
({geomean_tflops, protocol, shapes, results_dir}),
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

import dataclasses
import functools
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, cast

from tuner import child_process
from tuner.errors import ConfigError, SearchError, ShapeError
from tuner.kernel import shared_cache, toolchain
from tuner.kernel.config import KernelConfig, default_preset, load_preset
from tuner.kernel.support import check_runnable
from tuner.problem import Problem, ProblemClass
from tuner.search import rdb
from tuner.search.artifacts import StudyArtifacts, open_store
from tuner.search.compile_only import CompileOnly
from tuner.search.gpu_worker import DEFAULT_ENTRY
from tuner.search.outcomes import TrialOutcomes
from tuner.search.policy import SearchPolicy
from tuner.search.sampler import (
    FeasibleSampler,
    make_sampler,
    static_check,
    suggest_config,
    valid_config,
)
from tuner.search.session import (
    REQUEUE_REASONS,
    TIMEOUT_TOO_SHORT,
    Progress,
    SearchSummary,
    StopSignals,
    _Candidate,
    _owner,
    _Stop,
    _TrialLost,
    seed_params,
)
from tuner.search.shared import SharedStudy
from tuner.search.space import SearchSpace
from tuner.search.study import check_study_name, open_storage, quiet_optuna, storage_url
from tuner.search.worker_client import GpuWorker

# ---- the search's constants -------------------------------------------------------------------
# Stop when the sampler proposes this many invalid or already-measured configs in a row.
MAX_IDLE_ASKS = 300
# Heartbeat of the trials a worker holds (tuner/search/rdb.py): a beat every HEARTBEAT_S; a trial
# without one for GRACE_S belongs to a dead worker and is failed and enqueued again. The grace
# outlasts a storage hiccup; a dead worker's config waits that long for its retry.
HEARTBEAT_S = 10
GRACE_S = 60
# A worker with nothing left to ask waits this long after the others' last trial ended, for
# the retries of a dead worker's trials to be enqueued (rdb.RequeueStaleTrial).
LINGER_TAIL_S = 3.0

Builder = Callable[[KernelConfig], Any]  # -> an object with so_path, local_memory, ...


# ---- small helpers ---------------------------------------------------------------------------


# ---- progress --------------------------------------------------------------------------------


# ---- the search ---------------------------------------------------------------------------
class Search(SharedStudy, TrialOutcomes, CompileOnly):
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
        max_error_ratio: float | None = None,
        problem_class: ProblemClass | None = None,
        artifacts: str | None = None,
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
        # The seeds made for a class lead when the problems themselves are of it, where a
        # caller builds for a wider class than the problems' (window presets led a full bucket
        # at 0.77x FA3, docs/PERF.md step 80).
        self.problems_class = self.pclass
        if problem_class is not None:  # the class a workload's bucket is built for
            why = next((f"{p}: {w}" for p in shapes
                        if (w := problem_class.serves(p, varlen=False))), None)
            if why:
                raise ShapeError(f"the problems do not fit problem class {problem_class}: {why}")
            self.pclass = dataclasses.replace(problem_class, varlen=self.pclass.varlen)
        if n_trials is not None and n_trials < 1:
            raise SearchError(f"--trials must be at least 1 (got {n_trials})")
        self.study_name = check_study_name(study)
        self.space = space
        self.shapes = list(shapes)
        self.screen_shape = min(self.shapes, key=lambda s: (s.flops, str(s)))
        self.url = storage_url(study, storage)
        self.n_trials = n_trials
        self.timeout_s = timeout_s
        self.jobs = toolchain.compile_jobs(jobs)
        # Open trials (compiling, compiled and waiting, on the GPU): more than --jobs only
        # deepens the pile of compiled trials when the GPU and this loop are the bottleneck,
        # and every storage read re-reads the open trials (docs/PERF.md step 70).
        self.lookahead = max(2, self.jobs)
        if builder is None:
            from tuner.kernel.build import build_config

            builder = functools.partial(build_config, pclass=self.pclass)
        self.builder = builder
        if max_error_ratio is not None and not max_error_ratio > 0:
            raise SearchError(f"--max-error-ratio must be positive (got {max_error_ratio:g})")
        self.max_error_ratio = max_error_ratio
        # The default config of the problems' class: its library is what every gate's
        # err_vs_default compares with (built once, through the builder; outcomes.py).
        self.default_cfg = load_preset(default_preset(self.pclass))
        self._default_so: str | None | bool = False  # False: not built yet
        self.policy = policy or SearchPolicy()
        self.gate_seed = gate_seed
        self.results_root = results_root
        self.progress_cb = progress_cb
        self.owner = _owner()
        self.t_start = time.monotonic()
        self.started_utc = datetime.now(timezone.utc)

        self.allow_mixed_gpus = allow_mixed_gpus
        self.grace_s = grace_s or GRACE_S
        store = open_store(artifacts) if artifacts else None  # refused before any database
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
        # Kernels shared with the study's other hosts (tuner.search.artifacts), if named.
        self.artifacts = None if store is None else StudyArtifacts(
            self.study, store, lambda text: self.progress.event(text))
        self.worker = GpuWorker(worker_entry, device_index, tick=self._tick_measuring,
                                background=self._ask_while_gpu_works)
        self.stops = StopSignals(self._emit)
        self.storage.stop_requested = lambda: self.stops.why is not None
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
        self.queued: set[str] = set()  # configs of WAITING trials: someone's ask will take them
        self.waiting: dict[int, tuple[Any, KernelConfig, int]] = {}
        self._last_sync = 0.0
        self._study_waiting = False  # the study holds WAITING trials (as of the last _sync)
        self._foreign_seen = 0.0  # when _sync last saw another worker measuring
        self._nvcc: str | None | bool = False  # False: not looked up yet
        self.incumbent: Any | None = None
        self.confirm_ratios: list[float] = []  # confirmed / survey, the study's (policy)
        self.screen_ratios: list[float] = []  # screen / confirmed times, the study's (policy)
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
        self._final_text: str | None = None  # the final's verdict line (outcomes._final)

    def _acceptable(self, params: dict[str, Any]) -> bool:
        """The sampler's filter: a config the static check takes and no trial has measured, is
        measuring or waits to measure (a duplicate would only repeat a verdict)."""
        cfg = valid_config(params, self.space, self.shapes)
        if cfg is None:
            return False
        cid = cfg.config_id()
        return cid not in self.known and cid not in self.pending and cid not in self.foreign \
            and cid not in self.queued

    def _tick(self) -> None:
        now = time.monotonic()
        if self.progress_cb is not None and now - self._last_tick >= 0.25:
            self._last_tick = now
            self.progress.gpu_busy_s = self.worker.busy_s
            self.progress.worker_restarts = self.worker.restarts
            self.progress.worker_recycles = self.worker.recycles
            self.progress_cb(self.progress)

    def _tick_measuring(self) -> None:
        """The GPU wait's tick: where a requested stop cuts a measurement."""
        self.stops.check()
        self._tick()

    def _emit(self, text: str | None = None) -> None:
        if text:
            self.progress.event(text)
        self._last_tick = 0.0
        self._tick()

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
        for source, params in seed_params(self.space, self.pclass.head_dim, self.problems_class):
            if source in sources:
                continue
            if params is None:
                self.progress.event(f"{source} lies outside {self.space.source}: not enqueued")
                continue
            self.study.enqueue_trial(params, user_attrs={"source": source},
                                     skip_if_exists=True)

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
        self.progress.ready = True
        shared_cache.set_share(self.artifacts)
        self._enqueue_start_points()
        self._load_known()
        stopped_by = "finished"
        self.pool = ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="fa-tune-nvcc")
        self.stops.install()
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
            self._final_text = self._final()  # after the budget: the top configs' final
        except KeyboardInterrupt:
            stopped_by = "interrupted (Ctrl-C)"
        except _Stop as e:
            stopped_by = e.why
        except BaseException as e:
            stopped_by = f"error ({type(e).__name__})"
            raise
        finally:
            self.stops.settling = True
            self._asking = False
            self.pool.shutdown(wait=False, cancel_futures=True)
            # Compiles still running are no longer wanted (their trials go back to WAITING):
            # killed, not waited for at the process's exit. A killed nvcc is no verdict.
            child_process.kill_running()
            shared_cache.set_share(None)
            not_run = self._settle_open(stopped_by)
            if self.heartbeat is not None:
                self.heartbeat.stop()
            self.worker.stop()
            self.stops.restore()
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

    def _has_room(self, fresh: bool = False) -> bool:
        """Whether an ask can find a config: checked before the trial is created, because an
        ask that finds none still creates one (recorded as a duplicate, or put back as WAITING by
        a compile-only worker). WAITING trials (seeds, retries) are asks to make whatever the
        space holds, unless the asks are ``fresh`` (a compile-only worker's: never those)."""
        from optuna.trial import TrialState

        room = getattr(self.study.sampler, "has_room", None)
        if not callable(room) or room():
            return True
        if not fresh and self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return True
        self._exhausted = self._starved_text()
        return False

    def _starved_text(self) -> str:
        tries = cast(FeasibleSampler, self.study.sampler).random_tries
        return (f"no valid config that is not yet measured turned up in {tries} random draws "
                "(space exhausted?)")

    def _fill(self, max_asks: int | None = None) -> int:
        """Ask until ``lookahead`` trials are open (or ``max_asks`` asks); returns how many
        asks were made. A static reject or a duplicate is told at once."""
        n = 0
        while (max_asks is None or n < max_asks) and self.pool is not None \
                and len(self.open) < self.lookahead and self._may_ask(self._asked):
            n += 1
            cand = self._ask(self.pool)
            if cand is None:
                self._idle += 1
                if getattr(self.study.sampler, "starved", False):  # a FeasibleSampler
                    self._exhausted = self._starved_text()
                elif self._idle >= MAX_IDLE_ASKS:
                    self._exhausted = (f"the sampler proposed {self._idle} invalid or already "
                                       "measured configs in a row (space exhausted?)")
                continue
            self._idle = 0
            self._asked += 1
            self.queue.append(cand)
            self._sync_queue()
        return n

    def _compiling(self) -> int:
        """Compiles started or queued in the pool (the candidates not yet built)."""
        return sum(1 for c in self.queue if not c.future.done())

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
        compiles finish first. Returns None when the search should stop (even with one ready),
        or when nothing is left in the pipeline (trials that waited for another worker's
        verdict got it).
        """
        while True:
            if self._should_stop():  # first: a compile a Ctrl-C killed is no verdict
                return None
            for cand in self.queue:
                if cand.future.done():
                    self.queue.remove(cand)
                    return cand
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
        if self.stops.why is not None:
            return self.stops.why
        if self.progress.deadline is not None and time.monotonic() >= self.progress.deadline:
            return "timeout"
        return None

    def _may_ask(self, asked: int, fresh: bool = False) -> bool:
        if self._exhausted:
            return False
        exhausted = getattr(self.study.sampler, "is_exhausted", None)
        if callable(exhausted) and exhausted(self.study):
            self._exhausted = "every point of the grid has been asked"
            return False
        started = getattr(self.study.sampler, "all_started", None)
        if callable(started) and started(self.study):
            return False  # the last grid points are in flight: their verdicts end the grid
        if self.n_trials is not None and asked >= self.n_trials:
            return False
        if self.progress.deadline is not None:
            # Do not start a compile that cannot finish (and be measured) before the deadline,
            # nor ask beyond what the GPU can measure in the time left: such trials would only
            # go back to WAITING unmeasured.
            left = self.progress.deadline - time.monotonic()
            if left < 0.5 * self._avg_compile_s:
                if asked == 0 and not self.queue:  # the run would end with nothing to show
                    self._exhausted = (
                        f"{TIMEOUT_TOO_SHORT} {left:.0f} s, under half of a candidate's compile "
                        f"(about {self._avg_compile_s:.0f} s expected before the first): give a "
                        "longer --timeout")
                return False
            if self._avg_eval_s and len(self.queue) * self._avg_eval_s >= left:
                return False
        return self._has_room(fresh)

    def _sync_queue(self) -> None:
        self.progress.compile_queue = self._compiling()
        self.progress.compiling = sum(1 for c in self.queue if c.future.running())

    def _ask(self, pool: ThreadPoolExecutor, fresh: bool = False) -> _Candidate | None:
        """Ask one trial; a static reject or a duplicate is told at once (returns None).
        ``fresh``: a new trial of the sampler, never a WAITING one (a compile-only worker's:
        the WAITING ones are the GPU workers' next)."""
        import optuna

        self._sync()  # the sampler's filter and the dedupe see what other workers did
        if fresh:
            # Through the study's own (cached) storage, as study.ask does after its pop:
            # Optuna has no public call for "a new trial, whatever waits".
            trial = optuna.trial.Trial(
                self.study, self.study._storage.create_new_trial(self.study._study_id))
        else:
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


