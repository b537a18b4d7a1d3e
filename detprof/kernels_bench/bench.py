"""The kernels_bench driver: every (case, mode, repeat) in its own worker, interleaved, stored as it ends.

The same machinery as the sweep, one op at a time: a fresh process per run (determinism
cannot be switched off inside a process, and cuDNN's autotune cache must not carry from
one mode into the other), the two modes back to back in each repeat so that drift and
thermals hit both alike, one atomic record per run, and ``--resume`` skipping every run
already complete. A case that fails (out of memory, no deterministic implementation) is
recorded with its reason and the bench goes on.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from detprof.determinism import MODES, Mode
from detprof.errors import UsageError
from detprof.kernels_bench.cases import CONV_OPS, SUITES, OpCase
from detprof.profiler.devices import DeviceChoice
from detprof.profiler.launcher import WorkerLauncher, WorkerRun
from detprof.profiler.measured_study import RunProgress, check_run_settings
from detprof.profiler.tracers import Tracer
from detprof.store import ResultsStore
from detprof.sweep.plan import RUN_ORDER


@dataclass(frozen=True)
class KernelsConfig:
    ops: tuple[str, ...]
    kernel_sizes: tuple[int, ...] = (1, 3, 5, 7)
    steps: int = 100
    warmup: int = 10
    repeats: int = 3
    batch_size: int = 64
    input_size: int | None = None
    max_shapes: int | None = None
    tracer: str = "tf"
    xla: bool = False
    gpu_label: str = "cpu"
    seed: int = 0
    preset: str | None = None
    run_timeout_s: float | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.ops:
            raise UsageError("no ops to measure: check --suite and --ops")
        unknown = [op for op in self.ops if op not in SUITES["all"]]
        if unknown:
            raise UsageError(f"unknown op {unknown[0]!r}; valid ops: {', '.join(SUITES['all'])}")
        for k in self.kernel_sizes:
            if k < 1 or k % 2 == 0:
                raise UsageError(f"--kernel-sizes: '{k}' is not a positive odd integer")
        if not self.kernel_sizes and any(op in CONV_OPS for op in self.ops):
            raise UsageError("--kernel-sizes is empty: the conv suite needs at least one kernel size")
        check_run_settings(self.steps, self.warmup, self.repeats, self.batch_size, self.input_size, self.run_timeout_s)
        if self.max_shapes is not None and self.max_shapes < 1:
            raise UsageError(f"--max-shapes must be at least 1, not {self.max_shapes}")

    def manifest(self, cases: list[OpCase]) -> dict[str, Any]:
        """What identifies the measurement, the derived cases included: a resumed bench must match."""
        config = asdict(self)
        config.pop("run_timeout_s")
        config.update(
            ops=list(self.ops),
            kernel_sizes=list(self.kernel_sizes),
            modes=list(MODES),
            cases=[case.as_dict() for case in cases],
        )
        return config


@dataclass(frozen=True)
class BenchRun:
    case: OpCase
    mode: Mode
    repeat: int

    @property
    def run_id(self) -> str:
        return f"{self.case.key}--{self.mode}--r{self.repeat}"


def plan_runs(cases: list[OpCase], repeats: int) -> list[BenchRun]:
    """Repeat by repeat, case by case, the two modes back to back (D, N, D, N, ...)."""
    return [BenchRun(case, mode, repeat) for repeat in range(repeats) for case in cases for mode in RUN_ORDER]


def bench_payload(case: OpCase) -> dict[str, Any]:
    return {"workload": "op", "op": case.op, "params": case.params}


def record_fields(config: KernelsConfig, run: BenchRun) -> dict[str, Any]:
    """What a record says about its case, so that a summary needs nothing but the records."""
    case = run.case
    return {
        "case": case.key,
        "op": case.op,
        "model": case.model,
        "layers": list(case.layers),
        "shape": case.shape,
        "repeat": run.repeat,
        "batch_size": config.batch_size,
    }


def run_bench(
    config: KernelsConfig,
    cases: list[OpCase],
    store: ResultsStore,
    tracer: Tracer,
    device: DeviceChoice,
    *,
    resume: bool,
    command: str,
    progress: RunProgress | None = None,
) -> list[dict[str, Any]]:
    """Run every planned run not already complete; returns the records of this invocation."""
    progress = progress or RunProgress()
    store.open(config.manifest(cases), command, resume=resume)
    launcher = WorkerLauncher(store, tracer, device, config.run_timeout_s)
    plan = plan_runs(cases, config.repeats)
    todo = [run for run in plan if not store.is_done(run.run_id)]
    records = []
    for index, run in enumerate(todo, start=len(plan) - len(todo)):
        progress.on_start(f"{run.case.key} {run.mode} r{run.repeat}", index)
        record = launcher.run(
            WorkerRun(run.run_id, run.mode, config.seed, config.xla, config.steps, config.warmup),
            bench_payload(run.case),
            record_fields(config, run),
        )
        records.append(record)
        progress.on_done(record)
    return records


PRESETS: dict[str, dict[str, Any]] = {
    "paper": {
        "suite": "all",
        "ops": None,
        "kernel_sizes": (1, 3, 5, 7),
        "steps": 100,
        "warmup": 10,
        "repeats": 3,
        "batch_size": 64,
        "input_size": None,
        "max_shapes": None,
    },
    # Five cases x 2 modes x 3 repeats = 30 worker processes, which is what 2 cores start and
    # trace in about 3 minutes. On a CPU only the Python-level switch of sparse cross-entropy
    # changes kernels; the convolutions (the conv suite's question) and the overlapping
    # max-pool (the ops suite's cross-model shapes) show that the rest stay the same.
    "cpu-small": {
        "suite": "all",
        "ops": (*CONV_OPS, "max_pool_backward", "sparse_softmax_xent_backward"),
        "kernel_sizes": (3,),
        "steps": 30,
        "warmup": 3,
        "repeats": 3,
        "batch_size": 8,
        "input_size": 32,
        "max_shapes": 1,
    },
}


def select_ops(suite: str, named: tuple[str, ...] | None, *, strict: bool) -> tuple[str, ...]:
    """The suite's ops, narrowed to ``named``; ``strict`` refuses a named op outside the suite."""
    if suite not in SUITES:
        raise UsageError(f"unknown suite {suite!r}; choose one of {', '.join(SUITES)}")
    if named is None:
        return SUITES[suite]
    for op in named:
        if op not in SUITES["all"]:
            raise UsageError(f"unknown op {op!r}; valid ops: {', '.join(SUITES['all'])}")
        if strict and op not in SUITES[suite]:
            raise UsageError(f"op {op!r} is not in suite {suite!r}; its ops: {', '.join(SUITES[suite])}")
    return tuple(op for op in SUITES[suite] if op in named)
