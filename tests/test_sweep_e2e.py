"""Real CPU sweeps with the tf tracer: records, both modes in one process, resume, failure isolation, settings in
the worker; the kernels bench's real runs (the run's shared study: ``shared_studies``)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from in_process_pairs import check_pairs
from shared_studies import TENSORFLOW_COMMANDS, Study

from detprof.cli import main
from detprof.device_time import process_seconds
from detprof.kernels_bench.case_results import summarize
from detprof.profiler.process import STEADY_HEAP_ENV
from detprof.store import ResultsStore

TINY = [
    "--steps",
    "3",
    "--warmup",
    "1",
    "--batch-size",
    "8",
    "--input-size",
    "16",
    "--gpu",
    "cpu",
    "--tracer",
    "tf",
]


def records(out: Path) -> dict[str, dict]:
    return {r["run_id"]: r for r in ResultsStore(out, "sweep").records()}


@pytest.mark.slow
def test_sweep_two_models_end_to_end(tensorflow_study: Study) -> None:
    """The run's real TensorFlow sweep of two models (``shared_studies``), as ``TINY`` sweeps."""
    out = tensorflow_study.results
    recs = records(out)
    assert len(recs) == 8
    for rec in recs.values():
        assert rec["status"] == "ok", rec["reason"]
        # Wall time from untraced steps, kernel time from as many traced steps after them;
        # the settling step after the profiler started is in neither.
        assert rec["measures"] == "both" and rec["tracer"] == "tf"
        assert len(rec["step_wall_ns"]) == 3 and len(rec["traced_step_wall_ns"]) == 3
        assert rec["kernel_table_steps"] == 3
        assert rec["kernel_ns_per_step"] > 0 and rec["kernel_count"] > 0
        assert rec["settings"]["op_determinism"] is (rec["mode"] == "deterministic")
        assert rec["settings"]["jit_compile"] is False
        assert rec["versions"]["tensorflow"]
        assert rec["device"]["label"] == "cpu"
        table = ResultsStore(out, "sweep").read_table(rec["kernel_table"])
        assert {"name", "dur_ns", "op"} <= set(table.columns)
        assert table["dur_ns"].sum() == pytest.approx(rec["kernel_ns_per_step"] * 3)
        # Each repeat is one process on one core, one TensorFlow thread, a step of each mode in turn,
        # and TF's profiler splits the op time into each mode's measured steps.
        assert rec["pairing"] == "in_process" and rec["cpu_threads"] == 1
        assert len(rec["step_kernel_ns"]) == 3 and sum(rec["step_kernel_ns"]) == table["dur_ns"].sum()
        partner = recs[
            rec["run_id"].replace(rec["mode"], "default" if rec["mode"] == "deterministic" else "deterministic")
        ]
        assert partner["cpu_core"] == rec["cpu_core"]
        # Every worker keeps its tensors on the heap (launcher.STEADY_HEAP_ENV), and says so.
        assert rec["worker_env"] == STEADY_HEAP_ENV
    printed = tensorflow_study.stdout("sweep")
    assert "smallcnn" in printed and "mediumcnn_k3" in printed and "[" in printed
    manifest = json.loads((out / "sweep" / "manifest.json").read_text())
    assert manifest["config"]["models"] == ["smallcnn", "mediumcnn_k3"]


