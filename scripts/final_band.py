#!/usr/bin/env python3
"""How the search's final decides with more turns: the finalists of one or more studies' finals
(one trial per config), built, gated and played against each other in one process as the final
plays them (tuner.search.final), for --turns turns. Prints, for the first 4, 8, ... turns, each
config's median TFLOPS and spread (the relative range of its turns), the final's verdict, and
the fastest one's lead over each other config with the pair's noise band (final.paired).
Issue 38: are two searches' picks within 1 % in one process, and how many turns does a final
need to tell 1 % apart?

    python3 scripts/final_band.py --study twin1 --study twin2 [--turns 16] [--json F]
        [--repeat N] [--settle-s S]   (the final's protocol by default)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # time_to_tie, also when imported

from time_to_tie import Judge  # noqa: E402

from tuner.errors import FaTuneError  # noqa: E402
from tuner.search import final  # noqa: E402


def report(turns: dict[int, list[float]], labels: dict[int, str], steps: Sequence[int]
           ) -> list[dict[str, Any]]:
    rows = []
    for k in steps:
        head = {n: v[:k] for n, v in turns.items()}
        v = final.decide(head, {}, {})
        ref = v.ranked[0]
        pair = {n: final.paired(head[ref], head[n]) for n in v.ranked[1:]}
        spread = {n: (max(x) - min(x)) / v.tflops[n] for n, x in head.items()}
        rows.append({"turns": k, "verdict": v.text(), "band": v.band,
                     "median": {labels[n]: v.tflops[n] for n in v.ranked},
                     "spread": {labels[n]: spread[n] for n in v.ranked},
                     "lead_band": {labels[n]: pair[n] for n in v.ranked[1:]}})
        print(f"-- first {k} turns: {v.text()}")
        for n in v.ranked:
            pb = "" if n == ref else (f", the fastest leads by {100 * pair[n][0]:.1f} % "
                                      f"(band {100 * pair[n][1]:.1f} %)")
            print(f"   {labels[n]:28s} {v.tflops[n]:7.1f} TFLOPS "
                  f"({v.tflops[n] / v.tflops[ref]:.3f}x, spread {100 * spread[n]:.1f} %){pb}")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", action="append", required=True)
    ap.add_argument("--storage")
    ap.add_argument("--turns", type=int, default=16)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--repeat", type=int, default=final.PROTOCOL.repeat,
                    help=f"timed launches per measurement ({final.PROTOCOL.repeat})")
    ap.add_argument("--settle-s", type=float, default=final.PROTOCOL.settle_s,
                    help=f"settle before each measurement ({final.PROTOCOL.settle_s:g} s)")
    a = ap.parse_args(argv)
    if a.json and not a.json.parent.is_dir():
        print(f"final_band: --json {a.json}: no folder {a.json.parent}; give a path in an "
              "existing folder", file=sys.stderr)
        return 2
    if a.turns < 2 or a.repeat < 1 or a.settle_s < 0:
        print(f"final_band: --turns must be at least 2, --repeat at least 1 and --settle-s at "
              f"least 0 (got {a.turns}, {a.repeat}, {a.settle_s})", file=sys.stderr)
        return 2
    from tuner.search.trials import study_trials, trial_problems

    try:
        chosen: dict[str, Any] = {}      # config_id -> trial
        labels: dict[str, str] = {}
        for s in a.study:
            st, trials = study_trials(s, a.storage)
            v = final.Verdict.from_dict(st.user_attrs.get(final.ATTR))
            if v is None:
                raise FaTuneError(f"study '{s}' has no final")
            by_number = {t.number: t for t in trials}
            for n in v.turns:
                cid = by_number[n].user_attrs["config_id"]
                tag = f"{s}:{n}" + (" (pick)" if n == v.pick else "")
                labels[cid] = f"{labels[cid]} = {tag}" if cid in labels else f"{cid[:6]} {tag}"
                chosen.setdefault(cid, by_number[n])
        picked = list(chosen.values())
        problems = trial_problems(picked[0])
        # Trial numbers repeat across studies: the play is keyed by position.
        proto = dataclasses.replace(final.PROTOCOL, repeat=a.repeat, settle_s=a.settle_s)
        print(f"protocol: {proto}; {a.turns} turns")
        with Judge(dict(enumerate(picked)), problems, proto) as judge:
            turns = final.play(judge.measure, judge.so_paths, problems, a.turns)
    except FaTuneError as e:
        print(f"final_band: {e}", file=sys.stderr)
        return 2
    names = {i: labels[t.user_attrs["config_id"]] for i, t in enumerate(picked)}
    steps = sorted({k for k in (4, 8, 12, 16, a.turns) if 2 <= k <= a.turns})
    rows = report(turns, names, steps)
    if a.json:
        try:
            a.json.write_text(json.dumps({"turns": {names[i]: v for i, v in turns.items()},
                                          "by_turns": rows}, indent=1))
        except OSError as e:  # the table above is printed: only the file is lost
            print(f"final_band: could not write {a.json}: {e.strerror or e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
