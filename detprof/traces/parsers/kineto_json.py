"""PyTorch profiler traces (Kineto Chrome-trace JSON, ``*.pt.trace.json[.gz]``) -> KernelTable.

``torch.profiler`` writes one JSON object per process: ``traceEvents`` (Chrome trace
events), ``deviceProperties`` (every GPU of the machine) and, in distributed jobs,
``distributedInfo.rank``. ``tensorboard_trace_handler`` writes them into a folder as
``<worker>.<time>.pt.trace.json[.gz]``, one per rank and profiling cycle.

What counts as a kernel:

- GPU runs: the complete events of category ``kernel`` (CUDA and ROCm/HIP alike).
  ``gpu_memcpy``/``gpu_memset`` events become memory rows. ``ts``/``dur`` are microseconds
  (integers in older traces, fractional in newer ones); each is rounded, not truncated, to
  whole nanoseconds. The kernel's launching aten op is not recorded: the ``External id``
  that newer traces use to link a kernel to its op equals the launch's correlation id in
  older ones (so it would name a wrong op), and the time nesting of launches in ops costs a
  sweep over every CPU op, the bulk of a trace.
- CPU runs (no kernel events: ``torch.profiler`` on a machine without GPU): the nested
  ``cpu_op`` events (``aten::conv2d`` > ``aten::convolution`` > ``aten::mkldnn_convolution``).
  Each op is timed by its self time, its duration less that of the ops nested directly in
  it on the same thread, so that nested ops never count twice and the table's total is the
  time the threads spent in ops, as with TensorFlow's leaf op events. The ``op`` of a row is
  its outermost op, the one the model called.

Steps: detprof's worker marks each measured step with ``record_function("step N")``, which
the trace holds as a ``user_annotation`` event; without those, the profiler's own
``ProfilerStep#N`` annotations are the steps. Both are CPU ranges. CPU ops fall in them
directly. A kernel belongs to the step during which its launching runtime call (same
``args.correlation``) ran on the CPU; ``step_split`` wants the steps as ranges in the
kernel time domain, so each step becomes the span of its own kernels (see
``_kernel_time_ranges``). The GPU-side copies of the annotations (``gpu_user_annotation``)
are used instead only where they hold exactly the kernels launched in each step: Kineto
draws them around the kernels launched on the annotating thread only, so they miss what
autograd's threads launch (in a real ROCm trace the GPU range covers 53,920 of 110,881 ns).

Decoding is the cost of a large trace (a 345 MB file with 200,000 kernels and 1.2 million
events: msgspec 1.4 s, the standard library 7.4 s), so the JSON is decoded by msgspec into
classes that declare only the fields used, with the garbage collector off meanwhile
(``load_trace`` pauses it): it would otherwise walk the millions of new objects again and again. A ``.gz`` file is
decompressed whole in memory with ``gzip.decompress`` (0.7 s for that file; zlib directly
is no faster, and msgspec needs the whole document anyway).
"""

from __future__ import annotations

import gzip
import itertools
import re
import zlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

from detprof.backends.base import STEP_RANGE, graph_site, step_range_name
from detprof.errors import InputError, first_line
from detprof.traces.attribution import LAYER_RANGE, op_kind
from detprof.traces.kernel_names import short_kernel_name
from detprof.traces.kernel_table import (
    DIM_COLUMNS,
    KERNEL_DTYPES,
    MEMORY_DTYPES,
    Device,
    KernelTable,
    conform,
    range_table,
)
from detprof.traces.parsers.nesting import containers, self_times
from detprof.traces.parsers.signatures import GZIP_MAGIC

UTF8_BOM = b"\xef\xbb\xbf"
KERNEL_CATEGORY = "kernel"
MEMORY_KINDS = {"gpu_memcpy": "memcpy", "gpu_memset": "memset"}
CPU_OP_CATEGORY = "cpu_op"
ANNOTATION_CATEGORY = "user_annotation"
GPU_ANNOTATION_CATEGORY = "gpu_user_annotation"
LAUNCH_SUFFIXES = ("_runtime", "_driver")
"""``cuda_runtime``, ``cuda_driver``, and their ROCm spellings (``hipLaunchKernel`` is filed under ``cuda_runtime``)."""
TRACE_SUFFIXES = (".json", ".json.gz")

_PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")
_DETPROF_STEP = re.compile(STEP_RANGE)
_GRAPH_LAUNCH = re.compile(r"^(?:cuda|cu|hip)GraphLaunch")
_COPY_DIRECTION = re.compile(r"^Memcpy (\w+)")
_COMPILED_GRAPH = re.compile(r"^## Call CompiledFxGraph \w+ ##$")
COMPILED_GRAPH_CALL = "## Call CompiledFxGraph ##"
"""Inductor's call of a compiled graph, named in the trace by its cache key, which differs between processes and
modes: one name for every one, so that the two modes' calls are one row."""
_HEAD_BYTES = 1 << 20
_RANK = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(-?\d+)')
_LEADING_SPACE = re.compile(rb"\s*")


