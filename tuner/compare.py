"""``fa-tune compare``: fa-tune's kernel beside its peers, in one process, on the same inputs.

Every backend (fa-tune's kernel through its C ABI, FlashAttention-3, cuDNN SDPA,
FlashAttention-2, our Triton kernel) gets, per shape:

1. the same torch tensors (seed 42; Q, K uniform in [-2, 2], V uniform in [-1, 1]; BSHD, BF16);
2. the same gate before any timing: |out - ref| <= 0.05 + 0.1 |ref| on sampled full heads against
   an FP32 torch reference, and no NaN/Inf anywhere in O. A backend that fails is reported as
   failed and gets no numbers; nothing is substituted;
3. the same protocol as ``fa-tune run`` (tuner.measure.timing): per round, the bounded NVML temperature
   wait (<= 65 C; so also right before each backend), ``settle_s`` seconds of launches (so each
   round starts at the card's power-capped steady state) and GPU-state snapshots, ``warmup``
   launches, then ``repeat`` launches each bracketed by CUDA events (torch's, on torch's current
   stream); ``rounds`` rounds; headline = median of the round medians; every sample kept;
4. the gate again on the output of the last timed launch (catches races that show only under
   back-to-back load).

The reference peer (FA3 when present, else the first available peer) runs first and last on each
shape, and both medians are stored as the drift check. Ratios are FA3's time over the backend's
time (>1 means faster than FA3), with FA3's time the mean of its two medians.

This module imports torch only inside functions: ``tuner`` and the CLI import without it. The
writers (``write_outputs`` and friends) need no torch and no GPU.
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tuner.config import SEED_SHAPES, Shape
from tuner.errors import FaTuneError, GpuError
from tuner.peers import DEFAULT_PEERS, PEER_NAMES, REFERENCE_PEER, Peer, make_peer
from tuner.peers.base import dist_version

SCHEMA_VERSION = 1
GATE_ATOL = 0.05
GATE_RTOL = 0.1
SUMMARY_COLUMNS = (
    "shape",
    "B",
    "H",
    "S",
    "backend",
    "label",
    "status",
    "median_ms",
    "min_ms",
    "max_ms",
    "tflops",
    "tflops_min",
    "tflops_max",
    "ratio_to_fa3",
    "max_abs_err",
    "reason",
)

Log = Callable[[str], None]


@dataclass(frozen=True)
class Protocol:
    """The seeds' timing protocol (tuner.measure.timing's) plus the compare-only knobs."""

    warmup: int = 50
    repeat: int = 200
    rounds: int = 3
    temp_limit_c: int = 65
    # Each wait (before every round, as in tuner.measure.timing) is bounded, and so is their sum over
    # the suite: a card that idles hot delays the comparison, it never outlives a 10-minute call.
    temp_wait_max_s: float = 30.0
    temp_wait_total_s: float = 180.0
    seed: int = 42
    gate_heads: int = 3
    # Seconds of back-to-back launches after each round's temperature wait and before its
    # warm-up, so every backend is timed at the card's power-capped steady state. Without it
    # the first backends at S=4096 (0.2-s rounds) ran while the board power was still ramping
    # to its 700 W cap, and one round caught the clock overshooting down to 1455 MHz
    # (docs/PERF.md, step 18). 0 gives the seeds' protocol exactly.
    settle_s: float = 2.0

    def __post_init__(self) -> None:
        self.timing_protocol()  # the same validation (and messages) as fa-tune run
        if self.gate_heads < 1:
            raise FaTuneError(f"gate heads must be >= 1 (got {self.gate_heads})")
        if not 0.0 <= self.settle_s <= 60.0:
            raise FaTuneError(f"--settle-s must be between 0 and 60 seconds (got {self.settle_s})")

    def timing_protocol(self) -> Any:
        from tuner.measure import timing

        return timing.Protocol(warmup=self.warmup, repeat=self.repeat, rounds=self.rounds)


@dataclass
class Backend:
    """One row of the comparison: a peer object plus what we learned about it up front."""

    name: str
    label: str
    role: str  # "kernel" (fa-tune's .so) or "peer"
    peer: Peer
    available: bool = False
    reason: str = ""
    version: str = ""


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


# ---- backends --------------------------------------------------------------------------------
def parse_backends(spec: str | Sequence[str] | None) -> list[str]:
    """'fa3,cudnn' / ['fa3', 'cudnn'] / 'all' / None (the default set) -> peer names."""
    if spec is None:
        return list(DEFAULT_PEERS)
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names: list[str] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        if item == "all":
            names.extend(PEER_NAMES)
        elif item in ("fa-tune", "fatune"):
            continue  # the kernel is included whenever a .so is given
        elif item in PEER_NAMES:
            names.append(item)
        else:
            raise FaTuneError(f"unknown backend '{item}': choose from {', '.join(PEER_NAMES)}")
    return list(dict.fromkeys(names))


def _kernel_specs(so: Any) -> list[tuple[Path, str | None]]:
    """None | path | [(path, label), ...] -> [(path, label)]."""
    if so is None:
        return []
    if isinstance(so, (str, Path)):
        return [(Path(so), None)]
    out: list[tuple[Path, str | None]] = []
    for item in so:
        if isinstance(item, (str, Path)):
            out.append((Path(item), None))
        else:
            path, label = item
            out.append((Path(path), label))
    return out


def make_backends(so: Any, peer_names: Sequence[str]) -> list[Backend]:
    """Kernel backends first, then peers in the order given; availability probed once each."""
    from tuner.peers.fatune import FaTunePeer

    backends: list[Backend] = []
    specs = _kernel_specs(so)
    for path, label in specs:
        if label is None and len(specs) > 1:
            label = path.stem
        p = FaTunePeer(path, label)
        taken = {b.name for b in backends}
        n = 2
        while p.name in taken:  # two kernels with one label must stay two rows
            p = FaTunePeer(path, f"{label or path.stem}#{n}")
            n += 1
        backends.append(Backend(p.name, p.label, "kernel", p))
    for name in peer_names:
        p = make_peer(name)
        backends.append(Backend(p.name, p.label, "peer", p))
    for b in backends:
        try:
            b.available, b.reason = b.peer.available()
        except Exception as exc:  # a probe must not take the whole comparison down
            b.available, b.reason = False, _one_line(exc)
        if b.available:
            try:
                b.version = b.peer.version()
            except Exception as exc:
                b.version = f"unknown ({_one_line(exc)})"
    return backends


# ---- GPU state (NVML, through tuner.measure.timing) -------------------------------------------------
class WaitBudget:
    """tuner.measure.timing's bounded temperature wait, with a cap on the suite's total waiting."""

    def __init__(self, nvml: Any, protocol: Protocol) -> None:
        self.nvml = nvml
        self.protocol = protocol
        self.left_s = protocol.temp_wait_total_s

    def wait(self) -> Any:
        from tuner.measure import timing

        bound = max(0.0, min(self.protocol.temp_wait_max_s, self.left_s))
        tw = timing.wait_for_temperature(self.nvml.temperature, self.protocol.temp_limit_c, bound)
        self.left_s -= tw.waited_s
        return tw


# ---- inputs, reference and gate -----------------------------------------------------------
def make_inputs(shape: Shape, seed: int) -> tuple[Any, Any, Any]:
    """The seeds' inputs: Q, K uniform in [-2, 2], V uniform in [-1, 1]; BSHD BF16 on the GPU."""
    import torch

    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    dims = (shape.B, shape.S, shape.H, Shape.D)

    def uniform(lo: float, hi: float) -> Any:
        t = torch.empty(dims, device="cuda", dtype=torch.float32)
        t.uniform_(lo, hi, generator=g)
        return t.to(torch.bfloat16)

    return uniform(-2.0, 2.0), uniform(-2.0, 2.0), uniform(-1.0, 1.0)


