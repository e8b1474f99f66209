"""The ``fa-tune`` console script. It lives outside ``tuner.cli`` so that a Ctrl-C while the
CLI loads (about half a second: typer, rich, Optuna, then typer building the commands) is one
line, not a traceback."""

from __future__ import annotations

import signal
import sys
from typing import NoReturn

from tuner.errors import say_interrupted


def _interrupted() -> NoReturn:
    say_interrupted()
    sys.exit(130)


def main() -> None:
    # A KeyboardInterrupt raised inside importlib's own callbacks is printed as "Exception
    # ignored" past any try: while the modules load, a Ctrl-C is only noted.
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        from tuner.cli import main as cli_main
    finally:
        signal.signal(signal.SIGINT, previous)  # Python's own, or an ignored SIGINT kept
    if caught:
        _interrupted()
    try:
        cli_main()  # a command's own Ctrl-C is handled inside; this catches its set-up's too
    except KeyboardInterrupt:
        _interrupted()
    finally:
        # Only the interpreter's exit is left (threading's shutdown joins threads): a Ctrl-C
        # there ends the process as SIGINT does, not with an "Exception ignored" trace.
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
