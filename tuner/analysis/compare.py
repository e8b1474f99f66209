"""``fa-tune compare``: fa-tune's kernel beside its peers, in one process, on the same inputs.

Every backend (fa-tune's kernel through its C ABI, FlashAttention-3, cuDNN SDPA,
FlashAttention-2, our Triton kernel) goes through the one measurement path
(``tuner.measure.bench.Bench``), so per problem (``tuner.problem.Problem``: MHA/GQA/MQA, head
dim 64/128/256, causal or not, S_q queries over S_k keys, q/k/v layout; the ``--shape`` text
``BxHq[/Hkv]xS[:kSK][:dD][:full][:qkv|:bhsd]``) each gets:

1. the same device buffers holding the same inputs (the oracle's generators, seed 42: Q, K
   uniform in [-2, 2], V uniform in [-1, 1]; BSHD, BF16; with ``:qkv`` / ``:bhsd`` mirrored
   into one fused QKV tensor / a [B, Hkv, S_k, D] cache, which every backend reads through the
   same strided views); a peer sees them as torch views;
2. the same gate as ``fa-tune run`` and the search, before any timing: every input set against
   the full FP32 reference (tuner.measure.oracle). A backend that fails is reported as failed
   and gets no numbers; nothing is substituted;
3. the same protocol (tuner.measure.timing.Protocol, default FULL: temperature wait, 2 s settle,
   50 warm-up, 3 x 200 timed launches, median of the round medians; every sample kept);
4. the output of the last timed launch checked again (catches races that show only under
   back-to-back load).

The reference peer (FA3 when present, else the first available peer) runs first and last on each
shape, and both medians are stored as the drift check. Ratios are FA3's time over the backend's
time (>1 means faster than FA3), with FA3's time the mean of its two medians.

This module imports torch only through the peers: ``tuner`` and the CLI import without it. The
writers (``write_outputs`` and friends) need no torch and no GPU.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.errors import FaTuneError, GpuError
from tuner.kernel.support import unsupported
from tuner.measure.peers import DEFAULT_PEERS, PEER_NAMES, REFERENCE_PEER, make_peer
from tuner.measure.peers.base import dist_version
from tuner.measure.timing import FULL, Protocol
from tuner.problem import DEFAULT_LAYOUT, LAYOUTS, SEED_PROBLEMS, Problem, as_problem, describe

SCHEMA_VERSION = 2
DEFAULT_SEED = 42
# The sum of all temperature waits over one comparison: a card that idles hot delays it, it
# never outlives a 10-minute call. Each round's own bound is the protocol's temp_wait_s.
TEMP_WAIT_TOTAL_S = 180.0
SUMMARY_COLUMNS = (
    "shape",
    "B",
    "H",
    "Hq",
    "Hkv",
    "S",
    "Sk",
    "D",
    "causal",
    "layout",
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


@dataclass
class Backend:
    """One row of the comparison: a launchable plus what we learned about it up front."""

    name: str
    label: str
    role: str  # "kernel" (fa-tune's .so) or "peer"
    launch: Any  # tuner.measure.launch.KernelLaunch or PeerLaunch
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
    """'fa3,cudnn' / ['fa3', 'cudnn'] / 'all' / 'none' / None (the default set) -> peer names."""
    if spec is None:
        return list(DEFAULT_PEERS)
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names: list[str] = []
    for item in (i.strip() for i in items):
        if not item or item == "none":
            continue
        if item == "all":
            names.extend(PEER_NAMES)
        elif item in ("fa-tune", "fatune"):
            continue  # the kernel is included whenever a .so is given
        elif item in PEER_NAMES:
            names.append(item)
        else:
            raise FaTuneError(
                f"unknown backend '{item}': choose from {', '.join(PEER_NAMES)}, all or none"
            )
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


def _kernel_backend(path: Path, label: str) -> Backend:
    from tuner.measure.launch import KernelLaunch

    try:
        k = KernelLaunch(path, label)
    except FaTuneError as exc:  # not a fa-tune library, missing symbol, ...
        return Backend(label, label, "kernel", None, False, str(exc))
    return Backend(label, label, "kernel", k, True, "ok", f"config {k.module.config_json()}")


def make_backends(so: Any, peer_names: Sequence[str]) -> list[Backend]:
    """Kernel backends first, then peers in the order given; availability probed once each."""
    from tuner.measure.launch import PeerLaunch

    backends: list[Backend] = []
    specs = _kernel_specs(so)
    for path, label in specs:
        if label is None:
            label = path.stem if len(specs) > 1 else "fa-tune"
        taken = {b.name for b in backends}
        name, n = label, 2
        while name in taken:  # two kernels with one label must stay two rows
            name, n = f"{label}#{n}", n + 1
        backends.append(_kernel_backend(path, name))
    for name in peer_names:
        peer = make_peer(name)
        b = Backend(peer.name, peer.label, "peer", PeerLaunch(peer))
        try:
            b.available, b.reason = peer.available()
        except Exception as exc:  # a probe must not take the whole comparison down
            b.available, b.reason = False, _one_line(exc)
        if b.available:
            try:
                b.version = peer.version()
            except Exception as exc:
                b.version = f"unknown ({_one_line(exc)})"
        backends.append(b)
    return backends


# ---- one backend on one shape -------------------------------------------------------------
def measure(backend: Backend, bench: Any, shape: Problem, protocol: Protocol,
            position: str | None = None) -> dict[str, Any]:
    """Gate, time and re-check one backend on one shape; never raises (failures are a status)."""
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
    if backend.role == "kernel":
        # the grid limits (the CLI refuses earlier; the bench checks the library's class)
        why = unsupported(shape)
        if why is not None:
            run["reason"] = why
            return run
    launch = backend.launch
    try:
        m = bench.measure(launch, shape, protocol, gate=True, gate_after=True)
        d = m.to_dict()
        run.update(gate=d["gate"], gate_after=d["gate_after"], status=m.status, reason=m.reason)
        if m.status == "ok":
            t = d["timing"]
            t["tflops_min"] = shape.tflops(t["max_ms"])
            run["timing"] = t
    except FaTuneError as exc:  # a launch error of one backend is a row, not the end
        run["status"], run["reason"] = "error", str(exc)
    except Exception as exc:  # a peer's own failure (torch, JIT, ...)
        run["status"], run["reason"] = "error", _one_line(exc)
    finally:
        run["details"] = _safe_details(launch)
        try:
            launch.release()
        except Exception:  # noqa: BLE001 - releasing must not hide the row's result
            pass
    return run


def _safe_details(launch: Any) -> dict[str, Any]:
    try:
        return launch.details()
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


def run_suite(
    backends: list[Backend],
    shapes: Sequence[Problem],
    protocol: Protocol,
    log: Log = _stderr,
    *,
    seed: int = DEFAULT_SEED,
    device_index: int = 0,
) -> dict[str, Any]:
    """Measure every backend on every shape; return the results.json payload (no files)."""
    from tuner.measure import oracle
    from tuner.measure.bench import Bench

    if any(b.role == "peer" and b.available for b in backends):
        import torch  # available() said it imports

        if torch.cuda.current_device() != device_index:
            raise GpuError(f"torch's current device is {torch.cuda.current_device()}, "
                           f"not GPU {device_index}; set CUDA_VISIBLE_DEVICES instead")
    bench = Bench(device_index, seed=seed, temp_wait_total_s=TEMP_WAIT_TOTAL_S)
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
        "protocol": {**protocol.to_dict(), "seed": seed},
        "inputs": {
            "seed": seed,
            "layout": _layout_text(shapes),
            "problems": describe(shapes),
            "sets": list(bench.input_sets),
            "timed_on": "seed: Q, K uniform[-2, 2], V uniform[-1, 1] (tuner.measure.oracle)",
        },
        "gate": {
            "rule": oracle.RULE_TEXT,
            "reference": "FP32 attention on the GPU, every element (cuda_src/oracle.cu)",
            "checked": "before timing, on every input set, and on the last timed launch's "
            "output",
        },
        "ratio": "FA3 median / backend median (>1 = faster than FA3); FA3 median = mean of its "
        "before/after medians",
        "reference_peer": ref.name if ref else None,
        "drift_peer": drift_ref.name if drift_ref else None,
        "gpu": bench.gpu_info(),
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
        "artifacts": [
            {"name": b.name, **_safe_details(b.launch)}
            for b in backends if b.role == "kernel" and b.available
        ],
        "shapes": [],
    }
    try:
        for shape in shapes:
            log(f"[compare] shape {shape}: inputs (seed {seed}), FP32 references, gate, timing")
            order: list[tuple[Backend, str | None]] = []
            if drift_ref is not None:
                order.append((drift_ref, "before"))
            order += [(b, None) for b in backends if b is not drift_ref]
            if drift_ref is not None:
                order.append((drift_ref, "after"))
            runs = []
            for b, pos in order:
                r = measure(b, bench, shape, protocol, pos)
                runs.append(r)
                log(f"[compare]   {_run_line(r)}")
            entry: dict[str, Any] = {
                **shape.to_dict(),
                "shape": str(shape),
                "flops": shape.flops,
                "runs": runs,
            }
            entry["drift"] = _drift(runs)
            payload["shapes"].append(entry)
            bench.release(shape)
            _empty_torch_cache()
    finally:
        bench.close()

    payload["summary"] = summarize(payload)
    requested_ok = all(
        r["status"] in ("ok", "unavailable") for s in payload["shapes"] for r in s["runs"]
    )
    payload["status"] = "passed" if requested_ok else "failed"
    return payload


def _empty_torch_cache() -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


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
        shape = Problem.from_dict(s)
        merged: dict[str, list[dict[str, Any]]] = {}
        for r in s["runs"]:
            merged.setdefault(r["backend"], []).append(r)
        shape_rows = []
        for name, runs in merged.items():
            ok = [r for r in runs if r["status"] == "ok"]
            row: dict[str, Any] = {
                "shape": s["shape"],
                **{k: v for k, v in shape.to_dict().items() if k in SUMMARY_COLUMNS},
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


# ---- the search's confirmed number against compare's own ------------------------------------
def check_confirmed(payload: dict[str, Any], confirmed: dict[str, Any],
                    kernel: str = "fa-tune") -> dict[str, Any]:
    """Per shape: the TFLOPS the search confirmed for the study's best, compare's TFLOPS for the
    same kernel now, and their ratio (compare / confirmed). Both use the protocol stored with
    them; the search confirms with FULL, compare's default, so they should agree within noise."""
    conf_shapes = confirmed.get("shapes") or {}
    rows = []
    for r in payload.get("summary", []):
        if r["backend"] != kernel or r["status"] != "ok":
            continue
        c = (conf_shapes.get(r["shape"]) or {}).get("tflops")
        if not isinstance(c, (int, float)) or not c > 0:
            continue
        rows.append({"shape": r["shape"], "confirmed_tflops": float(c),
                     "compare_tflops": r["tflops"], "ratio": r["tflops"] / float(c)})
    return {"confirmed_protocol": confirmed.get("protocol"),
            "compare_protocol": payload.get("protocol"), "shapes": rows}


