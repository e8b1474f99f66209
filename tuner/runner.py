"""``fa-tune run``: build -> gate -> time -> store, for one config over shapes.

The artifact that is gated and timed is exactly the cached ``.so`` that build.py produced (the
same file an export ships), loaded once and called through its C ABI. A shape whose gate fails
is recorded with its metrics and never timed; the run then fails. Nothing is substituted.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner import __version__, _paths, store
from tuner import build as build_mod
from tuner.config import KernelConfig, Shape, check_shape, validate
from tuner.errors import FaTuneError


@dataclass
class RunReport:
    payload: dict[str, Any]  # the results.json content (schema in store.py)
    result_dir: Path
    build: build_mod.BuildResult

    @property
    def passed(self) -> bool:
        return self.payload["status"] == "passed"


def to_plain(obj: Any) -> Any:
    """Dataclasses, tuples, numpy scalars -> JSON-able values (for results.json)."""
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict) and not isinstance(obj, type):
        return to_plain(to_dict())  # the module's own JSON form wins
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalar
        try:
            return obj.item()
        except (TypeError, ValueError):
            pass
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def _worst(d: Any, key: str) -> float | None:
    """Largest value of key anywhere in a nested dict/list (the gate's per-input-set metrics)."""
    found: list[float] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                if k == key and isinstance(v, (int, float)) and not isinstance(v, bool):
                    found.append(float(v))
                else:
                    walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(d)
    return max(found) if found else None


def gate_to_dict(gate: Any) -> dict[str, Any]:
    details = to_plain(gate)
    summary = gate.summary() if callable(getattr(gate, "summary", None)) else str(gate)
    def metric(name: str) -> float | None:
        v = getattr(gate, name, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        return _worst(details, name)

    return {
        "passed": bool(gate.passed),
        "summary": summary,
        "max_abs_err": metric("max_abs_err"),
        "rel_l2": metric("rel_l2"),
        "details": details,
    }


def build_summary(b: build_mod.BuildResult) -> dict[str, Any]:
    sass = b.sass or {}
    return {
        "key": b.key,
        "so_path": b.so_path,
        "so_sha256": b.so_sha256,
        "source_sha256": b.source_sha256,
        "template_sha256": b.template_sha256,
        "nvcc_version": b.nvcc_version,
        "cutlass_version": b.cutlass_version,
        "compile_seconds": b.compile_seconds,
        "cache_hit": b.cache_hit,
        "ptxas": b.main_entry,
        "sass": {k: sass.get(k) for k in ("hgmma", "ldl", "stl")} if b.sass else None,
    }


def gpu_info(dev: Any) -> dict[str, Any]:
    props = getattr(dev, "properties", None)
    info: dict[str, Any] = dict(to_plain(props())) if callable(props) else {}
    for attr in ("name", "sm_count", "cc", "driver_version", "cuda_driver_version"):
        if attr not in info and hasattr(dev, attr):
            info[attr] = to_plain(getattr(dev, attr))
    # The NVIDIA driver release (e.g. 580.159) comes from NVML; tolerate its absence.
    if "driver_version" not in info:
        try:
            import pynvml

            pynvml.nvmlInit()
            v = pynvml.nvmlSystemGetDriverVersion()
            info["driver_version"] = v.decode() if isinstance(v, bytes) else v
        except Exception:  # NVML missing: the CUDA driver version above still identifies it
            pass
    return info


def _free(bufs: Any) -> None:
    for name in ("free", "close"):
        fn = getattr(bufs, name, None)
        if callable(fn):
            fn()
            return


def run_config(
    cfg: KernelConfig,
    shapes: Sequence[Shape],
    protocol: Any,
    results_root: str | Path | None = None,
    *,
    preset: str | None = None,
    config_file: str | None = None,
    device_index: int = 0,
    seed: int = 42,
    log: Callable[[str], None] | None = None,
) -> RunReport:
    """Build cfg, then gate and time it on every shape; write the result folder.

    Raises FaTuneError for user-level problems found before any measurement (invalid config,
    unsupported shape, no sm_90 GPU, compile error). A failed gate does not raise: the run is
    stored as failed and ``RunReport.passed`` is False.
    """
    # Imported here so build-only commands work where these GPU modules cannot load.
    from tuner import runtime
    from tuner.measure import oracle, timing

    say = log or (lambda _m: None)
    validate(cfg)
    for s in shapes:
        check_shape(cfg, s)
    # Fail on a missing GPU before spending a minute compiling.
    dev = runtime.Device.open(device_index)
    say(f"GPU {getattr(dev, 'name', '?')}; building config {cfg.config_id()}")
    built = build_mod.build_config(cfg)
    say(f"artifact {built.so_path} ({'cache hit' if built.cache_hit else 'compiled'})")
    built.require_timeable()
    # The exact cached artifact, through its C ABI (the same file an export ships).
    load = getattr(dev, "load_kernel", None)
    kernel = load(built.so_path) if callable(load) else runtime.KernelModule(built.so_path)

    rows: list[dict[str, Any]] = []
    for shape in shapes:
        row: dict[str, Any] = {
            "shape": str(shape),
            **shape.to_dict(),
            "flops": shape.flops,
            "status": "error",
            "error": None,
            "gate": None,
            "timing": None,
        }
        rows.append(row)
        bufs = None
        try:
            alloc = getattr(dev, "alloc_inputs", None)
            bufs = alloc(shape) if callable(alloc) else runtime.AttnBuffers(dev, shape)
            say(f"{shape}: gating")
            g = oracle.gate(dev, kernel, shape, bufs, seed=seed)
            row["gate"] = gate_to_dict(g)
            if not g.passed:
                row["status"] = "failed"
                row["error"] = f"gate failed: {row['gate']['summary']}"
                continue
            say(f"{shape}: timing")
            t = timing.time_kernel(dev, kernel, shape, bufs, protocol)
            row["timing"] = to_plain(t)
            row["status"] = "passed"
        except FaTuneError as e:
            row["error"] = str(e)
        finally:
            if bufs is not None:
                _free(bufs)

    bad = [r for r in rows if r["status"] != "passed"]
    failure = None
    if bad:
        failure = "; ".join(f"{r['shape']}: {r['error']}" for r in bad)
    payload: dict[str, Any] = {
        "schema": store.SCHEMA_VERSION,
        "status": "failed" if bad else "passed",
        "failure": failure,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fa_tune_version": __version__,
        "config": cfg.to_dict(),
        "config_id": cfg.config_id(),
        "preset": preset,
        "config_file": config_file,
        "protocol": to_plain(protocol),
        "seed": seed,
        "gpu": gpu_info(dev),
        "build": build_summary(built),
        "shapes": rows,
    }
    out = store.new_result_dir(results_root or _paths.results_root())
    store.write_results(out, payload)
    return RunReport(payload, out, built)
