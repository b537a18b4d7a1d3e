"""Which switch costs what: a knob study's records read into each knob's cost, saving and bitwise verdict.

Pure functions of the records (``sweep.knobs`` writes them): per model, each comparison's paired
ratio b/a with its interval (``analysis.overhead`` pairs arms a and b repeat by repeat, as it
pairs a calibration's), and per knob the bitwise check of full determinism without it. The add-one
costs need not sum to the total (knobs interact: PyTorch's fill works only under deterministic
algorithms), so ``ModelKnobs.unexplained`` says how far they do, on the log scale the intervals
are computed on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from detprof import backends
from detprof.analysis.overhead import model_overheads
from detprof.analysis.verification import Comparison, compare
from detprof.backends.base import HELPER_COMPARISON
from detprof.fingerprints import RunFingerprints
from detprof.formatting import counted
from detprof.intervals import ChainedRatio, Overhead, chained, headline, spans
from detprof.store import ResultsStore

TOTAL = "total"
EVERY = "every"
"""A study's comparison of every switch users set for determinism against the default, where that is more than
full determinism (``sweep.knobs``): its ``drop`` arms then leave one out of it."""
NO_EFFECT = 1.0


def within_noise(overhead: Overhead | None, floor: float | None) -> bool | None:
    """Whether a cost is indistinguishable from none: its interval holds 1.00, or lies inside the noise floor; None
    without an interval. Full determinism's total is read alike, so that the report marks it as a knob's."""
    if overhead is None or not overhead.has_interval:
        return None
    if spans(overhead, NO_EFFECT) or overhead.ci_low == NO_EFFECT:
        return True
    return floor is not None and max(abs(overhead.ci_high - 1), abs(overhead.ci_low - 1)) <= floor


@dataclass(frozen=True)
class KnobCost:
    """One knob of one model: what it costs added to the default, what leaving it off saves, whether it is needed."""

    knob: str
    setting: str
    does: str
    applies: bool
    reason: str | None
    """Why it was not measured: it cannot matter on this device, or it has no effect alone."""
    add_one: Overhead | None
    leave_one_out: Overhead | None
    needed: bool | None
    """Whether full determinism without it parts two runs; None: not checked, or full determinism itself parts."""
    check: str | None
    """The bitwise check in words: "still bitwise identical over 20 steps" or where the runs part."""
    in_mode: bool = True
    in_full: bool = False
    """One of the switches the study's leave-one-out arms leave one out of (full determinism's, or every switch
    on's), applicable here: the least set that holds bitwise is drawn from them."""

    @property
    def saving(self) -> Overhead | None:
        """The cost it carries within full determinism (what leaving it off saves); else its cost added alone."""
        return self.leave_one_out or self.add_one


@dataclass(frozen=True)
class HelperCost:
    """A library's one call for determinism, priced whole on one model: the switches it sets, what they cost against
    the default, and whether two runs under them stay bitwise identical."""

    call: str
    knobs: tuple[str, ...]
    differs: str
    priced_by: str
    """The comparison that priced it: its own (``helper:<key>``), or ``total`` where on the device it sets what
    deterministic mode sets."""
    cost: Overhead | None
    identical: bool | None
    check: str | None
    least: tuple[str, ...] | None = None
    """The least set of switches that holds bitwise (``ModelKnobs.least_set``) it is priced against; None: unknown."""
    over_least: ChainedRatio | None = None
    """What it costs beyond that least set: its own cost over the default divided by the least set's
    (``ModelKnobs.least_set_cost``); None where it could not be priced (``unpriced`` says why)."""
    unpriced: str = ""

    def line(self) -> str:
        """What it costs against the default and beyond the least set that holds bitwise, and whether the runs under
        it stay bitwise identical."""
        cost = "not measured" if self.cost is None else _interval(self.cost)
        same = " (on this device it sets what deterministic mode sets: the total)" if self.priced_by == TOTAL else ""
        held = f"; {self.check}" if self.check else ""
        differs = f"; {self.differs}" if self.differs else ""
        return f"{self.call}: {cost} over the default{same}{self._beyond_least()}{held}{differs}"

    def _beyond_least(self) -> str:
        if self.least is None or self.cost is None:
            return ""
        least = f"the least set that holds bitwise ({', '.join(self.least) or 'none of the switches'})"
        if self.over_least is None:
            return f"; beyond {least}: not priced ({self.unpriced})"
        o = self.over_least
        return f"; {_signed(o.ratio - 1)} [{_signed(o.ci_low - 1)}, {_signed(o.ci_high - 1)}] beyond {least}"


