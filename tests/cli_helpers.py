"""Shared by the CLI tests: a user error is exactly one `fa-tune: error:` line, no traceback."""

from __future__ import annotations


def one_error_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.startswith("fa-tune: error:")]
    assert len(lines) == 1, output
    assert "Traceback" not in output
    return lines[0]
