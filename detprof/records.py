"""The records detprof writes, one type per record, built and read through these types.

A measured run (one worker of a sweep or of kernels_bench) and a stability run are each
one JSON file in the results store. The producers (the launcher, the stability worker),
the readers (reports, check) and the tests and benchmarks that synthesize results all go
through the builders here, so that a changed field changes everywhere at once instead of
leaving tests on an old shape. Reading a record checks the fields every reader relies on:
a hand-edited or truncated record is unusable input (one line, exit 3), never a crash.
"""

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

import detprof.backends as backends
import detprof.study_kinds as study_kinds
from detprof.errors import InputError
from detprof.intervals import Metric

RunStatus = Literal["ok", "failed", "unsupported"]
""""unsupported": the framework refused to run an op deterministically (a finding, not a crash)."""
RecordKind = Literal["sweep", "kernels", "stability", "calibration", "verify", "knobs", "knob_checks"]


class FleetRun(TypedDict):
    """What a run made on a Ray fleet (``detprof.fleet``) adds to its record, measured or stability run alike."""

    ray_node_id: NotRequired[str]
    """The Ray node that ran it, and that node's address."""
    ray_node_address: NotRequired[str]


class MeasuredRun(FleetRun):
    """One (workload, mode, repeat) of a sweep or of kernels_bench, as the launcher writes it."""

    run_id: str
    mode: str
    repeat: int
    model: str
    status: RunStatus
    reason: str | None
    steps: int
    warmup: int
    tracer: str
    device: dict[str, Any]
    command: str
    log: str | None
    started_at: str
    finished_at: str
    duration_s: float
    settings: dict[str, Any] | None
    """What the worker's framework reported in effect (``determinism.apply``)."""
    versions: dict[str, Any] | None
    step_wall_ns: list[int] | None
    """Wall time of each untraced measured step: the run's wall time (None for a run that traced only)."""
    wall_ns_per_step: float | None
    kernel_ns_per_step: float | None
    kernel_count: int | None
    kernel_table: str | None
    """Path of the Parquet kernel table, relative to the study folder."""
    kernel_table_kind: Literal["launches", "summary"] | None
    step_kernel_ns: list[int] | None
    """Kernel time of each measured step, where the tracer split the window into steps."""
    trace_file: str | None
    telemetry: dict[str, Any] | None
    """What NVML saw of the GPU while the run ran (``profiler.telemetry``); None without a GPU."""
    load: NotRequired[dict[str, Any] | None]
    """What else used the machine's cores while the run ran (``profiler.machine_load``): other processes'
    ``other_cores`` of ``cores``, ``steal_fraction``, ``load_average``; records without it did not look."""
    backend: NotRequired[str]
    """The Keras backend that ran it (``detprof.backends``); records without it ran on TensorFlow."""
    measures: NotRequired[Literal["both", "kernel", "wall"]]
    """What the run measured (``launcher.Measures``); records without it measured both, wall time traced."""
    traced_step_wall_ns: NotRequired[list[int] | None]
    """Wall time of each traced step: what the tracer costs, next to ``step_wall_ns``; never an overhead."""
    kernel_table_format: NotRequired[str]
    """The trace format the kernel table was parsed from (``traces.kernel_table.TraceFormat``); older
    records leave it to their tracer and ``kernel_table_kind``."""
    kernel_devices: NotRequired[list[str]]
    """The GPUs whose kernels the kernel table holds, by name (``GPU <id>`` where the trace names none);
    empty where the table holds a CPU's ops."""
    kernel_table_steps: NotRequired[int]
    """Steps the kernel table holds: the traced steps, plus the settling step where the tracer marks no steps."""
    cuda_graph_launches: NotRequired[int]
    """CUDA graphs launched in the trace, and how many kernels graph nodes launched (``traces.graphs``)."""
    graph_kernel_count: NotRequired[int | None]
    pairing: NotRequired[Literal["lockstep", "in_process"]]
    """Set on the two runs of a pair whose steps ran in turn and pair up step by step: two processes in lockstep,
    or both arms in one process (``in_process``; their ``trace_file`` is the same, each arm's steps marked)."""
    precision: NotRequired[float]
    """``--precision``: the study added repeats until each model's interval was within +/-this fraction."""
    first_stage: NotRequired[int]
    """With ``precision``: the repeats of Stein's first stage, whose spread fixed how many more (``intervals``)."""
    cpu_core: NotRequired[int]
    """The core both workers of a lockstep pair were pinned to, each with ``cpu_threads`` TensorFlow threads."""
    cpu_threads: NotRequired[int]
    worker_env: NotRequired[dict[str, str]]
    """The environment detprof set for the worker that shapes its timing (``launcher.STEADY_HEAP_ENV``)."""
    compilation_cache: NotRequired[Literal["off", "on"]]
    """The framework's cache of compiled steps that outlives a process (JAX's persistent compilation cache), as the
    worker read it back after turning it off (``Backend.compile_in_this_process``): "off", every step compiled in
    the run's own process. Absent: a framework whose measured runs keep their caches (PyTorch under ``--compile``,
    as a user's jobs do) or keep none, or a record from before detprof read it."""
    arm: NotRequired[str]
    """A calibration's arm, "a" or "b": both deterministic, so their ratio measures the noise alone; a knob
    study's, "a" the reference and "b" the treated arm of its ``comparison``."""
    comparison: NotRequired[str]
    """A knob study's comparison (``sweep.knobs``): ``total``, ``add:<knob>`` or ``drop:<knob>``."""
    knobs: NotRequired[list[str]]
    """The knobs a knob study's run set (``settings.knobs``: each as read back)."""
    batch_size: NotRequired[int]
    """The batch a model or op case ran at; a program (``program``) decides its own."""
    program: NotRequired[dict[str, Any]]
    """A training program detprof did not write (``sweep --command``, ``profiler.program.run``): its ``command``,
    ``exit_status``, ``stderr_tail`` and ``stderr_log``, ``measured_window`` ("api": the steps inside
    ``detprof.measure()``, ``marked_steps`` of them marked by ``detprof.step()``; "process": the whole process),
    and how many of its Python ``processes`` reported what was in effect (``settings.frameworks``)."""
    model_api: NotRequired[str]
    """What kind of model trained: a Keras model, or a native PyTorch module (``models.torch_modules``); absent in
    records from before detprof trained native modules (Keras) and for programs and op cases."""
    input_shape: NotRequired[list[int]]
    """What a model workload reports about itself: input shape, classes, parameter count."""
    input_dtype: NotRequired[str]
    """The dtype of the model's input (``float32``; ``int64`` for token ids): what tells a model of tokens from one of
    feature vectors where both take one axis. Absent before detprof recorded it."""
    classes: NotRequired[int]
    labels_shape: NotRequired[list[int]]
    """One example's labels as the model was trained on them: ``[]`` a class id per example, ``[L]`` one per position
    (a language model's, a frame tagger's), ``[H, W]`` one per pixel; what tells the report whether a stability study
    can train your own model (``reports.report_data.stability_refusal``). Absent before detprof recorded it."""
    parameters: NotRequired[int]
    layer_names: NotRequired[list[str]]
    """Every layer of the model, nested ones included, in model order: what ``traces.attribution`` places ops in."""
    step_scopes: NotRequired[dict[str, str]]
    """Name scopes of the step's parts that are no layer (the loss, the optimizer's update), by their row."""
    earlier_failures: NotRequired[list[str]]
    """A run measured again after attempts that failed (a worker that crashed, a run past ``--run-timeout``): each
    attempt's reason, with the log it left, kept under a name of its own (``logs/RUN.failed-1.log``)."""
    kernel_modules: NotRequired[dict[str, dict[str, str | None]]]
    """Under ``torch.compile``: per phase (``forward``, ``backward``), the module path of each of Inductor's fused
    kernels by its name in the trace, and of each extern kernel call by its place in the graph's call
    (``aten::mm 3/14``, ``backends.base.graph_site``) (``backends.inductor_places``), for
    ``traces.attribution.placed_kernels``."""
    train_step: NotRequired[str]
    """Which compiled training step the model workload ran (``profiler.workloads``), with its compile setting."""
    dtype_policy: NotRequired[str]
    """The Keras dtype policy the model was built in: ``float32``, or a transformer's ``mixed_bfloat16`` on a GPU
    (``models.registry.ModelSpec.gpu_dtype_policy``)."""
    model_spec: NotRequired[dict[str, Any]]
    """A model of your own (``models.own.OwnModel``): the spec as given, its file, function and the file's sha256."""
    case: NotRequired[str]
    """What an op case (kernels_bench) is: its key, op, the layers it stands for, its shape and params."""
    op: NotRequired[str]
    layers: NotRequired[list[str]]
    shape: NotRequired[str]
    params: NotRequired[dict[str, Any]]
    dtype: NotRequired[str]
    on_gpu: NotRequired[bool]
    finding: NotRequired[dict[str, Any]]
    """An "unsupported" run's op that refused to run deterministically (``findings.Finding``: op, message,
    layer, advice); runs recorded before detprof kept it have only their ``reason``."""
    trace_on_node: NotRequired[str]
    """A fleet run's trace over ``--max-trace-mb``: its path on the node that kept it (``trace_file``: None)."""
    time_parts: NotRequired[dict[str, float]]
    """Where the run's time went, in seconds per part (``device_time.PARTS``: process start and imports, device,
    building, compiling, warm-up, measured steps, tracing, parsing, the rest). The records of an in-process pair
    share their process's parts (their ``log``), and each has its own ``parsing``; the first pair of a process
    carries its start."""
    steps_reused: NotRequired[bool]
    """With ``--shared-repeats`` (one process for every repeat of a model): True where this run re-ran the steps an
    earlier repeat built and compiled, False where it built them; absent: a process of its repeat's own."""
    peak_memory: NotRequired[dict[str, Any]]
    """The framework allocator's peak on the device: ``bytes``, what it ``covers`` ("run": this run's steps alone;
    "process": the whole process, both arms of an in-process pair on a framework that cannot tell them apart),
    and ``why`` it is null where it is (a CPU)."""


