"""The GPU study's plan: its parts in the order of their value, each a ``detprof`` command line and its expected time.

A GPU lease is short and rare, so the first window answers what no other machine can, each question at
the smallest size that answers it: whether pairing the two modes in one process measures what a
process started in each mode gets (the pairing check, on each backend), what determinism buys
(implementation noise against control), whether it holds (``verify`` of a CNN and a transformer), and
which switch pays (a knob study of few steps), and what it costs JAX users' own kind of model (the registry's
Flax NNX models, on JAX). Then the native PyTorch models people train (Hugging Face's, then torchvision's and
timm's as users name them, on PyTorch), a knob study of a Flax GPT (each of XLA's switches), the overhead of the
paper's medium CNN and a GPT, the rest of the zoo, the models whose pairs failed in one process (a process per
mode), the full knob studies, stability and ``verify`` of the rest. Overhead parts pair the modes as the pairing
check found valid on their backend: in one process where the two routes agree, else a process per mode. The
pairing check's third sweep asks whether a model's repeats may share one process (``--shared-repeats``: the steps
built once, re-run for each repeat) against a process per repeat; where it agrees, or until it has answered, the
overhead parts and the knob studies run their repeats that way. A check that could not tell is run once more where
more repeats would answer it within a window (``FollowUp``), after every backend's first repeats, and the parts it
decides wait for it. A part longer than a window is split so that every window ends with finished parts.

Expected times come from ``costs``: what this study's own windows measured, else what the last GPU run
kept in the repository measured, else a measured model like it (of its family, ``costs.Costs.relative``), else an
estimate per model family, each saying which.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from detprof import backends
from detprof.analysis.pairing_check import PAIRING, REPEATS, PairingAnswer, Ways
from detprof.gpu_study.costs import Costs, Estimate, Route, summed
from detprof.intervals import MIN_REPEATS
from detprof.models import registry

PartKind = Literal["pairing", "overhead", "knobs", "stability", "verify"]
KINDS: tuple[PartKind, ...] = ("pairing", "overhead", "knobs", "stability", "verify")
OVERHEAD_SHARE = 0.55
"""The share of a window's budget the overhead parts take, split evenly: what is left of a part's share after its
first repeats bounds the repeats it adds for precision (``sweep --budget``)."""
DEFAULT_BUDGET_S = 600.0
"""10 minutes: a 15-minute window keeps room for the machine's start and the transfers."""
FINISH_S = 30.0
"""Kept at a window's end for what every window writes after its parts: the report and the bundle."""
GRACE_S = 20.0
"""What a stopped part may take to stop its workers and write its records: kept out of the window's budget."""
COMMAND_START_S = 4.0
"""What a ``detprof`` command costs before its first run: Python, detprof, the plan."""
CHECK_RUNS = 2
"""A knob study verifies each arm that leaves a knob out twice, each in a worker of its own."""
APART = "apart"
"""The overhead part that reruns, with a process per mode (``--pairing processes``), the models whose pairs failed
in one process: on an H100, XLA failed to run gpt_small's and moe_small's step compiled with deterministic ops as
a compile option in a process started without them (reference/h100-2026-11-28); a process of its own is started
with the flag in ``XLA_FLAGS``, as a user's program is, and says whether the failure is the pairing's or the
mode's."""
NATIVE = "native"
"""The overhead part of the native PyTorch models (``Scale.native``)."""
LIBRARIES = "libraries"
"""The overhead part of torchvision's and timm's models (``Scale.libraries``), named as a user names them."""
FLAX = "flax"
"""The overhead part of the Flax NNX models (``Scale.flax``), on JAX in the first window."""
STABILITY_VARIANTS = ("impl", "control")
"""Implementation noise alone (same seed, default mode) against control (deterministic): what determinism buys."""
ROUTES: dict[Route, str] = {"in_process": "in-process", "processes": "processes"}
"""Each way of pairing the modes as ``--pairing`` names it."""
WAYS: tuple[tuple[str, Route, tuple[str, ...]], ...] = (
    ("in-process", "in_process", ()),
    ("processes", "processes", ()),
    ("shared", "in_process", ("--shared-repeats",)),
)
"""The pairing check's sweeps: each one's name, how it pairs the modes and what more it asks (repeats sharing a
process, for the repeats check)."""
CHECKS: tuple[tuple[str, str, str, Ways], ...] = (
    ("pairing", "in-process", "processes", PAIRING),
    ("shared", "shared", "in-process", REPEATS),
)
"""Each check (as ``StudyState`` keeps its answers): the way it holds to the other (the cheap one, then the one it
must stand for), by ``WAYS``'s names, and how its answers name them."""


