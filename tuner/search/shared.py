"""The study as several workers share it (a mixin of ``tuner.search.loop.Search``): resume and
recovery of this worker's and dead workers' trials, the sync with trials other workers measured
(dedupe across workers, the incumbent), the study attributes every worker must agree on, and
the GPU-model guard."""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta, timezone
from typing import Any

from tuner.errors import FaTuneError, SearchError
from tuner.kernel import toolchain
from tuner.kernel.config import KernelConfig
from tuner.search import rdb
from tuner.search.host import SearchHost
from tuner.search.session import (
    OWNERLESS_GRACE_S,
    _Candidate,
    _canonical,
    _is_verdict,
    _jsonable,
    _model_text,
    _pid_alive,
    _same_model,
    _same_space,
    _TrialLost,
    gpu_model,
)
from tuner.search.trials import best_confirmed, confirm_ratios, screen_ratios


class SharedStudy(SearchHost):
    """Methods of ``Search`` (tuner/search/loop.py); not used on its own."""

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
        if "shapes" in attrs and not self.study.get_trials(deepcopy=False):
            # Nothing was ever asked of it (a first run that stopped before its GPU worker
            # started, e.g. on a host without a driver): it takes these problems and space.
            attrs = {}
        shapes = [str(s) for s in self.shapes]
        space = self.space.to_dict()
        if "shapes" in attrs and _canonical(attrs["shapes"]) != shapes:
            # The first problem is the screen's: the order is part of the study.
            same = sorted(_canonical(attrs["shapes"])) == sorted(shapes)
            raise SearchError(
                f"study '{self.study_name}' searches shapes {', '.join(attrs['shapes'])}; give "
                + ("them in that order" if same else "the same --shape options")
                + " or a new --study name"
            )
        if "space" in attrs and not _same_space(attrs["space"], _jsonable(space)):
            was = attrs.get("space_source")
            raise SearchError(
                f"study '{self.study_name}' was created with another search space"
                + (f" ({was})" if was else "") + f", not {self.space.source}; give the "
                f"same --space or a new --study name"
            )
        if "shapes" not in attrs:  # a new study, or one never asked anything
            self.study.set_user_attr("shapes", shapes)
            self.study.set_user_attr("space", _jsonable(space))
            self.study.set_user_attr("space_source", self.space.source)

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
                    # Optuna stores datetime.now(): local time without a zone (astimezone
                    # reads a naive time as local).
                    start = start.astimezone(timezone.utc)
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

    def _load_known(self) -> None:
        trials = self.study.get_trials(deepcopy=False)
        for t in trials:
            cid = t.user_attrs.get("config_id")
            if cid and _is_verdict(t):
                self.known.setdefault(cid, t)
        self.incumbent = best_confirmed(trials)
        self._calibrate(trials)
        if self.incumbent is not None:
            self._show_best(self.incumbent)

    def _calibrate(self, trials: list[Any]) -> None:
        """The policy's calibrations from the study's trials on this worker's GPU model."""
        self.confirm_ratios = confirm_ratios(trials, self.progress.gpu_name)
        self.screen_ratios = screen_ratios(trials, self.progress.gpu_name)

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
        queued: set[str] = set()
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
            elif t.state == TrialState.WAITING:
                queued.add(cid)  # put back or precompiled: an ask pops it
            elif _is_verdict(t):
                self.known.setdefault(cid, t)
        self.foreign = foreign
        self.queued = queued
        if foreign:
            self._foreign_seen = now
        self._calibrate(trials)
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
                    self._nvcc = toolchain.nvcc_version()
                except FaTuneError:
                    self._nvcc = None
            nvcc = self._nvcc
        return {"name": g.get("name"), "sm_count": g.get("sm_count"),
                "driver_version": g.get("driver_version") or g.get("nvidia_driver_version"),
                "nvcc_version": nvcc, "host": socket.gethostname(),
                "device": self.worker.device_index}
