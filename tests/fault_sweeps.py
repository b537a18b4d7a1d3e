"""Starting a small sweep for a fault to strike, and watching what it leaves: shared by the fault tests.

The sweeps are small PyTorch ones (its workers start fastest) without a tracer, so that each
takes seconds; their device locks live in a folder of the test's own (``fault_env``), shared
by the commands it starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from script_runner import ROOT

from detprof import locks
from detprof.errors import ExitCode
from detprof.store import ResultsStore

SMALL = ["--backend", "torch", "--models", "smallcnn", "--input-size", "16", "--steps", "3", "--warmup", "1"]
SMALL += ["--tracer", "none", "--no-report"]


def detprof(*args: str | Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "detprof.cli", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )


def cpu_hog() -> psutil.Process:
    """A process that spins one core until killed and belongs to no detprof: started through a shell that exits."""
    started = subprocess.run(
        ["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    return psutil.Process(int(started.stdout))


@pytest.fixture
def fault_env(tmp_path: Path) -> dict[str, str]:
    """The commands' environment: one device-lock folder for all of them."""
    return {**os.environ, locks.LOCK_DIR_ENV: str(tmp_path / "device-locks"), "COLUMNS": "200"}


def records(out: Path) -> list[dict]:
    return list(ResultsStore(out, "sweep").records())


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout:g} s")
        time.sleep(0.1)


def processes_naming(text: str, *, but: str = "detprof.cli") -> list[int]:
    """Live processes whose command line holds ``text`` and not ``but``: a study's workers, by their folder."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and text in cmdline and but not in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def workers_of(out: Path) -> list[int]:
    """The sweep's workers: processes that name its results folder, the driver aside."""
    return processes_naming(str(out))


def assert_stopped(driver: subprocess.Popen[str], signum: int, study: Path) -> None:
    """The driver ended for ``signum`` in its exit code and one line that keeps ``study``'s runs; no traceback."""
    terminated = signum == signal.SIGTERM
    assert driver.wait(timeout=60) == (ExitCode.TERMINATED if terminated else ExitCode.INTERRUPTED)
    err = driver.stderr.read()
    why = "terminated (SIGTERM)" if terminated else "interrupted"
    assert f"{why}: every completed run is kept in {study}; --resume continues" in err
    assert "Traceback" not in err and "Exception ignored" not in err, err


def sweep_with_a_record(out: Path, repeats: int, env: dict[str, str]) -> subprocess.Popen[str]:
    """A sweep into ``out``, once it has recorded its first run: the moment each fault strikes."""
    driver = detprof("sweep", *SMALL, "--repeats", str(repeats), "--out", out, env=env)
    wait_until(lambda: any((out / "sweep" / "runs").glob("*.json")), 180, "first record")
    return driver


def assert_resume_completes(out: Path, repeats: int, kept: set[str], env: dict[str, str]) -> None:
    """``--resume`` measures what is missing: every run recorded once, ok, the runs kept among them."""
    resumed = detprof("sweep", *SMALL, "--repeats", str(repeats), "--out", out, "--resume", env=env)
    assert resumed.wait(timeout=300) == ExitCode.OK, resumed.stderr.read()[-2000:]
    done = records(out)
    assert len(done) == 2 * repeats and all(r["status"] == "ok" for r in done)
    assert kept <= {r["run_id"] for r in done}
