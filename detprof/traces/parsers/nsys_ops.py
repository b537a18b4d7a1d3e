"""Which op and which layer launched each kernel of an nsys export: the NVTX ranges around its launching call.

nsys records no framework op for a kernel, only the runtime call that launched it (the one
sharing its correlation id) and the NVTX ranges each thread pushed. What pushes ranges:
- a detprof worker, one range per Keras layer call (``layer:NAME``, ``attribution.LAYER_RANGE``)
  in a framework that runs layers eagerly (PyTorch), and PyTorch's ``emit_nvtx`` one per op
  (``aten::conv2d, seq = 12, op_id = 40``; a backward node's range carries its forward op's
  sequence number);
- TensorFlow and XLA their profiler annotations, which they push as NVTX ranges whenever a tool
  such as nsys is attached: a TensorFlow op's ``model/conv1/Conv2D:Conv2D`` (NVIDIA's builds with
  ``TF_ENABLE_NVTX_RANGES`` write ``Conv2D: model/conv1/Conv2D``), an XLA kernel's
  ``Thunk:#name=transpose(jvp(conv1))/conv_general_dilated,hlo_op=fusion.3#`` (the ``op_name``
  of JAX's name stack, less the prefix its program's range names); that program range
  (``XlaModule:...``) names no op.
A kernel's op is the innermost op range around its call, what the model called the outermost
one (as in the Kineto parser), its layer path the layer ranges around the call, or, for the
ops of a backward node, those around the forward op of the same sequence number. Its
``scope`` is always a name path ending in the op (``UNATTRIBUTED`` for a kernel launched in a
layer but in no op), so ``attribution.layer_path`` reads it as it reads TensorFlow's. Without
such ranges (a plain CUDA program) nothing is read.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass

import numpy as np
import pandas as pd

from detprof.backends.base import STEP_RANGE
from detprof.traces.attribution import LAYER_RANGE, UNATTRIBUTED, op_kind
from detprof.traces.parsers.nesting import containers
from detprof.traces.parsers.nsys_schema import API_TABLE, KERNEL_TABLE, columns, nvtx_range_rows

_PROCESS = 1 << 24
"""nsys's serialized global ids keep the thread in their low 24 bits: a thread's id over this is its process's."""
_MODULE_RANGE = "XlaModule:"
_SEQUENCE = re.compile(r", seq = (\d+)")
_STASHED_SEQUENCE = re.compile(r"stashed seq = (\d+)")
_TRACEME = re.compile(r"^(?P<name>[^#]*)#(?P<stats>.*)#$")
_STAT = re.compile(r"(?:^|,)(\w+)=(.*?)(?=,\w+=|$)")
"""A profiler annotation's ``key=value`` pairs; a value (a name path) may hold commas, never ``,key=``."""
_TYPE_FIRST = re.compile(r"^(?P<type>[A-Za-z_]\w*): (?P<path>\S+)$")
_TYPE_LAST = re.compile(r"^(?P<path>[^\s:]+):(?P<type>[A-Za-z_]\w*)$")


@dataclass(frozen=True)
class RangeOp:
    """What one NVTX range says: a layer, or an op with its kind, name path and autograd sequence numbers."""

    layer: str | None = None
    op: str | None = None
    kind: str | None = None
    path: str | None = None
    sequence: int | None = None
    forward_sequence: int | None = None
    """The forward op's sequence number a backward node's range names (``stashed seq``), else its own."""


def read_range(text: str) -> RangeOp | None:
    """The op or layer a range's text names; None for a range that names neither (steps, XLA's module)."""
    if text.startswith(LAYER_RANGE):
        return RangeOp(layer=text.removeprefix(LAYER_RANGE))
    if re.match(STEP_RANGE, text) or text.startswith(_MODULE_RANGE) or not text:
        return None
    for pattern in (_TYPE_FIRST, _TYPE_LAST):
        if (found := pattern.match(text)) is not None:
            return RangeOp(op=found.group("type"), kind=found.group("type"), path=found.group("path"))
    if (traceme := _TRACEME.match(text)) is not None:
        stats = dict(_STAT.findall(traceme.group("stats")))
        path = stats.get("name") or stats.get("tf_op")
        if path and not _TYPE_LAST.match(path):
            return RangeOp(op=path, kind=path.rsplit("/", 1)[-1], path=path)
        return read_range(path or stats.get("hlo_op") or traceme.group("name"))
    name = text.split(", ", 1)[0]
    sequence = _SEQUENCE.search(text)
    stashed = _STASHED_SEQUENCE.search(text)
    own = int(sequence.group(1)) if sequence else None
    forward = int(stashed.group(1)) if stashed else own
    return RangeOp(op=name, kind=name, sequence=own, forward_sequence=forward)


