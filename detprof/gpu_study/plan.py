"""The GPU study's plan: its parts in the order of their value, each a ``detprof`` command line and its expected time.

The order is the issue a GPU lease answers first: the paper's medium CNN from 1x1 to 7x7 and a
GPT on every backend (the answer a single window must bring back), then the rest of the zoo, the
knob study of the model that paid most, what determinism buys (implementation noise alone against
control), and ``verify`` of every swept model. The overhead parts share part of the window's budget
(``OVERHEAD_SHARE``) for the repeats they add for precision; the window's end bounds everything.

Expected times come from per-model costs: the seconds one repeat of a model took (both modes) as
measured on this GPU by the last run kept in the repository (``gpu_reference``), else an estimate
per model family, so that a dry run can say what fits before the GPU is spent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from detprof import backends
from detprof.models import registry

PartKind = Literal["overhead", "knobs", "stability", "verify"]
KINDS: tuple[PartKind, ...] = ("overhead", "knobs", "stability", "verify")
OVERHEAD_SHARE = 0.55
"""The share of a window's budget the overhead parts take, split evenly: what is left of a part's share after its
first repeats bounds the repeats it adds for precision (``sweep --budget``)."""
DEFAULT_BUDGET_S = 600.0
"""10 minutes: a 15-minute window keeps room for the machine's start and the transfers."""
COMMAND_START_S = 4.0
"""What a ``detprof`` command costs before its first run: Python, detprof, the plan."""
VERIFY_RUNS = 4
"""``verify`` trains each model twice in each mode."""
APART = "apart"
"""The overhead part that reruns, with a process per mode (``--pairing processes``), the models whose pairs failed
in one process: on an H100, XLA failed to run gpt_small's and moe_small's step compiled with deterministic ops as
a compile option in a process started without them (reference/h100-2026-11-28); a process of its own is started
with the flag in ``XLA_FLAGS``, as a user's program is, and says whether the failure is the pairing's or the
mode's."""
APART_REPEAT_FACTOR = 1.5
"""A process per mode starts, builds and compiles the model once per mode instead of once per repeat."""
STABILITY_VARIANTS = ("impl", "control")
"""Implementation noise alone (same seed, default mode) against control (deterministic): what determinism buys."""


@dataclass(frozen=True)
class Scale:
    """What the study runs at one scale: the models of each overhead part, and every command's sizes."""

    name: str
    first: tuple[str, ...]
    """The overhead models whose answer the first window must bring back, on every backend."""
    rest: tuple[str, ...]
    sweep: tuple[str, ...]
    """The sweep's options (both the overhead parts and the knob study)."""
    repeats: int
    precision: str
    stability: tuple[tuple[str, tuple[str, ...]], ...]
    """Each model whose stability is studied, with its options."""
    verify: tuple[str, ...]
    knobs: Mapping[str, str]
    """Per backend, the knobs its knob study prices (``--knobs``); ``all`` for a backend not listed."""
    family_repeat_s: Mapping[str, float]
    """Estimated seconds of one repeat (both modes, one process) of a model of each family, where none was
    measured; ``*`` for a family not listed."""
    stability_run_s: Mapping[str, float]
    verify_run_s: float


SCALES: dict[str, Scale] = {
    "gpu": Scale(
        name="gpu",
        first=("mediumcnn_k1", "mediumcnn_k3", "mediumcnn_k5", "mediumcnn_k7", "gpt_small"),
        rest=("moe_small", "vit_small", "vgg19", "resnet50", "densenet121", "mobilenet", "efficientnetb0"),
        sweep=("--preset", "paper", "--steps", "10", "--warmup", "3", "--batch-size", "64"),
        repeats=2,
        precision="2%",
        stability=(
            ("smallcnn", ("--dataset", "digits", "--runs", "3", "--epochs", "30")),
            ("gpt_tiny", ("--dataset", "markov", "--runs", "3", "--epochs", "20")),
        ),
        verify=("--steps", "5", "--batch-size", "16"),
        knobs={},
        # An H100 (reference/h100-2026-11-27): the medium CNNs 12-35 s a repeat, the Keras applications 26-48 s.
        family_repeat_s={"medium-cnn": 25.0, "keras-applications": 45.0, "gpt": 30.0, "moe": 40.0, "*": 30.0},
        stability_run_s={"smallcnn": 20.0, "gpt_tiny": 25.0},
        verify_run_s=15.0,
    ),
    "tiny": Scale(
        name="tiny",
        first=("gpt_tiny",),
        rest=(),
        sweep=("--preset", "cpu-small", "--steps", "3", "--warmup", "1", "--batch-size", "8"),
        repeats=1,
        precision="off",
        stability=(("smallcnn", ("--dataset", "digits", "--runs", "2", "--epochs", "1")),),
        verify=("--steps", "2", "--batch-size", "8"),
        knobs={backends.TORCH: "torch.use_deterministic_algorithms"},
        family_repeat_s={"*": 4.0},
        stability_run_s={"smallcnn": 6.0},
        verify_run_s=3.0,
    ),
}
"""``gpu``: the paper's sizes (its batch of 64, each model's own input) and the transformers' small sizes;
``tiny``: the same pipeline with the tiny GPT (stability of the small CNN) and one knob in one window, which a
CPU runs in minutes (the tests run it)."""