def check_part(backend: str, way: str, *, more: bool = False) -> str:
    """The part that sweeps one way of ``backend``'s checks (``WAYS``), or (``more``) its follow-up's."""
    return f"{backend}-pairing-{way}" + ("-more" if more else "")


ROUTED: tuple[PartKind, ...] = ("overhead", "knobs")
"""The kinds of part that pair the modes as the backend's pairing check finds."""


@dataclass(frozen=True)
class Scale:
    """What the study runs at one scale: the models of each part, and every command's sizes."""

    name: str
    first: tuple[str, ...]
    """The overhead models the study answers for first, on every backend."""
    rest: tuple[str, ...]
    native: tuple[str, ...]
    """The native PyTorch registry models (``hf_*``), swept on PyTorch right after the first window's checks."""
    libraries: tuple[str, ...]
    """torchvision's and timm's model functions (``registry.LIBRARY_MODELS``), swept on PyTorch after the native
    models where both packages are installed (a GPU image has them; their wheels do not import beside a CPU build
    of PyTorch)."""
    flax: tuple[str, ...]
    """The Flax NNX registry models (``flax_*``), swept on JAX at the first window's end: JAX users' own kind of
    model, on the backend where determinism has cost most."""
    flax_knobs: str | None
    """The Flax model whose knob study prices each of XLA's switches, first of the later windows' parts: a model with
    an embedding, whose gradient is the scatter that XLA's deterministic ops and its scatter expander rewrite."""
    sweep: tuple[str, ...]
    """The sweep's options (the pairing check, the overhead parts and the knob studies)."""
    repeats: int
    precision: str
    pairing: Mapping[str, tuple[str, ...]]
    """Per backend, the models of the pairing check: measured both ways, their overheads the study's too."""
    pairing_repeats: int
    pairing_follow_up: bool
    """Whether a check whose first repeats could not tell is run once more, with as many repeats as would answer it
    (``FollowUp``)."""
    stability_first: tuple[tuple[str, tuple[str, ...]], ...]
    """The first window's stability parts: each model with its options, at the smallest size that answers."""
    stability: tuple[tuple[str, tuple[str, ...]], ...]
    """The later windows' stability parts, at the size the study answers with."""
    verify: tuple[str, ...]
    """``verify``'s options."""
    verify_first: tuple[str, ...]
    """The models verified in the first window (a CNN and a transformer); the rest are verified later."""
    knobs: Mapping[str, str]
    """Per backend, the knobs its knob studies price (``--knobs``); ``all`` for a backend not listed."""
    knobs_first: tuple[str, ...]
    """The options that make the first window's knob study small (few steps), over the sweep's."""
    knobs_first_named: Mapping[str, str]
    """Per backend, the knobs the first window's knob study prices, where not ``knobs``'s: the switches of its mode
    that can matter on a GPU, and none that a process takes only when it starts (which would take a process per
    arm for every comparison)."""
    full_knobs: bool
    """Whether later windows run the knob study of the model that paid most, at the sweep's size."""
    family_repeat_s: Mapping[str, float]
    """Estimated seconds of one repeat (both modes, one process) of a model of each family, where no model of its
    family or the family built most like it was measured; ``*`` for a family not listed."""
    stability_run_s: Mapping[str, float]
    """Estimated seconds of one stability run of each model, where the study measured none."""

    @property
    def models(self) -> tuple[str, ...]:
        return (*self.first, *self.rest)


