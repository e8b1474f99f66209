#!/usr/bin/env python3
"""GPU self-test of the correctness gate and the timing protocol (no torch needed).

Run on the H200 from the repository root:

    python scripts/gpu_selftest.py [--quick] [--json OUT.json]

Checks, in order: device and NVML; oracle.so builds; the GPU input generators equal the NumPy
twin bit for bit; the "rising" set rises on GPU-made inputs; the FP32 reference matches NumPy
float64 on sampled rows (row 0, S-1, tile boundaries) and, for the problem family (GQA, MQA, head
dims 64 and 256, non-causal), on every row of small problems; oracle_compare's counters and BF16
budget sums equal their NumPy twin (D 64 and 256 too); the gate passes a perfect kernel and
catches injected bugs (no O rescale, no running-sum rescale, one wrong element, one unwritten
element, one NaN, one wrong LSE, LSE never written, and errors only the BF16 error budget sees:
O x 1.015 on rows 0-7 of every 64, O x 1.01 on 4 head-dim columns), and on every kind of problem
of the family passes the reference kernel and catches the rescale bugs and the column error; the
reference's runtime at the seed shapes and at GQA / D 64 / D 256 / non-causal problems of the
same size; the comparison's runtime; time_kernel on a trivial kernel. Prints a table last; exit
code 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.errors import FaTuneError  # noqa: E402
from tuner.kernel.runtime import AttnBuffers, Device, Event, OracleModule, as_problem  # noqa: E402
from tuner.measure import gate_rule as GR  # noqa: E402
from tuner.measure import oracle as O  # noqa: E402
from tuner.measure import timing as T  # noqa: E402
from tuner.problem import Problem  # noqa: E402

ROWS: list[tuple[str, str, str]] = []  # (check, PASS/FAIL, detail)
DETAILS: dict[str, Any] = {}


def Shape(B: int, H: int, S: int) -> SimpleNamespace:  # noqa: N802 - an MHA D 128 problem
    return SimpleNamespace(B=B, H=H, S=S)


# Small problems of each kind of the family (every row checked against NumPy float64).
FAMILY = [Problem(1, 4, 256, Hkv=2), Problem(2, 4, 200, Hkv=1), Problem(1, 2, 256, D=64),
          Problem(1, 2, 200, D=256), Problem(1, 2, 256, causal=False),
          Problem(1, 8, 320, Hkv=2, D=64, causal=False),
          Problem(1, 4, 130, Hkv=1, D=256, causal=False)]


def check(name: str, fn: Callable[[], tuple[bool, str]]) -> bool:
    t0 = time.monotonic()
    try:
        ok, detail = fn()
    except Exception as e:  # noqa: BLE001 - report every failure, keep going
        ok, detail = False, f"{type(e).__name__}: {' '.join(str(e).split())}"
        traceback.print_exc()
    dt = time.monotonic() - t0
    ROWS.append((name, "PASS" if ok else "FAIL", f"{detail} [{dt:.1f}s]"))
    print(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail} [{dt:.1f}s]", flush=True)
    return ok


def sample_rows(shape: SimpleNamespace, n_bh: int = 3) -> list[tuple[int, int, int]]:
    S = shape.S
    ss = sorted({0, 1, 63, 64, 65, 127, 128, 129, 191, 192, S // 2 - 1, S // 2, S - 65, S - 64,
                 S - 2, S - 1} & set(range(S)))
    bhs = sorted({(0, 0), (shape.B - 1, shape.H - 1), (shape.B // 2, shape.H // 2)})[:n_bh]
    return [(b, h, s) for b, h in bhs for s in ss]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="skip the S=16384 runs")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--oracle-so", type=Path, help="use this oracle.so instead of building")
    args = ap.parse_args()

    try:
        dev = Device.open(0)
    except FaTuneError as e:
        print(f"gpu_selftest: {e}", file=sys.stderr)
        return 2
    nv = T.nvml_for(dev)
    print(f"device: {dev.name} cc {dev.cc} SMs {dev.sm_count} L2 {dev.l2_bytes >> 20} MiB "
          f"CUDA driver {dev.info.cuda_driver_version_str} NVIDIA driver {nv.driver_version()} "
          f"NVML {'ok' if nv.available else nv.note}", flush=True)
    DETAILS["device"] = dev.properties()
    DETAILS["nvidia_driver"] = nv.driver_version()

    # -- build
    holder: dict[str, OracleModule] = {}

    def build() -> tuple[bool, str]:
        if args.oracle_so:
            holder["o"] = O.get_oracle(args.oracle_so)
            return True, f"loaded {args.oracle_so}"
        from tuner.kernel import build as B

        res = B.build_oracle()
        holder["o"] = O.get_oracle(res.so_path)
        ref = next((v for k, v in res.ptxas.get("entries", {}).items() if "reference" in k), {})
        return (not res.any_spills), f"{res.so_path} reference kernel ptxas {ref}"

    if not check("oracle.so builds and loads", build):
        return finish(args)
    orc = holder["o"]
    stream = dev.stream()

    # -- generators == NumPy twin
    def twin() -> tuple[bool, str]:
        bad = []
        shapes = (Shape(2, 3, 256), Problem(2, 6, 100, Hkv=2, D=64),
                  Problem(1, 4, 64, Hkv=1, D=256, causal=False))
        for shape in shapes:
            with AttnBuffers(dev, shape) as bufs:
                for name in O.INPUT_SETS:
                    O.fill_inputs(orc, bufs, name, 42, stream)
                    stream.synchronize()
                    got = O.inputs_to_host(bufs)
                    want = O.host_inputs(shape, name, 42)
                    for t, g, w in zip("qkv", got, want, strict=True):
                        if not np.array_equal(g, w):
                            bad.append(f"{bufs.shape} {name}.{t}: {int((g != w).sum())} differ")
        return not bad, "; ".join(bad) or (
            "seed, rising, rising_fwd identical at 2x3x256, 2x6/2x100:d64, 1x4/1x64:d256:full")

    check("GPU generators == NumPy twin (bit-exact)", twin)

    def rising_gpu() -> tuple[bool, str]:
        shape = Shape(1, 2, 1024)
        with AttnBuffers(dev, shape) as bufs:
            O.fill_inputs(orc, bufs, "rising", 42, stream)
            stream.synchronize()
            q, k, _ = O.inputs_to_host(bufs)
        fails = {bn: O.rising_failures(q, k, bn, reverse=True, min_rise=0.38)
                 for bn in (64, 128, 192)}
        sc = O.scores_f64(q, k, 0, 0)
        tri = sc[np.tril_indices(shape.S)]
        return all(v == 0 for v in fails.values()), (
            f"reverse-walk failures per block_n {fails}; logits in [{tri.min():.1f}, "
            f"{tri.max():.1f}]")

    check("rising set rises (GPU inputs, 1x2x1024, float64)", rising_gpu)

    # -- reference vs NumPy float64
    def gpu_reference(shape: Any, input_set: str) -> tuple[Any, ...]:
        """Inputs (host) and the GPU reference's O [B, S, H, D] and LSE [B, H, S] for a problem."""
        D = getattr(shape, "D", 128)  # Shape() is MHA, D 128
        with AttnBuffers(dev, shape) as bufs:
            o_ref = dev.alloc(bufs.n * 4)
            lse_ref = dev.alloc(bufs.n_lse * 4)
            try:
                O.fill_inputs(orc, bufs, input_set, 42, stream)
                orc.reference_for(bufs, o_ref.ptr, lse_ref.ptr, stream)
                stream.synchronize()
                q, k, v = O.inputs_to_host(bufs)
                o_gpu = o_ref.copy_to_host(np.float32).reshape(shape.B, shape.S, shape.H, D)
                l_gpu = lse_ref.copy_to_host(np.float32).reshape(shape.B, shape.H, shape.S)
            finally:
                o_ref.free()
                lse_ref.free()
        return q, k, v, o_gpu, l_gpu

    def ref_vs_numpy(shape: SimpleNamespace, input_set: str, n_bh: int) -> tuple[bool, str]:
        q, k, v, o_gpu, l_gpu = gpu_reference(shape, input_set)
        rows = sample_rows(shape, n_bh)
        o_np, l_np = O.numpy_reference_rows(q, k, v, rows)
        o_err = max(float(np.abs(o_gpu[b, s, h] - o_np[i]).max()) for i, (b, h, s) in
                    enumerate(rows))
        l_err = max(abs(float(l_gpu[b, h, s]) - l_np[i]) / (1 + abs(l_np[i]))
                    for i, (b, h, s) in enumerate(rows))
        finite = bool(np.isfinite(o_gpu).all() and np.isfinite(l_gpu).all())
        ok = finite and o_err <= 1e-4 and l_err <= 1e-5
        DETAILS.setdefault("reference_vs_numpy", []).append(
            dict(shape=[shape.B, shape.H, shape.S], set=input_set, rows=len(rows),
                 o_max_abs_err=o_err, lse_max_rel_err=l_err, finite=finite))
        return ok, f"{len(rows)} rows: O max|err| {o_err:.2e}, LSE max rel err {l_err:.2e}"

    for shape, n_bh in ((Shape(1, 2, 256), 2), (Shape(2, 3, 1024), 3), (Shape(1, 2, 200), 2),
                        (Shape(1, 2, 4096), 1)):
        for input_set in ("seed", "rising"):
            check(f"reference vs float64 {shape.B}x{shape.H}x{shape.S} {input_set}",
                  lambda s=shape, n=n_bh, i=input_set: ref_vs_numpy(s, i, n))

    def ref_family(p: Problem, input_set: str) -> tuple[bool, str]:
        q, k, v, o_gpu, l_gpu = gpu_reference(p, input_set)
        o_np, l_np = O.numpy_reference(q, k, v, p.causal)
        o_err = float(np.abs(o_gpu - o_np).max())
        l_err = float((np.abs(l_gpu - l_np) / (1 + np.abs(l_np))).max())
        finite = bool(np.isfinite(o_gpu).all() and np.isfinite(l_gpu).all())
        DETAILS.setdefault("reference_vs_numpy", []).append(
            dict(shape=str(p), set=input_set, rows="all", o_max_abs_err=o_err,
                 lse_max_rel_err=l_err, finite=finite))
        return (finite and o_err <= 1e-4 and l_err <= 2e-5), (
            f"every row: O max|err| {o_err:.2e}, LSE max rel err {l_err:.2e}")

    for p in FAMILY:
        for input_set in ("seed", "rising"):
            check(f"reference vs float64 {p} ({p.kind}) {input_set}",
                  lambda p=p, i=input_set: ref_family(p, i))

    # -- oracle_compare vs its NumPy twin (poison, NaN and a partial last row block included)
    def compare_twin(shp: Any) -> tuple[bool, str]:
        with AttnBuffers(dev, shp) as bufs:
            o_ref = dev.alloc(bufs.n * 4)
            try:
                O.fill_inputs(orc, bufs, "seed", 42, stream)
                orc.reference_for(bufs, o_ref.ptr, None, stream)
                orc.f32_to_bf16(o_ref.ptr, bufs.o.ptr, bufs.n, stream)
                stream.synchronize()
                o = bufs.o.copy_to_host(np.uint16, bufs.n)
                o[::977] = 0x3F80  # 1.0: violations and budget errors scattered around
                o[5] = GR.POISON_BF16
                o[123456] = 0x7FC0
                bufs.o.copy_from_host(o)
                stats, sums = O.compare(dev, orc, bufs, o_ref, None, stream)
                ref = o_ref.copy_to_host(np.float32)
            finally:
                o_ref.free()
        dims = (shp.B, shp.S, shp.H, getattr(shp, "D", 128))
        want, wsums = GR.compare_numpy(o.reshape(dims), ref.reshape(dims))
        bad = [f for f in ("o_count", "o_violations", "o_nonfinite", "o_unwritten",
                           "o_first_violation", "o_block_rows", "o_max_abs_err")
               if getattr(stats, f) != getattr(want, f)]
        bad += [f for f in ("o_sum_sq_err", "o_sum_sq_ref", "o_sum_sq_bf16")
                if not math.isclose(getattr(stats, f), getattr(want, f), rel_tol=1e-9)]
        if not np.allclose(sums.blocks, wsums.blocks, rtol=1e-4, atol=0):
            bad.append("block sums")
        if not np.allclose(sums.cols, wsums.cols, rtol=1e-5, atol=0):
            bad.append("column sums")
        return not bad, ("differ: " + ", ".join(bad)) if bad else (
            f"{bufs.shape}: {stats.o_violations} violations, first {stats.o_first_violation}, "
            f"{sums.blocks.shape[2]} row blocks per head, {sums.cols.shape[2]} columns: "
            "counters and sums equal")

    for shp in (Shape(2, 3, 1000), Problem(2, 4, 1000, Hkv=2, D=64),
                Problem(1, 3, 1000, Hkv=1, D=256, causal=False)):
        check(f"oracle_compare == NumPy twin (stats and budget sums) {as_problem(shp)}",
              lambda s=shp: compare_twin(s))

    # -- gate self-checks
    shape = Shape(2, 4, 1024)
    gbufs = AttnBuffers(dev, shape)

    def run_gate(kern: Any, sets: tuple[str, ...] = ("seed", "rising")) -> GR.GateResult:
        try:
            return O.gate(dev, kern, shape, gbufs, 42, sets, oracle=orc, stream=stream)
        finally:
            if hasattr(kern, "free"):
                kern.free()

    def perfect() -> tuple[bool, str]:
        g = run_gate(O.ReferenceKernel(dev, orc))
        DETAILS["gate_perfect"] = g.to_dict()
        return g.passed, g.summary()

    def reverse_ok() -> tuple[bool, str]:
        g = run_gate(O.ReferenceKernel(dev, orc, O.REF_REVERSE))
        return g.passed, g.summary()

    def bug(flags: int) -> Callable[[], tuple[bool, str]]:
        # A reverse walk must be caught by "rising", a forward walk by "rising_fwd".
        want = "rising" if flags & O.REF_REVERSE else "rising_fwd"

        def f() -> tuple[bool, str]:
            g = run_gate(O.ReferenceKernel(dev, orc, flags), ("seed", "rising", "rising_fwd"))
            r = g.by_set[want]
            DETAILS[f"gate_bug_{flags}"] = g.to_dict()
            others = ", ".join(f"{m.input_set} {'passed' if m.passed else 'failed'}"
                               for m in g.sets if m.input_set != want)
            return (not r.passed and r.violations > 0), (
                f"{want}: {r.violations} violations, max|err| {r.max_abs_err:.3g}, rel L2 "
                f"{r.rel_l2:.3g}; {others}")
        return f

    def poke(where: str, flat: int, bits: int, dtype: Any) -> Callable[[Any, Any], None]:
        def after(bufs: AttnBuffers, st: Any) -> None:
            st.synchronize()
            buf = bufs.o if where == "o" else bufs.lse
            item = np.dtype(dtype).itemsize
            buf.copy_from_host(np.array([bits], dtype=dtype), offset=flat * item)
        return after

    flat = ((1 * shape.S + 777) * shape.H + 2) * 128 + 5  # (b=1, s=777, h=2, d=5)

    def one_wrong() -> tuple[bool, str]:
        g = run_gate(O.ReferenceKernel(dev, orc, after=poke("o", flat, 0x4120, np.uint16)),
                     ("seed",))  # 10.0: far beyond tolerance for |ref| <= 1
        m = g.sets[0]
        ok = (not g.passed and m.violations == 1 and m.first_violation == (1, 777, 2, 5)
              and m.unwritten == 0 and m.nan_count == 0)
        return ok, f"violations {m.violations} first {m.first_violation}"

    def one_unwritten() -> tuple[bool, str]:
        g = run_gate(O.ReferenceKernel(dev, orc, after=poke("o", flat, GR.POISON_BF16, np.uint16)),
                     ("seed",))
        m = g.sets[0]
        ok = m.unwritten == 1 and m.violations == 1 and m.first_violation == (1, 777, 2, 5)
        return ok and not g.passed, f"unwritten {m.unwritten} nan {m.nan_count} first " \
            f"{m.first_violation}"

    def one_nan() -> tuple[bool, str]:
        g = run_gate(O.ReferenceKernel(dev, orc, after=poke("o", flat, 0x7FC0, np.uint16)),
                     ("seed",))
        m = g.sets[0]
        ok = m.nan_count == 1 and m.unwritten == 0 and m.violations == 1
        return ok and not g.passed, f"nan {m.nan_count} unwritten {m.unwritten}"

    lse_flat = (1 * shape.H + 3) * shape.S + 500  # (b=1, h=3, s=500)

    def one_lse() -> tuple[bool, str]:
        bits = int(np.array([1234.5], np.float32).view(np.uint32)[0])
        g = run_gate(O.ReferenceKernel(dev, orc, after=poke("lse", lse_flat, bits, np.uint32)),
                     ("seed",))
        m = g.sets[0]
        ok = m.lse_violations == 1 and m.lse_first_violation == (1, 3, 500) and m.violations == 0
        return ok and not g.passed, f"LSE violations {m.lse_violations} first " \
            f"{m.lse_first_violation}"

    def lse_missing() -> tuple[bool, str]:
        g = run_gate(O.ReferenceKernel(dev, orc, lse_target="none"), ("seed",))
        m = g.sets[0]
        return (not g.passed and m.lse_unwritten == elems(shape, lse=True)), \
            f"LSE unwritten {m.lse_unwritten}"

    def scale_after(rows: Any, cols: Any, factor: float) -> Callable[[Any, Any], None]:
        def after(bufs: AttnBuffers, st: Any) -> None:
            st.synchronize()
            s = bufs.shape
            o = O.bf16_bits_to_f32(bufs.o.copy_to_host(np.uint16, bufs.n)).reshape(
                s.B, s.S, s.H, s.D)
            o[:, rows, :, cols] *= np.float32(factor)
            bufs.o.copy_from_host(O.f32_to_bf16_bits(o).reshape(-1))
        return after

    def budget_only(rows: Any, cols: Any, factor: float, needle: str,
                    ) -> Callable[[], tuple[bool, str]]:
        def f() -> tuple[bool, str]:
            g = run_gate(O.ReferenceKernel(dev, orc, after=scale_after(rows, cols, factor)))
            ok = all(m.violations == 0 and m.rel_l2 <= GR.REL_L2_MAX and not m.passed
                     and needle in " ".join(m.reasons) for m in g.sets)
            return ok, " | ".join(
                f"{m.input_set}: rel L2 {m.rel_l2:.2g}, {m.budget_ratio:.2f}x budget, "
                f"{m.bf16_ratio:.2f}x rms_bf16" for m in g.sets)
        return f

    def lse_not_written_not_checked() -> tuple[bool, str]:
        g = run_gate(O.ReferenceKernel(dev, orc, writes_lse=False), ("seed",))
        return g.passed and not g.sets[0].lse_checked, g.summary()

    check("gate passes the reference kernel (2x4x1024)", perfect)
    check("gate passes a reverse-walking reference", reverse_ok)
    check("gate catches: no O rescale (reverse walk)", bug(O.REF_REVERSE | O.REF_BUG_NO_RESCALE_O))
    check("gate catches: no running-sum rescale", bug(O.REF_REVERSE | O.REF_BUG_NO_RESCALE_L))
    check("gate catches: no O rescale (forward walk)", bug(O.REF_BUG_NO_RESCALE_O))
    check("gate catches: one wrong element at (1,777,2,5)", one_wrong)
    check("gate catches: one unwritten element", one_unwritten)
    check("gate catches: one NaN", one_nan)
    check("gate catches: one wrong LSE at (1,3,500)", one_lse)
    check("gate catches: LSE never written", lse_missing)
    check("gate skips LSE for write_lse=false", lse_not_written_not_checked)
    check("gate catches (budget only): O x 1.015 on rows 0-7 of every 64",
          budget_only(np.arange(shape.S) % 64 < 8, slice(None), 1.015, "16-row blocks"))
    check("gate catches (budget only): O x 1.01 on head-dim columns 0-3",
          budget_only(slice(None), slice(0, 4), 1.01, "head-dim columns"))
    gbufs.free()

    # -- the gate on every kind of problem: the reference passes, rescale bugs and a 1% column
    #    error are caught (the rising sets must rise for GQA, every D and non-causal walks)
    def family_gate(p: Problem) -> tuple[bool, str]:
        sets = ("seed", "rising", "rising_fwd")
        cache = O.ReferenceCache()
        out = []
        with AttnBuffers(dev, p) as bufs:
            def gate(kern: Any) -> GR.GateResult:
                try:
                    return O.gate(dev, kern, p, bufs, 42, sets, oracle=orc, stream=stream,
                                  reference_cache=cache)
                finally:
                    kern.free()
            try:
                g = gate(O.ReferenceKernel(dev, orc))
                ok = g.passed and all(abs(m.bf16_ratio - 1.0) < 1e-3 for m in g.sets)
                out.append(f"reference {'PASS' if g.passed else 'FAIL'}")
                for flags, catching in ((O.REF_REVERSE | O.REF_BUG_NO_RESCALE_O, "rising"),
                                        (O.REF_REVERSE | O.REF_BUG_NO_RESCALE_L, "rising"),
                                        (O.REF_BUG_NO_RESCALE_O, "rising_fwd")):
                    m = gate(O.ReferenceKernel(dev, orc, flags)).by_set[catching]
                    ok &= not m.passed and m.violations > 0
                    out.append(f"bug {flags} on {catching}: {m.violations} violations")
                bad = gate(O.ReferenceKernel(dev, orc, after=scale_after(
                    slice(None), slice(0, 4), 1.01)))
                ok &= all(not m.passed and m.violations == 0 for m in bad.sets)
                out.append("1% on 4 columns: " + ", ".join(
                    f"{m.input_set} {m.budget_ratio:.2f}x budget" for m in bad.sets))
            finally:
                cache.clear()
        return ok, "; ".join(out)

    for p in FAMILY:
        check(f"gate on {p} ({p.kind}, D {p.D}, {'causal' if p.causal else 'non-causal'})",
              lambda p=p: family_gate(p))

    # -- reference runtime and the full gate at the seed shapes
    def ref_time(shp: Problem) -> tuple[bool, str]:
        with AttnBuffers(dev, shp) as bufs:
            o_ref = dev.alloc(bufs.n * 4)
            try:
                O.fill_inputs(orc, bufs, "seed", 42, stream)
                e0, e1 = Event(dev), Event(dev)
                e0.record(stream)
                orc.reference_for(bufs, o_ref.ptr, bufs.lse.ptr, stream)
                e1.record(stream)
                stream.synchronize()
                ms = Event.elapsed_ms(e0, e1)
            finally:
                o_ref.free()
        # FMAs: QK + PV = 2 S^2 D per (b, h), half of it causal; 2 flop per FMA.
        fl = 2.0 * shp.B * shp.Hq * shp.S * shp.S * shp.D * 2 / (2 if shp.causal else 1)
        DETAILS.setdefault("reference_ms", {})[str(shp)] = ms
        return True, f"{ms:.1f} ms ({fl / (ms * 1e9):.1f} TFLOPS FP32)"

    for S in (4096, 8192) if args.quick else (4096, 8192, 16384):
        check(f"reference runtime 4x32x{S}", lambda S=S: ref_time(Problem(4, 32, S)))
    S_f = 8192 if args.quick else 16384
    for p in (Problem(4, 32, S_f, Hkv=8), Problem(4, 32, S_f, D=64),
              Problem(4, 32, S_f, D=256), Problem(4, 32, S_f, causal=False),
              Problem(4, 32, S_f, Hkv=8, D=256, causal=False)):
        check(f"reference runtime {p}", lambda p=p: ref_time(p))

    def full_gate(S: int) -> tuple[bool, str]:
        shp = Shape(4, 32, S)
        with AttnBuffers(dev, shp) as bufs:
            kern = O.ReferenceKernel(dev, orc)
            t0 = time.monotonic()
            try:
                g = O.gate(dev, kern, shp, bufs, 42, oracle=orc, stream=stream)
            finally:
                kern.free()
            dt = time.monotonic() - t0
            t1 = time.monotonic()
            g2 = O.gate(dev, O.ReferenceKernel(dev, orc), shp, bufs, 42, oracle=orc,
                        stream=stream)  # reference now cached
            dt2 = time.monotonic() - t1
        O.clear_reference_cache()
        DETAILS.setdefault("full_gate", {})[S] = dict(result=g.to_dict(), seconds=dt,
                                                     seconds_cached=dt2)
        return g.passed and g2.passed, f"{g.summary()} ({dt:.1f}s, {dt2:.1f}s with cached ref)"

    def compare_time(S: int) -> tuple[bool, str]:
        shp = Shape(4, 32, S)
        with AttnBuffers(dev, shp) as bufs:
            o_ref = dev.alloc(bufs.n * 4)
            scratch = O.CompareScratch(dev, shp)
            try:
                O.fill_inputs(orc, bufs, "seed", 42, stream)
                orc.reference_for(bufs, o_ref.ptr, bufs.lse.ptr, stream)
                orc.f32_to_bf16(o_ref.ptr, bufs.o.ptr, bufs.n, stream)
                O.compare(dev, orc, bufs, o_ref, None, stream, scratch)  # warm-up
                e0, e1 = Event(dev), Event(dev)
                e0.record(stream)
                orc.compare(bufs.o.ptr, o_ref.ptr, shp.B, shp.H, shp.S, 128, None, None, GR.O_ATOL,
                            GR.O_RTOL, GR.LSE_ATOL, GR.LSE_RTOL, scratch.stats.ptr,
                            scratch.blocks.ptr, scratch.cols.ptr, stream)
                e1.record(stream)
                stream.synchronize()
                ms = Event.elapsed_ms(e0, e1)
                t0 = time.monotonic()
                stats, sums = O.compare(dev, orc, bufs, o_ref, None, stream, scratch)
                m = GR.evaluate(stats, shp, "seed", False, budget=sums)
                host_ms = (time.monotonic() - t0) * 1e3
            finally:
                scratch.free()
                o_ref.free()
        gbs = bufs.n * 6 / (ms * 1e-3) / 1e9
        DETAILS.setdefault("compare_ms", {})[S] = dict(kernel_ms=ms, with_readback_ms=host_ms)
        return m.passed, (f"compare kernel {ms:.2f} ms ({gbs:.0f} GB/s of O + O_ref), with "
                          f"read-back and evaluate {host_ms:.1f} ms; {m.brief()}")

    for S in (4096,) if args.quick else (4096, 16384):
        check(f"compare runtime 4x32x{S}", lambda S=S: compare_time(S))

    check("full gate, reference kernel, 4x32x4096", lambda: full_gate(4096))
    if not args.quick:
        check("full gate, reference kernel, 4x32x16384", lambda: full_gate(16384))

    # -- timing a trivial kernel
    class FillKernel:
        writes_lse = False

        def prepare(self, shape: Any, st: Any) -> float:
            return 0.0

        def forward(self, bufs: AttnBuffers, st: Any) -> None:
            orc.poison(bufs.o.ptr, bufs.n, None, 0, st)

    def timing() -> tuple[bool, str]:
        shp = Shape(4, 32, 4096)
        with AttnBuffers(dev, shp) as bufs:
            r = T.time_kernel(dev, FillKernel(), shp, bufs, T.Protocol(10, 50, 2), stream=stream)
        DETAILS["timing_fill"] = r.to_dict()
        gbps = bufs.n * 2 / (r.median_ms * 1e-3) / 1e9
        sane = (0.005 < r.median_ms < 5 and r.min_ms <= r.median_ms <= r.max_ms
                and len(r.samples_ms) == 100 and math.isfinite(r.tflops))
        sb, sa = r.state_before, r.state_after
        return sane, (f"{r.summary()}; fill {gbps:.0f} GB/s; before {sb.temperature_c}C "
                      f"{sb.sm_clock_mhz}MHz {sb.power_w}W/{sb.power_limit_w}W "
                      f"{sb.throttle_reasons}; after {sa.temperature_c}C {sa.sm_clock_mhz}MHz "
                      f"{sa.throttle_reasons}; note {r.nvml_note}")

    check("time_kernel on a fill kernel (4x32x4096, 10/50/2)", timing)
    return finish(args)


def elems(shape: SimpleNamespace, lse: bool = False) -> int:
    return shape.B * shape.H * shape.S * (1 if lse else 128)


def finish(args: argparse.Namespace) -> int:
    if args.json:
        args.json.write_text(json.dumps({"rows": ROWS, "details": DETAILS}, indent=1,
                                        default=str))
    w = max(len(r[0]) for r in ROWS) if ROWS else 10
    print("\n" + "=" * 100)
    print(f"{'check':<{w}}  result  detail")
    for name, res, detail in ROWS:
        print(f"{name:<{w}}  {res:<6}  {detail}")
    failed = sum(r[1] != "PASS" for r in ROWS)
    print(f"{len(ROWS) - failed}/{len(ROWS)} passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
