"""Ctrl-C and SIGTERM as one exception in the main thread, raised again where Python swallowed it.

Python raises ``KeyboardInterrupt`` wherever the main thread happens to be when the signal
lands. Inside a weakref callback or a ``__del__`` (``concurrent.futures`` runs one whenever a
pool's executor is collected) the exception cannot propagate: the interpreter prints "Exception
ignored in ..." with a traceback and goes on, and a study would train every remaining run as if
nothing had happened. Here each signal is remembered as well as raised; such a swallowed
interrupt prints nothing, and the long loops (runs of a study, a pool's results) call
``raise_pending`` between waits, so the command stops there as if it had been raised the
first time. SIGTERM (a scheduler's preemption, ``systemctl stop``) is ``Terminated``, a
``KeyboardInterrupt``: every path that ends a study cleanly on Ctrl-C ends it the same way.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from detprof.errors import Terminated

_pending: list[KeyboardInterrupt] = []
_handling: list[int] = []
"""The signals ``handled`` raises on, while it is in effect."""


def _raise(signum: int, frame: FrameType | None) -> None:
    stop = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
    if not _pending:
        _pending.append(stop)
    raise stop


def raise_pending() -> None:
    """Raise the interrupt the command received, if one was swallowed before it could stop it."""
    if _pending:
        raise _pending[0]


def terminated(stop: KeyboardInterrupt) -> bool:
    """Whether ``stop`` ends the command for SIGTERM, though a library re-raised it as a plain Ctrl-C
    (Ray turns whatever interrupts its waits into a new ``KeyboardInterrupt``)."""
    return isinstance(_pending[0] if _pending else stop, Terminated)


def reclaim() -> None:
    """Take SIGINT and SIGTERM back from a library that set its own (``ray.init`` makes SIGTERM a bare
    ``sys.exit``): inside ``handled`` they stop the command as Ctrl-C does, whoever set them last."""
    if _handling and threading.current_thread() is threading.main_thread():
        for signum in _handling:
            signal.signal(signum, _raise)


@contextmanager
def handled() -> Iterator[None]:
    """For the life of one command: SIGINT and SIGTERM raise, are remembered, and are never printed as ignored.

    A signal the command was started with ignored (SIGINT in a shell's background job) stays ignored.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not signal.SIG_IGN]
    previous = {signum: signal.signal(signum, _raise) for signum in caught}
    _handling[:] = caught
    previous_hook = sys.unraisablehook

    def quiet_interrupts(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            previous_hook(unraisable)

    sys.unraisablehook = quiet_interrupts
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        sys.unraisablehook = previous_hook
        _pending.clear()
        _handling.clear()
