"""Compile-only workers (issue 38): ``fa-tune worker --compile-only --artifacts URL`` on a host
without a GPU.

Such a worker joins a study like any other and asks its sampler for candidates, as the GPU
workers do, but never asks for a WAITING trial (those are the GPU workers' next ones, possibly
its own): each trial it asks is a new one. It compiles it, publishes the kernel through the
study's artifact store (tuner.search.artifacts; the build does it) and puts the trial back to
WAITING with its params fixed and the user attribute ``not_run: precompiled``. The GPU workers'
``study.ask()`` pops WAITING trials first, and their build of it is a fetch from the store, not
a compile. A config that fails to build, or whose kernel has local memory, fails its trial here,
as it would on a GPU host. The worker stays at most ``backlog`` handed-over trials ahead of the
GPU workers (WAITING precompiled trials in the study), so its lookahead follows the sampler's
latest knowledge.
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures

from tuner import child_process
from tuner.errors import FaTuneError
from tuner.kernel import shared_cache
from tuner.search.host import SearchHost
from tuner.search.session import SearchSummary, _Candidate, _is_transient_build, _Stop

PRECOMPILED = "precompiled"


class CompileOnly(SearchHost):
    """Methods of ``Search`` (tuner/search/loop.py) for a compile-only worker."""

    def _backlog(self) -> int:
        """Trials this study's compile-only workers handed over that no GPU worker took yet."""
        from optuna.trial import TrialState

        return sum(1 for t in self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
                   if t.user_attrs.get("not_run") == PRECOMPILED)

    def _hand_over(self, cand: _Candidate) -> bool:
        """A finished compile: back to WAITING for a GPU worker (True), or its trial failed."""
        trial = cand.trial
        try:
            built = cand.future.result()
        except FaTuneError as e:
            self._fail(trial, f"build: {e}", transient=_is_transient_build(e))
            return False
        except Exception as e:  # noqa: BLE001 - a builder bug fails one trial, not all
            self._fail(trial, f"build: {type(e).__name__}: {e}", transient=True)
            return False
        if built.unfit:
            self._spilled(trial, built.unfit)
            return False
        trial.set_user_attr("precompiled_by", self.owner)
        self._put_back(trial._trial_id, trial.params, PRECOMPILED)
        self.open.pop(trial.number, None)
        self.progress.done += 1
        self.progress.event(f"trial {trial.number} compiled, handed to the GPU workers")
        return True

    def run_compile_only(self, backlog: int | None = None) -> SearchSummary:
        """Compile what the sampler asks for, hand it over, until --trials or --timeout."""
        limit = backlog if backlog is not None else 2 * self.lookahead
        stopped_by = "finished"
        handed = 0
        pool = ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="fa-tune-nvcc")
        self.pool = pool
        self.progress.current = "compile-only: asking the sampler"
        self._emit()
        shared_cache.set_share(self.artifacts)  # every compile is published for the GPU hosts
        self._sync()  # the study's verdicts, so an exhausted space shows before the first ask
        self.stops.install()
        if self.heartbeat is not None:
            self.heartbeat.start()
        try:
            while True:
                why = self._should_stop()
                if why or (self.n_trials is not None and self._asked >= self.n_trials
                           and not self.queue):
                    stopped_by = why or stopped_by
                    break
                if self._exhausted and not self.queue:
                    stopped_by = self._exhausted
                    break
                if (len(self.queue) < self.jobs and self._backlog() + len(self.queue) < limit
                        and self._may_ask(self._asked, fresh=True)):
                    cand = self._ask(pool, fresh=True)
                    self._asked += 1
                    if cand is not None:
                        self.queue.append(cand)
                    elif getattr(self.study.sampler, "starved", False):  # a FeasibleSampler
                        self._exhausted = self._starved_text()
                    continue
                done = [c for c in self.queue if c.future.done()]
                if not done and self.queue:
                    wait_futures([c.future for c in self.queue], timeout=1.0,
                                 return_when=FIRST_COMPLETED)
                elif not done:
                    time.sleep(1.0)  # the GPU workers have enough: wait for them to take some
                for c in done:
                    self.queue.remove(c)
                    handed += self._hand_over(c)
                self._sync_queue()
                self._emit()
        except KeyboardInterrupt:
            stopped_by = "interrupted (Ctrl-C)"
        except _Stop as e:
            stopped_by = e.why
        finally:
            self.stops.settling = True
            pool.shutdown(wait=False, cancel_futures=True)
            child_process.kill_running()  # as Search.run: no compile holds the exit
            shared_cache.set_share(None)
            if self.heartbeat is not None:
                self.heartbeat.stop()
            not_run = self._settle_open(stopped_by)
            self.stops.restore()
            summary = self._summary(stopped_by, not_run)
            self._record_session(summary)
        self.progress.event(f"compile-only: {handed} trials compiled and handed over")
        return summary