class StabilityRun(FleetRun):
    """One training run of a stability study, as its pooled worker writes it."""

    run_id: str
    variant: str
    run: int
    mode: str
    seeds: dict[str, Any]
    status: RunStatus
    reason: NotRequired[str | None]
    backend: NotRequired[str]
    """As for a measured run: the Keras backend that trained it; records without it trained on TensorFlow."""
    pid: NotRequired[int]
    determinism: NotRequired[dict[str, Any]]
    software: NotRequired[dict[str, Any]]
    device_name: NotRequired[str]
    log: NotRequired[str]
    compilation_cache: NotRequired[Literal["off", "on"]]
    """As for a measured run, and PyTorch's compiler caches under ``--compile``: "off", the worker compiled its step
    itself, none loaded from a cache another worker filled."""
    accuracy: NotRequired[float]
    """What training measured (``stability.training.train``), on the test split after the last epoch."""
    cross_entropy: NotRequired[float]
    per_class_accuracy: NotRequired[list[float]]
    curve: NotRequired[list[dict[str, float]]]
    weights_sha256: NotRequired[str]
    layer_digests: NotRequired[list[list[str]]]
    input_shape: NotRequired[list[int]]
    data_shape: NotRequired[list[int]]
    outputs: NotRequired[Literal["probabilities", "logits"]]
    train_step: NotRequired[str]
    """The compiled training step that trained it, e.g. "keras train_on_batch (jit_compile=True)"."""
    arrays: NotRequired[str]
    weights_file: NotRequired[str]
    train_seconds: NotRequired[float]
    cpu_threads: NotRequired[int]
    """On the CPU, the compute threads its worker gave the framework: its share of the cores beside the other
    workers (``stability.study.cpu_threads``); absent where the framework cannot be limited (JAX) or on a GPU."""
    time_parts: NotRequired[dict[str, float]]
    """Where the run's time went (``device_time.PARTS``): a worker trains its runs one after another, so its start
    and device are its first run's; the steps are the epochs' training and evaluation, less the first training
    step's excess over the others (``compile``)."""
    seeded_stochastic_layers: NotRequired[list[str]]
    bitflip: NotRequired[dict[str, Any]]


