"""Picking a study's trials: the one family every reader of a study uses.

"Best" means the highest ``confirmed`` number (the full protocol, tuner/search/policy.py's noise
guard) over COMPLETE trials; a trial without one counts by its search value, after every
confirmed one. Who uses what:

* ``confirmed_value``, ``best_confirmed``: the search's incumbent (policy), fleet's summary;
  ``confirm_ratios``: the policy's calibration of survey values against confirmed ones;
  ``screen_ratios``: its calibration of screens against confirmed times;
* ``study_trials``, ``complete_trials``, ``best_rows``: ``show best`` (ranked, deduplicated by
  config, optionally by one problem);
* ``pick_trial``: export, profile, dispatch (``study:`` buckets), scripts/export_timing.py: the
  trial ``--trial N`` names, else the first of ``best_rows``; ``study_best`` (``compare
  --study``) reads the same trial, so compare times what export ships;
* ``best_summary``: the line a ``--gpus`` search ends with;
* ``final_verdict``: the search's final (tuner.search.final), while it still speaks for the
  study's best: ``show best`` and ``pick_trial`` then put its pick first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tuner.errors import ConfigError, FaTuneError, SearchError, ShapeError
from tuner.kernel.config import KernelConfig
from tuner.measure.accuracy import all_known, worst
from tuner.problem import Problem
from tuner.search.final import ATTR as FINAL_ATTR
from tuner.search.final import Verdict
from tuner.search.study import load_existing_study, trial_problems


def confirmed_value(t: Any) -> float | None:
    """The trial's confirmed geometric-mean TFLOPS (full protocol), or None."""
    c = t.user_attrs.get("confirmed")
    if isinstance(c, dict) and isinstance(c.get("geomean_tflops"), (int, float)):
        return float(c["geomean_tflops"])
    return None


def confirm_ratios(trials: Sequence[Any], gpu: str = "") -> list[float]:
    """Confirmed over survey value of each COMPLETE trial that has both: how the survey (a
    cooler card, no settle) reads against the full protocol on this study's problems; with
    ``gpu``, only trials measured on that GPU model (a study may mix models when allowed)."""
    from optuna.trial import TrialState

    out = []
    for t in _on_gpu(trials, gpu):
        c = confirmed_value(t)
        v = t.value if t.state == TrialState.COMPLETE else None
        if c and isinstance(v, (int, float)) and v > 0:
            out.append(c / float(v))
    return out


def screen_ratios(trials: Sequence[Any], gpu: str = "") -> list[float]:
    """Screen over confirmed median time on the screen's shape, of each trial that has both:
    how the screen (a short protocol, often on a cooler card) reads against the full protocol;
    with ``gpu``, only trials measured on that GPU model."""
    ratios = (screen_ratio(t.user_attrs) for t in _on_gpu(trials, gpu))
    return [r for r in ratios if r is not None]


def _on_gpu(trials: Sequence[Any], gpu: str) -> list[Any]:
    """The trials measured on GPU model ``gpu`` (all with ""; a trial that names none counts)."""
    return [t for t in trials
            if not gpu or (t.user_attrs.get("gpu") or {}).get("name") in (None, gpu)]


def confirmed_ms(attrs: dict[str, Any], shape: Any) -> float | None:
    """A trial's confirmed median time on one shape (its text), None when not confirmed there."""
    row = ((attrs.get("confirmed") or {}).get("shapes") or {}).get(shape) or {}
    return row.get("median_ms") or None


def screen_ratio(attrs: dict[str, Any]) -> float | None:
    """One trial's screen / confirmed median time on the screen's shape (None without both)."""
    scr = attrs.get("screen") or {}
    conf = confirmed_ms(attrs, scr.get("shape"))
    if not scr.get("median_ms") or not conf:
        return None
    return float(scr["median_ms"]) / float(conf)


def first_near_best(trials: Sequence[Any], since: Any, best: float, within: float = 0.01
                    ) -> tuple[int, float] | None:
    """How soon a search had its answer: of the trials completed after ``since`` (an aware
    datetime), the first confirmed within ``within`` of ``best``, as (trial number, seconds
    after ``since``); None when there is none."""
    near = [(_aware(t.datetime_complete), t) for t in trials
            if (confirmed_value(t) or 0.0) >= best * (1.0 - within)
            and t.datetime_complete is not None and _aware(t.datetime_complete) >= since]
    if not near:
        return None
    at, t = min(near, key=lambda x: x[0])
    return t.number, (at - since).total_seconds()


