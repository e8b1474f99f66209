#!/usr/bin/env python3
"""Print docs/ARCHITECTURE.md's knob table, generated from KernelConfig's knob table
(tuner/kernel/knobs.py), or write it into the docs between its markers.

    python scripts/knob_table.py            # print it
    python scripts/knob_table.py --write    # replace the one in docs/ARCHITECTURE.md

tests/test_knobs.py fails while the committed table differs from the generated one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuner.kernel.config import KNOBS  # noqa: E402
from tuner.kernel.knobs import DOC_BEGIN, DOC_END, docs_table, markdown_table  # noqa: E402

DOC = ROOT / "docs" / "ARCHITECTURE.md"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"rewrite the table in {DOC.name}")
    a = ap.parse_args()
    table = markdown_table(KNOBS)
    if not a.write:
        sys.stdout.write(table)
        return 0
    text = DOC.read_text()
    if DOC_BEGIN not in text or DOC_END not in text:
        sys.stderr.write(f"knob_table: error: {DOC} has no knob table markers\n")
        return 2
    old = docs_table(text)
    DOC.write_text(text.replace(DOC_BEGIN + old + DOC_END, DOC_BEGIN + table + DOC_END))
    print(f"{DOC}: knob table {'unchanged' if old == table else 'rewritten'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
