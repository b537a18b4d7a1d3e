"""A run's trace, parsed into the kernel fields of its record (or the reason it is unusable).

Where the tracer marks steps (nsys's NVTX ranges, the frameworks' step annotations), only
the kernels inside the measured steps count, so the settling step after the capture started
is left out; nvprof marks none, and its table keeps the settling step (``kernel_table_steps``
says so, and per-step figures divide by it). A program's window (``profiler.program.run``)
has no settling step.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from detprof.errors import DetprofError
from detprof.store import ResultsStore
from detprof.traces.graphs import cuda_graph_use
from detprof.traces.kernel_table import KernelTable
from detprof.traces.step_split import kernel_ns_by_step, within_steps

FAILURE = "failure"
"""The key of the reason a trace is unusable, which fails the run."""


@dataclass(frozen=True)
class TraceRead:
    """A run's trace file, and what reading it gave: its table, or why it is unusable."""

    path: Path
    table: KernelTable | None
    problem: str | None = None


def read_trace(trace_path: Path) -> TraceRead:
    """The trace parsed once (both arms of an in-process pair share one)."""
    from detprof.traces.parsers import load_trace

    try:
        return TraceRead(trace_path, load_trace(trace_path))
    except DetprofError as exc:
        return TraceRead(trace_path, None, f"trace unusable: {exc}")


def kernel_fields(
    store: ResultsStore, run_id: str, trace: TraceRead, steps: int, settling: int, arm: str | None = None
) -> dict[str, Any]:
    """The record's kernel fields from the trace (``arm``'s steps only, where one process ran two arms);
    ``{FAILURE: reason}`` (beside the trace file) when it is unusable."""
    found: dict[str, Any] = {"trace_file": str(trace.path.relative_to(store.dir))}
    if trace.table is None:
        return found | {FAILURE: trace.problem}
    measured = within_steps(trace.table, arm)
    if measured is None and arm is not None:
        return found | {FAILURE: f"the trace marks no step of arm {arm}"}
    table_steps = steps if measured is not None else steps + settling
    table = measured if measured is not None else trace.table
    if table.kernel_count == 0:
        return found | {FAILURE: "the measured window holds no kernels"}
    graphs = cuda_graph_use(table)
    if graphs.hidden:
        return found | {FAILURE: graphs.hidden}
    frame = table.summary if table.is_summary else table.kernels
    return found | {
        "kernel_table": store.write_table(run_id, frame),
        "kernel_table_kind": "summary" if table.is_summary else "launches",
        "kernel_table_format": table.format,
        "kernel_devices": kernel_devices(table),
        "kernel_table_steps": table_steps,
        "kernel_count": table.kernel_count,
        "kernel_ns_per_step": table.total_ns / table_steps,
        "step_kernel_ns": kernel_ns_by_step(table),
        **graphs.record(),
    }


def kernel_devices(table: KernelTable) -> list[str]:
    """The devices that ran the table's kernels, by name: none where the rows are a CPU's ops, which carry no
    device (a summary table names the devices of its trace)."""
    if table.cpu_ops:
        return []
    names = {device.id: device.name or f"GPU {device.id}" for device in table.devices}
    if table.is_summary:
        return sorted(set(names.values()))
    ran = table.launches("device_id")["device_id"].dropna().unique()
    return [names.get(int(device), f"GPU {int(device)}") for device in sorted(ran)]
