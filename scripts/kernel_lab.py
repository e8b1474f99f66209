"""Kernel lab: build, gate and time several kernel variants side by side in one process.

The developers' harness for kernel work on the GPU host (docs/PERF.md cites its output). It is
a thin layer over the product's one measurement path (tuner.measure): the same build cache,
the same C-ABI binding, the same gate (every input set against the FP32 oracle) and the same
timing protocol as `fa-tune run` and `fa-tune compare`; FlashAttention-3 is a peer on that path.

Variants are partial knob dicts over the defaults (JSON) or preset names:

    python3 scripts/kernel_lab.py --variant default --variant '{"pingpong": false}' \
        --shape 4x32x8192 --warmup 50 --repeat 200 --rounds 3

A variant may carry lab-only macros, `{"scheduler": "static", "_lab": {"FA_TUNE_LAB_X": 2}}`,
passed to nvcc as -D through the build path (experiments that break results on purpose, e.g.
FA_TUNE_LAB_KV_LOAD_EVERY, cuda_src/lab/hooks.cuh); such a variant is gated for the record but
timed whatever the gate says, and its row says "exp". --unchecked builds configs that
config.validate refuses until they have run on a GPU (the kernel's static_asserts still
apply); they are gated like any other. FA3 runs first and last on each shape.
Every row reports the SM clock and board power NVML read after the settle phase. A variant
built with `"_lab": {"FA_TUNE_LAB_TASK_CLOCKS": 1}` also reports its last timed launch's task
clocks (scripts/task_clocks.py): CTA ends, the tail's idle share, the time per task.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import task_clocks  # noqa: E402  (scripts/, beside this file)

from tuner.errors import FaTuneError, ShapeError  # noqa: E402
from tuner.kernel import (  # noqa: E402
    build,
    config,
    toolchain,  # noqa: E402
)
from tuner.kernel.support import check_runnable  # noqa: E402
from tuner.measure.timing import Protocol  # noqa: E402
from tuner.problem import (  # noqa: E402
    DEFAULT_CLASS,
    Problem,  # noqa: E402
    ProblemClass,
)


class Variant:
    def __init__(self, text: str):
        self.lab: dict[str, int] = {}
        if text.startswith("{"):
            knobs = json.loads(text)
            self.lab = {str(k): int(v) for k, v in knobs.pop("_lab", {}).items()}
            self.cfg = config.KernelConfig().replace(**knobs)
        else:
            self.cfg = config.load_preset(text)
        tag = "".join(f"+{k.removeprefix('FA_TUNE_LAB_').lower()}{v}" for k, v in self.lab.items())
        self.label = self.cfg.config_id() + tag


def compile_all(variants: list[Variant], jobs: int,
                pclass: ProblemClass = DEFAULT_CLASS, check: bool = True) -> list[Path | None]:
    """Build every variant through the product's build path (lab macros as -D defines), for
    one problem class (head dim and mask: the problems'); check=False skips validate."""
    groups: dict[str, list[int]] = {}
    for i, v in enumerate(variants):
        groups.setdefault(json.dumps(v.lab, sort_keys=True), []).append(i)
    sos: list[Path | None] = [None] * len(variants)
    for lab_json, idx in groups.items():
        defines = json.loads(lab_json) or None
        built = build.build_many([variants[i].cfg for i in idx], jobs=jobs, defines=defines,
                                 pclass=pclass, check=check)
        for i, outcome in zip(idx, built, strict=True):
            if outcome.ok and not outcome.result.unfit:
                sos[i] = Path(outcome.result.so_path)
            else:
                why = outcome.error or outcome.result.unfit
                print(f"  {variants[i].label}: not built: {why}", flush=True)
    return sos


def _row(shape: Problem, name: str, status: str, t: Any, fa3_ms: float | None) -> dict[str, Any]:
    st = t.rounds[-1].state_before
    return {"shape": str(shape), "backend": name, "gate": status, "median_ms": t.median_ms,
            "min_ms": t.min_ms, "max_ms": t.max_ms, "tflops": t.tflops,
            "x_fa3": (fa3_ms / t.median_ms) if fa3_ms else None,
            "sm_mhz": st.sm_clock_mhz, "power_w": st.power_w}


def bench_shape(bench: Any, fa3: Any, variants: list[Variant], sos: list[Path | None],
                shape: Problem, proto: Protocol, rows: list, log: list) -> None:
    """Gate every variant on `shape`, then time FA3, the passing variants, FA3 again; a task
    clocks build (FA_TUNE_LAB_TASK_CLOCKS) also reports its last launch's stamps."""
    from tuner.measure.launch import KernelLaunch

    timed: list[tuple[str, Any, str]] = []
    if fa3 is not None:
        g = bench.gate(fa3, shape)
        log.append({"shape": str(shape), "backend": "FA3", "gate": g.to_dict()})
        timed.append(("FA3", fa3, "ok" if g.passed else "FAIL"))
    for var, so in zip(variants, sos, strict=True):
        if so is None:
            continue
        kern = KernelLaunch(so, var.label)
        try:
            g = bench.gate(kern, shape)
            ok, summary = g.passed, g.summary()
            log.append({"shape": str(shape), "backend": var.label, "config": var.cfg.to_dict(),
                        "lab": var.lab, "gate": g.to_dict()})
        except Exception as e:  # noqa: BLE001 - a launch error: report it, keep the others
            ok, summary = False, f"{type(e).__name__}: {e}"
        if not ok and not var.lab:
            rows.append({"shape": str(shape), "backend": var.label, "gate": "FAIL",
                         "why": summary[:200]})
            print("  ", rows[-1], flush=True)
            continue
        timed.append((var.label, kern, "ok" if ok else "exp"))  # exp: wrong on purpose
    if fa3 is not None:
        timed.append(("FA3(end)", fa3, timed[0][2]))
    fa3_ms = None
    clocked = {v.label: so for v, so in zip(variants, sos, strict=True)
               if so is not None and v.lab.get(task_clocks.DEFINE)}
    for name, launch, status in timed:
        if name in clocked:
            task_clocks.reset(clocked[name])
        t = bench.time(launch, shape, proto)
        if name == "FA3":
            fa3_ms = t.median_ms
        rows.append(_row(shape, name, status, t, fa3_ms))
        print("  ", {k: v for k, v in rows[-1].items()}, flush=True)
        log.append({"shape": str(shape), "backend": name, "timing": t.to_dict()})
        if name in clocked:
            summary = task_clocks.summary(*task_clocks.read(clocked[name]))
            print(f"   {name} at {shape}: {task_clocks.line(summary)}", flush=True)
            log.append({"shape": str(shape), "backend": name, "task_clocks": summary})
    bench.release(shape)


def _fmt(r: dict[str, Any]) -> str:
    if "median_ms" not in r:
        return f"{r['shape']:<12} {r['backend']:<24} FAIL  {r.get('why', '')}"
    x = f"{r['x_fa3']:.3f}" if r["x_fa3"] else "-"
    return (f"{r['shape']:<12} {r['backend']:<24} {r['gate']:<5} {r['median_ms']:>10.4f} "
            f"{r['min_ms']:>8.4f}-{r['max_ms']:<8.4f} {r['tflops']:>7.1f} {x:>6} "
            f"{r['sm_mhz'] or '-':>5} {round(r['power_w']) if r['power_w'] else '-':>4}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", action="append", default=[])
    ap.add_argument("--variants-file", help="one variant per line (preset name or JSON)")
    ap.add_argument("--shape", action="append", default=[],
                    help="problem BxHq[/Hkv]xS[:dD][:full] (the kernel runs MHA, D 128, causal)")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle-s", type=float, default=2.0,
                    help="seconds of launches before each round (the power ramp; 0: none)")
    ap.add_argument("--jobs", type=int, default=toolchain.usable_cpus())
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--unchecked", action="store_true",
                    help="build configs config.validate refuses (e.g. not yet verified on a "
                         "GPU); every variant is still gated before it is timed")
    ap.add_argument("--no-fa3", action="store_true")
    args = ap.parse_args()
    texts = list(args.variant)
    try:  # a variant the config refuses, or an unreadable file, is one line
        if args.variants_file:
            texts += [ln.strip() for ln in Path(args.variants_file).read_text().splitlines()
                      if ln.strip() and not ln.startswith("#")]
        variants = [Variant(v) for v in (texts or ["default"])]
    except (FaTuneError, OSError, ValueError) as e:
        raise SystemExit(f"kernel_lab: {e}") from None
    try:  # before compiling: a problem the kernel cannot run is one line
        problems = [Problem.parse(s) for s in (args.shape or ["4x32x8192"])]
        pclass = check_runnable(problems)
    except ShapeError as e:
        raise SystemExit(f"kernel_lab: {e}") from None
    t0 = time.time()
    sos = compile_all(variants, args.jobs, pclass, check=not args.unchecked)
    print(f"built {len(sos)} variants in {time.time() - t0:.1f}s", flush=True)
    if args.build_only:
        return

    from tuner.measure.bench import Bench
    from tuner.measure.launch import PeerLaunch
    from tuner.measure.peers import make_peer

    proto = Protocol(warmup=args.warmup, repeat=args.repeat, rounds=args.rounds,
                     settle_s=args.settle_s)
    fa3 = None
    if not args.no_fa3:
        peer = make_peer("fa3")
        ok, why = peer.available()
        fa3 = PeerLaunch(peer) if ok else None
        if fa3 is None:
            print(f"FA3 unavailable: {why}")
    bench = Bench(0)
    rows: list[dict[str, Any]] = []
    log: list[dict[str, Any]] = []
    for problem in problems:
        bench_shape(bench, fa3, variants, sos, problem, proto, rows, log)
    out = os.environ.get("OUT")
    if out:
        Path(out, "kernel_lab.json").write_text(json.dumps(log, indent=1, default=str))
    print("\nvariants:")
    for var in variants:
        print(f"  {var.label}: {var.cfg.canonical_json()} {json.dumps(var.lab) if var.lab else ''}")
    print(f"\n{'shape':<12} {'backend':<24} {'gate':<5} {'median_ms':>10} {'min-max':>17} "
          f"{'TFLOPS':>7} {'xFA3':>6} {'MHz':>5} {'W':>4}")
    for r in rows:
        print(_fmt(r))


if __name__ == "__main__":
    main()
