"""The shape every framework detprof runs takes: one ``Backend`` subclass per Keras backend.

What detprof knows of a framework (how deterministic mode is switched on and read back, its
versions, the device it trains on, its threads, its out-of-memory error, its profiler, and
how a plan or a report words all that) lives in its subclass and nowhere else, so that a
fourth framework is one module and one line of the registry (``backends/__init__``).

Every module of this package imports only the standard library at module level, and other
modules of the package only relatively: each framework is imported inside the methods that
need it, and the ``sitecustomize`` hook of a program run loads the package by its path into
the program's own interpreter, which may not have detprof installed (``backends.program``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

StopProfiler = Callable[[], None]
"""What ``Backend.start_profiler`` returns: the call that stops the capture and writes the trace."""
Step = Callable[[], None]
"""One training step, run to completion."""
ArmStep = tuple[Step, dict[str, Any]]
"""An arm's step in a process that runs two arms in turn (``Backend.arm_steps``), and what that arm has in effect
(``Backend.in_effect`` as it reads there)."""
LossOf = Callable[[Any, Any], Any]
"""A loss function, ``loss(y_true, y_pred)``."""


NVTX_DOMAIN = "detprof"
"""The NVTX domain of the ranges a worker pushes (its steps, its layers), apart from the frameworks' own."""
LAYER_RANGE = "layer:"
"""The prefix of the profiler ranges a worker puts around each Keras layer call where the framework's trace
names no layer (PyTorch): the Kineto and nsys parsers turn them into layer paths (``traces.attribution``)."""


UNUSED_AT_IMPORT = ("sklearn", "pandas")
"""Packages Keras' own import loads whenever they are installed, for its scikit-learn wrappers and for pandas
frames as ``fit``'s input, which detprof never uses: a second or more of every worker's start-up
(``backends.unused_kept_out``). Keras asks for them only at its import, so a worker's own code (a user's model)
may import them later."""


LOSS_PART = "(loss)"
OPTIMIZER_PART = "(optimizer update)"
STEP_PARTS = (LOSS_PART, OPTIMIZER_PART)
"""The parts of a training step that are no layer of the model, marked as layers are where the framework's trace
names neither (PyTorch): the loss (its backward pass with it) and the optimizer's update are rows of their own in
the leaderboard, not "(unattributed)"."""
TOP_LEVEL_PART = "(top-level ops)"
"""What a native module's own call runs outside every submodule (a functional activation or pooling written in its
``forward`` or ``__call__``): a row of its own, where a Keras model's call runs nothing but its layers."""
COMPILED_PART = "(torch.compile region)"
"""Where a module's forward (and its backward) ran compiled by ``torch.compile``: its submodules' ranges do not
reach inside the compiled graph, so what runs there is placed in the module that holds it where a range says so,
and in this row of its own otherwise (with Inductor's fused kernels by their names in the kernel table)."""


NO_ATTENTION = "no model studied is known to run attention (for your own, name the knob in --knobs)"
GRADIENT_SUMS = "(gradient sums)"
"""TensorFlow's sums of the gradients of a tensor that several layers read (a residual connection's), which its
tape adds up outside every layer's scope (``AddN``): a row of their own, not "(unattributed)"."""
COMPILED_LOSS_SCOPE = "compile_loss"
"""The name scope of a Keras model's compiled loss, in TensorFlow's op names and JAX's op metadata alike."""


def layer_range_name(layer: str) -> str:
    return f"{LAYER_RANGE}{layer}"


def graph_site(op: str, index: int, count: int) -> str:
    """Where an aten op that a compiled graph's code calls as it is (an extern kernel: ``aten::mm``) ran in one call
    of the graph: the ``index``-th of the ``count`` calls of that op in the graph's call, ``aten::mm 3/14``. The
    trace names such an op only by its aten name, the same for every matrix product of the model; its place among
    the call's ops of that name tells them apart (``inductor_places.kernel_places`` names each extern kernel so, the
    Kineto parser each op it finds there). Counted by name, an op the call runs besides (Inductor's deterministic
    ``index_put_``, which provenance tracking does not list) moves no other; the count keeps a call that runs one
    more of the same op from taking a neighbour's module."""
    return f"{op} {index}/{count}"


