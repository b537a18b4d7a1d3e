"""KernelTable: the one normalized form every trace parser returns.

Parsers differ wildly (SQLite exports, three CSV dialects, XSpace protobufs); everything
downstream (top-N tables, diffs, the sweep's per-step kernel time, the report) reads only
this. Launch-level inputs fill ``kernels``; summary-only inputs (nsys stats CSV, nvprof
summary) cannot recover launches, so they fill ``summary`` with per-kernel aggregates and
leave ``kernels`` empty. ``kernel_stats`` hides that difference from the analyses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import pandas as pd

TraceFormat = Literal[
    "nsys-sqlite",
    "nsys-stats-csv",
    "nvprof-trace-csv",
    "nvprof-summary-csv",
    "tf-xplane",
    "jax-xplane",
    "kineto-json",
    "kineto-cpu-json",
]

DIM_COLUMNS = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")

TIME_UNITS_NS: dict[str, float] = {
    "ns": 1.0,
    "nsec": 1.0,
    "us": 1e3,
    "usec": 1e3,
    "\u00b5s": 1e3,
    "\u03bcs": 1e3,
    "ms": 1e6,
    "msec": 1e6,
    "s": 1e9,
    "sec": 1e9,
}
"""Nanoseconds per time unit as the CSV exporters spell it; micro is written with the micro sign
(U+00B5) or the Greek mu (U+03BC) depending on the tool version, so both are accepted."""

KERNEL_DTYPES: dict[str, str] = {
    "name": "category",
    "short_name": "category",
    "start_ns": "int64",
    "dur_ns": "int64",
    "device_id": "Int64",
    "stream_id": "Int64",
    "correlation_id": "Int64",
    **{c: "Int64" for c in DIM_COLUMNS},
    "op": "category",
    "graph_node_id": "Int64",
    "op_type": "category",
    "scope": "category",
    "graph_site": "category",
    "step": "Int64",
}
"""Names (``name``, ``short_name``, ``op``) are Categoricals: a trace repeats a few hundred
names over millions of launches, so only the distinct names become Python strings and
statistics group by the integer codes. ``graph_node_id``: the CUDA graph node that launched
the kernel (nsys with ``--cuda-graph-trace=node``); null for a kernel launched on its own, or
where the trace does not say. ``op_type``: the kind of framework op that ran the kernel (TensorFlow's
``Conv2DBackpropFilter``, JAX's ``conv_general_dilated``, PyTorch's ``aten::convolution_backward``);
``scope``: the name path it ran under, whose parts name the model's layers (TensorFlow's op name,
JAX's ``op_name`` metadata, the layer ranges a PyTorch worker marks), read by ``traces.attribution``;
both null where the trace does not say. ``graph_site``: under ``torch.compile``, the aten op a compiled graph's
call ran the kernel in and its place among the call's ops of that name (``aten::mm 3/14``:
``backends.base.graph_site``), which tells one layer's matrix product from another's; null elsewhere. ``step``:
the measured step the kernel ran in, where the table was cut to the worker's step ranges
(``step_split.within_steps``)."""

UNNAMED = "<unnamed>"
"""The name of a kernel whose trace records none, so that it still counts as one kernel."""

MEMORY_DTYPES: dict[str, str] = {
    "kind": "string",
    "start_ns": "int64",
    "dur_ns": "int64",
    "bytes": "Int64",
    "device_id": "Int64",
    "stream_id": "Int64",
}

SUMMARY_DTYPES: dict[str, str] = {
    "name": "string",
    "short_name": "string",
    "instances": "int64",
    "total_ns": "int64",
    "avg_ns": "float64",
    "med_ns": "float64",
    "min_ns": "float64",
    "max_ns": "float64",
    "std_ns": "float64",
    "op_type": "string",
}
"""One row per kernel. ``op_type``: the framework op that ran it where the launches said (their first one that
does), null where a summary's source does not; a kernel whose name says nothing is classified by it."""

NVTX_DTYPES: dict[str, str] = {"text": "string", "start_ns": "int64", "end_ns": "int64"}


def range_table(rows: list[tuple[str, int, int]] | list[dict[str, object]]) -> pd.DataFrame:
    """Named time ranges (NVTX ranges, detprof's step markers) in start order, in the ``nvtx`` schema."""
    frame = pd.DataFrame(rows, columns=list(NVTX_DTYPES))
    return conform(frame.sort_values("start_ns", kind="stable", ignore_index=True), NVTX_DTYPES)


@dataclass(frozen=True)
class Device:
    id: int
    name: str | None = None
    sm_count: int | None = None
    compute_capability: str | None = None
    memory_bytes: int | None = None


