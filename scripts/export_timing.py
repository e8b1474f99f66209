"""Does the exported kernel run as fast as the one the tuner timed? (issue 5, benchmark 3)

    python3 scripts/export_timing.py --study NAME [--storage URL] --export DIR [--shape BxHxS]...

Loads two shared libraries into one process: the trial's cached artifact (what the search
timed) and DIR/build/libfa_tune_fwd.so (built from scratch by the export's build.sh). Both are
gated on the seed inputs first (the product oracle), then timed alternately in A B B A order
with the seeds' protocol per round, so drift hits both alike; --settle-s seconds of launches
come first at each shape (the power ramp). Prints a table last: median ms of
each, and the ratio export / tuner (goal: within 3%).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner import export
from tuner.compare import settle  # noqa: E402
from tuner.config import KernelConfig, Shape  # noqa: E402
from tuner.errors import FaTuneError  # noqa: E402
from tuner.measure import oracle, timing  # noqa: E402
from tuner.runtime import AttnBuffers, Device, KernelModule  # noqa: E402
from tuner.show import pick_trial  # noqa: E402

SEED_SHAPES = ["4x32x4096", "4x32x8192", "4x32x16384"]


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
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--pairs", type=int, default=4, help="A/B pairs per shape (even: ABBA)")
    ap.add_argument("--settle-s", type=float, default=2.0,
                    help="seconds of launches before a shape's first pair (0: none)")
    ap.add_argument("--json", type=Path, help="write every sample here")
    a = ap.parse_args()

    _, trial = pick_trial(a.study, a.storage, None)  # the best, as `fa-tune export` picks it
    cfg = KernelConfig.from_dict(trial.user_attrs["config"])
    tuner_so = Path(export.artifact_for(trial, cfg).so_path)
    export_so = a.export / "build" / "libfa_tune_fwd.so"
    if not export_so.is_file():
        print(f"export_timing: {export_so} is missing; run {a.export / 'build.sh'} first")
        return 2

    dev = Device.open(0)
    kernels = {"tuner": KernelModule(tuner_so), "export": KernelModule(export_so)}
    proto = timing.Protocol(warmup=50, repeat=200, rounds=1)
    rows, dump = [], {"trial": trial.number, "tuner_so": str(tuner_so),
                      "export_so": str(export_so), "shapes": {}}
    for text in a.shape or SEED_SHAPES:
        shape = Shape.parse(text)
        per: dict[str, list[float]] = {k: [] for k in kernels}
        with AttnBuffers(dev, shape) as bufs:
            for name, kern in kernels.items():
                verdict = oracle.gate(dev, kern, shape, bufs)  # leaves the seed inputs in bufs
                if not verdict.passed:
                    print(f"export_timing: {name} kernel failed the gate at {text}: "
                          f"{verdict.summary()}")
                    return 1
            # Reach the power-capped steady state first: at 4096 the first pair otherwise runs
            # during the board's ~1 s ramp to 700 W (docs/PERF.md, step 18).
            st = dev.stream()
            try:
                settle(lambda st=st: kernels["tuner"].forward(bufs, st), a.settle_s,
                       st.synchronize)
            finally:
                st.destroy()
            names = list(kernels)
            for i in range(a.pairs):
                # A B, then B A: neither library always runs on the hotter GPU.
                for name in names if i % 2 == 0 else names[::-1]:
                    r = timing.time_kernel(dev, kernels[name], shape, bufs, proto)
                    per[name].append(r.median_ms)
        med = {k: statistics.median(v) for k, v in per.items()}
        rows.append((text, med["tuner"], med["export"], med["export"] / med["tuner"],
                     min(per["export"]) / min(per["tuner"])))
        dump["shapes"][text] = per
    if a.json:
        a.json.write_text(json.dumps(dump, indent=1))
    print(f"trial {trial.number}, config {cfg.config_id()}; seeds' protocol 50/200 per round, "
          f"{a.pairs} A/B pairs per shape")
    print(f"{'shape':12s} {'tuner ms':>10s} {'export ms':>10s} {'ratio':>7s} {'ratio(min)':>10s}")
    for s, t, e, r, rm in rows:
        print(f"{s:12s} {t:10.4f} {e:10.4f} {r:7.3f} {rm:10.3f}")
    return 0 if all(abs(r - 1) <= 0.03 for *_, r, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
