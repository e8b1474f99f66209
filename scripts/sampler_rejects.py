"""How often does the search's sampler propose configs the static check refuses?

Sampler only (no compile, no GPU): asks TPE (the search's settings) over a space until N
configs pass `tuner.config.validate`, telling each valid one a synthetic value (a hash of its
config, 500-650: a stand-in objective, never a measurement) and each invalid one either as
FAIL (the search before 2026-11-30) or as PRUNED with a violated constraint (after). Prints
the share of asks that were invalid, overall and over the second half.

    python3 scripts/sampler_rejects.py --valid 150 --mode pruned
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna  # noqa: E402
from optuna.trial import TrialState  # noqa: E402

from tuner import space as spaces  # noqa: E402
from tuner.config import ConfigError, validate  # noqa: E402
from tuner.search import suggest_config  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["fail", "pruned"], required=True)
    ap.add_argument("--valid", type=int, default=150)
    ap.add_argument("--space", default="default")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--storage", help="an Optuna RDB URL (default: in memory); the search uses "
                    "SQLite, whose transactions are part of each ask's cost")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = spaces.load_space(args.space)
    sampler = optuna.samplers.TPESampler(seed=args.seed, multivariate=True, constant_liar=True,
                                         n_startup_trials=10)
    if args.storage:
        from tuner.search import open_storage

        storage = open_storage(args.storage)
    else:
        storage = None
    study = optuna.create_study(direction="maximize", sampler=sampler, storage=storage)
    invalid: list[bool] = []
    valid = 0
    t0 = time.time()
    while valid < args.valid:
        trial = study.ask()
        try:
            cfg = suggest_config(trial, space)
            validate(cfg)
        except ConfigError:
            invalid.append(True)
            if args.mode == "pruned":
                trial.set_constraint("static_check", 1.0)
                study.tell(trial, state=TrialState.PRUNED)
            else:
                study.tell(trial, state=TrialState.FAIL)
            continue
        invalid.append(False)
        valid += 1
        h = int(hashlib.sha256(cfg.canonical_json().encode()).hexdigest()[:8], 16)
        study.tell(trial, 500.0 + h % 150)
    n = len(invalid)
    half = invalid[n // 2:]
    dt = time.time() - t0
    print(f"mode {args.mode}: {n} asks for {valid} valid configs, invalid {sum(invalid) / n:.0%} "
          f"(second half {sum(half) / len(half):.0%}), {dt:.1f} s = {1000 * dt / valid:.0f} ms "
          "of asking per valid config")


if __name__ == "__main__":
    main()
