"""The Keras backends detprof runs, registered in one place: ``get(name)`` is everything detprof knows of one.

A fourth framework is one module beside these and one line in ``REGISTRY``. The order of the
registry is the order every table and listing uses; the first is the default. Only the
standard library is imported here and by the backend modules (``base``), so that naming a
backend never loads a framework.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Iterator
from types import ModuleType

from .base import UNUSED_AT_IMPORT, Backend
from .jax import Jax
from .tensorflow import TensorFlow, quiet_tensorflow
from .torch import Torch

REGISTRY: dict[str, Backend] = {backend.name: backend for backend in (TensorFlow(), Jax(), Torch())}
NAMES: tuple[str, ...] = tuple(REGISTRY)
TENSORFLOW, JAX, TORCH = TensorFlow.name, Jax.name, Torch.name
DEFAULT = TENSORFLOW
"""The implied backend: of a record or a configuration that names none."""
NO_FRAMEWORK = "no deep-learning framework is installed here: pip install " + " or ".join(
    f"'detprof[{name}]'" for name in REGISTRY
)
"""What a command that needs a framework says where none is installed (``pip install detprof`` alone)."""
KERAS_BACKEND_ENV = "KERAS_BACKEND"


def get(name: str) -> Backend:
    """The backend called ``name``; KeyError for a name detprof does not know (``require`` says it in one line)."""
    return REGISTRY[name]


def named(name: object) -> str:
    """The backend a record, manifest or configuration names (``name``, its field): none named is ``DEFAULT``, for
    the records written before each named its backend."""
    return str(name or DEFAULT)


def all_backends() -> tuple[Backend, ...]:
    return tuple(REGISTRY.values())


def loaded() -> list[Backend]:
    """The backends whose framework this process has imported."""
    return [backend for backend in REGISTRY.values() if backend.loaded()]


def compile_refusal(backend: Backend, xla: bool, compile: bool) -> str | None:
    """One line when ``--xla`` or ``--compile`` asks ``backend`` for another backend's compiler, else None.

    A switch a backend lacks would be silently ignored, and the study would not measure what
    its user asked for.
    """
    for option, given in (("xla", xla), ("compile", compile)):
        owner = next((b for b in REGISTRY.values() if b.compiler.option == option), None)
        if given and owner is not None and owner is not backend:
            return f"{owner.compiler.option_words}; {backend.framework} {backend.compiler.compiles}"
    return None


OUT_OF_MEMORY = "out of memory: "
"""How a failed run's reason begins where the device (or host) ran out of memory: the reason says what to change
(a smaller batch, fewer runs at once), and ``verify`` runs such a run again with the device to itself."""


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is the device (or host) running out of memory, in whichever loaded framework raised it."""
    return isinstance(exc, MemoryError) or any(backend.out_of_memory(exc) for backend in loaded())


def failure_reason(exc: BaseException, reason: str) -> str:
    """A failed run's ``reason`` for ``exc``, named as running out of memory where it was (``OUT_OF_MEMORY``)."""
    return f"{OUT_OF_MEMORY}{reason}" if out_of_memory(exc) else reason


def installed_default() -> str:
    """``--backend`` left out: the framework installed here, TensorFlow first where several are.

    Found without importing any. With none installed, one line naming the extras that bring one.
    """
    from detprof.errors import UsageError

    found = next((backend.name for backend in REGISTRY.values() if backend.installed()), None)
    if found is None:
        raise UsageError(NO_FRAMEWORK)
    return found


def refuse_unknown(name: str) -> None:
    """One line where ``name`` names no backend of detprof's: what a command that needs no framework installed (a
    listing, a check before it measures) asks before anything else."""
    from detprof.errors import UsageError

    if name not in REGISTRY:
        raise UsageError(f"unknown backend {name!r}; choose one of {', '.join(REGISTRY)}")


def require(name: str | None) -> Backend:
    """``name``'s backend (None: the installed one) when its framework is installed; one line naming the extra
    to install otherwise.

    Checked in detprof's own process without importing the framework, so that a sweep on one
    backend never pays for loading another.
    """
    from detprof.errors import UsageError

    if name is None:
        name = installed_default()
    refuse_unknown(name)
    backend = REGISTRY[name]
    if not backend.installed():
        raise UsageError(f"--backend {name} needs {backend.module}, not installed here: pip install 'detprof[{name}]'")
    return backend


