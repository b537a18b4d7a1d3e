"""The ``--format`` choice shared by commands that print tables (kept tiny: the CLI imports it at start-up)."""

from __future__ import annotations

from enum import Enum


class OutputFormat(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"
