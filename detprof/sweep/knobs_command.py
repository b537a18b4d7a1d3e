"""``detprof knobs``: the switches of a backend's determinism, what each does, and whether it can matter here."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from detprof import backends
from detprof.console import print_table, table_console


def knobs(
    backend: Annotated[
        str | None, typer.Option(help="The backend whose knobs to list (default: every backend detprof knows).")
    ] = None,
    gpu: Annotated[
        bool, typer.Option("--gpu/--cpu", help="Whether each knob can matter on a GPU (default) or on a CPU.")
    ] = True,
) -> None:
    """No framework is imported: the knobs are declared by their backend (``Backend.knobs``)."""
    if backend is not None:
        backends.refuse_unknown(backend)
    chosen = [backends.get(backend)] if backend is not None else list(backends.all_backends())
    table = Table(title=f"Determinism knobs (sweep --knobs NAME,...), on a {'GPU' if gpu else 'CPU'}")
    table.add_column("Knob", no_wrap=True)
    for col in ("How it is set", "In deterministic mode", f"Can matter on a {'GPU' if gpu else 'CPU'}", "What it does"):
        table.add_column(col, overflow="fold")
    for each in chosen:
        for knob in each.knobs:
            reason = knob.applies(gpu)
            applies = "yes" if reason is None else f"no: {reason}"
            if knob.needs is not None:
                applies += f" (only with {knob.needs})"
            table.add_row(knob.name, escape(knob.setting), "yes" if knob.in_mode else "no", escape(applies), knob.does)
    console = table_console()
    print_table(console, table)
    helpers = [helper for each in chosen for helper in each.helpers]
    if helpers:
        listed = Table(title="Libraries' one-call determinism, priced whole by a knob study (sweep --knobs NAME,...)")
        for col in ("Helper", "The call", "The knobs it sets"):
            listed.add_column(col, overflow="fold")
        for helper in helpers:
            listed.add_row(helper.key, escape(helper.call), ", ".join(sorted(helper.knobs)))
        print_table(console, listed)
