"""What the op GPU test files share (imported by name: tests/gpu is on sys.path): torch with
CUDA or the module's skip, and a workload library exported through the CLI, as a user would, and
loaded into fa_tune_ops."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from tuner.cli import app


def cuda_torch() -> Any:
    """torch, imported; called at a test module's top, skips the whole module without PyTorch
    or without CUDA."""
    torch = pytest.importorskip("torch", reason="the op tests need PyTorch with CUDA")
    if not torch.cuda.is_available():  # pragma: no cover - a GPU host without CUDA torch
        pytest.skip("torch has no CUDA here (pip install torch with CUDA)", allow_module_level=True)
    return torch


def export_and_load(ops: Any, tmp: Path, workload: dict[str, Any],
                    buckets: dict[str, str]) -> tuple[Path, Any]:
    """`fa-tune export --workload` of ``workload`` into tmp/lib with each bucket's source
    (``{"short": "preset:default"}``), then ``ops.load`` of its library: (folder, Library)."""
    (tmp / "w.yaml").write_text(yaml.safe_dump(workload))
    out = tmp / "lib"
    args = ["export", "--workload", str(tmp / "w.yaml"), "--out", str(out)]
    for name, source in buckets.items():
        args += ["--bucket", f"{name}={source}"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    return out, ops.load(str(out / "lib" / "libfa_tune_fwd.so"))