def conform(frame: pd.DataFrame, dtypes: dict[str, str]) -> pd.DataFrame:
    """Give a parser's frame exactly the schema's columns, order and dtypes.

    Columns a format does not have become all-null, so every consumer can rely on them
    existing; they are filled from one scalar, not a list of a million nulls.
    """
    n = len(frame)
    out: dict[str, pd.Series] = {}
    for col, dtype in dtypes.items():
        if col in frame.columns:
            out[col] = frame[col].astype(dtype)
        else:
            out[col] = pd.Series(None, index=frame.index, dtype=_nullable(dtype))
    index = pd.RangeIndex(n) if frame.index.equals(pd.RangeIndex(n)) else frame.index
    return pd.DataFrame(out, index=index, copy=False)


def _nullable(dtype: str) -> str:
    return {"int64": "Int64", "float64": "Float64"}.get(dtype, dtype)


def empty(dtypes: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=d) for c, d in dtypes.items()})


Completion = Callable[[pd.DataFrame], pd.DataFrame]
"""Given the launch columns a parser read at once, the whole ``kernels`` table (``KernelTable.defer_columns``)."""


class _Launches:
    """``KernelTable.kernels``: the launch table, completed on first use when its parser deferred columns.

    A descriptor-typed dataclass field, so that ``KernelTable(..., kernels=frame)`` and
    ``dataclasses.replace(table, kernels=frame)`` work as with a plain field; a table set
    that way is whole.
    """

    def __get__(self, table: KernelTable | None, owner: type) -> Any:
        if table is None:
            return None  # the field's default: __set__ makes it an empty table
        frame = table.__dict__["_kernels"]
        complete = table.__dict__.get("_complete")
        if complete is not None:
            frame = table.__dict__["_kernels"] = complete(frame)
            del table.__dict__["_complete"]
        return frame

    def __set__(self, table: KernelTable, frame: pd.DataFrame | None) -> None:
        table.__dict__["_kernels"] = empty(KERNEL_DTYPES) if frame is None else frame
        table.__dict__.pop("_complete", None)


@dataclass
class KernelTable:
    source: str
    format: TraceFormat
    kernels: pd.DataFrame = _Launches()
    memory: pd.DataFrame | None = None
    devices: list[Device] = field(default_factory=list)
    summary: pd.DataFrame | None = None
    nvtx: pd.DataFrame | None = None
    graph_launches: int | None = None
    """CUDA graph launches (``cudaGraphLaunch``/``cuGraphLaunch`` calls) in the trace; None where
    the trace records no API calls (``traces.graphs`` checks that their kernels are there)."""
    cpu_ops: bool = False
    """The rows are a CPU's ops timed by a framework's profiler, not GPU kernels: a trace without a GPU."""

    def defer_columns(self, complete: Completion) -> KernelTable:
        """Leave the launch columns ``kernels`` lacks to ``complete``, run on its first use.

        A parser whose format costs per column read (nsys SQLite) reads at once only what a
        top-N table needs (``launches``), so ``detprof parse`` never pays for start times or
        grid sizes.
        """
        self.__dict__["_complete"] = complete
        return self

    def loaded(self, column: str) -> bool:
        """Whether ``launches`` gives ``column`` without reading the columns a parser deferred."""
        return column in self.__dict__["_kernels"].columns

    def launches(self, *columns: str) -> pd.DataFrame:
        """These launch columns, reading deferred columns only when they are among them."""
        frame = self.__dict__["_kernels"]
        return frame[list(columns)] if set(columns) <= set(frame.columns) else self.kernels[list(columns)]

    @property
    def is_summary(self) -> bool:
        return self.summary is not None

    @property
    def kernel_count(self) -> int:
        if self.summary is not None:
            return int(self.summary["instances"].sum())
        return len(self.launches("dur_ns"))

    @property
    def total_ns(self) -> int:
        if self.summary is not None:
            return int(self.summary["total_ns"].sum())
        return int(self.launches("dur_ns")["dur_ns"].sum())

    @property
    def memory_ns(self) -> int | None:
        if self.memory is None:
            return None
        return int(self.memory["dur_ns"].sum())

    def on_device(self, device_id: int) -> KernelTable:
        """The kernels and memory activity of one device (launch-level inputs only)."""
        kernels = self.kernels[self.kernels["device_id"] == device_id].reset_index(drop=True)
        memory = None
        if self.memory is not None:
            memory = self.memory[self.memory["device_id"] == device_id].reset_index(drop=True)
        devices = [d for d in self.devices if d.id == device_id]
        return KernelTable(
            self.source, self.format, kernels, memory, devices, None, self.nvtx, self.graph_launches, self.cpu_ops
        )
