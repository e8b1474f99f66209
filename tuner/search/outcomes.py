"""What happens to a trial once its kernel is built (the ``Search`` loop's second half):
measure it on the GPU worker, tell Optuna the verdict (complete, pruned, failed, duplicate),
confirm a possible best with the full protocol and write its results folder, and summarise
the session. A mixin of ``tuner.search.loop.Search``: every method reads the search's state."""

from __future__ import annotations

import time
from concurrent.futures import wait as wait_futures
from pathlib import Path
from typing import Any

from tuner import _paths
from tuner.errors import FaTuneError, SearchError
from tuner.kernel.config import KernelConfig
from tuner.measure import accuracy
from tuner.measure.timing import Protocol
from tuner.problem import Problem
from tuner.search import final
from tuner.search.host import SearchHost
from tuner.search.session import (
    REQUEUE_REASONS,
    SearchSummary,
    _Candidate,
    _is_transient_build,
    _is_verdict,
    _row,
    _temp_wait_s,
    _TrialLost,
    geomean,
)
from tuner.search.study import redact
from tuner.search.trials import (
    GATE_CONSTRAINT,
    SPILL_CONSTRAINT,
    confirmed_value,
    first_near_best,
    is_gate_refused,
    is_spilled,
    screen_ratio,
    trial_accuracy,
)
from tuner.search.worker_client import WorkerFailure