@dataclass(frozen=True)
class Costs:
    """Seconds of one repeat (both modes) of a model per backend, measured on a GPU where known."""

    measured: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """(backend, model): seconds one repeat took."""
    measured_on: str | None = None
    """The GPU and date they were measured on."""

    def repeat_s(self, scale: Scale, backend: str, model: str) -> float:
        if (backend, model) in self.measured:
            return self.measured[backend, model]
        family = registry.get(model).family
        return scale.family_repeat_s.get(family, scale.family_repeat_s["*"])

    def source(self, backend: str, models: Sequence[str]) -> str:
        known = [m for m in models if (backend, m) in self.measured]
        if not known:
            return "estimated"
        said = f"measured on {self.measured_on}" if self.measured_on else "measured"
        return said if len(known) == len(models) else f"{said} for {len(known)} of {len(models)}, else estimated"


@dataclass(frozen=True)
class Part:
    """One ``detprof`` command of the study, on one backend."""

    name: str
    """Its folder under the study's ``--out``, and how summaries name it."""
    kind: PartKind
    backend: str
    models: tuple[str, ...]
    """The models it runs; a knob study's one model is chosen when it starts (``knob_model``)."""
    options: tuple[str, ...]
    estimate_s: float
    estimated_from: str

    def argv(self, folder: str, model: str | None = None) -> list[str]:
        """The command line, after ``detprof``, that runs this part into ``folder``."""
        models = ",".join(self.models) if model is None else model
        if self.kind == "stability":
            return ["stability", "--backend", self.backend, "--model", models, *self.options, "--out", folder]
        if self.kind == "verify":
            return ["verify", "--backend", self.backend, "--models", models, *self.options, "--out", folder]
        return ["sweep", "--backend", self.backend, "--models", models, *self.options, "--no-report", "--out", folder]


@dataclass(frozen=True)
class StudyPlan:
    scale: Scale
    backends: tuple[str, ...]
    budget_s: float
    parts: tuple[Part, ...]
    not_run: Mapping[str, str] = field(default_factory=dict)
    """Parts the plan leaves out on this device, and why (a knob study of knobs that cannot matter here)."""


def installed_backends() -> tuple[str, ...]:
    """Every backend whose framework is installed here, in the registry's order."""
    return tuple(backend.name for backend in backends.all_backends() if backend.installed())


def build_plan(
    scale: Scale,
    names: Sequence[str],
    budget_s: float,
    costs: Costs,
    *,
    on_gpu: bool,
    knob_models: Mapping[str, str],
    apart_models: Mapping[str, Sequence[str]],
) -> StudyPlan:
    """Every part, in the order of value: overhead first on every backend, then the rest of the zoo (and, once the
    study knows them, the models whose pairs failed in one process, a process per mode), the knob studies,
    stability and verify. ``knob_models``: the model each backend's knob study was given (after its overhead parts
    ran), else the one the estimate assumes."""
    parts: list[Part] = []
    groups = [models for models in (scale.first, scale.rest) if models]
    share_s = budget_s * OVERHEAD_SHARE / (len(groups) * len(names) or 1)
    for group, models in (("first", scale.first), ("rest", scale.rest)):
        parts += [_overhead(scale, backend, group, models, costs, share_s) for backend in names if models]
    parts += [
        _apart(scale, backend, tuple(apart_models[backend]), costs) for backend in names if apart_models.get(backend)
    ]
    not_run: dict[str, str] = {}
    for backend in names:
        model = knob_models.get(backend) or _costliest(scale, backend, costs)
        knobs = _knobs(scale, backend, model, costs, on_gpu=on_gpu)
        if isinstance(knobs, Part):
            parts.append(knobs)
        else:
            not_run[f"{backend}-knobs"] = knobs
    for backend in names:
        parts += [_stability(scale, backend, model, options) for model, options in scale.stability]
    parts += [_verify(scale, backend) for backend in names]
    return StudyPlan(scale, tuple(names), budget_s, tuple(parts), not_run)


