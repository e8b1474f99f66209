"""Kernel lab: build, check and time several kernel variants side by side in one process.

The developers' harness for kernel work on the GPU host (docs/PERF.md cites its output).
Variants are partial knob dicts over the defaults (JSON on the command line or a preset
name). Each is rendered from templates/fa_fwd_sm90.cu, compiled in parallel with nvcc,
checked against an FP32 torch reference on sampled heads (seed inputs and a rising-max
input set), and timed with the seeds' protocol beside FlashAttention-3 when it imports.

    python3 scripts/kernel_lab.py --variant default --variant '{"pingpong": false}' \
        --shape 4x32x8192 --warmup 50 --repeat 200 --rounds 3

Uses torch for inputs and the reference: this is a lab script, not the product's path
(the product gates with cuda_src/oracle.cu and times through tuner/).

A variant may carry lab-only macros, `{"scheduler": "static", "_lab": {"FA_TUNE_LAB_X": 2}}`:
they are defined ahead of the template (experiments that break results on purpose, e.g.
FA_TUNE_LAB_KV_LOAD_EVERY in fa_tune/producer.cuh); such a variant is gated for the record
but timed whatever the gate says. Each timing also samples the SM clock and board power
(NVML) while the GPU drains the launch queue. Each round starts after --settle-s seconds of
launches (default 2), so every backend is timed at the card's power-capped steady state.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner import build, config  # noqa: E402


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

    def template(self) -> Path | None:
        """None for the product template; else a copy with the lab macros defined first."""
        if not self.lab:
            return None
        text = "".join(f"#define {k} {v}\n" for k, v in sorted(self.lab.items()))
        path = ROOT / "studies" / "lab_templates" / f"{self.label}.cu"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + build.template_text(None))
        return path


def compile_all(variants: list[Variant], jobs: int) -> list[Path | None]:
    outs: dict[int, build.BuildOutcome] = {}
    groups: dict[Path | None, list[int]] = {}
    for i, v in enumerate(variants):
        groups.setdefault(v.template(), []).append(i)
    for tpl, idx in groups.items():
        built = build.build_many([variants[i].cfg for i in idx], jobs=jobs, template=tpl)
        outs.update(zip(idx, built, strict=True))
    paths = []
    for i in range(len(variants)):
        out = outs[i]
        if not out.ok:
            print(f"  BUILD FAILED {out.config.config_id()}: {out.error}", flush=True)
            paths.append(None)
            continue
        r = out.result
        e = r.main_entry
        if r.unfit:  # local memory or serialized wgmma: timing it would only burn device time
            print(f"  SKIP {r.config_id}: {r.unfit}", flush=True)
            paths.append(None)
            continue
        sass = r.sass or {}
        print(f"  {r.config_id}: {r.compile_seconds:.1f}s regs={e.get('registers')} "
              f"spills={e.get('spill_stores')}/{e.get('spill_loads')} "
              f"hgmma={sass.get('hgmma')} ldl+stl={sass.get('ldl', 0) + sass.get('stl', 0)}",
              flush=True)
        paths.append(Path(r.so_path))
    return paths


class Kernel:
    def __init__(self, so: Path):
        self.lib = ctypes.CDLL(str(so))
        f = self.lib.fa_tune_forward
        f.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 3 + [ctypes.c_void_p]
        f.restype = ctypes.c_int
        self.lib.fa_tune_last_error.restype = ctypes.c_char_p

    def __call__(self, q, k, v, o, lse, stream: int) -> None:
        B, S, H, _ = q.shape
        rc = self.lib.fa_tune_forward(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                                      lse.data_ptr(), B, H, S, stream)
        if rc != 0:
            raise RuntimeError(f"fa_tune_forward -> {rc}: {self.lib.fa_tune_last_error().decode()}")


def make_inputs(torch, B, H, S, kind: str, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (B, S, H, 128)
    if kind == "seed":
        q = torch.rand(shape, device="cuda", generator=g) * 4 - 2
        k = torch.rand(shape, device="cuda", generator=g) * 4 - 2
    else:  # scores grow toward key 0: the running max rises as the kernel walks its tiles
        u = torch.randn(128, device="cuda", generator=g)
        u = u / u.norm()
        q = (u * 8 + torch.randn(shape, device="cuda", generator=g) * 0.3)
        ramp = torch.linspace(40.0, 0.0, S, device="cuda").view(1, S, 1, 1)
        k = ramp * u + torch.randn(shape, device="cuda", generator=g) * 0.3
    v = torch.rand(shape, device="cuda", generator=g) * 2 - 1
    return [t.to(torch.bfloat16).contiguous() for t in (q, k, v)]


def reference_heads(torch, q, k, v, heads):
    """FP32 causal attention for the (b, h) pairs in `heads`; returns {(b,h): [S,128]}."""
    out = {}
    S = q.shape[1]
    mask = torch.ones(S, S, device="cuda", dtype=torch.bool).triu(1)
    for b, h in heads:
        qf, kf, vf = (t[b, :, h].float() for t in (q, k, v))
        s = (qf @ kf.T) / 128 ** 0.5
        s.masked_fill_(mask, float("-inf"))
        out[(b, h)] = torch.softmax(s, dim=-1) @ vf
    return out


def check(torch, run, B, H, S, seed):
    worst = {}
    for kind in ("seed", "rising"):
        q, k, v = make_inputs(torch, B, H, S, kind, seed)
        o = torch.full_like(q, float("nan"))
        lse = torch.full((B, H, S), float("nan"), device="cuda")
        run(q, k, v, o, lse)
        torch.cuda.synchronize()
        heads = [(0, 0), (B - 1, H - 1), (B // 2, H // 3)]
        ref = reference_heads(torch, q, k, v, heads)
        max_err, viol, nan = 0.0, 0, int(torch.isnan(o.float()).sum())
        for (b, h), r in ref.items():
            got = o[b, :, h].float()
            err = (got - r).abs()
            max_err = max(max_err, float(err.max()))
            viol += int((err > 0.05 + 0.1 * r.abs()).sum())
        worst[kind] = (max_err, viol, nan)
    ok = all(v[1] == 0 and v[2] == 0 for v in worst.values())
    return ok, worst


class Telemetry:
    """SM clock (MHz) and board power (W) from NVML; empty lists where NVML is missing."""

    def __init__(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.dev = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # noqa: BLE001 - telemetry is optional in the lab
            self.nvml = None
        self.clock: list[float] = []
        self.power: list[float] = []

    def sample(self) -> None:
        if self.nvml is None:
            return
        n = self.nvml
        self.clock.append(n.nvmlDeviceGetClockInfo(self.dev, n.NVML_CLOCK_SM))
        self.power.append(n.nvmlDeviceGetPowerUsage(self.dev) / 1000.0)

    def summary(self) -> tuple[str, str]:
        if not self.clock:
            return "-", "-"
        return f"{statistics.median(self.clock):.0f}", f"{statistics.median(self.power):.0f}"


def time_fn(torch, fn, warmup, repeat, rounds, tele: Telemetry | None = None,
            settle_s: float = 0.0):
    from tuner.compare import settle

    medians, samples = [], []
    for _ in range(rounds):
        settle(fn, settle_s, torch.cuda.synchronize)  # reach the power-capped steady state
        for _ in range(warmup):
            fn()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(repeat)]
        for a, b in ev:
            a.record()
            fn()
            b.record()
        if tele is not None:  # the queue is still draining: sample its second half
            end = ev[-1][1]
            time.sleep(0.02)
            while not end.query():
                tele.sample()
                time.sleep(0.02)
        torch.cuda.synchronize()
        ms = [a.elapsed_time(b) for a, b in ev]
        samples += ms
        medians.append(statistics.median(ms))
    return statistics.median(medians), min(samples), max(samples)


def bench_shape(torch, fa3, variants, sos, shape, args, rows: list, log: list) -> None:
    """Gate every variant on `shape`, then time FA3, the passing variants, FA3 again."""
    B, H, S = shape
    q, k, v = make_inputs(torch, B, H, S, "seed", 42)
    o = torch.empty_like(q)
    lse = torch.empty((B, H, S), device="cuda")
    flops = 2 * B * H * S * S * 128
    tag = f"{B}x{H}x{S}"
    backends = []
    status: dict[str, str] = {}
    if fa3 is not None:
        backends.append(("FA3", lambda: fa3(q, k, v, causal=True)))
    for var, so in zip(variants, sos, strict=True):
        cfg = var.cfg
        if so is None:
            continue
        kern = Kernel(so)

        def run(q_, k_, v_, o_, l_, kern=kern):
            kern(q_, k_, v_, o_, l_, torch.cuda.current_stream().cuda_stream)

        try:
            ok, worst = check(torch, run, B, H, S, seed=1234 + S)
        except RuntimeError as e:  # a launch error: report it, keep the other variants
            ok, worst = False, {"error": str(e)}
        log.append({"shape": [B, H, S], "config": cfg.to_dict(), "lab": var.lab, "gate": ok,
                    "worst": worst})
        if not ok and not var.lab:
            rows.append((tag, var.label, "FAIL", json.dumps(worst), "", "", "", "", ""))
            print("  ", rows[-1], flush=True)
            continue
        status[var.label] = "ok" if ok else "exp"  # exp: a lab experiment, wrong on purpose
        backends.append((var.label, lambda run=run: run(q, k, v, o, lse)))
    if fa3 is not None:
        backends.append(("FA3(end)", lambda: fa3(q, k, v, causal=True)))
    fa3_ms = None
    for name, fn in backends:
        tele = Telemetry()
        med, lo, hi = time_fn(torch, fn, args.warmup, args.repeat, args.rounds, tele,
                              args.settle_s)
        if name == "FA3":
            fa3_ms = med
        ratio = f"{fa3_ms / med:.3f}" if fa3_ms else "-"
        mhz, watts = tele.summary()
        rows.append((tag, name, status.get(name, "ok"), f"{med:.4f}", f"{lo:.4f}-{hi:.4f}",
                     f"{flops / med / 1e9:.1f}", ratio, mhz, watts))
        print("  ", rows[-1], flush=True)
        log.append({"shape": [B, H, S], "backend": name, "median_ms": med, "min": lo,
                    "max": hi, "sm_mhz": tele.clock, "power_w": tele.power})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", action="append", default=[])
    ap.add_argument("--variants-file", help="one variant per line (preset name or JSON)")
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle-s", type=float, default=2.0,
                    help="seconds of launches before each round (the power ramp; 0: none)")
    ap.add_argument("--jobs", type=int, default=build.usable_cpus())
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--no-fa3", action="store_true")
    args = ap.parse_args()
    texts = list(args.variant)
    if args.variants_file:
        texts += [ln.strip() for ln in Path(args.variants_file).read_text().splitlines()
                  if ln.strip() and not ln.startswith("#")]
    variants = [Variant(v) for v in (texts or ["default"])]
    t0 = time.time()
    sos = compile_all(variants, args.jobs)
    print(f"built {len(sos)} variants in {time.time() - t0:.1f}s", flush=True)
    if args.build_only:
        return

    import torch

    fa3 = None
    if not args.no_fa3:
        try:
            from flash_attn.cute.interface import flash_attn_func
            fa3 = flash_attn_func
        except Exception as e:  # noqa: BLE001 - report and go on without the peer
            print(f"FA3 unavailable: {type(e).__name__}: {e}")
    shapes = [tuple(int(x) for x in s.split("x")) for s in (args.shape or ["4x32x8192"])]
    rows: list[tuple] = []
    log: list[dict] = []
    for B, H, S in shapes:
        bench_shape(torch, fa3, variants, sos, (B, H, S), args, rows, log)
    out = os.environ.get("OUT")
    if out:
        Path(out, "kernel_lab.json").write_text(json.dumps(log, indent=1, default=str))
    print("\nvariants:")
    for var in variants:
        print(f"  {var.label}: {var.cfg.canonical_json()} {json.dumps(var.lab) if var.lab else ''}")
    print(f"\n{'shape':<12} {'backend':<20} {'gate':<5} {'median_ms':>10} {'min-max':>16} "
          f"{'TFLOPS':>7} {'xFA3':>6} {'MHz':>5} {'W':>4}")
    for r in rows:
        print(f"{r[0]:<12} {r[1]:<20} {r[2]:<5} {r[3]:>10} {r[4]:>16} {r[5]:>7} {r[6]:>6} "
              f"{r[7]:>5} {r[8]:>4}")


if __name__ == "__main__":
    main()