def sample_heads(shape: Shape, n: int, seed: int) -> list[tuple[int, int]]:
    """n distinct (b, h): the first and last head always, the rest seeded-random."""
    all_heads = [(b, h) for b in range(shape.B) for h in range(shape.H)]
    picks = [all_heads[0], all_heads[-1]]
    rest = [x for x in all_heads if x not in picks]
    random.Random(seed).shuffle(rest)
    return list(dict.fromkeys(picks + rest))[: min(n, len(all_heads))]


def reference_head(q: Any, k: Any, v: Any, b: int, h: int, chunk: int = 2048) -> tuple[Any, Any]:
    """FP32 causal attention of one full head: ([S, D] output, [S] natural-log LSE)."""
    import torch

    qh, kh, vh = (t[b, :, h, :].float() for t in (q, k, v))
    S, D = qh.shape
    scale = 1.0 / math.sqrt(D)
    out = torch.empty((S, D), device=q.device, dtype=torch.float32)
    lse = torch.empty((S,), device=q.device, dtype=torch.float32)
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # a true FP32 reference, not TF32
    try:
        for r0 in range(0, S, chunk):
            r1 = min(r0 + chunk, S)
            s = (qh[r0:r1] @ kh[:r1].T) * scale  # causal: columns past r1 are never kept
            rows = torch.arange(r0, r1, device=q.device)[:, None]
            cols = torch.arange(r1, device=q.device)[None, :]
            s.masked_fill_(cols > rows, float("-inf"))
            lse[r0:r1] = torch.logsumexp(s, dim=1)
            out[r0:r1] = torch.exp(s - lse[r0:r1, None]) @ vh[:r1]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    return out, lse


