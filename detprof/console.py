"""The consoles commands print on, tables on stdout and what they say while running on stderr: a terminal's width,
or no width at all.

On a terminal rich lays a table out for the terminal's width. Written to a pipe or a file
(a CI log, ``> diff.txt``, ``| grep``) there is no width to fit: rich would fall back to 80
columns and fold every long kernel name and header over several lines, where grep cannot
find them. There each row stays one line and each name whole, as ``nsys stats`` prints its
tables; and a line such as ``results: <path>`` is not broken before its path. A width the user
sets in ``COLUMNS`` is theirs, and rich honours it. rich loads only when a console is made, so
that JSON and CSV output start without it.
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
    """stdout's console: a terminal's (or ``COLUMNS``') width, else ``UNBOUNDED``."""
    return _console(stderr=False)


def status_console() -> Console:
    """stderr's console, by the same rule: what a command says while it runs (each run's outcome, a failure's
    reason, where the results and the report are) reads whole in ``make``'s output or a CI log too."""
    return _console(stderr=True)


def _console(*, stderr: bool) -> Console:
    """It asks the stream itself whether it is a terminal, not rich, which also says so when ``FORCE_COLOR`` asks
    for colours in a CI log whose width is still unknown."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty() or os.environ.get("COLUMNS", "").isdigit():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=UNBOUNDED)


def unbounded(console: Console) -> bool:
    """Whether ``console`` has no width to fit: nothing it prints is folded, shortened or cut."""
    return console.width >= UNBOUNDED


def print_table(console: Console, table: Table) -> None:
    """Print ``table``; off a terminal at least as wide as its title and caption, which rich wraps at its width."""
    if unbounded(console):
        annotations = [console.measure(text).maximum for text in (table.title, table.caption) if text]
        table.min_width = max([table.min_width or 0, *annotations])
    console.print(table)
