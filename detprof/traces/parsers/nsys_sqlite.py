"""nsys SQLite exports (``nsys export --type sqlite``) -> KernelTable.

Kernel launches are the bulk of a file (millions in a long run) and must load within a
time and memory budget (1M launches to a top-N table: <= 0.5 s in-process and <= 1.0 s for
the whole ``detprof parse``, < 500 MB; ``benchmarks/bench_nsys_parse.py`` checks it). This
module is the half of the parser that imports no pandas: it checks the file, finds the
launch columns and starts reading them in the background (``sqlite_columns``); only then is
the other half imported (``nsys_sqlite_tables``, which builds the KernelTable with pandas),
so that pandas' import and SQLite's reading overlap. The integer name ids become pandas
Categoricals whose categories are only the strings used: no Python object is created per
launch. Only the columns a top-N table and the device list need are read at once; the rest
are read on first use of ``KernelTable.kernels``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from detprof.errors import InputError
from detprof.traces.parsers.nsys_schema import (
    EAGER_KERNEL_COLUMNS,
    KERNEL_INT_COLUMNS,
    KERNEL_TABLE,
    STRINGS_TABLE,
    LaunchRead,
    columns,
)
from detprof.traces.parsers.sqlite_columns import row_ranges, start_reading

if TYPE_CHECKING:
    from detprof.traces.kernel_table import KernelTable


def load_nsys_sqlite(path: Path, source: str | None = None) -> KernelTable:
    """Read an export; ``source`` names the file the user gave when it was converted first.

    A converted export lives in a temporary folder that is gone once this returns, so all
    its columns are read now; the user's own file stays, and the columns that only
    ``KernelTable.kernels`` needs are read on its first use.
    """
    shown = source or str(path)
    _check_not_truncated(path, shown)
    uri = "file:" + quote(str(path.resolve())) + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as exc:
        raise InputError(f"{shown}: cannot open SQLite file ({exc})") from None
    try:
        launches = _start_launch_read(conn, uri, shown, defer=source is None)
        # pandas is imported here, while the readers work through the launches.
        from detprof.traces.parsers.nsys_sqlite_tables import kernel_table

        return kernel_table(conn, launches, shown)
    except sqlite3.DatabaseError as exc:
        raise InputError(f"{shown}: corrupt or unreadable SQLite file ({exc})") from None
    finally:
        conn.close()


def _check_not_truncated(path: Path, shown: str) -> None:
    """Catch a cut-off copy up front: SQLite itself may only notice on the missing pages.

    The header records the page size and, when its version-valid-for counter matches
    the change counter, the database size in pages; a shorter file lost its tail.
    """
    with path.open("rb") as fh:
        header = fh.read(100)
    if len(header) < 100:
        raise InputError(f"{shown}: truncated SQLite file ({len(header)} bytes, shorter than its header)")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    if header[24:28] == header[92:96] and pages:
        expected = page_size * pages
        actual = path.stat().st_size
        if actual < expected:
            raise InputError(f"{shown}: truncated SQLite file ({actual} bytes, its header says {expected})")


def _start_launch_read(conn: sqlite3.Connection, uri: str, shown: str, *, defer: bool) -> LaunchRead:
    """Check that the file has kernels with names and times, then start reading them."""
    tables = frozenset(row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
    if KERNEL_TABLE not in tables:
        raise InputError(
            f"{shown}: no CUDA kernels in this nsys export (no {KERNEL_TABLE} table; "
            "was the profile taken with `-t cuda`?)"
        )
    if STRINGS_TABLE not in tables:
        raise InputError(f"{shown}: nsys export without a {STRINGS_TABLE} table; kernel names are unreadable")
    cols = columns(conn, KERNEL_TABLE)
    if not {"start", "end"} <= cols:
        raise InputError(f"{shown}: {KERNEL_TABLE} lacks start/end columns")
    name_col = "demangledName" if "demangledName" in cols else "shortName"
    if name_col not in cols:
        raise InputError(f"{shown}: {KERNEL_TABLE} has neither demangledName nor shortName")
    select = {"start_ns": "start", "dur_ns": '"end" - start', "name": name_col}
    if "shortName" in cols:
        select["short_name"] = "shortName"
    select.update({dst: src for dst, src in KERNEL_INT_COLUMNS.items() if src in cols})
    rows = row_ranges(conn, KERNEL_TABLE)
    now = {dst: src for dst, src in select.items() if dst in EAGER_KERNEL_COLUMNS or not defer}
    eager = start_reading(uri, KERNEL_TABLE, now, rows, shown)
    return LaunchRead(uri, tables, select, rows, eager, defer)