def confirmed_lines(payload: dict[str, Any]) -> list[str]:
    chk = payload.get("search_confirmed")
    if not chk or not chk.get("shapes"):
        return []
    lines = ["search's confirmed number vs this compare (same kernel; compare / confirmed):"]
    for r in chk["shapes"]:
        lines.append(f"  {r['shape']}: confirmed {r['confirmed_tflops']:.1f} TFLOPS, compare "
                     f"{r['compare_tflops']:.1f} TFLOPS, ratio {r['ratio']:.3f}")
    return lines


# ---- outputs (no torch needed) -----------------------------------------------------------
def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def new_result_dir(root: str | Path) -> Path:
    """``root/<UTC timestamp>/`` through tuner.measure.store, the one owner of result-folder
    names."""
    from tuner.measure.store import new_result_dir as store_new_result_dir

    return store_new_result_dir(root)


def write_summary_csv(payload: dict[str, Any], path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=SUMMARY_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for row in payload.get("summary", []):
            w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in SUMMARY_COLUMNS})
    os.replace(tmp, path)


def _layout_text(shapes: Sequence[Problem]) -> str:
    """The payload's input layout: BSHD contiguous, plus each other layout among the problems
    (every backend reads q, k, v in that layout, through the same views)."""
    text = "BSHD contiguous (Q, O [B, S_q, Hq, D]; K, V [B, S_k, Hkv, D]), BF16"
    others = sorted({p.layout for p in shapes} - {DEFAULT_LAYOUT})
    if others:
        text += "; O always, and q, k, v of the problems marked " + ", ".join(
            f":{x} as {LAYOUTS[x]}" for x in others) + " (every backend on the same views)"
    return text


