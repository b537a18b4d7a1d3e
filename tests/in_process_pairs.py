"""What a sweep that pairs the modes in one process must have written: the checks that ``test_in_process``'s own
sweeps and the run's shared TensorFlow sweep (``test_sweep_e2e``) both pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from detprof.backends.base import step_range_name
from detprof.store import ResultsStore
from detprof.traces.parsers import load_trace
from detprof.traces.step_split import kernel_ns_by_step


def check_pairs(out: Path, records: dict[str, dict[str, Any]], model: str, steps: int) -> None:
    """Each repeat's two runs: one process and one trace, each arm's steps marked apart in turn, read apart."""
    for repeat in (0, 1):
        det, default = records[f"{model}--deterministic--r{repeat}"], records[f"{model}--default--r{repeat}"]
        for rec in (det, default):
            assert rec["status"] == "ok", rec["reason"]
            assert rec["pairing"] == "in_process" and rec["steps"] == steps and rec["cpu_core"] in (0, 1)
            assert len(rec["step_wall_ns"]) == len(rec["step_kernel_ns"]) == steps
        assert det["trace_file"] == default["trace_file"] and det["command"] == default["command"]
        assert det["settings"]["op_determinism"] is True and default["settings"]["op_determinism"] is False
        trace = load_trace(out / "sweep" / det["trace_file"])
        assert trace.nvtx is not None
        marks = [t for t in trace.nvtx.sort_values("start_ns")["text"] if t.startswith("step ")]
        first = "deterministic" if repeat == 0 else "default"  # the modes' order alternates by repeat
        second = "default" if repeat == 0 else "deterministic"
        assert marks == [step_range_name(i, arm) for i in range(steps) for arm in (first, second)]
        for rec, arm in ((det, "deterministic"), (default, "default")):
            assert rec["step_kernel_ns"] == kernel_ns_by_step(trace, arm)
            table = ResultsStore(out, "sweep").read_table(rec["kernel_table"])
            assert table["dur_ns"].sum() == sum(rec["step_kernel_ns"])
