"""Has the cost of determinism changed since the baseline? Pure statistics, no I/O.

Each side (baseline, current) gives per model the per-repeat log ratios ln(det/default).
The change is D = mean(current) - mean(baseline); exp(D) is the ratio of the two
overheads (1.25 = determinism now costs 25% more than it did). Baseline and current runs
are independent samples with their own spread, so the interval is Welch's: standard error
sqrt(s_b^2/m + s_c^2/n) with Welch-Satterthwaite degrees of freedom. The t distribution
keeps it honest for the 3-10 repeats a sweep affords; two repeats already give an
interval, but a wide one.

The threshold tau is a margin, not a point: H_reg: exp(D) <= 1 + tau is rejected (the
model REGRESSED) only when the one-sided lower bound of exp(D) exceeds 1 + tau. The
mirror, H_imp: exp(D) >= 1 / (1 + tau) (the margin is symmetric on the log scale), is
rejected (IMPROVED) when the one-sided upper bound is below 1 / (1 + tau).

Several models are several tests, so each direction is one Holm family over the models
compared: the one-sided p-values are sorted ascending and step j of k tests at level
alpha / (k - j + 1), stopping at the first model it cannot reject; the models from there
on are tested at that stopping level, so none of them is rejected. Each model's bound is
computed at exactly the level its step used, and the verdict is read off that bound, so a
verdict and its interval can never disagree. The probability of calling any model
REGRESSED when none regressed stays at most alpha = 1 - confidence (likewise IMPROVED). The
interval shown, [lower, upper], is the pair of these one-sided bounds; for one model it is
the two-sided (1 - 2 alpha) Welch interval.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from detprof.analysis.overhead import ModelOverhead, PrecisionReached, model_overheads, paired_log_ratios
from detprof.errors import InputError
from detprof.intervals import (
    MIN_REPEATS,
    HolmStep,
    Metric,
    WelchDifference,
    holm,
    repeats_to_settle,
    welch_difference,
)

Direction = Literal["regression", "improvement"]


class Verdict(StrEnum):
    REGRESSED = "REGRESSED"
    IMPROVED = "IMPROVED"
    INCONCLUSIVE = "INCONCLUSIVE"
    OK = "OK"
    MISSING_BASELINE = "MISSING_BASELINE"
    MISSING_CURRENT = "MISSING_CURRENT"
    FAILED = "FAILED"
    UNSUPPORTED = "UNSUPPORTED"


@dataclass(frozen=True)
class ModelSample:
    """One side's measurement of one model: per-repeat log ratios and what one run measured."""

    wall: tuple[float, ...]
    kernel: tuple[float, ...] = ()
    steps: int | None = None
    warmup: int | None = None
    batch_size: int | None = None
    input_shape: tuple[int, ...] | None = None
    precision: PrecisionReached | None = None
    """How precise its overhead came out against the sweep's ``--precision``, where it asked one."""

    def log_ratios(self, metric: Metric) -> tuple[float, ...]:
        return self.kernel if metric == "kernel" else self.wall


@dataclass(frozen=True)
class SweepSamples:
    """Everything one sweep says per model: samples, and the models it could not measure."""

    samples: dict[str, ModelSample]
    failed: dict[str, str] = field(default_factory=dict)
    unsupported: dict[str, str] = field(default_factory=dict)

    @property
    def models(self) -> set[str]:
        return set(self.samples) | set(self.failed) | set(self.unsupported)


