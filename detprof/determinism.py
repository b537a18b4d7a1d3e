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


def quiet_tensorflow() -> None:
    """Keep TensorFlow's C++ start-up chatter out of detprof's output."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def apply(settings: DeterminismSettings) -> dict[str, Any]:
    """Switch the framework into ``settings.mode``; returns the effective settings."""
    quiet_tensorflow()
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
