"""Integer columns of a large SQLite table, read as numpy arrays by parallel readers, started early.

Kernel launches are the bulk of an nsys export (millions in a long run), and reading them is
most of what ``detprof parse`` does with such a file. They are read with the ADBC SQLite
driver as Arrow batches, by parallel threads over rowid ranges (the driver releases the GIL
while it steps through SQLite), streamed into preallocated numpy arrays; no Python object is
made per row.

This module imports neither pandas nor anything that does, and a read runs in the
background from the moment it is started (``start_reading``): the parser starts it, then
imports pandas while SQLite works. Importing pandas is Python code that holds the GIL, the
read is C that does not, so on two cores the two overlap instead of adding up.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from detprof.errors import InputError, first_line

PARALLEL_MIN_ROWS = 200_000
"""Row count below which one reader thread is as fast as several."""
MAX_READERS = 8
_ADBC_BATCH_ROWS = "65536"


def reader_cpus() -> int:
    """Cores this process may read on (its affinity mask, not the host's total)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass
class IntColumn:
    """One integer column: its values (0 where null) and where it is null."""

    values: np.ndarray
    null: np.ndarray


@dataclass(frozen=True)
class RowRanges:
    """Rowid ranges ``[start, stop)`` of a table, one per reader, and where each one's rows go."""

    bounds: list[tuple[int, int]]
    offsets: list[int]

    @property
    def count(self) -> int:
        return self.offsets[-1]


def row_ranges(conn: sqlite3.Connection, table: str) -> RowRanges:
    """Split a table into one rowid range per reader, counting each range's rows.

    nsys writes rowids without gaps; then the ranges' widths are their counts and one
    ``count(*)``, which SQLite answers from the b-tree without reading rows, confirms it.
    min and max are asked apart: SQLite looks either one up in the b-tree only when it is
    the query's one aggregate, and scans the whole table for both at once.
    """
    lo, hi = conn.execute(f"SELECT (SELECT min(rowid) FROM {table}), (SELECT max(rowid) FROM {table})").fetchone()
    if lo is None:
        return RowRanges([], [0])
    readers = max(1, min(reader_cpus(), MAX_READERS, (hi - lo + 1) // PARALLEL_MIN_ROWS))
    edges = np.linspace(lo, hi + 1, readers + 1).astype(np.int64)
    bounds = [(int(a), int(b)) for a, b in itertools.pairwise(edges)]
    (total,) = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    if total == hi - lo + 1:
        counts = [b - a for a, b in bounds]
    else:
        query = f"SELECT count(*) FROM {table} WHERE rowid >= ? AND rowid < ?"
        counts = [conn.execute(query, b).fetchone()[0] for b in bounds]
    return RowRanges(bounds, [0, *itertools.accumulate(counts)])


class ColumnRead:
    """Integer expressions over the rows of a table, being read in the background.

    Each reader streams its range batch by batch into its slice of preallocated arrays,
    so peak memory is the result plus a few batches, however many rows there are. A range
    that no longer holds the rows counted for it means the file changed since, and then
    rows read at different times would not line up.
    """

    def __init__(self, uri: str, table: str, select: dict[str, str], rows: RowRanges, shown: str) -> None:
        # The driver's own API, not its DB-API module: that one imports pyarrow.dataset, tens of
        # milliseconds of every `detprof parse`.
        import adbc_driver_manager
        import adbc_driver_sqlite

        self._errors = (adbc_driver_manager.Error, OSError, pa.ArrowException)
        self._table, self._shown = table, shown
        bounds, offsets = rows.bounds, rows.offsets
        self._columns = {name: IntColumn(np.zeros(rows.count, np.int64), np.zeros(rows.count, bool)) for name in select}
        exprs = ", ".join(f"{expr} AS {name}" for name, expr in select.items())
        query = f"SELECT {exprs} FROM {table} WHERE rowid >= {{}} AND rowid < {{}}"

        def read(part: int) -> None:
            at, stop = offsets[part], offsets[part + 1]
            with (
                adbc_driver_sqlite.connect(uri) as database,
                adbc_driver_manager.AdbcConnection(database) as connection,
                adbc_driver_manager.AdbcStatement(connection) as statement,
            ):
                statement.set_options(**{"adbc.sqlite.query.batch_rows": _ADBC_BATCH_ROWS})
                statement.set_sql_query(query.format(*bounds[part]))
                stream, _rows = statement.execute_query()
                for batch in pa.RecordBatchReader.from_stream(stream):
                    n = batch.num_rows
                    if at + n > stop:
                        break
                    for name, column in zip(batch.schema.names, batch.columns, strict=True):
                        _store(self._columns[name], slice(at, at + n), column, f"{shown}: {table}.{select[name]}")
                    at += n
            if at != stop:
                raise InputError(f"{shown}: {table} changed while it was being read")

        pool = ThreadPoolExecutor(max(1, len(bounds)))
        self._parts: list[Future[None]] = [pool.submit(read, part) for part in range(len(bounds))]
        pool.shutdown(wait=False)

    def result(self) -> dict[str, IntColumn]:
        """The columns, once every reader has finished; the first reader's error as one line."""
        try:
            for part in self._parts:
                part.result()
        except self._errors as exc:
            raise InputError(f"{self._shown}: cannot read {self._table} ({first_line(exc)})") from None
        return self._columns


def start_reading(uri: str, table: str, select: dict[str, str], rows: RowRanges, shown: str) -> ColumnRead:
    """Start reading ``select`` (``{name: integer SQL expression}``) over ``rows`` of ``table``."""
    return ColumnRead(uri, table, select, rows, shown)


def read_int_columns(uri: str, table: str, select: dict[str, str], rows: RowRanges, shown: str) -> dict[str, IntColumn]:
    """``start_reading`` and wait for it."""
    return start_reading(uri, table, select, rows, shown).result()


def _store(target: IntColumn, rows: slice, column: pa.Array, where: str) -> None:
    if pa.types.is_null(column.type):
        target.null[rows] = True
        return
    if not pa.types.is_integer(column.type):
        raise InputError(f"{where} holds {column.type} values where integers belong")
    if column.null_count:
        import pyarrow.compute as pc

        target.null[rows] = column.is_null().to_numpy(zero_copy_only=False)
        column = pc.fill_null(column, 0)
    target.values[rows] = column.to_numpy(zero_copy_only=False)