def gate(out: Any, lse: Any | None, refs: dict[tuple[int, int], tuple[Any, Any]]) -> dict[str, Any]:
    """The compare gate: no NaN/Inf in O; |err| <= 0.05 + 0.1|ref| on every sampled head."""
    import torch

    finite = bool(torch.isfinite(out).all().item())
    max_abs = 0.0
    worst = 0.0  # max of |err| / tolerance; <= 1 passes
    lse_max_abs: float | None = None
    bad_elems = 0
    B, S, H = out.shape[0], out.shape[1], out.shape[2]
    if lse is not None and tuple(lse.shape) != (B, H, S):
        lse = None  # informational only: a peer with another LSE layout is not failed for it
    for (b, h), (ref_o, ref_lse) in refs.items():
        got = out[b, :, h, :].float()
        err = (got - ref_o).abs()
        tol = GATE_ATOL + GATE_RTOL * ref_o.abs()
        max_abs = max(max_abs, float(torch.nan_to_num(err, nan=float("inf")).max().item()))
        worst = max(worst, float(torch.nan_to_num(err / tol, nan=float("inf")).max().item()))
        bad_elems += int((~(err <= tol)).sum().item())  # NaN compares False: counted bad
        if lse is not None:
            e = float((lse[b, h, :].float() - ref_lse).abs().max().item())
            lse_max_abs = e if lse_max_abs is None else max(lse_max_abs, e)
    passed = finite and bad_elems == 0
    if not finite:
        why = "O holds NaN or Inf"
    elif bad_elems:
        why = f"{bad_elems} elements outside |err| <= {GATE_ATOL} + {GATE_RTOL}|ref|"
    else:
        why = "ok"
    return {
        "passed": passed,
        "summary": why,
        "finite": finite,
        "max_abs_err": max_abs,
        "worst_err_over_tol": worst,
        "bad_elements": bad_elems,
        "heads_checked": [list(x) for x in refs],
        "lse_max_abs_err": lse_max_abs,  # informational: not every peer returns an LSE
    }


# ---- timing ------------------------------------------------------------------------------
def settle(run: Callable[[], Any], seconds: float, sync: Callable[[], Any]) -> int:
    """Launch ``run`` back to back for about ``seconds`` of GPU time; returns the launches.

    Synchronizes every few launches so the host never queues far ahead of the GPU (the wall
    clock then measures GPU time, not how fast the host enqueues).
    """
    if seconds <= 0:
        return 0
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(4):
            run()
        n += 4
        sync()
    return n


def time_launches(
    run: Callable[[], Any], shape: Shape, protocol: Protocol, waits: WaitBudget
) -> dict[str, Any]:
    """tuner.measure.timing's protocol with torch CUDA events on torch's current stream.

    Per round: bounded temperature wait, ``settle_s`` seconds of launches (the power ramp),
    NVML state, ``warmup`` launches, then ``repeat`` launches each bracketed by its own event
    pair. Aggregation (median of round medians, min/max over every sample) is tuner.measure.timing's
    own, so compare and ``fa-tune run`` report alike.
    """
    import torch

    from tuner.measure import timing

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(protocol.repeat)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(protocol.repeat)]
    rounds = []
    for r in range(protocol.rounds):
        tw = waits.wait()
        settle(run, protocol.settle_s, torch.cuda.synchronize)
        before = waits.nvml.state()
        for _ in range(protocol.warmup):
            run()
        for s, e in zip(starts, ends, strict=True):
            s.record()
            run()
            e.record()
        torch.cuda.synchronize()  # a kernel fault surfaces here, not as a number
        samples = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
        rounds.append(timing.make_round(r, samples, tw, before, waits.nvml.state()))
    res = timing.summarize_rounds(
        protocol.timing_protocol(), shape, rounds, protocol.temp_limit_c, waits.nvml.note
    )
    out = res.to_dict()
    out["tflops_min"] = shape.tflops(res.max_ms)
    return out