class NotInstalled(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of ``modules`` (and their submodules) fail as if they were not installed.

    Keras probes for TensorFlow (``keras.utils.set_random_seed`` seeds it whenever it is
    installed) and for JAX (its checkpoint callback), which would load them into every
    worker: seconds of start-up, their thread pools and, on a GPU, their own claim on device
    memory; while the framework and Keras load, their imports probe for scikit-learn, pandas
    and (TensorFlow's) JAX and torch the same way (``unused_kept_out``). Answering "not
    installed" makes Keras take the path it takes where they are not installed. A ``None``
    entry in ``sys.modules`` would not do: Keras tests whether TensorFlow is in
    ``sys.modules`` (its preprocessing layers ask whether they run in a tf.data graph) and
    would take TensorFlow for loaded. The failure comes when the module would load, not when
    it is looked up: torch asks ``importlib.util.find_spec`` about other frameworks at import
    and must get an answer.
    """

    def __init__(self, modules: tuple[str, ...]) -> None:
        self.modules = modules

    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(name, self) if name.split(".", 1)[0] in self.modules else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        raise ModuleNotFoundError(f"No module named {spec.name!r} (kept out of this detprof process)")

    def exec_module(self, module: object) -> None:
        """Never reached: ``create_module`` refuses first."""


class Asked(BaseException):
    """What ``HeldBack`` raises at the first import of a module it holds back. Not an ImportError: an optional
    dependency's ``except ImportError`` fallback must not take a framework that is installed for one that is not."""


class HeldBack(NotInstalled):
    """Imports of ``modules`` stop with ``Asked``, and ``asked`` says one was tried: a worker that does not yet know
    which framework a user's model needs lets the model's own imports tell it, before it loads any."""

    asked = False

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        self.asked = True
        raise Asked(spec.name)


def keep_out_for_good(name: str) -> None:
    """In a worker process of ``name``'s framework only: the other frameworks Keras would load for nothing
    (``Backend.keeps_out``) fail to import for the rest of the process, as if they were not installed. Keras loads
    TensorFlow well after its own import, wherever a layer's configuration is serialised (it asks whether
    TensorFlow is available), so keeping it out only while Keras imports would not do."""
    backend = get(name)
    if backend.keeps_out:
        sys.meta_path.insert(0, NotInstalled(backend.keeps_out))


@contextlib.contextmanager
def unused_kept_out(name: str) -> Iterator[None]:
    """Around the first import of ``name``'s framework and Keras: what their imports load only because it is
    installed (``UNUSED_AT_IMPORT``, ``Backend.unused_at_import``) fails as if it were not, and is importable
    again after, for whatever code runs next (a user's model)."""
    finder = NotInstalled(UNUSED_AT_IMPORT + get(name).unused_at_import)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def import_keras(name: str | None = None) -> ModuleType:
    """Keras, imported first here in detprof's own process, on ``name``'s framework (None: the installed one).

    Keras picks its framework at its first import, from ``KERAS_BACKEND``, and falls back to
    TensorFlow, so on a machine with only PyTorch or JAX a bare ``import keras`` fails, and on
    one with several it would load TensorFlow for a PyTorch study. The variable is set for the
    import and restored after (the workers set their own); TensorFlow loads quietly, and
    without what its import and Keras' load for nothing (``unused_kept_out``). Once Keras is
    loaded its framework is chosen and this returns it. A framework that is not installed is
    ``require``'s one line.
    """
    if "keras" in sys.modules:
        return sys.modules["keras"]
    backend = require(name)
    previous = os.environ.get(KERAS_BACKEND_ENV)
    os.environ[KERAS_BACKEND_ENV] = backend.name
    try:
        with (
            quiet_tensorflow() if backend.name == TENSORFLOW else contextlib.nullcontext(),
            unused_kept_out(backend.name),
        ):
            return importlib.import_module("keras")
    finally:
        if previous is None:
            os.environ.pop(KERAS_BACKEND_ENV, None)
        else:
            os.environ[KERAS_BACKEND_ENV] = previous
