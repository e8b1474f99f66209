"""The search session's pieces beside its loop (tuner/search/loop.py): the live progress and
the end-of-session summary, a built candidate, the search's small helpers (durations, seed
points, the GPU model guard's comparison, study-attribute comparisons) and the FAIL reasons that
mean "cut, not judged"."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from tuner.errors import FaTuneError, SearchError, ShapeError
from tuner.kernel.build import KILLED
from tuner.kernel.config import KNOBS, KernelConfig, load_preset
from tuner.measure.accuracy import accuracy_record
from tuner.measure.timing import geomean  # noqa: F401 - outcomes' and tests' name for it
from tuner.problem import Problem
from tuner.problem_class import ProblemClass
from tuner.search import rdb
from tuner.search.space import SearchSpace

# FAIL reasons of trials whose measurement was cut, not judged: re-enqueued on resume.
# "not run: search stopped" is what earlier versions told trials they never started.
REQUEUE_REASONS = ("interrupted", "not run: search stopped")
# The stop reason of a search whose --timeout leaves no time for one compile (a user's error:
# the CLI exits 2 on it).
TIMEOUT_TOO_SHORT = "--timeout left"
# A RUNNING trial without an owner (versions before owners) counts as killed only when it
# started this long before us: a trial another worker asked a moment ago has no owner yet.
OWNERLESS_GRACE_S = 120.0


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


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def seed_params(space: SearchSpace, head_dim: int = 128, pclass: ProblemClass | None = None
                ) -> list[tuple[str, dict[str, Any] | None]]:
    """(source, params) of every known-good point (the space file's ``seeds``; a file without
    them gets those of its head dim's default space); params None when it lies outside space.
    With ``pclass``, the seeds made for that class (``first_for``) come first, in file order.
    A study that lacks one (an older study) gets it on resume."""
    from tuner.search.space import default_space_name, load_space

    seeds = space.seeds or load_space(default_space_name(head_dim)).seeds
    if pclass is not None:
        seeds = tuple(sorted(seeds, key=lambda s: not s.leads(pclass)))  # stable
    return [(s.source, params_for(load_preset(s.preset).replace(**dict(s.changes)), space))
            for s in seeds if not _for_other_classes(s, space)]


def _for_other_classes(seed: Any, space: SearchSpace) -> bool:
    """A seed that sets a knob bound to problem classes this study's space does not search
    (e.g. ``softcap_tanh`` in a study without a softcap): it is meant for other classes, and is
    left out without a word (not reported as lying outside the space)."""
    return any(KNOBS[k].classes and k not in space.dims for k, _ in seed.changes)


def params_for(cfg: KernelConfig, space: SearchSpace) -> dict[str, Any] | None:
    """The free-knob params that make a trial suggest cfg; None if cfg lies outside the space."""
    if not space.contains(cfg):
        return None
    return {k: getattr(cfg, k) for k in space.free_knobs}


@dataclass
class EventLog:
    """A search's events as (seconds since it started, text), the newest 64, and how many
    there were in all, so a log that prints each once (the CLI, piped) knows which are new."""

    items: list[tuple[float, str]] = field(default_factory=list)
    count: int = 0

    def add(self, since_start: float, text: str) -> None:
        self.items = (self.items + [(since_start, text)])[-64:]
        self.count += 1


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
    spilled: int = 0  # compiled to local memory: not timed, infeasible for the sampler
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
    events: EventLog = field(default_factory=EventLog)
    ready: bool = False  # past the refusals (the GPU worker up, its GPU model accepted)
    device: int = 0  # the CUDA device this worker measures on
    gpu_name: str = ""  # as its GPU worker reports it
    waiting: int = 0  # trials waiting for another worker's verdict on their config

    def event(self, text: str) -> None:
        self.events.add(time.monotonic() - self.started, text)


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
    final: str | None = None  # the final's verdict (tuner.search.final), if one was played
    # (trial, seconds from the start) of the first confirmed within 1 % of this run's best
    near_best: tuple[int, float] | None = None
    spilled: int = 0  # compiled to local memory: not timed (told PRUNED, infeasible)

    @property
    def gpu_busy_fraction(self) -> float:
        return self.gpu_busy_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def trials_per_hour(self) -> float:
        return self.trials_run * 3600.0 / self.wall_s if self.wall_s > 0 else 0.0


class _Stop(Exception):
    """A stop the user asked for (SIGTERM, Ctrl-C), raised where the search polls for it."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class StopSignals:
    """SIGTERM, Ctrl-C and SIGHUP (a closed terminal) as a stop request that the search polls
    at safe points.

    The handler only records the request. An exception raised from a signal handler lands
    wherever the main thread happens to be, inside a storage commit or between Optuna's
    creating a trial and the search's holding it, and left a RUNNING trial that no worker
    owns or a storage session that failed the next call (CI, 2026-12-06). The search polls
    ``why`` between steps and ``check()`` in its waits (GPU reply, compiles), so a stop lands
    within a quarter second. A second signal raises at once, for a search stuck where nothing
    polls, except while the search settles its trials. Ctrl-C is taken over only where Python's
    default handler has it (a fleet's worker ignores it: its parent sends SIGTERM)."""

    def __init__(self, notify: Callable[[str], None]) -> None:
        self.why: str | None = None
        self.notify = notify
        # Set once the search settles its trials: a further signal must not cut that short
        # (it left a RUNNING trial, or a traceback from the GPU worker's join).
        self.settling = False
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals reach the main thread only; a search in a thread is stopped by it
        self._old[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_signal)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._old[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_signal)
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # a closed terminal (not nohup)
            self._old[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._on_signal)

    def restore(self) -> None:
        for signum, old in self._old.items():
            signal.signal(signum, old)
        self._old.clear()

    def check(self) -> None:
        if self.why is not None:
            raise _Stop(self.why)

    def _on_signal(self, signum: int, frame: Any) -> None:
        why = {signal.SIGINT: "interrupted (Ctrl-C)", signal.SIGHUP: "interrupted (SIGHUP)"}.get(
            signal.Signals(signum), "interrupted (SIGTERM)")
        if self.settling:
            self.notify(f"{why}: already settling this worker's trials (a few seconds)")
            return
        if self.why is not None:
            raise _Stop(why)  # asked twice: now
        self.why = why
        self.notify(f"{why}: settling this worker's trials (send it again to stop at once)")


class _TrialLost(Exception):
    """A trial this process holds was finished by another worker (its heartbeat sweep)."""


@dataclass
class _Candidate:
    trial: Any
    cfg: KernelConfig
    future: Future[Any]  # the compile, submitted when the trial is asked
    queued_at: float = field(default_factory=time.monotonic)


def _row(reply: dict[str, Any], gate: dict[str, Any] | None = None) -> dict[str, Any]:
    t = reply.get("timing") or {}
    g = gate if gate is not None else reply.get("gate")
    st = t.get("state_after") or {}
    return {
        "median_ms": float(t["median_ms"]), "min_ms": float(t.get("min_ms", t["median_ms"])),
        "max_ms": float(t.get("max_ms", t["median_ms"])), "tflops": float(t["tflops"]),
        "max_abs_err": (g or {}).get("max_abs_err"),
        **{k: v for k, v in accuracy_record(g).items() if k != "fa_rule_ok"},
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
    """nvcc missing, timed out or killed: not a property of the config, so never
    deduplicated (the trial is measured again)."""
    text = str(e)
    return "nvcc not found" in text or "timed out" in text or f"was {KILLED} " in text


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
