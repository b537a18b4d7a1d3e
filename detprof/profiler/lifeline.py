"""Processes that end with the detprof process that started them, however it ended.

A worker left running when its driver is killed (``kill -9``, a lost node) goes on measuring
beside the ``--resume`` started meanwhile, and on a GPU keeps its device memory. The driver
makes one pipe (``driver_lifeline``), keeps its write end, never writes to it and never lets
a child inherit it, and passes the read end to every process it starts. Each of them watches
that end (``end_with_driver``): a read blocks until the kernel closes the write end as the
driver dies, SIGKILL included, and then returns end-of-file. Unlike a parent-death signal, the
pipe reaches the worker through a process that wraps it and passes its open files on (under
nsys the worker's parent is nsys, not the driver).

This module imports only the standard library: the ``sitecustomize`` hook of a program that
``detprof sweep --command`` runs loads it by path into interpreters without detprof.
"""

from __future__ import annotations

import functools
import os
import stat
import threading
from collections.abc import Mapping

DRIVER_PIPE_ENV = "DETPROF_DRIVER_PIPE"
"""``FD:INODE``: the read end of the driver's lifeline pipe that a process it started inherits."""
DRIVER_GONE_EXIT = 1


@functools.cache
def driver_lifeline() -> tuple[dict[str, str], tuple[int, ...]]:
    """What a child needs to end with this process: the variable that names the lifeline, and its fd to pass.

    The pipe is made once per driver process; ``os.pipe`` fds are not inherited unless passed
    (``pass_fds``), so the write end stays here and closes only when this process ends.
    """
    read_end, _write_end = os.pipe()
    return {DRIVER_PIPE_ENV: f"{read_end}:{os.fstat(read_end).st_ino}"}, (read_end,)


def end_with_driver(fd: int, who: str = "detprof worker") -> None:
    """Exit this process as soon as the write end of the pipe ``fd`` reads from is closed."""

    def watch() -> None:
        while os.read(fd, 1):
            pass
        os.write(2, f"{who}: its driver process is gone; exiting\n".encode())
        os._exit(DRIVER_GONE_EXIT)

    threading.Thread(target=watch, name="detprof-driver-lifeline", daemon=True).start()


def inherited_lifeline(environ: Mapping[str, str]) -> int | None:
    """The lifeline's fd when this process holds that very pipe (its inode matches), else None.

    A wrapper that closed the fd, or opened something else under its number, must not make
    the process read a file that ends at once and exit for nothing; a process started with
    no lifeline (by hand, or by a wrapper that closed it) has none to watch.
    """
    fd, _, inode = environ.get(DRIVER_PIPE_ENV, "").partition(":")
    if not (fd.isdigit() and inode.isdigit()):
        return None
    try:
        found = os.fstat(int(fd))
    except OSError:
        return None
    return int(fd) if stat.S_ISFIFO(found.st_mode) and found.st_ino == int(inode) else None