def _overhead(scale: Scale, backend: str, group: str, models: tuple[str, ...], costs: Costs, share_s: float) -> Part:
    """A sweep of ``models``: its first repeats, then repeats added for precision within what is left of its share
    of the budget (at least a second, so that the sweep names the models it left wider than asked)."""
    repeat_s = sum(costs.repeat_s(scale, backend, model) for model in models)
    estimate = COMMAND_START_S + scale.repeats * repeat_s
    options: tuple[str, ...] = (*scale.sweep, "--repeats", str(scale.repeats), "--precision", scale.precision)
    if scale.precision != "off":
        options += ("--budget", f"{max(1, round(share_s - estimate))}s")
    source = costs.source(backend, models)
    return Part(f"{backend}-overhead-{group}", "overhead", backend, models, options, estimate, source)


def _apart(scale: Scale, backend: str, models: tuple[str, ...], costs: Costs) -> Part:
    repeat_s = sum(costs.repeat_s(scale, backend, model) for model in models) * APART_REPEAT_FACTOR
    options = (*scale.sweep, "--repeats", str(scale.repeats), "--precision", "off", "--pairing", "processes")
    source = costs.source(backend, models)
    return Part(
        f"{backend}-overhead-{APART}",
        "overhead",
        backend,
        models,
        options,
        COMMAND_START_S + scale.repeats * repeat_s,
        source,
    )


def _costliest(scale: Scale, backend: str, costs: Costs) -> str:
    """The model the knob study's estimate assumes before the overhead parts chose one: the first window's
    costliest to run, so that the estimate errs long."""
    return max(scale.first, key=lambda model: costs.repeat_s(scale, backend, model))


def _knobs(scale: Scale, backend: str, model: str, costs: Costs, *, on_gpu: bool) -> Part | str:
    """The knob study of one model: a pair of arms per comparison and repeat, then ``verify`` of each arm that
    leaves a knob out (``sweep.knobs``); where no knob studied can matter on the device, why not."""
    from detprof.sweep.knobs import knob_design, split_knobs

    named = scale.knobs.get(backend, "all")
    knobs = knob_design(backends.get(backend), on_gpu, split_knobs(named), [model])
    if len(knobs.comparisons) == 1:
        device = "a GPU" if on_gpu else "a CPU"
        return f"no knob of {backend} studied can matter on {device} ({', '.join(knobs.not_applicable)})"
    repeat_s = costs.repeat_s(scale, backend, model)
    arms_s = scale.repeats * len(knobs.comparisons) * repeat_s
    estimate = COMMAND_START_S + arms_s + len(knobs.dropped()) * VERIFY_RUNS * scale.verify_run_s
    options = (*scale.sweep, "--repeats", str(scale.repeats), "--knobs", named)
    return Part(f"{backend}-knobs", "knobs", backend, (model,), options, estimate, costs.source(backend, [model]))


def _stability(scale: Scale, backend: str, model: str, options: tuple[str, ...]) -> Part:
    runs = int(options[options.index("--runs") + 1])
    estimate = COMMAND_START_S + len(STABILITY_VARIANTS) * runs * scale.stability_run_s[model]
    options = (*options, "--variants", ",".join(STABILITY_VARIANTS))
    return Part(f"{backend}-stability-{model}", "stability", backend, (model,), options, estimate, "estimated")


def _verify(scale: Scale, backend: str) -> Part:
    models = (*scale.first, *scale.rest)
    estimate = COMMAND_START_S + len(models) * VERIFY_RUNS * scale.verify_run_s
    return Part(f"{backend}-verify", "verify", backend, models, scale.verify, estimate, "estimated")
