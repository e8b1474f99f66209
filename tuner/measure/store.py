"""Result folders: ``studies/results/<UTC timestamp>/`` with results.json, summary.csv, summary.md.

The payload ``write_results`` takes (and writes verbatim as results.json) is a JSON-able dict::

    {
      "schema": 1,
      "status": "passed" | "failed",      # failed: a gate failed or a shape could not run
      "failure": str | None,              # one line saying why, when failed
      "created_utc": "2026-11-29T18:30:00Z",
      "fa_tune_version": "0.1.0",
      "config": {knob: value, ...}, "config_id": "0123abcd4567",
      "preset": str | None, "config_file": str | None,
      "protocol": {"warmup": 50, "repeat": 200, "rounds": 3},
      "gpu": {"name": str, "sm_count": int, "cc": [9, 0], "driver_version": str, ...},
      "build": {"key", "so_path", "so_sha256", "source_sha256", "template_sha256",
                "nvcc_version", "compile_seconds", "cache_hit",
                "ptxas": {...main entry...}, "sass": {"hgmma", "ldl", "stl"} | None},
      "shapes": [
        {
          "shape": "4x32x8192",           # str(tuner.problem.Problem), e.g. 1x32/8x8192:qkv
          "B": 4, "Hq": 32, "Hkv": 32, "S": 8192, "D": 128, "causal": true,  # Problem.to_dict()
          "H": 32,                        # = Hq, for readers of schema-1 files before GQA
          "flops": int,                   # causal 2*B*Hq*S^2*D, non-causal 4*B*Hq*S^2*D
          "status": "passed" | "failed" | "error",
          "error": str | None,
          "gate": {"passed": bool, "summary": str, "max_abs_err": float, "rel_l2": float,
                   "details": {...the oracle's GateResult as a dict...}} | None,
          "timing": {"median_ms", "min_ms", "max_ms", "tflops", "round_medians_ms": [...],
                     "state_before": {...}, "state_after": {...},   # NVML: temp, clocks,
                     "rounds": [{..., "samples_ms": [...]}], ...}   # power, throttle reasons
                    | None,             # timing.TimingResult.to_dict(); None if the gate failed
        }, ...
      ]
    }

A shape whose gate failed is never timed and never gets numbers from anywhere else. Files
written before problems had Hkv, D and causal lack those keys: ``problem_of`` reads them as
MHA, D 128, causal (what the kernel ran then).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from tuner import __version__

SCHEMA_VERSION = 1
CSV_COLUMNS = (
    "shape",
    "median_ms",
    "min_ms",
    "max_ms",
    "tflops",
    "gate_passed",
    "max_abs_err",
    "rel_l2",
)


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


def build_summary(b: Any) -> dict[str, Any]:
    """What a results payload records of the kernel's build (a tuner.kernel.build.BuildResult)."""
    sass = b.sass or {}
    return {
        "key": b.key,
        "so_path": b.so_path,
        "so_sha256": b.so_sha256,
        "source_sha256": b.source_sha256,
        "template_sha256": b.template_sha256,
        "nvcc_version": b.nvcc_version,
        "compile_seconds": b.compile_seconds,
        "cache_hit": b.cache_hit,
        "ptxas": b.main_entry,
        "sass": {k: sass.get(k) for k in ("hgmma", "ldl", "stl")} if b.sass else None,
    }


def shape_row(shape: Any, *, status: str = "error", error: str | None = None,
              gate: Any = None, timing: Any = None) -> dict[str, Any]:
    """One problem's entry of a payload's ``shapes``: the problem's text and dict, its FLOPs,
    the outcome and the gate's and timing's records."""
    return {"shape": str(shape), **shape.to_dict(), "flops": shape.flops, "status": status,
            "error": error, "gate": gate, "timing": timing}


def results_payload(*, cfg: Any, rows: list[dict[str, Any]], protocol: dict[str, Any],
                    seed: int, gpu: Any, build: dict[str, Any], preset: str | None = None,
                    config_file: str | None = None,
                    study: dict[str, Any] | None = None) -> dict[str, Any]:
    """The results.json payload of one config measured on its problems (``fa-tune run`` and a
    search's confirmed best): failed when any row did not pass, its errors the failure."""
    bad = [r for r in rows if r["status"] != "passed"]
    payload: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "status": "failed" if bad else "passed",
        "failure": "; ".join(f"{r['shape']}: {r['error']}" for r in bad) if bad else None,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fa_tune_version": __version__,
        "config": cfg.to_dict(),
        "config_id": cfg.config_id(),
        "preset": preset,
        "config_file": config_file,
        "protocol": protocol,
        "seed": seed,
        "gpu": gpu,
        "build": build,
        "shapes": rows,
    }
    if study is not None:
        payload["study"] = study
    return payload


