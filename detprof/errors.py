"""detprof's exit codes, and the two kinds of failure a user can cause.

Every command turns these failures into one line on stderr, never a traceback, so that
callers (CI scripts above all) can tell "you called me wrong" (2) from "your input or
measurement is unusable" (3), and both from an answer (0, 1) or a crash (70).
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Every exit code detprof documents, and nothing else: README's "Commands" lists them."""

    OK = 0
    CHECK_FAILED = 1
    """The answer a check exists to give is no: ``check`` found a regression, ``doctor`` a machine not ready."""
    USAGE = 2
    """Bad arguments or options (``UsageError``)."""
    INPUT = 3
    """Input or a measurement that cannot be used (``InputError``); ``check``: results not comparable."""
    INTERNAL = 70
    """A bug in detprof, never its input or measurement: EX_SOFTWARE of sysexits.h."""
    INTERRUPTED = 130
    """Ctrl-C (128 + SIGINT, as a shell reports it); every completed run is kept."""


class DetprofError(Exception):
    """A problem the user can act on; the message is the whole explanation."""

    exit_code: ExitCode = ExitCode.INPUT


class UsageError(DetprofError):
    """Bad arguments or options (exit 2)."""

    exit_code = ExitCode.USAGE


class InputError(DetprofError):
    """A file or measurement that cannot be used: missing, corrupt, empty (exit 3)."""

    exit_code = ExitCode.INPUT


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
