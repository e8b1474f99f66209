"""Several search workers on one study: one per GPU of this host (``fa-tune search --gpus``),
and joining an existing study from any host (``fa-tune worker``).

A worker is a whole ``tuner.search.loop.Search`` (its own GPU worker subprocess, compile pool and
sampler) in its own process, against the study's storage; Optuna's storage is the only
coordinator. So a host's fleet and a cluster are one mechanism: ``fa-tune worker`` on another
host runs exactly what each process here runs. Processes, not threads: the sampler (TPE) and
the ask/tell bookkeeping are Python and would share one GIL, so N threads would feed N GPUs from
one core; a process that crashes or is killed takes only its own GPU out (its trials are failed
by the heartbeat and measured again by the others: tuner/search/rdb.py), and nothing is shared in
memory that could disagree with the storage.

What the fleet adds to N independent workers:

* the study is created and its known-good points enqueued once, here, before any worker starts
  (``Search.prepare``), so simultaneous workers neither race to create it nor enqueue twice;
* the host's cores (``--jobs``, default all usable) are split evenly between the workers'
  compile pools (``share``): nvcc is the host's bottleneck (a fresh search keeps one H200 only
  60-70% busy on 16 cores), and an even split keeps any one worker's queue from starving the
  others; compiles of one config are never repeated, across workers too, since the artifact
  cache locks each key (tuner/kernel/build.py) and the dedupe spans the study
  (tuner/search/loop.py);
* worker i samples with ``seed + i`` (else each would propose the same sequence) and takes
  ``--trials`` / N of the trial budget;
* Ctrl-C or SIGTERM reaches each worker once, as SIGTERM: each settles its own trials;
* progress and summaries come back over a queue, per GPU.

Storage: the default ``sqlite:///studies/<study>.db`` is safe with several writer processes on
one host (WAL, a 60 s busy timeout, and every call retried while the database is locked:
tuner/search/study.py, tuner/search/rdb.py). Several hosts need a server (PostgreSQL).
"""

from __future__ import annotations

import copy
import dataclasses
import multiprocessing as mp
import queue as queue_mod
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tuner.errors import FaTuneError, SearchError
from tuner.kernel.gpus import probe_gpus
from tuner.problem import Problem
from tuner.search.loop import Search
from tuner.search.session import EventLog, Progress, SearchSummary
from tuner.search.space import SearchSpace
from tuner.search.study import load_existing_study, redact
from tuner.search.trials import best_summary

# After Ctrl-C / SIGTERM, how long the workers get to settle their trials before SIGKILL.
SETTLE_S = 120.0


# ---- options -----------------------------------------------------------------------------------
def visible_gpus() -> list[int]:
    """Indices of the CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies)."""
    probe = probe_gpus()
    if not probe.gpus:
        raise SearchError(f"--gpus all: no CUDA GPU is visible ({probe.error or 'none found'})")
    return [g.index for g in probe.gpus]


def parse_gpus(text: str, visible: Callable[[], list[int]] = visible_gpus) -> list[int]:
    """``0,1,3`` or ``all`` -> device indices (distinct, in the order given)."""
    t = (text or "").strip().lower()
    if t == "all":
        return visible()
    out: list[int] = []
    for part in t.split(","):
        part = part.strip()
        if not part.isdigit():
            raise SearchError(f"bad --gpus '{text}': give device indices like 0,1 or 'all'")
        if int(part) in out:
            raise SearchError(f"bad --gpus '{text}': GPU {part} is listed twice")
        out.append(int(part))
    return out