def least_set_line(least: tuple[str, ...] | None) -> str | None:
    """The least set of deterministic mode's switches that holds bitwise (``ModelKnobs.least_set``), in words."""
    if least is None:
        return None
    if not least:
        return (
            "the least set that holds bitwise here: none of the switches studied together (each could be left off "
            "alone with the runs still bitwise identical)"
        )
    return f"the least set that holds bitwise here: {', '.join(least)} (the runs part without each)"


@dataclass(frozen=True)
class ModelKnobs:
    """A model's knob study on one device and backend."""

    model: str
    backend: str
    device: str
    total: Overhead | None
    """Full determinism against the default, measured beside the arms."""
    knobs: list[KnobCost]
    failures: list[str]
    helpers: list[HelperCost] = field(default_factory=list)
    every: Overhead | None = None
    """Every switch on against the default (``EVERY``), where the study has more than full determinism: what its
    knobs' leave-one-out costs are taken within."""
    has_every: bool = False
    """Whether the study compared every switch on (``every`` is None where its runs failed)."""

    def least_set(self) -> tuple[str, ...] | None:
        """The fewest of the switches studied together (deterministic mode's, or every one on) with which the runs
        stay bitwise identical, read off the study's own checks: each one without which they part (or that was not
        checked), none that could go; None where all of them on parts or was not checked."""
        if not any(k.needed is not None for k in self.knobs):
            return None
        return tuple(k.knob for k in self.knobs if k.in_full and k.needed is not False)

    def least_set_cost(self) -> tuple[list[Overhead], list[Overhead]] | None:
        """The least set's cost over the default, as the comparisons it is taken through (``intervals.chained``): the
        switches studied together (the total, or every switch on), less the one switch that could go (its
        ``drop``); nothing at all where the least set is none of them (the default); None where no least set is
        known, or where some switches could go and others not (never measured left off together: their savings
        need not multiply)."""
        least = self.least_set()
        if least is None:
            return None
        if not least:
            return [], []
        together = self.every if self.has_every else self.total
        gone = [k for k in self.knobs if k.in_full and k.needed is False]
        if together is None or len(gone) > 1 or any(k.leave_one_out is None for k in gone):
            return None
        return [together], [k.leave_one_out for k in gone if k.leave_one_out is not None]

    def top(self, floor: float | None = None) -> KnobCost | None:
        """The knob whose leaving off saves most (else that costs most alone), among those measured: one whose cost
        is told from noise before one whose is not."""
        measured = [k for k in self.knobs if k.saving is not None]
        return max(
            measured,
            key=lambda k: (not within_noise(k.saving, floor), k.saving.ratio),  # type: ignore[union-attr]
            default=None,
        )

    def share(self, knob: KnobCost) -> tuple[float, float, float] | None:
        """The knob's saving as a share of the total overhead (of every switch on's, for a cost taken within it),
        with its interval (the total's point estimate as the denominator, on the log scale); None where the total is
        within noise and shares mean nothing."""
        within_every = self.has_every and knob.leave_one_out is not None
        total, saving = (self.every if within_every else self.total), knob.saving
        if total is None or saving is None or not total.has_interval or spans(total, NO_EFFECT):
            return None
        scale = math.log(total.ratio)
        return tuple(math.log(v) / scale for v in (saving.ratio, saving.ci_low, saving.ci_high))  # type: ignore[return-value]

    def advice(self, floor: float | None = None) -> str:
        """The first screen's line: the knob that costs most, its share of the overhead, and whether the model
        stays deterministic without it; then every other knob the model needs (what a user must not turn off)."""
        top = self.top(floor)
        if top is None or top.saving is None:
            return "no knob could be measured on this device" + (f" ({self.failures[0]})" if self.failures else "")
        saving = top.saving
        needed = "".join(f"; {k.knob} is {k.check}" for k in self.knobs if k.needed and k is not top)
        within = "with every switch on" if self.has_every else "in full determinism"
        what = f"{within} it costs" if top.leave_one_out is not None else "added alone it costs"
        if not saving.has_interval:
            return (
                f"{top.knob} costs most: {what} {_signed(saving.ratio - 1)} (one repeat: no interval, use --repeats 3 "
                f"or more){'; ' + top.check if top.check else ''}{needed}"
            )
        cost = _interval(saving)
        share = self.share(top)
        of_total = "" if share is None else f", {share[0]:.0%} [{share[1]:.0%}, {share[2]:.0%}] of the overhead"
        if within_noise(saving, floor):
            needed_too = f"; {top.knob} is {top.check}" if top.needed else ""
            alone = [
                k
                for k in self.knobs
                if k.leave_one_out is not None and k.add_one and not within_noise(k.add_one, floor)
            ]
            if alone:  # each saves nothing told from noise within full determinism, yet costs added alone
                added = ", ".join(f"{k.knob} {_interval(k.add_one)}" for k in alone)  # type: ignore[arg-type]
                costing = all(k.add_one.ratio > 1 for k in alone)  # type: ignore[union-attr]
                change = "they cost" if costing else "they change the step's time by"
                return (
                    f"leaving any one knob off saves nothing told from noise (the most, {top.knob}: {cost}), "
                    f"though added alone to the default {change}: {added}{needed_too}{needed}"
                )
            return f"every knob's cost is within noise (the most, {top.knob}: {cost}){needed_too}{needed}"
        if top.needed is False:
            return f"turn off {top.knob}: it costs {cost} of step time{of_total}; {top.check}{needed}"
        if top.needed:
            return f"{top.knob} costs most ({what} {cost}{of_total}) and is {top.check}{needed}"
        return f"{top.knob} costs most: {what} {cost}{of_total}" + (f"; {top.check}" if top.check else "") + needed

    def unexplained(self) -> float | None:
        """How much of the total's log overhead the add-one costs leave unexplained (0: they sum to it exactly;
        negative: they add up to more)."""
        adds = [k.add_one for k in self.knobs if k.add_one is not None]
        total = self.total
        if total is None or not adds or not total.has_interval or spans(total, NO_EFFECT):
            return None
        return 1 - sum(math.log(a.ratio) for a in adds) / math.log(total.ratio)

    def unexplained_line(self) -> str | None:
        """How far the knobs' costs added alone fall short of the total (or overshoot it), in words: they interact.
        None where ``unexplained`` is."""
        unexplained = self.unexplained()
        if unexplained is None:
            return None
        if unexplained < 0:
            return f"The knobs added alone add up to {-unexplained:.0%} more than the overhead: knobs interact."
        if unexplained >= 1:
            return "No knob added alone explains any of the overhead: it comes from knobs together (they interact)."
        return f"The knobs added alone leave {unexplained:.0%} of the overhead unexplained: knobs interact."