def _aware(dt: Any) -> Any:
    """Optuna stores naive local datetimes: as aware ones, to compare with the search's start."""
    return dt.astimezone() if dt.tzinfo is None else dt


def best_confirmed(trials: Sequence[Any]) -> Any | None:
    from optuna.trial import TrialState

    cands = [t for t in trials if t.state == TrialState.COMPLETE and confirmed_value(t)]
    return max(cands, key=lambda t: confirmed_value(t) or 0.0, default=None)


def study_trials(study: str, storage: str | None) -> tuple[Any, list[Any]]:
    st = load_existing_study(study, storage)
    trials = st.get_trials(deepcopy=False)
    if not trials:
        raise SearchError(
            f"study '{study}' has no trials yet; run `fa-tune search --study {study}`"
        )
    return st, trials


def complete_trials(trials: list[Any]) -> list[Any]:
    from optuna.trial import TrialState

    return [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]


def best_rows(trials: list[Any], shape: str | None, top: int) -> list[dict[str, Any]]:
    """Rows {trial, config_id, confirmed, value, tflops per shape, diff} best first; ``shape``
    (a problem's canonical text, str(Problem)) ranks by that problem alone."""
    done = complete_trials(trials)
    seen: set[str] = set()
    rows: list[dict[str, Any]] = []
    for t in done:
        if "duplicate_of" in t.user_attrs:
            continue
        conf = t.user_attrs.get("confirmed") or {}
        per = conf.get("shapes") or t.user_attrs.get("shapes") or {}
        if shape is not None:
            name = _stored_name(per, shape)
            if name is None:
                continue
            key = float(per[name]["tflops"])
        else:
            key = confirmed_value(t) or float(t.value)
        cid = t.user_attrs.get("config_id", "")
        if cid in seen:
            continue
        seen.add(cid)
        rows.append({
            "trial": t.number, "config_id": cid, "confirmed": bool(conf),
            "value": confirmed_value(t) or float(t.value), "key": key,
            "shapes": {s: float(v["tflops"]) for s, v in per.items()},
            "config": t.user_attrs.get("config") or {},
            **trial_accuracy(t),
        })
    rows.sort(key=lambda r: (not r["confirmed"], -r["key"]))
    return rows[:top]


def trial_accuracy(t: Any) -> dict[str, Any]:
    """A trial's error ratios, worst over its gated problems (its user attr ``accuracy``, else
    the ratios in its per-problem rows): {fa_ratio, fa_rule_ok, err_vs_default,
    rms_vs_default, lse_ratio}, None where not recorded (older searches)."""
    recs = list((t.user_attrs.get("accuracy") or {}).values())
    if not recs:
        conf = t.user_attrs.get("confirmed") or {}
        recs = list((conf.get("shapes") or t.user_attrs.get("shapes") or {}).values())
    recs = [r for r in recs if isinstance(r, dict)]
    return {"fa_ratio": worst(r.get("fa_ratio") for r in recs),
            "fa_rule_ok": all_known(r.get("fa_rule_ok") for r in recs),
            "err_vs_default": worst(r.get("err_vs_default") for r in recs),
            "rms_vs_default": worst(r.get("rms_vs_default") for r in recs),
            "lse_ratio": worst(r.get("lse_ratio") for r in recs)}


def _stored_name(per: dict[str, Any], problem: str) -> str | None:
    """The key of ``per`` (a trial's {problem text: row}) naming the same problem, or None."""
    if problem in per:
        return problem
    for k in per:
        try:
            if str(Problem.parse(k)) == problem:
                return k
        except ShapeError:
            continue
    return None


# The constraint a trial whose kernel compiled to local memory carries (violated: 1.0), so
# TPE ranks it infeasible (static rejects carry "static_check"); such a trial is "spilled".
SPILL_CONSTRAINT = "local_memory"


def _pruned_with(t: Any, constraint: str) -> bool:
    """Told PRUNED with ``constraint`` violated (``_tell_infeasible``)."""
    return t.state.name == "PRUNED" and constraint in (t.constraints or {})


def is_spilled(t: Any) -> bool:
    """A trial never timed because its kernel has local memory (told PRUNED, infeasible)."""
    return _pruned_with(t, SPILL_CONSTRAINT)