class NotKinetoError(InputError):
    """The file is not a PyTorch profiler trace at all, as opposed to one this parser finds nothing in.

    ``load_trace`` hands any JSON or gzip file to this parser, so for it this means "no format
    detprof reads" and it says that, with ``what`` telling what the file looked like.
    """

    def __init__(self, path: Path, what: str) -> None:
        super().__init__(f"{path}: not a PyTorch profiler trace ({what})")
        self.what = what


class _Args(msgspec.Struct, gc=False):
    device: int | str | None = None
    stream: int | str | None = None
    correlation: int | None = None
    grid: list[int] | None = None
    block: list[int] | None = None
    bytes: int | None = None
    sequence: int | None = msgspec.field(default=None, name="Sequence number")
    """An op's autograd sequence number: the backward node of a forward op carries the same one."""


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: float = 0.0
    dur: float = 0.0
    pid: int | str | None = None
    tid: int | str | None = None
    args: _Args | None = None


class _DeviceProperties(msgspec.Struct, gc=False):
    id: int | None = None
    name: str | None = None
    totalGlobalMem: int | None = None
    computeMajor: int | None = None
    computeMinor: int | None = None
    numSms: int | None = None


class _DistributedInfo(msgspec.Struct, gc=False):
    rank: int | None = None


class _Trace(msgspec.Struct, gc=False):
    traceEvents: list[_Event] | None = None
    deviceProperties: list[_DeviceProperties] | None = None
    distributedInfo: _DistributedInfo | None = None
    host_name: str | None = None


_DECODER = msgspec.json.Decoder(_Trace)
_NO_ARGS = _Args()


def load_kineto(path: Path, rank: int | None = None) -> KernelTable:
    """Read a trace file, or the trace of one rank (by default the only one) in a folder of them."""
    path = Path(path)
    file = rank_file(path, rank) if path.is_dir() else path
    trace = _read_trace(file)
    if file == path and rank is not None:
        _check_rank(file, trace, rank)
    events = _group(trace.traceEvents or [])
    if events.kernels:
        return _gpu_table(str(file), trace, events)
    if events.cpu_ops:
        return _cpu_table(str(file), trace, events)
    raise InputError(
        f"{file}: PyTorch profiler trace without GPU kernels or CPU ops (no `kernel` or `cpu_op` events); "
        "profile the training steps themselves"
    )


def looks_like_kineto(head: bytes) -> bool:
    """Whether a file's first bytes (decompressed) open a PyTorch profiler JSON object."""
    text = head.removeprefix(UTF8_BOM)
    start = _LEADING_SPACE.match(text)
    return text[start.end() if start else 0 :].startswith(b"{") and (
        b'"traceEvents"' in text or b'"schemaVersion"' in text
    )


def trace_files(folder: Path) -> list[Path]:
    """The PyTorch profiler traces directly in a folder (``*.json``/``*.json.gz`` that open like one)."""
    candidates = sorted(p for p in folder.iterdir() if p.name.lower().endswith(TRACE_SUFFIXES) and p.is_file())
    return [p for p in candidates if looks_like_kineto(_head(p))]


def trace_rank(file: Path) -> int | None:
    """``distributedInfo.rank`` of a trace file; None for a trace of a job that was not distributed.

    Kineto writes its metadata, ``distributedInfo`` among it, before ``traceEvents``, so the
    first MiB tells without reading the events.
    """
    found = _RANK.search(_head(file))
    return int(found.group(1)) if found else None


def rank_file(folder: Path, rank: int | None) -> Path:
    """The trace of ``rank`` in a folder; without a rank, the only rank's.

    A folder that ``tensorboard_trace_handler`` filled over several profiling cycles holds
    one file per rank and cycle; the newest of the rank is read, as for TensorFlow runs.
    """
    files = trace_files(folder)
    if not files:
        raise InputError(f"{folder}: no PyTorch profiler trace here (no *.json or *.json.gz file with traceEvents)")
    ranks = {file: trace_rank(file) for file in files}
    if rank is None:
        if len(set(ranks.values())) > 1:
            raise InputError(f"{folder}: traces of several ranks ({_rank_list(ranks)}); choose one with --rank")
        return _newest(files)
    chosen = [file for file, found in ranks.items() if found == rank]
    if not chosen:
        raise InputError(f"{folder}: no trace of rank {rank}; ranks here: {_rank_list(ranks)}")
    return _newest(chosen)


def _rank_list(ranks: dict[Path, int | None]) -> str:
    found = sorted({r for r in ranks.values() if r is not None})
    listed = [str(r) for r in found]
    if None in ranks.values():
        listed.append("none (a trace without distributedInfo.rank)")
    return ", ".join(listed)


