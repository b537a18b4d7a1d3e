"""``detprof sweep --knobs``: what each determinism switch costs alone, and what leaving it off saves.

Determinism is several switches (``Backend.knobs``), and one often carries most of the cost.
Each comparison is a pair of arms measured as the sweep measures its two modes (the same
paired repeats, lockstep on a CPU, one after the other on a GPU), arm ``a`` the reference and
arm ``b`` the treated one, so every figure is a paired ratio b/a with its interval:

- ``total``: the default against full determinism (the sweep's own overhead, as the share's
  denominator);
- ``add:K``: the default against the default plus knob K alone ("what this switch costs");
- ``drop:K``: full determinism without K against full determinism: the cost K carries within full
  determinism ("what leaving it off saves");
- ``every``: the default against every switch users set for determinism, the mode's and the extra ones that join
  it (``Knob.in_every``: XLA's exclusion of nondeterministic ops, its autotuning level, its scatter expander); where
  the device takes such a switch, each ``drop:K`` is taken within ``every`` instead, so that an extra switch is
  left out too (whether deterministic ops could go where the others hold);
- ``helper:H``: the default against the switches a library's one call sets (``Backend.helpers``: Hugging Face's
  ``enable_full_determinism``, ...), priced whole; a helper that sets on the device what another comparison's arm
  sets (on a CPU, each sets what deterministic mode does) is priced by that comparison, not run again.

A knob that cannot matter on the device (cuDNN on a CPU) is listed with the reason, not run;
one that works only with another knob (PyTorch's fill under deterministic algorithms) is not
priced alone. Every ``drop`` arm is then verified bitwise (``verify.run``): whether the model
stays deterministic without that knob, which turns a cost into advice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from detprof.analysis.knobs import EVERY, TOTAL
from detprof.backends import get
from detprof.backends.base import HELPER_COMPARISON, Backend, Knob
from detprof.determinism import Mode
from detprof.errors import UsageError
from detprof.models import registry
from detprof.option_values import comma_separated
from detprof.profiler.measured_runs import MeasurementTarget, PlannedRun, mode_order
from detprof.profiler.sweep_request import SweepConfig
from detprof.sweep.sweep_runs import RunSlot, model_run

Side = Literal["a", "b"]


@dataclass(frozen=True)
class Comparison:
    """One pair of arms: ``reference`` (arm a) against ``treated`` (arm b), each a set of knobs."""

    name: str
    """``total``, ``add:<knob>`` or ``drop:<knob>``: what records and reports call it."""
    reference: frozenset[str]
    treated: frozenset[str]

    def knobs(self, side: Side) -> tuple[str, ...]:
        return tuple(sorted(self.reference if side == "a" else self.treated))

    @property
    def slug(self) -> str:
        """The comparison in a run id."""
        return self.name.replace(":", "-")


@dataclass(frozen=True)
class KnobDesign:
    """A backend's knobs on one device: which are priced how, and which are listed with the reason they are not."""

    backend: str
    knobs: tuple[Knob, ...]
    """The knobs studied (``--knobs``: some), in the backend's order."""
    not_applicable: dict[str, str]
    """Knob name: why it cannot matter on this device (not run)."""
    comparisons: tuple[Comparison, ...]
    full: frozenset[str]
    """Full determinism: the knobs deterministic mode sets (all of them, even those studied not)."""
    every: frozenset[str] = frozenset()
    """Where it is more than ``full``: full determinism and the extra switches studied that join it
    (``Knob.in_every``) on the device, which each ``drop`` arm leaves one out of; else empty."""
    helpers: dict[str, str] = field(default_factory=dict)
    """Each helper priced (``Backend.helpers``, by key): the comparison that prices it, its own or one whose arm
    sets the same switches on the device."""

    def dropped(self) -> list[str]:
        """The knobs whose leave-one-out arm runs, each verified bitwise."""
        return [c.name.removeprefix("drop:") for c in self.comparisons if c.name.startswith("drop:")]

    @property
    def left_out_of(self) -> frozenset[str]:
        """The switches each ``drop`` arm leaves one out of: ``every`` where there is one, else ``full``."""
        return self.every or self.full


