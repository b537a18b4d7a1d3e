"""The one place that switches determinism on, per backend, and that records what is in effect.

Determinism cannot be switched off again inside a process, and two of its switches are read
only once, when the framework starts (JAX's ``XLA_FLAGS``; ``CUBLAS_WORKSPACE_CONFIG`` when
CUDA initialises), so ``apply`` must run in a fresh worker before the framework does any
work. Seeds are set in both modes so that the only difference between a default and a
deterministic run is the implementation the framework chooses. The compiler is pinned to the
same explicit choice in both modes: Keras 3 resolves ``jit_compile="auto"`` to False on
TensorFlow when op determinism is on, which would silently compare XLA against non-XLA;
PyTorch compiles only with ``--compile``; JAX always jits.

Keras 3 runs the same models on TensorFlow, JAX and PyTorch; ``KERAS_BACKEND`` picks one and
is read when Keras is first imported, so it is set here too, before that import.

A training program detprof did not write (``detprof sweep --command``) is switched through its
environment instead (``program_environment``), and what is in effect there is read back by a
``sitecustomize`` hook (``profiler/program_hook``) that loads this file by its path into the
program's own interpreter, which may not have detprof installed: this module imports nothing
but the standard library at module level.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import platform
import random
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Literal

Mode = Literal["default", "deterministic"]
MODES: tuple[Mode, ...] = ("default", "deterministic")
Backend = Literal["tensorflow", "jax", "torch"]
BACKENDS: tuple[Backend, ...] = ("tensorflow", "jax", "torch")
DEFAULT_BACKEND: Backend = "tensorflow"
BACKEND_MODULES: dict[Backend, str] = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}
"""The module each backend needs; its extra is ``detprof[<backend>]`` (TensorFlow is a core dependency)."""

XLA_DETERMINISTIC_FLAG = "--xla_gpu_deterministic_ops"
CUBLAS_WORKSPACE_ENV = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_DETERMINISTIC_WORKSPACE = ":4096:8"
"""cuBLAS is deterministic per stream only with a fixed workspace (PyTorch's reproducibility notes)."""


BEFORE_THE_CHOICE: dict[str, Any] = {"backend": DEFAULT_BACKEND, "compile": False}
"""Settings that came with the backend choice, at the value every run had before there was one."""


def as_before_the_choice(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` without the settings that are at their value from before the backend choice.

    A study's configuration and a run's settings leave them out there, so that results
    measured before the choice (a sweep to ``--resume``, a stability study, a CI baseline)
    still match the same measurement made now.
    """
    return {k: v for k, v in values.items() if not (k in BEFORE_THE_CHOICE and v == BEFORE_THE_CHOICE[k])}


@dataclass(frozen=True)
class DeterminismSettings:
    mode: Mode
    seed: int = 0
    xla: bool = False
    """TensorFlow: ``jit_compile`` in both modes."""
    backend: Backend = DEFAULT_BACKEND
    compile: bool = False
    """PyTorch: ``torch.compile`` (Keras' ``jit_compile`` on the torch backend) in both modes."""

    @property
    def deterministic(self) -> bool:
        return self.mode == "deterministic"

    @property
    def jit_compile(self) -> bool:
        """What Keras' ``jit_compile`` is on this backend, the same in both modes."""
        return {"tensorflow": self.xla, "jax": True, "torch": self.compile}[self.backend]


def require_backend(backend: str) -> Backend:
    """``backend`` when its framework is installed; one line naming the extra to install otherwise.

    Checked in detprof's own process without importing the framework, so that a sweep on one
    backend never pays for loading another.
    """
    from detprof.errors import UsageError

    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if not backend_installed(backend):  # type: ignore[arg-type]
        module = BACKEND_MODULES[backend]  # type: ignore[index]
        raise UsageError(f"--backend {backend} needs {module}, not installed here: pip install 'detprof[{backend}]'")
    return backend  # type: ignore[return-value]


def backend_installed(backend: Backend) -> bool:
    """Whether ``backend``'s framework is installed, found without importing it."""
    return importlib.util.find_spec(BACKEND_MODULES[backend]) is not None


DEBUG_ENV = "DETPROF_DEBUG"
"""Set (non-empty) to see everything: tracebacks of internal errors and TensorFlow's own log lines."""
TF_LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
WORKER_TF_LOG_LEVEL = "2"
"""Workers log TensorFlow's warnings and errors to their log files unless their launcher asked for less."""


def debugging() -> bool:
    """Whether the user asked to see what detprof normally hides (the same test as the CLI's traceback switch)."""
    return bool(os.environ.get(DEBUG_ENV))


@contextmanager
def quiet_tensorflow() -> Iterator[None]:
    """Import TensorFlow (or Keras) in this block to keep TensorFlow's C++ log lines off the user's terminal.

    The one way detprof's own process loads TensorFlow. Its C++ side writes straight to fd 2
    (oneDNN notices, "Could not find cuda drivers", "failed call to cuInit"), which would bury
    detprof's output and its one-line errors. Two things are needed, because neither is
    enough alone: ``TF_CPP_MIN_LOG_LEVEL=3``, which TensorFlow reads once while it loads and
    which then also hides lines it logs later (cuInit fails at the first op, not at import);
    and fd 2 pointed at /dev/null for the block, because absl prints what is logged before
    its own initialization whatever the level says. The variable is restored afterwards so
    that worker processes started later still log to their log files as before.
    ``TF_ENABLE_ONEDNN_OPTS`` is left alone: it changes the numerics, not just the logging.

    Python exceptions raised in the block still propagate; detprof's main reports them once
    fd 2 is back. Once TensorFlow is loaded (every worker has loaded it in ``apply``) the
    block does nothing: the start-up chatter is over, and hiding fd 2 would hide only
    detprof's own output. With ``DETPROF_DEBUG=1`` nothing is silenced.
    """
    if debugging() or "tensorflow" in sys.modules:
        yield
        return
    previous = os.environ.get(TF_LOG_LEVEL_ENV)
    os.environ[TF_LOG_LEVEL_ENV] = "3"
    _flush_stderr()
    saved = os.dup(2)
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 2)
        finally:
            os.close(devnull)
        yield
    finally:
        _flush_stderr()
        os.dup2(saved, 2)
        os.close(saved)
        if previous is None:
            os.environ.pop(TF_LOG_LEVEL_ENV, None)
        else:
            os.environ[TF_LOG_LEVEL_ENV] = previous


def _flush_stderr() -> None:
    """Whatever Python buffered goes out on the fd 2 it was written under, not after the switch."""
    if sys.stderr is not None:
        sys.stderr.flush()


def apply(settings: DeterminismSettings) -> dict[str, Any]:
    """Switch ``settings.backend`` into ``settings.mode``; returns the settings in effect.

    Runs in worker processes only, before any framework is imported. Their stderr is their
    log file: the framework's warnings and errors belong there, so it is not silenced, only
    kept from logging every info line.
    """
    os.environ["KERAS_BACKEND"] = settings.backend
    _without_other_frameworks(settings.backend)
    os.environ.setdefault(TF_LOG_LEVEL_ENV, WORKER_TF_LOG_LEVEL)
    {"tensorflow": _apply_tensorflow, "jax": _apply_jax, "torch": _apply_torch}[settings.backend](settings)
    _seed(settings)
    return effective_settings(settings)


class _NotInThisWorker(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of ``modules`` (and their submodules) fail as if they were not installed.

    The failure comes when the module would load, not when it is looked up: torch asks
    ``importlib.util.find_spec`` about other frameworks at import and must get an answer.
    """

    def __init__(self, modules: tuple[str, ...]) -> None:
        self.modules = modules

    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(name, self) if name.split(".", 1)[0] in self.modules else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        raise ModuleNotFoundError(f"No module named {spec.name!r} (kept out of a detprof worker of another backend)")

    def exec_module(self, module: object) -> None:
        """Never reached: ``create_module`` refuses first."""


def _without_other_frameworks(backend: Backend) -> None:
    """Keep the frameworks this worker does not run out of it.

    Keras probes for TensorFlow (``keras.utils.set_random_seed`` seeds it whenever it is
    installed) and for JAX (its checkpoint callback), which would load them into every
    worker: seconds of start-up, their thread pools and, on a GPU, their own claim on device
    memory. An import finder that answers "not installed" makes Keras take the path it takes
    where they are not installed. A ``None`` entry in ``sys.modules`` would not do: Keras
    tests ``"tensorflow" in sys.modules`` (its preprocessing layers ask whether they run in a
    tf.data graph) and would take TensorFlow for loaded.
    """
    others = tuple(BACKEND_MODULES[b] for b in BLOCKED_IN[backend])
    if others:
        sys.meta_path.insert(0, _NotInThisWorker(others))


BLOCKED_IN: dict[Backend, tuple[Backend, ...]] = {
    "tensorflow": (),
    "jax": ("tensorflow",),
    "torch": ("tensorflow", "jax"),
}
"""Which frameworks a worker of each backend keeps out. TensorFlow's own modules import JAX where
it is installed (``tf.lite``), and Keras on JAX reaches into torch's types, so those stay."""


def _apply_tensorflow(settings: DeterminismSettings) -> None:
    import tensorflow as tf

    if settings.deterministic:
        tf.config.experimental.enable_op_determinism()


def _apply_jax(settings: DeterminismSettings) -> None:
    """The flag goes into ``XLA_FLAGS`` beside the user's own flags, which are kept.

    A deterministic flag the user set is removed in default mode: default mode is XLA's default.
    """
    os.environ["XLA_FLAGS"] = xla_flags(os.environ.get("XLA_FLAGS", ""), settings.deterministic)
    import jax  # noqa: F401  (XLA reads the flags when JAX starts)


def xla_flags(user_flags: str, deterministic: bool) -> str:
    """``XLA_FLAGS`` for a run: the user's flags without detprof's switch, plus the switch when deterministic."""
    kept = [flag for flag in user_flags.split() if flag.split("=", 1)[0] != XLA_DETERMINISTIC_FLAG]
    if deterministic:
        kept.append(f"{XLA_DETERMINISTIC_FLAG}=true")
    return " ".join(kept)


def _apply_torch(settings: DeterminismSettings) -> None:
    """Deterministic mode as PyTorch's reproducibility notes say; default mode is PyTorch's defaults.

    ``CUBLAS_WORKSPACE_CONFIG`` must be set before CUDA initialises, hence before the import;
    a value the user set is kept (any ``:SIZE:COUNT`` value is deterministic).
    """
    if settings.deterministic:
        os.environ.setdefault(CUBLAS_WORKSPACE_ENV, CUBLAS_DETERMINISTIC_WORKSPACE)
    import torch  # noqa: F401  (imported in default mode too, as the deterministic worker imports it)

    if settings.deterministic:
        switch_torch_on()


def switch_torch_on() -> None:
    """PyTorch's deterministic algorithms, cuDNN deterministic, no cuDNN benchmark: in a worker, and in a
    program as soon as it has imported torch (the ``sitecustomize`` hook)."""
    import torch

    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


PROGRAM_MODE_ENV = "DETPROF_PROGRAM_MODE"
"""A program's mode, for the hook that switches torch on in it (torch has no environment switch)."""
IN_EFFECT_DIR_ENV = "DETPROF_IN_EFFECT_DIR"
"""Where each Python process of a program writes what its frameworks report in effect (``in_effect_here``)."""
TF_DETERMINISTIC_OPS_ENV = "TF_DETERMINISTIC_OPS"


def program_environment(mode: Mode, environ: Mapping[str, str], in_effect_dir: str) -> dict[str, str]:
    """The environment a program detprof did not write runs with in ``mode``: every framework switched at once.

    The program may train with any of them, and its own processes read these when the
    framework starts: TensorFlow's ``TF_DETERMINISTIC_OPS`` (TensorFlow 2.21 still honours it:
    ``is_op_determinism_enabled()`` is then True), JAX's ``XLA_FLAGS`` (``xla_flags``) and
    cuBLAS's workspace before CUDA starts; torch has no such variable, so the hook switches it
    on from ``PROGRAM_MODE_ENV``. Default mode is every framework's default: the switches are
    taken out of the user's environment, which is otherwise kept.
    """
    deterministic = mode == "deterministic"
    env = dict(environ)
    env.pop(TF_DETERMINISTIC_OPS_ENV, None)
    flags = xla_flags(env.pop("XLA_FLAGS", ""), deterministic)
    if flags:
        env["XLA_FLAGS"] = flags
    if deterministic:
        env[TF_DETERMINISTIC_OPS_ENV] = "1"
        env.setdefault(CUBLAS_WORKSPACE_ENV, CUBLAS_DETERMINISTIC_WORKSPACE)
    return env | {PROGRAM_MODE_ENV: mode, IN_EFFECT_DIR_ENV: in_effect_dir}


def in_effect_here() -> dict[str, Any]:
    """What every framework this process has loaded reports in effect, with its version and Python's.

    For a program, which may have loaded any of them (or several); nothing is imported that the
    program did not load itself. Keras' version is kept when it is loaded, whatever its backend.
    """
    loaded = [backend for backend, module in BACKEND_MODULES.items() if module in sys.modules]
    versions = {"python": platform.python_version()}
    for module in ("keras", *(BACKEND_MODULES[b] for b in loaded)):
        if module in sys.modules:
            versions[module] = str(getattr(sys.modules[module], "__version__", "unknown"))
    return {"frameworks": {backend: EFFECTIVE[backend]() for backend in loaded}, "versions": versions}


def _seed(settings: DeterminismSettings) -> None:
    """Keras' seeds (Python, NumPy, its global seed generator and the backend's) plus the backend's own.

    JAX has no global seed: its randomness comes from explicit keys, which Keras' seed
    generators derive from the seed set here.
    """
    import keras

    keras.utils.set_random_seed(settings.seed)
    random.seed(settings.seed)
    if settings.backend == "torch":
        import torch

        torch.manual_seed(settings.seed)
    elif settings.backend == "tensorflow":
        import tensorflow as tf

        tf.random.set_seed(settings.seed)


def effective_settings(settings: DeterminismSettings) -> dict[str, Any]:
    """What the framework itself reports is in effect, not merely what was asked for."""
    return {**asdict(settings), "jit_compile": settings.jit_compile, **EFFECTIVE[settings.backend]()}


def _tensorflow_effective() -> dict[str, Any]:
    from tensorflow.python.framework import config as tf_config

    return {
        "op_determinism": bool(tf_config.is_op_determinism_enabled()),
        "cudnn_autotune": os.environ.get("TF_CUDNN_USE_AUTOTUNE", "1") not in ("0", "false", "False"),
        "deprecated_tf_deterministic_ops_env": os.environ.get("TF_DETERMINISTIC_OPS"),
    }


def _torch_effective() -> dict[str, Any]:
    import torch

    return {
        "op_determinism": bool(torch.are_deterministic_algorithms_enabled()),
        "deterministic_warn_only": bool(torch.is_deterministic_algorithms_warn_only_enabled()),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cublas_workspace_config": os.environ.get(CUBLAS_WORKSPACE_ENV),
    }


XLA_DEBUG_OPTIONS_PATH = (3, 3)
"""``CompileOptionsProto.executable_build_options`` (3), then ``ExecutableBuildOptionsProto.debug_options`` (3)."""
XLA_GPU_DETERMINISTIC_OPS_FIELD = 148
"""``DebugOptions.xla_gpu_deterministic_ops`` in XLA's xla.proto."""


def _jax_effective() -> dict[str, Any]:
    """The flag as XLA parsed it: the ``DebugOptions`` that XLA builds from ``XLA_FLAGS`` for every compilation.

    jaxlib exposes those options only as a serialized ``CompileOptionsProto``, without the
    message classes, so the one field is read from the wire format (a proto3 bool is written
    only when true). An ``XLA_FLAGS`` typo would not pass: XLA aborts on unknown flags.
    """
    from google.protobuf import empty_pb2
    from google.protobuf.unknown_fields import UnknownFieldSet
    from jax._src.lib import _jax

    def fields(wire: bytes) -> UnknownFieldSet:
        message = empty_pb2.Empty()
        message.ParseFromString(wire)
        return UnknownFieldSet(message)

    wire = _jax.CompileOptions().SerializeAsString()
    for number in XLA_DEBUG_OPTIONS_PATH:
        wire = next((f.data for f in fields(wire) if f.field_number == number), b"")
    deterministic = any(f.field_number == XLA_GPU_DETERMINISTIC_OPS_FIELD and f.data for f in fields(wire))
    return {"op_determinism": deterministic, "xla_flags": os.environ.get("XLA_FLAGS", "")}


EFFECTIVE = {"tensorflow": _tensorflow_effective, "jax": _jax_effective, "torch": _torch_effective}
"""Each backend's reading of what is in effect, from the framework itself."""


def software_versions(backend: Backend = DEFAULT_BACKEND) -> dict[str, Any]:
    """detprof's, Python's, Keras' and the backend's versions, with what the backend was built for and sees."""
    import keras

    from detprof.version import detprof_version

    common = {"detprof": detprof_version(), "python": platform.python_version(), "keras": keras.__version__}
    return {**common, **{"tensorflow": _tensorflow_versions, "jax": _jax_versions, "torch": _torch_versions}[backend]()}


def _tensorflow_versions() -> dict[str, Any]:
    import tensorflow as tf

    build = tf.sysconfig.get_build_info()
    return {
        "tensorflow": tf.__version__,
        "cuda_build": build.get("cuda_version"),
        "cudnn_build": build.get("cudnn_version"),
        "is_cuda_build": bool(build.get("is_cuda_build")),
        "gpus_visible": len(tf.config.list_physical_devices("GPU")),
    }


def _jax_versions() -> dict[str, Any]:
    import jax
    import jaxlib

    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "is_cuda_build": any(b.startswith("cuda") for b in _jax_plugins()),
        "gpus_visible": len(gpus),
    }


def _jax_plugins() -> list[str]:
    from importlib.metadata import distributions

    return [d.metadata["Name"] for d in distributions() if d.metadata["Name"].startswith(("jax-cuda", "jax_cuda"))]


def _torch_versions() -> dict[str, Any]:
    import torch

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "torch": str(torch.__version__),
        "cuda_build": torch.version.cuda,
        "cudnn_build": cudnn,
        "is_cuda_build": torch.version.cuda is not None,
        "gpus_visible": torch.cuda.device_count(),
    }