def _newest(files: list[Path]) -> Path:
    return max(files, key=lambda file: (file.stat().st_mtime_ns, file.name))


def _head(file: Path) -> bytes:
    """The first MiB of a trace, decompressed; what a cut-off gzip yields up to its end."""
    try:
        with file.open("rb") as fh:
            raw = fh.read(_HEAD_BYTES)
    except OSError as exc:
        raise InputError(f"{file}: cannot read ({exc.strerror or exc})") from None
    if not raw.startswith(GZIP_MAGIC):
        return raw
    try:
        return zlib.decompressobj(zlib.MAX_WBITS | 16).decompress(raw, _HEAD_BYTES)
    except zlib.error:
        return b""


def _check_rank(file: Path, trace: _Trace, rank: int) -> None:
    found = trace.distributedInfo.rank if trace.distributedInfo is not None else None
    if found != rank:
        held = f"rank {found}" if found is not None else "no rank (not a distributed trace: no distributedInfo.rank)"
        raise InputError(f"{file}: holds {held}, not rank {rank}")


def _read_trace(file: Path) -> _Trace:
    data, compressed = _read_bytes(file)
    packed = "gzip-compressed JSON" if compressed else "JSON"
    body = memoryview(data)[len(UTF8_BOM) :] if data.startswith(UTF8_BOM) else data
    start = _LEADING_SPACE.match(body)
    first = body[start.end() : start.end() + 1] if start else b""
    if first == b"[":
        try:
            msgspec.json.decode(body)
        except msgspec.DecodeError:  # text that opens with a bracket: an INI or TOML file's section
            raise NotKinetoError(file, "gzip-compressed, but not JSON inside" if compressed else "not JSON") from None
        raise NotKinetoError(file, f"{packed}, but an array, not an object with traceEvents")
    if first != b"{":
        raise NotKinetoError(file, "gzip-compressed, but not JSON inside" if compressed else "not JSON")
    try:
        trace = _DECODER.decode(body)
    except msgspec.ValidationError as exc:
        if " - at `$" not in str(exc):
            raise NotKinetoError(file, f"{packed}, but not an object with traceEvents") from None
        raise InputError(f"{file}: unexpected value in a PyTorch profiler trace ({first_line(exc)})") from None
    except msgspec.DecodeError as exc:
        raise InputError(f"{file}: invalid JSON ({first_line(exc)})") from None
    if trace.traceEvents is None:
        raise NotKinetoError(file, f"{packed}, but without traceEvents")
    return trace


def _read_bytes(file: Path) -> tuple[bytes, bool]:
    """The file's JSON text, and whether it was gzip-compressed (recognised by its magic bytes, not its name)."""
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise InputError(f"{file}: cannot read ({exc.strerror or exc})") from None
    if not raw.startswith(GZIP_MAGIC):
        return raw, False
    try:
        return gzip.decompress(raw), True
    except EOFError:
        raise InputError(f"{file}: truncated gzip file (it ends inside its compressed data)") from None
    except (OSError, zlib.error) as exc:
        raise InputError(f"{file}: corrupt gzip file ({first_line(exc)})") from None


@dataclass
class _Events:
    """The complete (``ph: X``) events of the categories this parser reads."""

    kernels: list[_Event]
    memory: list[_Event]
    launches: list[_Event]
    cpu_ops: list[_Event]
    annotations: list[_Event]
    gpu_annotations: list[_Event]


def _group(events: list[_Event]) -> _Events:
    by_category: defaultdict[str, list[_Event]] = defaultdict(list)
    for event in events:
        if event.ph == "X":
            by_category[event.cat].append(event)
    launches = [e for category, found in by_category.items() if category.endswith(LAUNCH_SUFFIXES) for e in found]
    for op in by_category[CPU_OP_CATEGORY]:
        if _COMPILED_GRAPH.match(op.name):
            op.name = COMPILED_GRAPH_CALL
    return _Events(
        kernels=by_category[KERNEL_CATEGORY],
        memory=[e for category in MEMORY_KINDS for e in by_category[category]],
        launches=launches,
        cpu_ops=by_category[CPU_OP_CATEGORY],
        annotations=by_category[ANNOTATION_CATEGORY],
        gpu_annotations=by_category[GPU_ANNOTATION_CATEGORY],
    )


def _ns(microseconds: Sequence[float]) -> np.ndarray:
    """Microsecond timestamps as whole nanoseconds, each rounded.

    Epoch timestamps in microseconds (1.7e15) times 1000 exceed what a double holds to the
    nanosecond, so the whole microseconds are scaled as integers and only the fraction is
    rounded.
    """
    values = np.asarray(microseconds, dtype=np.float64)
    whole = np.floor(values)
    return whole.astype(np.int64) * 1000 + np.rint((values - whole) * 1000).astype(np.int64)


