"""Kernel time of each measured step, from the per-step NVTX ranges the worker emits.

The worker wraps step ``i`` in an NVTX range ``step i`` and ends every step by reading its
loss back to the host, so each step's kernels are launched after its range opens and have
finished before it closes. A kernel therefore belongs to the range its start falls in. Per-step
times show what a mean hides: a slow first step, or one step of ten that autotuned again.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from detprof.traces.kernel_table import KernelTable

STEP_RANGE = r"^step \d+$"


def step_range_name(index: int) -> str:
    return f"step {index}"


def _step_of_kernels(table: KernelTable) -> tuple[np.ndarray, np.ndarray, int] | None:
    """Each kernel's step index, whether it lies inside that step's range, and the number of steps."""
    if table.nvtx is None or table.is_summary:
        return None
    ranges = table.nvtx[table.nvtx["text"].astype(str).str.match(STEP_RANGE)]
    if ranges.empty:
        return None
    ranges = ranges.sort_values("start_ns")
    starts = ranges["start_ns"].to_numpy(dtype=np.int64)
    ends = ranges["end_ns"].to_numpy(dtype=np.int64)
    kernel_start = table.kernels["start_ns"].to_numpy(dtype=np.int64)
    step = np.searchsorted(starts, kernel_start, side="right") - 1
    inside = (step >= 0) & (kernel_start < ends[np.clip(step, 0, None)])
    return step, inside, len(starts)


def kernel_ns_by_step(table: KernelTable) -> list[int] | None:
    """Total kernel time inside each ``step i`` range, in step order; None without such ranges."""
    found = _step_of_kernels(table)
    if found is None:
        return None
    step, inside, count = found
    totals = np.bincount(step[inside], weights=table.kernels["dur_ns"].to_numpy()[inside], minlength=count)
    return [int(t) for t in totals]


def within_steps(table: KernelTable) -> KernelTable | None:
    """The table with only the kernels inside ``step i`` ranges, each with its step; None where the trace marks
    no steps.

    What a capture holds outside the measured steps (the worker's settling step right after
    the tracer started, a stray launch before the first range) is not a step's work.
    """
    found = _step_of_kernels(table)
    if found is None:
        return None
    step, inside, _count = found
    kernels = table.kernels[inside].reset_index(drop=True)
    return replace(table, kernels=kernels.assign(step=pd.array(step[inside], dtype="Int64")))
