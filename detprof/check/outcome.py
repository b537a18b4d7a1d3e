"""``detprof check`` as the core runs it: a request in, the comparison and its exit code out.

The statistics live in ``check.regression``, the file format and fingerprint in
``check.baseline_file``; this module checks the request, has the results measured afresh
where asked (``--run``: the baseline's study kind measures again, ``study_kinds.remeasurer``,
so that this read side never imports the runner), compares, and decides the exit code. The
command (``check.command``) prints and writes the outputs.

``check --run`` measures afresh with the baseline's own configuration unless an option
overrides it: re-measuring what the baseline measured is the only comparison that needs no
``--allow-env-change``. It always runs the baseline's Keras backend: a check compares a
backend with itself, so results of another backend are refused in one line (exit 3), and
so is ``--backend`` naming another.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

import detprof.study_kinds as study_kinds
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

FLAGS = ("force", "compile", "shared_repeats")
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


def _refuse_before_measuring(request: CheckRequest, reference: Baseline, baseline_file: Path) -> None:
    """What ``--run`` would measure only to refuse afterwards, refused before anything is measured."""
    from detprof import backends
    from detprof.store import ResultsStore

    options = request.options
    if options.backend is not None:
        backends.refuse_unknown(options.backend)
    if options.backend not in (None, reference.backend):
        raise InputError(
            f"--backend {options.backend}: the baseline {baseline_file} ran on {reference.backend}, and overheads "
            "of different Keras backends are never comparable; check --run runs the baseline's backend by itself"
        )
    if options.repeats is not None and options.repeats < 2:
        raise UsageError(f"--repeats {options.repeats}: a check compares intervals, which take at least 2 repeats")
    known = set(reference.samples()) | set(reference.unsupported)
    asked = [m.strip() for m in (request.models or "").split(",") if m.strip()]
    registry_names = all(":" not in m and not m.endswith(".keras") for m in asked)
    if asked and registry_names and not known & {*asked, *(m.lower() for m in asked)}:
        raise UsageError(
            f"--models: none of {', '.join(asked)} is in the baseline {baseline_file}, which holds "
            f"{', '.join(sorted(known))}: there would be nothing to compare"
        )
    changed = {} if request.allow_env_change else _changed_sources(reference, request.models)
    if changed:
        fields = ", ".join(f"model_source.{label}" for label in changed)
        raise InputError(
            f"environment differs from the baseline ({fields}): the file of {', '.join(changed.values())} changed "
            "since the baseline was built, so check --run would measure only to refuse; rebuild the baseline, or "
            "pass --allow-env-change"
        )
    if request.out is not None and ResultsStore(request.out, "sweep").exists():
        raise UsageError(
            f"{request.out / 'sweep'} already holds results: check --run measures afresh, into another --out (or "
            "none: results/check-<time>)"
        )


def _changed_sources(reference: Baseline, models: str | None) -> dict[str, str]:
    """The models of one's own that ``--run`` would measure whose file is not the one the baseline measured
    (``model_source``), by name (-> as given): known before anything runs. A file that cannot be read is left to the
    sweep to name."""
    from detprof.models import own
    from detprof.models.plans import split_models

    sources = reference.fingerprint.get("model_source") or {}
    changed = {}
    for given in split_models(models) or tuple(reference.config.get("models") or ()):
        if not own.is_own(given):
            continue
        try:
            model = own.parse(given)
        except UsageError:
            continue
        if model.sha256 is not None and sources.get(model.label) not in (None, model.source):
            changed[model.label] = given
    return changed


def run_check(request: CheckRequest, *, console: Console) -> CheckOutcome:
    """The check the request asks for: the results compared with the baseline, measured first with ``--run``."""
    baseline_file = request.validated()
    reference = read_baseline(baseline_file)
    options = request.options
    if request.run:
        _refuse_before_measuring(request, reference, baseline_file)
    results_dir = request.current
    if results_dir is None:
        results_dir = study_kinds.remeasurer(reference.study)(reference, options, request.models, request.out, console)
    sweep = read_sweep(results_dir)
    found = fingerprint(sweep.config, sweep.records)
    refuse_other_backend(reference, results_dir, found["backend"])
    configs = (reference.config, sweep.config)
    env = check_environment(reference.fingerprint, found, allow=request.allow_env_change, configs=configs)
    title = f"detprof check: {baseline_file} vs {results_dir}"
    shared = tuple(shared_device_warnings(sweep.records))
    if not env.comparable:
        return CheckOutcome(title, results_dir, env, None, shared)
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
    return CheckOutcome(title, results_dir, env, comparison, shared)