def share(total: int, n: int) -> list[int]:
    """``total`` units split into n near-equal shares of at least 1 (the first ones larger)."""
    base, extra = divmod(max(total, n), n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def study_spec(study: str, storage: str | None) -> tuple[SearchSpace, list[Problem]]:
    """The search space and problems an existing study was created with (its user attrs),
    so a joining worker searches exactly that study."""
    from tuner.search.space import space_from_dict

    st = load_existing_study(study, storage)
    attrs = st.user_attrs
    if not isinstance(attrs.get("space"), dict) or not attrs.get("shapes"):
        raise SearchError(f"study '{study}' was not created by fa-tune search (no space or "
                          "problems recorded): create it with `fa-tune search --create-only`")
    space = space_from_dict(attrs["space"], str(attrs.get("space_source") or f"study {study}"))
    return space, [Problem.parse(str(s)) for s in attrs["shapes"]]


# ---- state the CLI shows -------------------------------------------------------------------------
@dataclass
class WorkerState:
    device: int
    progress: Progress | None = None
    summary: SearchSummary | None = None
    error: str | None = None  # one line: why this worker stopped without a summary
    exit_code: int = 0


@dataclass
class FleetProgress:
    study: str
    workers: dict[int, WorkerState]
    deadline: float | None
    started: float = field(default_factory=time.monotonic)
    events: EventLog = field(default_factory=EventLog)

    def event(self, text: str) -> None:
        self.events.add(time.monotonic() - self.started, text)


@dataclass
class FleetSummary:
    study: str
    storage: str
    workers: list[WorkerState]
    wall_s: float
    stopped_by: str
    best: dict[str, Any] | None = None  # the study's best confirmed trial after the run

    @property
    def summaries(self) -> list[SearchSummary]:
        return [w.summary for w in self.workers if w.summary is not None]

    @property
    def trials_run(self) -> int:
        return sum(s.trials_run for s in self.summaries)

    @property
    def trials_per_hour(self) -> float:
        return self.trials_run * 3600.0 / self.wall_s if self.wall_s > 0 else 0.0


# ---- the fleet -------------------------------------------------------------------------------
class Fleet:
    """One Search process per device, all on one study (module docstring).

    ``search_kwargs`` are tuner.search.loop.Search's keyword arguments apart from ``device_index``
    and ``progress_cb`` (a ``builder``, if any, must pickle: each worker is a spawned process).
    """

    def __init__(self, devices: list[int], search_kwargs: dict[str, Any],
                 progress_cb: Callable[[FleetProgress], None] | None = None) -> None:
        if len(devices) < 1:
            raise SearchError("--gpus lists no GPU")
        self.devices = list(devices)
        self.kwargs = dict(search_kwargs)
        self.progress_cb = progress_cb or (lambda _p: None)
        n = len(devices)
        from tuner.kernel.toolchain import compile_jobs

        self.jobs = share(compile_jobs(self.kwargs.pop("jobs", None)), n)
        trials = self.kwargs.pop("n_trials", None)
        # --trials is the fleet's budget: N near-equal shares (at least one trial per GPU).
        self.trials: list[int | None] = [None] * n if trials is None else \
            list(share(int(trials), n))
        self.seed = self.kwargs.pop("seed", None)
        timeout = self.kwargs.get("timeout_s")
        self.progress = FleetProgress(
            str(self.kwargs.get("study")), {d: WorkerState(d) for d in devices},
            None if timeout is None else time.monotonic() + float(timeout))

    def worker_kwargs(self, i: int) -> dict[str, Any]:
        kw = dict(self.kwargs)
        kw.update(device_index=self.devices[i], jobs=self.jobs[i], n_trials=self.trials[i],
                  seed=None if self.seed is None else (int(self.seed) + i) % 2**32)
        return kw

    def prepare(self) -> str:
        """Create the study (or check it against these options) and enqueue its known-good
        points, once, in this process; returns the storage URL as shown (redacted)."""
        s = Search(**self.worker_kwargs(0))
        try:
            s.prepare()
            return redact(s.url)
        finally:
            s.storage.engine.dispose()

    def run(self) -> FleetSummary:
        storage = self.prepare()
        ctx = mp.get_context("spawn")
        q: Any = ctx.Queue()
        procs: dict[int, Any] = {}
        for i, dev in enumerate(self.devices):
            # Not daemonic: each worker starts its own GPU worker subprocess.
            p = ctx.Process(target=_worker_main, args=(self.worker_kwargs(i), dev, q),
                            name=f"fa-tune-search-gpu{dev}")
            p.start()
            procs[dev] = p
        t0 = time.monotonic()
        stopped_by = "finished"
        signalled: set[int] = set()
        old_term = None
        if threading.current_thread() is threading.main_thread():
            old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
        settle_deadline: float | None = None
        try:
            while True:
                try:
                    self._drain(q, procs)
                    if all(not p.is_alive() for p in procs.values()):
                        self._drain(q, procs, final=True)
                        break
                    if settle_deadline is not None and time.monotonic() > settle_deadline:
                        for p in procs.values():
                            if p.is_alive():
                                p.kill()
                        settle_deadline = None
                except (KeyboardInterrupt, _Interrupt) as e:
                    if settle_deadline is not None:  # asked twice: do not wait any longer
                        for p in procs.values():
                            if p.is_alive():
                                p.kill()
                        continue
                    stopped_by = ("interrupted (Ctrl-C)" if isinstance(e, KeyboardInterrupt)
                                  else "interrupted (SIGTERM)")
                    self.progress.event(f"{stopped_by}: the workers settle their trials")
                    for dev, p in procs.items():
                        if p.is_alive() and dev not in signalled:
                            signalled.add(dev)
                            p.terminate()  # SIGTERM: the worker settles its trials and stops
                    settle_deadline = time.monotonic() + SETTLE_S
        finally:
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
            for p in procs.values():
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join(5)
            q.close()
        workers = [self.progress.workers[d] for d in self.devices]
        if stopped_by == "finished" and all(w.summary is None for w in workers):
            errs = [w for w in workers if w.error]
            if errs and all(w.exit_code == 2 for w in errs):
                # The same user error everywhere (no GPU, another GPU model, ...): one line.
                raise SearchError(errs[0].error or "every worker failed")
        return FleetSummary(study=self.progress.study, storage=storage, workers=workers,
                            wall_s=time.monotonic() - t0, stopped_by=stopped_by,
                            best=best_summary(str(self.kwargs["study"]),
                                             self.kwargs.get("storage")))

    def _drain(self, q: Any, procs: dict[int, Any], final: bool = False) -> None:
        """Take the workers' messages (waiting up to 0.25 s for the first one)."""
        timeout = 0.25
        while True:
            try:
                kind, dev, payload = q.get(timeout=timeout)
            except queue_mod.Empty:
                break
            timeout = 0.0 if not final else 0.2
            w = self.progress.workers[dev]
            if kind == "progress":
                w.progress = payload
            elif kind == "done":
                w.summary = payload
                self.progress.event(f"GPU {dev}: stopped ({payload.stopped_by})")
            elif kind == "error":
                w.error, w.exit_code = payload
                self.progress.event(f"GPU {dev}: {w.error}"[:160])
        for dev, p in procs.items():
            w = self.progress.workers[dev]
            if final and w.summary is None and w.error is None and p.exitcode is not None:
                from tuner.search.worker_client import _exit_text

                w.error = (f"the worker process died ({_exit_text(p.exitcode)}); the heartbeat "
                           "fails its trials and another worker measures them again")
                w.exit_code = 1
                self.progress.event(f"GPU {dev}: {w.error}"[:160])
        self.progress_cb(self.progress)


class _Interrupt(Exception):
    """SIGTERM to the fleet's parent."""


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise _Interrupt()


def _worker_main(kwargs: dict[str, Any], device: int, q: Any) -> None:
    """One worker process: a Search on ``device``; progress, then a summary or one error line,
    go back over ``q``. Ctrl-C is the parent's to handle (it sends SIGTERM once)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def on_progress(p: Progress) -> None:
        q.put(("progress", device, copy.deepcopy(p)))

    try:
        s = Search(**kwargs, progress_cb=on_progress)
        summary = s.run()
        q.put(("progress", device, copy.deepcopy(s.progress)))
        q.put(("done", device, dataclasses.replace(summary)))
    except FaTuneError as e:
        q.put(("error", device, (" ".join(str(e).split()), e.exit_code)))
    except BaseException as e:  # noqa: BLE001 - one line to the parent, not a traceback
        q.put(("error", device, (f"{type(e).__name__}: {' '.join(str(e).split())}", 1)))
