"""Whether pairing the two modes in one process measures what a process started in each mode gets.

Both modes in one process is the cheap way to pair them (one start, one build, no offset between two
processes), but a process is switched once when it starts, and a framework may keep, for the whole
process, what it read or chose under one mode: XLA its flags and its autotuner's picks, cuBLAS its
workspace. So the same sweep measured both ways is compared, model by model: the ratio of the
in-process overhead to the per-process one, with its 95% interval (Welch's, over the two routes'
paired repeats). It **agrees** where the whole interval lies within ``AGREEMENT``, **disagrees** where
it lies outside it (or where the runs fail one way and not the other), and **cannot tell** otherwise.

The same comparison asks whether a model's repeats may share one process (``--shared-repeats``: the steps its
first repeat built and compiled, re-run): a repeat in a process of its own draws again what a process fixes once
(a compiler's and an autotuner's picks, where memory lies), so shared repeats stand for it only where the two
agree (``REPEATS``).

Where a check cannot tell, each model's answer says how many repeats a way would answer it if its ratio and each
way's spread held (``intervals.repeats_to_settle``, the check command's rule): what a study's follow-up of the check
runs, once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from detprof.analysis.overhead import model_overheads, paired_log_ratios
from detprof.intervals import MIN_REPEATS, WelchDifference, repeats_to_settle, welch_difference

Answer = Literal["agrees", "disagrees", "cannot tell"]
Route = Literal["in_process", "processes"]
"""How a study pairs the modes: both in one process, or a process per mode."""
AGREEMENT = (0.98, 1.02)
"""Where the ratio of the two routes' overheads must lie, whole interval, for one process to stand for two."""
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Ways:
    """The two ways a check compares, as its answers name them: the cheap one, and the one it must stand for."""

    cheap: str
    reference: str


PAIRING = Ways("in one process", "a process per mode")
REPEATS = Ways("repeats in one process", "a process per repeat")


@dataclass(frozen=True)
class ModelPairing:
    model: str
    answer: Answer
    ratio: float | None
    """The in-process overhead over the per-process one; None where one route has none."""
    low: float | None
    high: float | None
    metric: str | None
    why: str
    repeats_to_answer: int | None = None
    """Where it cannot tell: the repeats a way after which its interval would lie wholly within the band or wholly
    outside it, if the ratio and each way's spread held; None where it answered, or where no number would."""


@dataclass(frozen=True)
class PairingAnswer:
    """A backend's answer: the models' answers, and what they add up to (any disagreement disagrees; all agreeing
    agrees)."""

    answer: Answer
    models: tuple[ModelPairing, ...]

    @property
    def why(self) -> str:
        return "; ".join(f"{m.model}: {m.why}" for m in self.models)

    @property
    def route(self) -> Route:
        """How the rest of a study pairs the modes on this backend: in one process only where it agrees."""
        return "in_process" if self.answer == "agrees" else "processes"

    def to_json(self) -> dict[str, Any]:
        return {"answer": self.answer, "models": [m.__dict__ for m in self.models]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PairingAnswer:
        return cls(data["answer"], tuple(ModelPairing(**m) for m in data["models"]))


def compare(
    cheap: Sequence[Mapping[str, Any]], reference: Sequence[Mapping[str, Any]], ways: Ways = PAIRING
) -> PairingAnswer:
    """The two ways' records of one backend (the same models, settings and device), compared model by model: the
    cheap way's overhead over the reference's."""
    models = sorted({str(r["model"]) for r in cheap} & {str(r["model"]) for r in reference})
    answers = tuple(_model(model, cheap, reference, ways) for model in models)
    if not answers:
        return PairingAnswer("cannot tell", ())
    said = {m.answer for m in answers}
    answer: Answer = "disagrees" if "disagrees" in said else "agrees" if said == {"agrees"} else "cannot tell"
    return PairingAnswer(answer, answers)


def _model(
    model: str, cheap: Sequence[Mapping[str, Any]], reference: Sequence[Mapping[str, Any]], ways: Ways
) -> ModelPairing:
    one, each = _of(cheap, model), _of(reference, model)
    failed_one, failed_each = _failure(one), _failure(each)
    if failed_one and not failed_each:
        why = f"{ways.cheap} {failed_one}; {ways.reference} it ran"
        return ModelPairing(model, "disagrees", None, None, None, None, why)
    if failed_each:
        return ModelPairing(model, "cannot tell", None, None, None, None, f"{ways.reference} {failed_each}")
    for metric in ("kernel", "wall"):
        ones, eaches = paired_log_ratios(one, metric).get(model, []), paired_log_ratios(each, metric).get(model, [])
        if ones and eaches:
            return _compared(model, metric, ones, eaches, ways)
    return ModelPairing(model, "cannot tell", None, None, None, None, "no pair measured both ways")


def _compared(model: str, metric: str, ones: list[float], eaches: list[float], ways: Ways) -> ModelPairing:
    ratio = math.exp(sum(ones) / len(ones) - sum(eaches) / len(eaches))
    if min(len(ones), len(eaches)) < MIN_REPEATS:
        why = f"{ratio:.3f}x ({metric} time) from one pair a way: two or more each way give an interval"
        return ModelPairing(model, "cannot tell", ratio, None, None, metric, why)
    welch = welch_difference(eaches, ones)
    alpha = (1 - CONFIDENCE) / 2
    low, high = math.exp(welch.lower(alpha)), math.exp(welch.upper(alpha))
    within = AGREEMENT[0] <= low and high <= AGREEMENT[1]
    outside = high < AGREEMENT[0] or low > AGREEMENT[1]
    answer: Answer = "agrees" if within else "disagrees" if outside else "cannot tell"
    band = f"[{AGREEMENT[0]:.2f}, {AGREEMENT[1]:.2f}]"
    where = {"agrees": "within", "disagrees": "outside", "cannot tell": "across the edge of"}[answer]
    counted = f"{len(ones)} and {len(eaches)} repeats"
    why = (
        f"{ratio:.3f}x [{low:.3f}, {high:.3f}] ({metric} time, {ways.cheap} over {ways.reference}, {counted}), "
        f"{where} {band}"
    )
    if answer != "cannot tell":
        return ModelPairing(model, answer, ratio, low, high, metric, why)
    needed = _repeats_to_answer(welch, alpha)
    why += f"; about {needed} repeats a way would answer" if needed else "; no number of repeats would answer"
    return ModelPairing(model, answer, ratio, low, high, metric, why, needed)


def _repeats_to_answer(welch: WelchDifference, alpha: float) -> int | None:
    """Repeats a way after which the interval would clear the band's nearer edge (wholly within the band where the
    ratio lies in it, wholly outside where it does not), if the ratio and the spreads held."""
    edges = (math.log(AGREEMENT[0]), math.log(AGREEMENT[1]))
    nearer = min(edges, key=lambda edge: abs(welch.diff - edge))
    return repeats_to_settle(welch, nearer, alpha)


def _of(records: Iterable[Mapping[str, Any]], model: str) -> list[Mapping[str, Any]]:
    return [r for r in records if r.get("model") == model]


def _failure(records: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the model has no overhead this way (its runs failed), or None."""
    overhead = model_overheads(records).get(records[0]["model"]) if records else None
    if overhead is None or overhead.kernel is not None or overhead.wall is not None:
        return None if overhead is not None else "ran no pair"
    note = overhead.failure_note()
    return f"failed ({note})" if note else "measured no pair"