def _layouts_note(payload: dict[str, Any]) -> str:
    """'' or '; :qkv: q, k, v views of ...' for the problems' other layouts (summary.md)."""
    others = sorted({p.layout for p in _problems(payload)} - {DEFAULT_LAYOUT})
    return "".join(f"; :{x}: {LAYOUTS[x]}" for x in others)


def _problems(payload: dict[str, Any]) -> list[Problem]:
    """The payload's problems (an old payload's {B, H, S, D} entries read as MHA, causal)."""
    return [Problem.from_dict(s) for s in payload.get("shapes", [])]


def _shape_headers(payload: dict[str, Any]) -> list[tuple[str, str]]:
    """[(shape key, column title)]; 'S=4096' when only S differs among the problems (and each
    has as many keys as queries)."""
    shapes = payload.get("shapes", [])
    ps = _problems(payload)
    same = (len({(p.B, p.Hq, p.Hkv, p.D, p.causal, p.layout) for p in ps}) <= 1
            and all(p.S_k == p.S_q and not p.is_varlen for p in ps))
    return [(s["shape"], f"S={s['S']}" if same else s["shape"]) for s in shapes]


def problems_title(payload: dict[str, Any]) -> str:
    """What the payload's problems are, for titles: 'causal, D=128, MHA, B=4, H=32'."""
    ps = _problems(payload)
    if not ps:
        return "no problems"
    text = describe(ps)
    if len({p.B for p in ps}) == 1:
        text += f", B={ps[0].B}"
    if len({(p.Hq, p.Hkv) for p in ps}) == 1 and ps[0].kind == "MHA":
        text += f", H={ps[0].Hq}"
    return text


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
        f"before each round an NVML wait (bounded) to <= {proto.get('temp_limit_c', '?')} C and "
        f"{proto.get('settle_s', '?')} s of untimed launches",
        f"- problems: {problems_title(payload)} "
        "(columns: BxHq[/Hkv]xS[:kSK][:dD][:full][:qkv|:bhsd])",
        f"- inputs: seed {proto.get('seed', '?')}, Q/K uniform [-2, 2], V uniform [-1, 1], BSHD "
        f"BF16{_layouts_note(payload)}; every backend gated "
        f"({(payload.get('gate') or {}).get('rule', '?')})",
        "- TFLOPS = FLOPs / time; FLOPs causal 2*B*Hq*S^2*D (not halved for causality, as in "
        "the seeds), non-causal 4*B*Hq*S^2*D; with S_q queries over S_k keys 4*B*Hq*D times "
        "the (query, key) pairs the mask keeps (causal, bottom-right: S_q*S_k - S_q^2/2)",
        "",
        "| implementation | " + " | ".join(f"{t} ms / TFLOPS" for _, t in cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for name, label in order:
        cells = []
        for key, _ in cols:
            r = rows.get((key, name))
            cells.append(_cell(r, lambda r: f"{r['median_ms']:.3f} / {r['tflops']:.0f}",
                               _down(payload)))
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
                    _down(payload),
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
    conf = confirmed_lines(payload)
    if conf:
        lines += [conf[0], "", *(f"- {x.strip()}" for x in conf[1:]), ""]
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
    down = _down(payload)
    for r in payload.get("summary", []):
        if r["status"] == "unavailable" and r["backend"] not in down:
            notes.append(f"- {r['label']} on {r['shape']}: unsupported ({r['reason']})")
        elif r["status"] not in ("ok", "unavailable"):
            notes.append(f"- {r['label']} on {r['shape']}: {r['status']} ({r['reason']})")
    if notes:
        lines += ["Not measured:", "", *notes, ""]
    for a in payload.get("artifacts", []):
        if a.get("sha256"):
            lines.append(f"- {a['name']} artifact: {a.get('so_path')} (sha256 {a['sha256']})")
    return "\n".join(lines).rstrip() + "\n"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f} ms"