class VerifyRun(TypedDict):
    """One of ``detprof verify``'s runs: K training steps, every tensor fingerprinted (``verify.workload``)."""

    run_id: str
    model: str
    mode: str
    replica: str
    """Which of the two runs of its mode ("a" or "b"): the two are compared tensor by tensor."""
    status: RunStatus
    reason: str | None
    backend: str
    steps: int
    """The steps it took: all that were asked for, unless it ended early."""
    steps_asked: int | None
    """None for a program (``verify --command``), which decides its own steps."""
    fingerprints: str | None
    """Its fingerprints' folder, relative to the study's; None where it took none (a program that fingerprinted
    nothing)."""
    layers: NotRequired[list[str]]
    finding: NotRequired[dict[str, Any] | None]
    """An op that refused to run deterministically (``findings.Finding``); None where none did."""
    started_at: NotRequired[str]
    finished_at: NotRequired[str]
    duration_s: NotRequired[float]
    log: NotRequired[str]
    settings: NotRequired[dict[str, Any]]
    versions: NotRequired[dict[str, Any]]
    device: NotRequired[dict[str, Any]]
    device_name: NotRequired[str]
    compilation_cache: NotRequired[Literal["off", "on"]]
    """As for a measured run, and PyTorch's compiler caches under ``--compile``: "off", the run compiled its steps
    itself, so that the two runs of a mode could differ in what compiling chose; a program (``verify --command``)
    compiles as it does."""
    parameters: NotRequired[int]
    model_api: NotRequired[str]
    """As for a measured run: the kind of model, whose parts the verdict names (a Keras model's layers, a native
    module's modules)."""
    program: NotRequired[dict[str, Any]]
    """A program's run (``verify --command``): as ``MeasuredRun.program``."""
    without: NotRequired[str]
    """A knob study's check (``sweep --knobs``): the knob that full determinism ran without."""
    helper: NotRequired[str]
    """A knob study's check of the switches a library's helper sets (``Helper.key``)."""
    knobs: NotRequired[list[str]]
    """The knobs such a run set."""
    time_parts: NotRequired[dict[str, float]]
    """Where the run's time went (``device_time.PARTS``): one process runs a replica's runs of every model, so the
    process's start and device are its first run's; the steps are the training steps apart from fingerprinting."""
    side_by_side: NotRequired[bool]
    """Whether its replica ran beside the other one, on one device (``verify.run.replicas_side_by_side``); a
    program's runs go one at a time."""


