"""The sweep's request resolved: its device and tracer, its settings, and each model's plan (``models.plans``).

The sweep, the knob study and ``detprof verify`` resolve ``--models`` and the options beside them here, into
a ``SweepConfig`` that holds every model's plan, made in one call before the study starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from detprof import backends
from detprof.errors import UsageError
from detprof.gpu_labels import CPU_LABEL
from detprof.models import kinds, own, registry
from detprof.models.plans import ModelPlan, ModelsAsked, check_known, data_path, model_plans, registry_plan
from detprof.option_values import parse_duration, parse_precision
from detprof.options import RunOptions
from detprof.profiler.measured_runs import (
    MeasurementTarget,
    RunSettings,
    choose_target,
    preset_values,
)
from detprof.profiler.presets import PRESETS
from detprof.profiler.worker_call import call_in_worker
from detprof.profiler.workloads import AMP_POLICIES

MODEL_WORKLOAD = "detprof.profiler.workloads:model_training"
MODEL_ARMS_WORKLOAD = "detprof.profiler.workloads:model_training_arms"


FP16_ON_A_CPU = (
    "--amp fp16 on a CPU: PyTorch's CPU has no fast float16 convolutions (a 5x5 one's forward and backward took 125x "
    "its float32 time on detprof's CPU), so a step can take seconds; bf16 is a CPU's half precision, fp16 a GPU's"
)
"""Said before a sweep that would otherwise run for many minutes without a word of why."""


@dataclass(frozen=True, kw_only=True)
class SweepConfig(RunSettings):
    models: tuple[str, ...]
    classes: int | None = None
    input_shape: str | None = None
    """``--input-shape`` (HxWxC) of your own models built at one (``own.Inspected.built_at_input_shape``); None: not
    given."""
    data: str | None = None
    """``--data npz:PATH`` as given; None: synthetic batches."""
    amp: str | None = None
    """``--amp``: the mixed precision every model trains in (``workloads.AMP_POLICIES``); None: each model's own."""
    plans: tuple[ModelPlan, ...] = field(default=(), compare=False)
    """Each model's plan, once ``SweepRequest.resolve`` made them; without them, registry models' defaults."""

    def __post_init__(self) -> None:
        if not self.models:
            raise UsageError("no models to sweep: pass --models")
        super().__post_init__()
        check_known(self.models)
        if self.amp is not None and self.amp not in AMP_POLICIES:
            raise UsageError(f"--amp takes {' or '.join(AMP_POLICIES)}, not {self.amp!r}")
        if self.classes is not None and self.classes < 2:
            raise UsageError(f"--classes must be at least 2 (a classifier tells two or more apart), not {self.classes}")

    def manifest(self) -> dict[str, Any]:
        """The configuration; your own models add their specs (file hashes included), so that a sweep of a
        changed model does not resume into the old one's results."""
        config = super().manifest()
        config.pop("plans")
        for key in ("input_shape", "data", "amp"):
            if config[key] is None:
                config.pop(key)
        mine = {plan.label: plan.own_model.as_record() for plan in self.model_plans() if plan.own_model is not None}
        if mine:
            config["own_models"] = mine
        return config | {"models": list(self.models)}

    def model_plans(self) -> tuple[ModelPlan, ...]:
        return self.plans or tuple(registry_plan(self.asked(), model) for model in self.models)

    def model_warnings(self) -> list[str]:
        """What the models' plans say before anything is measured (``ModelPlan.warning``), a line each: what a study
        prints first, and its dry run with its plan."""
        warnings = [plan.warning for plan in self.model_plans() if plan.warning is not None]
        if self.amp == "fp16" and self.backend == backends.TORCH and self.gpu_label.lower() == CPU_LABEL:
            warnings.append(FP16_ON_A_CPU)
        return warnings

    def say_before(self, console: Console) -> None:
        for line in self.model_warnings():
            console.print(escape(line), highlight=False)

    def labels(self) -> list[str]:
        """Each model as its records name it: what a folder of the study's own is named for (``store.place_for``)."""
        return [plan.label for plan in self.model_plans()]

    def asked(self, data: Path | None = None) -> ModelsAsked:
        """What this study asks of its models (``data``: ``--data``'s file, where the models are fed from it)."""
        return ModelsAsked(
            self.models, self.batch_size, self.input_size, self.input_shape, self.classes, data, self.amp
        )