def measure(
    backend: Backend,
    shape: Shape,
    inputs: tuple[Any, Any, Any],
    refs: dict[tuple[int, int], tuple[Any, Any]],
    protocol: Protocol,
    waits: WaitBudget,
    position: str | None = None,
) -> dict[str, Any]:
    """Gate then time one backend on one shape; never raises (failures become a status)."""
    import torch

    run: dict[str, Any] = {
        "backend": backend.name,
        "label": backend.label,
        "position": position,
        "status": "unavailable",
        "reason": backend.reason,
        "gate": None,
        "gate_after": None,
        "timing": None,
    }
    if not backend.available:
        return run
    peer = backend.peer
    try:
        peer.prepare(*inputs)
        out = peer.run()
        torch.cuda.synchronize()
        run["gate"] = gate(out, peer.lse(), refs)
        del out
        if not run["gate"]["passed"]:
            run["status"], run["reason"] = "gate_failed", run["gate"]["summary"]
            return run
        timing = time_launches(peer.run, shape, protocol, waits)
        # One more launch straight after the timed ones (hot GPU, queue full) must still pass:
        # a kernel that is right only when the GPU is idle has no valid timing.
        out = peer.run()
        torch.cuda.synchronize()
        run["gate_after"] = gate(out, peer.lse(), refs)
        del out
        if not run["gate_after"]["passed"]:
            run["status"] = "gate_failed"
            run["reason"] = f"after timing: {run['gate_after']['summary']}"
            return run
        run["timing"] = timing
        run["status"], run["reason"] = "ok", ""
    except Exception as exc:  # one backend's failure is a row, not the end of the comparison
        run["status"], run["reason"] = "error", _one_line(exc)
    finally:
        run["details"] = _safe_details(peer)
        peer.release()
    return run


def _safe_details(peer: Peer) -> dict[str, Any]:
    try:
        return peer.details()
    except Exception as exc:
        return {"details_error": _one_line(exc)}


# ---- the suite ---------------------------------------------------------------------------
def versions() -> dict[str, Any]:
    v: dict[str, Any] = {
        "python": platform.python_version(),
        "fa_tune": dist_version("fa-tune"),
        "torch": dist_version("torch"),
        "triton": dist_version("triton"),
        "flash_attn_4": dist_version("flash-attn-4", "fa4"),
        "nvidia_cutlass_dsl": dist_version("nvidia-cutlass-dsl"),
        "quack_kernels": dist_version("quack-kernels"),
    }
    try:
        import torch

        v["torch_cuda"] = torch.version.cuda
        v["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        pass
    return v


def _pci_bus_id(torch: Any) -> str | None:
    """NVML's bus id of torch's device, so NVML reads the GPU we time even when
    CUDA_VISIBLE_DEVICES reorders devices; None when torch does not expose it."""
    try:
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        return f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    except Exception:
        return None


def gpu_static(nvml: Any) -> dict[str, Any]:
    state = nvml.state()
    info: dict[str, Any] = {
        "driver_version": nvml.driver_version(),
        "power_limit_w": state.power_limit_w,
        "nvml_note": nvml.note,
    }
    try:
        import torch

        p = torch.cuda.get_device_properties(0)
        info.update(
            name=p.name,
            sm_count=p.multi_processor_count,
            cc=[p.major, p.minor],
            memory_gib=round(p.total_memory / 2**30, 1),
        )
    except Exception as exc:
        info["torch_error"] = _one_line(exc)
    return info


def run_suite(
    backends: list[Backend],
    shapes: Sequence[Shape],
    protocol: Protocol,
    log: Log = _stderr,
) -> dict[str, Any]:
    """Measure every backend on every shape; return the results.json payload (no files)."""
    try:
        import torch
    except ImportError as exc:
        raise GpuError(
            "fa-tune compare needs torch with CUDA: pip install 'fa-tune[peers]'"
        ) from exc
    if not torch.cuda.is_available():
        raise GpuError("fa-tune compare needs a CUDA GPU visible to torch; none was found")

    from tuner.measure import timing

    nvml = timing.Nvml(_pci_bus_id(torch), index=torch.cuda.current_device())
    waits = WaitBudget(nvml, protocol)
    usable = [b for b in backends if b.available]
    ref = next((b for b in usable if b.name == REFERENCE_PEER), None)
    # Drift is watched on FA3, else on the first other peer, else on the first kernel.
    drift_ref = (
        ref or next((b for b in usable if b.role == "peer"), None) or next(iter(usable), None)
    )
    for b in backends:
        log(f"[compare] {b.name}: {'ok, ' + b.version if b.available else 'skipped: ' + b.reason}")

    payload: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "kind": "compare",
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "protocol": asdict(protocol),
        "inputs": {
            "seed": protocol.seed,
            "layout": "BSHD contiguous, BF16, D=128, causal",
            "q": "uniform[-2, 2]",
            "k": "uniform[-2, 2]",
            "v": "uniform[-1, 1]",
            "generator": "torch CUDA generator, FP32 draws rounded to BF16",
        },
        "gate": {
            "rule": f"no NaN/Inf in O; |out - ref| <= {GATE_ATOL} + {GATE_RTOL}*|ref| on "
            f"{protocol.gate_heads} full heads",
            "reference": "FP32 torch (TF32 off), per head",
            "checked": "before timing and on the last timed launch's output",
        },
        "ratio": "FA3 median / backend median (>1 = faster than FA3); FA3 median = mean of its "
        "before/after medians",
        "reference_peer": ref.name if ref else None,
        "drift_peer": drift_ref.name if drift_ref else None,
        "gpu": gpu_static(nvml),
        "versions": versions(),
        "backends": [
            {
                "name": b.name,
                "label": b.label,
                "role": b.role,
                "available": b.available,
                "reason": b.reason,
                "version": b.version,
            }
            for b in backends
        ],
        "artifacts": [],
        "shapes": [],
    }
    for b in backends:
        if b.role == "kernel":
            art: dict[str, Any] = {"name": b.name, "so_path": str(getattr(b.peer, "so_path", ""))}
            if b.available:
                art.update(_safe_details(b.peer))
            payload["artifacts"].append(art)

    for shape in shapes:
        log(f"[compare] shape {shape}: inputs (seed {protocol.seed}) and FP32 reference")
        inputs = make_inputs(shape, protocol.seed)
        heads = sample_heads(shape, protocol.gate_heads, protocol.seed)
        refs = {bh: reference_head(*inputs, *bh) for bh in heads}
        order: list[tuple[Backend, str | None]] = []
        if drift_ref is not None:
            order.append((drift_ref, "before"))
        order += [(b, None) for b in backends if b is not drift_ref]
        if drift_ref is not None:
            order.append((drift_ref, "after"))
        runs = []
        for b, pos in order:
            r = measure(b, shape, inputs, refs, protocol, waits, pos)
            runs.append(r)
            log(f"[compare]   {_run_line(r)}")
        entry: dict[str, Any] = {
            **shape.to_dict(),
            "shape": str(shape),
            "flops": shape.flops,
            "heads_checked": [list(h) for h in heads],
            "runs": runs,
        }
        entry["drift"] = _drift(runs)
        payload["shapes"].append(entry)
        del inputs, refs
        torch.cuda.empty_cache()

    payload["summary"] = summarize(payload)
    requested_ok = all(
        r["status"] in ("ok", "unavailable") for s in payload["shapes"] for r in s["runs"]
    )
    payload["status"] = "passed" if requested_ok else "failed"
    return payload