REQUIRED_FIELDS: dict[RecordKind, tuple[tuple[str, type], ...]] = {
    "sweep": (("run_id", str), ("model", str), ("mode", str), ("repeat", int), ("status", str)),
    "kernels": (("run_id", str), ("case", str), ("mode", str), ("repeat", int), ("status", str)),
    "stability": (("run_id", str), ("variant", str), ("mode", str), ("status", str)),
    "calibration": (("run_id", str), ("model", str), ("mode", str), ("arm", str), ("repeat", int), ("status", str)),
    "verify": (("run_id", str), ("model", str), ("mode", str), ("replica", str), ("status", str)),
    "knobs": (
        *(("run_id", str), ("model", str), ("mode", str), ("arm", str), ("comparison", str), ("repeat", int)),
        ("status", str),
    ),
    "knob_checks": (("run_id", str), ("model", str), ("mode", str), ("replica", str), ("status", str)),
}
"""What every reader of a kind relies on; the rest may be null (a failed run measured nothing)."""
NUMERIC_FIELDS = ("wall_ns_per_step", "kernel_ns_per_step")


def _refuse_unknown(record_type: type, optional: Mapping[str, Any]) -> None:
    """A builder takes only the optional fields its record type declares: a renamed field cannot slip through."""
    unknown = sorted(optional.keys() - record_type.__optional_keys__)  # type: ignore[attr-defined]
    if unknown:
        raise TypeError(f"{record_type.__name__}: unknown field(s) {', '.join(unknown)}")


UNMEASURED: dict[str, Any] = dict.fromkeys(
    (
        "reason", "log", "settings", "versions", "step_wall_ns", "kernel_ns_per_step", "kernel_count",
        "kernel_table", "kernel_table_kind", "step_kernel_ns", "trace_file", "telemetry",
    )
) | {"command": ""}  # fmt: skip
"""A measured run's fields that a run which measured nothing (failed, unsupported) leaves empty."""