STEP_RANGE = r"^step \d+(?: \w+)?$"
"""A measured step's range, as the worker marks it (``profiler.tracers``) and the trace layer splits kernels by it
(``traces.step_split``): ``step i``, or ``step i ARM`` where one process measured two arms in turn (an in-process
pair: ``step 3 deterministic``), each arm's steps numbered on their own."""


def step_range_name(index: int, arm: str | None = None) -> str:
    return f"step {index}" if arm is None else f"step {index} {arm}"


@dataclass(frozen=True)
class Knob:
    """One switch of a framework's determinism, which ``detprof sweep --knobs`` prices alone.

    Determinism is several switches, and one of them often carries most of the cost; each is
    declared here, by the backend that sets it, so that a knob study, a plan and a report name
    it the same way and ``Backend.switch`` sets exactly the knobs a run asks for.
    """

    name: str
    """``<backend>.<switch>``, as ``--knobs`` takes it: ``torch.fill_uninitialized_memory``."""
    setting: str
    """How it is set, as code or an environment variable: what a user copies into a program."""
    does: str
    """What it does, in one sentence."""
    gpu_only: str | None = None
    """Why it cannot matter on a CPU (what it switches runs only on a GPU); None: it can matter anywhere."""
    in_mode: bool = True
    """Part of detprof's deterministic mode; False: an extra switch, priced added to the default only (unless
    ``in_every``)."""
    in_every: bool = False
    """An extra switch that users set for determinism beside the mode's (XLA's exclusion of nondeterministic ops,
    its autotuning level): a knob study also prices what it carries among every such switch on (``every``), by
    leaving it out of them, where the device takes it."""
    needs: str | None = None
    """The knob without which this one has no effect: it is priced only where that one is on."""
    per_process: str | None = None
    """Why the framework takes it only when a process starts: arms that differ in it share a process only where one
    was asked for by name, and a process that runs arms of which one sets it sets it when it starts
    (``Backend.process_knobs``); None: switchable between steps."""

    attention_only: bool = False
    """It switches how attention runs: a study of models that run none lists it as not applicable."""
    compiled_only: str | None = None
    """Why it matters only where the step is compiled (``--compile``); None: compiled or not."""

    def applies(self, on_gpu: bool, attention: bool = True, compiled: bool = True) -> str | None:
        """None where the knob can matter on the device measured, for models that run attention or not, compiled or
        not; else why it cannot."""
        if self.attention_only and not attention:
            return NO_ATTENTION
        if self.compiled_only is not None and not compiled:
            return self.compiled_only
        return None if on_gpu or self.gpu_only is None else self.gpu_only


HELPER_COMPARISON = "helper:"
"""A knob study's comparison that prices a library's helper is called this, then its ``Helper.key``."""


@dataclass(frozen=True)
class Helper:
    """A library's one call for determinism (Hugging Face's ``enable_full_determinism``, ...): the framework's
    switches it sets (``Knob`` names, as its source sets them), which a knob study prices whole."""

    key: str
    """Its name in a comparison and a run id: ``hf_full_determinism``."""
    call: str
    """The call as users write it: ``transformers.enable_full_determinism(seed)``."""
    knobs: frozenset[str]
    differs: str = ""
    """Where it sets a switch otherwise than the knob does (a value detprof's knob sets apart), in words."""


@dataclass(frozen=True)
class SettingColumn:
    """One setting a report shows for a backend's runs: its heading, and the ``Backend.in_effect`` key it reads."""

    heading: str
    key: str
    environment: bool = False
    """The setting is an environment variable: an empty one reads as unset."""

    def shown(self, in_effect: dict[str, Any]) -> Any:
        value = in_effect.get(self.key)
        return (value or "unset") if self.environment else value


@dataclass(frozen=True)
class Compiler:
    """How a backend compiles its training step, pinned to one explicit choice in both modes."""

    name: str
    """The compiler, as a plan names it."""
    option: str | None
    """The option that compiles the step (``xla``: ``--xla``, ``compile``: ``--compile``); None: always compiled."""
    compiles: str
    """How this backend compiles, in a refusal of another backend's option."""
    option_words: str = ""
    """What ``option`` is, for a user who gives it to another backend."""