def knob_design(
    backend: Backend, on_gpu: bool, only: tuple[str, ...] | None, models: Sequence[str] = (), compiled: bool = False
) -> KnobDesign:
    """The comparisons of a knob study of ``backend`` (``only``: the knobs named by ``--knobs``) of ``models``: a knob
    of attention is priced where one of them runs attention (``registry.runs_attention``: a transformer), or may (a
    model of your own) and the knob is named; a study of models without attention leaves it out, unless named."""
    names = backend.knob_names()
    helper_keys = tuple(helper.key for helper in backend.helpers)
    unknown = [name for name in only or () if name not in names and name not in helper_keys]
    if unknown:
        helpers = f"; its helpers: {', '.join(helper_keys)}" if helper_keys else ""
        raise UsageError(
            f"--knobs: {', '.join(unknown)} is not a knob of {backend.name}; its knobs: {', '.join(names)}{helpers} "
            f"(detprof knobs --backend {backend.name})"
        )
    runs = [registry.runs_attention(model) for model in models]
    attention = any(runs) or (only is not None and None in runs)
    studied = tuple(
        knob
        for knob in backend.knobs
        if (knob.name in only if only is not None else attention or not knob.attention_only)
    )
    full = backend.mode_knobs()
    not_applicable = {
        knob.name: reason for knob in studied if (reason := knob.applies(on_gpu, attention, compiled)) is not None
    }
    measured = [knob for knob in studied if knob.name not in not_applicable]
    every = full | {knob.name for knob in measured if knob.in_every}
    comparisons = [Comparison(TOTAL, frozenset(), full)]
    if every != full:
        comparisons.append(Comparison(EVERY, frozenset(), every))
    for knob in measured:
        if knob.needs is None:
            comparisons.append(Comparison(f"add:{knob.name}", frozenset(), frozenset({knob.name})))
        if knob.name in every:
            comparisons.append(Comparison(f"drop:{knob.name}", every - {knob.name}, every))
    helpers = _helpers(backend, on_gpu, full, comparisons, only)
    routes = _with_routes(backend, not_applicable)
    extra = every if every != full else frozenset()
    return KnobDesign(backend.name, studied, routes, tuple(comparisons), full, every=extra, helpers=helpers)


def _with_routes(backend: Backend, not_applicable: dict[str, str]) -> dict[str, str]:
    """Each knob that cannot matter on this device only because it is a GPU's, with how a GPU's study sets it."""
    return {
        name: f"{reason}; on a GPU, {backend.knob_route(knob)}" if reason == knob.gpu_only else reason
        for name, reason in not_applicable.items()
        for knob in [backend.knob(name)]
    }


def _helpers(
    backend: Backend,
    on_gpu: bool,
    full: frozenset[str],
    comparisons: list[Comparison],
    only: tuple[str, ...] | None,
) -> dict[str, str]:
    """Each of the backend's helpers studied (every one, or those ``--knobs`` names), by key, with the comparison
    that prices it: one of its own (appended to ``comparisons``), or the full determinism's or another helper's
    where that sets the same switches here."""
    priced = {backend.applying(full, on_gpu): TOTAL}
    helpers = {}
    for helper in backend.helpers:
        if only is not None and helper.key not in only:
            continue
        here = backend.applying(helper.knobs, on_gpu)
        if here not in priced:
            comparisons.append(Comparison(f"{HELPER_COMPARISON}{helper.key}", frozenset(), helper.knobs))
            priced[here] = comparisons[-1].name
        helpers[helper.key] = priced[here]
    return helpers


ALL_KNOBS = "all"
"""What a bare ``--knobs`` stands for."""


