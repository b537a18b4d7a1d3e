"""Kernel time of each measured step, from the per-step ranges the worker emits.

The worker wraps step ``i`` in a range ``step i`` (NVTX, or the framework profiler's own) and ends
every step by reading its loss back to the host, so each step's kernels are launched after its range opens and have
finished before it closes. A kernel therefore belongs to the range its start falls in. Per-step
times show what a mean hides: a slow first step, or one step of ten that autotuned again.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from detprof.backends.base import STEP_RANGE
from detprof.traces.kernel_table import KernelTable


def _step_ranges(table: KernelTable, arm: str | None) -> pd.DataFrame | None:
    """The table's step ranges in time order: ``arm``'s only where given, else every one."""
    if table.nvtx is None or table.is_summary:
        return None
    text = table.nvtx["text"].astype(str)
    steps = text.str.match(STEP_RANGE)
    if arm is not None:
        steps &= text.str.endswith(f" {arm}")
    ranges = table.nvtx[steps]
    return None if ranges.empty else ranges.sort_values("start_ns")


def _step_of_kernels(table: KernelTable, arm: str | None) -> tuple[np.ndarray, np.ndarray, int] | None:
    """Each kernel's step index, whether it lies inside that step's range, and the number of steps."""
    ranges = _step_ranges(table, arm)
    if ranges is None:
        return None
    starts = ranges["start_ns"].to_numpy(dtype=np.int64)
    ends = ranges["end_ns"].to_numpy(dtype=np.int64)
    kernel_start = table.kernels["start_ns"].to_numpy(dtype=np.int64)
    step = np.searchsorted(starts, kernel_start, side="right") - 1
    inside = (step >= 0) & (kernel_start < ends[np.clip(step, 0, None)])
    return step, inside, len(starts)


def kernel_ns_by_step(table: KernelTable, arm: str | None = None) -> list[int] | None:
    """Total kernel time inside each step range (``arm``'s only, where given), in step order; None without such
    ranges."""
    found = _step_of_kernels(table, arm)
    if found is None:
        return None
    step, inside, count = found
    totals = np.bincount(step[inside], weights=table.kernels["dur_ns"].to_numpy()[inside], minlength=count)
    return [int(t) for t in totals]


def within_steps(table: KernelTable, arm: str | None = None) -> KernelTable | None:
    """The table with only the kernels inside step ranges (``arm``'s only, where given), each with its step; None
    where the trace marks no such steps.

    What a capture holds outside the measured steps (the worker's settling step right after
    the tracer started, a stray launch before the first range, the other arm's steps of an
    in-process pair) is not a step's work. The table keeps only the step ranges it was cut to.
    """
    found = _step_of_kernels(table, arm)
    if found is None:
        return None
    step, inside, _count = found
    kernels = table.kernels[inside].reset_index(drop=True)
    nvtx = table.nvtx
    if arm is not None and nvtx is not None:
        text = nvtx["text"].astype(str)
        nvtx = nvtx[~text.str.match(STEP_RANGE) | text.str.endswith(f" {arm}")].reset_index(drop=True)
    return replace(table, kernels=kernels.assign(step=pd.array(step[inside], dtype="Int64")), nvtx=nvtx)