class TrialOutcomes(SearchHost):
    """Methods of ``Search`` (tuner/search/loop.py); not used on its own."""

    def _tell_duplicate(self, trial: Any, prev: Any) -> None:
        from optuna.trial import TrialState

        self.progress.duplicates += 1
        trial.set_user_attr("duplicate_of", prev.number)
        for k in ("build", "screen", "shapes", "accuracy", "prune_reason", "fail_reason", "gpu"):
            if k in prev.user_attrs:
                trial.set_user_attr(k, prev.user_attrs[k])
        if prev.state == TrialState.COMPLETE:
            self._tell(trial, TrialState.COMPLETE, prev.value)
            self.progress.complete += 1
        elif prev.state == TrialState.PRUNED:
            for key, value in prev.constraints.items():  # a spill stays infeasible for TPE
                trial.set_constraint(key, value)
            self._tell(trial, TrialState.PRUNED)
            if is_spilled(prev):
                self.progress.spilled += 1
            elif is_gate_refused(prev):
                self.progress.failed += 1
            else:
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

    def _spilled(self, trial: Any, why: str) -> None:
        """A kernel that compiles to local memory (or serialized wgmma) is never timed. Told
        PRUNED with a violated constraint, as a static reject: TPE's model never sees a FAIL
        trial, so told FAIL (as before) it went on proposing the same spilling region (39 of
        137 trials of a D 256 softcap search, docs/PERF.md step 62)."""
        trial.set_user_attr("prune_reason", f"artifact unfit to time: {why}"[:2000])
        self._tell_infeasible(trial, SPILL_CONSTRAINT)
        self.progress.spilled += 1
        self.progress.event(f"trial {trial.number} not timed: {why}"[:160])

    def _tell_infeasible(self, trial: Any, constraint: str) -> None:
        """Told PRUNED with ``constraint`` violated: TPE models PRUNED trials, not FAIL ones,
        and ranks an infeasible one with the worst (a spill, a gate refusal)."""
        from optuna.trial import TrialState

        trial.set_constraint(constraint, 1.0)
        self._tell(trial, TrialState.PRUNED)
        self.progress.done += 1

    def _gate_refused(self, trial: Any, reason: str) -> None:
        """A config the gate (or --max-error-ratio) refused on this study's problems: a failure
        to the user (fail_reason, counted as failed), but told PRUNED with a violated
        constraint so TPE learns the region, as it does from spills; told FAIL it went on
        proposing the same refused knobs (6 and 10 of 61 and 82 trials of gpt-oss-20b's window
        buckets were sum_in_pv configs the gate refused, docs/PERF.md step 78)."""
        trial.set_user_attr("fail_reason", " ".join(str(reason).split())[:2000])
        self._tell_infeasible(trial, GATE_CONSTRAINT)
        self.progress.failed += 1
        self.progress.event(f"trial {trial.number} failed: {reason}"[:160])

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

    def _refused_or_failed(self, trial: Any, reply: dict[str, Any]) -> None:
        """A measurement that did not come back ok: the gate's refusal, or a failure."""
        if reply.get("status") == "gate_failed":
            self._gate_refused(trial, str(reply.get("reason")))
        else:
            self._fail(trial, str(reply.get("reason")))

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
        default_so = self._default_library() if gate else None
        reply = self.worker.measure(so, shape, protocol, gate=gate, seed=self.gate_seed,
                                    default_so=default_so)
        self.temp_wait_s += _temp_wait_s(reply)
        return reply

    def _default_library(self) -> str | None:
        """The default config's library (what err_vs_default compares with), built once: a
        candidate of the same config in the pipeline is waited for (no second compile), else
        the builder builds it here. None when it cannot be built (no error ratio then)."""
        if self._default_so is False:
            cid = self.default_cfg.config_id()
            fut = next((c.future for c in self.queue if c.cfg.config_id() == cid), None)
            if fut is None and self.pool is not None:
                fut = self.pool.submit(self.builder, self.default_cfg)
            while fut is not None and not fut.done():
                self.stops.check()  # a stop asked for meanwhile lands here, not after a compile
                wait_futures([fut], timeout=0.25)
            try:
                built = fut.result() if fut is not None else self.builder(self.default_cfg)
                self._default_so = None if built.unfit else str(built.so_path)
            except Exception as e:  # noqa: BLE001 - no ratio, the search goes on
                self._default_so = None
                self.progress.event(f"the default config could not be built ({e}); no "
                                    "err_vs_default"[:160])
        return self._default_so if isinstance(self._default_so, str) else None

    def _accuracy_reason(self, trial: Any, shape: Problem, gate: Any) -> str | None:
        """Store a gate's error ratios with the trial (user attr ``accuracy``); why it fails
        --max-error-ratio, or None."""
        rec = accuracy.accuracy_record(gate)
        acc = dict(trial.user_attrs.get("accuracy") or {})
        acc[str(shape)] = rec
        trial.set_user_attr("accuracy", acc)
        if self.max_error_ratio is None:
            return None
        return accuracy.max_error_ratio_reason(rec["err_vs_default"], self.max_error_ratio,
                                               str(shape))

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
            self._spilled(trial, why)
            return
        so = str(built.so_path)
        if self._default_so is False and cfg.config_id() == self.default_cfg.config_id():
            self._default_so = so  # the default config is this candidate
        self.progress.current = f"trial {trial.number}: gate + screen on {self.screen_shape}"
        self._emit()
        rows: dict[str, dict[str, Any]] = {}
        gates: dict[str, Any] = {}
        pol = self.policy
        try:
            r = self._measure(so, self.screen_shape, pol.screen, True)
            if r.get("status") != "ok":
                self._refused_or_failed(trial, r)
                return
            gates[str(self.screen_shape)] = r.get("gate")
            why = self._accuracy_reason(trial, self.screen_shape, r.get("gate"))
            if why:
                self._gate_refused(trial, why)
                return
            scr = {"shape": str(self.screen_shape), **_row(r)}
            trial.set_user_attr("screen", scr)
            trial.report(scr["tflops"], 0)
            why = pol.prune_reason(scr, self.incumbent, self.screen_ratios)
            if why:
                trial.set_user_attr("prune_reason", why)
                self._tell(trial, TrialState.PRUNED)
                self.progress.pruned += 1
                self.progress.done += 1
                assert self.incumbent is not None  # a prune reason needs one (prune_reason)
                self.progress.event(f"trial {trial.number} pruned (screen slower than trial "
                                    f"{self.incumbent.number})")
                return
            for shape in self.shapes:
                self.progress.current = f"trial {trial.number}: timing {shape}"
                self._emit()
                gate = shape != self.screen_shape
                r = self._measure(so, shape, pol.survey, gate)
                if r.get("status") != "ok":
                    self._refused_or_failed(trial, r)
                    return
                if gate:
                    gates[str(shape)] = r.get("gate")
                    why = self._accuracy_reason(trial, shape, r.get("gate"))
                    if why:
                        self._gate_refused(trial, why)
                        return
                rows[str(shape)] = _row(r, gates.get(str(shape)))
            trial.set_user_attr("shapes", rows)
            value = geomean([rows[str(s)]["tflops"] for s in self.shapes])
            if pol.needs_confirming(value, self.incumbent, self.confirm_ratios):
                confirmed = self._confirm(trial, cfg, built, so, gates)
                if value > 0:  # calibrates the next decisions before _sync re-reads the study
                    self.confirm_ratios.append(confirmed / value)
                ratio = screen_ratio(trial.user_attrs)
                if ratio is not None:
                    self.screen_ratios.append(ratio)
        except WorkerFailure as e:
            self._fail(trial, e.reason)
            return
        ft = self._tell(trial, TrialState.COMPLETE, value)
        self.progress.complete += 1
        self.progress.done += 1
        # The survey's number (no settle: it reads high on a cool card), named as such so it
        # is not taken for the confirmed best's.
        self.progress.event(f"trial {trial.number}: {value:.1f} TFLOPS (survey, geomean)")
        if pol.is_new_best(ft, self.incumbent):
            self.incumbent = ft
            self._show_best(ft)
            self.progress.event(f"new best: trial {ft.number}, "
                                f"{confirmed_value(ft):.1f} TFLOPS confirmed")

    def _confirm(self, trial: Any, cfg: KernelConfig, built: Any, so: str,
                 gates: dict[str, Any]) -> float:
        """Noise guard: the policy's confirm protocol (CONFIRM: FULL, as `fa-tune run` and
        `compare` time, with long kernels' rounds capped) on every shape; stored as
        ``confirmed``. Returns its geometric-mean TFLOPS."""
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
            conf["results_error"] = str(e)  # the number is stored with the trial all the same
            self.progress.event(f"trial {trial.number}: results folder not written ({e}); its "
                                "confirmed number is in the study"[:160])
        trial.set_user_attr("confirmed", conf)
        return float(conf["geomean_tflops"])

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
    def _final(self) -> str | None:
        """The search's last step (tuner.search.final): its top configs timed against each
        other, the verdict stored as the study's ``final``; its line, or why none was played.
        A failure here costs the verdict only, never a trial."""
        if self.policy.final_top < 2:
            return None
        if self._foreign_seen:  # each worker would play its own on its own GPU
            return ("not played: other workers searched this study at the same time (their "
                    "finalists run on other GPUs); `fa-tune show best` ranks by the confirmed "
                    "numbers")
        top = final.finalists(self.study.get_trials(deepcopy=False), confirmed_value,
                              self.policy.final_top)
        if len(top) < 2:
            return None
        nums = ", ".join(str(t.number) for t in top)
        self.progress.current = f"final: trials {nums} timed against each other"
        self._emit()
        try:
            so = {t.number: self.builder(KernelConfig.from_dict(t.user_attrs["config"])).so_path
                  for t in top}

            def measure(path: str, p: Problem) -> float:
                reply = self.worker.measure(path, p, self.policy.final_protocol, gate=False,
                                            seed=self.gate_seed)
                if reply.get("status") != "ok":
                    raise SearchError(str(reply.get("reason") or reply.get("status")))
                return float(reply["timing"]["tflops"])

            n_turns = self.policy.final_turns or final.turns_for(len(self.shapes))
            turns = final.play(measure, so, self.shapes, n_turns)
            verdict = final.decide(
                turns, {t.number: final.knobs_changed(t.user_attrs["config"], self.default_cfg)
                        for t in top},
                {t.number: trial_accuracy(t)["err_vs_default"] for t in top})
            self.study.set_user_attr(final.ATTR, verdict.to_dict())
        except (FaTuneError, WorkerFailure, OSError) as e:
            text = f"final not played: {str(e)[:200]}"
            self.progress.event(text)
            return text
        self.progress.event(verdict.text())
        return verdict.text()

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
            spilled=p.spilled,
            duplicates=p.duplicates, best=best, wall_s=time.monotonic() - self.t_start,
            gpu_busy_s=self.worker.busy_s, stopped_by=stopped_by, temp_wait_s=self.temp_wait_s,
            not_run=not_run, device=self.worker.device_index, gpu_name=p.gpu_name,
            owner=self.owner, final=self._final_text, near_best=self._near_best(),
        )

    def _near_best(self) -> tuple[int, float] | None:
        best = confirmed_value(self.incumbent) if self.incumbent is not None else None
        if best is None:
            return None
        try:
            return first_near_best(self.study.get_trials(deepcopy=False), self.started_utc, best)
        except Exception:  # noqa: BLE001 - a summary figure must not mask the search's outcome
            return None

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
                "rejected": s.rejected, "spilled": s.spilled, "not_run": s.not_run,
                "stopped_by": s.stopped_by,
                "device": s.device, "gpu": s.gpu_name,
            }
            self.study.set_user_attr(f"session {started} {self.owner}", rec)
            sessions = list(self.study.user_attrs.get("sessions", []))
            sessions.append(rec)
            self.study.set_user_attr("sessions", sessions[-200:])
        except Exception:  # noqa: BLE001 - bookkeeping must not mask the search's outcome
            pass
