"""What a verification worker runs: K training steps of one model, every tensor of every step fingerprinted.

The worker's mode is switched before the framework loads (``determinism.apply``), the model
is built and trained as the sweep builds and trains it (``workloads.training_of``), and each
step's batch is drawn from the run's seed, so two workers of one request see the same data in
the same order and differ only in what the framework does, compiling too: each compiles its steps itself
(``Backend.compile_in_this_process``), none loaded from a cache another run filled. Each step is one pass through a
model whose outputs are every layer's (``Backend.gradient_step``): the layers' outputs on the
step's batch, the gradients, and each layer's weights once the optimizer applied them are
fingerprinted (``fingerprints``). An op that refuses to run deterministically ends the run as
a finding (``findings``); any other error as a failure. Either way the steps already taken
are written.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import detprof.backends as backends
from detprof.determinism import DeterminismSettings, apply, effective_settings, reseed, software_versions
from detprof.device_time import PartClock
from detprof.errors import first_line
from detprof.findings import finding_of, refuses_determinism
from detprof.fingerprints import RunFingerprints
from detprof.models import kinds
from detprof.models.own import is_native
from detprof.profiler.worker_process import utc_now
from detprof.store import atomic_write_json

if TYPE_CHECKING:
    import keras

REASON_CHARS = 500


@dataclass(frozen=True)
class VerifyAsk:
    """One verification run as the parent asks a worker for it (``asdict`` of it crosses the process boundary):
    the workload (``params``), its mode and backend, the seed its batches are drawn from, how many steps, and
    whether gradients are fingerprinted too; ``knobs``: the backend's knobs the run sets (a knob study's arm
    without one knob), None: its mode's."""

    params: dict[str, Any]
    mode: str
    backend: str
    seed: int
    steps: int
    gradients: bool
    knobs: list[str] | None = None
    compile: bool = False
    """``--compile``: a native module's step through ``torch.compile`` (a knob study's checks of a compiled study)."""


def fingerprint_runs(asks: list[dict[str, Any]], outs: list[str], answers: str) -> int:
    """``worker_call.call_in_worker``'s entry: the runs ``asks`` (``VerifyAsk``s of one mode: one replica's runs of
    several models, of several knob sets where ``verify.run.arm_groups`` grouped a knob study's checks) one after
    the other in this process, each one's fingerprints written to its ``outs`` and its answer to
    ``answers/<index>.json`` as soon as it ends, so that a process that dies keeps what it finished. Each run starts
    from the seeds a process of its own starts from (``determinism.reseed``), under its own knobs
    (``Backend.arm_switch``, its record's settings read back then), so its runs are those a process per run would
    make, for a process's start less. Returns how many ran."""
    from detprof.device_time import running_clock

    clock = running_clock()
    settings = _settings(VerifyAsk(**asks[0]))
    keras = not all(is_native(ask["params"]) for ask in asks)
    common: dict[str, Any] = {"settings": apply(settings, keras=keras)}
    clock.lap("start")
    backend = backends.get(settings.backend)
    backend.init_device()
    clock.lap("device")
    common |= {"versions": software_versions(settings.backend), "device_name": backend.device_name()}
    common |= backend.compile_in_this_process(settings.compile, compared=True)
    for index, (ask, out) in enumerate(zip(asks, outs, strict=True)):
        started = utc_now()
        run = VerifyAsk(**ask)
        if _settings(run) != settings:
            settings = _settings(run)
            backend.arm_switch(settings.knob_set())()
            common["settings"] = effective_settings(settings)
        if index:
            reseed(settings)
        clock.lap("other")
        answer = common | _fingerprinted(run, settings, Path(out), clock)
        answer |= {"started_at": started, "finished_at": utc_now(), "time_parts": clock.take()}
        atomic_write_json(Path(answers) / f"{index}.json", answer)
    return len(asks)


