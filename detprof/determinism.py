"""The one place that switches determinism on in a worker, and that records what is in effect there.

Determinism cannot be switched off again inside a process, and two of its switches are read
only once, when the framework starts (JAX's ``XLA_FLAGS``; ``CUBLAS_WORKSPACE_CONFIG`` when
CUDA initialises), so ``apply`` must run in a fresh worker before the framework does any
work. Seeds are set in both modes so that the only difference between a default and a
deterministic run is the implementation the framework chooses. The compiler is pinned to the
same explicit choice in both modes (``Backend.jit_compile``): Keras 3 resolves
``jit_compile="auto"`` to False on TensorFlow when op determinism is on, which would silently
compare XLA against non-XLA.

Keras 3 runs the same models on TensorFlow, JAX and PyTorch; ``KERAS_BACKEND`` picks one and
is read when Keras is first imported, so it is set here too, before that import. What each
framework needs is its backend's (``detprof.backends``); a program detprof did not write is
switched through its environment instead (``backends.program``).
"""

from __future__ import annotations

import os
import platform
import random
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import detprof.backends as backends

Mode = Literal["default", "deterministic"]
MODES: tuple[Mode, ...] = ("default", "deterministic")

IMPLIED_SETTINGS: dict[str, Any] = {"backend": backends.DEFAULT, "compile": False}
"""Settings whose value is implied where a configuration or a record does not name them: files that name no
backend ran on TensorFlow, without torch.compile."""


def without_implied(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` without the settings at their implied value (``IMPLIED_SETTINGS``).

    A study's configuration and a run's settings leave them out there, so that a configuration
    that names them and one that does not compare equal (a sweep to ``--resume``, a stability
    study, a CI baseline).
    """
    return {k: v for k, v in values.items() if not (k in IMPLIED_SETTINGS and v == IMPLIED_SETTINGS[k])}


@dataclass(frozen=True)
class DeterminismSettings:
    mode: Mode
    seed: int = 0
    xla: bool = False
    """TensorFlow: ``jit_compile`` in both modes."""
    backend: str = backends.DEFAULT
    compile: bool = False
    """PyTorch: ``torch.compile`` (Keras' ``jit_compile`` on the torch backend) in both modes."""
    knobs: tuple[str, ...] | None = None
    """The backend's knobs this run sets (``Backend.knobs``); None: its mode's (all of deterministic mode's, or
    none). A knob study's arms set some."""

    @property
    def deterministic(self) -> bool:
        return self.mode == "deterministic"

    def knob_set(self) -> frozenset[str]:
        """The knobs set: those named, else the mode's."""
        if self.knobs is not None:
            return frozenset(self.knobs)
        return backends.get(self.backend).mode_knobs() if self.deterministic else frozenset()

    @property
    def jit_compile(self) -> bool:
        """What Keras' ``jit_compile`` is on this backend, the same in both modes."""
        return backends.get(self.backend).jit_compile(self.xla, self.compile)


def apply(settings: DeterminismSettings, *, keras: bool = True) -> dict[str, Any]:
    """Switch ``settings.backend`` into ``settings.mode``; returns the settings in effect. ``keras``: load Keras on
    it (a native PyTorch module's worker trains without it).

    Runs in worker processes only, before any framework is imported.
    """
    _switch(backends.get(settings.backend), settings.knob_set(), settings.seed, keras)
    return effective_settings(settings)


def apply_shared(arms: Sequence[DeterminismSettings], process_knobs: Iterable[str], *, keras: bool = True) -> None:
    """Set up a worker that runs ``arms`` in turn, a step of each (``Backend.arm_steps``): the backend, and the
    knobs only a fresh process takes (``Backend.process_knobs``, as its launcher read them for the device); each
    arm's step sets the rest.

    Runs in worker processes only, before any framework is imported.
    """
    _switch(backends.get(arms[0].backend), frozenset(process_knobs), arms[0].seed, keras)


def restore_shared(arms: Sequence[DeterminismSettings], process_knobs: Iterable[str]) -> None:
    """A worker that pairs several models in turn (``profiler.worker.pair_session``) back under the knobs it started
    with (``apply_shared``), before it builds the next model: the last arm's step left its own switched on, and a
    model whose build runs an op without a deterministic implementation would fail to build there, as it does not in
    a process of its own. A JAX arm takes its knobs as compile options of its own step and leaves none switched."""
    backend = backends.get(arms[0].backend)
    if backend.knobs_switch_between_runs:
        backend.arm_switch(frozenset(process_knobs))()


def _switch(backend: backends.Backend, knobs: frozenset[str], seed: int, keras: bool) -> None:
    """The framework and Keras load here: what their imports load only because it is installed is kept out while
    they do (``Backend.unused_at_import``), and stays importable for whatever runs after."""
    os.environ["KERAS_BACKEND"] = backend.name
    backends.keep_out_for_good(backend.name)
    with backends.unused_kept_out(backend.name):
        backend.switch(knobs)
        _seed(seed, backend, keras)


def arm_settings(settings: DeterminismSettings, in_effect: Mapping[str, Any]) -> dict[str, Any]:
    """What a run asked for, with what the framework reports ``in_effect`` (``knobs``: each knob as read back; a
    knob study's record names the knobs its arm asked for)."""
    asked = {key: value for key, value in asdict(settings).items() if key != "knobs"}
    return {**asked, "jit_compile": settings.jit_compile, **in_effect}


def reseed(settings: DeterminismSettings) -> None:
    """A worker that runs several models in turn (``verify``'s replicas) back where a fresh process starts each:
    Keras' session cleared and every seed set again, so that a model's weights are what a process of its own would
    build (a worker that trains native modules alone loaded no Keras: its seeds, without)."""
    keras = sys.modules.get("keras")
    if keras is not None:
        keras.backend.clear_session()
    _seed(settings.seed, backends.get(settings.backend), keras is not None)


def _seed(seed: int, backend: backends.Backend, keras: bool) -> None:
    """Keras' seeds (Python, NumPy, its global seed generator and the backend's) plus the framework's own; without
    Keras, Python's, NumPy's and the framework's.

    JAX has no global seed: its randomness comes from explicit keys, which Keras' seed
    generators derive from the seed set here.
    """
    if keras:
        import keras as keras_module

        keras_module.utils.set_random_seed(seed)
    else:
        import numpy as np

        np.random.seed(seed)
    random.seed(seed)
    backend.seed(seed)


def effective_settings(settings: DeterminismSettings) -> dict[str, Any]:
    """What the framework itself reports is in effect, not merely what was asked for (``arm_settings``)."""
    return arm_settings(settings, backends.get(settings.backend).in_effect())


def software_versions(backend: str = backends.DEFAULT) -> dict[str, Any]:
    """detprof's, Python's, Keras' (where the process loaded it) and the backend's versions, with what the backend
    was built for and sees."""
    from detprof.version import detprof_version

    common = {"detprof": detprof_version(), "python": platform.python_version()}
    keras = sys.modules.get("keras")
    return common | ({"keras": keras.__version__} if keras else {}) | backends.get(backend).versions()
