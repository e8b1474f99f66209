"""The ``fa-tune`` console script. It lives outside ``tuner.cli`` so that a Ctrl-C while the
CLI's modules load (about half a second: typer, rich, Optuna) is one line, not a traceback."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from tuner.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("fa-tune: interrupted\n")
        sys.exit(130)
    cli_main()