def by_reason(not_applicable: Mapping[str, str]) -> dict[str, list[str]]:
    """The knobs that cannot matter on the device (knob -> why), grouped by why: said a line (or a clause) each,
    cuDNN's two switches in one."""
    grouped: dict[str, list[str]] = {}
    for name, reason in not_applicable.items():
        grouped.setdefault(reason, []).append(name)
    return grouped


def model_knobs(
    records: Iterable[Mapping[str, Any]], checks: Mapping[tuple[str, str], Comparison], manifest: Mapping[str, Any]
) -> list[ModelKnobs]:
    """Every model of a knob study, in the order of its manifest (``sweep.knobs.knobs_manifest``)."""
    records = list(records)
    backend = backends.get(backends.named(manifest.get("backend")))
    studied = [backend.knob(name) for name in manifest.get("knobs", [])]
    not_applicable: dict[str, str] = dict(manifest.get("not_applicable") or {})
    every = frozenset(manifest.get(EVERY) or ())
    left_out_of = every or backend.mode_knobs()
    models = list(dict.fromkeys(str(r["model"]) for r in records))
    result = []
    for model in models:
        mine = [r for r in records if r["model"] == model]
        overheads = model_overheads(mine, key="comparison")
        cost = {name: headline(o.kernel, o.wall)[1] for name, o in overheads.items()}
        full = checks.get((model, EVERY if every else ""))
        knobs = []
        for knob in studied:
            reason = not_applicable.get(knob.name)
            if reason is None and knob.needs is not None and f"add:{knob.name}" not in cost:
                reason = f"alone it has no effect: it works only with {knob.needs}"
            check = checks.get((model, knob.name))
            knobs.append(
                KnobCost(
                    knob=knob.name,
                    setting=knob.setting,
                    does=knob.does,
                    applies=knob.name not in not_applicable,
                    reason=reason,
                    add_one=cost.get(f"add:{knob.name}"),
                    leave_one_out=cost.get(f"drop:{knob.name}"),
                    needed=_needed(full, check),
                    check=_check_words(full, check, "every switch on" if every else "full determinism"),
                    in_mode=knob.in_mode,
                    in_full=knob.name in left_out_of and knob.name not in not_applicable,
                )
            )
        failures = [f"{r['run_id']}: {r.get('reason') or r['status']}" for r in mine if r.get("status") != "ok"]
        helpers = _helper_costs(backend, manifest.get("helpers") or {}, cost, checks, model)
        first = mine[0]
        result.append(
            _priced_beyond_least(
                ModelKnobs(
                    model=model,
                    backend=backend.name,
                    device=str((first.get("device") or {}).get("label") or manifest.get("gpu_label") or "?"),
                    total=cost.get(TOTAL),
                    knobs=knobs,
                    failures=failures,
                    helpers=helpers,
                    every=cost.get(EVERY),
                    has_every=bool(every),
                )
            )
        )
    return result


