"""What the op GPU test files share (imported by name: tests/gpu is on sys.path): a workload
library exported through the CLI, as a user would, and loaded into fa_tune_ops."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from tuner.cli import app


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