def new_result_dir(root: str | Path) -> Path:
    """Create and return ``root/<UTC timestamp>/``; a suffix keeps same-second runs apart."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for n in range(1, 10_000):
        d = root / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            d.mkdir()  # atomic: exactly one concurrent run gets each name
            return d
        except FileExistsError:
            continue
    raise OSError(f"cannot create a result folder under {root}")


def _num(v: Any, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "" if v is None else str(v)
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1e-3 else f"{v:.{digits}f}"
    return str(v)


def _row(s: dict[str, Any]) -> dict[str, Any]:
    t = s.get("timing") or {}
    g = s.get("gate") or {}
    return {
        "shape": s.get("shape"),
        "median_ms": t.get("median_ms"),
        "min_ms": t.get("min_ms"),
        "max_ms": t.get("max_ms"),
        "tflops": t.get("tflops"),
        "gate_passed": g.get("passed"),
        "max_abs_err": g.get("max_abs_err"),
        "rel_l2": g.get("rel_l2"),
    }


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def summary_markdown(payload: dict[str, Any]) -> str:
    gpu = payload.get("gpu") or {}
    proto = payload.get("protocol") or {}
    build = payload.get("build") or {}
    name = payload.get("preset") or payload.get("config_file") or "config"
    lines = [
        f"# fa-tune run: {name} ({payload.get('config_id', '?')})",
        "",
        f"- status: **{payload.get('status', '?')}**"
        + (f" ({payload['failure']})" if payload.get("failure") else ""),
        f"- date: {payload.get('created_utc', '?')}",
        f"- GPU: {gpu.get('name', '?')}, driver {gpu.get('driver_version', '?')}",
        f"- protocol: {proto.get('warmup', '?')} warm-up, {proto.get('repeat', '?')} timed "
        f"launches, {proto.get('rounds', '?')} rounds; median of round medians",
        f"- nvcc {build.get('nvcc_version', '?')}, artifact sha256 "
        f"{str(build.get('so_sha256', '?'))[:16]}",
        "",
        "| shape | gate | median ms | TFLOPS | min ms | max ms | max abs err |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in payload.get("shapes", []):
        r = _row(s)
        gate = {True: "pass", False: "FAIL", None: "-"}[r["gate_passed"]]
        if s.get("status") == "error":
            gate = "error"
        lines.append(
            f"| {r['shape']} | {gate} | {_num(r['median_ms'], 3)} | {_num(r['tflops'], 1)} | "
            f"{_num(r['min_ms'], 3)} | {_num(r['max_ms'], 3)} | {_num(r['max_abs_err'])} |"
        )
    for s in payload.get("shapes", []):
        if s.get("error"):
            lines.append(f"\n{s['shape']}: {s['error']}")
    return "\n".join(lines) + "\n"


def json_safe(obj: Any) -> Any:
    """Replace NaN/Inf (which JSON cannot hold) with None, recursively."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def write_results(result_dir: str | Path, payload: dict[str, Any]) -> dict[str, Path]:
    """Write results.json, summary.csv and summary.md into result_dir; return their paths."""
    payload = json_safe(payload)
    d = Path(result_dir)
    d.mkdir(parents=True, exist_ok=True)
    payload.setdefault("schema", SCHEMA_VERSION)
    paths = {
        "json": d / "results.json",
        "csv": d / "summary.csv",
        "md": d / "summary.md",
    }
    text = json.dumps(payload, indent=2, default=str, allow_nan=False)
    _atomic_write(paths["json"], text + "\n")
    tmp = paths["csv"].with_name(".summary.csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for s in payload.get("shapes", []):
            w.writerow({k: ("" if v is None else v) for k, v in _row(s).items()})
    os.replace(tmp, paths["csv"])
    _atomic_write(paths["md"], summary_markdown(payload))
    return paths


def read_results(result_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(result_dir) / "results.json").read_text())


def problem_of(entry: dict[str, Any]) -> Any:
    """The tuner.problem.Problem of a results.json shape entry (new or old: {B, H, S, D})."""
    from tuner.problem import Problem, as_problem

    if all(k in entry for k in ("B", "S")) and ("Hq" in entry or "H" in entry):
        return Problem.from_dict(entry)
    return as_problem(entry.get("shape", ""))


def with_problem(entry: dict[str, Any]) -> dict[str, Any]:
    """A shape entry with its problem's fields filled in (B, H, Hq, Hkv, S, D, causal, flops,
    canonical "shape"), e.g. for an entry of a file written before problems had Hkv, D, causal.
    An entry that names no readable problem comes back unchanged."""
    from tuner.errors import ShapeError

    try:
        prob = problem_of(entry)
    except ShapeError:
        return dict(entry)
    return {"shape": str(prob), **prob.to_dict(), "flops": prob.flops,
            **{k: v for k, v in entry.items() if k not in ("shape",)}}
