"""What each part of a GPU study is expected to take, and where that figure comes from.

Every estimate is built from what a GPU measured: first what this study's own windows measured
(its records and its parts' seconds), then what the last GPU run shipped with detprof measured on
the same GPU (``gpu_reference``); where neither has the model, a measured model of its family (on
its backend first, else the model itself on another backend, else its family there), then of the family built most
like it (``RELATED_FAMILIES``), each saying which; only where none of those was measured, an estimate per model
family. A repeat measured with both modes in one process and one measured with a
process per mode differ by the process the second one starts again, so a figure measured one way is scaled to the
other (by the ratio this study's pairing check measured on the backend, else ``APART_REPEAT_FACTOR``), and the
source says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from detprof.analysis.pairing_check import Route
from detprof.models import registry
from detprof.reports.gpu_reference import GpuMeasurement

APART_REPEAT_FACTOR = 1.5
"""A process per mode starts, builds and compiles the model once per mode instead of once per repeat: what a repeat
measured one way is taken to cost the other, until the study has measured it (the H100's in-process JAX repeats and
its PyTorch repeats of a process per mode, reference/h100-2026-11-28, agree with it within their spread)."""
VERIFY_RUN_SHARE = 0.5
"""A verify run trains one mode of one model for a few steps, in a worker that runs its replica's other models too:
half a measured repeat (both modes, in one process) of that model."""
REUSED_REST_S = 3.0
"""A repeat that re-runs the steps its process built for the model's first (``--shared-repeats``): beyond its
measured steps, a warm-up round of each mode, the tracer's start and stop, and its trace parsed; until the study
measured one (its records' ``steps_reused``). Where a model's measured steps are not known, none is saved."""
RELATED_FAMILIES: Mapping[str, str] = {
    "moe": "gpt",
    "llama": "gpt",
    "resnet": "keras-applications",
    "small-cnn": "medium-cnn",
}
"""For a family none of whose models a GPU measured, the family built most like it: detprof's mixture of experts is
its GPT with expert layers, a Llama-style decoder a GPT-style one with other norms and activations, the ResNets
residual CNNs as the Keras applications' ResNet-50 is, the small CNNs the medium CNNs with fewer filters."""
WORKER_START_S = 8.0
"""A worker's start on a GPU machine (Python, the framework and Keras imported, the device initialised), where the
study has measured none yet (its records' ``start`` and ``device`` parts): what a process of its own adds."""


@dataclass(frozen=True)
class Measured:
    """One repeat of a model, both modes, as a GPU measured it."""

    seconds: float
    steps_s: float | None
    """Of those, its measured steps' seconds."""
    route: Route
    source: str
    """Where it was measured: "this study", or the GPU and date of a shipped run."""


@dataclass(frozen=True)
class Estimate:
    seconds: float
    steps_s: float
    """Of those, the measured steps it is expected to run (0 where none is known)."""
    source: str
    stand_ins: tuple[tuple[str, str], ...] = ()
    """Each link by which an unmeasured model in it was estimated from another: (the model of the part it stands
    for, "MODEL as OTHER on BACKEND (why)"); a stand-in itself estimated adds its own link under the same model."""

    def times(self, factor: float) -> Estimate:
        return replace(self, seconds=self.seconds * factor, steps_s=self.steps_s * factor)

    @property
    def like(self) -> tuple[str, ...]:
        return tuple(text for _, text in self.stand_ins)

    @property
    def cited(self) -> str:
        """Its source, with the measured model each unmeasured one was estimated from."""
        return f"{self.source}: {', '.join(self.like)}" if self.like else self.source


def summed(estimates: Sequence[Estimate], start_s: float = 0.0) -> Estimate:
    """The estimates of several units added, and ``start_s`` of a command's own; the source: the first measured one,
    with how many were measured where others were estimated, each estimated one's clauses once."""
    sources = [e.source for e in estimates]
    measured = [s for s in sources if not s.startswith("estimated")]
    estimated = "; ".join(dict.fromkeys(c for s in sources if s.startswith("estimated") for c in s.split("; ")))
    if not sources:
        source = "estimated"
    elif not estimated:
        source = measured[0]
    elif not measured:
        source = estimated
    else:
        source = f"{measured[0]} for {len(measured)} of {len(sources)}, else {estimated}"
    stand_ins = tuple(dict.fromkeys(link for e in estimates for link in e.stand_ins))
    return Estimate(start_s + sum(e.seconds for e in estimates), sum(e.steps_s for e in estimates), source, stand_ins)


@dataclass(frozen=True)
class Costs:
    """Seconds of one repeat per backend and model, measured on a GPU where known; the kinds' own costs learned."""

    measured: Mapping[tuple[str, str], Measured] = field(default_factory=dict)
    family_repeat_s: Mapping[str, float] = field(default_factory=dict)
    """Estimated seconds of one in-process repeat of a model of each family, where nothing like it was measured
    (``relative``; ``*``: any other family)."""
    verify_run_s: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """(backend, model): seconds one verify run took in this study."""
    stability_run_s: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """(backend, model): seconds one stability run took in this study."""
    worker_start_s: Mapping[str, float] = field(default_factory=dict)
    """Backend: the seconds a worker took to start and initialise the device in this study (its records' parts)."""
    reused_repeat_s: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """(backend, model): seconds a repeat that re-ran its process's steps took in this study."""
    apart_factor: Mapping[str, float] = field(default_factory=dict)
    """Backend: a repeat with a process per mode over one in one process, as this study measured both (the pairing
    check's models, the median); ``APART_REPEAT_FACTOR`` where it has not."""

    def repeat(self, backend: str, model: str, route: Route) -> Estimate:
        """One repeat of ``model`` paired by ``route``: as measured that way, else scaled from the other way, else
        as a model like it (``relative``), else its family's guess."""
        known = self.measured.get((backend, model))
        if known is None and (relative := self.relative(backend, model)) is not None:
            other_backend, other, why = relative
            estimate = self.repeat(other_backend, other, route)
            link = f"{model} as {'measured' if other == model else other} on {other_backend}{why}"
            stand_ins = ((model, link), *((model, text) for text in estimate.like))
            estimated = estimate.source.startswith("estimated")  # a stand-in itself estimated: as it was
            source = estimate.source if estimated else "estimated from a measured model like it"
            return Estimate(estimate.seconds, estimate.steps_s, source, stand_ins)
        if known is None:
            family = spec.family if (spec := registry.BUILT_IN.get(model)) is not None else "*"
            seconds = self.family_repeat_s.get(family, self.family_repeat_s.get("*", 30.0))
            estimate = Estimate(seconds, 0.0, f"estimated for a {family} model")
            return estimate.times(self.apart(backend)) if route == "processes" else estimate
        if known.route == route:
            return Estimate(known.seconds, known.steps_s or 0.0, f"measured {known.source}")
        apart = self.apart(backend)
        factor = apart if route == "processes" else 1 / apart
        how = "one process" if route == "in_process" else "a process per mode"
        learned = f" ({apart:.2f}x, as this study's pairing check measured)" if backend in self.apart_factor else ""
        return Estimate(
            known.seconds * factor, known.steps_s or 0.0, f"measured {known.source}, scaled to {how}{learned}"
        )

    def apart(self, backend: str) -> float:
        """A repeat with a process per mode over one in one process, on ``backend``."""
        return self.apart_factor.get(backend, APART_REPEAT_FACTOR)

    def relative(self, backend: str, model: str) -> tuple[str, str, str] | None:
        """The model that an unmeasured ``model``'s repeat is estimated from: its backend, its name and why it was
        chosen ("" where it is ``model`` itself). A library's model: the registry model of its size
        (``registry.LIBRARY_MODELS``), itself estimated where not measured. A registry model: a measured one of its
        family on ``backend``, ``model`` on another backend, its family there, then the related family's
        (``RELATED_FAMILIES``) on ``backend`` and elsewhere; of several, the one of median cost (the costlier of
        two), so that one model's figure is cited whole."""
        if (stand_in := registry.LIBRARY_MODELS.get(model)) is not None:
            return backend, stand_in, " (its size)"
        spec = registry.BUILT_IN.get(model)
        if spec is None:
            return None
        related = RELATED_FAMILIES.get(spec.family)
        searches: list[tuple[list[tuple[str, str]], str]] = [
            (self._of_family(spec.family, backend, here=True), f" (its family, {spec.family})"),
            ([(b, m) for b, m in self.measured if m == model], ""),
            (self._of_family(spec.family, backend, here=False), f" (its family, {spec.family})"),
        ]
        if related is not None:
            why = f" (a {related} model: no {spec.family} model was measured)"
            searches += [
                (self._of_family(related, backend, here=True), why),
                (self._of_family(related, backend, here=False), why),
            ]
        for found, why in searches:
            if found:
                ranked = sorted(found, key=lambda key: self.repeat(*key, "in_process").seconds)
                return (*ranked[len(ranked) // 2], why)
        return None

    def _of_family(self, family: str, backend: str, *, here: bool) -> list[tuple[str, str]]:
        """The measured (backend, model)s of ``family``: on ``backend`` (``here``), else on the others."""
        return [
            (b, m)
            for b, m in self.measured
            if (b == backend) == here and (spec := registry.BUILT_IN.get(m)) is not None and spec.family == family
        ]

    def repeats(self, backend: str, model: str, route: Route, count: int, *, shared: bool = False) -> Estimate:
        """``count`` repeats of ``model``: each its own process, or (``shared``) the first building the steps that
        the others re-run in its process."""
        first = self.repeat(backend, model, route)
        if not shared or count < 2:
            return first.times(count)
        again = self.reused_repeat(backend, model, first)
        steps = first.steps_s * count
        source = f"{first.source}; {again.source}"
        return Estimate(first.seconds + again.seconds * (count - 1), steps, source, first.stand_ins)

    def reused_repeat(self, backend: str, model: str, first: Estimate) -> Estimate:
        """A repeat that re-runs the steps ``first`` built: as measured in this study, else its measured steps and
        ``REUSED_REST_S``, else (its steps unknown) as long as ``first``."""
        if (backend, model) in self.reused_repeat_s:
            return Estimate(
                self.reused_repeat_s[backend, model], first.steps_s, "a re-run repeat measured in this study"
            )
        if not first.steps_s:
            return Estimate(first.seconds, 0.0, "a re-run repeat taken as a whole one")
        again = min(first.seconds, first.steps_s + REUSED_REST_S)
        return Estimate(again, first.steps_s, f"a re-run repeat as its measured steps and {REUSED_REST_S:g} s")

    def verify_run(self, backend: str, model: str) -> Estimate:
        """One verify run (one mode, a few steps) in a worker of several: as measured in this study, else half a
        repeat of the model in one process."""
        if (backend, model) in self.verify_run_s:
            return Estimate(self.verify_run_s[backend, model], 0.0, "measured in this study")
        pair = self.repeat(backend, model, "in_process")
        source = f"{pair.source}; a verify run taken as half a repeat"
        return Estimate(pair.seconds * VERIFY_RUN_SHARE, 0.0, source, pair.stand_ins)

    def worker_start(self, backend: str) -> Estimate:
        """What a worker of its own adds: its start and the device's initialisation."""
        if backend in self.worker_start_s:
            return Estimate(self.worker_start_s[backend], 0.0, "measured in this study")
        return Estimate(WORKER_START_S, 0.0, "estimated (a worker's start, until a window measures it)")

    def stability_run(self, backend: str, model: str, estimated_s: float) -> Estimate:
        if (backend, model) in self.stability_run_s:
            return Estimate(self.stability_run_s[backend, model], 0.0, "measured in this study")
        return Estimate(estimated_s, 0.0, "estimated (no stability run measured on a GPU yet)")


def shipped_measured(rows: Iterable[GpuMeasurement], taken_for: str = "") -> dict[tuple[str, str], Measured]:
    """The newest shipped measurement of each (backend, model) among ``rows`` (one GPU's); ``taken_for``: the GPU
    (and why) they stand in for, where it is another."""
    found: dict[tuple[str, str], Measured] = {}
    for row in sorted(rows, key=lambda row: row.date):
        if row.repeat_s:
            route: Route = "processes" if row.pairing == "processes" else "in_process"
            source = f"on {row.gpu}, {row.date}" + (f", taken for {taken_for}" if taken_for else "")
            found[row.backend, row.model] = Measured(row.repeat_s, row.steps_s, route, source)
    return found