def _dur_ns(microseconds: Sequence[float]) -> np.ndarray:
    return np.rint(np.asarray(microseconds, dtype=np.float64) * 1000).astype(np.int64)


def _int_array(values: list[object]) -> pd.arrays.IntegerArray:
    """Integers, with anything else (missing, ``"0x0"`` strings) as null."""
    try:
        data = np.array(values, dtype=np.int64)
        return pd.arrays.IntegerArray(data, np.zeros(len(data), dtype=bool))
    except (TypeError, ValueError, OverflowError):
        ints = [v if type(v) is int else None for v in values]
        return pd.array(ints, dtype="Int64")


def _dims(values: list[list[int] | None]) -> list[pd.arrays.IntegerArray]:
    """``[x, y, z]`` lists as three nullable columns."""
    n = len(values)
    if None not in values and set(map(len, values)) == {3}:
        missing = np.zeros(n, dtype=bool)
        whole = values
    else:
        missing = np.array([v is None or len(v) != 3 for v in values], dtype=bool)
        whole = [[0, 0, 0] if m else v for v, m in zip(values, missing.tolist(), strict=True)]
    data = np.fromiter(itertools.chain.from_iterable(whole), dtype=np.int64, count=3 * n).reshape(n, 3)
    return [pd.arrays.IntegerArray(data[:, axis].copy(), missing) for axis in range(3)]


def _gpu_table(source: str, trace: _Trace, events: _Events) -> KernelTable:
    kernels = events.kernels
    args = [e.args if e.args is not None else _NO_ARGS for e in kernels]
    start = _ns([e.ts for e in kernels])
    dur = _dur_ns([e.dur for e in kernels])
    names = pd.Series(pd.Categorical([e.name for e in kernels]))
    short = {name: short_kernel_name(name) for name in names.cat.categories}
    correlation = _int_array([a.correlation for a in args])
    frame = pd.DataFrame(
        {
            "name": names,
            "short_name": names.map(short).astype("category"),
            "start_ns": start,
            "dur_ns": dur,
            **_placement(kernels, args),
            "correlation_id": correlation,
            **dict(zip(DIM_COLUMNS, _dims([a.grid for a in args]) + _dims([a.block for a in args]), strict=True)),
        }
    )
    step = _launch_steps(correlation, events)
    steps = _gpu_steps(start, start + dur, step, events)
    frame = frame.sort_values(["start_ns", "device_id"], kind="stable", ignore_index=True)
    device_ids = sorted({int(d) for d in frame["device_id"].dropna().unique()})
    table = KernelTable(
        source=source,
        format="kineto-json",
        kernels=conform(frame, _LAUNCH_DTYPES),
        memory=_memory(events.memory),
        devices=_devices(trace, device_ids),
        nvtx=steps,
        graph_launches=_graph_launches(events.launches),
    )
    return table.defer_columns(
        lambda launches: conform(launches.assign(**_launching_ops(launches, events)), KERNEL_DTYPES)
    )


_OP_COLUMNS = ("op", "op_type", "scope", "graph_site")
_LAUNCH_DTYPES = {column: dtype for column, dtype in KERNEL_DTYPES.items() if column not in _OP_COLUMNS}
"""A GPU trace's kernel columns but the ops that launched them, which cost a walk over every CPU op (the bulk of a
trace): ``detprof parse`` never pays for it, a sweep's attribution does on first use (``_launching_ops``)."""


def _launching_ops(launches: pd.DataFrame, events: _Events) -> dict[str, pd.Categorical]:
    """Each kernel's ops and layer: the runtime call of its correlation id, the innermost op around that call on
    its thread (``op``), the outermost one (``op_type``: what the model called, or the backward node), and the
    layer ranges around the call, or around the forward op of the backward node's sequence number (``scope``)."""
    ops = events.cpu_ops
    calls = {(e.args or _NO_ARGS).correlation: e for e in events.launches}
    call_of = [calls.get(c) for c in launches["correlation_id"].astype("Int64").tolist()]
    found = [call for call in call_of if call is not None]
    op_thread, call_thread = _threads(ops, found)
    start = _ns([e.ts for e in ops])
    end = start + _dur_ns([e.dur for e in ops])
    at = _ns([e.ts for e in found])
    parent, innermost = containers(op_thread, start, end, call_thread, at)
    _, outermost = self_times(op_thread, start, end, parent)
    sites = _graph_sites(ops, op_thread, start, end, parent)
    layers = _LayerRanges.of(events)
    scopes = dict(zip(map(id, ops), layers.scopes(ops, start, outermost), strict=True))
    around = iter(layers.holding(found, at))
    names: list[str | None] = []
    kinds: list[str | None] = []
    paths: list[str | None] = []
    placed: list[str | None] = []
    held = iter(innermost.tolist())
    for call in call_of:
        inner = next(held) if call is not None else -1
        path = next(around) if call is not None else None
        if inner < 0:
            names.append(None)
            kinds.append(None)
            paths.append(path)
            placed.append(None)
            continue
        top = ops[int(outermost[inner])]
        names.append(ops[inner].name)
        kinds.append(op_kind(top.name))
        paths.append(path or scopes[id(top)])
        placed.append(sites[inner])
    return {
        "op": pd.Categorical(names),
        "op_type": pd.Categorical(kinds),
        "scope": pd.Categorical(paths),
        "graph_site": pd.Categorical(placed),
    }


