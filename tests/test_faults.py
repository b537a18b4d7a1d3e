"""Faults a real machine throws, each a real one: two sweeps at once, a dead lock holder, SIGTERM, a full disk.

Every case ends in one clear line and its documented exit code, with nothing lost or recorded
twice, and ``--resume`` completes the work. The sweeps are small PyTorch ones (its workers start
fastest) without a tracer, so that each takes seconds; their device locks live in a folder of
the test's own, shared by the commands it starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

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


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The commands' environment: one device-lock folder for all of them."""
    return {**os.environ, locks.LOCK_DIR_ENV: str(tmp_path / "device-locks"), "COLUMNS": "200"}


def records(out: Path) -> list[dict]:
    return list(ResultsStore(out, "sweep").records())


@pytest.mark.slow
def test_two_sweeps_started_together_into_one_folder_leave_one_complete_set(
    tmp_path: Path, env: dict[str, str]
) -> None:
    out = tmp_path / "out"
    together = [detprof("sweep", *SMALL, "--repeats", "2", "--out", out, env=env) for _ in range(2)]
    for sweep in together:
        sweep.wait(timeout=300)
    refused, ran = sorted(together, key=lambda p: p.returncode != ExitCode.ENVIRONMENT)
    assert ran.returncode == ExitCode.OK, ran.stderr.read()[-2000:]
    err = refused.stderr.read().strip()
    assert refused.returncode == ExitCode.ENVIRONMENT and err.count("\n") == 0, err
    assert f"{out / 'sweep'} is in use by another detprof (pid {ran.pid} on " in err
    assert sorted(r["run_id"] for r in records(out)) == sorted(
        f"smallcnn--{mode}--r{repeat}" for mode in ("default", "deterministic") for repeat in range(2)
    )
    assert all(r["status"] == "ok" for r in records(out))


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout:g} s")
        time.sleep(0.1)


def holds(path: Path, pid: int) -> bool:
    try:
        return json.loads(path.read_text() or "{}").get("pid") == pid
    except (OSError, ValueError):
        return False


@pytest.mark.slow
def test_a_second_measurement_on_the_device_waits_and_says_so_or_refuses_with_no_wait(
    tmp_path: Path, env: dict[str, str]
) -> None:
    holder = detprof("sweep", *SMALL, "--repeats", "2", "--out", tmp_path / "first", env=env)
    device_lock = Path(env[locks.LOCK_DIR_ENV]) / "cpu.lock"
    wait_until(lambda: holds(device_lock, holder.pid), 120, "device lock held by the first sweep")
    rushed = detprof("sweep", *SMALL, "--repeats", "1", "--out", tmp_path / "second", "--no-wait", env=env)
    assert rushed.wait(timeout=120) == ExitCode.ENVIRONMENT
    err = rushed.stderr.read().strip()
    assert err.count("\n") == 0 and f"cpu is being measured by another detprof (pid {holder.pid} on " in err
    patient = detprof("sweep", *SMALL, "--repeats", "1", "--out", tmp_path / "second", env=env)
    assert holder.wait(timeout=300) == ExitCode.OK and patient.wait(timeout=300) == ExitCode.OK
    assert f"waiting for cpu: another detprof is measuring on it (pid {holder.pid} on " in patient.stderr.read()
    last_of_first = max(r["finished_at"] for r in records(tmp_path / "first"))
    assert min(r["started_at"] for r in records(tmp_path / "second")) >= last_of_first
    assert device_lock.read_text() == ""


def test_a_lock_whose_holder_died_is_taken_over_with_a_note(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "results"
    folder.mkdir()
    script = (
        f"import os, pathlib\nfrom detprof import locks\nwith locks.holding(pathlib.Path({str(folder)!r}), None):\n"
    )
    subprocess.run([sys.executable, "-c", f"{script}    os._exit(0)"], cwd=ROOT, check=True)
    with locks.holding(folder, None):
        holder = json.loads((folder / locks.RESULTS_LOCK).read_text())
        assert holder["pid"] == os.getpid()
    err = capsys.readouterr().err
    assert f"took over {folder / locks.RESULTS_LOCK} from pid " in err and "ended without giving it back" in err
    assert (folder / locks.RESULTS_LOCK).read_text() == ""


def workers_of(out: Path) -> list[int]:
    """Processes whose command line names the results folder: the sweep's workers."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and str(out) in cmdline and "detprof.cli" not in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


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


@pytest.mark.slow
def test_sigterm_to_the_driver_alone_stops_the_workers_keeps_the_runs_and_resume_completes(
    tmp_path: Path, env: dict[str, str]
) -> None:
    out = tmp_path / "out"
    driver = sweep_with_a_record(out, 2, env)
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=60) == ExitCode.TERMINATED
    err = driver.stderr.read()
    assert f"terminated (SIGTERM): every completed run is kept in {out / 'sweep'}; --resume continues" in err
    assert "Traceback" not in err
    wait_until(lambda: not workers_of(out), 10, "end of the workers")
    kept = {r["run_id"] for r in records(out)}
    assert kept and len(kept) < 4
    assert_resume_completes(out, 2, kept, env)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs: a real file system that fills up (mounting one needs root, as in CI's container)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path) -> Path:
    """Write until the file system refuses: no byte left."""
    filler = disk / "filler"
    with open(filler, "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass
    return filler


@pytest.mark.slow
def test_a_disk_that_fills_up_mid_sweep_is_one_line_exit_74_and_resume_completes(
    small_disk: Path, env: dict[str, str]
) -> None:
    out = small_disk / "out"
    driver = sweep_with_a_record(out, 3, env)
    filler = fill(small_disk)
    assert driver.wait(timeout=300) == ExitCode.ENVIRONMENT
    err = [line for line in driver.stderr.read().splitlines() if line.startswith("detprof: error")]
    assert len(err) == 1 and "No space left on device" in err[0], err
    assert f"cannot write {out}" in err[0] and "MiB free there); every run recorded so far is kept" in err[0]
    kept = {r["run_id"] for r in records(out) if r["status"] == "ok"}
    filler.unlink()
    assert_resume_completes(out, 3, kept, env)
