"""The ``fa-tune`` command line: parse, call the modules, print with rich.

The commands live by group (``kernel_cmds``: build, run, doctor, presets, bundle;
``compare_cmd``; ``search_cmds``: search, worker, tune; ``study_cmds``: show, export, workload,
profile) and are registered here, in the order ``fa-tune --help`` lists them. A command parses
its options, calls the module that does the work and prints what it returns. Every command is
wrapped by ``common.user_errors``: a FaTuneError becomes ONE line on stderr and exit code 2.
"""

from __future__ import annotations

import signal
import sys

import typer

from tuner.cli import compare_cmd, kernel_cmds, search_cmds, study_cmds
from tuner.cli.common import Command, app, interrupted
from tuner.errors import FaTuneError

try:  # typer >= 0.20 vendors click as typer._click; its errors are that module's
    from typer._click import exceptions as click_errors
except ImportError:  # older typer runs on click itself
    from click import exceptions as click_errors  # type: ignore[no-redef]  # typer < 0.20

NO_ARGS_IS_HELP = getattr(click_errors, "NoArgsIsHelpError", ())  # click >= 8.2
try:  # Ctrl-C at a prompt: click's Abort, which typer >= 0.20 keeps in typer.exceptions
    from typer.exceptions import Abort as ABORT
except ImportError:
    ABORT = click_errors.Abort  # type: ignore[misc,attr-defined]  # typer < 0.20: click's

for _name, _fn in (
    ("build", kernel_cmds.build),
    ("run", kernel_cmds.run),
    ("doctor", kernel_cmds.doctor),
    ("presets", kernel_cmds.presets),
    ("bundle", kernel_cmds.bundle),
    ("compare", compare_cmd.compare),
    ("search", search_cmds.search),
    ("worker", search_cmds.worker_cmd),
    ("show", study_cmds.show),
    ("export", study_cmds.export),
    ("workload", study_cmds.workload_cmd),
    ("tune", search_cmds.tune),
    ("profile", study_cmds.profile),
):
    app.command(_name, cls=Command)(_fn)

__all__ = ["app", "main"]


def app_commands(command: object) -> set[str]:
    return set(getattr(command, "commands", {}))


class Terminated(BaseException):
    """SIGTERM or SIGHUP outside a search (which takes them as a stop of its own,
    search.session)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _terminated(signum: int, frame: object) -> None:
    raise Terminated(signum)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point. click's own errors (an unknown option, a missing argument, a
    bad value) are ONE line too, with the command to ask for help, and exit 2; no usage dump.
    SIGTERM and SIGHUP unwind like Ctrl-C, so a command's cleanup runs (an export's staging
    folder goes) and it says one line."""
    signal.signal(signal.SIGTERM, _terminated)
    if hasattr(signal, "SIGHUP"):  # a closed terminal: the same unwinding
        signal.signal(signal.SIGHUP, _terminated)
    try:
        command = typer.main.get_command(app)
        rv = command.main(args=argv, prog_name="fa-tune", standalone_mode=False)
    except NO_ARGS_IS_HELP as e:  # a bare `fa-tune`: typer has printed the help
        sys.exit(e.exit_code)
    except click_errors.UsageError as e:
        args = sys.argv[1:] if argv is None else argv
        name = next((a for a in args if not a.startswith("-")), None)
        path = f"fa-tune {name}" if name in app_commands(command) else "fa-tune"
        sys.stderr.write(f"fa-tune: error: {' '.join(e.format_message().split())} "
                         f"(see `{path} --help`)\n")
        sys.exit(e.exit_code)
    except click_errors.ClickException as e:
        sys.stderr.write(f"fa-tune: error: {' '.join(e.format_message().split())}\n")
        sys.exit(e.exit_code)
    except FaTuneError as e:  # a command without the decorator; still one line
        sys.stderr.write(f"fa-tune: error: {e}\n")
        sys.exit(e.exit_code)
    except (KeyboardInterrupt, ABORT):
        sys.exit(interrupted().exit_code)
    except Terminated as e:
        sys.stderr.write(f"fa-tune: stopped ({signal.Signals(e.signum).name})\n")
        sys.exit(128 + e.signum)
    sys.exit(rv if isinstance(rv, int) else 0)