# The constraint of a trial the gate refused on the study's problems (or --max-error-ratio did):
# the config's own numerics, so as infeasible for TPE as a spill. Such a trial is told PRUNED
# with it (TPE reads no FAIL trial) and is shown and counted as failed, with its fail_reason.
GATE_CONSTRAINT = "gate"


def is_gate_refused(t: Any) -> bool:
    """A trial whose config failed the gate (told PRUNED with GATE_CONSTRAINT; a failure)."""
    return _pruned_with(t, GATE_CONSTRAINT)


def why_not_complete(t: Any) -> str:
    """Why a trial did not complete, in a few words ("" when it says nothing)."""
    from tuner.search.rdb import stale_failed  # lazy: rdb imports optuna (slow) at the top

    a = t.user_attrs
    if stale_failed(t):  # failed by Optuna's heartbeat: no worker told it anything
        return "its worker stopped (no heartbeat); the config is measured again as a retry"
    return a.get("fail_reason") or a.get("prune_reason") or ""


def final_verdict(st: Any, rows: list[dict[str, Any]]) -> Verdict | None:
    """The study's final, when it still speaks for the best rows (``best_rows``, all problems):
    the best confirmed trial was one of its finalists, whether the final found it the winner,
    tied or slower (the case the final exists for: its number was confirmed minutes apart from
    the others'). A later search that confirmed a faster config leaves it stale (None)."""
    v = Verdict.from_dict(st.user_attrs.get(FINAL_ATTR))
    if v is None or not rows or not rows[0]["confirmed"]:
        return None
    if rows[0]["trial"] not in v.turns:
        return None
    return v if any(r["trial"] == v.pick for r in rows) else None


def with_final(st: Any, trials: list[Any], rows: list[dict[str, Any]]
               ) -> tuple[list[dict[str, Any]], Verdict | None]:
    """``rows`` with the final's pick first (where it still speaks for them), and the verdict."""
    v = final_verdict(st, rows)
    if v is None:
        return rows, None
    pick = next(r for r in rows if r["trial"] == v.pick)
    return [pick, *(r for r in rows if r is not pick)], v


def pick_trial(study: str, storage: str | None, trial: int | None) -> tuple[Any, Any]:
    """The trial to export/profile: --trial N, else the final's pick (tuner.search.final),
    else the best confirmed (else best complete)."""
    st, trials = study_trials(study, storage)
    if trial is not None:
        match = [t for t in trials if t.number == trial]
        if not match:
            raise SearchError(f"study '{study}' has no trial {trial} (trials 0..{len(trials) - 1})")
        t = match[0]
        if not complete_trials([t]):
            why = why_not_complete(t)
            raise SearchError(f"trial {trial} of study '{study}' is {t.state.name}"
                              + (f" ({why[:150]})" if why else "") + "; pick a COMPLETE trial")
        return st, t
    rows, _ = with_final(st, trials, best_rows(trials, None, len(trials)))
    if not rows:
        raise SearchError(f"study '{study}' has no completed trial yet; `fa-tune show trials "
                          f"--study {study}` says why its trials did not complete, `fa-tune "
                          f"search --study {study}` measures more")
    return st, next(t for t in trials if t.number == rows[0]["trial"])


def study_best(study: str, storage: str | None, trial: int | None = None
               ) -> tuple[KernelConfig, dict[str, Any] | None, list[Problem]]:
    """The config ``pick_trial`` picks (``--trial N``, else the final's pick, else the best
    confirmed), what the search confirmed for it (None if unconfirmed) and the problems it was
    measured on."""
    _, t = pick_trial(study, storage, trial)
    if not isinstance(t.user_attrs.get("config"), dict):
        raise ConfigError(f"study '{study}' has no best config (no trial passed its gate yet)")
    cfg = KernelConfig.from_dict(t.user_attrs["config"], source=f"study '{study}'")
    conf = t.user_attrs.get("confirmed")
    return cfg, conf if isinstance(conf, dict) else None, trial_problems(t)


def best_summary(study: str, storage: str | None) -> dict[str, Any] | None:
    """The study's best confirmed trial (whichever worker found it), as a search's summary
    names it; None when there is none or the study cannot be read."""
    from optuna.trial import TrialState

    try:
        st = load_existing_study(study, storage)
        best = best_confirmed(st.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    except FaTuneError:
        return None
    if best is None:
        return None
    return {"trial": best.number, "config_id": best.user_attrs.get("config_id"),
            "confirmed": best.user_attrs.get("confirmed"), "gpu": best.user_attrs.get("gpu")}