def _settings(run: VerifyAsk) -> DeterminismSettings:
    knobs = None if run.knobs is None else tuple(run.knobs)
    return DeterminismSettings(run.mode, run.seed, backend=run.backend, knobs=knobs, compile=run.compile)  # type: ignore[arg-type]


def _fingerprinted(run: VerifyAsk, settings: DeterminismSettings, out: Path, clock: PartClock) -> dict[str, Any]:
    """One run's training, fingerprinted into ``out``: what it found, as JSON."""
    taken = RunFingerprints()
    answer: dict[str, Any] = {}
    try:
        answer |= _train(run.params, settings, run.steps, run.gradients, taken, clock) | {
            "status": "ok",
            "reason": None,
        }
    except Exception as exc:
        traceback.print_exc()
        if settings.deterministic and refuses_determinism(exc):
            finding = finding_of(exc, run.backend)
            answer |= {"status": "unsupported", "reason": finding.message, "finding": finding.to_json()}
        else:
            reason = backends.failure_reason(exc, first_line(exc, with_type=True))
            answer |= {"status": "failed", "reason": reason[:REASON_CHARS]}
    taken.save(out)
    clock.lap("other")
    return answer | {"steps": len(taken.steps)}


def _train(
    params: dict[str, Any],
    settings: DeterminismSettings,
    steps: int,
    gradients: bool,
    taken: RunFingerprints,
    clock: PartClock,
) -> dict[str, Any]:
    """``steps`` training steps of the model's kind (``_KerasSteps``, ``_NativeSteps``, ``_FlaxSteps``), each
    fingerprinted; on
    ``clock``, the steps apart from the fingerprinting, and the first step's excess over the others as compiling."""
    native = kinds.of_params(params)
    kind = (_KerasSteps if native is None else _FlaxSteps if native is kinds.FLAX else _NativeSteps)(params, settings)
    clock.lap("build")
    step_s: list[float] = []
    for step in range(steps):
        batch = kind.batch(settings.seed + step)
        clock.lap("other")
        trained = kind.train(batch)
        before = clock.parts.get("steps", 0.0)
        clock.lap("steps")
        step_s.append(clock.parts["steps"] - before)
        taken.begin_step()
        kind.take(trained, taken, gradients)
        clock.lap("other")
    clock.first_step_compiled(step_s)
    return {"layers": kind.layers, "parameters": kind.parameters, "model_api": (native or kinds.KERAS).api}


class _KerasSteps:
    """A Keras model's verified steps: each layer's output (a model whose outputs are every layer's,
    ``Backend.gradient_step``), each variable's gradient, each layer's weights."""

    def __init__(self, params: dict[str, Any], settings: DeterminismSettings) -> None:
        import keras

        from detprof.profiler.workloads import training_of

        self.params, self.backend = params, backends.get(settings.backend)
        self.training = training_of(params)
        self.probe, self.layer_objects = _every_layer(self.training.model)
        loss = self.training.loss
        self.loss = keras.losses.get(loss) if isinstance(loss, str) else loss
        self.layers = [layer.name for layer in self.layer_objects]
        self.parameters = int(self.training.model.count_params())

    def batch(self, seed: int) -> tuple[Any, Any]:
        import keras

        from detprof.profiler.workloads import batch_of

        x, y = batch_of(self.training.model, self.params, self.training.classes, seed)
        return keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(y)

    def train(self, batch: tuple[Any, Any]) -> tuple[list[Any], list[Any]]:
        return self.backend.gradient_step(self.probe, self.loss, self.training.optimizer, *batch)

    def take(self, trained: tuple[list[Any], list[Any]], taken: RunFingerprints, gradients: bool) -> None:
        import keras

        outputs, grads = trained
        for layer, output in zip(self.layer_objects, outputs, strict=False):
            taken.add(layer.name, "output", [keras.ops.convert_to_numpy(output)])
        if gradients:
            for variable, grad in zip(self.probe.trainable_variables, grads, strict=True):
                taken.add(variable.path, "gradients", [keras.ops.convert_to_numpy(grad)])
        for layer in self.layer_objects:
            if layer.weights:
                taken.add(layer.name, "weights", [keras.ops.convert_to_numpy(w.value) for w in layer.weights])