GPU_SWEEP = ("--preset", "paper", "--steps", "10", "--warmup", "3", "--batch-size", "64")
SCALES: dict[str, Scale] = {
    "gpu": Scale(
        name="gpu",
        first=("mediumcnn_k1", "mediumcnn_k3", "mediumcnn_k5", "mediumcnn_k7", "gpt_small"),
        rest=("moe_small", "vit_small", "vgg19", "resnet50", "densenet121", "mobilenet", "efficientnetb0"),
        native=("hf_resnet50_small", "hf_vit_small", "hf_gpt2_small", "hf_llama_small"),
        libraries=tuple(registry.LIBRARY_MODELS),
        flax=("flax_resnet_small", "flax_gpt_small"),
        flax_knobs="flax_gpt_small",
        sweep=GPU_SWEEP,
        repeats=2,
        precision="2%",
        pairing={backends.JAX: ("mediumcnn_k5", "gpt_small"), backends.TORCH: ("mediumcnn_k3",)},
        pairing_repeats=2,
        pairing_follow_up=True,
        stability_first=(("smallcnn", ("--dataset", "digits", "--runs", "2", "--epochs", "15")),),
        stability=(
            ("smallcnn", ("--dataset", "digits", "--runs", "3", "--epochs", "30")),
            ("gpt_tiny", ("--dataset", "markov", "--runs", "3", "--epochs", "20")),
        ),
        verify=("--steps", "5", "--batch-size", "16"),
        verify_first=("mediumcnn_k3", "gpt_small"),
        knobs={},
        knobs_first=("--steps", "3", "--warmup", "2"),
        knobs_first_named={
            backends.JAX: "jax.xla_gpu_deterministic_ops,jax.xla_gpu_autotune_level",
            backends.TORCH: "torch.use_deterministic_algorithms,torch.cudnn_deterministic",
        },
        full_knobs=True,
        # An H100 (reference/h100-2026-11-27): the medium CNNs 12-35 s a repeat, the Keras applications 26-48 s.
        family_repeat_s={"medium-cnn": 25.0, "keras-applications": 45.0, "gpt": 30.0, "moe": 40.0, "*": 30.0},
        stability_run_s={"smallcnn": 20.0, "gpt_tiny": 25.0},
    ),
    "tiny": Scale(
        name="tiny",
        first=("gpt_tiny",),
        rest=(),
        native=(),
        libraries=(),
        flax=(),
        flax_knobs=None,
        sweep=("--preset", "cpu-small", "--steps", "3", "--warmup", "1", "--batch-size", "8"),
        repeats=1,
        precision="off",
        pairing={backends.TORCH: ("gpt_tiny",)},
        pairing_repeats=2,
        pairing_follow_up=False,
        stability_first=(("smallcnn", ("--dataset", "digits", "--runs", "2", "--epochs", "1", "--jobs", "1")),),
        stability=(),
        verify=("--steps", "2", "--batch-size", "8"),
        verify_first=("gpt_tiny",),
        knobs={backends.TORCH: "torch.use_deterministic_algorithms"},
        knobs_first=(),
        knobs_first_named={},
        full_knobs=False,
        family_repeat_s={"*": 4.0},
        stability_run_s={"smallcnn": 6.0},
    ),
}
"""``gpu``: the paper's sizes (its batch of 64, each model's own input) and the transformers' small sizes;
``tiny``: the same pipeline with the tiny GPT (stability of the small CNN) and one knob, its first window's parts
all there is, which a CPU runs in minutes (the tests run it); its stability studies train in one worker, as a
GPU's do (``stability.study.default_jobs``)."""


@dataclass(frozen=True)
class Part:
    """One ``detprof`` command of the study, on one backend."""

    name: str
    """Its folder under the study's ``--out``, and how summaries name it."""
    kind: PartKind
    backend: str
    models: tuple[str, ...]
    """The models it runs; a knob study's one model is chosen when it starts (``knob_model``), unless fixed."""
    options: tuple[str, ...]
    estimate: Estimate
    first_window: bool = False
    """One of the answers the first window brings back."""
    knobs: str | None = None
    """A knob study's ``--knobs``."""
    chooses_model: bool = False
    """A later knob study of the model that paid most on its backend, chosen when it starts (``knob_model``);
    False: its ``models`` as planned."""

    @property
    def estimate_s(self) -> float:
        return self.estimate.seconds

    @property
    def estimated_from(self) -> str:
        return self.estimate.cited

    def argv(self, folder: str, model: str | None = None) -> list[str]:
        """The command line, after ``detprof``, that runs this part into ``folder``."""
        models = ",".join(self.models) if model is None else model
        if self.kind == "stability":
            return ["stability", "--backend", self.backend, "--model", models, *self.options, "--out", folder]
        if self.kind == "verify":
            return ["verify", "--backend", self.backend, "--models", models, *self.options, "--out", folder]
        knobs = ["--knobs", self.knobs] if self.knobs is not None else []
        sweep = ["sweep", "--backend", self.backend, "--models", models, *self.options, *knobs]
        return [*sweep, "--no-report", "--out", folder]


