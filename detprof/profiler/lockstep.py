"""Lockstep pairs: the coordinator in detprof's process and the pacer in each worker, and the messages between them.

In a lockstep pair the coordinator steps the deterministic and the default worker in turn
(A, B, A, B, ...), so that every pair of steps shares the machine's state. Per run a worker
says ``READY`` once warmed up, with the step time its warm-up measured (or ``FAILED``), then
runs one step per ``STEP`` line on its stdin and answers with the step's wall time in
nanoseconds (or ``FAILED``) until another command ends the phase; a ``TRACE`` line starts its
tracer and its settling step, answered by ``TRACED``, and ``END`` ends the run's last phase; it
says ``DONE`` once the run's result is written. The coordinator sizes the phases
(``worker_spec.sized_steps``) from both workers' warm-up, so that a pair takes the same steps on
both sides. The coordinator writes to the
worker's stdin, the worker answers on a control pipe it inherited (``WorkerSpec.control_fd``).
A process that runs both arms of a pair itself (``worker.pair_session``) is not stepped: it only
says ``DONE`` after each pair.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import IO, Protocol


class Message(StrEnum):
    READY = "ready"
    STEP = "step"
    TRACE = "trace"
    TRACED = "traced"
    END = "end"
    DONE = "done"
    FAILED = "failed"


class Paced(Protocol):
    """A worker as the coordinator sees it: its stdin, and its answers on the control pipe."""

    @property
    def stdin(self) -> IO[bytes] | None: ...

    @property
    def control(self) -> IO[str] | None: ...


def step_in_lockstep(workers: Sequence[Paced], wall_steps: int, traced_steps: int, size: Sizer | None = None) -> int:
    """Wait until each is warm, then one step each in turn, always in the same order (A, B, A, B, ...).

    The same order keeps the pair symmetric: each step follows a step of the other worker on
    the same core. Alternating who goes first (A, B, B, A, ...) lets a worker step twice in a
    row, on caches it had just warmed: in A/A pairs a step that followed the worker's own step
    ran faster than one that followed the other's, and the order of the steps then decided the
    ratio.

    First ``wall_steps`` untraced steps, then each worker in turn starts its tracer (and
    its settling step) while the other waits, then ``traced_steps`` traced steps: starting a
    profiler beside the other worker's step would disturb that step.

    A worker whose run fails (a refusal to run deterministically, out of memory) drops out
    and the other goes on alone: its run is no longer paired, but its kernels are still what
    the report shows of that mode.

    ``size`` turns the step times the workers' warm-ups measured into the steps of each phase
    (at most ``wall_steps``, ``traced_steps``); returns the steps each phase took.
    """
    ready = {id(w): _answer(w).split() for w in workers}
    alive = [w for w in workers if ready[id(w)][:1] == [Message.READY]]
    warm = [int(words[1]) for words in ready.values() if len(words) == 2 and words[1].isdigit()]
    steps = size(sum(warm) // len(warm) if warm else 0) if size is not None else max(wall_steps, traced_steps)
    alive = _in_turn(alive, Message.STEP, min(wall_steps, steps), str.isdigit)
    if traced_steps:
        alive = _in_turn(alive, Message.TRACE, 1, lambda answer: answer == Message.TRACED)
        alive = _in_turn(alive, Message.STEP, min(traced_steps, steps), str.isdigit)
    for worker in alive:
        _say(worker, Message.END)
    for worker in workers:
        wait_until_done(worker)
    return steps


def wait_until_done(worker: Paced) -> None:
    """Until the worker says ``DONE`` (its results written) or has gone."""
    while _answer(worker) not in (Message.DONE, ""):
        pass


def _in_turn(alive: list[Paced], command: Message, times: int, accepted: Callable[[str], bool]) -> list[Paced]:
    """``command`` to each worker in turn, ``times`` rounds; the workers whose answers were all accepted."""
    alive = list(alive)
    for _round in range(times):
        for worker in list(alive):
            if not _say(worker, command) or not accepted(_answer(worker)):
                alive.remove(worker)
        if not alive:
            break
    return alive


def _say(worker: Paced, command: Message) -> bool:
    """``command`` on the worker's stdin; False when it has gone."""
    assert worker.stdin is not None
    try:
        worker.stdin.write(f"{command}\n".encode())
        worker.stdin.flush()
    except OSError:
        return False
    return True


def _answer(worker: Paced) -> str:
    """The worker's next line on its control pipe; "" once it has gone."""
    assert worker.control is not None
    try:
        return worker.control.readline().strip()
    except (OSError, ValueError):
        return ""


Sizer = Callable[[int], int]
"""The steps of each phase, from a step's time in nanoseconds (0: unknown)."""


class Pacer:
    """When each measured step of a worker may run: at once, or when the coordinator says so."""

    def __init__(self, control_fd: int | None) -> None:
        self._control = None if control_fd is None else os.fdopen(control_fd, "w", buffering=1)
        self._owed = True
        self._pending: str | None = None

    @property
    def paced(self) -> bool:
        """Whether a coordinator paces the steps (and sizes the phases)."""
        return self._control is not None

    def _say(self, line: str) -> None:
        if self._control is not None:
            self._control.write(f"{line}\n")
        self._owed = False

    def begin(self) -> None:
        """A new run of the session: an answer is owed again, and the last run's ``END`` is spent."""
        self._owed = True
        self._pending = None

    def wait_for(self, command: Message) -> bool:
        """True when the coordinator says ``command`` next; False when it says another (kept for the next wait: the
        command that ends a phase starts the next) or has gone (its pipe closed)."""
        if self._control is None:
            return True
        self._owed = True
        said, self._pending = self._pending, None
        said = said if said is not None else sys.stdin.readline().strip()
        if said == command:
            return True
        self._pending = said or None
        return False

    def answer(self, line: str) -> None:
        """``READY`` and the warm-up's step time, ``TRACED``, or a step's wall time in nanoseconds."""
        self._say(line)

    def failed(self) -> None:
        """The run failed: answer what the coordinator is waiting for (the start, a step, the tracer)."""
        if self._owed:
            self._say(Message.FAILED)

    def written(self) -> None:
        self._say(Message.DONE)