_ATEN = "aten::"


def _graph_sites(
    ops: Sequence[_Event], thread: np.ndarray, start: np.ndarray, end: np.ndarray, parent: np.ndarray
) -> list[str | None]:
    """Each op's place in the call of a compiled graph that ran it (``base.graph_site``): the aten op among the
    call's own ops of its name (the extern kernels its code calls: ``aten::mm 3/14``) that the op is or runs in;
    None outside them. The record's ``kernel_modules`` names the module of each such place (``inductor_places``)."""
    sites: list[str | None] = [None] * len(ops)
    calls = {index for index, op in enumerate(ops) if op.name == COMPILED_GRAPH_CALL}
    if not calls:
        return sites
    called: defaultdict[tuple[int, str], list[int]] = defaultdict(list)
    for index, holder in enumerate(parent.tolist()):
        if holder in calls and ops[index].name.startswith(_ATEN):
            called[holder, ops[index].name].append(index)
    for children in called.values():
        children.sort(key=lambda index: start[index])
        for place, index in enumerate(children, 1):
            sites[index] = graph_site(ops[index].name, place, len(children))
    for index in np.lexsort((-end, start, thread)).tolist():
        holder = int(parent[index])
        if sites[index] is None and holder >= 0:
            sites[index] = sites[holder]
    return sites


def _placement(events: list[_Event], args: list[_Args]) -> dict[str, pd.arrays.IntegerArray]:
    """Device and stream of GPU events: ``args.device``/``args.stream``, else the pid/tid Kineto files them under."""
    devices = [a.device for a in args]
    streams = [a.stream for a in args]
    if None in devices:
        devices = [d if d is not None else e.pid for d, e in zip(devices, events, strict=True)]
    if None in streams:
        streams = [s if s is not None else e.tid for s, e in zip(streams, events, strict=True)]
    return {"device_id": _int_array(devices), "stream_id": _int_array(streams)}


def _memory(events: list[_Event]) -> pd.DataFrame:
    """Copies and sets, with nsys's kind spelling (``memcpy HtoD``, ``memset``) so kinds compare across formats."""
    args = [e.args if e.args is not None else _NO_ARGS for e in events]
    frame = pd.DataFrame(
        {
            "kind": [_memory_kind(e) for e in events],
            "start_ns": _ns([e.ts for e in events]),
            "dur_ns": _dur_ns([e.dur for e in events]),
            "bytes": _int_array([a.bytes for a in args]),
            **_placement(events, args),
        }
    )
    return conform(frame.sort_values("start_ns", kind="stable", ignore_index=True), MEMORY_DTYPES)


def _memory_kind(event: _Event) -> str:
    kind = MEMORY_KINDS[event.cat]
    direction = _COPY_DIRECTION.match(event.name) if kind == "memcpy" else None
    return f"memcpy {direction.group(1)}" if direction else kind


def _devices(trace: _Trace, device_ids: list[int]) -> list[Device]:
    """The GPUs that ran kernels; ``deviceProperties`` lists every GPU of the machine."""
    properties = {p.id: p for p in trace.deviceProperties or () if p.id is not None}
    devices = []
    for device_id in device_ids:
        p = properties.get(device_id)
        if p is None:
            devices.append(Device(id=device_id))
            continue
        capability = None
        if p.computeMajor is not None and p.computeMinor is not None:
            capability = f"{p.computeMajor}.{p.computeMinor}"
        memory = p.totalGlobalMem
        devices.append(Device(device_id, p.name, sm_count=p.numSms, compute_capability=capability, memory_bytes=memory))
    return devices


def _graph_launches(launches: list[_Event]) -> int | None:
    """CUDA/HIP graph launches among the runtime calls; None where the trace records no calls."""
    if not launches:
        return None
    calls = pd.Series([e.name for e in launches]).value_counts()
    return int(sum(count for name, count in calls.items() if _GRAPH_LAUNCH.match(name)))


