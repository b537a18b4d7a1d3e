"""The Keras backends detprof runs, registered in one place: ``get(name)`` is everything detprof knows of one.

A fourth framework is one module beside these and one line in ``REGISTRY``. The order of the
registry is the order every table and listing uses; the first is the default. Only the
standard library is imported here and by the backend modules (``base``), so that naming a
backend never loads a framework.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from .base import Backend
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


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is the device (or host) running out of memory, in whichever loaded framework raised it."""
    return isinstance(exc, MemoryError) or any(backend.out_of_memory(exc) for backend in loaded())


def installed_default() -> str:
    """``--backend`` left out: the framework installed here, TensorFlow first where several are.

    Found without importing any. With none installed, one line naming the extras that bring one.
    """
    from detprof.errors import UsageError

    found = next((backend.name for backend in REGISTRY.values() if backend.installed()), None)
    if found is None:
        raise UsageError(NO_FRAMEWORK)
    return found


def require(name: str | None) -> Backend:
    """``name``'s backend (None: the installed one) when its framework is installed; one line naming the extra
    to install otherwise.

    Checked in detprof's own process without importing the framework, so that a sweep on one
    backend never pays for loading another.
    """
    from detprof.errors import UsageError

    if name is None:
        name = installed_default()
    if name not in REGISTRY:
        raise UsageError(f"unknown backend {name!r}; choose one of {', '.join(REGISTRY)}")
    backend = REGISTRY[name]
    if not backend.installed():
        raise UsageError(f"--backend {name} needs {backend.module}, not installed here: pip install 'detprof[{name}]'")
    return backend


@contextlib.contextmanager
def keras_first_import(name: str | None = None) -> Iterator[None]:
    """Keras imported in this block, in detprof's own process, runs on ``name``'s framework (None: the installed one).

    Keras picks its framework at its first import, from ``KERAS_BACKEND``, and falls back to
    TensorFlow, so on a machine with only PyTorch or JAX a bare ``import keras`` fails, and on
    one with several it would load TensorFlow for a PyTorch study. The variable is set for the
    block and restored after (the workers set their own); TensorFlow loads quietly. Once Keras
    is loaded its framework is chosen and the block changes nothing. A framework that is not
    installed is ``require``'s one line.
    """
    if "keras" in sys.modules:
        yield
        return
    backend = require(name)
    previous = os.environ.get(KERAS_BACKEND_ENV)
    os.environ[KERAS_BACKEND_ENV] = backend.name
    try:
        with quiet_tensorflow() if backend.name == TENSORFLOW else contextlib.nullcontext():
            yield
    finally:
        if previous is None:
            os.environ.pop(KERAS_BACKEND_ENV, None)
        else:
            os.environ[KERAS_BACKEND_ENV] = previous
