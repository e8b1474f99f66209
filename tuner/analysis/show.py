"""``fa-tune show``: read a study back: best configs, all trials, knob importances, plots.

"Best" ranks trials by their ``confirmed`` number (the full protocol, tuner/search/policy.py's noise
guard); trials without one are listed after, marked unconfirmed, by their search value.
WAITING trials (enqueued, or asked by a search that stopped before measuring them) are
counted as waiting, never as failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner import _paths
from tuner.errors import SearchError
from tuner.search.trials import (
    complete_trials,
    confirmed_value,
    is_gate_refused,
    is_spilled,
    trial_accuracy,
    why_not_complete,
)

MIN_TRIALS_FOR_IMPORTANCE = 4


STATE_LABELS = {"COMPLETE": "complete", "PRUNED": "pruned", "SPILLED": "spilled",
                "FAIL": "failed", "WAITING": "waiting", "RUNNING": "running"}


def state_counts(trials: list[Any]) -> dict[str, int]:
    """Trials per state in this order: complete, pruned, spilled, failed, waiting, running
    (zeros left out). Failed: FAIL, and a config the gate refused (told PRUNED so TPE learns
    from it); a trial asked but never measured is WAITING, one whose kernel has local memory
    is spilled (told PRUNED)."""
    out: dict[str, int] = {}
    for state, label in STATE_LABELS.items():
        n = sum(1 for t in trials if _state(t) == state)
        if n:
            out[label] = n
    return out


def _state(t: Any) -> str:
    if is_gate_refused(t):  # told PRUNED so TPE learns from it; to the user a failure
        return "FAIL"
    return "SPILLED" if is_spilled(t) else t.state.name


def not_run_reason(t: Any) -> str | None:
    """Why a WAITING trial waits: asked by a search that stopped before measuring it (the next
    search measures it first), or enqueued (a seed point); None for other states."""
    from optuna.trial import TrialState

    if t.state != TrialState.WAITING:
        return None
    why = t.user_attrs.get("not_run")
    if why:
        return f"not run yet (search stopped: {why}); the next search measures it first"
    source = t.user_attrs.get("source")
    return f"enqueued ({source})" if source else "enqueued"


def trial_rows(trials: list[Any]) -> list[dict[str, Any]]:
    out = []
    for t in trials:
        a = t.user_attrs
        why = not_run_reason(t) or why_not_complete(t)
        if "duplicate_of" in a:
            why = f"duplicate of {a['duplicate_of']}" + (f"; {why}" if why else "")
        out.append({
            "trial": t.number, "state": _state(t), "value": t.value,
            "confirmed": confirmed_value(t), "config_id": a.get("config_id", ""),
            "params": dict(t.params), "reason": why, **trial_accuracy(t),
        })
    return out


def importances(study: Any, trials: list[Any]) -> tuple[dict[str, float] | None, str]:
    """fANOVA importances of the knobs, or (None, why not)."""
    import optuna

    done = complete_trials(trials)
    varied = {k for t in done for k in t.params}
    if len(done) < MIN_TRIALS_FOR_IMPORTANCE:
        return None, (f"knob importances need at least {MIN_TRIALS_FOR_IMPORTANCE} completed "
                      f"trials (this study has {len(done)})")
    if len({t.value for t in done}) < 2 or not varied:
        return None, "knob importances need completed trials with different values and knobs"
    try:
        imp = optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0)
        )
    except ImportError:
        return None, ("knob importances (fANOVA) need scikit-learn: "
                      "`pip install 'fa-tune[plots]'` or `pip install scikit-learn`")
    except (RuntimeError, ValueError) as e:
        return None, f"knob importances unavailable: {' '.join(str(e).split())[:200]}"
    return dict(imp), ""


def plots_dir(study: str) -> Path:
    return _paths.studies_root() / "plots" / study


def write_plots(study: str, trials: list[Any], out: Path | None = None) -> list[Path]:
    """best-so-far.png and tflops_by_<knob>.png (one per varied knob) under studies/plots/."""
    try:
        import matplotlib
    except ImportError:
        raise SearchError("plots need matplotlib: `pip install matplotlib`") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = out or plots_dir(study)
    out.mkdir(parents=True, exist_ok=True)
    done = complete_trials(trials)
    paths: list[Path] = []
    if not done:
        return paths
    xs, best, cur = [], [], None
    cx, cy = [], []
    for t in sorted(done, key=lambda t: t.number):
        cur = t.value if cur is None else max(cur, t.value)
        xs.append(t.number)
        best.append(cur)
        if conf := confirmed_value(t):
            cx.append(t.number)
            cy.append(conf)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.scatter([t.number for t in done], [t.value for t in done], s=10, alpha=0.5,
               label="trial (search protocol)")
    ax.step(xs, best, where="post", label="best so far")
    if cx:
        ax.scatter(cx, cy, marker="*", s=80, label="confirmed (full protocol)")
    ax.set_xlabel("trial")
    ax.set_ylabel("geometric-mean TFLOPS")
    ax.set_title(f"study {study}")
    ax.legend()
    fig.tight_layout()
    p = out / "best_so_far.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    knobs = sorted({k for t in done for k in t.params})
    for k in knobs:
        vals = sorted({repr(t.params[k]) for t in done if k in t.params})
        if len(vals) < 2:
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        pos = {v: i for i, v in enumerate(vals)}
        ax.scatter([pos[repr(t.params[k])] for t in done if k in t.params],
                   [t.value for t in done if k in t.params], s=12, alpha=0.6)
        ax.set_xticks(range(len(vals)), vals, rotation=45 if len(vals) > 6 else 0)
        ax.set_xlabel(k)
        ax.set_ylabel("geometric-mean TFLOPS")
        ax.set_title(f"TFLOPS by {k}")
        fig.tight_layout()
        p = out / f"tflops_by_{k}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def profile_lines(trials: list[Any]) -> list[str]:
    """One line per headline ``fa-tune profile`` stored with a trial (its user attr ``profile``:
    {problem: record}), in trial order; malformed records are skipped."""
    from tuner.analysis.profile import PROFILE_ATTR, record_line

    out = []
    for t in sorted(trials, key=lambda t: t.number):
        recs = t.user_attrs.get(PROFILE_ATTR)
        if not isinstance(recs, dict):
            continue
        for problem, rec in recs.items():
            if not isinstance(rec, dict):
                continue
            line = (f"trial {t.number} on {problem} ({rec.get('date', '?')}, ncu "
                    f"{rec.get('ncu_version', '?')}): {record_line(rec) or 'no metrics'}")
            vs = rec.get("vs")
            if isinstance(vs, dict):
                line += f"; beside {vs.get('label', '?')}: " + (
                    record_line(vs, ("duration_ms", "sm_clock_ghz", "tensor_pipe_pct")) or "-")
            out.append(f"{line}; report {rec.get('report', '?')}")
    return out
