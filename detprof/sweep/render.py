"""What a sweep prints: each study's closing table, and where its results are.

``detprof sweep`` and ``detprof check --run`` print the same tables for what they measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from detprof.console import print_table, table_console
from detprof.formatting import floor, ratio
from detprof.store import ResultsStore
from detprof.sweep.run import SweepOutcome

FAILURE_NOTE_CHARS = 160


def print_outcome(outcome: SweepOutcome, console: Console) -> None:
    """Each study's table (a fleet's under its label), then where the results are."""
    for label, store in outcome.studies.items():
        if outcome.fleet:
            table_console().print(f"[bold]{escape(label)}[/] ({escape(str(store.dir))})")
        {"calibration": print_noise_floor, "knobs": print_knobs}.get(outcome.kind, print_summary)(store)
    results = outcome.out if outcome.fleet else next(iter(outcome.studies.values())).dir
    console.print(f"results: {escape(str(results))}")


def print_noise_floor(store: ResultsStore) -> None:
    """The A/A ratios (deterministic against itself, 95% CI over repeats) and what they mean."""
    from detprof.analysis.overhead import model_overheads, noise_floors

    records = list(store.records())
    floors = noise_floors(records)
    table = Table(title="Noise floor: deterministic against itself (A/A, 95% CI over repeats; true ratio 1)")
    for col in ("Model", "Kernel time", "Wall time", "Smallest resolvable overhead"):
        table.add_column(col, overflow="fold")
    for model, overhead in model_overheads(records).items():
        table.add_row(model, ratio(overhead.kernel), ratio(overhead.wall), floor(floors.get(model)))
    print_table(table_console(), table)


def print_summary(store: ResultsStore) -> None:
    """The closing table: overheads and the report's verdict, then the report's attribution, word for word.

    The verdict (``reports.verdict``) and the sentence on where the added time went
    (``reports.attribution``) are the ones the report prints, from the same per-step kernel
    diff, so the console and the report cannot name different kernels or numbers. The
    sentences follow the table, one per model, where a terminal has the width to show them, and
    then the layers that pay (``analysis.layers``, as the report's leaderboard reads them without a
    calibration's floor). The runs the report names beside its answer (``analysis.conditions.disturbed_runs``:
    steps something interrupted, a machine other work used) come first.
    """
    from detprof.analysis.conditions import UNDER_LOAD, disturbed_runs, every_run_shared
    from detprof.analysis.layers import attribute_model
    from detprof.analysis.overhead import AddedRepeats
    from detprof.analysis.study_results import summarize
    from detprof.intervals import headline
    from detprof.reports.attribution import attribution, with_layer
    from detprof.reports.cells import layers_line
    from detprof.reports.verdict import verdict

    summaries = summarize(store)
    by_model: dict[str, list[Mapping[str, Any]]] = {}
    for record in store.records():
        by_model.setdefault(str(record.get("model")), []).append(record)
    layer_lines: list[str] = []
    words: set[str] = set()
    disturbed: list[str] = []
    notes = {s.model: s.overhead.failure_note() for s in summaries}
    table = Table(title="Overhead of determinism (deterministic / default, 95% CI over repeats)")
    table.add_column("Model", no_wrap=True)
    for col in ("Kernel time", "Wall time", "Verdict"):
        table.add_column(col, overflow="fold")
    if any(notes.values()):
        table.add_column("Failed runs", overflow="fold")
    sentences = []
    for summary in summaries:
        overhead = summary.overhead
        metric, measured = headline(overhead.kernel, overhead.wall)
        read = verdict(measured)
        records = by_model.get(summary.model, [])
        loaded = f", {UNDER_LOAD}" if every_run_shared(records) else ""
        verdict_text = read.text if read.reading is None else f"{read.text} ({metric} time{loaded})"
        row = [summary.model, ratio(overhead.kernel), ratio(overhead.wall), escape(verdict_text)]
        if any(notes.values()):
            note = notes[summary.model]
            row.append("-" if note is None else escape(note[:FAILURE_NOTE_CHARS]))
        table.add_row(*row)
        parts = attribute_model(store, records)
        if summary.kernel_diff is not None:
            said = with_layer(parts, attribution(summary.kernel_diff, measured))
            sentences.append(f"  {escape(summary.model)}: {escape(str(said))}")
        if parts is not None:
            words.add(parts.part)
            layer_lines.append(f"  {escape(summary.model)}: {escape(layers_line(parts))}")
        disturbed += [f"  {escape(summary.model)}: {escape(line)}" for line in disturbed_runs(records)]
    console = table_console()
    print_table(console, table)
    nouns = sorted(words) or ["layer"]
    parts_title, every = " and ".join(f"{n}s" for n in nouns).capitalize(), ", ".join(nouns)
    for title, lines in (
        ("Disturbed runs:", disturbed),
        ("Where the added time went:", sentences),
        (f"{parts_title} by time determinism adds (95% CI; the report has every {every} and op):", layer_lines),
    ):
        if lines:
            console.print(title)
            for line in lines:
                console.print(line)
    precision = [(s.model, s.overhead.precision_line()) for s in summaries]
    if any(line for _, line in precision):
        console.print("Precision (repeats added until each interval was within it, or the budget was spent):")
        for model, line in precision:
            console.print(f"  {escape(model)}: {escape(line or 'no precision asked')}")
        if (added := AddedRepeats.read(store)) is not None:
            console.print(f"  {added.line()}")


def print_knobs(store: ResultsStore) -> None:
    """Per model, each knob's cost added alone and within full determinism, with the bitwise check; then the
    first screen's line."""
    from detprof.analysis.knobs import by_reason, helper_lines, read_knob_study

    console = table_console()
    for study in read_knob_study(store):
        every = f"; every switch on {ratio(study.every)}" if study.has_every else ""
        table = Table(
            title=f"Which switch costs what: {study.model} on {study.device} ({study.backend}); full determinism "
            f"{ratio(study.total)}{every} (ratios, 95% CI over repeats)"
        )
        table.add_column("Knob", no_wrap=True)
        within = "Within every switch on" if study.has_every else "Within full determinism"
        for col in ("Added to the default alone", within, "Without it (bitwise)"):
            table.add_column(col, overflow="fold")
        for knob in (k for k in study.knobs if k.applies):
            alone = ratio(knob.add_one) if knob.add_one is not None else escape(knob.reason or "not run")
            within = ratio(knob.leave_one_out) if knob.leave_one_out is not None else "not in deterministic mode"
            table.add_row(knob.knob, alone, within, escape(knob.check or "-"))
        print_table(console, table)
        # The knobs that cannot matter here: a line each below the table, not a row each folded into a paragraph.
        for reason, knobs in by_reason({k.knob: k.reason or "" for k in study.knobs if not k.applies}).items():
            console.print(f"  {', '.join(knobs)}: not applicable: {escape(reason)}")
        console.print(f"  {escape(study.model)}: {escape(study.advice())}")
        for line in helper_lines(study):
            console.print(f"  {escape(line)}")
        unexplained = study.unexplained_line()
        if unexplained is not None:
            console.print(f"  {escape(unexplained)}")
        for failure in study.failures[:3]:
            console.print(f"  failed: {escape(failure[:FAILURE_NOTE_CHARS])}")