class Backend:
    """A Keras backend: its framework, how determinism is switched in it, and how it is measured and described."""

    name: ClassVar[str]
    """``KERAS_BACKEND`` and ``--backend``: the name results, records and reports use."""
    module: ClassVar[str]
    """The framework's top-level module; its extra is ``detprof[<name>]``."""
    framework: ClassVar[str]
    """The framework as readers know it: "PyTorch"."""
    compiled_step_cache: ClassVar[str] = "persistent compilation cache"
    """What keeps the framework's compiled steps across processes, in words (``compile_in_this_process``)."""
    tracer: ClassVar[str]
    """``--tracer`` of the framework's own profiler."""
    trace_suffix: ClassVar[str]
    """What the own profiler's trace is named after the run id."""
    keeps_out: ClassVar[tuple[str, ...]] = ()
    """Modules kept out of this backend's workers (``determinism.apply``): frameworks Keras would load
    for nothing. TensorFlow's modules import JAX where it is installed, and Keras on JAX reaches into
    torch's types, so those must stay importable where they are used."""
    unused_at_import: ClassVar[tuple[str, ...]] = ()
    """Packages the framework's own import loads whenever they are installed, for features detprof never uses
    (kept out while the framework and Keras load: ``backends.unused_kept_out``)."""
    version_keys: ClassVar[tuple[str, ...]]
    """The packages of ``versions`` a CI baseline compares (``check.baseline_file``)."""
    cuda_build: ClassVar[str]
    """How to install the framework's CUDA build (``detprof doctor``'s fix)."""
    switch_words: ClassVar[str]
    """What deterministic mode switches, as a plan shows it (``sweep --dry-run``)."""
    in_effect_columns: ClassVar[tuple[SettingColumn, ...]]
    """The settings a report shows for this backend's runs."""
    settings_note: ClassVar[str]
    """One sentence under that table: what is pinned alike in both modes."""
    nondeterministic_op_advice: ClassVar[str]
    """What a user can do about an op this framework has no deterministic implementation of (``findings``)."""
    knobs: ClassVar[tuple[Knob, ...]]
    """Every switch of this framework's determinism (``Knob``); deterministic mode sets those ``in_mode``."""
    switched_after_import: ClassVar[bool] = False
    """Whether a program's deterministic mode needs ``switch_on`` once it imports the framework (no
    environment variable switches it: ``backends.program``)."""
    helpers: ClassVar[tuple[Helper, ...]] = ()
    """Libraries' one-call determinism on this framework, priced whole by a knob study."""
    arm_route: ClassVar[str] = "switched between steps: both arms in one process"
    """How a knob study sets a knob that a process need not take when it starts (``Knob.per_process``: None), as
    ``knob_route`` says it."""
    knobs_switch_between_runs: ClassVar[bool] = False
    """Whether ``arm_switch`` puts a process under another arm's knobs for the next model it trains, as it does
    for the next step (PyTorch reads its switches at every op, TensorFlow when it traces a function and when a
    kernel runs): a replica then trains a knob study's checks of every arm in one process (``verify.run``).
    JAX takes its knobs as compile options of an arm's own step and as flags it reads when it starts."""
    deterministic_mode_times_kernels: ClassVar[bool] = True
    """Whether deterministic mode on a GPU still picks some kernels by timing them: XLA's GEMM autotuner keeps timing
    cuBLAS's algorithms under deterministic ops, TensorFlow cuDNN's deterministic ones. Two runs beside each other on
    one GPU could then pick apart, so ``verify`` gives each run the device to itself
    (``verify.run.replicas_side_by_side``). PyTorch's deterministic mode turns cuDNN's benchmark off and picks by
    heuristics alone."""

    def installed(self) -> bool:
        """Whether the framework is installed, found without importing it."""
        return importlib.util.find_spec(self.module) is not None

    def loaded(self) -> bool:
        return self.module in sys.modules

    compiler: ClassVar[Compiler]

    def jit_compile(self, xla: bool, compile: bool) -> bool:
        """What Keras' ``jit_compile`` is here for ``--xla`` and ``--compile``, the same in both modes."""
        return bool({"xla": xla, "compile": compile}.get(self.compiler.option or "", True))

    def compiler_words(self, xla: bool, compile: bool) -> str:
        """The compile setting pinned in both modes, as a plan shows it."""
        option = self.compiler.option
        if option is None:
            return f"{self.compiler.name} in both modes (always)"
        on = f"on in both modes (--{option})" if self.jit_compile(xla, compile) else "off in both modes"
        return f"{self.compiler.name} pinned: {on}"

    # Determinism: switched before the framework does any work, read back from the framework.

    def mode_knobs(self) -> frozenset[str]:
        """The knobs deterministic mode sets."""
        return frozenset(knob.name for knob in self.knobs if knob.in_mode)

    def knob_route(self, knob: Knob) -> str:
        """How a knob study sets ``knob`` on a GPU, in words: where a CPU lists it as not applicable, a user reads
        how a GPU's study would take it."""
        return f"a process per arm ({knob.per_process})" if knob.per_process else self.arm_route

    def knob(self, name: str) -> Knob:
        """The knob called ``name``; KeyError for one this backend does not declare."""
        for knob in self.knobs:
            if knob.name == name:
                return knob
        raise KeyError(name)

    def knob_names(self) -> tuple[str, ...]:
        return tuple(knob.name for knob in self.knobs)

    def switch(self, knobs: frozenset[str]) -> None:
        """Put a fresh process (the framework not yet imported) under ``knobs`` (none: the framework's defaults),
        then import the framework."""
        raise NotImplementedError

    def knobs_in_effect(self) -> dict[str, bool]:
        """Each knob as the framework reports it in effect, once it is imported."""
        raise NotImplementedError

    def shared_process_refusal(
        self, arms: Sequence[frozenset[str]], *, compile: bool, on_gpu: bool, asked: bool = False
    ) -> str | None:
        """Why ``arms`` (each a knob set) cannot run in one process (``arm_steps``); None where they can. ``compile``:
        the step runs under the backend's compiler option (``--compile``); ``on_gpu``: on a GPU. ``asked``: one
        process was asked for by name (``--pairing in-process``), so a knob taken only when a process starts, which
        the arms set differently, is set for the whole process (``process_knobs``), every arm's record saying so,
        where it would otherwise refuse: the pairing check measures what that costs the answer."""
        differ = (k.per_process for k in self.knobs if k.per_process and len({k.name in a for a in arms}) > 1)
        return None if asked else next(differ, None)

    def applying(self, knobs: frozenset[str], on_gpu: bool) -> frozenset[str]:
        """Those of ``knobs`` that can matter on the device (``Knob.applies``: no cuDNN switch on a CPU)."""
        return frozenset(knob for knob in knobs if self.knob(knob).applies(on_gpu) is None)

    def process_knobs(self, arms: Sequence[frozenset[str]], on_gpu: bool) -> frozenset[str]:
        """What ``switch`` sets for a process that runs ``arms`` in turn on the device (``on_gpu``): the knobs a
        process takes only when it starts (``Knob.per_process``) that any arm sets and that can matter there (only
        where one process was asked for by name can the arms differ in one: ``shared_process_refusal``); the rest
        each arm's step sets (``arm_steps``)."""
        return frozenset(
            k.name
            for k in self.knobs
            if k.per_process and k.applies(on_gpu) is None and any(k.name in arm for arm in arms)
        )

    def arm_switch(self, knobs: frozenset[str]) -> Step:
        """What puts this process under an arm's ``knobs`` where the framework reads them between steps: called
        before the arm's step is built and before each of its steps (``profiler.workloads.switched_arms``)."""
        raise NotImplementedError(f"{self.framework} does not switch its determinism between steps")

    def arm_steps(self, model: Any, x: Any, y: Any, arms: Sequence[frozenset[str]]) -> list[ArmStep]:
        """Per arm, one training step of the compiled Keras ``model`` on ``x``, ``y`` under that arm's knobs, to run
        in turn in this process (where ``shared_process_refusal`` has none), with what the arm has in effect."""
        raise NotImplementedError

    def switch_on(self) -> None:
        """The switches that only work once the framework is imported (``switched_after_import``)."""

    def program_environment(self, env: MutableMapping[str, str], deterministic: bool) -> None:
        """Set (or, in default mode, take out) the environment variables that switch a program's framework."""

    def seed(self, seed: int) -> None:
        """The framework's own global seed, beside Keras' (``keras.utils.set_random_seed``)."""

    def in_effect(self) -> dict[str, Any]:
        """What the framework itself reports in effect: ``op_determinism`` and its other switches (each knob's
        under ``knobs``)."""
        raise NotImplementedError

    def versions(self) -> dict[str, Any]:
        """The framework's version, what it was built for (CUDA, cuDNN) and how many GPUs it sees."""
        raise NotImplementedError

    # What a worker needs of the framework.

    def limit_threads(self, threads: int) -> bool:
        """Give the framework ``threads`` compute threads (a lockstep pair's one core each); False where it cannot."""
        return False

    def out_of_memory(self, exc: BaseException) -> bool:
        """Whether ``exc`` is this framework's out-of-memory error; asked only once the framework is loaded."""
        return False

    def device_name(self) -> str:
        """The device Keras trains on here, as the framework names it ("cpu" without a GPU)."""
        raise NotImplementedError

    def init_device(self) -> None:
        """Initialise the device the framework trains on, once imported: a worker times it apart from building."""

    def compiled_facts(self) -> dict[str, Any]:
        """What a run's record keeps of what compiling its model made, read once the run's steps are done: a graph
        is compiled at the first call that needs it, in the warm-up or later. Nothing, by default."""
        return {}

    peak_memory_per_arm: ClassVar[bool] = False
    """The framework's allocator can start its peak again between two arms' steps in one process
    (``reset_peak_memory``); else the peak it reports covers the whole process."""
    no_peak_memory: ClassVar[str] = "the framework keeps no allocator statistics on a CPU"
    """Why ``peak_memory`` is None where it is."""

    def peak_memory(self) -> int | None:
        """The bytes the framework's allocator held at most on the training device since the process started (or
        since ``reset_peak_memory``); None where it keeps no such statistics (a CPU)."""
        return None

    def reset_peak_memory(self) -> None:
        """Start the allocator's peak again from what it holds now (only where ``peak_memory_per_arm``)."""

    def gradient_step(self, model: Any, loss_of: LossOf, optimizer: Any, x: Any, y: Any) -> tuple[list[Any], list[Any]]:
        """One training step of ``model`` (whose outputs are every layer's, the prediction last): the forward pass in
        training mode, the gradients of ``loss_of(y, prediction)`` by trainable variable, applied by ``optimizer``.

        The step ``detprof verify`` fingerprints: it returns the outputs and the gradients, so that
        two runs can be compared tensor by tensor.
        """
        raise NotImplementedError

    # What ``detprof.fingerprint`` reads of the framework's own objects (asked only once it is loaded).

    def named_tensors(self, value: Any) -> list[tuple[str, Any]] | None:
        """A model of the framework's own that is not a ``keras.Model``: its tensors by name; None for anything else."""
        return None

    def host_array(self, value: Any) -> Any | None:
        """A tensor of the framework's that ``np.asarray`` cannot read as it is, as NumPy; None for anything else."""
        return None

    # The framework's own profiler, the tracer on a CPU.

    def start_profiler(self, trace_path: str) -> StopProfiler:
        """Start capturing into ``trace_path``; returns what stops the capture and writes the trace."""
        raise NotImplementedError

    def step_mark(self, name: str) -> contextlib.AbstractContextManager[None]:
        """A range named ``name`` around one step in the profiler's trace (``traces.step_split`` reads it)."""
        raise NotImplementedError

    def step_scopes(self) -> dict[str, str]:
        """Name scopes of this framework's traces that are a part of the step but no layer's, by the row they go to.
        None by default: the loss's and the optimizer's scopes are Keras's (``profiler.workloads.step_scopes``)."""
        return {}

    def compile_in_this_process(self, compiled: bool, *, compared: bool) -> dict[str, str]:
        """Before a process compiles its steps: the framework compiles each of them in this process, loading none
        that another process compiled into a cache that outlives it. A traced process needs it for its trace to name
        a step's ops; a run compared with another (``compared``: ``verify``'s two runs of a mode, a stability study's
        control runs) for the two to be able to differ in what compiling chose (autotuned kernels, fusions), where
        processes on a GPU part. ``compiled``: whether the steps go through a compiler that is a choice
        (``--compile``). Returns what the process's record says of it: that cache's state as this process reads it
        back (``compilation_cache``); nothing, by default, for a framework that keeps no compiled step across
        processes."""
        return {}

    # Under nsys, which names no framework op by itself.

    def mark_ops_for_nvtx(self) -> StopProfiler:
        """Have the ops and layers of the traced steps push NVTX ranges (``traces.parsers.nsys_ops`` reads them);
        returns what stops it. Nothing by default: a framework whose layers run only while a step is compiled
        (TensorFlow, JAX) names its ops in ranges of its own, or in none."""
        return _nothing_to_stop


def _nothing_to_stop() -> None:
    pass