def _cell(r: dict[str, Any] | None, fmt: Callable[[dict[str, Any]], str],
          down: frozenset[str] = frozenset()) -> str:
    """A table cell: the numbers, or why there are none. ``down``: backends that did not run
    at all (not installed, no GPU); another unavailable row is a problem the backend declined
    (S_q != S_k on FA2's SDPA backend, GQA on Triton, ...)."""
    if r is None:
        return "-"
    if r["status"] == "ok":
        return fmt(r)
    if r["status"] == "unavailable":
        return "not installed" if r["backend"] in down else "unsupported"
    return {"gate_failed": "gate failed"}.get(r["status"], r["status"])


def _down(payload: dict[str, Any]) -> frozenset[str]:
    """The backends that did not run at all (payload["backends"]' unavailable ones)."""
    return frozenset(b["name"] for b in payload.get("backends", []) if not b.get("available"))


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
    ax.set_ylabel("TFLOPS (FLOPs / median time)")
    gpu = (payload.get("gpu") or {}).get("name") or "GPU"
    ax.set_title(
        f"FlashAttention forward, BF16, {problems_title(payload)}\n"
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
    shapes: Sequence[Problem | str] | None = None,
    backends: str | Sequence[str] | None = None,
    protocol: Protocol | None = None,
    results_root: str | Path | None = None,
    log: Log = _stderr,
    confirmed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the comparison and write its result folder; return the payload.

    so_path_or_none: one built kernel .so, a list of paths or (path, label) pairs, or None for
    peers only. shapes: Problems or their text forms
    'BxHq[/Hkv]xS[:kSK][:dD][:full][:qkv|:bhsd]' (default: the seed problems); the kernel's own
    limits are the caller's check (support.check_problem: a problem it cannot run would be a
    failed row, the peers run every one). backends:
    peer names ('fa3,cudnn,fa2,triton' by default). The payload gains 'result_dir' and 'files'.
    """
    shape_list = [as_problem(s) for s in (shapes or SEED_PROBLEMS)]
    protocol = protocol or FULL
    if results_root is None:
        from tuner import _paths

        results_root = _paths.results_root()
    for path, _ in _kernel_specs(so_path_or_none):
        if not path.is_file():
            raise FaTuneError(f"kernel library {path} does not exist; build it first")
    backend_objs = make_backends(so_path_or_none, parse_backends(backends))
    payload = run_suite(backend_objs, shape_list, protocol, log)
    if confirmed is not None:
        payload["search_confirmed"] = check_confirmed(payload, confirmed)
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
    settle_s: float = FULL.settle_s,
    confirmed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What ``fa-tune compare`` calls once it has resolved --study/--config/--preset to a .so.

    ``confirmed``: the search's ``confirmed`` attribute of the study's best trial; compare then
    states, per shape, its own number for the kernel against the one the search showed.

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
        confirmed=confirmed,
    )
    lines = confirmed_lines(payload)
    if console is not None:
        console.print(rich_table(payload))
        for line in lines:
            console.print(line, soft_wrap=True, markup=False)
        console.print(f"results: {payload['result_dir']}", soft_wrap=True)
    else:
        print(format_table(payload))
        print("\n".join([*lines, f"results: {payload['result_dir']}"]))
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
        t.add_row(label, *(_cell(rows.get((k, name)), _ms_tflops_ratio, _down(payload))
                           for k, _ in cols))
    return t


def _ms_tflops_ratio(r: dict[str, Any]) -> str:
    ratio = f" ({r['ratio_to_fa3']:.2f}x)" if r.get("ratio_to_fa3") else ""
    return f"{r['median_ms']:.3f} / {r['tflops']:.0f}{ratio}"


def format_table(payload: dict[str, Any]) -> str:
    """Plain-text table (median ms, min, max, TFLOPS, ratio to FA3), one line per row."""
    head = (
        f"{'shape':<16} {'backend':<28} {'median':>9} {'min':>9} {'max':>9} {'TFLOPS':>7} "
        f"{'xFA3':>7}  status"
    )
    lines = [head, "-" * len(head)]
    for r in payload.get("summary", []):
        if r["status"] == "ok":
            ratio = f"{r['ratio_to_fa3']:.3f}" if r.get("ratio_to_fa3") else "-"
            lines.append(
                f"{r['shape']:<16} {r['backend'][:28]:<28} {r['median_ms']:>9.4f} "
                f"{r['min_ms']:>9.4f} {r['max_ms']:>9.4f} {r['tflops']:>7.1f} {ratio:>7}  ok"
            )
        else:
            lines.append(
                f"{r['shape']:<16} {r['backend'][:28]:<28} {'':>9} {'':>9} {'':>9} "
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
