"""The console that commands print their tables on: a terminal's width, or no width at all.

On a terminal rich lays a table out for the terminal's width. Written to a pipe or a file
(a CI log, ``> diff.txt``, ``| grep``) there is no width to fit: rich would fall back to 80
columns and fold every long kernel name and header over several lines, where grep cannot
find them. There each row stays one line and each name whole, as ``nsys stats`` prints its
tables. A width the user sets in ``COLUMNS`` is theirs, and rich honours it. rich loads
only when a table is printed, so that JSON and CSV output start without it.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

UNBOUNDED = 1_000_000
"""The width of a console off a terminal: wider than any row, so columns keep their natural widths."""


def table_console() -> Console:
    """stdout's console: a terminal's (or ``COLUMNS``') width, else ``UNBOUNDED``.

    It asks stdout itself whether it is a terminal, not rich, which also says so when
    ``FORCE_COLOR`` asks for colours in a CI log whose width is still unknown.
    """
    from rich.console import Console

    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit():
        return Console()
    return Console(width=UNBOUNDED)


def unbounded(console: Console) -> bool:
    """Whether ``console`` has no width to fit: nothing it prints is folded, shortened or cut."""
    return console.width >= UNBOUNDED


def print_table(console: Console, table: Table) -> None:
    """Print ``table``; off a terminal at least as wide as its title and caption, which rich wraps at its width."""
    if unbounded(console):
        annotations = [console.measure(text).maximum for text in (table.title, table.caption) if text]
        table.min_width = max([table.min_width or 0, *annotations])
    console.print(table)
