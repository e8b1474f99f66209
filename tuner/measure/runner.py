"""``fa-tune run``: build -> gate -> time -> store, for one config over problems (shapes).

The artifact that is gated and timed is exactly the cached ``.so`` that build.py produced (the
same file an export ships), loaded once and called through its C ABI. A shape whose gate fails
is recorded with its metrics and never timed; the run then fails. Nothing is substituted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner import _paths
from tuner.errors import FaTuneError
from tuner.kernel import build as build_mod
from tuner.kernel.config import KernelConfig
from tuner.kernel.support import check_problems
from tuner.measure import store
from tuner.problem import Problem


@dataclass
class RunReport:
    payload: dict[str, Any]  # the results.json content (schema in store.py)
    result_dir: Path
    build: build_mod.BuildResult

    @property
    def passed(self) -> bool:
        return self.payload["status"] == "passed"


def run_config(
    cfg: KernelConfig,
    shapes: Sequence[Problem],
    protocol: Any,
    results_root: str | Path | None = None,
    *,
    preset: str | None = None,
    config_file: str | None = None,
    device_index: int = 0,
    seed: int = 42,
    log: Callable[[str], None] | None = None,
) -> RunReport:
    """Build cfg, then gate and time it on every problem; write the result folder.

    Raises FaTuneError for user-level errors found before any measurement (invalid config, a
    problem the kernel cannot run (support.check_problem), no sm_90 GPU, compile error). A
    failed gate does not raise: the run is stored as failed and ``RunReport.passed`` is False.
    Each row of the payload carries the problem's dict (B, H = Hq, Hq, Hkv, S, D, causal; Sk
    when the keys outnumber the queries, seqlens / seqlens_k for a packed batch) and
    ``"shape": str(problem)`` (``1x32/8x2048:k8192``).
    """
    # Imported here so build-only commands work where the GPU modules cannot load.
    from tuner.measure.bench import Bench
    from tuner.measure.launch import KernelLaunch, default_launches

    say = log or (lambda _m: None)
    pclass = check_problems(cfg, shapes)  # validates cfg for the problems' class
    # Fail on a missing GPU before spending a minute compiling. Each gate also records the
    # error against the default config's on the same inputs (err_vs_default).
    bench = Bench(device_index, seed=seed, default_launch=default_launches())
    say(f"GPU {bench.dev.name}; building config {cfg.config_id()}")
    built = build_mod.build_config(cfg, pclass=pclass)
    say(f"artifact {built.so_path} ({'cache hit' if built.cache_hit else 'compiled'})")
    built.require_timeable()
    # The exact cached artifact, through its C ABI (the same file an export ships).
    kernel = KernelLaunch(built.so_path)

    rows: list[dict[str, Any]] = []
    for shape in shapes:
        row = store.shape_row(shape)
        rows.append(row)
        try:
            say(f"{shape}: gating, then timing")
            m = bench.measure(kernel, shape, protocol)
            d = m.to_dict()
            row["gate"], row["timing"] = d["gate"], d["timing"]
            if m.status != "ok":
                row["status"] = "failed"
                row["error"] = f"gate failed: {m.reason}"
                continue
            row["status"] = "passed"
        except FaTuneError as e:
            row["error"] = str(e)
        finally:
            bench.release(shape)

    payload = store.results_payload(
        cfg=cfg, rows=rows, protocol=store.to_plain(protocol), seed=seed, gpu=bench.gpu_info(),
        build=store.build_summary(built), preset=preset, config_file=config_file)
    out = store.new_result_dir(results_root or _paths.results_root())
    store.write_results(out, payload)
    return RunReport(payload, out, built)
