"""``fa-tune compare``: fa-tune's kernel beside its peers, in one process, on the same inputs.

Every backend (fa-tune's kernel through its C ABI, FlashAttention-3, cuDNN SDPA,
FlashAttention-2, our Triton kernel, FlashInfer) goes through the one measurement path
(``tuner.measure.bench.Bench``), so per problem (``tuner.problem.Problem``: MHA/GQA/MQA, head
dim 64/128/256, causal or not, S_q queries over S_k keys, q/k/v layout; the ``--shape`` text
``BxHq[/Hkv]xS[:kSK][:dD][:full][:qkv|:bhsd]``) each gets:

1. the same device buffers holding the same inputs (the oracle's generators, seed 42: Q, K
   uniform in [-2, 2], V uniform in [-1, 1]; BSHD, BF16; with ``:qkv`` / ``:bhsd`` mirrored
   into one fused QKV tensor / a [B, Hkv, S_k, D] cache, which every backend reads through the
   same strided views; with ``:pP`` into pages read through a block table, which the peers that
   read paged caches get, FA3 and FlashInfer, and the others decline); a peer sees them as
   torch views;
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

import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.analysis.compare_report import (
    ACCURACY_COLUMNS,
    SUMMARY_COLUMNS,
    _layout_text,
    check_confirmed,
    confirmed_lines,
    format_table,
    new_result_dir,
    rich_table,
    uneven_lines,
    write_outputs,
)
from tuner.errors import ConfigError, FaTuneError, GpuError
from tuner.kernel import build as build_mod
from tuner.kernel import runtime
from tuner.kernel.config import KernelConfig, load_config
from tuner.kernel.support import check_problems, unsupported
from tuner.measure import accuracy
from tuner.measure.peers import DEFAULT_PEERS, PEER_NAMES, REFERENCE_PEER, make_peer
from tuner.measure.peers import base as peers_base
from tuner.measure.peers.base import dist_version
from tuner.measure.timing import FULL, Protocol
from tuner.problem import SEED_PROBLEMS, Problem, as_problem, describe, parse_problems
from tuner.search.trials import study_best

SCHEMA_VERSION = 2
DEFAULT_SEED = 42
# The sum of all temperature waits over one comparison: a card that idles hot delays it, it
# never outlives a 10-minute call. Each round's own bound is the protocol's temp_wait_s.
TEMP_WAIT_TOTAL_S = 180.0

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


def _slow_first_call(b: Backend, shape: Any, warned: set[tuple[str, str]]) -> str | None:
    """A peer's warning of a slow first call (a JIT build), once per peer and problem class."""
    peer = getattr(b.launch, "peer", None)
    if not b.available or peer is None:
        return None
    key = (b.name, str(shape.problem_class))
    if key in warned:
        return None
    warned.add(key)
    return peer.slow_first_call(shape)


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
        "flashinfer_python": dist_version("flashinfer-python"),
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
    from tuner.measure import gate_rule
    from tuner.measure.bench import Bench

    if any(b.role == "peer" and b.available for b in backends):
        import torch  # available() said it imports

        if torch.cuda.current_device() != device_index:
            raise GpuError(f"torch's current device is {torch.cuda.current_device()}, "
                           f"not GPU {device_index}; set CUDA_VISIBLE_DEVICES instead")
    from tuner.measure.launch import default_launches

    # Every backend's gate also records its error against fa-tune's default config's on the
    # same inputs (err_vs_default; the default is gated once per problem).
    bench = Bench(device_index, seed=seed, temp_wait_total_s=TEMP_WAIT_TOTAL_S,
                  default_launch=default_launches())
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
            "rule": gate_rule.RULE_TEXT,
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
    warned: set[tuple[str, str]] = set()
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
                note = _slow_first_call(b, shape, warned)
                if note:
                    log(f"[compare]   {b.name}: {note}")
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
        f"{_ratio_note(r['gate'])}"
    )


def _ratio_note(gate: dict[str, Any]) -> str:
    """', 0.41x BF16 impl, 1.02x default' (the error ratios recorded with a gate)."""
    acc = accuracy.accuracy_record(gate)
    out = ""
    if acc["fa_ratio"] is not None:
        out += f", {accuracy.ratio_text(acc['fa_ratio'])}x BF16 impl"
    if acc["err_vs_default"] is not None:
        out += f", {accuracy.ratio_text(acc['err_vs_default'])}x default"
    if acc["lse_ratio"] is not None:
        out += f", LSE {accuracy.ratio_text(acc['lse_ratio'])}x its bound"
    return out


