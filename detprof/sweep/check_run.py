"""``detprof check`` as the core runs it: a request in, the comparison and its exit code out.

The statistics live in ``check.regression``, the file format and fingerprint in
``check.baseline_file``; this module checks the request, measures afresh where asked
(``--run``, through ``sweep.run``), compares, and decides the exit code. The command
(``sweep.check_command``) prints and writes the outputs.

``check --run`` measures afresh with the baseline's own sweep configuration unless an
option overrides it: re-measuring what the baseline measured is the only comparison that
needs no ``--allow-env-change``. It always runs the baseline's Keras backend: a check
compares a backend with itself, so results of another backend are refused in one line
(exit 3), and so is ``--backend`` naming another.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from detprof.analysis.conditions import shared_device_warnings
from detprof.check.baseline_file import (
    Baseline,
    EnvironmentCheck,
    check_environment,
    fingerprint,
    read_baseline,
    read_sweep,
    refuse_other_backend,
)
from detprof.check.regression import Comparison, Verdict, compare, severity
from detprof.errors import ExitCode, InputError, UsageError
from detprof.options import CHECK_RUN, RunOptions
from detprof.sweep.run import SweepOutcome

FLAGS = ("force", "compile")
"""The on/off options ``check --run`` passes on: given when on (off is also what not giving them means)."""


@dataclass(frozen=True)
class CheckRequest:
    """What ``detprof check`` was asked: the baseline, the results to check (or ``run``), and how to judge."""

    baseline_file: Path | None
    current: Path | None
    run: bool
    threshold: float
    confidence: float
    strict: bool
    allow_env_change: bool
    options: RunOptions
    models: str | None = None
    out: Path | None = None

    def validated(self) -> Path:
        """The baseline file, once every option is checked (one line for the first mistake)."""
        if self.baseline_file is None:
            raise UsageError("detprof check needs --baseline FILE (written by detprof baseline)")
        if (self.current is None) == (not self.run):
            raise UsageError("give exactly one of --current RESULTS_DIR or --run")
        if len(self.options.gpus) > 1:
            raise UsageError("a check compares one GPU type with its baseline: give --gpu once (with --ray too)")
        given = {"out": self.out, "models": self.models}
        given |= {n: getattr(self.options, n) for n in CHECK_RUN if n not in FLAGS}
        flags = [n for n in FLAGS if getattr(self.options, n)]
        if not self.run and (flags or any(v is not None for v in given.values())):
            used = sorted([*(k.replace("_", "-") for k, v in given.items() if v is not None), *flags])
            raise UsageError(f"--{', --'.join(used)} only apply with --run")
        if not self.threshold > 0:
            raise UsageError(f"--threshold must be a positive fraction (0.10 = 10%), not {self.threshold}")
        if not 0.5 < self.confidence < 1:
            raise UsageError(f"--confidence must lie between 0.5 and 1 (exclusive), not {self.confidence}")
        return self.baseline_file


@dataclass(frozen=True)
class CheckOutcome:
    title: str
    results_dir: Path
    env: EnvironmentCheck
    comparison: Comparison | None
    """None when the environments are not comparable."""
    measured: SweepOutcome | None
    """What ``--run`` measured."""
    measured_models: bool
    """Whether ``--run`` swept models (a program's sweep writes no report)."""
    shared_device: tuple[str, ...] = ()
    """The current runs that shared their device with other load (``analysis.conditions``)."""

    @property
    def refusal(self) -> str | None:
        """The one line that stops a check whose environment differs from the baseline's."""
        if self.env.comparable:
            return None
        fields = ", ".join(d.field for d in self.env.differences)
        return (
            f"environment differs from the baseline ({fields}): overheads are not comparable; "
            "rebuild the baseline here, or pass --allow-env-change"
        )

    def exit_code(self, *, strict: bool) -> ExitCode:
        """Not comparable, or a measurement failed: INPUT; a regression, or what --strict fails: CHECK_FAILED."""
        if self.comparison is None or not self.env.comparable:
            return ExitCode.INPUT
        if self.comparison.having(Verdict.REGRESSED):
            return ExitCode.CHECK_FAILED
        levels = {severity(r, strict=strict) for r in self.comparison.results}
        if "error" in levels:
            return ExitCode.INPUT
        if "failure" in levels:
            return ExitCode.CHECK_FAILED
        return ExitCode.OK


def run_check(request: CheckRequest, *, console: Console) -> CheckOutcome:
    """The check the request asks for: the results compared with the baseline, measured first with ``--run``."""
    baseline_file = request.validated()
    reference = read_baseline(baseline_file)
    options = request.options
    if request.run and options.backend not in (None, reference.backend):
        raise InputError(
            f"--backend {options.backend}: the baseline {baseline_file} ran on {reference.backend}, and overheads "
            "of different Keras backends are never comparable; check --run runs the baseline's backend by itself"
        )
    measured = None
    if request.current is None:
        measured = remeasure(reference, options, request.models, request.out, console)
    results_dir = request.current if measured is None else measured.out
    assert results_dir is not None
    sweep = read_sweep(results_dir)
    found = fingerprint(sweep.config, sweep.records)
    refuse_other_backend(reference, results_dir, found["backend"])
    env = check_environment(reference.fingerprint, found, allow=request.allow_env_change)
    title = f"detprof check: {baseline_file} vs {results_dir}"
    swept_models = measured is not None and reference.config.get("program") is None
    shared = tuple(shared_device_warnings(sweep.records))
    if not env.comparable:
        return CheckOutcome(title, results_dir, env, None, measured, swept_models, shared)
    current = sweep.samples()
    known = set(reference.samples()) | set(reference.unsupported)
    if not known & current.models:
        raise InputError(
            f"no model in common: the baseline has {', '.join(sorted(known))}; "
            f"{results_dir} has {', '.join(sorted(current.models))}"
        )
    comparison = compare(
        reference.samples(),
        current,
        threshold=request.threshold,
        confidence=request.confidence,
        baseline_unsupported=reference.unsupported,
    )
    return CheckOutcome(title, results_dir, env, comparison, measured, swept_models, shared)


def remeasure(
    reference: Baseline, given: RunOptions, models: str | None, out: Path | None, console: Console
) -> SweepOutcome:
    """The sweep (or the program) the baseline measured, with its configuration and backend, the options given
    overriding the configuration."""
    from detprof.models.plans import split_models
    from detprof.profiler.model_plan import SweepRequest
    from detprof.sweep.run import measure_sweep

    config = reference.config
    if config.get("program") is not None:
        return _remeasure_program(reference, given, models, out, console)
    fixed = ("gpu", "backend", *FLAGS)
    options = _replayed(
        reference,
        given,
        [n for n in CHECK_RUN if n not in fixed],
        out,
        compile=bool(config.get("compile")) or given.compile,
        preset=config.get("preset"),
    )
    swept = split_models(models) or tuple(config.get("models") or ()) or None
    return measure_sweep(SweepRequest(swept, options), console=console)


def _remeasure_program(
    reference: Baseline, given: RunOptions, models: str | None, out: Path | None, console: Console
) -> SweepOutcome:
    """The baseline's training program (``sweep --command``) measured again as it was: its command, name,
    backend, tracer, repeats and ``--seed``, the options given that a program takes overriding them."""
    from detprof.profiler.program.plan import PROGRAM_OPTIONS, ProgramRequest, refuse_for_programs
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
