"""TensorFlow: op determinism, its own ``tf.function`` step, and its profiler (XSpace)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, MutableMapping, Sequence
from typing import Any

from .base import GRADIENT_SUMS, ArmStep, Backend, Compiler, Knob, LossOf, SettingColumn, Step, StopProfiler

DEBUG_ENV = "DETPROF_DEBUG"
"""Set (non-empty) to see everything: tracebacks of internal errors and TensorFlow's own log lines."""
LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
WORKER_LOG_LEVEL = "2"
"""Workers log TensorFlow's warnings and errors to their log files unless their launcher asked for less."""
DETERMINISTIC_OPS_ENV = "TF_DETERMINISTIC_OPS"
AUTOTUNE_ENV = "TF_CUDNN_USE_AUTOTUNE"
FIRST_GPU = "GPU:0"
"""The GPU Keras trains on, as TensorFlow names it for its memory statistics."""
OP_DETERMINISM = "tensorflow.op_determinism"
CUDNN_AUTOTUNE = "tensorflow.cudnn_autotune"
KNOBS = (
    Knob(
        OP_DETERMINISM,
        "tf.config.experimental.enable_op_determinism()",
        "deterministic implementations of every op that has one (cuDNN's algorithms included); an op without one "
        "raises",
    ),
    Knob(
        CUDNN_AUTOTUNE,
        f"{AUTOTUNE_ENV}=0",
        "no cuDNN autotuning: the first algorithm instead of the fastest measured one; not part of detprof's "
        "deterministic mode, since op determinism already restricts autotuning to deterministic algorithms",
        gpu_only="cuDNN runs only on a CUDA GPU",
        in_mode=False,
        per_process=f"{AUTOTUNE_ENV} is set for the whole process",
    ),
)