def measured_run(**given: Any) -> MeasuredRun:
    """A measured run's record from ``MeasuredRun``'s fields; wall time per step is derived, never given.

    Every required field must be given (or be one of ``UNMEASURED``), and no field that
    ``MeasuredRun`` does not declare may be: a renamed field cannot slip through.
    """
    if "wall_ns_per_step" in given:
        raise TypeError("MeasuredRun: wall_ns_per_step is derived from step_wall_ns, not given")
    record = UNMEASURED | given
    steps = record["step_wall_ns"]
    record["wall_ns_per_step"] = sum(steps) / len(steps) if record.get("status") == "ok" and steps else None
    missing = sorted(MeasuredRun.__required_keys__ - record.keys())
    if missing:
        raise TypeError(f"MeasuredRun: missing field(s) {', '.join(missing)}")
    _refuse_unknown(MeasuredRun, {k: v for k, v in record.items() if k not in MeasuredRun.__required_keys__})
    return MeasuredRun(**record)  # type: ignore[typeddict-item]


def stability_run(
    *,
    run_id: str,
    variant: str,
    run: int,
    mode: str,
    seeds: Mapping[str, Any],
    status: RunStatus,
    reason: str | None = None,
    **measured: Any,
) -> StabilityRun:
    """A stability run's record: identity and outcome, then what training measured (``training.train``)."""
    _refuse_unknown(StabilityRun, measured)
    record = StabilityRun(run_id=run_id, variant=variant, run=run, mode=mode, seeds=dict(seeds), status=status)
    if reason is not None:
        record["reason"] = reason
    record.update(measured)  # type: ignore[typeddict-item]
    return record


def verify_run(**given: Any) -> VerifyRun:
    """A verification run's record from ``VerifyRun``'s fields: every required one, and no field it does not declare."""
    missing = sorted(VerifyRun.__required_keys__ - given.keys())
    if missing:
        raise TypeError(f"VerifyRun: missing field(s) {', '.join(missing)}")
    _refuse_unknown(VerifyRun, {k: v for k, v in given.items() if k not in VerifyRun.__required_keys__})
    return VerifyRun(**given)  # type: ignore[typeddict-item]


def required_fields(kind: str) -> tuple[tuple[str, type], ...]:
    """What readers of ``kind``'s records rely on: detprof's own kinds here, a registered one as it declares."""
    known = REQUIRED_FIELDS.get(kind)  # type: ignore[call-overload]
    return known if known is not None else study_kinds.kind(kind).record_fields


def checked(kind: str, data: dict[str, Any], source: Path) -> dict[str, Any]:
    """``data`` if every field readers of ``kind`` rely on is there and valid; else one InputError line."""
    name = data.get("run_id") if isinstance(data.get("run_id"), str) else source.stem
    for key, expected in required_fields(kind):
        value = data.get(key)
        if not isinstance(value, expected) or isinstance(value, bool):
            raise InputError(f"{source}: run record {name} has no valid {key!r}")
    for key in NUMERIC_FIELDS:
        value = data.get(key)
        if value is not None and not finite_number(value):
            raise InputError(f"{source}: run record {name} has a non-numeric {key!r}: {value!r}")
    return data


