"""The one progress display of every study that runs workers (sweep, kernels, stability).

Runs done out of the total, the runs in flight and an ETA on a terminal; one line per
finished run when the output goes to a file or a pipe, where a bar would print nothing for
minutes. Ctrl-C ends the command with exit 130 and says that every completed run is kept
and ``--resume`` continues: records are written as runs end, so nothing measured is lost.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from detprof import interrupts
from detprof.errors import ExitCode


@dataclass
class RunProgress:
    """What a driver reports as it goes; it never knows how (or whether) that is shown."""

    bar: Progress | None = None
    task: TaskID | None = None
    total: int = 0
    title: str = ""
    done_count: int = field(default=0)
    failed_count: int = field(default=0)
    """Runs of this invocation that did not end ok (a fleet's display shows them per GPU type)."""

    def on_start(self, label: str, completed: int) -> None:
        """``label``: the run (or runs) in flight; ``completed``: runs finished so far, earlier ones included.

        No run starts after an interrupt that Python swallowed (``interrupts``): it is raised here.
        """
        interrupts.raise_pending()
        self.done_count = completed
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, completed=completed, description=escape(label))

    def add_runs(self, count: int, why: str) -> None:
        """``count`` runs more than planned (a sweep adding repeats to reach its precision), and why."""
        self.total += count
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, total=self.total)
        self.note(why)

    def note(self, line: str) -> None:
        """A line beside the runs, of what no record says (repeats added, a worker that ended before its last run)."""
        if self.bar is not None:
            self.bar.console.print(f"{self.title}: {escape(line)}")

    def on_done(self, record: Mapping[str, Any]) -> None:
        self.done_count += 1
        status = str(record.get("status"))
        failed = f": {escape(str(record.get('reason')))}" if status != "ok" else ""
        self.failed_count += status != "ok"
        if self.bar is None:
            return
        assert self.task is not None
        self.bar.update(self.task, completed=self.done_count)
        if not self.bar.console.is_terminal:
            self.bar.console.print(
                f"{self.title} [{self.done_count}/{self.total}] {escape(str(record.get('run_id')))}: {status}{failed}"
            )
        elif status != "ok":
            self.bar.console.print(f"  {escape(str(record.get('run_id')))}: {status}{failed}")


@contextmanager
def progress_bar(console: Console, title: str, total: int, results_dir: Path) -> Iterator[RunProgress]:
    """Show ``title``'s progress over ``total`` runs; Ctrl-C: exit 130, completed runs kept in ``results_dir``."""
    with progress_bars(console, {title: total}, results_dir) as bars:
        yield bars[title]


@contextmanager
def progress_bars(console: Console, totals: Mapping[str, int], results_dir: Path) -> Iterator[dict[str, RunProgress]]:
    """One line per title (a fleet's GPU types: ``sweep t4``, ``sweep a100``), each over its total, in one display."""
    columns = (
        TextColumn("[bold]{task.fields[title]}[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        TextColumn("{task.description}"),
    )
    # Off a terminal the bar is not drawn (rich would print nothing until the end): one line per run instead.
    with Progress(*columns, console=console, transient=False, disable=not console.is_terminal) as bar:
        bars = {
            title: RunProgress(bar, bar.add_task("starting", total=total, title=escape(title)), total, title)
            for title, total in totals.items()
        }
        try:
            yield bars
        except KeyboardInterrupt as stop:
            bar.stop()
            terminated = interrupts.terminated(stop)
            why = "terminated (SIGTERM)" if terminated else "interrupted"
            console.print(f"{why}: every completed run is kept in {escape(str(results_dir))}; --resume continues")
            raise typer.Exit(ExitCode.TERMINATED if terminated else ExitCode.INTERRUPTED) from None
        for progress in bars.values():
            bar.update(progress.task, completed=progress.total, description="done")  # type: ignore[arg-type]
