"""``detprof check --run``'s measuring: the baseline's sweep (or program) measured again, on the runner's side.

``check`` reads and compares (``check.outcome``); the sweep kind registers this module as what
measures a sweep baseline again (``study_kinds.KindEntry.remeasure``), so the check reaches
it through the registry and ``check/`` never imports the runner.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from detprof.check.baseline_file import Baseline
from detprof.check.outcome import FLAGS
from detprof.errors import UsageError
from detprof.options import CHECK_RUN, RunOptions
from detprof.reports.command import write_report
from detprof.sweep.render import print_outcome
from detprof.sweep.run import SweepOutcome


def remeasure(reference: Baseline, given: RunOptions, models: str | None, out: Path | None, console: Console) -> Path:
    """The sweep (or the program) the baseline measured, measured again with its configuration and backend (the
    options given overriding the configuration), shown as a sweep shows it: its results folder."""
    program = reference.config.get("program") is not None
    outcome = (_remeasure_program if program else _remeasure_models)(reference, given, models, out, console)
    print_outcome(outcome, console)
    if not program:  # a program's sweep writes no report
        console.print(f"report: {escape(str(write_report(outcome.out, outcome.out / 'report.html')))}")
    return outcome.out


def _remeasure_models(
    reference: Baseline, given: RunOptions, models: str | None, out: Path | None, console: Console
) -> SweepOutcome:
    from detprof.models.plans import split_models
    from detprof.profiler.sweep_request import SweepRequest
    from detprof.sweep.run import measure_sweep

    config = reference.config
    fixed = ("gpu", "backend", *FLAGS)
    if config.get("run_seconds") is not None:
        # Steps sized to the machine (the preset's): its most steps given as --steps would be steps asked for.
        fixed += ("steps",)
    options = _replayed(
        reference,
        given,
        [n for n in CHECK_RUN if n not in fixed],
        out,
        compile=bool(config.get("compile")) or given.compile,
        shared_repeats=bool(config.get("shared_repeats")) or given.shared_repeats,
        preset=config.get("preset"),
    )
    swept = split_models(models) or tuple(config.get("models") or ()) or None
    return measure_sweep(SweepRequest(swept, options), console=console)


def _remeasure_program(
    reference: Baseline, given: RunOptions, models: str | None, out: Path | None, console: Console
) -> SweepOutcome:
    """The baseline's training program (``sweep --command``) measured again as it was: its command, name,
    backend, tracer, repeats and ``--seed``, the options given that a program takes overriding them."""
    from detprof.profiler.program.request import PROGRAM_OPTIONS, ProgramRequest, refuse_for_programs
    from detprof.sweep.run import measure_program

    program = reference.config["program"]
    if models:
        raise UsageError(f"--models: the baseline measured the program {program['name']!r}, not models")
    refuse_for_programs(given, [])
    seed = given.seed if given.seed is not None else program.get("seed")
    options = _replayed(reference, given, [n for n in PROGRAM_OPTIONS if n not in ("backend", "seed")], out, seed=seed)
    return measure_program(ProgramRequest(program["command"], program["name"], options), console=console)


def _replayed(reference: Baseline, given: RunOptions, names: list[str], out: Path | None, **fixed: Any) -> RunOptions:
    """The options the baseline was measured with: its GPU label and its configuration's values of ``names``, each
    overridden by an option given; its backend, ``fixed``, and a results folder of its own unless ``out``."""
    config = reference.config
    baseline = {"gpu": config.get("gpu_label")} | {n: config[n] for n in names if n in config}
    overrides = {n: getattr(given, n) for n in baseline if getattr(given, n) is not None}
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return dataclasses.replace(
        given,
        **(baseline | overrides),
        backend=reference.backend,
        out=out or Path("results") / f"check-{stamp}",
        resume=False,
        **fixed,
    )
