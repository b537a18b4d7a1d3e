"""Real stability studies on this CPU through the CLI: determinism verified (on the run's shared study:
``shared_studies``), resume, a failed run.

TensorFlow runs only in subprocesses (the CLI and its spawned workers): determinism,
once switched on, cannot be switched off in a process, so it must never leak into pytest's.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console
from script_runner import run_script
from shared_studies import TENSORFLOW_COMMANDS, Study
from sklearn.metrics import accuracy_score

from detprof.cli import main
from detprof.stability import datasets
from detprof.stability.command import print_summary
from detprof.stability.variants import DEFAULT_VARIANTS

ROOT = Path(__file__).resolve().parents[1]


def detprof(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "detprof.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def _records(study: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((study / "runs").glob("*.json"))}


def _with(args: list[str], **values: str) -> list[str]:
    """``args`` with the values of the options ``values`` names (``epochs="3"``: ``--epochs 3``) replaced."""
    changed = list(args)
    for name, value in values.items():
        changed[changed.index(f"--{name}") + 1] = value
    return changed


@pytest.mark.slow
def test_small_study_verifies_control_bitwise_and_resumes_in_a_fresh_worker(
    tensorflow_study: Study, tmp_path: Path
) -> None:
    """The run's shared stability study (``shared_studies``: smallcnn on digits, the default variants, two runs of
    each, two workers); on a copy of it, a control run trained again in a fresh worker matches bit for bit."""
    assert "determinism verified: 2 runs ended with bitwise-identical weights" in tensorflow_study.stdout("stability")
    assert "did not learn" not in tensorflow_study.stdout("stability")
    study = tensorflow_study.results / "stability"
    summary = json.loads((study / "summary.json").read_text())
    assert (summary["model"], summary["dataset"], summary["device"]) == ("smallcnn", "digits", "cpu")
    # Had its runs stayed at chance, the command would have said so under its tables.
    for variant in summary["variants"]:
        variant["accuracy"]["mean"] = 0.11
    printed = Console(record=True, width=200)
    print_summary(printed, summary)
    epochs = summary["config"]["epochs"]
    assert (
        f"did not learn: mean test accuracy 11.0%, chance 10.0%, learning needs 20%: train longer (--epochs "
        f"{3 * epochs}, 3x the {epochs} it ran) before reading its spread"
    ) in printed.export_text()
    # Nor does one of a generated language whose loss stayed near its tokens' frequencies.
    language = summary | {"entropy_rate": 2.35, "frequency_entropy": 4.08}
    for variant in language["variants"]:
        variant |= {"cross_entropy": variant["cross_entropy"] | {"mean": 3.87}, "learned": False}
    printed = Console(record=True, width=300)
    print_summary(printed, language)
    assert f"train longer (--epochs {3 * epochs}, 3x the {epochs} it ran)" in printed.export_text().splitlines()[-1]
    by_variant = {v["variant"]: v for v in summary["variants"]}
    assert by_variant.keys() == set(DEFAULT_VARIANTS)
    assert by_variant["control"]["determinism_check"]["verified"] is True
    assert by_variant["control"]["churn"] == 0.0 and by_variant["control"]["l2"] == 0.0
    assert by_variant["algo"]["distinct_weights"] == 2
    assert by_variant["algo"]["determinism_check"]["applicable"] is False
    assert 0.0 < by_variant["algo"]["churn"] < 1.0
    assert {v["runs_ok"] for v in summary["variants"]} == {2}

    runs = pd.read_parquet(study / summary["tables"]["runs"])
    assert len(runs) == 2 * len(DEFAULT_VARIANTS) and set(runs["status"]) == {"ok"}
    assert {"variant", "run", "seed_init", "seed_shuffle", "accuracy", "cross_entropy", "weights_sha256"} <= set(
        runs.columns
    )
    control = runs[runs["variant"] == "control"]
    assert control["weights_sha256"].nunique() == 1 and control["seed_init"].nunique() == 1
    assert runs[runs["variant"] == "algo"]["seed_init"].nunique() == 2
    curves = pd.read_parquet(study / summary["tables"]["curves"])
    assert len(curves) == len(runs) * 15  # the shared study's --epochs

    y_test = datasets.load("digits").y_test
    records = _records(study)
    for record in records.values():
        with np.load(study / record["arrays"]) as arrays:
            assert record["accuracy"] == pytest.approx(accuracy_score(y_test, arrays["predictions"]))
            np.testing.assert_allclose(arrays["probabilities"].sum(axis=1), 1.0, rtol=1e-5)
            assert arrays["representations"].shape == (len(y_test), 32)
        assert record["determinism"]["op_determinism"] is (record["mode"] == "deterministic")
    # The two workers share the cores out (within the suite's one OpenMP thread: conftest), and each run says where
    # its worker's time went: a worker's first run its start.
    assert {record["cpu_threads"] for record in records.values()} == {1}
    assert all(record["time_parts"]["steps"] > 0 for record in records.values())
    started = [record["pid"] for record in records.values() if "start" in record["time_parts"]]
    assert sorted(started) == sorted({record["pid"] for record in records.values()})

    # A control run trained again in a brand-new worker process must match bit for bit.
    out = tensorflow_study.copy(tmp_path / "results", "stability")
    study = out / "stability"
    (study / "runs" / "control-r001.json").unlink()
    (study / records["control-r001"]["arrays"]).unlink()
    # A run whose arrays were cut short (a disk full, a copy interrupted) is trained again, not read.
    damaged = study / records["impl-r000"]["arrays"]
    damaged.write_bytes(damaged.read_bytes()[:300])
    untouched = (study / "runs" / "algo-r001.json").read_bytes()
    args = TENSORFLOW_COMMANDS["stability"]
    resumed = detprof(*args, "--out", str(out), "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"2 runs trained, {len(records) - 2} already done" in resumed.stderr
    assert "determinism verified: 2 runs" in resumed.stdout
    assert (study / "runs" / "algo-r001.json").read_bytes() == untouched
    rerun = json.loads((study / "runs" / "control-r001.json").read_text())
    assert rerun["weights_sha256"] == records["control-r000"]["weights_sha256"]
    assert rerun["pid"] not in {r["pid"] for r in records.values()}

    different = detprof(*_with(args, jobs="1", epochs="3"), "--out", str(out), "--resume", cwd=tmp_path)
    assert different.returncode == 2
    assert "different configuration" in different.stderr


@pytest.mark.slow
def test_a_failed_run_is_recorded_the_rest_continue_and_resume_retries_it(tmp_path: Path) -> None:
    out = tmp_path / "results"
    blocker = out / "stability" / "arrays" / "algo-r001.npz"
    blocker.mkdir(parents=True)  # the run's arrays cannot be written: a real I/O failure
    args = ["stability", "--variants", "algo", "--runs", "3", "--epochs", "1", "--jobs", "1", "--keep-weights"]
    args += ["--out", str(out)]
    result = detprof(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    records = _records(out / "stability")
    assert records["algo-r001"]["status"] == "failed"
    assert "IsADirectoryError" in records["algo-r001"]["reason"]
    assert records["algo-r000"]["status"] == records["algo-r002"]["status"] == "ok"
    assert "algo-r001 failed: IsADirectoryError" in result.stdout
    summary = json.loads((out / "stability" / "summary.json").read_text())
    assert (summary["runs_ok"], summary["runs_failed"]) == (2, 1)
    runs = pd.read_parquet(out / "stability" / summary["tables"]["runs"])
    assert runs.set_index("run_id").loc["algo-r001", "status"] == "failed"
    with np.load(out / "stability" / records["algo-r000"]["weights_file"]) as kept:
        digest = hashlib.sha256(b"".join(kept[k].tobytes() for k in sorted(kept.files)))
        assert {k.split("_", 1)[1] for k in kept.files} >= {"conv1/kernel", "logits/bias"}
    assert digest.hexdigest() == records["algo-r000"]["weights_sha256"]

    blocker.rmdir()
    resumed = detprof(*args, "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "1 runs trained, 2 already done" in resumed.stderr
    assert json.loads((out / "stability" / "summary.json").read_text())["runs_failed"] == 0


@pytest.mark.slow
def test_a_worker_killed_mid_run_is_replaced_and_its_run_retried(tmp_path: Path) -> None:
    out = tmp_path / "results"
    args = ["stability", "--variants", "control", "--runs", "4", "--epochs", "5", "--jobs", "1", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "detprof.cli", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    runs_dir, logs = out / "stability" / "runs", out / "stability" / "logs"
    deadline = time.monotonic() + 300
    while not (runs_dir.is_dir() and any(runs_dir.glob("*.json"))):
        assert proc.poll() is None and time.monotonic() < deadline, "the study ended before its first run"
        time.sleep(0.05)
    (log,) = logs.glob("worker-deterministic-*.log")
    victim = int(log.stem.rsplit("-", 1)[1])
    os.kill(victim, signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    records = _records(out / "stability")
    assert {r["status"] for r in records.values()} == {"ok"}
    assert len({r["pid"] for r in records.values()}) == 2  # the killed worker and its replacement
    assert "determinism verified: 4 runs" in stdout


@pytest.mark.slow
def test_ctrl_c_keeps_completed_runs_ends_the_workers_and_resume_finishes(tmp_path: Path) -> None:
    out = tmp_path / "results"
    args = ["stability", "--variants", "control", "--runs", "3", "--epochs", "8", "--jobs", "1", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "detprof.cli", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's Ctrl-C would reach
    )
    runs_dir = out / "stability" / "runs"
    deadline = time.monotonic() + 300
    while not (runs_dir.is_dir() and any(runs_dir.glob("*.json"))):
        assert proc.poll() is None and time.monotonic() < deadline, "the study ended before its first run"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "interrupted: every completed run is kept" in stderr
    kept = _records(out / "stability")
    assert 1 <= len(kept) < 3 and {r["status"] for r in kept.values()} == {"ok"}
    worker_pid = next(iter(kept.values()))["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(worker_pid, 0)
    resumed = detprof(*args, "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{3 - len(kept)} runs trained, {len(kept)} already done" in resumed.stderr
    assert "determinism verified: 3 runs" in resumed.stdout


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--variants", "algo,sideways"], 2, "unknown variant 'sideways'"),
        (["--model", "nonesuch"], 2, "unknown model 'nonesuch'"),
        (["--dataset", "npz:/no/such.npz"], 3, "no such file"),
        (["--runs", "1"], 2, "--runs must be at least 2"),
        (["--jobs", "0"], 2, "--jobs must be at least 1"),
        (["--models", "smallcnn,mediumcnn_k1"], 2, "a stability study trains one model"),
    ],
)
def test_bad_input_is_one_line_and_an_exit_code(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    code: int,
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["stability", *args, "--out", str(tmp_path / "r")]) == code
    stderr = capsys.readouterr().err
    assert message in stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_dropout_seeding_bitflip_and_keras_application_heads(tmp_path: Path) -> None:
    result = run_script("dropout_bitflip_heads.py", cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["seeded"] == ["drop"]
    assert out["same_seed_same_mask"] and out["other_seed_other_mask"]
    assert out["changed_elements"] == 1 and out["one_ulp"]
    assert out["flip"]["variable"] == out["variable"]
    assert out["app_softmax"] is True and out["app_features"] == 1024
