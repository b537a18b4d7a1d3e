"""The console of detprof's tables: a terminal's width, the user's COLUMNS, or no width at all off a terminal."""

from __future__ import annotations

import pytest
from rich.table import Table

from detprof.console import UNBOUNDED, print_table, status_console, table_console, unbounded

TITLE = "A title far wider than the two narrow columns of the table below it"


def test_off_a_terminal_the_width_is_unbounded_unless_columns_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setenv("FORCE_COLOR", "1")  # colours asked for in a CI log tell nothing of its width
    assert table_console().width == UNBOUNDED and unbounded(table_console())
    monkeypatch.setenv("COLUMNS", "100")
    assert table_console().width == 100 and not unbounded(table_console())
    monkeypatch.delenv("COLUMNS")
    assert status_console().stderr and unbounded(status_console())


def test_title_and_caption_off_a_terminal_stay_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """rich wraps a title at its table's width; off a terminal the table widens to the title instead."""
    monkeypatch.delenv("COLUMNS", raising=False)
    table = Table(title=TITLE, caption=f"({TITLE.lower()}, and longer still)")
    for column in ("a", "b"):
        table.add_column(column)
    table.add_row("1", "2")
    print_table(table_console(), table)
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    assert lines[0] == TITLE and lines[-1] == f"({TITLE.lower()}, and longer still)"
    assert len(lines) == 7  # title, three rules, header, the row, caption
