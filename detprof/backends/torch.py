"""PyTorch: deterministic algorithms as its reproducibility notes say, and ``torch.profiler`` (Kineto JSON)."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import weakref
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

from .base import (
    COMPILED_PART,
    LOSS_PART,
    NVTX_DOMAIN,
    OPTIMIZER_PART,
    TOP_LEVEL_PART,
    ArmStep,
    Backend,
    Compiler,
    Helper,
    Knob,
    LossOf,
    SettingColumn,
    Step,
    StopProfiler,
    layer_range_name,
)
from .inductor_places import Places, kernel_places, node_module

CUBLAS_WORKSPACE_ENV = "CUBLAS_WORKSPACE_CONFIG"
CUBLAS_DETERMINISTIC_WORKSPACE = ":4096:8"
"""cuBLAS is deterministic per stream only with a fixed workspace (PyTorch's reproducibility notes)."""
DETERMINISTIC_ALGORITHMS = "torch.use_deterministic_algorithms"
FILL_UNINITIALIZED = "torch.fill_uninitialized_memory"
CUDNN_DETERMINISTIC = "torch.cudnn_deterministic"
CUDNN_BENCHMARK = "torch.cudnn_benchmark"
CUBLAS_WORKSPACE = "torch.cublas_workspace_config"
INDUCTOR_DETERMINISTIC = "torch.inductor_deterministic"
LAUNCH_BLOCKING_ENV = "CUDA_LAUNCH_BLOCKING"
LAUNCH_BLOCKING = "torch.cuda_launch_blocking"
CUDA_ONLY = "cuDNN and cuBLAS run only on a CUDA GPU"
SDPA_MATH = "torch.sdpa_math"
SDPA_FLASH = "torch.sdpa_flash"
SDPA_EFFICIENT = "torch.sdpa_efficient"
SDPA_ONLY = {SDPA_MATH: "math", SDPA_FLASH: "flash", SDPA_EFFICIENT: "mem_efficient"}
"""Each knob keeps ``scaled_dot_product_attention`` to one of its back ends: the alternatives a transformer's
attention has, each priced against PyTorch's own choice. The math back end is matrix products and a softmax; the
fused ones (flash attention, memory-efficient attention, cuDNN's) accumulate their backward pass as they each do."""
SDPA_BACK_ENDS = ("flash", "mem_efficient", "math", "cudnn")


def _sdpa_knob(knob: str, name: str, gpu_only: str | None = None) -> Knob:
    return Knob(
        knob,
        f"torch.nn.attention.sdpa_kernel(SDPBackend.{name.upper()})",
        f"scaled_dot_product_attention on its {name.replace('_', '-')} back end alone, instead of the one PyTorch "
        "picks; not part of detprof's deterministic mode",
        gpu_only=gpu_only,
        in_mode=False,
        attention_only=True,
    )


KNOBS = (
    Knob(
        DETERMINISTIC_ALGORITHMS,
        "torch.use_deterministic_algorithms(True)",
        "deterministic implementations of every op that has one; an op without one raises",
    ),
    Knob(
        FILL_UNINITIALIZED,
        "torch.utils.deterministic.fill_uninitialized_memory = True",
        "fills memory from torch.empty and friends with NaN (or the largest integer), so that reading it is "
        "reproducible; on by default, in effect only under use_deterministic_algorithms",
        needs=DETERMINISTIC_ALGORITHMS,
    ),
    Knob(
        CUDNN_DETERMINISTIC,
        "torch.backends.cudnn.deterministic = True",
        "cuDNN convolutions use deterministic algorithms only",
        gpu_only=CUDA_ONLY,
    ),
    Knob(
        CUDNN_BENCHMARK,
        "torch.backends.cudnn.benchmark = False",
        "no cuDNN autotuning, whose choice of algorithm can differ from run to run (off by default: a program "
        "that turns it on needs this)",
        gpu_only=CUDA_ONLY,
    ),
    Knob(
        CUBLAS_WORKSPACE,
        f"{CUBLAS_WORKSPACE_ENV}={CUBLAS_DETERMINISTIC_WORKSPACE}",
        "a fixed cuBLAS workspace, without which cuBLAS is not deterministic per stream",
        gpu_only=CUDA_ONLY,
        per_process=f"{CUBLAS_WORKSPACE_ENV} is read once, when CUDA starts",
    ),
    Knob(
        INDUCTOR_DETERMINISTIC,
        "torch._inductor.config.deterministic = True",
        "Inductor's deterministic mode: no benchmarking on the device where it would change numerics (its kernels' "
        "autotuned configurations, reductions split or not); torch.use_deterministic_algorithms(True) turns it on "
        "since PyTorch 2.10",
        compiled_only="only a step compiled by torch.compile (--compile) runs Inductor's kernels",
    ),
    Knob(
        LAUNCH_BLOCKING,
        f"{LAUNCH_BLOCKING_ENV}=1",
        "every CUDA launch waits until its kernel has run (the host no longer runs ahead of the device): a debugging "
        "switch that Hugging Face's enable_full_determinism sets beside the others; not part of detprof's "
        "deterministic mode",
        gpu_only="no CUDA kernel is launched on a CPU",
        in_mode=False,
        per_process=f"{LAUNCH_BLOCKING_ENV} is read once, when CUDA starts",
    ),
    _sdpa_knob(SDPA_MATH, "math"),
    _sdpa_knob(SDPA_FLASH, "flash_attention"),
    _sdpa_knob(SDPA_EFFICIENT, "efficient_attention", gpu_only="memory-efficient attention runs only on a CUDA GPU"),
)


HELPERS = (
    Helper(
        "hf_full_determinism",
        "transformers.enable_full_determinism(seed)",
        frozenset(
            {
                DETERMINISTIC_ALGORITHMS,
                FILL_UNINITIALIZED,
                INDUCTOR_DETERMINISTIC,
                CUDNN_DETERMINISTIC,
                CUDNN_BENCHMARK,
                CUBLAS_WORKSPACE,
                LAUNCH_BLOCKING,
            }
        ),
        f"it sets {CUBLAS_WORKSPACE_ENV}=:16:8 (the knob sets {CUBLAS_DETERMINISTIC_WORKSPACE}), and "
        "FLASH_ATTENTION_DETERMINISTIC=1 for the flash-attn package",
    ),
    Helper(
        "lightning_deterministic",
        "lightning.Trainer(deterministic=True)",
        frozenset(
            {DETERMINISTIC_ALGORITHMS, FILL_UNINITIALIZED, INDUCTOR_DETERMINISTIC, CUDNN_BENCHMARK, CUBLAS_WORKSPACE}
        ),
    ),
    Helper(
        "accelerate_deterministic",
        "accelerate.utils.set_seed(seed, deterministic=True)",
        frozenset({DETERMINISTIC_ALGORITHMS, FILL_UNINITIALIZED, INDUCTOR_DETERMINISTIC}),
    ),
)
"""The helpers users call, each with the switches its source sets (the fill and Inductor's deterministic mode with
deterministic algorithms, as PyTorch's default leaves the one on and ``use_deterministic_algorithms`` turns the other
on): Hugging Face transformers' ``enable_full_determinism``, Lightning's
``Trainer(deterministic=True)`` (cuDNN's benchmark off with it) and accelerate's ``set_seed(deterministic=True)``."""


class Torch(Backend):
    name = "torch"
    module = "torch"
    framework = "PyTorch"
    compiled_step_cache = "compiler caches (Inductor's)"
    tracer = "torch"
    trace_suffix = ".pt.trace.json"
    keeps_out = ("tensorflow", "jax")
    version_keys = ("torch",)
    cuda_build = "install a CUDA wheel of PyTorch (https://pytorch.org/get-started/locally/)"
    switch_words = (
        "torch.use_deterministic_algorithms(True), cudnn.deterministic=True, cudnn.benchmark=False, "
        f"{CUBLAS_WORKSPACE_ENV}={CUBLAS_DETERMINISTIC_WORKSPACE}"
    )
    nondeterministic_op_advice = (
        "torch.use_deterministic_algorithms(True, warn_only=True) runs it with a warning instead of an error (the op "
        "itself stays non-deterministic), or replace the op"
    )
    in_effect_columns = (
        SettingColumn("op determinism (use_deterministic_algorithms)", "op_determinism"),
        SettingColumn("warn only", "deterministic_warn_only"),
        SettingColumn("cudnn.deterministic", "cudnn_deterministic"),
        SettingColumn("cudnn.benchmark", "cudnn_benchmark"),
        SettingColumn("CUBLAS_WORKSPACE_CONFIG", "cublas_workspace_config", environment=True),
        SettingColumn("torch.compile (pinned)", "jit_compile"),
    )
    settings_note = (
        "torch.compile is on in both modes or in neither (--compile); deterministic mode also fixes cuBLAS's "
        "workspace, as PyTorch's reproducibility notes require."
    )
    switched_after_import = True
    knobs_switch_between_runs = True
    deterministic_mode_times_kernels = False
    knobs = KNOBS
    helpers = HELPERS
    compiler = Compiler(
        "torch.compile", "compile", "compiles with --compile", "--compile is torch.compile, for --backend torch"
    )

    def switch(self, knobs: frozenset[str]) -> None:
        """The knobs asked for; the rest at PyTorch's defaults.

        ``CUBLAS_WORKSPACE_CONFIG`` must be set before CUDA initialises, hence before the
        import. torch is imported in default mode too, as the deterministic worker imports it.
        """
        if CUBLAS_WORKSPACE in knobs:
            os.environ.setdefault(CUBLAS_WORKSPACE_ENV, CUBLAS_DETERMINISTIC_WORKSPACE)
        if LAUNCH_BLOCKING in knobs:
            os.environ[LAUNCH_BLOCKING_ENV] = "1"
        self._flip(knobs)

    def _flip(self, knobs: frozenset[str]) -> None:
        """Every switch PyTorch reads at each op, to ``knobs`` (the ones left out at PyTorch's defaults)."""
        import torch

        algorithms = DETERMINISTIC_ALGORITHMS in knobs
        torch.use_deterministic_algorithms(algorithms)  # Inductor's deterministic mode with it: set apart below
        torch._inductor.config.deterministic = INDUCTOR_DETERMINISTIC in knobs
        torch.utils.deterministic.fill_uninitialized_memory = FILL_UNINITIALIZED in knobs or not algorithms
        torch.backends.cudnn.deterministic = CUDNN_DETERMINISTIC in knobs
        torch.backends.cudnn.benchmark = False
        only = [back_end for knob, back_end in SDPA_ONLY.items() if knob in knobs]
        for back_end in SDPA_BACK_ENDS:
            getattr(torch.backends.cuda, f"enable_{back_end}_sdp")(not only or back_end in only)

    def shared_process_refusal(
        self, arms: Sequence[frozenset[str]], *, compile: bool, on_gpu: bool, asked: bool = False
    ) -> str | None:
        """What torch.compile compiled under one setting is not shown to follow a switch between steps; cuBLAS reads
        its workspace setting once, when CUDA starts (``Knob.per_process``)."""
        if compile:
            return "torch.compile keeps what it compiled under one setting of the switches"
        return super().shared_process_refusal(arms, compile=compile, on_gpu=on_gpu, asked=asked)

    def named_tensors(self, value: Any) -> list[tuple[str, Any]] | None:
        """A ``torch.nn.Module``'s parameters and buffers."""
        torch = sys.modules[self.module]
        if not isinstance(value, torch.nn.Module):
            return None
        return [*value.named_parameters(), *value.named_buffers()]

    def host_array(self, value: Any) -> Any | None:
        """A tensor's values on the host (``np.asarray`` refuses one on a GPU, or one that requires grad); a float
        type NumPy lacks (bfloat16, float8) widened to float32, which holds each of its values exactly, so that equal
        digests still mean equal tensors."""
        torch = sys.modules[self.module]
        if not isinstance(value, torch.Tensor):
            return None
        host = value.detach().cpu()
        if host.dtype.is_floating_point and host.dtype not in (torch.float16, torch.float32, torch.float64):
            host = host.float()
        return host.numpy()

    def arm_switch(self, knobs: frozenset[str]) -> Step:
        """PyTorch reads its switches at every op it runs, as its reproducibility notes set them."""
        return lambda: self._flip(knobs)

    def arm_steps(self, model: Any, x: Any, y: Any, arms: Sequence[frozenset[str]]) -> list[ArmStep]:
        """Keras' own step (``train_on_batch``) with the arm's switches flipped before it (``arm_switch``)."""

        def arm(knobs: frozenset[str]) -> ArmStep:
            switch = self.arm_switch(knobs)

            def step() -> None:
                switch()
                model.train_on_batch(x, y)

            switch()
            return step, self.in_effect()

        return [arm(knobs) for knobs in arms]

    def switch_on(self) -> None:
        """Deterministic algorithms, cuDNN deterministic, no cuDNN benchmark: in a program as soon as it has
        imported torch, which has no environment variable for them."""
        import torch

        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False

    def program_environment(self, env: MutableMapping[str, str], deterministic: bool) -> None:
        """The fixed cuBLAS workspace; a value the user set is kept (any ``:SIZE:COUNT`` value is deterministic)."""
        if deterministic:
            env.setdefault(CUBLAS_WORKSPACE_ENV, CUBLAS_DETERMINISTIC_WORKSPACE)

    def seed(self, seed: int) -> None:
        import torch

        torch.manual_seed(seed)

    def in_effect(self) -> dict[str, Any]:
        import torch

        return {
            "op_determinism": bool(torch.are_deterministic_algorithms_enabled()),
            "deterministic_warn_only": bool(torch.is_deterministic_algorithms_warn_only_enabled()),
            "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "cublas_workspace_config": os.environ.get(CUBLAS_WORKSPACE_ENV),
            "inductor_deterministic": _inductor_deterministic(),
            "knobs": self.knobs_in_effect(),
        }

    def knobs_in_effect(self) -> dict[str, bool]:
        """The fill counts only under deterministic algorithms, as PyTorch applies it only there."""
        import torch

        algorithms = bool(torch.are_deterministic_algorithms_enabled())
        return {
            DETERMINISTIC_ALGORITHMS: algorithms,
            FILL_UNINITIALIZED: algorithms and bool(torch.utils.deterministic.fill_uninitialized_memory),
            CUDNN_DETERMINISTIC: bool(torch.backends.cudnn.deterministic),
            CUDNN_BENCHMARK: not torch.backends.cudnn.benchmark,
            CUBLAS_WORKSPACE: bool(os.environ.get(CUBLAS_WORKSPACE_ENV)),
            INDUCTOR_DETERMINISTIC: bool(_inductor_deterministic()),
            LAUNCH_BLOCKING: os.environ.get(LAUNCH_BLOCKING_ENV) == "1",
            **{knob: _sdpa_only(back_end) for knob, back_end in SDPA_ONLY.items()},
        }

    def versions(self) -> dict[str, Any]:
        import torch

        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        return {
            "torch": str(torch.__version__),
            "cuda_build": torch.version.cuda,
            "cudnn_build": cudnn,
            "is_cuda_build": torch.version.cuda is not None,
            "gpus_visible": torch.cuda.device_count(),
        }

    def limit_threads(self, threads: int) -> bool:
        """Inter-op threads are settable once per process: a lockstep session's later runs keep the setting."""
        import torch

        torch.set_num_threads(threads)
        if torch.get_num_interop_threads() != 1:
            torch.set_num_interop_threads(1)
        return True

    def out_of_memory(self, exc: BaseException) -> bool:
        torch = sys.modules.get(self.module)
        return torch is not None and isinstance(exc, torch.OutOfMemoryError)

    def device_name(self) -> str:
        """Keras on PyTorch trains on the first visible GPU when there is one."""
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"

    def compiled_facts(self) -> dict[str, Any]:
        """Under ``torch.compile``, the module of each of Inductor's fused kernels (``kernel_modules``), for the
        leaderboard (``traces.attribution.placed_kernels``): ``PLACES`` holds them once the step has compiled."""
        return {"kernel_modules": PLACES.as_json()} if PLACES else {}

    def init_device(self) -> None:
        """CUDA's state and the device's context (``synchronize`` needs one), where there is a GPU."""
        import torch

        if torch.cuda.is_available():
            torch.cuda.init()
            torch.cuda.synchronize()

    peak_memory_per_arm = True
    no_peak_memory = "PyTorch keeps allocator statistics only for a CUDA device"

    def peak_memory(self) -> int | None:
        torch = sys.modules.get(self.module)
        if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        return int(torch.cuda.max_memory_allocated())

    def reset_peak_memory(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats()

    def gradient_step(self, model: Any, loss_of: LossOf, optimizer: Any, x: Any, y: Any) -> tuple[list[Any], list[Any]]:
        """As Keras' own torch step: the gradients left on the variables by ``backward`` (cleared first), applied
        without recording the update for autograd."""
        import torch

        outputs = model(x, training=True)
        model.zero_grad()
        loss_of(y, outputs[-1]).backward()
        grads = [variable.value.grad for variable in model.trainable_variables]
        with torch.no_grad():
            optimizer.apply(grads, model.trainable_variables)
        return list(outputs), grads

    def compile_in_this_process(self, compiled: bool, *, compared: bool) -> dict[str, str]:
        """A compared run under ``torch.compile``: off, every cache of PyTorch's compiler (Inductor's FX graph and
        AOTAutograd caches, its autotuning results, kept in ``TORCHINDUCTOR_CACHE_DIR`` across processes, on by
        default). A process that loaded another's compiled graph or its autotuned picks could not differ from it in
        what compiling chose. A measured run keeps the autotuning results as the user's own jobs do (its steps are
        timed after compiling), not the graph caches, which placing Inductor's kernels in modules needs off
        (``_placing_kernels``). Eager, nothing is compiled and nothing is said."""
        if not (compiled and compared):
            return {}
        import torch

        torch.compiler.config.force_disable_caches = True
        return {"compilation_cache": "off" if torch.compiler.config.force_disable_caches else "on"}

    def start_profiler(self, trace_path: str) -> StopProfiler:
        """CPU activities always, CUDA activities (CUPTI) where a GPU is visible."""
        import torch

        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        profile = torch.profiler.profile(activities=activities)
        unmark = _mark_layers(torch.profiler.record_function)
        profile.start()

        def stop() -> None:
            profile.stop()
            unmark()
            profile.export_chrome_trace(trace_path)

        return stop

    def step_mark(self, name: str) -> contextlib.AbstractContextManager[None]:
        import torch

        return torch.profiler.record_function(name)

    def mark_ops_for_nvtx(self) -> StopProfiler:
        """Each Keras layer call in an NVTX range of its own and, on a GPU, each op in one (``emit_nvtx``, whose
        ranges carry the autograd sequence numbers that place a backward op in its forward op's layer)."""
        import nvtx
        import torch

        unmark = _mark_layers(lambda name: nvtx.annotate(name, domain=NVTX_DOMAIN))
        ops = torch.autograd.profiler.emit_nvtx() if torch.cuda.is_available() else contextlib.nullcontext()
        ops.__enter__()

        def stop() -> None:
            ops.__exit__(None, None, None)
            unmark()

        return stop


MARKED: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
"""The native parts of the step a worker trains (``mark_native``): each module by its path, the loss module and the
optimizer by their rows; the ranges ``_mark_layers`` opens around their calls while a tracer captures."""


def _inductor_deterministic() -> bool | None:
    """Inductor's deterministic mode as it compiles (``torch.use_deterministic_algorithms`` turns it on since PyTorch
    2.10); None where nothing loaded Inductor (no ``torch.compile``)."""
    config = sys.modules.get("torch._inductor.config")
    return None if config is None else bool(config.deterministic)


def mark_native(module: Any, loss: Any | None, optimizer: Any, compiled: Any = None) -> None:
    """A ``torch.nn.Module``'s submodules by their paths as PyTorch names them (``named_modules``: ``blocks.1.conv``),
    its loss and optimizer as the step's parts (``STEP_PARTS``), the module itself as ``TOP_LEVEL_PART``: what its
    ``forward`` runs outside every submodule goes to that row. ``compiled``: ``torch.compile``'s module around it,
    whose call is the compiled region (``COMPILED_PART``), its submodules unmarked (a range inside it would be
    compiled in, ``_hooked``). ``loss``: None where the module's own loss runs where no range can be put."""
    if compiled is not None:
        MARKED[compiled] = COMPILED_PART
    else:
        for path, submodule in module.named_modules():
            MARKED[submodule] = path or TOP_LEVEL_PART
    if loss is not None:
        MARKED[loss] = LOSS_PART
    MARKED[optimizer] = OPTIMIZER_PART


PLACES = Places()
"""The module of each fused kernel of the graphs Inductor compiled for the model this process trains now
(``compiled``), filled as it compiles them, when the step first runs (``Torch.compiled_facts``)."""


def compiled(module: Any, backend: str) -> Any:
    """``module`` through ``torch.compile`` with ``backend``; on a CPU, Inductor's C++ kernels each in a range of
    their own (``cpp.enable_kernel_profile``, the same in both modes), so that the trace names each fused kernel as
    a GPU trace names Triton's; each fused kernel's module kept in ``PLACES`` as Inductor compiles its graph
    (``_placing_kernels``)."""
    import torch
    import torch._inductor.config

    torch._inductor.config.cpp.enable_kernel_profile = True
    _placing_kernels()
    PLACES.clear()  # a session compiles its models in turn: the last one's kernels are in its record
    return torch.compile(module, backend=backend)


def _placing_kernels() -> None:
    """Inductor's provenance tracking on, and each graph it compiles read once its code is written, when its kernels
    and the post-grad graph nodes each fused are known (``inductor_places``). Its provenance map holds the kernels
    of the graph being compiled alone.

    Its graph caches (the FX graph cache, AOTAutograd's) are off: a graph loaded from one is not compiled in this
    process, so its kernels would stay in the compiled region's row, and a study whose first repeat compiled and
    whose next loaded the graph would put the same kernel in a module in one run and in no module in the other.
    Compiling costs time before the warm-up, never in a measured step; autotuning's cache stays as the user has it.

    All of this is Inductor's internals: a PyTorch without provenance tracking (before 2.9) compiles as it would,
    its kernels left in the compiled region's row, and what a graph lacks is read as nothing placed.
    """
    import torch._functorch.config
    import torch._inductor.config
    import torch._inductor.debug
    from torch._inductor.graph import GraphLowering

    if not hasattr(torch._inductor.config.trace, "provenance_tracking_level"):
        return
    torch._inductor.config.trace.provenance_tracking_level = 1
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    unplaced = GraphLowering.compile_to_module
    if getattr(unplaced, "places_kernels", False):
        return

    @functools.wraps(unplaced)
    def placing(graph: Any, *args: Any, **kwargs: Any) -> Any:
        code = unplaced(graph, *args, **kwargs)
        fused = getattr(torch._inductor.debug, "_inductor_triton_kernel_to_post_grad_node_info", {})
        modules = {node.name: node_module(node.meta) for node in graph.graph.nodes}
        graph_id = getattr(graph, "graph_id", None)
        prefix = f"graph_{graph_id}_" if graph_id is not None else ""
        PLACES.add(bool(getattr(graph, "is_backward", False)), kernel_places(fused, modules, prefix))
        return code

    placing.places_kernels = True  # type: ignore[attr-defined]
    GraphLowering.compile_to_module = placing  # type: ignore[method-assign]


def _mark_layers(range_named: Callable[[str], contextlib.AbstractContextManager[Any]]) -> Callable[[], None]:
    """While a tracer captures: a range around each layer call, named after the layer.

    A PyTorch trace names no layer: Keras's name scopes do not reach ``torch.profiler`` or nsys,
    and a native module's path is nowhere in it. The ranges (``traces.attribution``) let the
    parsers place each op, and each backward op through its forward op, in the model's layers.
    Keras layers are called through ``Layer.__call__`` alone, so wrapping it reaches every layer
    of every model; the loss (``Model.compute_loss``) and the optimizer's update
    (``Optimizer.apply``) get ranges of their own (``STEP_PARTS``). Native modules, their loss
    and their optimizer (``MARKED``) are reached through hooks on each (``_hooked``). The
    wrappers and hooks go when the capture ends.
    """
    unmarks = []
    keras = sys.modules.get("keras")
    if keras is not None:
        unmarks = [
            _wrapped(range_named, keras.layers.Layer, "__call__", lambda layer: layer.name),
            _wrapped(range_named, keras.Model, "compute_loss", lambda _: LOSS_PART),
            _wrapped(range_named, keras.optimizers.Optimizer, "apply", lambda _: OPTIMIZER_PART),
        ]
    if MARKED:
        unmarks.append(_hooked(range_named))

    def unmark_all() -> None:
        for unmark in reversed(unmarks):
            unmark()

    return unmark_all


def _wrapped(
    range_named: Callable[[str], contextlib.AbstractContextManager[Any]],
    owner: type,
    method: str,
    name: Callable[[Any], str],
) -> Callable[[], None]:
    unmarked = getattr(owner, method)

    @functools.wraps(unmarked)
    def marked(self: Any, *args: Any, **kwargs: Any) -> Any:
        with range_named(layer_range_name(name(self))):
            return unmarked(self, *args, **kwargs)

    setattr(owner, method, marked)
    return lambda: setattr(owner, method, unmarked)


def _hooked(range_named: Callable[[str], contextlib.AbstractContextManager[Any]]) -> Callable[[], None]:
    """A range from each marked module's forward (or optimizer's step) to its end, through hooks of its own.

    Hooks of each marked object, not PyTorch's global hooks: ``torch.compile`` traces every hook it meets inside a
    compiled module, and hooks added once it compiled would have it compile the module again, hooks and all, in the
    traced run alone. A compiled module's inner modules are not marked (``mark_native``). A range ends even where its
    forward raises: activation checkpointing (``torch.utils.checkpoint``) stops a forward it recomputes in the
    backward pass as soon as it has what the backward needs, and a range left open would hold every later one."""
    import torch

    open_ranges: list[contextlib.AbstractContextManager[Any]] = []

    def enter(owner: Any, *_: Any) -> None:
        opened = range_named(layer_range_name(MARKED[owner]))
        opened.__enter__()
        open_ranges.append(opened)

    def leave(owner: Any, *_: Any) -> None:
        if open_ranges:
            open_ranges.pop().__exit__(None, None, None)

    handles = []
    for owner in list(MARKED):
        if isinstance(owner, torch.optim.Optimizer):
            handles += [owner.register_step_pre_hook(enter), owner.register_step_post_hook(leave)]
        else:
            handles += [owner.register_forward_pre_hook(enter), owner.register_forward_hook(leave, always_call=True)]

    def unhook() -> None:
        for handle in handles:
            handle.remove()

    return unhook


def _sdpa_only(back_end: str) -> bool:
    """Whether ``back_end`` is the one back end of ``scaled_dot_product_attention`` left on."""
    import torch

    enabled = {name for name in SDPA_BACK_ENDS if getattr(torch.backends.cuda, f"{name}_sdp_enabled")()}
    return enabled == {back_end}
