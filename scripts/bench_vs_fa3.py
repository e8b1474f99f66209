#!/usr/bin/env python3
"""Time built fa-tune kernels side by side with FlashAttention-3, in one process.

For the lead's H200 runs: every kernel .so and FA3 get the same torch inputs (seed 42, Q/K
uniform [-2, 2], V uniform [-1, 1]), the same gate (|err| <= 0.05 + 0.1|ref| against an FP32
reference on sampled full heads, no NaN) and the same protocol (warm-up / timed launches /
rounds, CUDA events, median of round medians); FA3 runs first and last on each shape (drift).
The short table comes last; with $OUT set the full payload (every sample) goes to
$OUT/bench_vs_fa3.json.

    PYTHONPATH=/root/fa3site:/root/fa3site/nvidia_cutlass_dsl/dsl_packages:. \\
        python3 scripts/bench_vs_fa3.py --so build/a.so:default --so build/b.so:tuned \\
        --shape 4x32x8192 [--shape ...] [--peers fa3,cudnn] [--warmup 50 --repeat 200 --rounds 3]

Without flash_attn installed it still times the kernels (FA3 is reported as skipped, with why).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere

from tuner.compare import (  # noqa: E402  (after the sys.path fix above)
    Protocol,
    format_table,
    make_backends,
    parse_backends,
    run_suite,
    write_outputs,
)
from tuner.config import SEED_SHAPES, Shape  # noqa: E402
from tuner.errors import FaTuneError  # noqa: E402


def parse_so(spec: str) -> tuple[Path, str]:
    """'path/to/k.so:label' -> (path, label); without ':label' the file stem is the label."""
    path, sep, label = spec.rpartition(":")
    if not sep or not path or "/" in label:
        return Path(spec), Path(spec).stem
    return Path(path), label


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument(
        "--so",
        action="append",
        default=[],
        metavar="PATH[:LABEL]",
        help="a built kernel .so (repeatable)",
    )
    ap.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="BxHxS",
        help="problem shape (repeatable; default: the three seed shapes)",
    )
    ap.add_argument(
        "--peers",
        default="fa3",
        help="comma-separated peers to time beside the kernels (default: fa3; "
        "also cudnn, fa2, triton, mem_efficient, all)",
    )
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--temp-limit", type=float, default=65.0, help="NVML wait target, C")
    ap.add_argument(
        "--temp-wait-max", type=float, default=30.0, help="longest NVML wait per backend, s"
    )
    ap.add_argument(
        "--results-dir",
        default=None,
        help="also write results.json/summary.csv/summary.md/chart.png here",
    )
    args = ap.parse_args(argv)

    try:
        kernels = [parse_so(s) for s in args.so]
        for path, _ in kernels:
            if not path.is_file():
                raise FaTuneError(f"kernel library {path} does not exist")
        shapes = [Shape.parse(s) for s in args.shape] or list(SEED_SHAPES)
        protocol = Protocol(
            warmup=args.warmup,
            repeat=args.repeat,
            rounds=args.rounds,
            temp_limit_c=args.temp_limit,
            temp_wait_max_s=args.temp_wait_max,
        )
        backends = make_backends(kernels, parse_backends(args.peers))
        fa3 = next((b for b in backends if b.name == "fa3"), None)
        if fa3 is not None and not fa3.available:
            print(
                f"FA3 skipped: {fa3.reason}. To install it offline run scripts/fa3_stage1.sh "
                "and scripts/fa3_stage2.sh, then put /root/fa3site and "
                "/root/fa3site/nvidia_cutlass_dsl/dsl_packages on PYTHONPATH.",
                file=sys.stderr,
            )
        payload = run_suite(backends, shapes, protocol)
    except FaTuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    out_dir = os.environ.get("OUT")
    if out_dir:
        path = Path(out_dir) / "bench_vs_fa3.json"
        path.write_text(json.dumps(payload, indent=1, default=str) + "\n")
        print(f"wrote {path}")
    if args.results_dir:
        files = write_outputs(payload, args.results_dir)
        print("wrote " + ", ".join(str(p) for p in files.values()))
    print()
    print(format_table(payload))
    bad = [r for r in payload["summary"] if r["status"] not in ("ok", "unavailable")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
