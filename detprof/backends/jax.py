"""JAX: XLA's deterministic-ops flag, read back as XLA parsed it, and ``jax.profiler`` (XSpace)."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from .base import ArmStep, Backend, Compiler, Knob, LossOf, SettingColumn, StopProfiler

XLA_FLAGS_ENV = "XLA_FLAGS"
DETERMINISTIC_FLAG = "--xla_gpu_deterministic_ops"
DEBUG_OPTIONS_PATH = (3, 3)
"""``CompileOptionsProto.executable_build_options`` (3), then ``ExecutableBuildOptionsProto.debug_options`` (3)."""
SCATTER_EXPANDER_FIELD = 345
"""``DebugOptions.xla_gpu_enable_scatter_determinism_expander`` (read off this jaxlib: the field its flag sets).
Without it, a deterministic scatter on a GPU falls back to a much slower loop, and its default has changed between
XLA versions: every run records it (``scatter_determinism_expander``) beside ``XLA_FLAGS``."""
XLA_GPU_ONLY = "an XLA GPU flag: XLA compiles for the CPU the same either way"


EXPANDER_FLAG = "--xla_gpu_enable_scatter_determinism_expander"
FLIPPED = "flipped"
"""An ``XlaKnob``'s value that turns the installed XLA's default around (``scatter_expander_default``)."""


@dataclass(frozen=True)
class XlaKnob:
    """A knob that is one flag of ``XLA_FLAGS``, read back as XLA parsed it: a field of its ``DebugOptions``."""

    knob: Knob
    flag: str
    value: str
    """The flag's value when the knob is on; ``FLIPPED``: the opposite of the installed XLA's default."""
    field: int
    """The flag's field number in XLA's ``DebugOptions`` (xla.proto)."""
    on: int | None
    """The field's value when the knob is on (proto3 leaves a field at its default unwritten); None: ``FLIPPED``."""

    def flag_value(self) -> str:
        """The flag's value when the knob is on, as ``XLA_FLAGS`` takes it."""
        if self.value != FLIPPED:
            return self.value
        return "false" if scatter_expander_default() else "true"

    def is_on(self, options: Mapping[int, Any]) -> bool:
        """Whether the knob is on in ``options`` (a process's ``debug_options``). A flipped knob is off wherever
        the process's ``XLA_FLAGS`` does not name its flag (detprof takes a user's out: ``xla_flags``), so that no
        run without it pays for reading the installed default."""
        if self.on is not None:
            return options.get(self.field, 0) == self.on
        if self.flag not in os.environ.get(XLA_FLAGS_ENV, ""):
            return False
        return (options.get(self.field, 0) == 1) != scatter_expander_default()


XLA_KNOBS = (
    XlaKnob(
        Knob(
            "jax.xla_gpu_deterministic_ops",
            f"XLA_FLAGS={DETERMINISTIC_FLAG}=true",
            "deterministic implementations of every op (scatter and reductions without atomics), and autotuning "
            "that picks the same kernel every run",
            gpu_only=XLA_GPU_ONLY,
        ),
        DETERMINISTIC_FLAG,
        "true",
        148,
        1,
    ),
    XlaKnob(
        Knob(
            "jax.xla_gpu_exclude_nondeterministic_ops",
            "XLA_FLAGS=--xla_gpu_exclude_nondeterministic_ops=true",
            "only ops with a deterministic implementation (compiling fails on one without, such as max pooling's "
            "gradient), without deterministic_ops' hold on autotuning; not part of detprof's deterministic mode",
            gpu_only=XLA_GPU_ONLY,
            in_mode=False,
            in_every=True,
        ),
        "--xla_gpu_exclude_nondeterministic_ops",
        "true",
        297,
        1,
    ),
    XlaKnob(
        Knob(
            "jax.xla_gpu_autotune_level",
            "XLA_FLAGS=--xla_gpu_autotune_level=0",
            "no autotuning of GPU kernels (level 0 instead of 4); not part of detprof's deterministic mode",
            gpu_only=XLA_GPU_ONLY,
            in_mode=False,
            in_every=True,
        ),
        "--xla_gpu_autotune_level",
        "0",
        123,
        0,
    ),
    XlaKnob(
        Knob(
            "jax.xla_gpu_enable_scatter_determinism_expander",
            f"XLA_FLAGS={EXPANDER_FLAG}=<the installed XLA's default, turned around>",
            "XLA's rewrite of a deterministic scatter into sorted segments, much faster than the serial loop it "
            "replaces (openxla/xla#34917); its default has changed between XLA versions, so the knob turns this "
            "one's around; not part of detprof's deterministic mode",
            gpu_only=XLA_GPU_ONLY,
            in_mode=False,
            in_every=True,
        ),
        EXPANDER_FLAG,
        FLIPPED,
        SCATTER_EXPANDER_FIELD,
        None,
    ),
)


