"""The ``fa-tune`` command line: parse, call the modules, print with rich.

The commands live by group (``kernel_cmds``: build, run, doctor, presets, bundle;
``compare_cmd``; ``search_cmds``: search, worker, tune; ``study_cmds``: show, export, workload,
profile) and are registered here, in the order ``fa-tune --help`` lists them. A command parses
its options, calls the module that does the work and prints what it returns. Every command is
wrapped by ``common.user_errors``: a FaTuneError becomes ONE line on stderr and exit code 2.
"""

from __future__ import annotations

import sys

from tuner.cli import compare_cmd, kernel_cmds, search_cmds, study_cmds
from tuner.cli.common import app
from tuner.errors import FaTuneError

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
    app.command(_name)(_fn)

__all__ = ["app", "main"]


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    try:
        app(args=argv, prog_name="fa-tune")
    except FaTuneError as e:  # a command without the decorator; still one line
        sys.stderr.write(f"fa-tune: error: {e}\n")
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("fa-tune: interrupted\n")
        sys.exit(130)