def samples_from_records(records: Iterable[Mapping[str, Any]]) -> SweepSamples:
    """Pair each model's runs repeat by repeat; failed and unsupported runs are kept apart."""
    records = list(records)
    wall = paired_log_ratios(records, "wall")
    kernel = paired_log_ratios(records, "kernel")
    failed: dict[str, list[Mapping[str, Any]]] = {}
    unsupported: dict[str, str] = {}
    first_ok: dict[str, Mapping[str, Any]] = {}
    for rec in records:
        model, status = str(rec["model"]), rec.get("status")
        if status == "ok":
            first_ok.setdefault(model, rec)
        elif status == "unsupported":
            unsupported.setdefault(model, str(rec.get("reason") or "not supported under determinism"))
        else:
            failed.setdefault(model, []).append(rec)
    overheads = model_overheads(records)
    samples = {}
    for model in sorted(set(wall) | set(kernel)):
        rec = first_ok[model]
        shape = rec.get("input_shape")
        samples[model] = ModelSample(
            wall=tuple(wall.get(model, ())),
            kernel=tuple(kernel.get(model, ())),
            steps=rec.get("steps"),
            warmup=rec.get("warmup"),
            batch_size=rec.get("batch_size"),
            input_shape=tuple(shape) if shape is not None else None,
            precision=overheads[model].precision_reached(),
        )
    failures = {
        model: str(ModelOverhead(model, failures=[dict(r) for r in runs]).failure_note())
        for model, runs in sorted(failed.items())
    }
    unsupported_only = {m: unsupported[m] for m in sorted(unsupported) if m not in samples}
    return SweepSamples(samples, failures, unsupported_only)


def baseline_models(sweep: SweepSamples, source: str, asked_repeats: int | None = None) -> dict[str, dict[str, Any]]:
    """The per-model part of a baseline; refuses a sweep that cannot be a trustworthy reference: one with failed
    runs, or fewer repeats of a model than it asked for (``asked_repeats``: a sweep stopped before its end)."""
    if sweep.failed:
        model, reason = next(iter(sweep.failed.items()))
        raise InputError(
            f"{source}: {model}: {reason}; a baseline needs a complete sweep: "
            "rerun the failed runs first (detprof sweep --resume with the same options)"
        )
    if not sweep.samples:
        raise InputError(f"{source}: no model has a completed default/deterministic pair to build a baseline from")
    models = {}
    for model, sample in sweep.samples.items():
        if len(sample.wall) < MIN_REPEATS:
            raise InputError(
                f"{source}: {model} has {len(sample.wall)} paired repeat(s); R < 2 cannot give an interval: "
                "rerun the sweep with --repeats 3 or more"
            )
        if asked_repeats is not None and len(sample.wall) < asked_repeats:
            raise InputError(
                f"{source}: {model} has {len(sample.wall)} of the {asked_repeats} paired repeats the sweep asked for: "
                "a baseline needs a complete sweep: finish it first (detprof sweep --resume with the same options)"
            )
        models[model] = {
            "repeats": len(sample.wall),
            "steps": sample.steps,
            "warmup": sample.warmup,
            "batch_size": sample.batch_size,
            "input_shape": list(sample.input_shape) if sample.input_shape is not None else None,
            "wall_log_ratios": list(sample.wall),
            "kernel_log_ratios": list(sample.kernel) if len(sample.kernel) >= MIN_REPEATS else None,
        }
    return models


@dataclass(frozen=True)
class ModelComparison:
    """One model's verdict. Ratios are exp of log-scale quantities; ``lower``/``upper`` bound exp(D)."""

    model: str
    verdict: Verdict
    reason: str | None = None
    """Why there is no comparison: the run that failed, the side that lacks the model, the refusal."""
    direction: Direction | None = None
    """Which way an INCONCLUSIVE change points (its point estimate beyond the threshold, its interval across)."""
    metric: Metric | None = None
    """What the verdict compares: kernel time where both sides traced kernels, else wall time."""
    metric_note: str | None = None
    """Why the gate fell back to wall time, where it did (``gate_metric``)."""
    n_baseline: int = 0
    n_current: int = 0
    """Paired repeats on each side: with under 3 on either, the note says the interval is valid but wide."""
    baseline_overhead: float | None = None
    current_overhead: float | None = None
    """Each side's geometric mean of det/default: what the change (``ratio``) divides."""
    current_log_ratios: tuple[float, ...] = ()
    """The current side's log ratio per repeat: Bencher's document gives the current overhead its own interval."""
    ratio: float | None = None
    lower: float | None = None
    upper: float | None = None
    lower_level: float | None = None
    upper_level: float | None = None
    p_regression: float | None = None
    p_regression_holm: float | None = None
    p_improvement: float | None = None
    p_improvement_holm: float | None = None
    df: float | None = None
    log_se: float | None = None
    repeats_to_settle: int | None = None
    precision: PrecisionReached | None = None
    """The current results' precision against their ``--precision`` (``ModelSample.precision``)."""

    @property
    def width(self) -> float | None:
        if self.lower is None or self.upper is None:
            return None
        return self.upper - self.lower