def split_knobs(knobs: str | None) -> tuple[str, ...] | None:
    """``--knobs`` as given: None (every knob) for the bare flag or "all", else the names."""
    if knobs is None or knobs.strip().lower() in ("", ALL_KNOBS):
        return None
    return comma_separated(knobs)


def knob_settings(config: SweepConfig, target: MeasurementTarget, plan: KnobDesign) -> SweepConfig:
    """The sweep's settings as a knob study measures them: the repeats asked for (no precision, so that every
    comparison has as many), paired as asked, except the comparisons whose arms cannot share a process (a knob set
    once per process, such as cuBLAS's workspace): those take a process per arm (``RunSettings.apart``), the rest
    of a repeat one process as asked; where no comparison can share one, the whole study takes a process per arm,
    and a process per repeat (``--shared-repeats`` does not apply)."""
    apart = comparisons_apart(plan, target.on_gpu, compile=config.compile)
    if config.pairing == "in_process" and len(apart) < len(plan.comparisons):
        return replace(config, precision=None, budget_s=None, apart=apart)
    pairing = target.pairing if apart else config.pairing
    shared = config.shared_repeats and pairing == "in_process"
    return replace(config, precision=None, budget_s=None, pairing=pairing, shared_repeats=shared)


def comparisons_apart(plan: KnobDesign, on_gpu: bool, *, compile: bool = False) -> tuple[str, ...]:
    """The comparisons whose arms cannot share a process on the device (``process_starts``)."""
    return tuple(name for name, starts in process_starts(plan, on_gpu, compile=compile).items() if starts is None)


def process_starts(plan: KnobDesign, on_gpu: bool, *, compile: bool = False) -> dict[str, frozenset[str] | None]:
    """Per comparison, what a process that runs both its arms starts with on the device (``Backend.process_knobs``);
    None where the arms cannot share one (``Backend.shared_process_refusal``: a knob a process takes when it starts,
    set by one arm and not the other), the knobs that cannot matter there left out."""
    backend = get(plan.backend)
    starts: dict[str, frozenset[str] | None] = {}
    for c in plan.comparisons:
        arms = [backend.applying(c.reference, on_gpu), backend.applying(c.treated, on_gpu)]
        apart = backend.shared_process_refusal(arms, compile=compile, on_gpu=on_gpu)
        starts[c.name] = None if apart else backend.process_knobs(arms, on_gpu)
    return starts


def plan_knob_runs(config: SweepConfig, plan: KnobDesign) -> list[PlannedRun]:
    """Repeat by repeat, model by model, comparison by comparison, the two arms back to back, their order
    alternating by repeat as the sweep's modes do (``plan.mode_order``)."""
    runs = []
    for repeat in range(config.repeats):
        for model in config.model_plans():
            for comparison in plan.comparisons:
                sides: tuple[Side, Side] = ("a", "b") if mode_order(repeat)[0] == "deterministic" else ("b", "a")
                for side in sides:
                    knobs = comparison.knobs(side)
                    mode: Mode = "deterministic" if knobs else "default"
                    fields = {"arm": side, "comparison": comparison.name, "knobs": list(knobs)}
                    shown = f"{comparison.name} {side}"
                    slot = RunSlot(mode, f"{comparison.slug}--{side}", shown, fields, knobs)
                    runs.append(model_run(config, model, repeat, slot))
    return runs


def knobs_manifest(config: SweepConfig, plan: KnobDesign) -> dict[str, object]:
    """The sweep's configuration and the comparisons: a study of other knobs does not resume into this one."""
    return (
        config.manifest()
        | {
            "knobs": [knob.name for knob in plan.knobs],
            "comparisons": [c.name for c in plan.comparisons],
            "not_applicable": plan.not_applicable,
            "helpers": plan.helpers,
        }
        | ({EVERY: sorted(plan.every)} if plan.every else {})
    )