def finite_number(value: Any) -> bool:
    """A JSON number that is a real measurement: not a boolean, not NaN or infinity."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def environment_values(records: Iterable[Mapping[str, Any]], section: str, key: str) -> list[Any]:
    """Every distinct ``record[section][key]`` (e.g. ``versions.tensorflow``) across runs, first seen first.

    What the runs of a study ran on: one value when they agree, several when they do not. The
    report warns about several; the CI check's fingerprint refuses to compare them.
    """
    seen: dict[str, Any] = {}
    for record in records:
        value = (record.get(section) or {}).get(key)
        if value is not None:
            seen.setdefault(json.dumps(value, sort_keys=True, default=str), value)
    return list(seen.values())


CLOCK_DROP_FRACTION = 0.9
"""A busy telemetry sample whose SM clock is below this fraction of the run's highest busy clock
counts as a clock drop (the record's ``telemetry.low_clock_samples``)."""

PER_STEP_FIELDS: dict[Metric, tuple[str, str]] = {
    "wall": ("step_wall_ns", "wall_ns_per_step"),
    "kernel": ("step_kernel_ns", "kernel_ns_per_step"),
}


def is_aa(record: Mapping[str, Any]) -> bool:
    """A calibration's run: arm "a" or "b" of deterministic mode against itself (a knob study's arms name their
    ``comparison``)."""
    return record.get("arm") in ("a", "b") and "comparison" not in record


def backend_of(record: Mapping[str, Any]) -> str:
    """The backend a run (measured or stability) ran on: a record that names none ran on TensorFlow."""
    return backends.named(record.get("backend"))


def measures(record: Mapping[str, Any], metric: Metric) -> bool:
    """Whether the run measured ``metric``: an untraced run has no kernels, a traced-only run no wall time."""
    return record.get("measures", "both") in ("both", metric)


def kernel_table_steps(record: Mapping[str, Any]) -> int:
    """How many steps the run's kernel table holds (older records: its ``steps``)."""
    return int(record.get("kernel_table_steps") or record["steps"])


def time_per_step(record: Mapping[str, Any], metric: Metric) -> float | None:
    """The run's time per step in ``metric``: the median of its per-step times where it has them, else the mean.

    The median because a step that other work on the machine interrupted (or that the
    framework spent re-tracing) says nothing about determinism, and one such step in a
    hundred moves a mean by more than the overheads worth resolving. Every overhead ratio
    is a ratio of these. None for a run that did not measure ``metric``.
    """
    steps_field, mean_field = PER_STEP_FIELDS[metric]
    steps = record.get(steps_field)
    if steps:
        return float(statistics.median(steps))
    value = record.get(mean_field)
    return None if value is None else float(value)


OUTLYING_MADS = 3.0
"""How many median absolute deviations above its run's median step an interrupted step lies, at least."""
INTERRUPTED_STEP = 1.5
"""How many times its run's median step an interrupted step lasts, at least: in a run of steady steps (a deviation
of microseconds) a step a few percent slow is jitter, not an interruption."""


def outlying_steps(steps: Sequence[float]) -> list[int]:
    """The steps of a run that something else interrupted (another process took the core, the framework re-traced),
    by index: over ``OUTLYING_MADS`` deviations above its median step and over ``INTERRUPTED_STEP`` times it.

    The median per step (``time_per_step``, ``pair_log_ratio``) sets them aside; whatever else is read off a run's
    steps (its kernels, its layers) sets the same steps aside, and the runs that had them are named. Fewer than
    three steps have no median to stand out from.
    """
    if len(steps) < 3:
        return []
    median = statistics.median(steps)
    deviation = statistics.median(abs(step - median) for step in steps)
    limit = max(median + OUTLYING_MADS * deviation, INTERRUPTED_STEP * median)
    return [i for i, step in enumerate(steps) if step > limit]


def pair_log_ratio(base: Mapping[str, Any], other: Mapping[str, Any], metric: Metric) -> float | None:
    """ln(other / base) for one repeat, the paired unit of every overhead interval.

    A lockstep pair (or both arms in one process) ran its steps in turn, so step i of one and
    step i of the other saw the same moment of the machine: the median of the per-step log ratios. Runs measured one
    after the other compare their ``time_per_step``. None when either side lacks ``metric``.
    """
    steps_field = PER_STEP_FIELDS[metric][0]
    a, b = base.get(steps_field), other.get(steps_field)
    in_turn = base.get("pairing") == other.get("pairing") and base.get("pairing") in ("lockstep", "in_process")
    if in_turn and a and b and len(a) == len(b) and all(x > 0 for x in (*a, *b)):
        return float(statistics.median(math.log(y / x) for x, y in zip(a, b, strict=True)))
    t_base, t_other = time_per_step(base, metric), time_per_step(other, metric)
    if t_base is None or t_other is None or t_base <= 0 or t_other <= 0:
        return None
    return math.log(t_other / t_base)
