"""The command line as the user typed it: stored in every manifest so a report can say how to reproduce it.

``sys.argv`` is not enough: tests and ``detprof check --run`` call the CLI in-process with
their own argument lists.
"""

from __future__ import annotations

import shlex
import sys

_args: list[str] | None = None


def remember(args: list[str]) -> None:
    global _args
    _args = list(args)


def command_line() -> str:
    return shlex.join(["detprof", *(_args if _args is not None else sys.argv[1:])])
