"""Every kind of study detprof runs, registered once: what the CLI, the store, the report and ``check`` iterate.

A kind is one folder name in a results directory (and its manifest's ``kind``), a command that runs it, and a
declaration on the read side (``StudyKind``): the fields its run records must hold, its loader, its own report
section if it has one, and whether ``detprof check`` compares it. The registry holds each kind as strings
(``KindEntry``), so that ``detprof --help`` and the store import none of them, and the read side never imports a
runner: a kind's module is imported when a results folder of that kind is read, its command's module when that
command runs. A new kind is its module plus one ``register`` line, as pytest takes a plugin.

The order of ``KINDS`` is the order in which every listing shows the kinds (the provenance table, the report's
own sections, ``--help``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from detprof.errors import UsageError

Where = Callable[[str, str], str]
"""(device label, backend) -> how the report names that device (``report_data.Report.where``)."""


class Command(NamedTuple):
    """A CLI command as ``detprof --help`` lists it without importing it."""

    module: str
    function: str
    summary: str
    """The help's first paragraph, which ``detprof --help`` lists: here, so that listing imports no command."""
    details: str | None = None
    """The module's constant that holds the rest of the help, where there is more."""

    def help(self, module: Any) -> str:
        return self.summary if self.details is None else f"{self.summary}\n\n{getattr(module, self.details)}"


@dataclass(frozen=True)
class KindEntry:
    """One registry line: the kind's name, where its declaration lives, and the command that runs it (if any)."""

    name: str
    reader: str
    """``module:attribute`` of its ``StudyKind``, on the read side."""
    command: tuple[str, Command] | None = None
    """(command name, command): a kind run by an option of another command (``sweep --calibrate``) has none."""
    remeasure: str | None = None
    """``module:function`` that measures again what a baseline of this kind measured (``check --run``), on the
    runner's side: ``(baseline, options, models, out, console) -> results folder``."""


@dataclass(frozen=True)
class Section:
    """A kind's own part of the report, as plain words: every format (HTML, Markdown, JSON) shows the same cells."""

    id: str
    title: str
    nav: str
    """The navigation bar's short name."""
    lead: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def as_json(self) -> dict[str, Any]:
        rows = [dict(zip(self.headers, row, strict=True)) for row in self.rows]
        return {"title": self.title, "lead": self.lead, "rows": rows}


@dataclass(frozen=True)
class StudyKind:
    """What the read side knows of a kind.

    ``load`` returns the study (a ``provenance.StudyOrigin``), None while its folder holds no runs yet, or the one
    line saying why it cannot be shown yet. ``section`` turns the studies of the kind a report holds into its own
    section; the six kinds detprof was built with leave it None, their sections being the report's own.
    ``compared_by_check``: its runs are ``records.MeasuredRun`` pairs (default and deterministic, by model and
    repeat) that ``detprof baseline`` freezes and ``detprof check`` compares.
    """

    name: str
    record_fields: tuple[tuple[str, type], ...]
    """The fields every reader of its run records relies on (``records.checked``)."""
    load: Callable[[Any], Any]
    """``store.ResultsStore`` -> the study, None or a line (the store is not imported here: it reads this registry)."""
    section: Callable[[Sequence[Any], Where], Section | None] | None = None
    compared_by_check: bool = False


def _command(name: str, module: str, function: str, summary: str) -> tuple[str, Command]:
    return name, Command(module, function, summary)


KINDS: dict[str, KindEntry] = {
    entry.name: entry
    for entry in (
        KindEntry(
            "sweep",
            "detprof.reports.report_data:SWEEP",
            _command(
                "sweep",
                "detprof.sweep.command",
                "sweep",
                "Run each model in default and deterministic mode; report the overhead.",
            ),
            remeasure="detprof.sweep.remeasure:remeasure",
        ),
        KindEntry("calibration", "detprof.reports.report_data:CALIBRATION"),
        KindEntry(
            "kernels",
            "detprof.reports.kernels_data:KERNELS",
            _command(
                "kernels",
                "detprof.kernels_bench.command",
                "kernels",
                "Measure what determinism costs op by op (convolutions, pooling, scatters, ...).",
            ),
        ),
        KindEntry(
            "stability",
            "detprof.reports.report_data:STABILITY",
            _command(
                "stability",
                "detprof.stability.command",
                "stability",
                "Train many copies under chosen noise sources and measure what the noise does to the models.",
            ),
        ),
        KindEntry(
            "verify",
            "detprof.reports.verification_data:VERIFY",
            _command(
                "verify",
                "detprof.verify.command",
                "verify",
                "Prove that determinism holds: train each model twice in deterministic mode and twice in default "
                "mode, fingerprint every layer's output and weights at every step, and say where runs part ways; or "
                "verify your own training program (--command), comparing what it fingerprints with "
                "detprof.fingerprint(). Exit 0 held, 1 not, 2 bad options, 3 unusable input, 74 the machine refused.",
            ),
        ),
        KindEntry("knobs", "detprof.reports.knobs_data:KNOBS"),
    )
}
"""Every kind, in the order every listing shows them."""


def register(entry: KindEntry) -> None:
    """Add a kind (a plugin's, a test's): after the built-in ones, in the order registered."""
    KINDS[entry.name] = entry


def names() -> tuple[str, ...]:
    return tuple(KINDS)


def kind(name: str) -> StudyKind:
    """The registered kind's declaration, its module imported now."""
    module, _, attribute = KINDS[name].reader.partition(":")
    declared: StudyKind = getattr(importlib.import_module(module), attribute)
    return declared


def remeasurer(name: str) -> Callable[..., Path]:
    """What measures a baseline of kind ``name`` again (``KindEntry.remeasure``); a UsageError for a kind that
    ``check --run`` cannot measure, or one not registered here."""
    entry = KINDS.get(name)
    if entry is None or entry.remeasure is None:
        raise UsageError(f"--run cannot measure a baseline of a {name} study again: measure it, then give --current")
    module, _, function = entry.remeasure.partition(":")
    found: Callable[..., Path] = getattr(importlib.import_module(module), function)
    return found


def kinds() -> list[StudyKind]:
    return [kind(name) for name in KINDS]


def commands() -> dict[str, Command]:
    """The commands that run a kind, in the registry's order."""
    return dict(entry.command for entry in KINDS.values() if entry.command is not None)