class TensorFlow(Backend):
    name = "tensorflow"
    module = "tensorflow"
    framework = "TensorFlow"
    tracer = "tf"
    trace_suffix = ".tfprof"
    unused_at_import = ("jax", "torch")
    """TensorFlow's import loads JAX (for TFLite's converter) whenever JAX is installed."""
    knobs_switch_between_runs = True
    version_keys = ("tensorflow",)
    cuda_build = "install TensorFlow's CUDA build: pip install 'tensorflow[and-cuda]'"
    switch_words = "tf.config.experimental.enable_op_determinism()"
    nondeterministic_op_advice = (
        "replace the op, or place it on the CPU (with tf.device('/CPU:0')), where TensorFlow's kernels are "
        "deterministic"
    )
    knobs = KNOBS
    compiler = Compiler(
        "jit_compile (XLA)",
        "xla",
        "compiles with XLA (jit_compile: the sweep's --xla)",
        "--xla is TensorFlow's jit_compile",
    )
    in_effect_columns = (
        SettingColumn("op determinism", "op_determinism"),
        SettingColumn("jit_compile (XLA, pinned)", "jit_compile"),
        SettingColumn("cuDNN autotune", "cudnn_autotune"),
        SettingColumn("TF_DETERMINISTIC_OPS", "deprecated_tf_deterministic_ops_env", environment=True),
    )
    settings_note = (
        "jit_compile is pinned to the same explicit value in both modes: Keras would otherwise turn XLA "
        "off under op determinism and compare XLA against non-XLA."
    )

    def switch(self, knobs: frozenset[str]) -> None:
        """Its stderr is the worker's log file: warnings and errors belong there, not every info line."""
        os.environ.setdefault(LOG_LEVEL_ENV, WORKER_LOG_LEVEL)
        if CUDNN_AUTOTUNE in knobs:
            os.environ[AUTOTUNE_ENV] = "0"
        import tensorflow as tf

        if OP_DETERMINISM in knobs:
            tf.config.experimental.enable_op_determinism()

    def shared_process_refusal(
        self, arms: Sequence[frozenset[str]], *, compile: bool, on_gpu: bool, asked: bool = False
    ) -> str | None:
        """On a GPU, cuDNN's autotuning keeps the algorithm it picked for a convolution's shape for the whole process,
        whichever arm picked it, so one arm could run the other's algorithms (not shown otherwise: no GPU here has
        TensorFlow); and its switch (``TF_CUDNN_USE_AUTOTUNE``) is set for the whole process (``Knob.per_process``)."""
        if on_gpu:
            return "TensorFlow keeps cuDNN's autotuned algorithms for the whole process, whichever mode chose them"
        return super().shared_process_refusal(arms, compile=compile, on_gpu=on_gpu, asked=asked)

    def arm_switch(self, knobs: frozenset[str]) -> Step:
        """Op determinism, on or off; TensorFlow reads it when it traces a function and when a kernel runs."""
        from tensorflow.python.framework import config as tf_config

        return tf_config.enable_op_determinism if OP_DETERMINISM in knobs else tf_config.disable_op_determinism

    def arm_steps(self, model: Any, x: Any, y: Any, arms: Sequence[frozenset[str]]) -> list[ArmStep]:
        """Keras' own step (``train_step``) in a ``tf.function`` of each arm's own, with the arm's op determinism
        switched before each call. TensorFlow reads the switch twice: when it traces a function (the Python API
        picks an op's implementation then: sparse cross-entropy is a log-softmax and a gather under determinism,
        one fused op without) and when a kernel runs (an op without a deterministic kernel raises then). Each arm's
        function is traced at its first call, under its arm's switch, and never reused by the other arm: a function
        traced under one setting keeps its ops under the other (``tests/test_in_process.py``)."""
        import tensorflow as tf

        def arm(knobs: frozenset[str]) -> ArmStep:
            switch = self.arm_switch(knobs)

            def train_step(data: Any) -> Any:  # a function of its own: TensorFlow traces each arm anew
                return model.train_step(data)

            compiled = tf.function(train_step, jit_compile=model.jit_compile, reduce_retracing=True)

            def step() -> None:
                switch()
                logs = compiled((x, y))
                tf.nest.map_structure(lambda value: value.numpy(), logs)  # the step is over once its logs are read

            switch()
            return step, self.in_effect()

        return [arm(knobs) for knobs in arms]

    def program_environment(self, env: MutableMapping[str, str], deterministic: bool) -> None:
        """``TF_DETERMINISTIC_OPS``: TensorFlow 2.21 still honours it (``is_op_determinism_enabled()`` is then True)."""
        env.pop(DETERMINISTIC_OPS_ENV, None)
        if deterministic:
            env[DETERMINISTIC_OPS_ENV] = "1"

    def seed(self, seed: int) -> None:
        import tensorflow as tf

        tf.random.set_seed(seed)

    def in_effect(self) -> dict[str, Any]:
        from tensorflow.python.framework import config as tf_config

        return {
            "op_determinism": bool(tf_config.is_op_determinism_enabled()),
            "cudnn_autotune": _autotune(),
            "deprecated_tf_deterministic_ops_env": os.environ.get(DETERMINISTIC_OPS_ENV),
            "knobs": self.knobs_in_effect(),
        }

    def knobs_in_effect(self) -> dict[str, bool]:
        from tensorflow.python.framework import config as tf_config

        return {OP_DETERMINISM: bool(tf_config.is_op_determinism_enabled()), CUDNN_AUTOTUNE: not _autotune()}

    def versions(self) -> dict[str, Any]:
        import tensorflow as tf

        build = tf.sysconfig.get_build_info()
        return {
            "tensorflow": tf.__version__,
            "cuda_build": build.get("cuda_version"),
            "cudnn_build": build.get("cudnn_version"),
            "is_cuda_build": bool(build.get("is_cuda_build")),
            "gpus_visible": len(tf.config.list_physical_devices("GPU")),
        }

    def limit_threads(self, threads: int) -> bool:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        return True

    def out_of_memory(self, exc: BaseException) -> bool:
        tf = sys.modules.get(self.module)
        return tf is not None and isinstance(exc, tf.errors.ResourceExhaustedError)

    def device_name(self) -> str:
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            return "cpu"
        return str(tf.config.experimental.get_device_details(gpus[0]).get("device_name", gpus[0].name))

    def init_device(self) -> None:
        """TensorFlow's devices, which it makes at the first question about them."""
        import tensorflow as tf

        tf.config.list_logical_devices()

    peak_memory_per_arm = True
    no_peak_memory = "TensorFlow keeps allocator statistics only for a GPU"

    def peak_memory(self) -> int | None:
        import tensorflow as tf

        if not tf.config.list_logical_devices("GPU"):
            return None
        return int(tf.config.experimental.get_memory_info(FIRST_GPU)["peak"])

    def reset_peak_memory(self) -> None:
        import tensorflow as tf

        tf.config.experimental.reset_memory_stats(FIRST_GPU)

    def gradient_step(self, model: Any, loss_of: LossOf, optimizer: Any, x: Any, y: Any) -> tuple[list[Any], list[Any]]:
        import tensorflow as tf

        with tf.GradientTape() as tape:
            outputs = model(x, training=True)
            loss = loss_of(y, outputs[-1])
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return list(outputs), grads

    def start_profiler(self, trace_path: str) -> StopProfiler:
        import tensorflow as tf

        tf.profiler.experimental.start(trace_path)
        return tf.profiler.experimental.stop

    def step_mark(self, name: str) -> contextlib.AbstractContextManager[None]:
        import tensorflow as tf

        return tf.profiler.experimental.Trace(name)

    def step_scopes(self) -> dict[str, str]:
        return {"AddN": GRADIENT_SUMS}


