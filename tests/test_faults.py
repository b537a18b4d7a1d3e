"""Faults a real machine throws, each a real one: two sweeps at once, a dead lock holder, a full disk, another
process loading the CPU, a worker that exits before its session's last pair (signals, and a worker killed by one:
``test_signals``).

Every case ends in one clear line and its documented exit code, with nothing lost or recorded
twice, and ``--resume`` completes the work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_sweeps import (
    SMALL,
    assert_resume_completes,
    cpu_hog,
    detprof,
    records,
    sweep_with_a_record,
    wait_until,
)
from script_runner import ROOT

from detprof import locks
from detprof.cli import main
from detprof.errors import EnvironmentFailure, ExitCode
from detprof.store import ResultsStore

EXITS_IN_A_WORKER = """
import os
from pathlib import Path

import torch


def model():
    inspected = Path(__file__).with_suffix(".inspected")
    if inspected.exists():
        print("the module's builder ends its worker", flush=True)
        os._exit(7)
    inspected.touch()  # the sweep reads what the function returns in a process of its own first
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(10))
"""


@pytest.mark.slow
@pytest.mark.parametrize(("pairing", "workers"), [("in-process", 1), ("lockstep", 2)])
def test_a_worker_that_exits_before_its_sessions_last_pair_is_named_and_fresh_workers_measure_the_rest(
    tmp_path: Path, fault_env: dict[str, str], pairing: str, workers: int
) -> None:
    """A session's worker (one per pair in process, one per mode in lockstep) exits as it builds the first pair's
    model: that pair's runs are failed with the worker's last words, a line names each worker that ended and the
    log that holds what it said, and fresh workers measure the pair left."""
    (tmp_path / "exits.py").write_text(EXITS_IN_A_WORKER)
    out = tmp_path / "out"
    args = [f"{tmp_path / 'exits.py'}:model,smallcnn" if arg == "smallcnn" else arg for arg in SMALL]
    done = detprof("sweep", *args, "--repeats", "1", "--pairing", pairing, "--out", out, env=fault_env)
    assert done.wait(timeout=300) == ExitCode.OK, done.stderr.read()[-2000:]
    by_id = {r["run_id"]: r for r in records(out)}
    last_words = "the module's builder ends its worker"
    for mode in ("default", "deterministic"):
        assert by_id[f"model--{mode}--r0"]["reason"] == f"worker crashed (exit code 7): {last_words}"
        assert by_id[f"smallcnn--{mode}--r0"]["status"] == "ok"
    said = [line for line in done.stderr.read().splitlines() if "exited with code 7" in line]
    assert len(said) == workers, said
    for line in said:
        assert "(1 of 2) exited with code 7; fresh workers measure the 1 left; its last output is in logs/" in line
        log = out / "sweep" / line.rsplit(" ", 1)[1]
        assert log.read_text().strip().endswith(last_words), line


def holds(path: Path, pid: int) -> bool:
    try:
        return json.loads(path.read_text() or "{}").get("pid") == pid
    except (OSError, ValueError):
        return False


@pytest.mark.slow
def test_a_second_measurement_on_the_device_waits_and_says_so_or_refuses_with_no_wait(
    tmp_path: Path, fault_env: dict[str, str]
) -> None:
    holder = detprof("sweep", *SMALL, "--repeats", "2", "--out", tmp_path / "first", env=fault_env)
    device_lock = Path(fault_env[locks.LOCK_DIR_ENV]) / "cpu.lock"
    wait_until(lambda: holds(device_lock, holder.pid), 120, "device lock held by the first sweep")
    rushed = detprof("sweep", *SMALL, "--repeats", "1", "--out", tmp_path / "second", "--no-wait", env=fault_env)
    assert rushed.wait(timeout=120) == ExitCode.ENVIRONMENT
    err = rushed.stderr.read().strip()
    assert err.count("\n") == 0 and f"cpu is being measured by another detprof (pid {holder.pid} on " in err
    patient = detprof("sweep", *SMALL, "--repeats", "1", "--out", tmp_path / "second", env=fault_env)
    assert holder.wait(timeout=300) == ExitCode.OK and patient.wait(timeout=300) == ExitCode.OK
    assert f"waiting for cpu: another detprof is measuring on it (pid {holder.pid} on " in patient.stderr.read()
    last_of_first = max(r["finished_at"] for r in records(tmp_path / "first"))
    assert min(r["started_at"] for r in records(tmp_path / "second")) >= last_of_first
    assert device_lock.read_text() == ""


def test_a_resume_of_another_configuration_is_refused_before_the_device_is_waited_for(
    tmp_path: Path, fault_env: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--resume`` with other options needs no device to be refused: it is, while another detprof measures."""
    out = tmp_path / "out"
    ResultsStore(out, "sweep").open({"steps": 1}, "detprof sweep --steps 1", resume=False)
    monkeypatch.setenv(locks.LOCK_DIR_ENV, fault_env[locks.LOCK_DIR_ENV])
    device_lock = Path(fault_env[locks.LOCK_DIR_ENV]) / "cpu.lock"
    device_lock.parent.mkdir(parents=True)
    script = f"import fcntl, os, sys\nfd = os.open({str(device_lock)!r}, os.O_RDWR | os.O_CREAT)\n"
    script += "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\nsys.stdin.read()\n"
    other = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline() == "held\n"
        code = main(["sweep", *SMALL, "--out", str(out), "--resume", "--no-wait", "--dry-run"])
        assert code == ExitCode.OK  # a dry run measures nothing: it neither opens the folder nor waits
        code = main(["sweep", *SMALL, "--out", str(out), "--resume", "--no-wait"])
    finally:
        other.communicate("")
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE and f"cannot resume {out / 'sweep'}: it holds a sweep of a different" in err, err


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


