"""Results home from a node: a unit's records and the files they name, written by the driver alone.

A node measures a unit into a scratch store of its own, with the one measured-study flow,
and sends back its records with the files they name (logs, kernel tables, arrays), each
as bytes under its path relative to the study folder, so that the driver's store holds
them where the records say. A trace comes too unless it is larger than ``--max-trace-mb``:
then it stays on the node, and the record keeps its path there (``trace_on_node``). The
driver writes the files first and each record last, atomically: a record in the store
always has its files beside it, and a unit lost on the way is measured again whole.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from detprof.errors import InputError
from detprof.fleet.cluster import ray_module
from detprof.store import ResultsStore, StudyKind, atomic_write_bytes

MB = 1_000_000
TRACE_FIELD = "trace_file"
SCRATCH = "detprof-fleet"
"""The folder, in a node's temporary directory, where its units measure and its traces over the cap stay."""


@dataclass(frozen=True)
class Bundle:
    """What one unit brings home: its records, and the files they name by their paths in the study folder."""

    records: list[dict[str, Any]]
    files: dict[str, bytes] = field(default_factory=dict)


def scratch_store(token: str, unit: str, kind: StudyKind) -> ResultsStore:
    """On the node: an empty store for one unit, in ``<tmp>/detprof-fleet/<driver's token>/<node id>/<unit>``.

    Per node, since the nodes of a test cluster share one machine; emptied first, since a
    unit lost on a node whose Ray worker crashed may run there again.
    """
    node_id = ray_module().get_runtime_context().get_node_id()
    root = Path(tempfile.gettempdir()) / SCRATCH / token / node_id / unit
    shutil.rmtree(root, ignore_errors=True)
    store = ResultsStore(root, kind)
    store.dir.mkdir(parents=True)
    return store


def _files_under(path: Path) -> list[Path]:
    """A file, or every file under a folder (TensorFlow's profiler writes a folder per trace)."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else []


def collect(
    store: ResultsStore, records: Iterable[Mapping[str, Any]], file_fields: Sequence[str], max_trace_bytes: int
) -> Bundle:
    """On the node: ``records`` with the files their ``file_fields`` name, and their traces up to the cap.

    Then the node's copy is removed but for the traces it keeps: ``store.root`` is the unit's own
    scratch folder (``scratch_store``), removed whole when no trace stays.
    """
    bundle = Bundle([])
    for given in records:
        record = dict(given)
        for name in file_fields:
            for path in _files_under(store.dir / record[name]) if record.get(name) else []:
                bundle.files[path.relative_to(store.dir).as_posix()] = path.read_bytes()
        trace = store.dir / record[TRACE_FIELD] if record.get(TRACE_FIELD) else None
        if trace is not None:
            found = _files_under(trace)
            if sum(p.stat().st_size for p in found) <= max_trace_bytes:
                bundle.files.update({p.relative_to(store.dir).as_posix(): p.read_bytes() for p in found})
                _remove(trace)
            else:
                record |= {TRACE_FIELD: None, "trace_on_node": str(trace)}
        bundle.records.append(record)
    for entry in store.dir.iterdir():
        if entry.name != "traces":
            _remove(entry)
    kept = store.dir / "traces"
    if not (kept.is_dir() and any(kept.iterdir())):
        _remove(store.root)
        for emptied in (store.root.parent, store.root.parent.parent):
            with contextlib.suppress(OSError):
                emptied.rmdir()
    return bundle


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def safe_path(store: ResultsStore, relative: str) -> Path:
    """``relative`` inside the study folder; a path that would leave it is refused (a node sent it)."""
    path = PurePosixPath(relative)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise InputError(f"a node sent a file outside its study folder: {relative!r}")
    return store.dir / path


def write_files(bundle: Bundle, store: ResultsStore) -> None:
    """On the driver: the unit's files into ``store``, each atomically, before any of its records."""
    for relative, data in bundle.files.items():
        atomic_write_bytes(safe_path(store, relative), data)


def deliver(bundle: Bundle, store: ResultsStore, node_fields: Mapping[str, Any]) -> list[dict[str, Any]]:
    """On the driver: the files, then each record (with the node that measured it), atomically, into ``store``."""
    write_files(bundle, store)
    records = [record | dict(node_fields) for record in bundle.records]
    for record in records:
        store.write_record(record)
    return records