def xla_flags(user_flags: str, knobs: frozenset[str]) -> str:
    """``XLA_FLAGS`` for a run: the user's flags without detprof's knobs, plus the knobs asked for.

    A knob's flag the user set is removed where the run does not ask for it: the default is
    XLA's default.
    """
    ours = {xla.flag for xla in XLA_KNOBS}
    kept = [flag for flag in user_flags.split() if flag.split("=", 1)[0] not in ours]
    kept += [f"{xla.flag}={xla.flag_value()}" for xla in XLA_KNOBS if xla.knob.name in knobs]
    return " ".join(kept)


@functools.lru_cache(maxsize=1)
def scatter_expander_default() -> bool:
    """The installed XLA's own default for its scatter determinism expander, read in a process started without
    detprof's knobs' flags (``xla_flags`` of none): XLA parses ``XLA_FLAGS`` once per process, so this one's reading
    may hold a flag already."""
    env = dict(os.environ)
    env[XLA_FLAGS_ENV] = xla_flags(env.pop(XLA_FLAGS_ENV, ""), frozenset())
    probe = "from detprof.backends.jax import scatter_expander; print(int(scatter_expander()))"
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True, timeout=300
        )
    except (subprocess.SubprocessError, OSError) as exc:
        raise RuntimeError(f"could not read the installed XLA's default for {EXPANDER_FLAG}: {exc}") from exc
    return done.stdout.split()[-1:] == ["1"]