class _NativeSteps:
    """A native PyTorch module's verified steps: each submodule's output as its forward returned it (in the order
    they ran), each parameter's gradient, and each module's own parameters and buffers once the optimizer stepped,
    by path (the top module's by its class name). Compiled (``--compile``), its submodules' outputs are inside the
    compiled graph, where a hook would be compiled in: the module's logits stand for them."""

    def __init__(self, params: dict[str, Any], settings: DeterminismSettings) -> None:
        from detprof.models import torch_modules
        from detprof.models.own_build import native_training

        self.params, self.host = params, backends.get(settings.backend).host_array
        self.training = native_training(params, settings.seed, settings.jit_compile)
        self.module = self.training.module
        self.layers = torch_modules.module_paths(self.module)
        self.parameters = sum(p.numel() for p in self.module.parameters())

    def batch(self, seed: int) -> tuple[Any, Any]:
        from detprof.models import torch_modules

        training = self.training
        return torch_modules.batch(
            self.module, self.params, seed, training.logits_shape, training.targets, training.classes_first
        )

    def train(self, batch: tuple[Any, Any]) -> list[tuple[str, list[Any]]]:
        from detprof.models import torch_modules

        if self.training.forward is not None:  # compiled
            _, logits = self.training.train_on(*batch)
            return [(type(self.module).__name__, [self.host(logits)])]
        with torch_modules.outputs_taken(self.module) as outputs:
            self.training.train_on(*batch)
        return outputs

    def take(self, trained: list[tuple[str, list[Any]]], taken: RunFingerprints, gradients: bool) -> None:
        for path, arrays in trained:
            taken.add(path, "output", arrays)
        if gradients:
            for name, parameter in self.module.named_parameters():
                if parameter.grad is not None:
                    taken.add(name, "gradients", [self.host(parameter.grad)])
        for path, submodule in self.module.named_modules():
            own = [*submodule.parameters(recurse=False), *submodule.buffers(recurse=False)]
            if own:
                taken.add(path or type(self.module).__name__, "weights", [self.host(t) for t in own])


class _FlaxSteps:
    """A Flax NNX module's verified steps (``flax_modules.FlaxTraining.taken_step``): each submodule's output as its
    call returned it (in the order they ran), each parameter's gradient, and each module's own parameters and batch
    statistics after the optimizer's update, by path (the top module's by its class name)."""

    def __init__(self, params: dict[str, Any], settings: DeterminismSettings) -> None:
        from detprof.models.own_build import native_training

        self.params = params
        self.training = native_training(params, settings.seed)
        self.layers = self.training.paths
        self.parameters = self.training.parameters

    def batch(self, seed: int) -> tuple[Any, Any]:
        from detprof.models import flax_modules

        return flax_modules.batch(self.training.module, self.params, seed, self.training.logits_shape)

    def train(self, batch: tuple[Any, Any]) -> Any:
        return self.training.taken_step(batch)

    def take(self, trained: Any, taken: RunFingerprints, gradients: bool) -> None:
        for path, arrays in trained.outputs:
            taken.add(path, "output", arrays)
        if gradients:
            for name, gradient in trained.gradients:
                taken.add(name, "gradients", [gradient])
        for path, arrays in trained.weights:
            taken.add(path, "weights", arrays)


def _every_layer(model: keras.Model) -> tuple[keras.Model, list[keras.layers.Layer]]:
    """The model with every layer's output as an output of its own, in model order, and its prediction last.

    A model of several outputs has no one prediction to train on synthetic labels: one line says so.
    """
    import keras

    from detprof.errors import UsageError

    if len(model.outputs) != 1:
        raise UsageError(f"detprof verify trains models of one output; {model.name} has {len(model.outputs)}")
    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    return keras.Model(model.inputs, [*(layer.output for layer in layers), *model.outputs]), layers