def _run_line(r: dict[str, Any]) -> str:
    name = r["backend"] + (f" ({r['position']})" if r.get("position") else "")
    if r["status"] != "ok":
        return f"{name}: {r['status']}: {r['reason']}"
    t = r["timing"]
    return (
        f"{name}: {t['median_ms']:.3f} ms ({t['min_ms']:.3f}-{t['max_ms']:.3f}), "
        f"{t['tflops']:.0f} TFLOPS, max|err| {r['gate']['max_abs_err']:.4f}"
    )


def _drift(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    ends = {r["position"]: r for r in runs if r.get("position")}
    if "before" not in ends:
        return None
    before, after = ends.get("before"), ends.get("after")
    out: dict[str, Any] = {"backend": before["backend"]}
    for key, r in (("before", before), ("after", after)):
        out[f"{key}_ms"] = r["timing"]["median_ms"] if r and r.get("timing") else None
    if out["before_ms"] and out["after_ms"]:
        out["change_pct"] = 100.0 * (out["after_ms"] / out["before_ms"] - 1.0)
    return out


def summarize(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (shape, backend); the drift peer's two runs merge into one row."""
    rows: list[dict[str, Any]] = []
    ref_name = payload.get("reference_peer")
    for s in payload["shapes"]:
        shape = Shape(s["B"], s["H"], s["S"])
        merged: dict[str, list[dict[str, Any]]] = {}
        for r in s["runs"]:
            merged.setdefault(r["backend"], []).append(r)
        shape_rows = []
        for name, runs in merged.items():
            ok = [r for r in runs if r["status"] == "ok"]
            row: dict[str, Any] = {
                "shape": s["shape"],
                "B": s["B"],
                "H": s["H"],
                "S": s["S"],
                "backend": name,
                "label": runs[0]["label"],
                "median_ms": None,
                "min_ms": None,
                "max_ms": None,
                "tflops": None,
                "tflops_min": None,
                "tflops_max": None,
                "ratio_to_fa3": None,
                "max_abs_err": None,
            }
            if len(ok) == len(runs):
                row["status"], row["reason"] = "ok", ""
                row["median_ms"] = statistics.fmean(r["timing"]["median_ms"] for r in ok)
                row["min_ms"] = min(r["timing"]["min_ms"] for r in ok)
                row["max_ms"] = max(r["timing"]["max_ms"] for r in ok)
                row["tflops"] = shape.tflops(row["median_ms"])
                row["tflops_min"] = shape.tflops(row["max_ms"])
                row["tflops_max"] = shape.tflops(row["min_ms"])
                row["max_abs_err"] = max(r["gate"]["max_abs_err"] for r in ok)
            else:
                bad = next(r for r in runs if r["status"] != "ok")
                row["status"], row["reason"] = bad["status"], bad["reason"]
                if bad.get("gate"):
                    row["max_abs_err"] = bad["gate"]["max_abs_err"]
            shape_rows.append(row)
        ref_row = next((r for r in shape_rows if r["backend"] == ref_name), None)
        if ref_row and ref_row["median_ms"]:
            for r in shape_rows:
                if r["median_ms"]:
                    r["ratio_to_fa3"] = ref_row["median_ms"] / r["median_ms"]
        rows += shape_rows
    return rows


# ---- outputs (no torch needed) -----------------------------------------------------------
def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def new_result_dir(root: str | Path) -> Path:
    """``root/<UTC timestamp>/`` through tuner.store, the one owner of result-folder names."""
    from tuner.store import new_result_dir as store_new_result_dir

    return store_new_result_dir(root)


def write_summary_csv(payload: dict[str, Any], path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SUMMARY_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for row in payload.get("summary", []):
            w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in SUMMARY_COLUMNS})
    os.replace(tmp, path)


def _shape_headers(payload: dict[str, Any]) -> list[tuple[str, str]]:
    """[(shape key, column title)]; 'S=4096' when B and H are the same for every shape."""
    shapes = payload.get("shapes", [])
    same_bh = len({(s["B"], s["H"]) for s in shapes}) <= 1
    return [(s["shape"], f"S={s['S']}" if same_bh else s["shape"]) for s in shapes]


def _backend_order(payload: dict[str, Any]) -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    for row in payload.get("summary", []):
        seen.setdefault(row["backend"], row["label"])
    return list(seen.items())


def summary_markdown(payload: dict[str, Any]) -> str:
    rows = {(r["shape"], r["backend"]): r for r in payload.get("summary", [])}
    cols = _shape_headers(payload)
    order = _backend_order(payload)
    gpu = payload.get("gpu") or {}
    proto = payload.get("protocol") or {}
    ver = payload.get("versions") or {}
    ref = payload.get("reference_peer")
    lines = [
        "# fa-tune compare",
        "",
        f"- date: {payload.get('created_utc', '?')}; status: **{payload.get('status', '?')}**",
        f"- GPU: {gpu.get('name') or gpu.get('torch_name', '?')}, driver "
        f"{gpu.get('driver_version', '?')}, power limit {gpu.get('power_limit_w', '?')} W",
        f"- torch {ver.get('torch', '?')} (CUDA {ver.get('torch_cuda', '?')}, cuDNN "
        f"{ver.get('cudnn', '?')}), triton {ver.get('triton', '?')}, flash-attn-4 "
        f"{ver.get('flash_attn_4', '?')}",
        f"- protocol: {proto.get('warmup', '?')} warm-up, {proto.get('repeat', '?')} timed "
        f"launches, {proto.get('rounds', '?')} rounds, CUDA events, median of round medians; "
        f"NVML wait (bounded) to <= {proto.get('temp_limit_c', '?')} C before each round",
        f"- inputs: seed {proto.get('seed', '?')}, Q/K uniform [-2, 2], V uniform [-1, 1], BSHD "
        f"BF16; every backend gated ({(payload.get('gate') or {}).get('rule', '?')})",
        "- TFLOPS = 2*B*H*S^2*D / time (not halved for causality, as in the seeds)",
        "",
        "| implementation | " + " | ".join(f"{t} ms / TFLOPS" for _, t in cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for name, label in order:
        cells = []
        for key, _ in cols:
            r = rows.get((key, name))
            cells.append(_cell(r, lambda r: f"{r['median_ms']:.3f} / {r['tflops']:.0f}"))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [""]
    if ref:
        lines += [
            "Speed relative to FlashAttention-3 (FA3 time / backend time; > 1 is faster):",
            "",
            "| implementation | " + " | ".join(t for _, t in cols) + " |",
            "|---|" + "---|" * len(cols),
        ]
        for name, label in order:
            cells = [
                _cell(
                    rows.get((key, name)),
                    lambda r: f"{r['ratio_to_fa3']:.3f}x" if r["ratio_to_fa3"] else "-",
                )
                for key, _ in cols
            ]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    else:
        lines += ["FlashAttention-3 was not available: no ratios to FA3.", ""]
    drifts = [(s["shape"], s.get("drift")) for s in payload.get("shapes", []) if s.get("drift")]
    if drifts:
        lines.append(f"Drift check ({drifts[0][1]['backend']} first and last on each shape):")
        lines.append("")
        for shape, d in drifts:
            b, a = d.get("before_ms"), d.get("after_ms")
            ch = d.get("change_pct")
            lines.append(
                f"- {shape}: before {_ms(b)}, after {_ms(a)}"
                + (f" ({ch:+.2f}%)" if ch is not None else "")
            )
        lines.append("")
    hot = [
        f"{r['backend']} on {s['shape']}"
        for s in payload.get("shapes", [])
        for r in s.get("runs", [])
        if (r.get("timing") or {}).get("temp_wait_bound_hit")
    ]
    if hot:
        lines += [f"Temperature wait bound hit (GPU above the limit) for: {', '.join(hot)}.", ""]
    notes = []
    for b in payload.get("backends", []):
        if not b["available"]:
            notes.append(f"- {b['label']}: not run ({b['reason']})")
    for r in payload.get("summary", []):
        if r["status"] not in ("ok", "unavailable"):
            notes.append(f"- {r['label']} on {r['shape']}: {r['status']} ({r['reason']})")
    if notes:
        lines += ["Not measured:", "", *notes, ""]
    for a in payload.get("artifacts", []):
        if a.get("sha256"):
            lines.append(f"- {a['name']} artifact: {a.get('so_path')} (sha256 {a['sha256']})")
    return "\n".join(lines).rstrip() + "\n"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f} ms"


def _cell(r: dict[str, Any] | None, fmt: Callable[[dict[str, Any]], str]) -> str:
    if r is None:
        return "-"
    if r["status"] == "ok":
        return fmt(r)
    return {"unavailable": "not installed", "gate_failed": "gate failed"}.get(
        r["status"], r["status"]
    )


def write_chart(payload: dict[str, Any], path: Path) -> bool:
    """Grouped bars of TFLOPS per shape per backend, min-max whiskers, zero-based axis.

    Returns False (and writes nothing) when matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # headless: no display on GPU hosts or CI
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = {(r["shape"], r["backend"]): r for r in payload.get("summary", [])}
    cols = _shape_headers(payload)
    order = [
        (n, lbl)
        for n, lbl in _backend_order(payload)
        if any((rows.get((k, n)) or {}).get("status") == "ok" for k, _ in cols)
    ]
    fig, ax = plt.subplots(figsize=(max(7.0, 1.2 + 0.45 * len(cols) * max(len(order), 1)), 5.6))
    width = 0.8 / max(len(order), 1)
    for i, (name, label) in enumerate(order):
        xs, ys, lo, hi = [], [], [], []
        for j, (key, _) in enumerate(cols):
            r = rows.get((key, name))
            if r and r["status"] == "ok":
                xs.append(j - 0.4 + width * (i + 0.5))
                ys.append(r["tflops"])
                lo.append(r["tflops"] - r["tflops_min"])
                hi.append(r["tflops_max"] - r["tflops"])
        bars = ax.bar(
            xs, ys, width, label=label, yerr=[lo, hi], capsize=3, error_kw={"elinewidth": 1}
        )
        for bar, y in zip(bars, ys, strict=True):
            ax.annotate(
                f"{y:.0f}",
                (bar.get_x() + bar.get_width() / 2, 0),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                fontsize=7,
                color="white",
            )
    ax.set_xticks(range(len(cols)), [t for _, t in cols])
    ax.set_ylim(bottom=0)  # zero-based: bar lengths compare honestly
    ax.set_ylabel("TFLOPS (2·B·H·S²·D / median time)")
    gpu = (payload.get("gpu") or {}).get("name") or "GPU"
    shapes = payload.get("shapes") or []
    bh = {(s["B"], s["H"]) for s in shapes}
    bh_text = f", B={shapes[0]['B']}, H={shapes[0]['H']}" if len(bh) == 1 else ""
    ax.set_title(
        f"causal FlashAttention forward, BF16, D=128{bh_text}\n"
        f"{gpu}; bar = median, whiskers = min-max",
        fontsize=9,
    )
    # Legend under the plot: peer labels are long, and a side legend squeezes the bars.
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=130)
    plt.close(fig)
    os.replace(tmp, path)
    return True


def write_outputs(payload: dict[str, Any], result_dir: str | Path) -> dict[str, Path]:
    """results.json, summary.csv, summary.md and chart.png (when matplotlib exists)."""
    d = Path(result_dir)
    d.mkdir(parents=True, exist_ok=True)
    paths = {"json": d / "results.json", "csv": d / "summary.csv", "md": d / "summary.md"}
    _atomic_write(paths["json"], json.dumps(payload, indent=1, default=str) + "\n")
    write_summary_csv(payload, paths["csv"])
    _atomic_write(paths["md"], summary_markdown(payload))
    if write_chart(payload, d / "chart.png"):
        paths["png"] = d / "chart.png"
    return paths


# ---- entry points --------------------------------------------------------------------------
def run_compare(
    so_path_or_none: Any,
    shapes: Sequence[Shape | str] | None = None,
    backends: str | Sequence[str] | None = None,
    protocol: Protocol | None = None,
    results_root: str | Path | None = None,
    log: Log = _stderr,
) -> dict[str, Any]:
    """Run the comparison and write its result folder; return the payload.

    so_path_or_none: one built kernel .so, a list of paths or (path, label) pairs, or None for
    peers only. shapes: Shape objects or 'BxHxS' strings (default: the seed shapes). backends:
    peer names ('fa3,cudnn,fa2,triton' by default). The payload gains 'result_dir' and 'files'.
    """
    shape_list = [s if isinstance(s, Shape) else Shape.parse(s) for s in (shapes or SEED_SHAPES)]
    protocol = protocol or Protocol()
    if results_root is None:
        from tuner import _paths

        results_root = _paths.results_root()
    for path, _ in _kernel_specs(so_path_or_none):
        if not path.is_file():
            raise FaTuneError(f"kernel library {path} does not exist; build it first")
    backend_objs = make_backends(so_path_or_none, parse_backends(backends))
    payload = run_suite(backend_objs, shape_list, protocol, log)
    d = new_result_dir(results_root)
    files = write_outputs(payload, d)
    payload["result_dir"] = str(d)
    payload["files"] = {k: str(v) for k, v in files.items()}
    return payload


def compare_command(
    so_path: str | Path | None,
    shapes: Sequence[str] | None,
    backends: str | None,
    warmup: int = 50,
    repeat: int = 200,
    rounds: int = 3,
    results_root: str | Path | None = None,
    console: Any = None,
    log: Log | None = None,
    settle_s: float = Protocol.settle_s,
) -> dict[str, Any]:
    """What ``fa-tune compare`` calls once it has resolved --study/--config/--preset to a .so.

    Prints the summary table (rich, when a console is given) and the result folder, and returns
    the payload (``payload["status"]`` is "failed" when a backend errored or failed its gate;
    ``payload["result_dir"]`` is the folder). Raises FaTuneError for user errors.
    """
    if log is None:
        log = (lambda m: console.print(f"[dim]{m}[/]")) if console is not None else _stderr
    payload = run_compare(
        so_path,
        list(shapes) if shapes else None,
        backends,
        Protocol(warmup=warmup, repeat=repeat, rounds=rounds, settle_s=settle_s),
        results_root,
        log=log,
    )
    if console is not None:
        console.print(rich_table(payload))
        console.print(f"results: {payload['result_dir']}", soft_wrap=True)
    else:
        print(format_table(payload))
        print(f"results: {payload['result_dir']}")
    return payload


def rich_table(payload: dict[str, Any]) -> Any:
    from rich.table import Table

    cols = _shape_headers(payload)
    rows = {(r["shape"], r["backend"]): r for r in payload.get("summary", [])}
    t = Table(title="fa-tune compare: median ms / TFLOPS (x FA3)")
    t.add_column("implementation")
    for _, title in cols:
        t.add_column(title, justify="right")
    for name, label in _backend_order(payload):
        t.add_row(label, *(_cell(rows.get((k, name)), _ms_tflops_ratio) for k, _ in cols))
    return t


def _ms_tflops_ratio(r: dict[str, Any]) -> str:
    ratio = f" ({r['ratio_to_fa3']:.2f}x)" if r.get("ratio_to_fa3") else ""
    return f"{r['median_ms']:.3f} / {r['tflops']:.0f}{ratio}"


def format_table(payload: dict[str, Any]) -> str:
    """Plain-text table (median ms, min, max, TFLOPS, ratio to FA3), one line per row."""
    head = (
        f"{'shape':<12} {'backend':<28} {'median':>9} {'min':>9} {'max':>9} {'TFLOPS':>7} "
        f"{'xFA3':>7}  status"
    )
    lines = [head, "-" * len(head)]
    for r in payload.get("summary", []):
        if r["status"] == "ok":
            ratio = f"{r['ratio_to_fa3']:.3f}" if r.get("ratio_to_fa3") else "-"
            lines.append(
                f"{r['shape']:<12} {r['backend'][:28]:<28} {r['median_ms']:>9.4f} "
                f"{r['min_ms']:>9.4f} {r['max_ms']:>9.4f} {r['tflops']:>7.1f} {ratio:>7}  ok"
            )
        else:
            lines.append(
                f"{r['shape']:<12} {r['backend'][:28]:<28} {'':>9} {'':>9} {'':>9} "
                f"{'':>7} {'':>7}  {r['status']}: {r['reason']}"
            )
    for s in payload.get("shapes", []):
        d = s.get("drift")
        if d and d.get("change_pct") is not None:
            lines.append(
                f"drift {s['shape']}: {d['backend']} {d['before_ms']:.4f} -> "
                f"{d['after_ms']:.4f} ms ({d['change_pct']:+.2f}%)"
            )
    return "\n".join(lines)