@dataclass(frozen=True)
class _Ranges:
    """Time ranges in nanoseconds, in step order."""

    starts: np.ndarray
    ends: np.ndarray
    names: tuple[str, ...] = ()
    """The steps' range names (``step_split``'s), where known: detprof's markers as they are (``step 3 default`` where
    one process ran two arms), ``ProfilerStep#N`` numbered as detprof's."""

    def __len__(self) -> int:
        return len(self.starts)

    def index_of(self, times: np.ndarray) -> np.ndarray:
        """The range each time falls in, -1 for none: the last range starting at or before it, if it has not ended.

        This is ``step_split``'s rule, so that ranges checked with it split kernels as it will.
        """
        index = np.searchsorted(self.starts, times, side="right") - 1
        inside = (index >= 0) & (times < self.ends[np.clip(index, 0, None)])
        return np.where(inside, index, -1)

    def table(self) -> pd.DataFrame:
        bounds = zip(self.starts.tolist(), self.ends.tolist(), strict=True)
        names = self.names or tuple(step_range_name(i) for i in range(len(self)))
        return range_table([(name, start, end) for name, (start, end) in zip(names, bounds, strict=True)])

    def named(self, steps: list[_Event]) -> _Ranges:
        """These ranges named after ``steps`` (``_step_annotations``)."""
        names = tuple(e.name if _DETPROF_STEP.match(e.name) else step_range_name(i) for i, e in enumerate(steps))
        return replace(self, names=names)


def _step_annotations(events: _Events) -> list[_Event]:
    """The CPU ranges that are steps, in order: detprof's ``step N`` markers, else ``ProfilerStep#N``."""
    markers = [e for e in events.annotations if _DETPROF_STEP.match(e.name)]
    steps = markers or [e for e in events.annotations if _PROFILER_STEP.match(e.name)]
    return sorted(steps, key=lambda e: e.ts)


def _cpu_ranges(steps: list[_Event]) -> _Ranges:
    starts = _ns([e.ts for e in steps])
    return _Ranges(starts, starts + _dur_ns([e.dur for e in steps]))


def _launch_steps(correlation: pd.arrays.IntegerArray, events: _Events) -> np.ndarray:
    """Each kernel's step: the one during which its launching call ran on the CPU; -1 for none.

    A kernel whose launch the trace lacks was launched before the profiler started (it ran
    on after), so it belongs to no profiled step.
    """
    none = np.full(len(correlation), -1)
    steps = _cpu_ranges(_step_annotations(events))
    calls = events.launches
    call_ids = _int_array([(e.args or _NO_ARGS).correlation for e in calls]).to_numpy(dtype=np.int64, na_value=-1)
    if not len(steps) or not (call_ids >= 0).any():
        return none
    order = np.argsort(call_ids, kind="stable")
    call_ids, call_times = call_ids[order], _ns([e.ts for e in calls])[order]
    ids = correlation.to_numpy(dtype=np.int64, na_value=-2)
    at = np.minimum(np.searchsorted(call_ids, ids), len(call_ids) - 1)
    found = call_ids[at] == ids
    return np.where(found, steps.index_of(call_times[at]), none)


def _gpu_steps(start: np.ndarray, end: np.ndarray, step: np.ndarray, events: _Events) -> pd.DataFrame | None:
    annotations = _step_annotations(events)
    if not annotations:
        return None
    gpu = _gpu_annotation_ranges(annotations, events.gpu_annotations)
    if gpu is not None and np.array_equal(gpu.index_of(start), step):
        return gpu.named(annotations).table()
    return _kernel_time_ranges(start, end, step, len(annotations)).named(annotations).table()


def _gpu_annotation_ranges(steps: list[_Event], gpu_annotations: list[_Event]) -> _Ranges | None:
    """The GPU-side ranges of the steps (one per stream, merged), if every step has one and they do not overlap."""
    spans: dict[str, list[float]] = {}
    for e in gpu_annotations:
        span = spans.setdefault(e.name, [e.ts, e.ts + e.dur])
        span[0], span[1] = min(span[0], e.ts), max(span[1], e.ts + e.dur)
    if any(e.name not in spans for e in steps):
        return None
    chosen = [spans[e.name] for e in steps]
    starts = _ns([s for s, _ in chosen])
    ends = _ns([e for _, e in chosen])
    if np.any(starts[1:] < ends[:-1]):
        return None
    return _Ranges(starts, ends)


