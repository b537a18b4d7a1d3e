"""The ``--format`` choice of commands that print tables (tiny: the CLI imports it at start-up)."""

from __future__ import annotations

from enum import StrEnum


class OutputFormat(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"