def _worst_ratios(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """The summary row's error ratios: the worst over its runs' gates."""
    recs = [accuracy.accuracy_record(r.get("gate")) for r in runs if r.get("gate")]
    return {k: accuracy.worst(a[k] for a in recs) for k in ACCURACY_COLUMNS}


def _drift(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    ends = {r["position"]: r for r in runs if r.get("position")}
    if "before" not in ends:
        return None
    before, after = ends["before"], ends.get("after")
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
                **dict.fromkeys(ACCURACY_COLUMNS),
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
                row.update(_worst_ratios(ok))
            else:
                bad = next(r for r in runs if r["status"] != "ok")
                row["status"], row["reason"] = bad["status"], bad["reason"]
                if bad.get("gate"):
                    row["max_abs_err"] = bad["gate"]["max_abs_err"]
                    row.update(_worst_ratios([bad]))
            shape_rows.append(row)
        ref_row = next((r for r in shape_rows if r["backend"] == ref_name), None)
        if ref_row and ref_row["median_ms"]:
            for r in shape_rows:
                if r["median_ms"]:
                    r["ratio_to_fa3"] = ref_row["median_ms"] / r["median_ms"]
        rows += shape_rows
    return rows


# ---- the search's confirmed number against compare's own ------------------------------------


# ---- outputs (no torch needed) -----------------------------------------------------------


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
    uneven = uneven_lines(payload)
    if uneven:
        lines += [uneven[0], *(f"  {x}" for x in uneven[1:])]
    if console is not None:
        console.print(rich_table(payload))
        for line in lines:
            console.print(line, soft_wrap=True, markup=False)
        console.print(f"results: {payload['result_dir']}", soft_wrap=True)
    else:
        print(format_table(payload))
        print("\n".join([*lines, f"results: {payload['result_dir']}"]))
    return payload


def compare_options(*, study: str | None, storage: str | None, preset: str | None,
                    trial: int | None = None,
                    config: Path | None, shape: Sequence[str] | None, backends: str | None,
                    warmup: int, repeat: int, rounds: int, settle_s: float,
                    results_dir: Path | None, console: Any) -> dict[str, Any]:
    """``fa-tune compare`` from its options: at most one of --study / --preset / --config (the
    study's best config, measured on the study's own problems unless --shape names others),
    every cheap check before a compile that can take a minute (problems, backends, protocol,
    one problem class, torch for the peers, a GPU), then the build and ``compare_command``.
    Returns its payload."""
    given = [n for n, v in (("--study", study), ("--preset", preset), ("--config", config))
             if v is not None]
    if len(given) > 1:
        raise ConfigError(f"give at most one of --study, --preset or --config (got "
                          f"{' and '.join(given)})")
    problems = parse_problems(shape)
    shapes = [str(p) for p in problems] if shape else None
    peers = parse_backends(backends)
    Protocol(warmup=warmup, repeat=repeat, rounds=rounds, settle_s=settle_s)
    cfg: KernelConfig | None = None
    confirmed = None
    label = ""
    if storage is not None and study is None:
        raise ConfigError("--storage goes with --study")
    if trial is not None and study is None:
        raise ConfigError("--trial goes with --study")
    if study is not None:
        cfg, confirmed, measured = study_best(study, storage, trial)
        label = f"study {study}"
        if not shape and measured:  # the study's own problems (a D 256 study: D 256 ones)
            problems, shapes = measured, [str(p) for p in measured]
    elif given:
        cfg, label = load_config(preset, config)
    if cfg is not None:
        pclass = check_problems(cfg, problems)  # one problem class per kernel library
    # through the module: the tests stand in for it
    if peers and peers_base.module_missing("torch"):
        raise FaTuneError("fa-tune compare's peers need torch with CUDA: pip install "
                          "'fa-tune[peers]' (or --backends none for fa-tune's kernel alone)")
    if cfg is None and not peers:
        raise ConfigError("nothing to compare: give --study, --preset or --config, or peers")
    # No GPU: say so before spending a minute compiling.
    runtime.Device.open(0)
    so_path: Path | None = None
    if cfg is not None:
        console.print(f"[dim]building {label} ({cfg.config_id()}) ...[/]")
        built = build_mod.build_config(cfg, pclass=pclass)
        built.require_timeable()
        so_path = Path(built.so_path)
    else:
        console.print("[dim]no --study/--preset/--config: comparing the peers only[/]")
    return compare_command(
        so_path, shapes, backends, warmup=warmup, repeat=repeat, rounds=rounds,
        results_root=results_dir, console=console, settle_s=settle_s, confirmed=confirmed,
    )


def kernel_outcome(payload: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]]]:
    """(why fa-tune's kernel could not run at all, or None; its summary rows that are not ok)."""
    kernel_names = {b["name"] for b in payload.get("backends", []) if b.get("role") == "kernel"}
    for b in payload.get("backends", []):
        if b["name"] in kernel_names and not b.get("available"):
            return str(b.get("reason")), []
    bad = [r for r in payload.get("summary", [])
           if r["backend"] in kernel_names and r["status"] != "ok"]
    return None, bad
