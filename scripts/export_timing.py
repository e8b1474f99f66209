"""Does the exported kernel run as fast as the one the tuner timed? (issue 5, benchmark 3)

    python3 scripts/export_timing.py --study NAME [--storage URL] --export DIR \\
        [--shape BxHq[/Hkv]xS[:dD][:full]]...

Loads two shared libraries into one process: the trial's cached artifact (what the search
timed) and DIR/build/libfa_tune_fwd.so (built from scratch by the export's build.sh). Both go
through the one measurement path (tuner.measure.bench): gated first, then timed alternately in
A B B A order, one round of the FULL protocol each (settle, 50 warm-up, 200 timed), so drift
hits both alike. Prints a table last: median ms of each, and the ratio export / tuner (goal:
within 3%).
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
from tuner.kernel.config import KernelConfig  # noqa: E402
from tuner.kernel.support import check_problems  # noqa: E402
from tuner.measure import ab  # noqa: E402
from tuner.measure.bench import Bench  # noqa: E402
from tuner.measure.launch import KernelLaunch  # noqa: E402
from tuner.measure.timing import FULL  # noqa: E402
from tuner.problem import parse_problems  # noqa: E402
from tuner.search.study import trial_problems  # noqa: E402
from tuner.search.trials import pick_trial  # noqa: E402
from tuner.ship import export  # noqa: E402


def main() -> int:
    try:
        return _main()
    except FaTuneError as e:  # unknown study, bad shape, no GPU, ...: one line, exit 2
        print(f"export_timing: {e}", file=sys.stderr)
        return 2


def _main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", required=True)
    ap.add_argument("--storage")
    ap.add_argument("--export", required=True, type=Path, help="folder written by fa-tune export")
    ap.add_argument("--shape", action="append", default=[],
                    help="problem BxHq[/Hkv]xS[:dD][:full] (default: the trial's own problems)")
    ap.add_argument("--pairs", type=int, default=4, help="A/B pairs per shape (even: ABBA)")
    ap.add_argument("--settle-s", type=float, default=FULL.settle_s,
                    help="seconds of launches before each timed round (0: none)")
    ap.add_argument("--json", type=Path, help="write every sample here")
    a = ap.parse_args()

    _, trial = pick_trial(a.study, a.storage, None)  # the best, as `fa-tune export` picks it
    cfg = KernelConfig.from_dict(trial.user_attrs["config"])
    # The trial's own problems by default: the seed shapes would refuse a GQA-only config.
    problems = parse_problems(a.shape) if a.shape else trial_problems(trial)
    problems = problems or parse_problems(None)
    check_problems(cfg, problems)
    export_so = a.export / "build" / "libfa_tune_fwd.so"
    if not export_so.is_file():  # before artifact_for, which may compile the trial's kernel
        print(f"export_timing: {export_so} is missing; run {a.export / 'build.sh'} first")
        return 2
    tuner_so = Path(export.artifact_for(trial, cfg).so_path)

    bench = Bench(0)
    kernels = {"tuner": KernelLaunch(tuner_so, "tuner"),
               "export": KernelLaunch(export_so, "export")}
    proto = dataclasses.replace(FULL, rounds=1, settle_s=a.settle_s)
    rows, dump = [], {"trial": trial.number, "tuner_so": str(tuner_so),
                      "export_so": str(export_so), "shapes": {}}
    for shape in problems:
        text = str(shape)
        failed = ab.gate_all(bench, kernels, shape)
        for name, why in failed.items():
            print(f"export_timing: {name} kernel failed the gate at {text}: {why}")
        if failed:
            return 1
        # A B, then B A: neither library always runs on the hotter GPU.
        per = ab.interleaved(bench, kernels, shape, proto, a.pairs)
        bench.release(shape)
        med = {k: statistics.median(v) for k, v in per.items()}
        rows.append((text, med["tuner"], med["export"], med["export"] / med["tuner"],
                     min(per["export"]) / min(per["tuner"])))
        dump["shapes"][text] = per
    if a.json:
        a.json.write_text(json.dumps(dump, indent=1))
    print(f"trial {trial.number}, config {cfg.config_id()}; one FULL round (settle "
          f"{a.settle_s} s, 50 + 200) per kernel per pair, "
          f"{a.pairs} A/B pairs per shape")
    print(f"{'shape':12s} {'tuner ms':>10s} {'export ms':>10s} {'ratio':>7s} {'ratio(min)':>10s}")
    for s, t, e, r, rm in rows:
        print(f"{s:12s} {t:10.4f} {e:10.4f} {r:7.3f} {rm:10.3f}")
    return 0 if all(abs(r - 1) <= 0.03 for *_, r, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