@dataclass(frozen=True)
class StudyPlan:
    scale: Scale
    backends: tuple[str, ...]
    budget_s: float
    parts: tuple[Part, ...]
    not_run: Mapping[str, str] = field(default_factory=dict)
    """Parts the plan leaves out on this device, and why (a knob study of knobs that cannot matter here)."""
    routes: Mapping[str, Route] = field(default_factory=dict)
    """Per backend, how its later parts pair the modes: as the pairing check found, or as it is expected to."""
    shared: Mapping[str, bool] = field(default_factory=dict)
    """Per backend, whether its later sweeps' repeats share a process: as the repeats check found, or as expected."""
    waits: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Per backend, the parts of its checks' follow-up (``FollowUp``) that its parts paired as the checks find
    (``ROUTED``) wait for: a part started one way cannot resume the other."""

    @property
    def window_s(self) -> float:
        """What a window's parts may take: its budget less what its end keeps."""
        return self.budget_s - FINISH_S - GRACE_S

    def waiting(self, part: Part) -> tuple[str, ...]:
        """The parts of this plan that ``part`` waits for: its backend's checks' follow-up, where it pairs the modes as
        they find (``waits``)."""
        names = {p.name for p in self.parts}
        return tuple(n for n in self.waits.get(part.backend, ()) if n in names) if part.kind in ROUTED else ()


@dataclass(frozen=True)
class FollowUp:
    """A backend's pairing and repeats checks, where they could not tell, run once more: the models they could not
    tell about, with as many more repeats a way as would answer if the ratios and spreads held, in the ways those
    checks compare; read with the first repeats. Two repeats a way give an interval of 4.3 per-repeat spreads on each
    side, wider than the band at a spread of 1% (an H100's mediumcnn_k3 on JAX), where 4 answer a ratio of 1 and 8
    one within 0.9% of it."""

    models: tuple[str, ...]
    repeats: int
    ways: tuple[str, ...]
    """The pairing check's ways it runs again (``WAYS``'s names)."""

    def part_names(self, backend: str) -> tuple[str, ...]:
        return tuple(check_part(backend, way, more=True) for way in self.ways)

    @classmethod
    def asked(cls, answers: Mapping[str, PairingAnswer], scale: Scale) -> FollowUp | None:
        """The follow-up of the checks ``answers`` (by ``CHECKS``'s names) that cannot tell, where more repeats would
        answer every model they cannot tell about (a check answers for its backend only where all its models do);
        None where no check would (or the scale runs none)."""
        undecided = {
            check: [model for model in answer.models if model.answer == "cannot tell"]
            for check, answer in answers.items()
            if answer.answer == "cannot tell" and scale.pairing_follow_up
        }
        open_checks = [check for check, models in undecided.items() if all(m.repeats_to_answer for m in models)]
        needed = [(m.model, m.repeats_to_answer or 0) for check in open_checks for m in undecided[check]]
        if not needed:
            return None
        repeats = max(MIN_REPEATS, max(n for _, n in needed) - scale.pairing_repeats)
        compared = {way for check, *ways, _ in CHECKS if check in open_checks for way in ways}
        models = tuple(sorted({model for model, _ in needed}))
        return cls(models, repeats, tuple(way for way, _, _ in WAYS if way in compared))


@dataclass(frozen=True)
class Known:
    """What the study knows so far that shapes its plan: the model each knob study takes, the models whose pairs
    failed in one process, and how each backend's pairs are to be made (the pairing check's answer)."""

    knob_models: Mapping[str, str] = field(default_factory=dict)
    apart_models: Mapping[str, Sequence[str]] = field(default_factory=dict)
    routes: Mapping[str, Route] = field(default_factory=dict)
    shared: Mapping[str, bool] = field(default_factory=dict)
    """Per backend, the repeats check's answer: whether repeats sharing a process agree with a process per repeat."""
    follow_ups: Mapping[str, FollowUp] = field(default_factory=dict)
    """Per backend, its checks' follow-up, once one was asked for; it waits for an answer while ``routes`` has none."""


def installed_backends() -> tuple[str, ...]:
    """Every backend whose framework is installed here, in the registry's order."""
    return tuple(backend.name for backend in backends.all_backends() if backend.installed())


