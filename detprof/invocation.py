"""The command line as the user typed it: stored in every manifest so a report can say how to reproduce it.

``sys.argv`` is not enough: tests and ``detprof check --run`` call the CLI in-process with
their own argument lists.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass

_args: list[str] | None = None


@dataclass(frozen=True)
class Invocation:
    """How a study's command was given: its command line (kept in the manifest), whether it resumes a folder, and
    whether it waits for a device or folder that another detprof holds instead of refusing."""

    command: str
    resume: bool = False
    wait: bool = True

    @classmethod
    def of(cls, resume: bool, wait: bool) -> Invocation:
        """This process's command line, as the user typed it."""
        return cls(command_line(), resume, wait)


def remember(args: list[str]) -> None:
    global _args
    _args = list(args)


def command_line() -> str:
    return shlex.join(["detprof", *(_args if _args is not None else sys.argv[1:])])


def resumed_in(command: str, folder: str) -> str:
    """``command`` continuing the study in ``folder``: the folder it is read from now, which is not the ``--out`` it
    was given where the results were moved or copied (from a server, a CI artifact), nor found by its configuration
    in the day's folder where it was given none and that day has passed."""
    args, skip = [], False
    for arg in shlex.split(command):
        if skip or arg == "--resume" or arg.startswith("--out="):
            skip = False
            continue
        skip = arg == "--out"
        if not skip:
            args.append(arg)
    return shlex.join([*args, "--out", folder, "--resume"])
