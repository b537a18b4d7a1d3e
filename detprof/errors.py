"""The two kinds of failure a user can cause, each with its documented exit code.

Every command turns these into one line on stderr, never a traceback, so that callers
(CI scripts above all) can tell "you called me wrong" (2) from "your input or
measurement is unusable" (3).
"""

from __future__ import annotations

USAGE_EXIT = 2
INPUT_EXIT = 3


class DetprofError(Exception):
    """A problem the user can act on; the message is the whole explanation."""

    exit_code: int = INPUT_EXIT

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(DetprofError):
    """Bad arguments or options (exit 2)."""

    exit_code = USAGE_EXIT


class InputError(DetprofError):
    """A file or measurement that cannot be used: missing, corrupt, empty (exit 3)."""

    exit_code = INPUT_EXIT
