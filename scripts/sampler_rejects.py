"""How often does the search's sampler propose configs the static check refuses?

Sampler only (no compile, no GPU). Like the search, it first enqueues the seed points (told
the best values once through the pipeline below); then it asks the sampler (the search's
settings) until N valid configs have been proposed. Each valid one gets a synthetic outcome, a
stand-in objective and never a measurement: a hash of its config picks a value of 500-640
TFLOPS, below the seed points (as on the H200, where no sampled config beat them), and 70% of
them are told PRUNED after one intermediate value (the screen), as most candidates are.
Invalid ones are told
  fail:     FAIL (the search before 2026-11-30; TPE leaves them out of its model)
  pruned:   PRUNED with a violated constraint (2026-11-30; TPE puts them in its model)
  feasible: as pruned, behind tuner/search/sampler.py's FeasibleSampler (proposals are checked in
            Python before Optuna stores a trial; since 2026-11-30, session 2)
Like the search, valid trials stay open (RUNNING, which TPE's constant liar sees) while the
next ones are asked: the oldest is told only when --lag of them are open (the search keeps as
many in its compile queue while the asks of invalid ones return at once).
Prints asks per valid config, the invalid share, the longest run of invalid asks in a row (the
search stops after 300) and the time spent asking per valid config.

    python3 scripts/sampler_rejects.py --valid 150 --mode feasible --storage sqlite:///x.db
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

from tuner.kernel.config import ConfigError, validate  # noqa: E402
from tuner.search import space as spaces  # noqa: E402
from tuner.search.loop import seed_params  # noqa: E402
from tuner.search.sampler import make_sampler, suggest_config, valid_config  # noqa: E402
from tuner.search.study import open_storage  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["fail", "pruned", "feasible"], required=True)
    ap.add_argument("--valid", type=int, default=150)
    ap.add_argument("--space", default="default")
    ap.add_argument("--sampler", default="tpe")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lag", type=int, default=16, help="valid trials open at once (the "
                    "search's compile queue: --jobs)")
    ap.add_argument("--storage", help="an Optuna RDB URL (default: in memory); the search uses "
                    "SQLite, whose transactions are part of each ask's cost")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = spaces.load_space(args.space)
    seen: set[str] = set()

    def accept(params: dict[str, Any]) -> bool:
        cfg = valid_config(params, space)
        return cfg is not None and cfg.config_id() not in seen

    sampler = make_sampler(args.sampler, args.seed, space,
                           accept=accept if args.mode == "feasible" else None)
    storage = open_storage(args.storage) if args.storage else None
    study = optuna.create_study(direction="maximize", sampler=sampler, storage=storage)
    for _, params in seed_params(space):
        if params is not None:
            study.enqueue_trial(params)
    n_seeds = len(study.get_trials(states=(TrialState.WAITING,)))
    invalid: list[bool] = []
    valid = run = longest = 0
    t0 = time.time()
    pipeline: list[tuple[Any, Any]] = []  # valid trials asked, not yet told (compiling)

    def outcome(trial: Any, cfg: Any) -> None:
        if trial.number < n_seeds:
            study.tell(trial, 650.0 + 10 * trial.number)
            return
        h = int(hashlib.sha256(cfg.canonical_json().encode()).hexdigest()[:8], 16)
        value = 500.0 + h % 140
        if h % 10 < 7:
            trial.report(value * 0.9, 0)
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, value)

    while valid < args.valid:
        trial = study.ask()
        try:
            cfg = validate(suggest_config(trial, space))
            if cfg.config_id() in seen:
                raise ConfigError("duplicate")
        except ConfigError:
            invalid.append(True)
            run += 1
            longest = max(longest, run)
            if run >= 300:
                study.tell(trial, state=TrialState.FAIL)
                print("300 invalid asks in a row: the search would stop here")
                break
            if args.mode == "fail":
                study.tell(trial, state=TrialState.FAIL)
            else:
                trial.set_constraint("static_check", 1.0)
                study.tell(trial, state=TrialState.PRUNED)
            continue
        run = 0
        seen.add(cfg.config_id())
        pipeline.append((trial, cfg))
        if trial.number >= n_seeds:
            invalid.append(False)
            valid += 1
        if len(pipeline) >= args.lag:
            outcome(*pipeline.pop(0))
    n = len(invalid)
    half = invalid[n // 2:]
    dt = time.time() - t0
    extra = ""
    if hasattr(sampler, "model_proposals"):
        extra = (f"; model proposals {sampler.model_proposals} (accepted "
                 f"{sampler.model_accepted}), random draws {sampler.random_draws}")
    per_valid = 1000 * dt / max(1, valid)
    print(f"{args.sampler}/{args.mode}: {n} asks for {valid} valid configs, invalid "
          f"{sum(invalid) / n:.0%} (second half {sum(half) / max(1, len(half)):.0%}), longest "
          f"invalid run {longest}, {dt:.1f} s = {per_valid:.0f} ms of asking per valid "
          f"config{extra}")

if __name__ == "__main__":
    main()