class Jax(Backend):
    name = "jax"
    module = "jax"
    framework = "JAX"
    tracer = "jax"
    trace_suffix = ".jaxprof"
    keeps_out = ("tensorflow",)
    version_keys = ("jax", "jaxlib")
    cuda_build = "install JAX's CUDA plugin: pip install 'jax[cuda12]'"
    switch_words = "XLA_FLAGS+=--xla_gpu_deterministic_ops=true (the user's other flags kept)"
    nondeterministic_op_advice = "replace the op, or run it on the CPU (with jax.default_device)"
    compiler = Compiler("jax.jit", None, "always compiles with XLA")
    knobs = tuple(xla.knob for xla in XLA_KNOBS)
    arm_route = (
        "a compile option of each arm's step, both arms in one process, where the pairing check (detprof gpu-study) "
        "agrees; else in XLA_FLAGS, a process per arm"
    )
    in_effect_columns = (
        SettingColumn("op determinism (xla_gpu_deterministic_ops)", "op_determinism"),
        SettingColumn("XLA_FLAGS", "xla_flags", environment=True),
        SettingColumn("scatter determinism expander", "scatter_determinism_expander"),
    )
    settings_note = (
        "JAX compiles every step with XLA in both modes; op determinism is XLA's own flag, as XLA parsed it."
    )

    def switch(self, knobs: frozenset[str]) -> None:
        """The flags go into ``XLA_FLAGS`` beside the user's own flags, which XLA reads when JAX starts."""
        _set_flags(os.environ, knobs)
        import jax  # noqa: F401

    def arm_steps(self, model: Any, x: Any, y: Any, arms: Sequence[frozenset[str]]) -> list[ArmStep]:
        """Keras' own JAX step (``train_step``, as ``train_on_batch`` jits it) compiled once per arm with its knobs
        (``compiled_arms``), the arms taking turns on one model state."""
        data = (x, y, None)
        model._symbolic_build(data_batch=data)
        state = model._get_jax_state(**dict.fromkeys(_JAX_STATE, True), purge_model_variables=False)

        def train_step(state: Any, data: Any) -> Any:
            return model.train_step(state, data)

        return compiled_arms(train_step, state, data, arms)

    def program_environment(self, env: MutableMapping[str, str], deterministic: bool) -> None:
        _set_flags(env, self.mode_knobs() if deterministic else frozenset())

    def in_effect(self) -> dict[str, Any]:
        options = debug_options()
        knobs = _knobs_in(options)
        return {
            "op_determinism": knobs[XLA_KNOBS[0].knob.name],
            "xla_flags": os.environ.get(XLA_FLAGS_ENV, ""),
            "scatter_determinism_expander": scatter_expander(options),
            "knobs": knobs,
        }

    def knobs_in_effect(self) -> dict[str, bool]:
        """The flags as XLA parsed them (``debug_options``)."""
        return _knobs_in(debug_options())

    def versions(self) -> dict[str, Any]:
        from importlib.metadata import distributions

        import jax
        import jaxlib

        plugins = [str(d.metadata["Name"] or "") for d in distributions()]
        cuda = [name for name in plugins if name.startswith(("jax-cuda", "jax_cuda"))]
        return {
            "jax": jax.__version__,
            "jaxlib": jaxlib.__version__,
            "cuda_build": next((m[1] for name in cuda if (m := re.match(r"jax[-_]cuda(\d+)", name))), None),
            "is_cuda_build": bool(cuda),
            "gpus_visible": len([d for d in jax.devices() if d.platform == "gpu"]),
        }

    def out_of_memory(self, exc: BaseException) -> bool:
        jax = sys.modules.get(self.module)
        return jax is not None and isinstance(exc, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" in str(exc)

    def device_name(self) -> str:
        import jax

        device = jax.devices()[0]
        return "cpu" if device.platform == "cpu" else str(device.device_kind)

    def init_device(self) -> None:
        """XLA's client for the device, which JAX makes at the first question about its devices."""
        import jax

        jax.devices()

    no_peak_memory = "XLA keeps allocator statistics only for a GPU"

    def peak_memory(self) -> int | None:
        """XLA's peak for the process: it cannot start it again between two arms' steps."""
        import jax

        stats = jax.local_devices()[0].memory_stats() or {}
        return int(stats["peak_bytes_in_use"]) if "peak_bytes_in_use" in stats else None

    def gradient_step(self, model: Any, loss_of: LossOf, optimizer: Any, x: Any, y: Any) -> tuple[list[Any], list[Any]]:
        """As Keras' own JAX step: ``stateless_call`` under ``jax.value_and_grad``, compiled with ``jax.jit``; the
        non-trainable state the pass updates (batch-norm statistics, seed generators) is written back."""
        trainable = [variable.value for variable in model.trainable_variables]
        non_trainable = [variable.value for variable in model.non_trainable_variables]
        (_, (outputs, non_trainable)), grads = _compiled_step(model, loss_of)(trainable, non_trainable, x, y)
        for variable, value in zip(model.non_trainable_variables, non_trainable, strict=True):
            variable.assign(value)
        optimizer.apply(grads, model.trainable_variables)
        return list(outputs), list(grads)

    def start_profiler(self, trace_path: str) -> StopProfiler:
        """Python calls are not traced: every one of them would tax the traced steps for nothing."""
        import jax

        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 0
        jax.profiler.start_trace(trace_path, profiler_options=options)
        return jax.profiler.stop_trace

    def step_mark(self, name: str) -> contextlib.AbstractContextManager[None]:
        import jax

        return jax.profiler.TraceAnnotation(name)

    def compile_in_this_process(self, compiled: bool, *, compared: bool) -> dict[str, str]:
        """Off in every process (JAX compiles every step, and a traced process needs it as much as a compared one):
        JAX's persistent compilation cache (``JAX_COMPILATION_CACHE_DIR``, a user's or a platform's). A step loaded
        from it reaches the profiler without its HLO, so none of its kernels names an op or a layer (a sweep's second
        repeat was 39% unattributed, its planted layer half hidden); and two runs that load one executable from it
        cannot differ in what XLA's compilation chose."""
        import jax

        jax.config.update("jax_enable_compilation_cache", False)
        return {"compilation_cache": "on" if jax.config.jax_enable_compilation_cache else "off"}


def compiled_arms(
    pure_step: Callable[[Any, Any], tuple[Any, Any]], state: Any, data: Any, arms: Sequence[frozenset[str]]
) -> list[ArmStep]:
    """Per arm, ``pure_step`` (a pure function of the state and the batch, returning its output and the state
    after it) compiled with the arm's knobs as XLA compile options, in ``compile_order``, with what the arm has in
    effect. XLA reads its flags once, when JAX starts, and a compile option overrides them for that one executable
    (an option XLA does not know fails the compilation); Python code that reads ``XLA_FLAGS`` while the step is
    traced sees the arm's (``_flags_while_traced``). The state is donated: the arms take turns on one state, each
    step's output state the next step's input."""
    import jax

    from detprof.device_time import charged

    held = [state]

    def arm(knobs: frozenset[str]) -> ArmStep:
        def train_step(state: Any, data: Any) -> tuple[Any, Any]:  # a function of its own: JAX traces each anew
            return pure_step(state, data)

        options = compiler_options(knobs)
        with _flags_while_traced(knobs), charged("compile", before="build"):
            compiled = jax.jit(train_step, donate_argnums=0).lower(held[0], data).compile(compiler_options=options)

        def step() -> None:
            output, held[0] = compiled(held[0], data)
            jax.block_until_ready(output)

        effect = {
            "op_determinism": XLA_KNOBS[0].knob.name in knobs,
            "xla_flags": xla_flags(os.environ.get(XLA_FLAGS_ENV, ""), knobs),
            "compiler_options": options,
            "scatter_determinism_expander": bool(options.get(EXPANDER_FLAG.removeprefix("--"), scatter_expander())),
            "knobs": {xla.knob.name: xla.knob.name in knobs for xla in XLA_KNOBS},
        }
        return step, effect

    steps = {i: arm(arms[i]) for i in compile_order(arms)}
    return [steps[i] for i in range(len(arms))]


def compile_order(arms: Sequence[frozenset[str]]) -> list[int]:
    """The arms in the order their steps are compiled: the one with most knobs first. XLA keeps the kernels its
    autotuner picked for the rest of the process, whichever executable asked, so an arm compiled second may run
    the first one's picks, which a process of its own never would: on an H100 the medium CNN's deterministic arm
    took 6-7% less kernel time at 5x5 and 7x7 where the default arm had compiled first, in both GPU runs kept
    (``reference/h100-2026-11-2[78]``), while the default arm's time did not move with the order."""
    return sorted(range(len(arms)), key=lambda i: -len(arms[i]))


_JAX_STATE = ("trainable_variables", "non_trainable_variables", "optimizer_variables", "metrics_variables")


def compiler_options(knobs: frozenset[str]) -> dict[str, bool | int]:
    """The knobs as XLA compile options (each flag's name without its dashes, its value typed as the option is):
    those of one executable."""
    typed = {"true": True, "false": False}
    on = [(xla.flag.removeprefix("--"), xla.flag_value()) for xla in XLA_KNOBS if xla.knob.name in knobs]
    return {option: typed[value] if value in typed else int(value) for option, value in on}


@contextlib.contextmanager
def _flags_while_traced(knobs: frozenset[str]) -> Iterator[None]:
    """``XLA_FLAGS`` as a process of the arm's own would have it, while the arm's step is traced: Python code that
    reads it (a layer that takes another path under determinism) sees its arm's; XLA itself read the flags when JAX
    started, and takes the arm's as compile options."""
    before = os.environ.get(XLA_FLAGS_ENV)
    _set_flags(os.environ, knobs)
    try:
        yield
    finally:
        os.environ.pop(XLA_FLAGS_ENV, None)
        if before is not None:
            os.environ[XLA_FLAGS_ENV] = before


def _set_flags(env: MutableMapping[str, str], knobs: frozenset[str]) -> None:
    flags = xla_flags(env.pop(XLA_FLAGS_ENV, ""), knobs)
    if flags:
        env[XLA_FLAGS_ENV] = flags


@functools.lru_cache(maxsize=4)
def _compiled_step(model: Any, loss_of: LossOf) -> Callable[..., Any]:
    """``Jax.gradient_step``'s pass, compiled once per model: every step of a run reuses it."""
    import jax

    def loss_and_outputs(trainable: Any, non_trainable: Any, x: Any, y: Any) -> tuple[Any, tuple[Any, Any]]:
        outputs, non_trainable = model.stateless_call(trainable, non_trainable, x, training=True)
        return loss_of(y, outputs[-1]), (outputs, non_trainable)

    return jax.jit(jax.value_and_grad(loss_and_outputs, has_aux=True))


def _knobs_in(options: Mapping[int, Any]) -> dict[str, bool]:
    return {xla.knob.name: xla.is_on(options) for xla in XLA_KNOBS}


def scatter_expander(options: Mapping[int, Any] | None = None) -> bool:
    """Whether XLA rewrites scatters for determinism (``SCATTER_EXPANDER_FIELD``), as this process's XLA parsed it
    (``options``: its ``debug_options``, where the caller has read them)."""
    return (debug_options() if options is None else options).get(SCATTER_EXPANDER_FIELD, 0) == 1


def debug_options() -> dict[int, Any]:
    """Field by field, the ``DebugOptions`` that XLA builds from ``XLA_FLAGS`` for every
    compilation.

    jaxlib exposes those options only as a serialized ``CompileOptionsProto``, without the
    message classes, so the fields are read from the wire format (proto3 writes a field
    only where it is not at its default). An ``XLA_FLAGS`` typo would not pass: XLA aborts
    on unknown flags.
    """
    from google.protobuf import empty_pb2
    from google.protobuf.unknown_fields import UnknownFieldSet
    from jax._src.lib import _jax

    def fields(wire: bytes) -> UnknownFieldSet:
        message = empty_pb2.Empty()
        message.ParseFromString(wire)
        return UnknownFieldSet(message)

    wire = _jax.CompileOptions().SerializeAsString()
    for number in DEBUG_OPTIONS_PATH:
        wire = next((f.data for f in fields(wire) if f.field_number == number), b"")
    return {f.field_number: f.data for f in fields(wire)}