def _kernel_time_ranges(start: np.ndarray, end: np.ndarray, step: np.ndarray, count: int) -> _Ranges:
    """Steps as ranges of kernel time: each from its first kernel's start to its last kernel's end.

    A step without kernels becomes an empty range where the step before it ended (or where
    the first step with kernels starts), so that step numbers still count every step. Where
    the GPU runs behind and a step's first kernels (on one stream) start before the previous
    step's last ones (on another), no single range per step holds exactly its own kernels;
    the two ranges then meet at the boundary that puts the least kernel time in the wrong
    step (``_ByStart.least_misplaced_boundary``). Kernels launched before the profiler
    started that still run when the first step's kernels start are weighed the same way
    against the first step. detprof's worker ends each step by reading the loss back, so
    its steps never overlap on the GPU and their ranges are exact.
    """
    mine = step >= 0
    first = np.full(count, np.iinfo(np.int64).max)
    last = np.full(count, np.iinfo(np.int64).min)
    np.minimum.at(first, step[mine], start[mine])
    np.maximum.at(last, step[mine], np.maximum(end[mine], start[mine] + 1))
    order = np.argsort(start, kind="stable")
    by_start = _ByStart(start[order], (end - start)[order], step[order])
    with_kernels = np.flatnonzero(first <= last).tolist()
    spans: dict[int, _Span] = {}
    previous = _launched_earlier(start, end, step, int(first[with_kernels[0]])) if with_kernels else None
    for i in with_kernels:
        current = _Span(i, int(first[i]), int(last[i]))
        if previous is not None and previous.end > current.start:
            boundary = by_start.least_misplaced_boundary(previous.step, i, current.start, previous.end)
            boundary = max(boundary, previous.start)
            previous.end = current.start = boundary
            current.end = max(current.end, boundary)
        spans[i] = previous = current
    return _with_empty_steps(spans, count, int(start.min()) if len(start) else 0)


def _launched_earlier(start: np.ndarray, end: np.ndarray, step: np.ndarray, first_step_start: int) -> _Span | None:
    """The span of the kernels of no step that start before the first step's kernels, as a step -1."""
    earlier = (step < 0) & (start < first_step_start)
    if not earlier.any():
        return None
    return _Span(-1, int(start[earlier].min()), int(end[earlier].max()))


@dataclass
class _Span:
    step: int
    start: int
    end: int


def _with_empty_steps(spans: dict[int, _Span], count: int, origin: int) -> _Ranges:
    """All ``count`` steps, those without kernels as empty ranges right after the step before them."""
    starts, ends = [], []
    at = spans[min(spans)].start if spans else origin
    for i in range(count):
        span = spans.get(i)
        starts.append(span.start if span else at)
        ends.append(span.end if span else at)
        at = ends[-1]
    return _Ranges(np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64))


@dataclass(frozen=True)
class _ByStart:
    """Kernels sorted by start time: starts, durations and steps."""

    start: np.ndarray
    dur: np.ndarray
    step: np.ndarray

    def least_misplaced_boundary(self, before: int, after: int, lo: int, hi: int) -> int:
        """Where steps ``before`` and ``after``, whose kernels overlap in ``[lo, hi)``, split best.

        Kernels that start before the boundary count for ``before``; the boundary minimises the
        time of ``after``'s kernels before it plus ``before``'s kernels from it on. Kernels
        starting at the same time are never split.
        """
        window = slice(np.searchsorted(self.start, lo, side="left"), np.searchsorted(self.start, hi, side="left"))
        starts, durs, steps = self.start[window], self.dur[window], self.step[window]
        early_after = np.concatenate(([0], np.cumsum(np.where(steps == after, durs, 0))))
        late_before = np.concatenate(([0], np.cumsum(np.where(steps == before, durs, 0))))
        # A boundary at position k: kernels [0, k) go before it, [k, n) from it on.
        cost = early_after + (late_before[-1] - late_before)
        splittable = np.concatenate(([True], starts[1:] != starts[:-1], [True]))
        positions = np.flatnonzero(splittable)
        best = int(positions[np.argmin(cost[positions])])
        return int(starts[best]) if best < len(starts) else hi


def _threads(*events: Sequence[_Event]) -> list[np.ndarray]:
    """Each event's thread as one integer per (pid, tid), numbered alike across the lists."""
    keys, _ = pd.factorize(pd.Series([(e.pid, e.tid) for found in events for e in found], dtype=object))
    bounds = np.cumsum([0, *map(len, events)])
    return [keys[a:b].astype(np.int64) for a, b in itertools.pairwise(bounds)]


