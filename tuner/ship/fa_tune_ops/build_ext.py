"""Build the op's C++ launch path for this python's torch: ``python3 -m fa_tune_ops.build_ext
OUT_DIR`` (an export's build.sh runs it; native.py has the details)."""

from __future__ import annotations

import sys
from pathlib import Path

from .native import NativeBuildError, build


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python3 -m fa_tune_ops.build_ext OUT_DIR", file=sys.stderr)
        return 2
    try:
        out = build(Path(argv[0]))
    except NativeBuildError as e:
        print(f"fa_tune_ops.build_ext: {e}", file=sys.stderr)
        return 1
    print(f"built {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
