"""Worker processes: their environment, starting them, and ending them (on exit, on a timeout, or killed).

Every process detprof measures in (a worker, a program) gets the same environment
(``WorkerEnvironment``), runs in a session of its own so that its whole group can be killed,
and watches detprof's lifeline, so that it ends with the driver however the driver ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from detprof import backends
from detprof.device_time import spawn_env
from detprof.errors import last_line
from detprof.profiler.devices import DeviceChoice
from detprof.profiler.gpu_env import gpu_env
from detprof.profiler.lifeline import driver_lifeline

STEADY_HEAP_ENV: dict[str, str] = {
    "MALLOC_MMAP_THRESHOLD_": str(1 << 30),
    "MALLOC_TRIM_THRESHOLD_": str((1 << 32) - 1),
    "MALLOC_TOP_PAD_": str(1 << 28),
}
"""glibc malloc settings under which a worker's tensors reuse heap memory from step to step.

By default glibc hands buffers over 128 KiB (up to 32 MiB as its threshold adapts) to mmap and
gives freed memory back to the kernel, so each step page-faults its large tensors afresh, and how
much it does depends on the process: one worker of a lockstep pair ran slower than the other for a
whole run. Kept on the heap, every step after the warm-up touches memory it already has
(docs/concepts.md, "Three ways to pair the two modes"). Both modes get the same settings; a user's
own value wins (``setdefault``).

Address-space randomization stays on. Turned off, it steadied the step times while the heap
still moved, but it fixes each mode's layout by its command line (the two modes' run ids
differ in length), a bias between the modes that no A/A test can see. With the heap kept,
randomized layouts cost little and are a random effect the interval over pairs covers
(Mytkowicz et al., "Producing wrong data without doing anything obviously wrong", ASPLOS 2009).
"""
ONE_ARENA_ENV: dict[str, str] = {"MALLOC_ARENA_MAX": "1"}
"""For JAX on a CPU, every thread's allocations from the one heap that ``STEADY_HEAP_ENV`` keeps.

glibc gives each thread that allocates (XLA's CPU threads, the profiler's) an arena of its own, whose heaps those
settings do not hold on to. A small Flax module's traced steps took 15 ms or 115 ms by turns, its ops that write
fresh buffers (iota, broadcast, fusions) 10-60x slower in the slow ones; the medium CNN's op time was 4.6x its wall
time (335 ms against 73 ms a step). With one arena both held steady, op time about the wall time (75 ms against
76 ms). TensorFlow's CPU ops, which allocate from many threads at once, ran 1.8x slower with one arena (19 ms a
step, 35 with it), and PyTorch's were unchanged: one arena is JAX's alone. On a GPU tensors live in device
memory."""
TF_LOG_LEVEL = {"TF_CPP_MIN_LOG_LEVEL": "2"}
"""TensorFlow's warnings and errors in the worker's log, not every info line."""
Outcome = str | int
"""How a process ended: its exit status, "timeout", or why it could not start."""


@dataclass(frozen=True)
class WorkerEnvironment:
    """What detprof sets in the environment of every process it measures in."""

    device: DeviceChoice
    shares_gpu: bool = False
    """Whether another of detprof's workers runs on the GPU at the same time (``gpu_env``)."""
    backend: str | None = None
    """The framework its workers run (``ONE_ARENA_ENV`` is JAX's on a CPU); None: a program's, any."""

    def heap_env(self) -> dict[str, str]:
        """The heap settings detprof asks of its workers here (``STEADY_HEAP_ENV``, ``ONE_ARENA_ENV``)."""
        one_arena = self.backend == backends.JAX and self.device.gpu is None
        return STEADY_HEAP_ENV | (ONE_ARENA_ENV if one_arena else {})

    def detprof_env(self) -> dict[str, str]:
        """As it takes effect: a user's own logging and heap settings win; the GPU pinning always comes from
        ``gpu_env``."""
        env = {name: os.environ.get(name, value) for name, value in (TF_LOG_LEVEL | self.heap_env()).items()}
        return env | {"PYTHONUNBUFFERED": "1"} | gpu_env(self.device, shares_gpu=self.shares_gpu)

    def worker_env(self) -> dict[str, str]:
        """The whole environment: this process's, what detprof sets, and the lifeline it ends with."""
        return dict(os.environ) | self.detprof_env() | driver_lifeline()[0]

    def timing_env(self) -> dict[str, str]:
        """The heap settings the processes run with, as they take effect: each record keeps them."""
        env = self.detprof_env()
        return {name: env[name] for name in self.heap_env()}


def worker_command(spec_path: Path, result_path: Path | None = None) -> list[str]:
    """The worker's command line; a session's spec names each run's result path itself."""
    return [
        sys.executable,
        "-m",
        "detprof.profiler.worker",
        str(spec_path),
        *([str(result_path)] if result_path else []),
    ]


def spawn(
    command: list[str],
    env: dict[str, str],
    stdout: Path,
    *,
    stderr: Path | None = None,
    control_write: int | None = None,
) -> subprocess.Popen[bytes]:
    """``command`` in a session of its own, its output to files, the lifeline (and a control pipe) passed on.

    A lockstep worker (``control_write``) reads the coordinator's commands on its stdin; every process learns when
    it was started (``device_time.spawn_env``), where its time accounting begins.
    """
    with open(stdout, "wb") as out, open(stderr or os.devnull, "wb") as err:
        return subprocess.Popen(
            command,
            env=env | spawn_env(),
            stdin=subprocess.DEVNULL if control_write is None else subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT if stderr is None else err,
            start_new_session=True,
            pass_fds=driver_lifeline()[1] + (() if control_write is None else (control_write,)),
        )


def timeout_reason(timeout_s: float | None) -> str:
    return f"timed out after {timeout_s:g} s (--run-timeout)"


def wait_for_exit(proc: subprocess.Popen[bytes], timeout: float | None) -> Outcome:
    """The exit status, or "timeout" once ``timeout`` passed (the process group killed)."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return "timeout"
    except BaseException:
        kill_group(proc)
        raise


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def watchdog(
    timeout_s: float | None, procs: Sequence[subprocess.Popen[bytes] | None]
) -> tuple[threading.Timer | None, threading.Event]:
    """A timer (None without a timeout) that kills ``procs`` when it fires, and the event it sets."""
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        for proc in procs:
            if proc is not None:
                kill_group(proc)

    return (None if timeout_s is None else threading.Timer(timeout_s, expire)), expired


def last_log_line(log_path: Path) -> str:
    try:
        line = last_line(log_path.read_text(errors="replace"))
    except OSError:
        return "no output"
    return line[:300] or "no output"