def build_plan(
    scale: Scale, names: Sequence[str], budget_s: float, costs: Costs, *, on_gpu: bool, known: Known = Known()
) -> StudyPlan:
    """Every part, in the order of value (the module's docstring), each split where it would not fit a window."""
    routes = {backend: known.routes.get(backend) or _expected_route(backend, on_gpu) for backend in names}
    shared = {
        backend: routes[backend] == "in_process"
        and _checked(scale, backend, on_gpu)
        and known.shared.get(backend, True)
        for backend in names
    }
    planner = _Planner(scale, costs, on_gpu, routes, budget_s, shared)
    first: list[Part] = []
    for backend in names:
        first += planner.pairing(backend)
    for backend, follow_up in known.follow_ups.items():
        first += planner.pairing(backend, follow_up) if backend in names else []
    for backend in names:
        first += [planner.stability(backend, model, options, first=True) for model, options in scale.stability_first]
    for backend in names:
        first += planner.verify(backend, scale.verify_first, first=True)
    not_run: dict[str, str] = {}
    for backend in names:
        knobs = planner.knobs(backend, _pairing_cnn(scale, backend), first=True)
        _add(first, not_run, knobs, f"{backend}-knobs-first")
    if backends.JAX in names and scale.flax:
        flax = planner.native(backends.JAX, FLAX, scale.flax, registry.FLAX_NEEDS)
        flax = flax if isinstance(flax, str) else [replace(part, first_window=True) for part in flax]
        _add(first, not_run, flax, f"{backends.JAX}-overhead-{FLAX}")
    later: list[Part] = []
    if backends.TORCH in names and scale.native:
        native = planner.native(backends.TORCH, NATIVE, scale.native, registry.NATIVE_NEEDS)
        _add(later, not_run, native, f"{backends.TORCH}-overhead-{NATIVE}")
    if backends.TORCH in names and scale.libraries:
        libraries = planner.libraries(backends.TORCH, scale.libraries)
        _add(later, not_run, libraries, f"{backends.TORCH}-overhead-{LIBRARIES}")
    if backends.JAX in names and scale.flax_knobs:
        flax_knobs = planner.native_knobs(backends.JAX, FLAX, scale.flax_knobs, registry.FLAX_NEEDS)
        _add(later, not_run, flax_knobs, f"{backends.JAX}-knobs-{FLAX}")
    for group, models in (("first", scale.first), ("rest", scale.rest)):
        for backend in names:
            left = tuple(m for m in models if m not in scale.pairing.get(backend, ()))
            later += planner.overhead(backend, group, left, share_of=len(names) * 2)
    for backend in names:
        if known.apart_models.get(backend):
            later += planner.overhead(backend, APART, tuple(known.apart_models[backend]), route="processes")
    if scale.full_knobs:
        for backend in names:
            model = known.knob_models.get(backend) or planner.costliest(backend)
            chosen = planner.knobs(backend, model, first=False)
            chosen = chosen if isinstance(chosen, str) else [replace(part, chooses_model=True) for part in chosen]
            _add(later, not_run, chosen, f"{backend}-knobs")
    for backend in names:
        later += [planner.stability(backend, model, options, first=False) for model, options in scale.stability]
    for backend in names:
        later += planner.verify(backend, tuple(m for m in scale.models if m not in scale.verify_first), first=False)
    parts = [split for part in (*first, *later) for split in planner.split(part)]
    waits = {b: f.part_names(b) for b, f in known.follow_ups.items() if b in names and b not in known.routes}
    return StudyPlan(scale, tuple(names), budget_s, tuple(parts), not_run, routes, shared, waits)


def _add(parts: list[Part], not_run: dict[str, str], planned: list[Part] | str, name: str) -> None:
    if isinstance(planned, str):
        not_run[name] = planned
    else:
        parts += planned


def _expected_route(backend: str, on_gpu: bool) -> Route:
    """How a backend's pairs are expected to be made before its pairing check answers: in one process where the
    backend can run both modes in one when asked."""
    modes = [backends.get(backend).mode_knobs(), frozenset()]
    refusal = backends.get(backend).shared_process_refusal(modes, compile=False, on_gpu=on_gpu, asked=True)
    return "processes" if refusal else "in_process"


def _checked(scale: Scale, backend: str, on_gpu: bool) -> bool:
    """Whether the pairing check runs on ``backend`` at this scale: it has models for it, and the backend can run
    both modes in one process."""
    return bool(scale.pairing.get(backend)) and _expected_route(backend, on_gpu) == "in_process"


def _pairing_cnn(scale: Scale, backend: str) -> str:
    """The first window's knob study takes the pairing check's first model (a CNN at the gpu scale), else the
    first overhead model."""
    return (scale.pairing.get(backend) or scale.first)[0]


