"""Softcap's two tanh forms on the H200 (docs/PERF.md steps 50, 60): knob softcap_tanh exact
(EX2 + RCP) and approx (tanh.approx), each gated on the seed, rising and peaky input sets
(peaky: scores spread to the cap, where tanh.approx errs most) and timed, beside the same preset
without a cap.

    python3 lab/h200/softcap_forms.py [--preset default] [--shape 1x16/8x8192]
"""

from __future__ import annotations

import argparse

from tuner.kernel import build
from tuner.kernel.config import load_preset
from tuner.measure.bench import Bench
from tuner.measure.launch import KernelLaunch
from tuner.measure.timing import Protocol
from tuner.problem import Problem


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="default")
    ap.add_argument("--shape", default="1x16/8x8192")
    ap.add_argument("--cap", type=float, default=50.0)
    a = ap.parse_args()
    plain = Problem.parse(a.shape)
    capped = Problem.parse(f"{a.shape}:cap{a.cap:g}")
    cfg = load_preset(a.preset)
    proto = Protocol(warmup=20, repeat=100, rounds=3, settle_s=1.0)
    rows = []
    bench = Bench(0, input_sets=("seed", "rising", "peaky"))
    try:
        for name, p, form in (("no cap", plain, "exact"), ("exact (EX2+RCP)", capped, "exact"),
                              ("tanh.approx", capped, "approx")):
            res = build.build_config(cfg.replace(softcap_tanh=form), pclass=p.problem_class)
            res.require_timeable()
            launch = KernelLaunch(res.so_path)
            g = bench.gate(launch, p)
            t = bench.time(launch, p, proto)
            rows.append((name, g.passed, g.summary(), t.median_ms, p.tflops(t.median_ms)))
            bench.release(p)
    finally:
        bench.close()
    for name, passed, summary, ms, tf in rows:
        print(f"{name:16s} gate {'pass' if passed else 'FAIL'} {ms:8.4f} ms {tf:6.1f} TFLOPS"
              f"  {summary}")


if __name__ == "__main__":
    main()