@dataclass(frozen=True)
class NvtxRanges:
    """The op and layer ranges of an export, each with the innermost range around it on its thread."""

    said: list[RangeOp]
    thread: np.ndarray
    start: np.ndarray
    end: np.ndarray

    @classmethod
    def read(cls, conn: sqlite3.Connection, tables: frozenset[str]) -> NvtxRanges | None:
        """The ranges that name an op or a layer; None where there are none (no work for the launches' read)."""
        rows = nvtx_range_rows(conn, tables, "globalTid") if API_TABLE in tables else None
        if not rows:
            return None
        kept = [(said, start, end, tid) for text, start, end, tid in rows if (said := read_range(str(text or "")))]
        if not kept:
            return None
        said, start, end, thread = zip(*kept, strict=True)
        return cls(list(said), np.array(thread, dtype=np.int64), np.array(start, np.int64), np.array(end, np.int64))

    def launching_ops(self, conn: sqlite3.Connection) -> dict[str, pd.Categorical]:
        """Per kernel, in the kernel table's row order: ``op``, ``op_type`` and ``scope`` (null where no range holds
        its launching call)."""
        calls = _launching_calls(conn)
        found = calls["thread"].notna().to_numpy()
        call_thread = calls["thread"].to_numpy(dtype=np.int64, na_value=-1)[found]
        call_start = calls["start"].to_numpy(dtype=np.int64, na_value=0)[found]
        parent, holder = containers(self.thread, self.start, self.end, call_thread, call_start)
        chains = self._chains(parent)
        forward: dict[int, str] = {}
        for said, chain in zip(self.said, chains, strict=True):
            if said.sequence is not None and chain.layers and said.layer is None:
                forward.setdefault(said.sequence, chain.layers)
        rows: list[tuple[str | None, str | None, str | None]] = [(None, None, None)] * len(calls)
        for row, held in zip(np.flatnonzero(found).tolist(), holder.tolist(), strict=True):
            if held >= 0:
                rows[row] = chains[held].columns(forward)
        op, op_type, scope = zip(*rows, strict=True) if rows else ((), (), ())
        return {"op": pd.Categorical(op), "op_type": pd.Categorical(op_type), "scope": pd.Categorical(scope)}

    def _chains(self, parent: np.ndarray) -> list[_Chain]:
        """Each range's innermost and outermost op and its layer path, parents first (they start earlier)."""
        chains: dict[int, _Chain] = {}
        for index in np.lexsort((-self.end, self.start, self.thread)).tolist():
            chains[index] = _Chain.below(chains.get(int(parent[index])), self.said[index])
        return [chains[index] for index in range(len(self.said))]


@dataclass(frozen=True)
class _Chain:
    """The ranges open at one moment, as far as attribution goes."""

    innermost: RangeOp | None
    outermost: RangeOp | None
    layers: str | None

    @classmethod
    def below(cls, up: _Chain | None, said: RangeOp) -> _Chain:
        up = up or _Chain(None, None, None)
        if said.layer is not None:
            return _Chain(up.innermost, up.outermost, f"{up.layers}/{said.layer}" if up.layers else said.layer)
        return _Chain(said, up.outermost or said, up.layers)

    def columns(self, forward: dict[int, str]) -> tuple[str | None, str | None, str | None]:
        top = self.outermost
        if top is None:
            return None, None, None if self.layers is None else f"{self.layers}/{UNATTRIBUTED}"
        kind = op_kind(top.kind)
        layers = self.layers or (forward.get(top.forward_sequence) if top.forward_sequence is not None else None)
        scope = f"{layers}/{kind}" if layers else top.path
        return self.innermost.op if self.innermost else None, kind, scope


def _launching_calls(conn: sqlite3.Connection) -> pd.DataFrame:
    """Per kernel, in row order, the thread and start of the runtime call that launched it: the call of its
    correlation id in its process (correlation ids are counted per process), null where the export has none."""
    process = f"globalPid / {_PROCESS}" if "globalPid" in columns(conn, KERNEL_TABLE) else "NULL"
    kernels = pd.DataFrame(
        conn.execute(f"SELECT correlationId, {process} FROM {KERNEL_TABLE} ORDER BY rowid").fetchall(),
        columns=["correlation", "process"],
        dtype="Int64",
    )
    calls = pd.DataFrame(
        conn.execute(
            f"SELECT correlationId, globalTid / {_PROCESS}, globalTid, start FROM {API_TABLE} "
            "WHERE correlationId IS NOT NULL AND globalTid IS NOT NULL"
        ).fetchall(),
        columns=["correlation", "process", "thread", "start"],
        dtype="Int64",
    )
    if kernels["process"].isna().all():
        calls = calls.drop(columns="process").drop_duplicates("correlation")
        kernels = kernels.drop(columns="process")
    else:
        calls = calls.drop_duplicates(["correlation", "process"])
    return kernels.merge(calls, how="left", on=list(kernels.columns), sort=False)[["thread", "start"]]
