"""What the mixins of ``tuner.search.loop.Search`` (shared.py, outcomes.py, compile_only.py)
read of the class they are mixed into: its state, as ``Search.__init__`` sets it, and the
methods one of them calls of ``Search`` or of another mixin.

Declarations for the type checker only: ``SearchHost`` has no attributes and no methods at run
time (its annotations hold no values; the method stubs are under TYPE_CHECKING)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections import deque
    from collections.abc import Callable
    from concurrent.futures import ThreadPoolExecutor
    from datetime import datetime
    from pathlib import Path

    import optuna

    from tuner.kernel.config import KernelConfig
    from tuner.problem import Problem
    from tuner.search.artifacts import StudyArtifacts
    from tuner.search.policy import SearchPolicy
    from tuner.search.rdb import ResilientRDBStorage, TrialHeartbeat
    from tuner.search.session import Progress, SearchSummary, StopSignals, _Candidate
    from tuner.search.space import SearchSpace
    from tuner.search.worker_client import GpuWorker


class SearchHost:
    """The base of Search's mixins: what they use of ``Search`` (tuner/search/loop.py)."""

    # -- the search's settings
    study_name: str
    space: SearchSpace
    shapes: list[Problem]
    screen_shape: Problem
    url: str
    n_trials: int | None
    jobs: int
    lookahead: int
    builder: Callable[[KernelConfig], Any]  # -> an object with so_path, local_memory, ...
    max_error_ratio: float | None
    default_cfg: KernelConfig
    policy: SearchPolicy
    gate_seed: int
    results_root: Path | None
    owner: str
    t_start: float
    started_utc: datetime
    allow_mixed_gpus: bool
    grace_s: int
    # -- what it works with
    storage: ResilientRDBStorage
    study: optuna.Study
    artifacts: StudyArtifacts | None
    worker: GpuWorker
    stops: StopSignals
    progress: Progress
    heartbeat: TrialHeartbeat | None
    # -- its state
    open: dict[int, Any]
    known: dict[str, Any]
    pending: dict[str, int]
    dups: dict[int, list[Any]]
    foreign: set[str]
    queued: set[str]
    waiting: dict[int, tuple[Any, KernelConfig, int]]
    incumbent: Any | None
    confirm_ratios: list[float]
    screen_ratios: list[float]
    queue: deque[_Candidate]
    pool: ThreadPoolExecutor | None
    temp_wait_s: float
    _default_so: str | None | bool  # False: not built yet
    _nvcc: str | None | bool  # False: not looked up yet
    _last_sync: float
    _study_waiting: bool
    _foreign_seen: float
    _avg_compile_s: float
    _in_flight: int | None
    _asked: int
    _exhausted: str | None  # why no ask can find a new config (the stop's reason)
    _final_text: str | None

    if TYPE_CHECKING:
        # Search's own (loop.py)
        def _emit(self, text: str | None = None) -> None: ...
        def _show_best(self, t: Any) -> None: ...
        def _sync_queue(self) -> None: ...
        def _should_stop(self) -> str | None: ...
        def _may_ask(self, asked: int, fresh: bool = False) -> bool: ...
        def _ask(self, pool: ThreadPoolExecutor, fresh: bool = False) -> _Candidate | None: ...
        def _starved_text(self) -> str: ...

        # TrialOutcomes' (outcomes.py)
        def _tell_duplicate(self, trial: Any, prev: Any) -> None: ...
        def _spilled(self, trial: Any, why: str) -> None: ...
        def _fail(self, trial: Any, reason: str, *, counted: bool = True,
                  transient: bool = False) -> None: ...
        def _settle_open(self, stopped_by: str) -> int: ...
        def _put_back(self, trial_id: int, params: dict[str, Any], why: str) -> None: ...
        def _summary(self, stopped_by: str, not_run: int = 0) -> SearchSummary: ...
        def _record_session(self, s: SearchSummary) -> None: ...

        # SharedStudy's (shared.py)
        def _gpu_record(self, built: Any) -> dict[str, Any]: ...
        def _sync(self, min_age_s: float = 0.0) -> None: ...