def _autotune() -> bool:
    """cuDNN autotuning as TensorFlow reads ``TF_CUDNN_USE_AUTOTUNE``: on unless set false."""
    return os.environ.get(AUTOTUNE_ENV, "1") not in ("0", "false", "False")


def debugging() -> bool:
    """Whether the user asked to see what detprof normally hides (the same test as the CLI's traceback switch)."""
    return bool(os.environ.get(DEBUG_ENV))


@contextlib.contextmanager
def quiet_tensorflow() -> Iterator[None]:
    """Import TensorFlow (or Keras) in this block to keep TensorFlow's C++ log lines off the user's terminal.

    The one way detprof's own process loads TensorFlow. Its C++ side writes straight to fd 2
    (oneDNN notices, "Could not find cuda drivers", "failed call to cuInit"), which would bury
    detprof's output and its one-line errors. Two things are needed, because neither is
    enough alone: ``TF_CPP_MIN_LOG_LEVEL=3``, which TensorFlow reads once while it loads and
    which then also hides lines it logs later (cuInit fails at the first op, not at import);
    and fd 2 pointed at /dev/null for the block, because absl prints what is logged before
    its own initialization whatever the level says. The variable is restored afterwards so
    that worker processes started later still log to their log files.
    ``TF_ENABLE_ONEDNN_OPTS`` is left alone: it changes the numerics, not just the logging.

    Python exceptions raised in the block still propagate; detprof's main reports them once
    fd 2 is back. Once TensorFlow is loaded (every worker has loaded it in
    ``determinism.apply``) the block does nothing: the start-up chatter is over, and hiding
    fd 2 would hide only detprof's own output. With ``DETPROF_DEBUG=1`` nothing is silenced.
    """
    if debugging() or TensorFlow.module in sys.modules:
        yield
        return
    previous = os.environ.get(LOG_LEVEL_ENV)
    os.environ[LOG_LEVEL_ENV] = "3"
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
            os.environ.pop(LOG_LEVEL_ENV, None)
        else:
            os.environ[LOG_LEVEL_ENV] = previous


def _flush_stderr() -> None:
    """Whatever Python buffered goes out on the fd 2 it was written under, not after the switch."""
    if sys.stderr is not None:
        sys.stderr.flush()
