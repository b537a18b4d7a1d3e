"""Exclusive locks: one detprof per results folder, and one measurement per device.

Two sweeps into one ``--out`` overwrite each other's records, and two measurements on one
device (the CPU, or a GPU) each time the other's load: both results are wrong, and nothing
in them says so. A results folder is locked when a study opens it (``ResultsStore.open``);
the second command refuses, naming the holder. A device is locked while runs are measured on
it; the second measurement waits, and says whom for, or refuses with ``--no-wait``.

The locks are ``flock``s on files that name their holder (pid, host, command, since when). The
kernel drops a ``flock`` when its process dies however it died, so a crashed holder never
blocks anyone; its file still names it, and the next holder says it took over. A process
holds each lock once however often it asks, for the ``holding`` block that took it (a knob
study measures, then verifies, inside one); giving it back empties the file, so that a finished
holder leaves no note behind. Long-lived processes (a Ray node's workers) therefore never keep
a lock past the measurement that needed it. A CPU session's core is claimed apart from these
(``claimed_core``): a preference that never waits.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from detprof.errors import EnvironmentFailure, UsageError, environment_failure

LOCK_DIR_ENV = "DETPROF_LOCK_DIR"
"""Where the device locks live (default: the system's temporary folder), shared by every detprof on the machine."""
RESULTS_LOCK = ".detprof.lock"

_held: dict[Path, list[int]] = {}
"""Lock file -> [its descriptor, how many ``holding`` blocks of this process hold it]."""


def device_lock_path(device_key: str) -> Path:
    folder = Path(os.environ.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "detprof-locks")
    return folder / f"{device_key}.lock"


@contextlib.contextmanager
def holding(
    results: Path, device: tuple[str, str] | None, *, wait: bool = True, first: Callable[[], object] | None = None
) -> Iterator[None]:
    """Hold the results folder ``results`` and the device (``(lock key, label)``; None: no device) for the block.

    The folder is held first: a second command into it refuses in one line rather than waiting
    for the device, and so does ``first`` (opening the folder's study: a ``--resume`` of another
    configuration is refused without waiting for another detprof's measurement to end). What this
    block took is given back when it ends, however it ends; what an enclosing block holds stays
    held (a knob study measures, then verifies, in one block).
    """
    try:
        results.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        unusable = UsageError(f"cannot write results to {results}: {exc.strerror or exc}")
        raise environment_failure(exc) or unusable from exc
    taken: list[Path] = []
    try:
        path = results / RESULTS_LOCK
        if not _take(path, wait=False):
            raise EnvironmentFailure(
                f"{results} is in use by another detprof ({_holder_words(path)}): wait for it to finish, or choose "
                "another --out"
            )
        taken.append(path)
        if first is not None:
            first()
        if device is not None:
            taken.append(_hold_device(*device, wait=wait))
        yield
    finally:
        for path in reversed(taken):
            _give_back(path)


def _hold_device(device_key: str, label: str, *, wait: bool) -> Path:
    """The device's lock, at once, else waiting (saying for whom) or refusing."""
    path = device_lock_path(device_key)
    if _take(path, wait=False):
        return path
    holder = _holder_words(path)
    if not wait:
        raise EnvironmentFailure(f"{label} is being measured by another detprof ({holder}); --no-wait refuses to wait")
    _note(f"waiting for {label}: another detprof is measuring on it ({holder}); --no-wait refuses instead")
    _take(path, wait=True)
    return path


CORE_CLAIMS = Path(tempfile.gettempdir()) / "detprof-cores"
"""Where a session's core is claimed: one folder for the machine, whatever ``DETPROF_LOCK_DIR`` says, since the
cores are the machine's."""


@contextlib.contextmanager
def claimed_core(cores: Sequence[int], folder: Path | None = None) -> Iterator[int]:
    """The first of ``cores`` (in the order preferred) that no other detprof's session has claimed, claimed for the
    block; the first of them where every one is claimed.

    A measurement holds the CPU's device lock, so another waits; but one that keeps its device locks apart (the
    suite's tests side by side) measures at the same time, and both pinned their measured steps to the first core.
    Two measured processes on one core each get half of it, or less beside a process of many threads: beside
    another sweep pinned there, a PyTorch sweep's steps took twice their time and the standard deviation of its
    ratio over eight repeats was 0.12, against 0.014 with the other sweep pinned to the other core (0.025 alone). A
    claim never waits and never fails a measurement: where none can be claimed, the core is shared.
    """
    for core in cores:
        try:
            fd = _flocked((folder or CORE_CLAIMS) / f"{core}.lock", wait=False)
        except OSError:
            continue
        if fd is None:
            continue
        try:
            yield core
        finally:
            os.close(fd)
        return
    yield cores[0]


def release_all() -> None:
    """Give back every lock this process holds (the end of ``cli.main``, however the command ended)."""
    for path in list(_held):
        _held[path][1] = 1
        _give_back(path)


def _give_back(path: Path) -> None:
    """One hold fewer; at none, the file is emptied (no holder) and the lock dropped."""
    entry = _held.get(path)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] > 0:
        return
    with contextlib.suppress(OSError):
        os.ftruncate(entry[0], 0)
    os.close(entry[0])
    del _held[path]


def _note(line: str) -> None:
    print(f"detprof: {line}", file=sys.stderr, flush=True)


def _take(path: Path, *, wait: bool) -> bool:
    if path in _held:
        _held[path][1] += 1
        return True
    name = json.dumps(_me()).encode()
    try:
        fd = _flocked(path, wait=wait)
    except OSError as exc:
        raise environment_failure(exc) or EnvironmentFailure(f"cannot use the lock file {path}: {exc}") from exc
    if fd is None:
        return False
    stale = _read_holder(path)
    if stale:
        _note(f"took over {path} from {_words(stale)}, which ended without giving it back")
    os.pwrite(fd, name, 0)
    os.ftruncate(fd, len(name))
    _held[path] = [fd, 1]
    return True


def _flocked(path: Path, *, wait: bool) -> int | None:
    """A descriptor holding ``path``'s ``flock`` (the file made where missing), or None where another holds it and
    ``wait`` is False."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _me() -> dict[str, object]:
    from detprof.invocation import command_line

    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return {"pid": os.getpid(), "host": socket.gethostname(), "command": command_line(), "since": now}


def _read_holder(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


NAMING_S = 2.0
"""How long a refusal waits for a holder that has just taken its lock to write its name there."""


def _holder_words(path: Path) -> str:
    """Who holds ``path``, waiting briefly where its file is still empty: a holder names itself just after its
    ``flock`` succeeds, so a second command started beside it can find the lock taken and the file not yet written
    (two sweeps started together on a loaded CPU did)."""
    deadline = time.monotonic() + NAMING_S
    while not (holder := _read_holder(path)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _words(holder) if holder else "its holder did not say who it is"


def _words(holder: dict[str, object]) -> str:
    return f"pid {holder.get('pid')} on {holder.get('host')}, `{holder.get('command')}` since {holder.get('since')}"
