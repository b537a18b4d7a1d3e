"""The kernels_bench measurement: every op case in both modes, repeat by repeat.

The same measured-study flow as the sweep (``profiler.study``), one op at a time: a fresh
process per run, the two modes back to back in each repeat, one atomic record per run,
``--resume``. A case that fails (out of memory, no deterministic implementation) is
recorded with its reason and the bench goes on. ``--backend`` picks the suite: TensorFlow's
ops (``cases``, ``ops``) or PyTorch's (``torch_cases``, ``torch_ops``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from detprof import backends
from detprof.errors import UsageError
from detprof.kernels_bench import cases as tensorflow_cases
from detprof.kernels_bench import torch_cases
from detprof.kernels_bench.cases import CONV_OPS, OpCase
from detprof.profiler.measured_runs import PlannedRun, RunSettings, Workload, interleaved

BACKEND_SUITES: dict[str, dict[str, tuple[str, ...]]] = {
    backends.TENSORFLOW: tensorflow_cases.SUITES,
    backends.TORCH: torch_cases.SUITES,
}


def suites(backend: str) -> dict[str, tuple[str, ...]]:
    """The op suites of ``backend``; one line for a backend that has none."""
    if backend not in BACKEND_SUITES:
        raise UsageError(f"detprof kernels has op suites for {' and '.join(BACKEND_SUITES)}, not for {backend}")
    return BACKEND_SUITES[backend]


@dataclass(frozen=True, kw_only=True)
class KernelsConfig(RunSettings):
    ops: tuple[str, ...]
    kernel_sizes: tuple[int, ...] = (1, 3, 5, 7)
    max_shapes: int | None = None

    def __post_init__(self) -> None:
        if not self.ops:
            raise UsageError("no ops to measure: check --suite and --ops")
        valid = suites(self.backend)["all"]
        unknown = [op for op in self.ops if op not in valid]
        if unknown:
            raise UsageError(f"unknown op {unknown[0]!r}; valid ops: {', '.join(valid)}")
        if self.compile:
            raise UsageError("--compile: detprof kernels times PyTorch's ops eagerly, one by one; the sweep compiles")
        for k in self.kernel_sizes:
            if k < 1 or k % 2 == 0:
                raise UsageError(f"--kernel-sizes: '{k}' is not a positive odd integer")
        if not self.kernel_sizes and any(op in CONV_OPS for op in self.ops):
            raise UsageError("--kernel-sizes is empty: the conv suite needs at least one kernel size")
        super().__post_init__()
        if self.max_shapes is not None and self.max_shapes < 1:
            raise UsageError(f"--max-shapes must be at least 1, not {self.max_shapes}")

    def manifest(self, cases: list[OpCase]) -> dict[str, Any]:  # type: ignore[override]
        """What identifies the measurement, the derived cases included: a resumed bench must match."""
        return super().manifest() | {
            "ops": list(self.ops),
            "kernel_sizes": list(self.kernel_sizes),
            "cases": [case.as_dict() for case in cases],
        }


def plan_runs(cases: list[OpCase], repeats: int, batch_size: int) -> list[PlannedRun]:
    """Repeat by repeat, case by case, the two modes back to back (D, N, D, N, ...).

    Each record says what its case is, so that a summary needs nothing but the records.
    """
    return [
        PlannedRun(
            run_id=f"{case.key}--{mode}--r{repeat}",
            label=f"{case.key} {mode} r{repeat}",
            mode=mode,
            repeat=repeat,
            workload=Workload(case.workload, {"op": case.op, "params": case.params}),
            fields={
                "case": case.key,
                "op": case.op,
                "model": case.model,
                "layers": list(case.layers),
                "shape": case.shape,
                "repeat": repeat,
                "batch_size": batch_size,
            },
        )
        for repeat, case, mode in interleaved(cases, repeats)
    ]


def select_ops(
    by_name: dict[str, tuple[str, ...]], suite: str, named: tuple[str, ...] | None, *, strict: bool
) -> tuple[str, ...]:
    """The ops of suite ``suite`` of ``by_name`` (a backend's ``suites``), narrowed to ``named``;
    ``strict`` refuses a named op outside the suite."""
    if suite not in by_name:
        raise UsageError(f"unknown suite {suite!r}; choose one of {', '.join(by_name)}")
    if named is None:
        return by_name[suite]
    for op in named:
        if op not in by_name["all"]:
            raise UsageError(f"unknown op {op!r}; valid ops: {', '.join(by_name['all'])}")
        if strict and op not in by_name[suite]:
            raise UsageError(f"op {op!r} is not in suite {suite!r}; its ops: {', '.join(by_name[suite])}")
    return tuple(op for op in by_name[suite] if op in named)


def derive(config: KernelsConfig) -> list[OpCase]:
    """The cases of ``config``'s ops on its backend, shapes derived without loading a framework here."""
    request: dict[str, Any] = {
        "ops": list(config.ops),
        "kernel_sizes": list(config.kernel_sizes),
        "batch_size": config.batch_size,
        "input_size": config.input_size,
        "max_shapes": config.max_shapes,
    }
    if config.backend == backends.TORCH:
        return torch_cases.derive_cases(**request)
    return tensorflow_cases.derive_in_subprocess(config.backend, **request)