@dataclass(frozen=True)
class _LayerRanges:
    """The ranges a detprof worker put around each Keras layer call (``attribution.LAYER_RANGE``), and the
    layer path of each: a PyTorch trace names no layer otherwise."""

    ranges: list[_Event]
    start: np.ndarray
    end: np.ndarray
    paths: list[str]

    @classmethod
    def of(cls, events: _Events) -> _LayerRanges:
        ranges = sorted((e for e in events.annotations if e.name.startswith(LAYER_RANGE)), key=lambda e: e.ts)
        start = _ns([e.ts for e in ranges])
        end = start + _dur_ns([e.dur for e in ranges])
        (thread,) = _threads(ranges)
        parent, _ = containers(thread, start, end, thread[:0], start[:0])
        paths: list[str] = []
        for index, event in enumerate(ranges):
            name = event.name.removeprefix(LAYER_RANGE)
            paths.append(f"{paths[parent[index]]}/{name}" if parent[index] >= 0 else name)
        return cls(ranges, start, end, paths)

    def holding(self, where: Sequence[_Event], at: np.ndarray) -> list[str | None]:
        """The layer path around each moment ``at`` on the thread of ``where``; None outside every layer."""
        if not self.ranges:
            return [None] * len(at)
        thread, points = _threads(self.ranges, where)
        _, holder = containers(thread, self.start, self.end, points, at)
        return [self.paths[h] if h >= 0 else None for h in holder.tolist()]

    def scopes(self, ops: Sequence[_Event], start: np.ndarray, outermost: np.ndarray) -> list[str | None]:
        """Each op's layer path: the layer ranges around it, or, for the ops of a backward node (which runs
        after every layer call has ended), those around the forward op of the same autograd sequence number;
        a gradient's accumulation into its variable goes with the node that computed it (``_accumulated``)."""
        around = self.holding(ops, start)
        forward: dict[int, str] = {}
        for op, path in zip(ops, around, strict=True):
            sequence = (op.args or _NO_ARGS).sequence
            if path is not None and sequence is not None:
                forward.setdefault(sequence, path)
        backward = [(ops[i].args or _NO_ARGS).sequence for i in outermost.tolist()]
        found = [
            path or (forward.get(seq) if seq is not None else None) for path, seq in zip(around, backward, strict=True)
        ]
        return _accumulated(ops, start, outermost, found)


_ACCUMULATE_GRAD = "torch::autograd::AccumulateGrad"


def _accumulated(
    ops: Sequence[_Event], start: np.ndarray, outermost: np.ndarray, found: list[str | None]
) -> list[str | None]:
    """``found`` with each op of an ``AccumulateGrad`` node placed in the layer of the node run just before it on
    its thread. The node has no forward op (no sequence number), but autograd's engine runs it the moment its
    variable's gradient is computed (it ranks first in the ready queue), right after the backward node of the
    layer that owns the variable: on a small model its time would otherwise leave several percent of the step
    unattributed."""
    top = outermost.astype(np.int64)
    accumulates = np.array([op.name.endswith(_ACCUMULATE_GRAD) for op in ops], dtype=bool)[top]
    if not accumulates.any():
        return found
    (thread,) = _threads(ops)
    order = np.lexsort((start, thread))
    other_node = (top == np.arange(len(ops)))[order] & ~accumulates[order]
    last = np.maximum.accumulate(np.where(other_node, np.arange(len(order)), -1))
    placed = list(found)
    for position in np.flatnonzero(accumulates[order] & (last >= 0)).tolist():
        op, node = int(order[position]), int(order[last[position]])
        if found[op] is None and thread[node] == thread[op]:
            placed[op] = found[node]
    return placed


def _cpu_table(source: str, trace: _Trace, events: _Events) -> KernelTable:
    ops = events.cpu_ops
    start = _ns([e.ts for e in ops])
    end = start + _dur_ns([e.dur for e in ops])
    pids, _ = pd.factorize(pd.Series([e.pid for e in ops], dtype=object))
    tids, _ = pd.factorize(pd.Series([e.tid for e in ops], dtype=object))
    thread = pids.astype(np.int64) * (int(tids.max()) + 1) + tids
    parent, _ = containers(thread, start, end, thread[:0], start[:0])
    self_ns, outermost = self_times(thread, start, end, parent)
    names = np.array([e.name for e in ops], dtype=object)
    layers = _LayerRanges.of(events)
    frame = pd.DataFrame(
        {
            "name": pd.Categorical(names),
            "start_ns": start,
            "dur_ns": self_ns,
            "device_id": np.zeros(len(ops), dtype=np.int64),
            "stream_id": _int_array([e.tid for e in ops]),
            "op": pd.Categorical(names[outermost]),
            "op_type": pd.Categorical([op_kind(name) for name in names[outermost]]),
            "scope": pd.Categorical(layers.scopes(ops, start, outermost)),
            "graph_site": pd.Categorical(_graph_sites(ops, thread, start, end, parent)),
        }
    )
    frame["short_name"] = frame["name"]
    frame = frame.sort_values("start_ns", kind="stable", ignore_index=True)
    steps = _step_annotations(events)
    host = f"{trace.host_name} CPU" if trace.host_name else "CPU"
    return KernelTable(
        source=source,
        format="kineto-cpu-json",
        kernels=conform(frame, KERNEL_DTYPES),
        devices=[Device(id=0, name=host)],
        nvtx=_cpu_ranges(steps).named(steps).table() if steps else None,
        cpu_ops=True,
    )