@dataclass(frozen=True)
class Comparison:
    threshold: float
    confidence: float
    results: tuple[ModelComparison, ...]

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence

    @property
    def family_size(self) -> int:
        return sum(1 for r in self.results if r.ratio is not None)

    def having(self, *verdicts: Verdict) -> list[ModelComparison]:
        return [r for r in self.results if r.verdict in verdicts]


def gate_metric(baseline: ModelSample, current: ModelSample) -> tuple[Metric, str | None]:
    """Kernel time when both sides traced kernels; else wall time, saying why."""
    has_b, has_c = len(baseline.kernel) >= MIN_REPEATS, len(current.kernel) >= MIN_REPEATS
    if has_b and has_c:
        return "kernel", None
    if has_b or has_c:
        side = "baseline" if has_b else "current results"
        return "wall", f"kernel time only in the {side}: gated on wall time"
    return "wall", "no kernel time on either side: gated on wall time"


def compare(
    baseline: Mapping[str, ModelSample],
    current: SweepSamples,
    *,
    threshold: float,
    confidence: float,
    baseline_unsupported: Mapping[str, str] | None = None,
) -> Comparison:
    """Every model's verdict; regression and improvement each form one Holm family."""
    if threshold <= 0:
        raise ValueError("threshold must be positive")
    if not 0 < confidence < 1:
        raise ValueError("confidence must lie strictly between 0 and 1")
    alpha = 1.0 - confidence
    margin = math.log1p(threshold)
    baseline_unsupported = baseline_unsupported or {}
    fixed: dict[str, ModelComparison] = {}
    tested: dict[str, _Test] = {}
    for model in sorted(set(baseline) | set(baseline_unsupported) | current.models):
        outcome = _pair(model, baseline, baseline_unsupported, current)
        if isinstance(outcome, ModelComparison):
            fixed[model] = outcome
        else:
            tested[model] = outcome

    def reg_rejects(name: str, level: float) -> bool:
        return tested[name].welch.lower(level) > margin

    def imp_rejects(name: str, level: float) -> bool:
        return tested[name].welch.upper(level) < -margin

    p_reg = {name: test.welch.p_greater(margin) for name, test in tested.items()}
    p_imp = {name: test.welch.p_less(-margin) for name, test in tested.items()}
    reg = holm(p_reg, alpha, reg_rejects)
    imp = holm(p_imp, alpha, imp_rejects)
    for model, test in tested.items():
        fixed[model] = _verdict(model, test, reg[model], imp[model], p_reg[model], p_imp[model], margin)
    return Comparison(threshold, confidence, tuple(fixed[m] for m in sorted(fixed)))


@dataclass(frozen=True)
class _Test:
    welch: WelchDifference
    metric: Metric
    note: str | None
    current: tuple[float, ...]
    precision: PrecisionReached | None


