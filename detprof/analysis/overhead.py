"""Overhead of determinism per model (or op case), from the run records of a measured study.

Runs are interleaved (the two modes of a repeat back to back, in lockstep on a CPU, their
order alternating by repeat), so repeat ``r`` of one mode and repeat ``r`` of the other
ran side by side and saw the same drift and thermals:
each repeat gives one paired log ratio, and ``intervals.paired_t`` turns them into the
interval.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from detprof.errors import InputError
from detprof.findings import Finding, fix_for
from detprof.intervals import (
    SETTLE_LIMIT,
    Metric,
    Overhead,
    headline,
    headline_metric,
    noise_floor,
    paired_t,
    repeats_for_precision,
    stein_interval,
)
from detprof.records import is_aa, measures, pair_log_ratio
from detprof.store import read_json_object

if TYPE_CHECKING:
    from detprof.store import ResultsStore


APART_FIX = "--pairing processes runs each mode in a process of its own"
"""What a model whose runs failed with both modes in one process tries (``ModelOverhead.failed_in_one_process``)."""


@dataclass(frozen=True)
class PrecisionReached:
    """How precise a model's headline interval came out against ``--precision``: the fields the JSON report and
    ``check``'s outputs carry beside the sentence (``ModelOverhead.precision_line``).

    ``repeats_to_target`` counts the repeats in all the interval needs to be within the target (Stein's number
    where the study added repeats), distinct from a verdict's ``repeats_needed``, which counts repeats to clear
    1.10x; None where no interval says (fewer than two repeats) or more than ``SETTLE_LIMIT`` would be needed.
    """

    metric: Metric
    half_width: float | None
    target: float
    settled: bool
    repeats: int
    repeats_to_target: int | None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ModelOverhead:
    model: str
    kernel: Overhead | None = None
    wall: Overhead | None = None
    failures: list[dict[str, Any]] = field(default_factory=list)
    precision_asked: float | None = None
    """``--precision``, where the study added repeats until the interval was within it."""

    def precision_short(self) -> int | None:
        """Repeats more the headline interval would need to be within the precision asked; None where it is (or
        none was asked)."""
        interval = headline(self.kernel, self.wall)[1]
        if self.precision_asked is None or interval is None or not interval.has_interval:
            return None
        need = repeats_for_precision(interval, self.precision_asked)
        if need is None:
            return SETTLE_LIMIT
        return need - interval.n if need > interval.n else None

    def precision_reached(self) -> PrecisionReached | None:
        """The precision fields; None where no precision was asked or no run of the model was measured."""
        metric, interval = headline(self.kernel, self.wall)
        asked = self.precision_asked
        if asked is None or interval is None:
            return None
        need = repeats_for_precision(interval, asked) if interval.has_interval else None
        settled = interval.has_interval and self.precision_short() is None
        return PrecisionReached(metric, interval.precision, asked, settled, interval.n, need)

    def precision_line(self) -> str | None:
        """How precise the headline interval came out against ``--precision``, in the words every output uses;
        None where no precision was asked."""
        metric, interval = headline(self.kernel, self.wall)
        asked = self.precision_asked
        if asked is None or interval is None:
            return None
        if interval.precision is None:
            return f"{metric} time: no interval (fewer than two repeats); not within +/-{asked:.1%}"
        # One more digit where one digit would read the same as the precision asked for ("+/-2.0%: not within
        # +/-2.0%").
        digits = 2 if f"{interval.precision:.1%}" == f"{asked:.1%}" else 1
        got = f"{metric} time +/-{interval.precision:.{digits}%} after {interval.n} repeats"
        short = self.precision_short()
        if short is None:
            return f"{got}, within +/-{asked:.1%}"
        more = f"about {short} more repeat{'s' * (short != 1)}" if short < SETTLE_LIMIT else "far more repeats"
        return f"{got}: not within +/-{asked:.1%}; {more} would reach it (--resume with a larger --budget adds them)"

    @property
    def unsupported_reason(self) -> str | None:
        for failure in self.failures:
            if failure.get("status") == "unsupported":
                return str(failure.get("reason"))
        return None

    @property
    def finding(self) -> Finding | None:
        """The op that refused to run deterministically, where its run recorded it (``findings``)."""
        for failure in self.failures:
            if failure.get("status") == "unsupported" and isinstance(failure.get("finding"), dict):
                return Finding.from_json(failure["finding"])
        return None

    @property
    def failed_in_one_process(self) -> bool:
        """Its failed runs all ran in deterministic mode with both modes in one process, its default runs beside them
        ran: a process per mode, where the framework reads its switches when it starts, as a user's program does, is
        what to try (JAX on an H100: gpt_small's deterministic step, compiled with deterministic ops as a compile
        option, failed at its first run, reference/h100-2026-11-28). A model whose default runs failed too failed
        whatever the pairing."""
        return bool(self.failures) and all(
            failure.get("pairing") == "in_process" and failure.get("mode") == "deterministic"
            for failure in self.failures
        )

    def failure_note(self) -> str | None:
        """Why runs are missing, in the same words in every table, warning and CI output; None if none are.

        An op that refused determinism is named with the layer that called it and what to do
        (``Finding.line``): what a user acts on, where the framework's message names only the op.
        """
        finding = self.finding
        if finding is not None:
            return finding.line()
        if self.unsupported_reason is not None:
            return f"not supported under determinism: {self.unsupported_reason}"
        if not self.failures:
            return None
        first = self.failures[0]
        reason = first.get("reason") or first.get("status")
        example = f"{first['run_id']}: {reason}" if first.get("run_id") else reason
        fix = fix_for(str(reason)) or (APART_FIX if self.failed_in_one_process else None)
        return f"{len(self.failures)} run(s) failed, e.g. {example}" + (f" (fix: {fix})" if fix else "")


def paired_log_ratios(
    records: Iterable[Mapping[str, Any]], metric: Metric, key: str = "model"
) -> dict[str, list[float]]:
    """ln(det/default) per ``key`` (a model or an op case), one per repeat (``records.pair_log_ratio``).

    A calibration (both arms deterministic) pairs its arms instead: ln(b/a), whose true value is 0.
    Each metric pairs the runs that measured it: under nsys or nvprof, kernel time the traced
    runs, wall time the untraced ones beside them.
    """
    by_run: dict[tuple[str, int], dict[str, Mapping[str, Any]]] = {}
    for rec in records:
        if rec.get("status") == "ok" and measures(rec, metric):
            by_run.setdefault((rec[key], int(rec["repeat"])), {})[rec.get("arm") or rec["mode"]] = rec
    ratios: dict[str, list[float]] = {}
    for (model, _repeat), sides in sorted(by_run.items()):
        for base, other in (("default", "deterministic"), ("a", "b")):
            if base in sides and other in sides:
                value = pair_log_ratio(sides[base], sides[other], metric)
                if value is not None:
                    ratios.setdefault(model, []).append(value)
    return ratios


def model_overheads(
    records: Iterable[Mapping[str, Any]], confidence: float = 0.95, key: str = "model"
) -> dict[str, ModelOverhead]:
    """Every model's (or op case's) kernel-time and wall-time overhead, and the runs that failed.

    Where the study added repeats until a precision (its records name their ``first_stage``),
    the interval of each time that decided how many is Stein's two-stage interval: the headline's, and in an A/A
    calibration both (``stopping_metrics``).
    """
    records = list(records)
    result: dict[str, ModelOverhead] = {}
    first_stage: dict[str, int] = {}
    aa = {rec[key] for rec in records if is_aa(rec)}
    for rec in records:
        entry = result.setdefault(rec[key], ModelOverhead(rec[key]))
        if rec.get("first_stage"):
            first_stage[rec[key]] = int(rec["first_stage"])
            entry.precision_asked = rec.get("precision")
        if rec.get("status") != "ok":
            failure = {k: rec.get(k) for k in ("run_id", "mode", "repeat", "status", "reason", "pairing")}
            entry.failures.append(failure | ({"finding": rec["finding"]} if rec.get("finding") else {}))
    logs_of = {metric: paired_log_ratios(records, metric, key) for metric in ("kernel", "wall")}
    for metric, by_model in logs_of.items():
        for model, logs in by_model.items():
            decided = model in first_stage and metric in stopping_metrics(model in logs_of["kernel"], model in aa)
            interval = stein_interval(logs, first_stage[model], confidence) if decided else paired_t(logs, confidence)
            setattr(result[model], metric, interval)
    return result


def stopping_metrics(kernel_traced: bool, aa: bool) -> tuple[Metric, ...]:
    """The times whose intervals ``--precision`` holds a study to: the headline's, and in an A/A calibration both,
    since it is the noise floor of both (a sweep untraced, or a program timed whole, reads the wall-time floor) and
    in one process its wall time is the noisier (untraced steps beside traced ones)."""
    return ("kernel", "wall") if aa and kernel_traced else (headline_metric(kernel_traced),)


def repeats_wanted(records: Iterable[Mapping[str, Any]], precision: float) -> dict[str, tuple[int, int]]:
    """Per model that has an interval: the repeats it has, and the repeats its intervals need to be within
    +/-``precision`` (``intervals.repeats_for_precision``; Stein's number where the records name a first stage),
    the widest of its ``stopping_metrics``. A model that failed, or whose spread not even ``SETTLE_LIMIT`` repeats
    would tame, is left out."""
    records = list(records)
    aa = {rec["model"] for rec in records if is_aa(rec)}
    wanted = {}
    for model, overhead in model_overheads(records).items():
        interval = headline(overhead.kernel, overhead.wall)[1]
        if interval is None or overhead.failures:
            continue
        metrics = stopping_metrics(overhead.kernel is not None, model in aa)
        needs = [repeats_for_precision(o, precision) for o in (getattr(overhead, m) for m in metrics) if o is not None]
        if needs and None not in needs:
            wanted[model] = (interval.n, max(n for n in needs if n is not None))
    return wanted


def noise_floors(calibration_records: Iterable[Mapping[str, Any]]) -> dict[str, float | None]:
    """Per model, the smallest overhead this machine resolves (``intervals.noise_floor`` of its A/A overhead)."""
    floors: dict[str, float | None] = {}
    for model, o in model_overheads(calibration_records).items():
        overhead = headline(o.kernel, o.wall)[1]
        floors[model] = None if overhead is None else noise_floor(overhead)
    return floors


ADDED_REPEATS_FILE = "added_repeats.json"


@dataclass(frozen=True)
class AddedRepeats:
    """What the repeats a study's last invocation added after its first stage took: the time ``--budget`` bounds.

    The study writes it (a resumed study's clock starts again, so its record timestamps, spanning both
    invocations, could not say it); the closing summary reads it.
    """

    first_stage: int
    added: int
    seconds: float
    budget_s: float | None

    def write(self, store: ResultsStore) -> None:
        store.write_json(ADDED_REPEATS_FILE, asdict(self))

    @classmethod
    def read(cls, store: ResultsStore) -> AddedRepeats | None:
        """None where the study added no repeats by precision (none asked, or not measured here)."""
        path = store.dir / ADDED_REPEATS_FILE
        if not path.is_file():
            return None
        data = read_json_object(path, "added repeats")
        try:
            return cls(int(data["first_stage"]), int(data["added"]), float(data["seconds"]), data.get("budget_s"))
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{path}: not a detprof added-repeats file ({exc})") from exc

    def line(self) -> str:
        of = f" of the {self.budget_s:g} s budget" if self.budget_s is not None else " (no budget)"
        return f"repeats added after the first {self.first_stage}: {self.added}, in {self.seconds:.0f} s{of}"
