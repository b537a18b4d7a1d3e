"""TensorFlow and JAX profiler traces (XSpace protobufs, ``*.xplane.pb``) -> KernelTable.

``tf.profiler.experimental.start/stop``, the TensorBoard callback and
``jax.profiler.start_trace/stop_trace`` write one XSpace per host into
``<logdir>/plugins/profile/<run>/<host>.xplane.pb``. An XSpace holds planes
(``/host:CPU``, ``/device:GPU:N``), each with lines (threads, CUDA streams, derived
views) of events whose names and stat names live in per-plane metadata tables.

What counts as a kernel:

- GPU runs: the kernel records of the GPU tracer (CUPTI on NVIDIA, roctracer on AMD), which
  TensorFlow's profiler and ``jax.profiler`` write alike (XLA's ``cupti_collector`` and
  ``rocm_collector``): the events on the ``Stream #N(...)`` lines of ``/device:GPU:N`` planes
  that carry a ``kernel_details`` stat (registers, grid, block), which the collectors give
  every kernel and nothing else. ``Memcpy*`` and ``Memset*`` events (or those with copy or
  set details) become memory rows; other activity on a stream line (memory residency,
  unified-memory counters, a CUDA graph traced as one block) is neither and is left out.
  The plane's other lines ("TensorFlow Ops", "XLA Ops", "Steps", ...) are views derived from
  the same records and would count every kernel twice; the host planes hold the launches,
  never kernel time. A kernel's ``op`` is the HLO instruction that launched it (``hlo_op``),
  else its TF op (``tf_op``, or ``level 0`` in older TensorFlow: the outermost annotation,
  ``op_name:OpType``, which TensorFlow's kernel-stats tool reports as the op). XLA annotates
  each launch with its module around its instruction (``XlaModule:#hlo_module=...#``,
  ``Thunk:#hlo_op=...#``) and the collector files the outermost name, ``XlaModule``, as
  ``tf_op``, so for XLA's kernels, every JAX kernel among them, the instruction comes first.
  A kernel a CUDA graph node launched keeps the node (``cuda_graph_node_id``). The devices
  are the GPUs that ran kernels, named by the GPU's model where the plane records it
  (``gpu_device_name``), else by the plane. A trace with GPU activity but no kernel, or
  with none and a profiler error (a GPU tracer that failed: CUPTI missing or not
  permitted), is refused rather than read from its host ops, which are not kernel time.
- CPU runs (no GPU activity at all): the TF op events of the host plane's
  ``tf_Compute*`` (inter-op executor) and ``tf_numa_*Eigen*`` (intra-op) threads. Only
  events named ``op_name:OpType`` are ops; the same threads also carry executor and
  thread-pool bookkeeping (``ExecutorState::Process``, ``ThreadpoolListener::Record``,
  ``MemoryAllocation``) whose time encloses or is not op work. The python thread
  (eager dispatch) and tf.data threads (input pipeline) are not the training step's
  compute and are left out. The op type is the kernel ``name``, the op name its ``op``.
- CPU runs compiled with XLA (TF's ``jit_compile=True``, every JAX program) run as XLA:CPU
  thunks, one event per executed HLO instruction (``convolution.3``,
  ``transpose_copy_fusion.7``, ``wrapped_reduce-window``) carrying ``hlo_op`` (the
  instruction) and ``hlo_module`` stats. That stat, not the event name, marks them: the
  same threads carry ``ThunkExecutor::Execute``, ``end: <name>`` markers and thread-pool
  bookkeeping, and thunks run on whichever thread is free: TF's ``tf_Compute``/Eigen
  threads, JAX's ``tf_XLAPjRtCpuClient`` and ``tf_XLAEigen`` threads, and the python
  thread itself for small programs (without an enclosing executor event). The
  instruction without its ``.N`` instance suffix (``convolution``) is the ``name`` and
  ``short_name``, so that a diff lines up programs whose instances got other numbers;
  the instruction itself (``convolution.3``) is the ``op``. The TF ops that launch a
  cluster (``_XlaRun``) enclose that time and are left out.
- Host ops nest only where a thunk runs others synchronously (a ``while`` thunk and its
  body on the same thread): each row then holds its self time, its duration less that
  of the ops nested in it on the same line, so no time counts twice. Ops on different
  threads run concurrently and all count, as CPU time does.
- Traces written by JAX (a ``/host:metadata`` plane with a ``jax_version`` stat) are
  format ``jax-xplane``, TensorFlow's ``tf-xplane``: the rows are parsed alike, but on a
  CPU a JAX table's names are HLO instructions, never TF op types.

Steps are detprof's ``step i`` markers on the host plane (a TraceMe per measured step), as
NVTX-like ranges; ``step_split`` puts a kernel in the range its start falls in. That holds
on a GPU because the worker reads each step's result back before the range closes and the
GPU tracer puts kernel times on the host's clock (XLA's collector aligns them to the wall
clock at the start of the trace).

The files are read with detprof's own XSpace classes (``xspace_schema``), so reading a
trace needs protobuf, never TensorFlow.

Times are ``line.timestamp_ns + event.offset_ps / 1000`` and ``duration_ps / 1000``,
truncated to whole nanoseconds.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from google.protobuf.message import DecodeError

from detprof.backends.base import STEP_RANGE
from detprof.errors import InputError, first_line
from detprof.traces.kernel_names import short_kernel_name
from detprof.traces.kernel_table import (
    DIM_COLUMNS,
    KERNEL_DTYPES,
    MEMORY_DTYPES,
    Device,
    KernelTable,
    TraceFormat,
    conform,
    range_table,
)
from detprof.traces.parsers.nesting import self_times
from detprof.traces.parsers.signatures import GZIP_MAGIC
from detprof.traces.parsers.xspace_schema import hlo_class, xspace_class

_GPU_PLANE = re.compile(r"^/device:GPU:(\d+)$")
_HOST_PLANE = "/host:CPU"
_STREAM_LINE = "Stream #"
_OP_THREAD = re.compile(r"^(?:tf_Compute|tf_numa_.*Eigen)")
_STEP_MARKER = re.compile(STEP_RANGE)
# A TF op event name, modelled on TensorFlow's own test (tsl/profiler/utils/tf_op_utils.cc).
_TF_OP = re.compile(r"^(?P<op>[A-Za-z0-9.][A-Za-z0-9_.\\/>-]*):(?P<type>[A-Z_][A-Za-z0-9_]*)$")
_MEMORY_EVENT = re.compile(r"^Mem(?:cpy|set)")
_XLA_LAUNCH_OPS = frozenset({"_XlaRun", "_XlaCompile", "XlaLaunch", "XlaLaunchV2"})
_XLA_INSTANCE_SUFFIX = re.compile(r"\.\d+$")
_KERNEL_STAGE_SUFFIX = re.compile(r"__\d+$")
_COPY_DIRECTION = re.compile(r"^Memcpy([A-Z])2([A-Z])$")
_LAUNCH_SHAPE = re.compile(r"(grid|block):(\d+),(\d+),(\d+)")
# Copies say "size:N" (CUPTI and roctracer alike); sets "size:N" in older TensorFlow, "num_bytes:N" in XLA.
_SIZE = re.compile(r"(?:^|\s)(?:size|num_bytes):(\d+)")
_METADATA_PLANE = "/host:metadata"
_HLO_PROTO_STAT = "Hlo Proto"
_JAX_VERSION_STAT = "jax_version"
_TF_RUN_NAME = re.compile(r"^\d{4}_\d{2}_\d{2}_\d{2}_\d{2}_\d{2}$")
# tf.profiler writes <logdir>/plugins/profile; Keras' TensorBoard callback one level down
# (<logdir>/train/plugins/profile). Deeper folders are other experiments, not this one.
_PROFILE_DIRS = ("plugins/profile", "*/plugins/profile")
_RUN_FILES = tuple(f"{d}/*/*.xplane.pb" for d in _PROFILE_DIRS)

# The stats read, by their name in the trace -> the name used here: XLA spells the memset details
# "Memset_details" (xla/tsl/profiler/utils/xplane_schema.cc), older TensorFlow "memset_details".
_WANTED_STATS = {
    name: name
    for name in (
        "correlation_id",
        "kernel_details",
        "level 0",
        "tf_op",
        "annotation",
        "memcpy_details",
        "memset_details",
        "hlo_op",
        "hlo_module",
        "program_id",
    )
} | {"Memset_details": "memset_details", "cuda_graph_node_id": "graph_node_id"}


class NotXSpaceError(InputError):
    """The file is not an XSpace at all, as opposed to an XSpace this parser finds nothing in.

    ``load_trace`` reaches this parser for any binary file it recognised as nothing else, so
    for it this means "no format detprof reads" and it says that instead.
    """


def load_xplane(path: Path) -> KernelTable:
    """Read an ``.xplane.pb`` file, a ``plugins/profile/<run>`` folder or a profiler log folder.

    A log folder is what ``tf.profiler.experimental.start`` or ``jax.profiler.start_trace``
    was given (or a TensorBoard callback's); its newest run is read.
    """
    path = Path(path)
    files = xplane_files(path)
    spaces = [(file, _read_space(file)) for file in files]
    several = len(spaces) > 1

    trace_format: TraceFormat = "jax-xplane" if any(_written_by_jax(space) for _, space in spaces) else "tf-xplane"

    gpu = _Collected()
    base = 0
    for file, space in spaces:
        gpu.hlo_names = _hlo_names(space)
        base = _collect_gpu(space, _host_label(file, space) if several else "", base, gpu)
    if gpu.kernels:
        for _, space in spaces:
            _collect_steps(space, gpu)
        return _table(path, gpu, trace_format, ops_are_kernels=False)
    _refuse_gpu_run_without_kernels(path, gpu, [error for _, space in spaces for error in space.errors])

    cpu = _Collected()
    for index, (file, space) in enumerate(spaces):
        cpu.hlo_names = _hlo_names(space)
        _collect_cpu_ops(space, _host_label(file, space) if several else "", index, cpu)
        _collect_steps(space, cpu)
    if cpu.kernels:
        return _table(path, cpu, trace_format, ops_are_kernels=True)
    raise InputError(
        f"{path}: profile holds no GPU kernels and no TF op or XLA events (no TF ops on tf_Compute/Eigen "
        "threads, no XLA:CPU ops with an hlo_op stat): an empty or eager-only profile; profile model.fit, "
        "a tf.function or a jitted JAX function"
    )


def _refuse_gpu_run_without_kernels(path: Path, gpu: _Collected, errors: list[str]) -> None:
    """A GPU run whose kernels the trace lacks is unreadable: its host ops are launches, not kernel time.

    GPU activity without a kernel record, or a profiler error (a GPU tracer that failed to
    start writes its error into the XSpace and no device events), marks such a run; a CPU
    run has neither.
    """
    if gpu.memory or gpu.other_activity:
        raise InputError(
            f"{path}: the GPU planes hold {len(gpu.memory)} memory copies/sets and {gpu.other_activity} other "
            "events but no kernel record (no event with kernel_details): the traced steps launched no kernel, "
            "or the GPU tracer lost them; host ops are not kernel time"
        )
    if errors:
        raise InputError(
            f"{path}: profile holds no GPU kernels and its profiler reported {len(errors)} error(s), the first: "
            f"{' '.join(errors[0].split())!r}; a GPU run traced without its kernels (a GPU tracer that failed: "
            "CUPTI missing or not permitted) cannot be read from its host ops, which are not kernel time"
        )


def xplane_files(path: Path) -> list[Path]:
    """The XSpace files a path stands for: itself, a run folder's, or a log folder's newest run's.

    A run holds one file per profiled host, and all of them belong to the same steps.
    """
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    if not path.is_dir():
        return [path]
    direct = sorted(p for p in path.glob("*.xplane.pb") if p.is_file())
    if direct:
        return direct
    runs = sorted({p.parent for pattern in _RUN_FILES for p in path.glob(pattern) if p.is_file()})
    if not runs:
        if any(p.is_dir() for pattern in _PROFILE_DIRS for p in path.glob(pattern)):
            raise InputError(f"{path}: plugins/profile holds no run with an *.xplane.pb file")
        raise InputError(f"{path}: no TensorFlow profile here (no *.xplane.pb, no plugins/profile/<run>/)")
    return sorted(p for p in _newest(runs).glob("*.xplane.pb") if p.is_file())


def _newest(runs: list[Path]) -> Path:
    """TensorFlow names runs by their UTC start time, which sorts; renamed runs go by mtime."""
    if all(_TF_RUN_NAME.match(run.name) for run in runs):
        return max(runs, key=lambda run: run.name)
    return max(runs, key=lambda run: (run.stat().st_mtime_ns, run.name))


def _read_space(file: Path) -> Any:
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise InputError(f"{file}: cannot read ({exc.strerror or exc})") from None
    if not data:
        raise InputError(f"{file}: empty file")
    if data.startswith(GZIP_MAGIC):  # jax.profiler's traces, as a run folder may keep them (.xplane.pb.gz)
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(f"{file}: truncated or damaged gzip file ({first_line(exc)})") from None
    space = xspace_class()()
    try:
        space.ParseFromString(data)
    except DecodeError:
        raise NotXSpaceError(f"{file}: not a TensorFlow profiler trace (not an XSpace protobuf)") from None
    # Arbitrary bytes often decode as a protobuf with only unknown fields, so a real XSpace
    # is recognised by its planes.
    if not any(p.name.startswith(("/host:", "/device:")) for p in space.planes):
        raise NotXSpaceError(f"{file}: not a TensorFlow profiler trace (no host or device planes in the XSpace)")
    return space


def _written_by_jax(space: Any) -> bool:
    """JAX's profiler records its version in a metadata plane; TensorFlow's never does."""
    metadata = (plane for plane in space.planes if plane.name == _METADATA_PLANE)
    return any(_JAX_VERSION_STAT in _Stats(plane).plane_values(plane) for plane in metadata)


def _host_label(file: Path, space: Any) -> str:
    host = space.hostnames[0] if space.hostnames else file.name.removesuffix(".xplane.pb")
    return f"{host} "


@dataclass
class _Collected:
    kernels: list[dict[str, object]] = field(default_factory=list)
    memory: list[dict[str, object]] = field(default_factory=list)
    devices: list[Device] = field(default_factory=list)
    steps: list[dict[str, object]] = field(default_factory=list)
    other_activity: int = 0
    """Events on GPU stream lines that are neither kernels nor memory rows."""
    hlo_names: dict[str, dict[str, str]] = field(default_factory=dict)
    """The space being read: each compiled XLA program's instructions and the ``op_name`` each came from."""


class _Stats:
    """Resolves one plane's stats by name; reference values point into the stat names."""

    def __init__(self, plane: Any) -> None:
        self._names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        self._wanted = {key: _WANTED_STATS[name] for key, name in self._names.items() if name in _WANTED_STATS}

    def of(self, *holders: Iterable[Any]) -> dict[str, object]:
        values: dict[str, object] = {}
        for stats in holders:
            for stat in stats:
                name = self._wanted.get(stat.metadata_id)
                if name is not None:
                    values[name] = self._value(stat)
        return values

    def plane_values(self, plane: Any) -> dict[str, object]:
        return {self._names.get(stat.metadata_id, ""): self._value(stat) for stat in plane.stats}

    def _value(self, stat: Any) -> object:
        kind = stat.WhichOneof("value")
        if kind == "ref_value":
            return self._names.get(stat.ref_value)
        return getattr(stat, kind) if kind else None


def _collect_gpu(space: Any, host: str, base: int, out: _Collected) -> int:
    """Add one host's GPU planes; returns the first device id free for the next host."""
    next_base = base
    for plane in space.planes:
        match = _GPU_PLANE.match(plane.name)
        if match is None:
            continue
        device_id = base + int(match.group(1))
        next_base = max(next_base, device_id + 1)
        stats = _Stats(plane)
        kernels_before = len(out.kernels)
        for line in plane.lines:
            if line.name.startswith(_STREAM_LINE):
                _collect_stream(plane, line, device_id, stats, out)
        if len(out.kernels) > kernels_before:
            out.devices.append(_gpu_device(device_id, host, plane.name, stats.plane_values(plane)))
    return next_base


def _gpu_device(device_id: int, host: str, plane_name: str, values: dict[str, object]) -> Device:
    major, minor = values.get("compute_cap_major"), values.get("compute_cap_minor")
    cores, memory, model = values.get("core_count"), values.get("memory_size"), values.get("gpu_device_name")
    return Device(
        id=device_id,
        name=host + (model if isinstance(model, str) and model else plane_name),
        sm_count=int(cores) if isinstance(cores, int) else None,
        compute_capability=f"{major}.{minor}" if isinstance(major, int) and isinstance(minor, int) else None,
        memory_bytes=int(memory) if isinstance(memory, int) else None,
    )


def _collect_stream(plane: Any, line: Any, device_id: int, stats: _Stats, out: _Collected) -> None:
    metadata = plane.event_metadata
    line_ps = line.timestamp_ns * 1000
    for event in line.events:
        meta = metadata[event.metadata_id]
        values = stats.of(meta.stats, event.stats)
        start_ns = (line_ps + event.offset_ps) // 1000
        dur_ns = event.duration_ps // 1000
        if _MEMORY_EVENT.match(meta.name) or "memcpy_details" in values or "memset_details" in values:
            details = values.get("memcpy_details") or values.get("memset_details")
            size = _SIZE.search(details) if isinstance(details, str) else None
            out.memory.append(
                {
                    "kind": _memory_kind(meta.name),
                    "start_ns": start_ns,
                    "dur_ns": dur_ns,
                    "bytes": int(size.group(1)) if size else None,
                    "device_id": device_id,
                    "stream_id": line.id,
                }
            )
            continue
        details = values.get("kernel_details")
        if not isinstance(details, str):
            out.other_activity += 1
            continue
        row: dict[str, object] = {
            "name": meta.name,
            "start_ns": start_ns,
            "dur_ns": dur_ns,
            "device_id": device_id,
            "stream_id": line.id,
            "correlation_id": _int_or_none(values.get("correlation_id")),
            "op": _kernel_op(values),
            "graph_node_id": values.get("graph_node_id"),
            **_framework_op(values, out.hlo_names, meta.name),
        }
        for shape, *sizes in _LAUNCH_SHAPE.findall(details):
            row.update(zip(DIM_COLUMNS[:3] if shape == "grid" else DIM_COLUMNS[3:], map(int, sizes), strict=True))
        out.kernels.append(row)


def _memory_kind(name: str) -> str:
    """TF's ``MemcpyH2D`` in the spelling the other parsers use (nvprof's ``memcpy HtoD``)."""
    direction = _COPY_DIRECTION.match(name)
    if direction:
        return f"memcpy {direction.group(1)}to{direction.group(2)}"
    if name.startswith("Memset"):
        return "memset"
    return name.lower()


def _kernel_op(values: dict[str, object]) -> str | None:
    """The HLO instruction that launched an XLA kernel, else the TF op of a TensorFlow one."""
    for key in ("hlo_op", "tf_op", "level 0"):
        value = values.get(key)
        if isinstance(value, str) and value:
            return value
    annotation = values.get("annotation")
    if isinstance(annotation, str) and annotation:
        return annotation.split("::", 1)[0].split("#", 1)[0] or None
    return None


def _framework_op(
    values: dict[str, object], hlo_names: dict[str, dict[str, str]], kernel: str = ""
) -> dict[str, object]:
    """The kind of framework op behind an event and the name path it ran under (``op_type``, ``scope``).

    An XLA instruction's come from its ``op_name`` metadata (a JAX name stack such as
    ``jit(train_step)/transpose(jvp(conv6))/conv_general_dilated``), found through the program
    the event names; a TensorFlow kernel's from its ``name/scope/Op:OpType`` annotation. A kernel
    XLA:GPU launched from a command buffer (a CUDA graph) names the buffer (``command_buffer_11``),
    not its instruction: there the kernel's own name, which XLA takes from its instruction, finds it.
    """
    hlo_op = values.get("hlo_op")
    if isinstance(hlo_op, str) and hlo_op:
        module = values.get("hlo_module")
        program = hlo_names.get(f"{module}({values.get('program_id')})") or hlo_names.get(str(module)) or {}
        op_name = program.get(hlo_op) or program.get(_kernel_key(kernel))
        return {"scope": op_name, "op_type": op_name.rsplit("/", 1)[-1]} if op_name else {}
    tf_op = _kernel_op(values)
    if tf_op is not None and ":" in tf_op:
        path, _, kind = tf_op.rpartition(":")
        return {"scope": path, "op_type": kind}
    return {}


def _hlo_names(space: Any) -> dict[str, dict[str, str]]:
    """Per compiled program (``name(program id)``, and ``name`` where one program has it), each instruction's
    ``op_name``, from the HLO modules JAX's profiler keeps in the metadata plane; empty elsewhere."""
    programs: dict[str, dict[str, str]] = {}
    by_name: dict[str, list[dict[str, str]]] = {}
    for plane in space.planes:
        if plane.name != _METADATA_PLANE:
            continue
        names = {key: meta.name for key, meta in plane.stat_metadata.items()}
        for meta in plane.event_metadata.values():
            for stat in meta.stats:
                if names.get(stat.metadata_id) != _HLO_PROTO_STAT:
                    continue
                module = hlo_class()()
                try:
                    module.ParseFromString(stat.bytes_value)
                except DecodeError:
                    continue
                ops = _op_names(module.hlo_module)
                programs[meta.name] = ops
                by_name.setdefault(meta.name.split("(", 1)[0], []).append(ops)
    return programs | {name: found[0] for name, found in by_name.items() if len(found) == 1}


def _kernel_key(name: str) -> str:
    """The key ``_op_names`` files a kernel's instruction under: the kernel's name as XLA:GPU spells its
    instruction's (``.`` and ``-`` as ``_``), less the ``__N`` of one of several kernels it launches
    (a sort's stages: ``sort_1_1__5``)."""
    return "kernel:" + _KERNEL_STAGE_SUFFIX.sub("", re.sub(r"[.-]", "_", name))


def _op_names(module: Any) -> dict[str, str]:
    """Each instruction's ``op_name``; one XLA added itself (a layout copy, the reversed kernel of a convolution's
    backward pass, the sort that makes a scatter deterministic) has none and takes that of the nearest
    instruction its result feeds, whose work it is. Each is also filed under the kernel names XLA:GPU gives
    its kernels (``_kernel_key``): its own, and for a fusion its fused computation's root's (``sort.4``)."""
    named: dict[str, str] = {}
    users: dict[int, list[Any]] = {}
    unnamed = []
    instructions = [i for computation in module.computations for i in computation.instructions]
    for computation in module.computations:
        for instruction in computation.instructions:
            for operand in instruction.operand_ids:
                users.setdefault(operand, []).append(instruction)
            if instruction.metadata.op_name:
                named[instruction.name] = instruction.metadata.op_name
            else:
                unnamed.append(instruction)
    for instruction in unnamed:
        seen, frontier = {instruction.id}, list(users.get(instruction.id, ()))
        while frontier:
            user = frontier.pop(0)
            if user.metadata.op_name:
                named[instruction.name] = user.metadata.op_name
                break
            if user.id not in seen:
                seen.add(user.id)
                frontier.extend(users.get(user.id, ()))
    return named | _kernel_names(module, instructions, named)


def _kernel_names(module: Any, instructions: list[Any], named: dict[str, str]) -> dict[str, str]:
    by_id = {instruction.id: instruction for instruction in instructions}
    roots = {computation.id: by_id.get(computation.root_id) for computation in module.computations}
    keys: dict[str, str] = {}
    for instruction in instructions:
        op_name = named.get(instruction.name)
        if op_name is None:
            continue
        keys.setdefault(_kernel_key(instruction.name), op_name)
        if instruction.opcode == "fusion" and instruction.called_computation_ids:
            root = roots.get(instruction.called_computation_ids[0])
            if root is not None:
                keys.setdefault(_kernel_key(root.name), op_name)
    return keys


def _int_or_none(value: object) -> int | None:
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _host_op(name: str, hlo_op: object, tf_op_thread: bool) -> tuple[str, str] | None:
    """(kernel name, op) of a host event that is op work, or None for bookkeeping.

    An XLA:CPU thunk is recognised by its ``hlo_op`` stat, on any thread; a TF op by its
    ``op_name:OpType`` name, on the executor threads only (tf.data threads run the input
    pipeline, not the step). The ops that launch an XLA cluster enclose its thunks' time
    and are left out.
    """
    if isinstance(hlo_op, str) and hlo_op:
        return _XLA_INSTANCE_SUFFIX.sub("", hlo_op), hlo_op
    if not tf_op_thread:
        return None
    match = _TF_OP.match(name)
    if match is None or match.group("type") in _XLA_LAUNCH_OPS:
        return None
    return match.group("type"), match.group("op")


def _collect_cpu_ops(space: Any, host: str, device_id: int, out: _Collected) -> None:
    for plane in space.planes:
        if plane.name != _HOST_PLANE:
            continue
        stats = _Stats(plane)
        found = False
        for line in plane.lines:
            rows = _line_ops(plane, line, stats, device_id, out.hlo_names)
            found = found or bool(rows)
            out.kernels.extend(rows)
        if found:
            out.devices.append(Device(id=device_id, name=host + plane.name))


def _line_ops(
    plane: Any, line: Any, stats: _Stats, device_id: int, hlo_names: dict[str, dict[str, str]]
) -> list[dict[str, object]]:
    """One thread's op rows, each timed by its self time (its duration less the ops nested in it, ``nesting``)."""
    metadata = plane.event_metadata
    tf_op_thread = _OP_THREAD.match(line.name) is not None
    line_ps = line.timestamp_ns * 1000
    rows: list[dict[str, object]] = []
    spans_ps: list[tuple[int, int]] = []
    for event in sorted(line.events, key=lambda e: (e.offset_ps, -e.duration_ps)):  # rows in start order
        values = stats.of(event.stats)
        op = _host_op(metadata[event.metadata_id].name, values.get("hlo_op"), tf_op_thread)
        if op is None:
            continue
        spans_ps.append((event.offset_ps, event.offset_ps + event.duration_ps))
        rows.append(
            {
                "name": op[0],
                "start_ns": (line_ps + event.offset_ps) // 1000,
                "device_id": device_id,
                "stream_id": line.id,
                "op": op[1],
                **(_framework_op(values, hlo_names) if "hlo_op" in values else {"scope": op[1], "op_type": op[0]}),
            }
        )
    if not rows:
        return rows
    start_ps, end_ps = np.array(spans_ps, dtype=np.int64).T
    self_ps, _outermost = self_times(np.zeros(len(rows), dtype=np.int64), start_ps, end_ps)
    for row, duration_ps in zip(rows, self_ps.tolist(), strict=True):
        row["dur_ns"] = duration_ps // 1000
    return rows


def _collect_steps(space: Any, out: _Collected) -> None:
    """detprof's per-step markers (TraceMe events named ``step N`` on the host), as NVTX-like ranges.

    A detprof worker traced by TensorFlow's profiler wraps each measured step in one, so that
    kernel (or op) time splits into steps as it does under nsys with NVTX ranges.
    """
    for plane in space.planes:
        if plane.name != _HOST_PLANE:
            continue
        metadata = plane.event_metadata
        for line in plane.lines:
            line_ps = line.timestamp_ns * 1000
            for event in line.events:
                name = metadata[event.metadata_id].name
                if _STEP_MARKER.match(name):
                    start = (line_ps + event.offset_ps) // 1000
                    out.steps.append({"text": name, "start_ns": start, "end_ns": start + event.duration_ps // 1000})


def _table(path: Path, collected: _Collected, trace_format: TraceFormat, *, ops_are_kernels: bool) -> KernelTable:
    kernels = pd.DataFrame(collected.kernels)
    names = kernels["name"].astype("category")
    if ops_are_kernels:
        kernels["short_name"] = names
    else:
        short = {name: short_kernel_name(name) for name in names.cat.categories}
        kernels["short_name"] = names.map(short).astype("category")
    kernels["name"] = names
    kernels = kernels.sort_values(["start_ns", "device_id"], kind="stable", ignore_index=True)
    memory = None
    if collected.memory:
        memory = pd.DataFrame(collected.memory).sort_values("start_ns", kind="stable", ignore_index=True)
        memory = conform(memory, MEMORY_DTYPES)
    elif not ops_are_kernels:
        memory = conform(pd.DataFrame(columns=list(MEMORY_DTYPES)), MEMORY_DTYPES)
    steps = None
    if collected.steps:
        steps = range_table(collected.steps)
    return KernelTable(
        source=str(path),
        format=trace_format,
        kernels=conform(kernels, KERNEL_DTYPES),
        memory=memory,
        devices=sorted(collected.devices, key=lambda d: d.id),
        nvtx=steps,
        cpu_ops=ops_are_kernels,
    )
