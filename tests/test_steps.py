"""Kernels assigned to the worker's per-step NVTX ranges, on real nsys-layout SQLite files."""

from __future__ import annotations

from fixtures_traces import Kernel, write_nsys_sqlite

from detprof.backends.base import step_range_name
from detprof.traces.parsers import load_trace
from detprof.traces.step_split import kernel_ns_by_step


def test_kernels_are_summed_per_step_range(tmp_path) -> None:
    nvtx = [
        {"start": 1_000, "end": 2_000, "eventType": 59, "text": step_range_name(0)},
        {"start": 2_000, "end": 3_000, "eventType": 59, "text": step_range_name(1)},
        {"start": 3_500, "end": 4_000, "eventType": 59, "text": step_range_name(2)},
        {"start": 900, "end": 5_000, "eventType": 59, "text": "outer range"},
    ]
    kernels = [
        Kernel("a", "a", 500, 10),  # before the first step: warm-up leftovers, not counted
        Kernel("a", "a", 1_100, 100),
        Kernel("b", "b", 1_900, 50),
        Kernel("a", "a", 2_000, 70),  # a kernel starting exactly at a range start belongs to it
        Kernel("b", "b", 3_100, 999),  # between ranges
        Kernel("a", "a", 3_600, 30),
    ]
    table = load_trace(write_nsys_sqlite(tmp_path / "steps.sqlite", kernels, nvtx=nvtx))
    assert kernel_ns_by_step(table) == [150, 70, 30]


def test_no_step_ranges_gives_none(tmp_path) -> None:
    plain = load_trace(write_nsys_sqlite(tmp_path / "plain.sqlite", [Kernel("a", "a", 1, 2)]))
    assert kernel_ns_by_step(plain) is None
    other = [{"start": 0, "end": 10, "eventType": 59, "text": "train"}]
    ranged = load_trace(write_nsys_sqlite(tmp_path / "other.sqlite", [Kernel("a", "a", 1, 2)], nvtx=other))
    assert kernel_ns_by_step(ranged) is None