@dataclass(frozen=True)
class SweepRequest:
    """The sweep's options as given; ``None`` takes the preset's value (the paper's on a GPU)."""

    models: tuple[str, ...] | None
    options: RunOptions

    def resolve(
        self, *, dry_run: bool = False, plans: tuple[ModelPlan, ...] | None = None
    ) -> tuple[SweepConfig, MeasurementTarget]:
        """The device and tracer chosen and checked, and the configuration the sweep will run (``plans``: the models'
        plans made already, by the resolution that found a native module without ``--backend``)."""
        run = self.options
        kinds.refuse_mixed([(m, kinds.NATIVE[registry.get(m).api]) for m in self.models or () if registry.is_native(m)])
        native = next((model for model in self.models or () if registry.is_native(model)), None)
        if native is not None and run.backend is None:  # known before any worker looks: no other framework's worker
            implied = replace(run, backend=kinds.NATIVE[registry.get(native).api].backend)
            return replace(self, options=implied).resolve(dry_run=dry_run, plans=plans)
        if native is not None:
            kinds.refuse_other_backend(native, registry.get(native).api, run.backend)
        refused = self._refused_until_inspected(run)
        if refused is not None:  # planned without the switch, then implied or refused
            run = replace(run, compile=False, xla=False)
        target = choose_target(run, list(PRESETS), dry_run=dry_run)
        given = {
            "models": self.models,
            "steps": run.steps,
            "warmup": run.warmup,
            "repeats": run.repeats,
            "batch_size": run.batch_size,
            "input_size": run.input_size,
            "classes": run.classes,
            "precision": parse_precision(run.precision),
            "budget_s": parse_duration(run.budget, "--budget"),
        }
        data = data_path(run.data, run.input_size)
        values = preset_values(PRESETS[target.preset], given)
        if data is not None:
            values["input_size"] = None
        if run.steps is not None:  # the steps asked for, not a number sized to the machine
            values["run_seconds"] = None
        if given["precision"] is None and run.repeats is not None:  # the repeats asked for, no more
            values["precision"] = None
        values["precision"] = values["precision"] or None
        if values["precision"] is None:
            if given["budget_s"] is not None:
                raise UsageError("--budget bounds the repeats --precision adds: give --precision too")
            values["budget_s"] = None
        shape = own.parse_input_shape(run.input_shape)
        lengths = values.pop("run_seconds")
        config = SweepConfig.for_target(
            target,
            run,
            in_process=True,
            **values,
            input_shape=None if shape is None else own.shape_text(shape),
            data=run.data,
            amp=run.amp,
        )
        run_seconds = lengths.get(config.pairing) if isinstance(lengths, dict) else lengths
        plans = plans or model_plans(config.asked(data), target.backend, call_in_worker)
        kinds.refuse_mixed([(p.given, p.kind) for p in plans if p.kind is not None])
        native = next((p.kind for p in plans if p.kind is not None), None)
        if native is not None and target.backend != native.backend and run.backend is None:
            # A native module implies its framework; what a worker found of each model holds there.
            implied = replace(self, options=replace(self.options, backend=native.backend))
            return implied.resolve(dry_run=dry_run, plans=plans)
        for plan in plans:
            if plan.kind is not None:
                kinds.refuse_other_backend(plan.given, plan.kind.api, target.backend)
            if run.amp is not None and plan.kind is not None and plan.kind.amp_refused is not None:
                raise UsageError(f"{plan.given}: {plan.kind.amp_refused}")
        if refused is not None:
            raise UsageError(refused)
        return replace(config, run_seconds=run_seconds, plans=plans), target

    def _refused_until_inspected(self, run: RunOptions) -> str | None:
        """The refusal of a compiler switch (``--compile``, ``--xla``) of another backend than the installed default,
        where no ``--backend`` is given and a model of one's own may be a native module that implies that backend:
        the refusal stands only once the models are inspected and none does."""
        if run.backend is not None or not any(own.is_own(model) for model in self.models or ()):
            return None
        return backends.compile_refusal(backends.require(None), bool(run.xla), run.compile)
