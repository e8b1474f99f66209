"""User-facing errors.

Every error a user can cause (bad input, missing tool, no GPU) is a ``FaTuneError`` whose
message is ONE line saying what is wrong and what to do. ``tuner.cli.main`` prints it to stderr
and exits 2; anything else escaping is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys


def say_interrupted() -> None:
    """The one line a Ctrl-C prints, while the CLI loads (tuner.entry) or in a command."""
    sys.stderr.write("fa-tune: interrupted\n")


class FaTuneError(Exception):
    """Base class: a one-line, user-facing message."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        # Keep the message on one line even if a caller interpolated multi-line text.
        super().__init__(" ".join(str(message).split()))

    @property
    def message(self) -> str:
        return str(self)


class ConfigError(FaTuneError):
    """A kernel config, preset or search space is malformed or statically invalid."""


class ShapeError(FaTuneError):
    """A problem shape (BxHxS) is malformed or unsupported."""


class BuildError(FaTuneError):
    """nvcc is missing or a compile failed (the message names the log file)."""

    def __init__(self, message: str, log_path: str | None = None) -> None:
        super().__init__(message)
        self.log_path = log_path


class GpuError(FaTuneError):
    """No usable GPU: no driver, no device, or not sm_90."""


class SearchError(FaTuneError):
    """A study, storage or search option is wrong (one line, exit 2)."""


class GateError(FaTuneError):
    """The correctness gate failed (the run is stored as failed, never substituted)."""


class BundleError(FaTuneError):
    """``fa-tune bundle`` could not write a wheelhouse."""
