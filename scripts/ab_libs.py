#!/usr/bin/env python3
"""Each preset's kernel before and after a change, timed against each other in one process.

    python scripts/ab_libs.py BEFORE_DIR AFTER_DIR [PRESET...] [--pairs N] [--settle-s S]

BEFORE_DIR and AFTER_DIR are scripts/sass_snapshot.py folders (each preset's library built
from one source tree, and a problem of its class). Per preset: both libraries are gated by the
one oracle, then timed in turn, A B then B A (tuner.measure.ab), each turn one FULL-protocol
round (settle, 50 warm-up, 200 timed launches). Prints per preset the median ms of each, the
ratio after / before, and whether the SASS is the same; a table last. Exit 1 when a gate fails,
2 for a usage error (one line).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.errors import FaTuneError  # noqa: E402
from tuner.measure import ab  # noqa: E402
from tuner.measure.bench import Bench  # noqa: E402
from tuner.measure.launch import KernelLaunch  # noqa: E402
from tuner.measure.timing import FULL  # noqa: E402
from tuner.problem import Problem  # noqa: E402


def fail(msg: str) -> None:
    sys.stderr.write(f"ab_libs: error: {msg}\n")
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("presets", nargs="*")
    ap.add_argument("--pairs", type=int, default=4, help="A/B turns per library (default 4)")
    ap.add_argument("--settle-s", type=float, default=1.0, help="settle before each turn")
    ap.add_argument("--json", type=Path, help="write every sample here")
    a = ap.parse_args(argv)
    try:
        idx = {k: json.loads((d / "index.json").read_text()) for k, d in
               (("before", a.before), ("after", a.after))}
    except (OSError, ValueError) as e:
        fail(f"cannot read a snapshot's index.json: {e}")
    names = a.presets or sorted(set(idx["before"]) & set(idx["after"]))
    missing = [n for n in names if n not in idx["before"] or n not in idx["after"]]
    if missing:
        fail(f"not in both snapshots: {', '.join(missing)}")
    proto = dataclasses.replace(FULL, rounds=1, settle_s=a.settle_s)
    try:
        bench = Bench(0)
    except FaTuneError as e:
        fail(str(e))
    rows, dump, bad = [], {}, 0
    for name in names:
        b, f = idx["before"][name], idx["after"][name]
        shape = Problem.parse(b["shape"])
        libs = {"before": KernelLaunch(b["so_path"], "before"),
                "after": KernelLaunch(f["so_path"], "after")}
        failed = ab.gate_all(bench, libs, shape)
        if failed:
            bad += 1
            print(f"{name}: gate failed: {failed}", flush=True)
            continue
        per = ab.interleaved(bench, libs, shape, proto, a.pairs)
        bench.release(shape)
        med = {k: statistics.median(v) for k, v in per.items()}
        same = b["functions"] == f["functions"]
        rows.append((name, str(shape), med["before"], med["after"], med["after"] / med["before"],
                     min(per["after"]) / min(per["before"]), same))
        dump[name] = per
        print(f"{name}: {per}", flush=True)
    if a.json:
        a.json.write_text(json.dumps(dump, indent=1))
    print(f"one FULL round (settle {a.settle_s} s, 50 + 200) per library per turn, {a.pairs} "
          "turns each, alternated")
    print(f"{'preset':16s} {'shape':22s} {'before ms':>10s} {'after ms':>10s} {'ratio':>7s} "
          f"{'ratio(min)':>10s}  SASS")
    for n, s, t0, t1, r, rm, same in rows:
        print(f"{n:16s} {s:22s} {t0:10.4f} {t1:10.4f} {r:7.3f} {rm:10.3f}  "
              f"{'same' if same else 'differs'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