@pytest.mark.slow
def test_each_run_says_where_its_time_went(tensorflow_study: Study, tmp_path: Path) -> None:
    """Each record splits its process's time into parts that add up to it; the two records of a pair share the
    parts of their one process (its start counted by the process's first pair), and the measured steps are the
    steps the record timed; on a CPU the allocator's peak is unknown, and the record says why."""
    recs = sorted(records(tensorflow_study.results).values(), key=lambda r: (r["repeat"], r["started_at"]))
    by_log: dict[str, list[dict]] = {}
    for rec in recs:
        by_log.setdefault(rec["log"], []).append(rec)
        assert rec["peak_memory"] == {
            "bytes": None,
            "covers": None,
            "why": "TensorFlow keeps allocator statistics only for a GPU",
        }
    starts = []
    for pair in by_log.values():
        first, second = pair
        shared = {k: v for k, v in first["time_parts"].items() if k != "parsing"}
        assert shared == {k: v for k, v in second["time_parts"].items() if k != "parsing"}
        assert {"build", "steps", "tracing"} <= shared.keys()
        timed_s = sum(sum(r["step_wall_ns"]) + sum(r["traced_step_wall_ns"]) for r in pair) / 1e9
        assert timed_s - 0.0005 <= shared["steps"] <= timed_s + 0.5  # parts are kept to the millisecond
        starts.append(shared.get("start", 0.0))
        if "start" in shared:  # a process's first pair: from its spawn to its results, as the parent timed it
            assert sum(shared.values()) == pytest.approx(first["duration_s"], rel=0.15)
    assert sum(start > 1.0 for start in starts) == 2  # two repeats: two processes, each of both models
    totals = process_seconds(recs)
    assert totals["start"] == pytest.approx(sum(starts), abs=0.01)
    written = tmp_path / "report.md"
    assert main(["report", str(tensorflow_study.results), "--format", "md", "-o", str(written)]) == 0
    report = written.read_text()
    assert "where the runs' time went" in report and "| all models |" in report
    assert "Peak device memory not known: TensorFlow keeps allocator statistics only for a GPU." in report


SHARED_STEPS = 3
"""The shared sweep's and kernels bench's ``--steps``."""


@pytest.mark.slow
def test_tensorflow_runs_both_modes_in_one_process_each_with_its_own_ops(tensorflow_study: Study) -> None:
    """Each repeat one process and one trace per model, and each arm traced with its mode's ops (sparse
    cross-entropy's fused op by default, a log-softmax and a gather under determinism)."""
    out = tensorflow_study.results
    recs = records(out)
    for model in ("smallcnn", "mediumcnn_k3"):
        check_pairs(out, recs, model, SHARED_STEPS)
    for rec in recs.values():
        ops = set(ResultsStore(out, "sweep").read_table(rec["kernel_table"])["op_type"].dropna())
        fused = "SparseSoftmaxCrossEntropyWithLogits" in ops
        assert fused is (rec["mode"] == "default") and ("LogSoftmax" in ops) is (rec["mode"] == "deterministic")


def added_and_removed(store: ResultsStore, records: list[dict]) -> tuple[set[str], set[str]]:
    """Kernel names each mode launched, straight from the stored Parquet tables."""
    names = {
        mode: set().union(*(set(store.read_table(r["kernel_table"])["name"]) for r in records if r["mode"] == mode))
        for mode in ("default", "deterministic")
    }
    return names["deterministic"] - names["default"], names["default"] - names["deterministic"]