@dataclass(frozen=True)
class _Planner:
    scale: Scale
    costs: Costs
    on_gpu: bool
    routes: Mapping[str, Route]
    budget_s: float
    shared: Mapping[str, bool]

    def _pairs(self, backend: str, models: Sequence[str], route: Route, repeats: int, shared: bool) -> Estimate:
        estimates = [self.costs.repeats(backend, model, route, repeats, shared=shared) for model in models]
        return summed(estimates, COMMAND_START_S)

    def _sharing(self, backend: str, route: Route) -> tuple[str, ...]:
        """``--shared-repeats`` where ``backend``'s sweeps paired ``route`` share a process across repeats."""
        return ("--shared-repeats",) if route == "in_process" and self.shared.get(backend) else ()

    def pairing(self, backend: str, follow_up: FollowUp | None = None) -> list[Part]:
        """The pairing check: the same sweep with both modes in one process and with a process per mode; and the
        repeats check: in one process, with every repeat of a model in that process. With ``follow_up``: its sweeps,
        the ways it runs again (``NAME-more``)."""
        if not _checked(self.scale, backend, self.on_gpu):
            return []
        models = follow_up.models if follow_up else self.scale.pairing.get(backend, ())
        repeats = follow_up.repeats if follow_up else self.scale.pairing_repeats
        options = (*self.scale.sweep, "--repeats", str(repeats), "--precision", "off")
        return [
            Part(
                check_part(backend, name, more=follow_up is not None),
                "pairing",
                backend,
                models,
                (*options, "--pairing", ROUTES[route], *more),
                self._pairs(backend, models, route, repeats, bool(more)),
                first_window=True,
            )
            for name, route, more in WAYS
            if follow_up is None or name in follow_up.ways
        ]

    def overhead(
        self,
        backend: str,
        group: str,
        models: tuple[str, ...],
        share_of: int = 0,
        route: Route | None = None,
        extra: tuple[str, ...] = (),
    ) -> list[Part]:
        """A sweep of ``models``: its first repeats, then repeats added for precision within what is left of its share
        of the window (at least a second, so that the sweep names the models it left wider than asked)."""
        if not models:
            return []
        route = route or self.routes[backend]
        sharing = self._sharing(backend, route) if group != APART else ()
        estimate = self._pairs(backend, models, route, self.scale.repeats, bool(sharing))
        precision = "off" if group == APART else self.scale.precision
        options: tuple[str, ...] = (
            *self.scale.sweep,
            *extra,
            "--repeats",
            str(self.scale.repeats),
            "--precision",
            precision,
        )
        if precision != "off":
            share_s = self.budget_s * OVERHEAD_SHARE / (share_of or 1)
            options += ("--budget", f"{max(1, round(share_s - estimate.seconds))}s")
        options += ("--pairing", ROUTES[route], *sharing)
        return [Part(f"{backend}-overhead-{group}", "overhead", backend, models, options, estimate)]

    def native(self, backend: str, group: str, models: tuple[str, ...], needs: str) -> list[Part] | str:
        """A sweep of native registry models on their backend, paired as its pairing check found; why not, where the
        package that builds them (``needs``) is not installed."""
        if missing := _not_installed(needs):
            return missing
        return self.overhead(backend, group, models, share_of=len(self.routes) * 2)

    def libraries(self, backend: str, models: tuple[str, ...]) -> list[Part] | str:
        """A sweep of library model functions at the images they take, paired as the pairing check found; why not,
        where a package they come from is not installed."""
        if missing := _not_installed(*(model.split(".", 1)[0] for model in models)):
            return missing
        from detprof.models.own import shape_text

        channels_first = shape_text((registry.IMAGENET_SHAPE[-1], *registry.IMAGENET_SHAPE[:-1]))
        return self.overhead(backend, LIBRARIES, models, len(self.routes) * 2, extra=("--input-shape", channels_first))

    def native_knobs(self, backend: str, group: str, model: str, needs: str) -> list[Part] | str:
        """A knob study of a native registry model (``knobs``), each part named for its group; why not, where the
        package that builds it (``needs``) is not installed."""
        if missing := _not_installed(needs):
            return missing
        parts = self.knobs(backend, model, first=False)
        if isinstance(parts, str):
            return parts
        return [replace(part, name=part.name.replace(f"{backend}-knobs", f"{backend}-knobs-{group}")) for part in parts]

    def costliest(self, backend: str) -> str:
        """The model the full knob study's estimate assumes before the overhead parts chose one: the costliest of
        the first models to run, so that the estimate errs long."""
        return max(self.scale.first, key=lambda model: self.costs.repeat(backend, model, "in_process").seconds)

    def knobs(self, backend: str, model: str, *, first: bool) -> list[Part] | str:
        """A knob study of one model: a pair of arms per comparison and repeat, then ``verify`` of each arm that
        leaves a knob out (``sweep.knobs``), split by its knobs where it would not fit a window (each part prices its
        own, against full determinism again, the libraries' helpers a part of their own); where no knob studied can
        matter on the device, why not."""
        from detprof.sweep.knobs import knob_design, split_knobs

        named = self.scale.knobs.get(backend, "all")
        if first:
            named = self.scale.knobs_first_named.get(backend, named)
        design = knob_design(backends.get(backend), self.on_gpu, split_knobs(named), [model])
        if len(design.comparisons) == 1:
            device = "a GPU" if self.on_gpu else "a CPU"
            return f"no knob of {backend} studied can matter on {device} ({', '.join(design.not_applicable)})"
        whole = self._knob_part(backend, model, named, first)
        studied = [k.name for k in design.knobs if k.name not in design.not_applicable]
        if first or whole.estimate_s <= self.window_s or len(studied) < 2:
            return [whole]
        groups: list[list[str]] = [[]]
        for knob in studied:
            if groups[-1] and self._knob_part(backend, model, ",".join([*groups[-1], knob]), first).estimate_s > (
                self.window_s
            ):
                groups.append([])
            groups[-1].append(knob)
        helpers = [helper.key for helper in backends.get(backend).helpers]
        return [
            replace(self._knob_part(backend, model, ",".join(group), first), name=f"{backend}-knobs-{n}")
            for n, group in enumerate([*groups, *([helpers] if helpers else [])], start=1)
        ]

    @property
    def window_s(self) -> float:
        return self.budget_s - FINISH_S - GRACE_S

    def _knob_part(self, backend: str, model: str, named: str, first: bool) -> Part:
        from detprof.sweep.knobs import TOTAL, knob_design, process_starts, split_knobs

        design = knob_design(backends.get(backend), self.on_gpu, split_knobs(named), [model])
        extra = self.scale.knobs_first if first else ()
        shorter = _steps_share(self.scale.sweep, extra)
        starts = process_starts(design, self.on_gpu)
        route = self._knob_route(backend, starts)
        sharing = self._sharing(backend, route)
        arms = self._knob_arms(backend, model, starts, route, bool(sharing))
        arms = replace(arms, steps_s=arms.steps_s * shorter)
        run = summed([self.costs.verify_run(backend, model), self.costs.worker_start(backend)])
        checked = len(design.dropped()) + len(set(design.helpers.values()) - {TOTAL}) + bool(design.every)
        checks = run.times(checked * CHECK_RUNS)
        estimate = summed([arms, checks], COMMAND_START_S)
        options = (*_with(self.scale.sweep, extra), "--repeats", str(self.scale.repeats), "--pairing", ROUTES[route])
        options += sharing
        name = f"{backend}-knobs-first" if first else f"{backend}-knobs"
        return Part(name, "knobs", backend, (model,), options, estimate, first_window=first, knobs=named)

    def _knob_route(self, backend: str, starts: Mapping[str, frozenset[str] | None]) -> Route:
        """How the knob study pairs its arms: as the backend's sweeps do, where some comparison's arms can share a
        process (``starts``: what each comparison's process starts with, None where its arms differ in a knob that
        a process takes when it starts, such as PyTorch's cuBLAS workspace on a GPU, and take a process per arm);
        else a process per arm for the whole study (``sweep.knobs.knob_settings``)."""
        if self.routes[backend] == "in_process" and any(start is not None for start in starts.values()):
            return "in_process"
        return "processes" if None in starts.values() else self.routes[backend]

    def _knob_arms(
        self, backend: str, model: str, starts: Mapping[str, frozenset[str] | None], route: Route, sharing: bool
    ) -> Estimate:
        """Every comparison's arms in every repeat: in one process, one worker per repeat (per study, sharing
        repeats) for the comparisons whose process starts alike; a process per arm for those that cannot share one
        (None in ``starts``)."""
        pairs = self.costs.repeats(backend, model, route, self.scale.repeats, shared=sharing)
        if route != "in_process":
            return pairs.times(len(starts))
        alike = [start for start in starts.values() if start is not None]
        apart = len(starts) - len(alike)
        workers = 1 if sharing else self.scale.repeats  # of each start, each running all its comparisons
        saved = self.costs.worker_start(backend).seconds * workers * (len(alike) - len(set(alike)))
        shared = pairs.times(len(alike))
        together = replace(shared, seconds=max(shared.seconds - saved, shared.steps_s))
        if not apart:
            return together
        each = self.costs.repeats(backend, model, "processes", self.scale.repeats).times(apart)
        source = f"{together.source}; {apart} of {len(starts)} comparisons a process per arm"
        return replace(
            together, seconds=together.seconds + each.seconds, steps_s=together.steps_s + each.steps_s, source=source
        )

    def stability(self, backend: str, model: str, options: tuple[str, ...], *, first: bool) -> Part:
        runs = int(options[options.index("--runs") + 1])
        run = self.costs.stability_run(backend, model, self.scale.stability_run_s[model])
        estimate = summed([run.times(len(STABILITY_VARIANTS) * runs)], COMMAND_START_S)
        options = (*options, "--variants", ",".join(STABILITY_VARIANTS))
        name = f"{backend}-stability-{model}" + ("-first" if first else "")
        return Part(name, "stability", backend, (model,), options, estimate, first_window=first)

    def verify(self, backend: str, models: tuple[str, ...], *, first: bool) -> list[Part]:
        """``verify`` of ``models``: each of its runs (two modes, two replicas) one worker for every model, a mode's
        two replicas one run's time where they run side by side (``verify.run.replicas_side_by_side``): a run of a
        few steps keeps a GPU's host busier than its device."""
        from detprof.verify.run import MODE_ARMS, REPLICAS, replicas_side_by_side

        if not models:
            return []
        beside = [replicas_side_by_side([arm], backend, self.on_gpu) for arm in MODE_ARMS]
        in_turn = sum(1 if both else len(REPLICAS) for both in beside)
        runs = [self.costs.verify_run(backend, model).times(in_turn) for model in models]
        workers = self.costs.worker_start(backend).times(in_turn)
        name = f"{backend}-verify" + ("-first" if first else "")
        estimate = summed([*runs, workers], COMMAND_START_S)
        return [Part(name, "verify", backend, models, self.scale.verify, estimate, first)]

    def split(self, part: Part) -> list[Part]:
        """``part`` as parts that each fit a window, its models in turn (``NAME-1``, ``NAME-2``, ...); a part of one
        model, or that fits, as it is."""
        window = self.window_s
        if part.estimate_s <= window or len(part.models) < 2 or part.kind in ("knobs", "stability", "pairing"):
            return [part]
        each = (part.estimate_s - COMMAND_START_S) / len(part.models)
        per_part = max(1, math.floor((window - COMMAND_START_S) / each)) if each > 0 else len(part.models)
        chunks = [part.models[i : i + per_part] for i in range(0, len(part.models), per_part)]
        whole = part.estimate
        return [
            replace(
                part,
                name=f"{part.name}-{n}",
                models=chunk,
                estimate=Estimate(
                    COMMAND_START_S + each * len(chunk),
                    whole.steps_s * len(chunk) / len(part.models),
                    whole.source,
                    tuple(link for link in whole.stand_ins if link[0] in chunk),
                ),
            )
            for n, chunk in enumerate(chunks, start=1)
        ]


def _not_installed(*packages: str) -> str:
    """Why a part of models that ``packages`` build is not run here: each one missing, with its install ("": none)."""
    missing = [package for package in dict.fromkeys(packages) if importlib.util.find_spec(package) is None]
    return "; ".join(f"{package} is not installed: {registry.MODEL_PACKAGES[package]}" for package in missing)


def _with(options: Sequence[str], changed: Sequence[str]) -> tuple[str, ...]:
    """``options`` (each ``--name value``) with the values ``changed`` gives them."""
    values = dict(zip(changed[::2], changed[1::2], strict=True))
    kept = [(name, values.pop(name, value)) for name, value in zip(options[::2], options[1::2], strict=True)]
    return tuple(item for pair in (*kept, *values.items()) for item in pair)


def _steps_share(sweep: Sequence[str], extra: Sequence[str]) -> float:
    """The share of the sweep's measured steps that ``extra``'s ``--steps`` keeps."""
    asked, kept = _steps(sweep), _steps(extra)
    return 1.0 if asked is None or kept is None else kept / asked


def _steps(options: Sequence[str]) -> int | None:
    return int(options[list(options).index("--steps") + 1]) if "--steps" in options else None
