"""Where a run's time goes (``device_time``) and each mode's peak device memory, without a framework: the clock's
parts, the sums that count a shared process once, and the peak read at the GPU boundary."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from detprof.analysis.run_costs import memory_line, memory_peaks, time_rows
from detprof.device_time import SPAWNED_ENV, PartClock, charged, process_seconds, spawned_clock, steps_fraction
from detprof.profiler.worker import _PeakMemory, _traced_from_outside
from detprof.profiler.worker_call import call_in_worker


def test_laps_add_up_to_the_time_the_clock_ran() -> None:
    started = time.monotonic()
    clock = PartClock(started - 2.0)  # spawned two seconds ago
    clock.lap("start")
    time.sleep(0.02)
    clock.lap("build")
    clock.move(0.01, "build", "compile")
    clock.move(5.0, "steps", "compile")  # nothing charged to steps: nothing moves
    parts = clock.take()
    assert parts["start"] == pytest.approx(2.0, abs=0.05)
    assert parts["build"] + parts["compile"] == pytest.approx(0.02, abs=0.01)
    assert parts["compile"] == pytest.approx(0.01, abs=0.001)
    assert "steps" not in parts
    assert clock.take() == {}


def test_a_worker_clock_starts_when_its_parent_spawned_it_and_takes_charges() -> None:
    clock = spawned_clock({SPAWNED_ENV: repr(time.monotonic() - 1.5)})
    with charged("compile", before="build"):
        time.sleep(0.01)
    parts = clock.take()
    assert parts["build"] == pytest.approx(1.5, abs=0.05)
    assert parts["compile"] >= 0.01


def test_a_pairs_process_is_counted_once_and_each_record_parses_its_own() -> None:
    pair = {"start": 3.0, "build": 2.0, "steps": 1.0}
    paired = {"model": "m", "log": "logs/m-r0.log", "pairing": "in_process"}
    records = [
        {"run_id": "m--deterministic--r0", **paired, "time_parts": pair | {"parsing": 0.5}},
        {"run_id": "m--default--r0", **paired, "time_parts": pair | {"parsing": 0.25}},
        {"run_id": "n--default--r0", "model": "n", "log": "logs/n.log", "time_parts": {"steps": 1.0, "build": 1.0}},
    ]
    assert process_seconds(records) == {"start": 3.0, "build": 3.0, "steps": 2.0, "parsing": 0.75}
    rows = time_rows(records)
    assert [row.model for row in rows] == ["m", "n", "all models"]
    assert rows[0].seconds == 6.75 and rows[0].steps_share == pytest.approx(1.0 / 6.75)
    assert steps_fraction({}) is None


def test_runs_one_process_makes_in_turn_each_count_their_own_parts() -> None:
    """``verify`` writes the runs of one process (several models, a knob study's arms) beside one log: each record
    keeps its own run's parts, the process's start in the first."""
    log = "logs/m--deterministic--a+more.log"
    records = [
        {"run_id": "m--deterministic--a", "log": log, "time_parts": {"start": 3.0, "build": 1.0, "steps": 2.0}},
        {"run_id": "n--deterministic--a", "log": log, "time_parts": {"build": 1.0, "steps": 2.0}},
    ]
    assert process_seconds(records) == {"start": 3.0, "build": 2.0, "steps": 4.0}


class _Allocator:
    """A GPU framework's allocator as ``Backend.peak_memory`` reads it: the faked boundary."""

    peak_memory_per_arm = True
    no_peak_memory = "none here"

    def __init__(self, per_arm: bool) -> None:
        self.peak_memory_per_arm = per_arm
        self.held, self.peak = 100, 100

    def peak_memory(self) -> int | None:
        return self.peak

    def reset_peak_memory(self) -> None:
        self.peak = self.held

    def allocate(self, size: int) -> None:
        self.peak = max(self.peak, self.held + size)


@pytest.mark.parametrize("per_arm", [True, False])
def test_each_arm_has_its_own_peak_where_the_framework_can_start_it_again(per_arm: bool) -> None:
    allocator = _Allocator(per_arm)
    memory = _PeakMemory(allocator, 2)  # type: ignore[arg-type]
    for k, size in ((0, 500), (1, 200), (0, 100), (1, 300)):
        memory.before(k)
        allocator.allocate(size)
        memory.after(k)
    if per_arm:
        assert memory.field(0, shared=True) == {"bytes": 600, "covers": "run", "why": None}
        assert memory.field(1, shared=True) == {"bytes": 400, "covers": "run", "why": None}
    else:
        assert memory.field(1, shared=True) == {"bytes": 600, "covers": "process", "why": None}


def test_the_peaks_of_each_mode_read_side_by_side() -> None:
    def run(mode: str, size: int | None, covers: str | None = "run") -> dict:
        why = None if size is not None else "XLA keeps allocator statistics only for a GPU"
        return {
            "model": "m",
            "mode": mode,
            "status": "ok",
            "peak_memory": {"bytes": size, "covers": covers, "why": why},
        }

    peaks = memory_peaks([run("deterministic", 3 * 2**29), run("deterministic", 2**30), run("default", 2**30)])
    assert memory_line(peaks["m"]) == "1.50 / 1.00 GiB (+50%)"
    shared = memory_peaks([run("deterministic", 2**30, "process"), run("default", 2**30, "process")])
    assert memory_line(shared["m"]) == "1.00 / 1.00 GiB (+0%) (each the whole process, both modes)"
    unknown = memory_peaks([run("deterministic", None), run("default", None)])
    assert memory_line(unknown["m"]) == "not known: XLA keeps allocator statistics only for a GPU"


def test_a_worker_ends_once_its_answer_is_written_without_the_interpreter_s_teardown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent waits for a worker's exit before it reads its result; tearing down an interpreter that loaded a
    framework takes a second or more, so the worker skips it, but not what was registered to run at the end, nor
    output still buffered."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    log = tmp_path / "worker.log"
    assert call_in_worker("worker_end:leave_marks", {"folder": str(tmp_path)}, "leaving marks", log=log) == "answered"
    assert (tmp_path / "exit-function-ran").is_file()
    assert "said just before the end" in log.read_text()
    assert not (tmp_path / "torn-down").exists()


def test_a_worker_that_nsys_or_nvprof_runs_ends_through_the_interpreter_as_they_expect() -> None:
    assert _traced_from_outside({"tracer": "nsys"})
    assert _traced_from_outside({"runs": [{"tracer": "none"}, {"tracer": "nvprof"}]})
    assert not _traced_from_outside({"pairs": [[{"tracer": "torch"}, {"tracer": "torch"}]]})
    assert not _traced_from_outside({"call": "module:function", "request": {}})