@pytest.mark.slow
def test_kernels_bench_runs_two_ops_in_both_modes_then_resumes(
    tensorflow_study: Study, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shared kernels bench: a cross-entropy whose fused op determinism replaces, and a convolution's filter
    gradient; its command again on a copy refuses to overwrite it, and resumed runs nothing."""
    store = ResultsStore(tensorflow_study.results, "kernels")
    records = list(store.records())
    assert len(records) == 8
    for rec in records:
        assert rec["status"] == "ok", rec["reason"]
        assert rec["settings"]["op_determinism"] is (rec["mode"] == "deterministic")
        assert len(rec["step_wall_ns"]) == SHARED_STEPS and rec["batch_size"] == 8
        table = store.read_table(rec["kernel_table"])
        assert table["dur_ns"].sum() == pytest.approx(rec["kernel_ns_per_step"] * SHARED_STEPS)
    printed = tensorflow_study.stdout("kernels")
    assert "sparse_softmax_xent_backward" in printed and "conv2d_backward_filter" in printed

    xent = [r for r in records if r["op"] == "sparse_softmax_xent_backward"]
    assert {r["shape"] for r in xent} == {"8x1000"}
    added, removed = added_and_removed(store, xent)
    # Under determinism TF's Python API replaces the fused op by log-softmax and a gather.
    assert "SparseSoftmaxCrossEntropyWithLogits" in removed and "LogSoftmax" in added
    summary = {row.op: row for row in summarize(store).cases}
    assert set(summary["sparse_softmax_xent_backward"].added) == added
    assert set(summary["sparse_softmax_xent_backward"].removed) == removed
    assert "-SparseSoftmaxCrossEntropyWithLogits" in printed

    conv = [r for r in records if r["op"] == "conv2d_backward_filter"]
    # Each repeat runs both modes in one process, a step of each in turn, so the repeat's
    # log ratio is the median over steps of ln(det step i / default step i).
    per_mode = {(r["mode"], r["repeat"]): r["step_kernel_ns"] for r in conv}
    logs = [
        float(np.median(np.log(np.array(per_mode[("deterministic", i)]) / np.array(per_mode[("default", i)]))))
        for i in (0, 1)
    ]
    assert summary["conv2d_backward_filter"].overhead.kernel.ratio == pytest.approx(math.exp(np.mean(logs)))

    out = tensorflow_study.copy(tmp_path / "res", "kernels")
    args = [*TENSORFLOW_COMMANDS["kernels"], "--out", str(out)]
    finished = {r["run_id"]: r["finished_at"] for r in records}
    assert main(args) == 2
    assert "already holds results" in capsys.readouterr().err
    assert main([*args, "--resume"]) == 0
    again = list(ResultsStore(out, "kernels").records())
    assert {r["run_id"]: r["finished_at"] for r in again} == finished
    assert len(list((out / "kernels" / "logs").glob("*.log"))) == 4  # a process, and its log, per pair
    assert {r["pairing"] for r in again} == {"in_process"}


@pytest.mark.slow
def test_xla_stays_pinned_under_determinism(tmp_path) -> None:
    """Keras 3 would silently drop XLA in deterministic mode; detprof keeps it and reports the outcome."""
    out = tmp_path / "res"
    code = main(["sweep", "--models", "smallcnn", "--repeats", "1", "--xla", *TINY, "--out", str(out)])
    assert code == 0
    recs = records(out)
    default, det = recs["smallcnn--default--r0"], recs["smallcnn--deterministic--r0"]
    assert default["settings"]["jit_compile"] is True and det["settings"]["jit_compile"] is True
    assert default["status"] == "ok"
    table = ResultsStore(out, "sweep").read_table(default["kernel_table"])
    assert "convolution" in set(table["name"].astype(str)), "the default run must execute XLA thunks"
    assert det["status"] == "unsupported"
    assert "deterministic XLA implementation" in det["reason"]


@pytest.mark.slow
def test_failure_is_recorded_and_sweep_goes_on(tmp_path) -> None:
    out = tmp_path / "res"
    code = main(["sweep", "--models", "inceptionv3,smallcnn", "--repeats", "1", *TINY, "--out", str(out)])
    assert code == 0
    recs = records(out)
    assert recs["inceptionv3--default--r0"]["status"] == "failed"
    assert "ValueError" in recs["inceptionv3--default--r0"]["reason"]
    assert recs["smallcnn--default--r0"]["status"] == "ok"


@pytest.mark.slow
def test_killed_sweep_resumes_without_losing_runs(tmp_path) -> None:
    out = tmp_path / "res"
    args = ["sweep", "--models", "smallcnn", "--repeats", "2", *TINY, "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "detprof.cli", *args],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    runs = out / "sweep" / "runs"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(list(runs.glob("*.json"))) < 2:
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=60)
    kept = records(out)
    assert 2 <= len(kept) < 4  # the second repeat's worker takes seconds to start: the signal comes first
    finished = {k: v["finished_at"] for k, v in kept.items()}
    assert main([*args, "--resume"]) == 0
    after = records(out)
    assert len(after) == 4 and all(r["status"] == "ok" for r in after.values())
    assert all(after[k]["finished_at"] == t for k, t in finished.items())


def test_resume_with_another_configuration_is_refused(tmp_path, capsys) -> None:
    out = tmp_path / "res"
    ResultsStore(out, "sweep").open({"other": True}, "x", resume=False)
    code = main(["sweep", "--models", "smallcnn", *TINY, "--out", str(out), "--resume"])
    assert code == 2
    assert "different configuration" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--models", "alexnet"], "unknown model 'alexnet'; valid models:"),
        (["--models", "hf_gpt2"], "unknown model 'hf_gpt2' (did you mean hf_gpt2_tiny, hf_gpt2_small?); valid"),
        (["--models", "nets.py"], "'nets.py' is a file, not a model: name the function in it that returns the model"),
        (["--models", "smallcnn", "--steps", "0"], "--steps must be at least 1"),
        (["--models", "smallcnn", "--repeats", "-1"], "--repeats must be at least 1"),
        (["--models", "smallcnn", "--seed", "-1"], "--seed takes a whole number from 0 to 4,294,967,295"),
        (["--models", "smallcnn", "--classes", "0"], "--classes must be at least 2"),
        (["--models", "smallcnn", "--seed", str(2**32)], "not 4294967296"),
        (["--models", "smallcnn", "--tracer", "nsys"], "tracer 'nsys' is not installed"),
        (["--models", "smallcnn", "--tracer", "magic"], "unknown tracer 'magic'"),
        (["--models", "smallcnn", "--gpu", "t4"], "--gpu t4"),
        (["--preset", "huge"], "unknown preset 'huge'"),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, args: list[str], message: str) -> None:
    code = main(["sweep", *args, "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_unwritable_output_directory(tmp_path, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = main(["sweep", "--models", "smallcnn", *TINY, "--out", str(blocker / "r")])
    assert code == 2
    assert "cannot write results" in capsys.readouterr().err


@pytest.mark.slow
def test_calibration_runs_deterministic_mode_against_itself(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("MALLOC_TOP_PAD_", "0")
    out = tmp_path / "res"
    code = main(["sweep", "--calibrate", "--models", "smallcnn", "--repeats", "2", *TINY, "--out", str(out)])
    assert code == 0
    recs = {r["run_id"]: r for r in ResultsStore(out, "calibration").records()}
    assert sorted(recs) == sorted(f"smallcnn--{arm}--r{r}" for r in (0, 1) for arm in ("a", "b"))
    for rec in recs.values():
        assert rec["status"] == "ok", rec["reason"]
        assert rec["mode"] == "deterministic" and rec["settings"]["op_determinism"] is True
        assert rec["worker_env"] == STEADY_HEAP_ENV | {"MALLOC_TOP_PAD_": "0"}, "the user's own malloc setting wins"
    assert not (out / "sweep").exists()
    printed = capsys.readouterr().out
    assert "Noise floor" in printed and "smallcnn" in printed and "+/-" in printed


@pytest.mark.slow
def test_a_pair_past_its_timeout_is_recorded_failed_and_fresh_workers_take_the_next(tmp_path) -> None:
    out = tmp_path / "res"
    args = ["--models", "smallcnn,mediumcnn_k1", "--repeats", "1", *TINY, "--run-timeout", "0.5", "--out", str(out)]
    assert main(["sweep", *args]) == 0
    recs = records(out)
    assert sorted(recs) == [
        f"{m}--{mode}--r0" for m in ("mediumcnn_k1", "smallcnn") for mode in ("default", "deterministic")
    ]
    for rec in recs.values():
        assert rec["status"] == "failed" and "timed out after 0.5 s" in rec["reason"]
    # The killed session's workers are gone: nothing of theirs is left running or writing.
    assert not list((out / "sweep" / "work").glob("*"))