def _priced_beyond_least(study: ModelKnobs) -> ModelKnobs:
    """Each helper priced beyond the least set that holds bitwise, where the study knows that set: its cost over the
    default divided by the least set's, taken through the comparisons that measured both."""
    least, through = study.least_set(), study.least_set_cost()
    helpers = []
    for h in study.helpers:
        over = None if through is None else _over(h.cost, *through)
        unpriced = (
            ""
            if over is not None
            else "the switches that could go were never left off together"
            if through is None
            else "a comparison it is taken through has no interval: use --repeats 3 or more"
        )
        helpers.append(replace(h, least=least, over_least=over, unpriced=unpriced))
    return replace(study, helpers=helpers)


def _over(cost: Overhead | None, least_over: list[Overhead], least_under: list[Overhead]) -> ChainedRatio | None:
    """``cost`` divided by the least set's cost (``least_over`` / ``least_under``). A comparison on both sides (a
    helper priced by the total, where the least set is the total) is one measurement: it cancels exactly, and a
    helper that sets what the least set sets costs nothing beyond it; one comparison left alone keeps its own
    interval."""
    if cost is None:
        return None
    over, under = [cost, *least_under], list(least_over)
    for shared in [o for o in over if any(o is u for u in under)]:
        over.remove(shared)
        under = [u for u in under if u is not shared]
    if not over and not under:
        return ChainedRatio(1.0, 1.0, 1.0, cost.confidence)
    if not under and len(over) == 1 and over[0].has_interval:
        (alone,) = over
        return ChainedRatio(alone.ratio, alone.ci_low, alone.ci_high, alone.confidence)
    return chained(over, under)


def _helper_costs(
    backend: backends.Backend,
    priced_by: Mapping[str, str],
    cost: Mapping[str, Overhead],
    checks: Mapping[tuple[str, str], Comparison],
    model: str,
) -> list[HelperCost]:
    """Each helper the study priced (``sweep.knobs.KnobDesign.helpers``), with its comparison's cost and check (full
    determinism's where the total priced it)."""
    found = []
    for helper in backend.helpers:
        name = priced_by.get(helper.key)
        if name is None:
            continue
        check = checks.get((model, "" if name == TOTAL else name))
        found.append(
            HelperCost(
                helper.call,
                tuple(sorted(helper.knobs)),
                helper.differs,
                name,
                cost.get(name),
                None if check is None else check.identical,
                None if check is None else _held_words(check),
            )
        )
    return found


def _held_words(check: Comparison) -> str:
    if check.identical is None:
        return f"not compared: {check.problem}"
    if check.identical:
        return f"bitwise identical over {counted(check.steps, 'step')}"
    return f"not bitwise reproducible (the runs part {check.parting()})"


def _interval(overhead: Overhead) -> str:
    if not overhead.has_interval:
        return f"{_signed(overhead.ratio - 1)} (one repeat)"
    return f"{_signed(overhead.ratio - 1)} [{_signed(overhead.ci_low - 1)}, {_signed(overhead.ci_high - 1)}]"


def _signed(fraction: float) -> str:
    """A signed percentage with one decimal; a value that rounds to zero is +0.0%, never -0.0%."""
    return f"{fraction if round(fraction, 3) != 0 else 0.0:+.1%}"


