"""detprof's exit codes, and the two kinds of failure a user can cause.

Every command turns these failures into one line on stderr, never a traceback, so that
callers (CI scripts above all) can tell "you called me wrong" (2) from "your input or
measurement is unusable" (3) and from "the machine refused" (74: a full disk, a permission,
results or a device another detprof holds), and all of them from an answer (0, 1) or a crash
(70).
"""

from __future__ import annotations

import errno
import os
import shutil
from enum import IntEnum
from pathlib import Path


class ExitCode(IntEnum):
    """Every exit code detprof documents, and nothing else: docs/reference/exit-codes.md lists them."""

    OK = 0
    CHECK_FAILED = 1
    """The answer a check exists to give is no: ``check`` found a regression, ``doctor`` a machine not ready."""
    USAGE = 2
    """Bad arguments or options (``UsageError``)."""
    INPUT = 3
    """Input or a measurement that cannot be used (``InputError``); ``check``: results not comparable."""
    INTERNAL = 70
    """A bug in detprof, never its input or measurement: EX_SOFTWARE of sysexits.h."""
    ENVIRONMENT = 74
    """The machine refused what detprof needs (``EnvironmentFailure``): a full disk, a read-only folder, a
    permission, a results folder or a device another detprof holds: EX_IOERR of sysexits.h."""
    INTERRUPTED = 130
    """Ctrl-C (128 + SIGINT, as a shell reports it); every completed run is kept."""
    TERMINATED = 143
    """SIGTERM (128 + SIGTERM), as a scheduler's preemption or ``systemctl stop`` sends it; every completed run
    is kept."""


class DetprofError(Exception):
    """A problem the user can act on; the message is the whole explanation."""

    exit_code: ExitCode = ExitCode.INPUT


class UsageError(DetprofError):
    """Bad arguments or options (exit 2)."""

    exit_code = ExitCode.USAGE


class InputError(DetprofError):
    """A file or measurement that cannot be used: missing, corrupt, empty (exit 3)."""

    exit_code = ExitCode.INPUT


class EnvironmentFailure(DetprofError):
    """The machine refused what detprof needs, not the user's input and not a bug (exit 74)."""

    exit_code = ExitCode.ENVIRONMENT


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread (``cli.main``): every path that ends a study cleanly on Ctrl-C (workers
    stopped, completed runs kept, the resume line) ends it the same way on SIGTERM."""


FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
"""A full disk or quota: where the space left is worth saying."""
ENVIRONMENT_ERRNOS = FULL_ERRNOS | {errno.EROFS, errno.EACCES, errno.EPERM}
"""``OSError``s that are the machine refusing (a full disk or quota, a read-only file system, a permission)."""


def environment_failure(exc: OSError) -> EnvironmentFailure | None:
    """One line for an ``OSError`` the machine caused: the path, why, the space left, and that the work so far is
    kept; None for any other error (a bug, reported as one)."""
    if exc.errno not in ENVIRONMENT_ERRNOS:
        return None
    path = exc.filename or "a file"
    full = exc.errno in FULL_ERRNOS
    free = _free_space(exc.filename) if full else None
    room = f" ({free} free there)" if free is not None else ""
    if exc.errno == errno.EROFS:
        return EnvironmentFailure(f"cannot write {path}: {exc.strerror or exc}: give a folder that can be written")
    fix = "free space" if full else "fix the permission"
    return EnvironmentFailure(
        f"cannot write {path}: {exc.strerror or exc}{room}; every run recorded so far is kept: {fix}, then run the "
        "same command with --resume"
    )


def output_failure(exc: OSError, refused: str) -> DetprofError:
    """``refused`` (what could not be written, and where) as one line with why: the machine refusing a file the user
    named (a permission, a full disk) exits 74, a path that cannot hold it (a folder, a missing parent) 3."""
    line = f"{refused}: {exc.strerror or exc}"
    return EnvironmentFailure(line) if exc.errno in ENVIRONMENT_ERRNOS else InputError(line)


def _free_space(filename: object) -> str | None:
    if not isinstance(filename, str | os.PathLike):
        return None
    folder = Path(filename)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    return f"{free / 2**20:,.1f} MiB"


_TF_GRAPH_ERROR = "Graph execution error:"
_TF_NODE_HEADER = "Detected at node"


def first_line(exc: BaseException, *, with_type: bool = False) -> str:
    """The first non-blank line of an exception's message, for a one-line reason.

    TensorFlow and Keras messages run to many lines (stack excerpts, node lists); a record or
    an error line keeps only the first. An empty message falls back to the exception's type.
    ``with_type`` prefixes the type, for reasons read without the code that raised them.
    A ``tf.function`` error starts with "Graph execution error:" and an indented stack
    excerpt; the message that says what went wrong is the first line after them.
    """
    lines = [line for line in str(exc).splitlines() if line.strip()]
    if lines and lines[0].strip() == _TF_GRAPH_ERROR:
        lines = [line for line in lines[1:] if not line[0].isspace() and not line.startswith(_TF_NODE_HEADER)]
    line = lines[0].strip() if lines else ""
    if not line:
        return type(exc).__name__
    return f"{type(exc).__name__}: {line}" if with_type else line


def last_line(text: str) -> str:
    """The last non-blank line of a child process's output, where its fatal error is; empty when none."""
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")
