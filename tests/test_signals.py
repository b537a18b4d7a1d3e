"""Signals a real machine sends (SIGTERM from a scheduler, SIGINT from ``timeout -s INT``, the OOM killer's SIGKILL).

Sent to the driver alone, whatever the command (sweep, kernels, stability on every backend) and
whenever it lands, the command stops with one line and its exit code, prints no traceback, ends its
workers, keeps every completed run, and ``--resume`` completes the work.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import psutil
import pytest
from fault_sweeps import (
    SMALL,
    assert_resume_completes,
    assert_stopped,
    detprof,
    records,
    sweep_with_a_record,
    wait_until,
    workers_of,
)

from detprof.errors import ExitCode
from detprof.reports.command import render_report


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "moment"), [(signal.SIGTERM, "first record"), (signal.SIGINT, "first worker")])
def test_a_signal_to_the_driver_alone_stops_the_workers_keeps_the_runs_and_resume_completes(
    tmp_path: Path, fault_env: dict[str, str], signum: signal.Signals, moment: str
) -> None:
    out = tmp_path / "out"
    if moment == "first record":
        driver = sweep_with_a_record(out, 2, fault_env)
    else:
        driver = detprof("sweep", *SMALL, "--repeats", "2", "--out", out, env=fault_env)
        wait_until(lambda: bool(workers_of(out)), 120, "first worker")
    driver.send_signal(signum)
    assert_stopped(driver, signum, out / "sweep")
    wait_until(lambda: not workers_of(out), 10, "end of the workers")
    kept = {r["run_id"] for r in records(out)}
    assert len(kept) < 4 and (kept or moment == "first worker")
    assert_resume_completes(out, 2, kept, fault_env)


@pytest.mark.slow
def test_a_worker_killed_mid_run_is_recorded_as_failed_with_why_and_resume_reruns_it(
    tmp_path: Path, fault_env: dict[str, str]
) -> None:
    out = tmp_path / "out"
    driver = detprof("sweep", *SMALL, "--repeats", "1", "--out", out, env=fault_env)
    wait_until(lambda: bool(workers_of(out)), 120, "first worker")
    victim = workers_of(out)[0]
    os.kill(victim, signal.SIGKILL)
    driver.wait(timeout=300)
    failed = [r for r in records(out) if r["status"] == "failed"]  # both modes of its pair: one process ran them
    assert len(failed) == 2 and all("worker crashed (exit code -9)" in r["reason"] for r in failed), failed
    assert failed[0]["repeat"] == failed[1]["repeat"] and failed[0]["model"] == failed[1]["model"]
    study = out / "sweep"
    with (study / failed[0]["log"]).open("a") as log:  # whatever the killed worker had said (here, at once, nothing)
        log.write("the killed attempt's last words\n")
    killed_log = (study / failed[0]["log"]).read_text()
    assert_resume_completes(out, 1, set(), fault_env)
    # The measured-again runs say why the attempt before failed and where its log is kept, as the report does.
    kept = f"{failed[0]['log'].removesuffix('.log')}.failed-1.log"
    for record in records(out):
        assert record["earlier_failures"] == [f"{failed[0]['reason']} (its log: {kept})"], record
    assert (study / kept).read_text() == killed_log
    said = f"2 runs measured again after an attempt that failed; {failed[0]['run_id']}'s: {failed[0]['reason']}"
    warnings = json.loads(render_report([out], "json"))["warnings"]
    assert any(line.endswith(f"{said} (its log: {kept})") for line in warnings), warnings


@pytest.mark.slow
def test_sigint_to_the_driver_of_a_kernels_run_keeps_its_cases_and_resume_completes(
    tmp_path: Path, fault_env: dict[str, str]
) -> None:
    out = tmp_path / "out"
    args = ["kernels", "--backend", "torch", "--ops", "index_add,scatter_add", "--max-shapes", "1", "--steps", "3"]
    args += ["--warmup", "1", "--repeats", "2", "--tracer", "none", "--gpu", "cpu", "--out", str(out)]
    driver = detprof(*args, env=fault_env)
    done = out / "kernels" / "runs"
    wait_until(lambda: any(done.glob("*.json")), 180, "first record")
    driver.send_signal(signal.SIGINT)
    assert_stopped(driver, signal.SIGINT, out / "kernels")
    kept = {p.stem for p in done.glob("*.json")}
    resumed = detprof(*args, "--resume", env=fault_env)
    assert resumed.wait(timeout=300) == ExitCode.OK, resumed.stderr.read()[-2000:]
    runs = [json.loads(p.read_text()) for p in done.glob("*.json")]
    assert len(runs) == 8 and all(r["status"] == "ok" for r in runs) and kept <= {r["run_id"] for r in runs}


STABILITY = ["stability", "--variants", "control", "--runs", "3", "--epochs", "5", "--jobs", "1"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "signum", "moment"),
    [
        ("torch", signal.SIGINT, "pool start"),
        ("torch", signal.SIGINT, "first record"),
        ("jax", signal.SIGTERM, "first record"),
        ("tensorflow", signal.SIGTERM, "pool start"),
    ],
)
def test_a_signal_to_the_driver_alone_stops_a_stability_study_without_a_traceback(
    tmp_path: Path, fault_env: dict[str, str], backend: str, signum: signal.Signals, moment: str
) -> None:
    study = tmp_path / "out" / "stability"
    driver = detprof(*STABILITY, "--backend", backend, "--out", tmp_path / "out", env=fault_env)
    if moment == "pool start":
        wait_until(lambda: any((study / "logs").glob("worker-*.log")), 120, "a pool worker")
    else:
        wait_until(lambda: any((study / "runs").glob("*.json")), 180, "first record")
    workers = psutil.Process(driver.pid).children(recursive=True)
    driver.send_signal(signum)
    assert_stopped(driver, signum, study)
    wait_until(lambda: not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers), 15, "end")
    kept = list((study / "runs").glob("*.json")) if (study / "runs").is_dir() else []
    assert len(kept) < 6 and all(json.loads(p.read_text())["status"] == "ok" for p in kept)