def _needed(full: Comparison | None, without: Comparison | None) -> bool | None:
    if full is None or without is None or not full.identical or without.identical is None:
        return None
    return not without.identical


def _check_words(full: Comparison | None, without: Comparison | None, reference: str) -> str | None:
    if without is None:
        return None
    if full is not None and full.identical is False:
        return f"{reference} itself is not bitwise reproducible here (the runs part {full.parting()})"
    if without.identical is None:
        return f"not compared: {without.problem}"
    if without.identical:
        return f"still bitwise identical over {counted(without.steps, 'step')} without it"
    return f"needed: without it the runs part {without.parting()}"


def knob_checks(store: ResultsStore) -> dict[tuple[str, str], Comparison]:
    """The bitwise checks of a knob study: (model, knob left off) -> the two runs compared; full determinism under the
    knob "", a helper's switches under its comparison's name (``helper:<key>``)."""
    by_arm: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in store.records():
        helper = f"{HELPER_COMPARISON}{record['helper']}" if record.get("helper") else ""
        arm = EVERY if record.get("every") else str(record.get("without") or helper)
        by_arm.setdefault((str(record["model"]), arm), []).append(record)
    result = {}
    for key, runs in by_arm.items():
        runs.sort(key=lambda r: str(r["replica"]))
        taken = [RunFingerprints.load(store.dir / r["fingerprints"]) for r in runs if r.get("fingerprints")]
        if len(taken) == 2:
            result[key] = compare("deterministic", *taken)
        else:
            failed = next((str(r.get("reason")) for r in runs if r.get("status") != "ok"), "")
            result[key] = Comparison("deterministic", None, 0, 0, problem=f"{len(taken)} of 2 runs recorded {failed}")
    return result


def read_knob_study(store: ResultsStore) -> list[ModelKnobs]:
    """A knob study's models, its checks read from the study's own ``knob_checks`` folder."""
    checks_store = ResultsStore(store.dir, "knob_checks")
    checks = knob_checks(checks_store) if checks_store.exists() else {}
    return model_knobs(store.records(), checks, store.manifest().get("config") or {})


def helper_lines(study: ModelKnobs) -> list[str]:
    """The least set that holds bitwise, then each library helper priced whole: what a report lists under the knobs."""
    if not study.helpers:
        return []
    least = least_set_line(study.least_set())
    return [*([least] if least else []), *(helper.line() for helper in study.helpers)]


def helpers_json(study: ModelKnobs) -> list[dict[str, Any]]:
    """The JSON report's ``helpers`` of one model: each helper priced, its switches, cost and check."""
    return [
        {
            "call": h.call,
            "knobs": list(h.knobs),
            "priced_by": h.priced_by,
            "cost": None if h.cost is None else {"ratio": h.cost.ratio, "lo": h.cost.ci_low, "hi": h.cost.ci_high},
            "least_set": None if h.least is None else list(h.least),
            "over_least_set": None
            if h.over_least is None
            else {"ratio": h.over_least.ratio, "lo": h.over_least.ci_low, "hi": h.over_least.ci_high},
            "identical": h.identical,
            "line": h.line(),
        }
        for h in study.helpers
    ]


def knobs_json(study: ModelKnobs, floor: float | None = None) -> list[dict[str, Any]]:
    """The JSON report's ``knobs`` of one model: every studied knob, applicable or not."""

    def interval(overhead: Overhead | None) -> dict[str, float] | None:
        if overhead is None:
            return None
        return {"ratio": overhead.ratio, "lo": overhead.ci_low, "hi": overhead.ci_high, "repeats": overhead.n}

    rows = []
    for knob in study.knobs:
        share = study.share(knob)
        rows.append(
            {
                "knob": knob.knob,
                "setting": knob.setting,
                "applies": knob.applies,
                "reason": knob.reason,
                "in_mode": knob.in_mode,
                "add_one": interval(knob.add_one),
                "leave_one_out": interval(knob.leave_one_out),
                "add_one_within_noise": within_noise(knob.add_one, floor),
                "leave_one_out_within_noise": within_noise(knob.leave_one_out, floor),
                "share": None if share is None else {"share": share[0], "lo": share[1], "hi": share[2]},
                "needed": knob.needed,
                "check": knob.check,
            }
        )
    return rows
