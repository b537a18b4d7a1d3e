"""The one place that switches determinism on, and that records what is in effect.

Determinism cannot be switched off again inside a process, so ``apply`` must run in a
fresh worker before TensorFlow does any work. Seeds are set in both modes so that the only
difference between a default and a deterministic run is the implementation TensorFlow
chooses. Keras 3 resolves ``jit_compile="auto"`` to False when op determinism is on, which
would silently compare XLA against non-XLA; ``jit_compile`` is therefore always pinned to
the same explicit value in both modes.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Literal

Mode = Literal["default", "deterministic"]
MODES: tuple[Mode, ...] = ("default", "deterministic")


@dataclass(frozen=True)
class DeterminismSettings:
    mode: Mode
    seed: int = 0
    xla: bool = False

    @property
    def deterministic(self) -> bool:
        return self.mode == "deterministic"


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
    """Switch the framework into ``settings.mode``; returns the effective settings.

    Runs in worker processes only, whose stderr is their log file: TensorFlow's warnings and
    errors belong there, so it is not silenced, only kept from logging every info line.
    """
    os.environ.setdefault(TF_LOG_LEVEL_ENV, WORKER_TF_LOG_LEVEL)
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(settings.seed)
    if settings.deterministic:
        tf.config.experimental.enable_op_determinism()
    return effective_settings(settings)


def effective_settings(settings: DeterminismSettings) -> dict[str, Any]:
    """What TensorFlow reports is in effect, not merely what was asked for."""
    from tensorflow.python.framework import config as tf_config

    return {
        **asdict(settings),
        "op_determinism": bool(tf_config.is_op_determinism_enabled()),
        "jit_compile": settings.xla,
        "cudnn_autotune": os.environ.get("TF_CUDNN_USE_AUTOTUNE", "1") not in ("0", "false", "False"),
        "deprecated_tf_deterministic_ops_env": os.environ.get("TF_DETERMINISTIC_OPS"),
    }


def software_versions() -> dict[str, Any]:
    import keras
    import tensorflow as tf

    from detprof import __version__

    build = tf.sysconfig.get_build_info()
    return {
        "detprof": __version__,
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "cuda_build": build.get("cuda_version"),
        "cudnn_build": build.get("cudnn_version"),
        "is_cuda_build": bool(build.get("is_cuda_build")),
        "gpus_visible": len(tf.config.list_physical_devices("GPU")),
    }