def _pair(
    model: str,
    baseline: Mapping[str, ModelSample],
    baseline_unsupported: Mapping[str, str],
    current: SweepSamples,
) -> ModelComparison | _Test:
    """A fixed verdict for a model that cannot be tested, else what the test needs."""
    if model in current.failed:
        return ModelComparison(model, Verdict.FAILED, reason=current.failed[model])
    if model in baseline_unsupported:
        if model in current.unsupported:
            return ModelComparison(model, Verdict.UNSUPPORTED, reason=current.unsupported[model])
        reason = f"not supported under determinism in the baseline ({baseline_unsupported[model]})"
        if model not in current.models:
            reason += "; absent from the current results"
            return ModelComparison(model, Verdict.MISSING_CURRENT, reason=reason)
        return ModelComparison(model, Verdict.MISSING_BASELINE, reason=reason)
    if model not in baseline:
        return ModelComparison(model, Verdict.MISSING_BASELINE, reason="not in the baseline")
    if model in current.unsupported:
        reason = f"deterministic mode is no longer supported: {current.unsupported[model]}"
        return ModelComparison(model, Verdict.FAILED, reason=reason)
    if model not in current.samples:
        return ModelComparison(model, Verdict.MISSING_CURRENT, reason="not in the current results")
    base, cur = baseline[model], current.samples[model]
    metric, note = gate_metric(base, cur)
    b, c = base.log_ratios(metric), cur.log_ratios(metric)
    if len(c) < MIN_REPEATS:
        reason = f"{len(c)} paired repeat(s) in the current results; R < 2 cannot give an interval"
        return ModelComparison(model, Verdict.FAILED, reason=reason, n_baseline=len(b), n_current=len(c))
    return _Test(welch_difference(b, c), metric, note, c, cur.precision)


def _verdict(
    model: str, test: _Test, reg: HolmStep, imp: HolmStep, p_reg: float, p_imp: float, margin: float
) -> ModelComparison:
    welch = test.welch
    direction: Direction | None = None
    settle = None
    if reg.rejected:
        verdict = Verdict.REGRESSED
    elif imp.rejected:
        verdict = Verdict.IMPROVED
    elif welch.diff > margin:
        verdict, direction = Verdict.INCONCLUSIVE, "regression"
        settle = repeats_to_settle(welch, margin, reg.level)
    elif welch.diff < -margin:
        verdict, direction = Verdict.INCONCLUSIVE, "improvement"
        settle = repeats_to_settle(welch, -margin, imp.level)
    else:
        verdict = Verdict.OK
    return ModelComparison(
        model,
        verdict,
        direction=direction,
        metric=test.metric,
        metric_note=test.note,
        n_baseline=welch.n_baseline,
        n_current=welch.n_current,
        baseline_overhead=math.exp(welch.mean_baseline),
        current_overhead=math.exp(welch.mean_current),
        current_log_ratios=test.current,
        ratio=math.exp(welch.diff),
        lower=math.exp(welch.lower(reg.level)),
        upper=math.exp(welch.upper(imp.level)),
        lower_level=reg.level,
        upper_level=imp.level,
        p_regression=p_reg,
        p_regression_holm=reg.adjusted_p,
        p_improvement=p_imp,
        p_improvement_holm=imp.adjusted_p,
        df=welch.df,
        log_se=welch.se,
        repeats_to_settle=settle,
        precision=test.precision,
    )


Severity = Literal["failure", "error", "warning", "ok", "skipped"]


def severity(result: ModelComparison, *, strict: bool) -> Severity:
    """How CI should treat a verdict: the one policy behind the exit code, JUnit and annotations.

    A regression fails; a measurement that failed is an error (exit 3). A possible
    regression the data cannot settle, and a model missing on either side, warn; under
    ``--strict`` they fail. A possible improvement the data cannot settle is only reported.
    """
    verdict = result.verdict
    if verdict == Verdict.REGRESSED:
        return "failure"
    if verdict == Verdict.FAILED:
        return "error"
    if verdict == Verdict.UNSUPPORTED:
        return "skipped"
    needs_attention = verdict in (Verdict.MISSING_BASELINE, Verdict.MISSING_CURRENT) or (
        verdict == Verdict.INCONCLUSIVE and result.direction == "regression"
    )
    if needs_attention:
        return "failure" if strict else "warning"
    return "ok"
