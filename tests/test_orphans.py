"""No orphans: a driver killed with SIGKILL takes its workers with it, however they were started.

Each test starts a real driver (``detprof sweep``, ``detprof stability``, or a script that
runs a worker behind a wrapper process as nsys does) whose workers would run for minutes,
waits until they exist, SIGKILLs the driver and gives the workers a few seconds to notice.
Processes are found through /proc: each one's parent, state and command line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from script_runner import ROOT, SCRIPTS

STARTUP_S = 120.0
"""How long workers may take to appear: they import TensorFlow on a loaded 2-core machine."""
NOTICE_S = 10.0
"""How long a worker may take to end once its driver is gone (it ends within milliseconds)."""
DRIVER_GONE = "its driver process is gone"


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str
    cmdline: str


def processes() -> dict[int, Proc]:
    """Every process /proc shows now; one that ends while it is read is left out."""
    found: dict[int, Proc] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        # The command name in parentheses may hold spaces; the fields after it are fixed.
        state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
        found[int(entry.name)] = Proc(int(entry.name), int(ppid), state, cmdline)
    return found


def alive(pid: int) -> bool:
    """Running: present and not a zombie waiting to be reaped."""
    proc = processes().get(pid)
    return proc is not None and proc.state not in ("Z", "X")


def wait_for(condition: Callable[[], list[Proc]], timeout: float, what: str) -> list[Proc]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.2)
    pytest.fail(f"no {what} within {timeout:g} s")


def children(parent: int, marker: str, count: int = 1, *, busy: bool = False) -> Callable[[], list[Proc]]:
    """The children of ``parent`` whose command line holds ``marker``, once there are ``count`` of them
    (``busy``: and each has loaded TensorFlow, so it is at work, not waiting for its driver to speak)."""

    def found() -> list[Proc]:
        matching = [p for p in processes().values() if p.ppid == parent and marker in p.cmdline]
        ready = [p for p in matching if not busy or loaded_tensorflow(p.pid)]
        return ready if len(ready) >= count else []

    return found


def loaded_tensorflow(pid: int) -> bool:
    try:
        return "libtensorflow_framework" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def kill_and_expect_gone(driver: subprocess.Popen[bytes], workers: list[Proc]) -> None:
    """SIGKILL the driver; every worker must be gone within ``NOTICE_S``."""
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + NOTICE_S
    while time.monotonic() < deadline and any(alive(w.pid) for w in workers):
        time.sleep(0.1)
    left = [w for w in workers if alive(w.pid)]
    for worker in left:
        os.kill(worker.pid, signal.SIGKILL)
    assert not left, f"orphaned workers still running {NOTICE_S:g} s after their driver was killed: {left}"


def detprof(*args: str | Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "detprof.cli", *map(str, args)], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT
        )


def logs_saying(folder: Path, text: str) -> list[Path]:
    return [log for log in folder.rglob("*.log") if text in log.read_text(errors="replace")]


@pytest.mark.slow
def test_a_killed_sweep_takes_its_workers_with_it(tmp_path: Path) -> None:
    """A CPU sweep's two lockstep workers, killed mid warm-up (which alone would take many minutes)."""
    driver = detprof(
        "sweep", "--models", "smallcnn", "--steps", "2", "--repeats", "2", "--warmup", "1000000",
        "--pairing", "processes", "--no-report", "--out", tmp_path / "out",
        log=tmp_path / "driver.log",
    )  # fmt: skip
    try:
        workers = wait_for(children(driver.pid, "detprof.profiler.worker", 2, busy=True), STARTUP_S, "sweep workers")
        kill_and_expect_gone(driver, workers)
    finally:
        driver.kill()
    assert len(logs_saying(tmp_path / "out" / "sweep" / "logs", DRIVER_GONE)) == 2


@pytest.mark.slow
def test_a_killed_stability_study_takes_its_pool_with_it(tmp_path: Path) -> None:
    driver = detprof(
        "stability", "--variants", "control", "--runs", "2", "--epochs", "100000", "--jobs", "1",
        "--out", tmp_path / "out",
        log=tmp_path / "driver.log",
    )  # fmt: skip
    try:
        workers = wait_for(children(driver.pid, "multiprocessing.spawn", busy=True), STARTUP_S, "pool workers")
        kill_and_expect_gone(driver, workers)
    finally:
        driver.kill()
    assert logs_saying(tmp_path / "out" / "stability" / "logs", DRIVER_GONE)


def test_a_killed_program_sweep_takes_the_program_with_it(tmp_path: Path) -> None:
    """A training program run by ``sweep --command`` ends with detprof through its sitecustomize hook."""
    program = tmp_path / "train_forever.py"
    program.write_text("import time\nwhile True:\n    time.sleep(0.1)\n")
    driver = detprof(
        "sweep", "--command", f"{sys.executable} {program}", "--name", "forever", "--tracer", "none",
        "--repeats", "1", "--no-report", "--out", tmp_path / "out",
        log=tmp_path / "driver.log",
    )  # fmt: skip
    try:
        programs = wait_for(children(driver.pid, "train_forever.py"), STARTUP_S, "program")
        time.sleep(1.0)  # past the interpreter's start-up, where the hook starts watching
        kill_and_expect_gone(driver, programs)
    finally:
        driver.kill()
    assert logs_saying(tmp_path / "out" / "sweep" / "logs", "detprof program: its driver process is gone")


def test_a_worker_behind_a_wrapper_ends_with_the_driver_not_the_wrapper(tmp_path: Path) -> None:
    """The worker's parent is a wrapper process (as under nsys); it still ends when the driver dies, and then so
    does the wrapper."""
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    driver = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "lifeline_driver.py"), str(tmp_path)], stdout=subprocess.PIPE, env=environ
    )
    try:
        assert driver.stdout is not None
        wrapper = int(driver.stdout.readline())
        workers = wait_for(children(wrapper, "detprof.profiler.worker"), STARTUP_S, "worker behind the wrapper")
        kill_and_expect_gone(driver, [*workers, processes()[wrapper]])
    finally:
        driver.kill()
    assert DRIVER_GONE in (tmp_path / "worker.log").read_text()
