#!/usr/bin/env python3
"""Time to a tie: how soon a search had a config as fast as its final pick, judged as the
search's final judges (interleaved turns in one process, the noise band), not by one
confirmation against the best of many (which is the top of a noisy plateau: docs/PERF.md step
60). Issue 38's bar: a config within 1 % of the 8-minute best by 3 minutes.

    python3 scripts/time_to_tie.py --study S [--storage URL] [--within 0.03] [--max 6] [--list]

The candidates are the study's confirmed trials completed before the pick, within --within of
its confirmed number, earliest first (at most --max, one per config). Each is gated and played
against the pick alone (tuner.search.final's play and decide: A B, B A, ...). Prints a line per
candidate (seconds after the study's first trial started, TFLOPS against the pick, tie or not)
and the answer last: the first candidate that ties the pick or beats it, else the pick itself.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.errors import FaTuneError  # noqa: E402
from tuner.search import final  # noqa: E402
from tuner.search.trials import confirmed_value  # noqa: E402


def seconds_after(t: Any, start: Any) -> float:
    return (t.datetime_complete - start).total_seconds()


def candidates(trials: Sequence[Any], pick: Any, within: float, most: int) -> list[Any]:
    """Confirmed trials completed before the pick, within ``within`` of its confirmed number,
    earliest first, one per config, at most ``most``."""
    best = confirmed_value(pick) or 0.0
    near = sorted((t for t in trials
                   if t.datetime_complete is not None
                   and t.datetime_complete < pick.datetime_complete
                   and (confirmed_value(t) or 0.0) >= best * (1.0 - within)),
                  key=lambda t: t.datetime_complete)
    return final.one_per_config(near, most, skip=[pick.user_attrs.get("config_id", "")])


WAIT_TOTAL_S = 120.0


class Judge:
    """The trials' configs (``trials``: any key -> trial) built for the problems' class, gated
    on every problem, and timed as the search's final times (``measure(so_path, problem)`` ->
    TFLOPS); ``so_paths`` by the same keys. A context manager that releases the problems'
    buffers and the bench."""

    def __init__(self, trials: dict[int, Any], problems: Sequence[Any],
                 protocol: Any = final.PROTOCOL) -> None:
        from tuner.kernel import build
        from tuner.kernel.config import KernelConfig
        from tuner.measure.bench import Bench
        from tuner.measure.launch import KernelLaunch
        from tuner.problem import class_of

        pclass = class_of(problems)
        built = {n: build.build_config(KernelConfig.from_dict(t.user_attrs["config"]),
                                       pclass=pclass) for n, t in trials.items()}
        for r in built.values():
            r.require_timeable()
        self.problems = list(problems)
        self.protocol = protocol
        self.so_paths = {n: r.so_path for n, r in built.items()}
        # The whole play's temperature waits are capped (a card that idles hot would wait up
        # to the protocol's bound before every measurement), as compare caps its suite's.
        self.bench = Bench(0, temp_wait_total_s=WAIT_TOTAL_S)
        self._launch = {r.so_path: KernelLaunch(r.so_path) for r in built.values()}
        for n, so in self.so_paths.items():
            for p in problems:
                g = self.bench.gate(self._launch[so], p)
                if not g.passed:
                    self.close()
                    raise FaTuneError(f"trial {n} fails the gate on {p}: {g.summary()}")

    def measure(self, so: str, p: Any) -> float:
        return float(p.tflops(self.bench.time(self._launch[so], p, self.protocol).median_ms))

    def close(self) -> None:
        for p in self.problems:
            self.bench.release(p)
        self.bench.close()

    def __enter__(self) -> Judge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", required=True)
    ap.add_argument("--storage")
    ap.add_argument("--within", type=float, default=0.03,
                    help="candidates: confirmed within this fraction of the pick's (0.03)")
    ap.add_argument("--max", type=int, default=6, help="candidates at most (6)")
    ap.add_argument("--turns", type=int, default=final.TURNS)
    ap.add_argument("--list", action="store_true", help="print the candidates and stop (no GPU)")
    a = ap.parse_args(argv)
    bad = ("--within must be between 0 and 1" if not 0 < a.within < 1 else
           "--max must be at least 1" if a.max < 1 else
           "--turns must be at least 2 (the noise band needs two)" if a.turns < 2 else None)
    if bad:
        print(f"time_to_tie: {bad} (got --within {a.within}, --max {a.max}, --turns {a.turns})",
              file=sys.stderr)
        return 2
    try:
        return run(a)
    except FaTuneError as e:
        print(f"time_to_tie: {e}", file=sys.stderr)
        return 2


def run(a: argparse.Namespace) -> int:
    from tuner.search.trials import pick_trial, study_trials, trial_problems

    _, trials = study_trials(a.study, a.storage)
    _, pick = pick_trial(a.study, a.storage, None)
    start = min(t.datetime_start for t in trials if t.datetime_start is not None)
    problems = trial_problems(pick)
    cands = candidates(trials, pick, a.within, a.max)
    if not cands:
        print(f"no confirmed trial before the pick within {100 * a.within:.0f} % of it: the "
              f"first tie is the pick, trial {pick.number}, {seconds_after(pick, start):.0f} s "
              "after the start")
        return 0
    if a.list:
        for t in cands:
            print(f"trial {t.number:4d} at {seconds_after(t, start):5.0f} s: confirmed "
                  f"{confirmed_value(t):.1f} TFLOPS (the pick, trial {pick.number}: "
                  f"{confirmed_value(pick):.1f})")
        return 0
    with Judge({t.number: t for t in [pick, *cands]}, problems) as judge:
        answer = None
        print(f"pick: trial {pick.number} ({seconds_after(pick, start):.0f} s, confirmed "
              f"{confirmed_value(pick):.1f} TFLOPS); {', '.join(map(str, problems))}")
        for t in cands:
            pair = {n: judge.so_paths[n] for n in (pick.number, t.number)}
            turns = final.play(judge.measure, pair, problems, a.turns)
            v = final.decide(turns, {}, {})
            ratio = v.tflops[t.number] / v.tflops[pick.number]
            ties = v.winner in (None, t.number)
            print(f"trial {t.number:4d} at {seconds_after(t, start):5.0f} s: {ratio:.3f}x the "
                  f"pick (band {100 * v.band:.1f} %): {'ties or beats it' if ties else 'slower'}",
                  flush=True)
            if ties and answer is None:
                answer = t
        if answer is None:
            print(f"none of {len(cands)} earlier candidates ties it: the first tie is the pick, "
                  f"{seconds_after(pick, start):.0f} s after the start")
        else:
            print(f"first tie with the pick: trial {answer.number}, "
                  f"{seconds_after(answer, start):.0f} s after the start")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
