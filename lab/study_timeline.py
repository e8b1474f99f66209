"""A search's pipeline over time, read from its study alone (docs/PERF.md step 73).

Each measured trial records when it was asked (Optuna's start time), how long its compile took
(``build.compile_seconds``) and when its verdict came (Optuna's end time). A trial's compile
starts at its ask (the search keeps at most ``--jobs`` trials open, one compile slot each), so
at any moment the open trials split into compiling and compiled-but-waiting-for-the-GPU.
Mostly compiling means the compiles bound the search; mostly waiting means the GPU does.

    python3 lab/study_timeline.py STUDY.db [--step 10] [--phases 0,60,220]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sqlite3
import statistics
from dataclasses import dataclass


@dataclass
class Trial:
    number: int
    state: str
    asked: float
    compiled: float
    done: float | None


def load(path: str) -> list[Trial]:
    """The study's compiled trials; SystemExit with one line where the file is not a study."""
    try:  # read-only: a wrong path is an error, not a new empty file
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        rows = con.execute(
            "select t.number, t.state, t.datetime_start, t.datetime_complete, a.value_json "
            "from trials t join trial_user_attributes a on a.trial_id = t.trial_id "
            "and a.key = 'build' where t.datetime_start is not null order by t.number").fetchall()
        con.close()
    except sqlite3.Error as e:
        raise SystemExit(f"study_timeline: {path} is not a readable study file ({e})") from None
    if not rows:
        raise SystemExit(f"study_timeline: {path} has no compiled trial to place on a timeline")

    def ts(s: str) -> float:
        return dt.datetime.fromisoformat(s).timestamp()

    t0 = min(ts(r[2]) for r in rows)
    return [Trial(number, state, ts(start) - t0,
                  ts(start) - t0 + json.loads(build)["compile_seconds"],
                  None if end is None else ts(end) - t0)
            for number, state, start, end, build in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db")
    ap.add_argument("--step", type=float, default=10.0)
    ap.add_argument("--phases", default="0,60,220", help="phase bounds in seconds")
    a = ap.parse_args()
    if a.step <= 0:
        ap.error("--step must be a positive number of seconds")
    try:
        bounds = [float(b) for b in a.phases.split(",")]
    except ValueError:
        ap.error(f"--phases takes seconds separated by commas, e.g. 0,60,220; not {a.phases!r}")
    trials = load(a.db)
    end = max(t.done or t.compiled for t in trials)
    print("t (s)  open  compiling  compiled, waiting for the GPU")
    t = 0.0
    while t <= end:
        open_ = [x for x in trials if x.asked <= t and (x.done is None or x.done > t)]
        compiling = sum(1 for x in open_ if x.compiled > t)
        print(f"{t:5.0f}  {len(open_):4d}  {compiling:9d}  {len(open_) - compiling:8d}")
        t += a.step
    bounds.append(end + 1)
    print("phase        trials done  a second  complete  compile median (s)")
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        done = [x for x in trials if x.done is not None and lo <= x.done < hi]
        asked = [x.compiled - x.asked for x in trials if lo <= x.asked < hi]
        med = f"{statistics.median(asked):.1f}" if asked else "-"
        print(f"{lo:4.0f}-{hi:4.0f} s  {len(done):11d}  {len(done) / (hi - lo):8.2f}  "
              f"{sum(1 for x in done if x.state == 'COMPLETE'):8d}  {med}")


if __name__ == "__main__":
    main()