def test_a_refusal_names_a_holder_that_took_the_lock_and_names_itself_a_moment_later(tmp_path: Path) -> None:
    """A second sweep started beside the first can find the folder's lock taken and its file not yet written (on a
    loaded CPU it did): the refusal waits for the name rather than saying the holder never gave one."""
    folder = tmp_path / "results"
    folder.mkdir()
    lock = folder / locks.RESULTS_LOCK
    script = f"import fcntl, json, os, sys, time\nfd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\n"
    script += "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(0.5)\n"
    script += "os.pwrite(fd, json.dumps({'pid': os.getpid(), 'host': 'h'}).encode(), 0)\nsys.stdin.read()\n"
    other = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline() == "held\n"
        named = f"in use by another detprof \\(pid {other.pid} on h,"
        with pytest.raises(EnvironmentFailure, match=named), locks.holding(folder, None):
            pass
    finally:
        other.communicate("")


def test_a_session_claims_a_core_no_other_detprof_claimed_and_shares_one_where_all_are(tmp_path: Path) -> None:
    """Two measurements that keep their device locks apart (the suite's side by side) pin their steps to two cores,
    not both to the first: a core another process claimed is passed over, one this process claimed too, and where
    every core is claimed the first preferred is shared; a claim ends with its block, or with its process."""
    folder = tmp_path / "cores"
    script = f"import fcntl, os, sys\nfd = os.open({str(folder / '0.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
    script += "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\nsys.stdin.read()\n"
    folder.mkdir()
    other = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout is not None and other.stdout.readline() == "held\n"
        with locks.claimed_core([0, 1, 2], folder) as first, locks.claimed_core([1, 2, 0], folder) as second:
            assert (first, second) == (1, 2)
            with locks.claimed_core([2, 0, 1], folder) as shared:
                assert shared == 2
    finally:
        other.communicate("")
    with locks.claimed_core([0, 1], folder) as core, locks.claimed_core([1, 0], folder) as again:
        assert (core, again) == (0, 1)


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
    small_disk: Path, fault_env: dict[str, str]
) -> None:
    out = small_disk / "out"
    driver = sweep_with_a_record(out, 2, fault_env)
    filler = fill(small_disk)
    assert driver.wait(timeout=300) == ExitCode.ENVIRONMENT
    err = [line for line in driver.stderr.read().splitlines() if line.startswith("detprof: error")]
    assert len(err) == 1 and "No space left on device" in err[0], err
    assert f"cannot write {out}" in err[0] and "MiB free there); every run recorded so far is kept" in err[0]
    kept = {r["run_id"] for r in records(out) if r["status"] == "ok"}
    filler.unlink()
    assert_resume_completes(out, 2, kept, fault_env)


@pytest.mark.slow
def test_two_sweeps_started_together_beside_a_process_loading_the_cpu_leave_one_set_that_names_the_load(
    tmp_path: Path, fault_env: dict[str, str]
) -> None:
    """Two faults, one sweep's cost: a second sweep into the folder is refused in one line while the first measures
    one complete set, and the process loading the CPU meanwhile is named in its report and by ``check``."""
    out = tmp_path / "out"
    hog = cpu_hog()
    try:
        together = [detprof("sweep", *SMALL, "--repeats", "2", "--out", out, env=fault_env) for _ in range(2)]
        for sweep in together:
            sweep.wait(timeout=300)
    finally:
        hog.kill()
    refused, ran = sorted(together, key=lambda p: p.returncode != ExitCode.ENVIRONMENT)
    assert ran.returncode == ExitCode.OK, ran.stderr.read()[-2000:]
    err = refused.stderr.read().strip()
    assert refused.returncode == ExitCode.ENVIRONMENT and err.count("\n") == 0, err
    assert f"{out / 'sweep'} is in use by another detprof (pid {ran.pid} on " in err
    assert sorted(r["run_id"] for r in records(out)) == sorted(
        f"smallcnn--{mode}--r{repeat}" for mode in ("default", "deterministic") for repeat in range(2)
    )
    assert all(r["status"] == "ok" for r in records(out))
    loads = [r["load"] for r in records(out)]
    assert all(load["cores"] == len(os.sched_getaffinity(0)) for load in loads)
    assert sum(load["other_cores"] >= 0.25 for load in loads) >= 2, loads
    report = tmp_path / "report.md"
    assert detprof("report", out, "--format", "md", "-o", report, env=fault_env).wait(timeout=120) == ExitCode.OK
    assert "runs measured while other processes used up to " in report.read_text()
    baseline = tmp_path / "baseline.json"
    assert detprof("baseline", out, "-o", baseline, env=fault_env).wait(timeout=120) == ExitCode.OK
    check = detprof("check", "--baseline", baseline, "--current", out, "--github", env=fault_env)
    assert check.wait(timeout=120) == ExitCode.OK
    assert "runs measured while other processes used up to " in check.stderr.read()
    said = check.stdout.read()
    assert "::warning title=detprof check%3A device shared with other load::" in said, said
