"""The kernels_bench measurement: every op case in both modes, repeat by repeat.

The same measured-study flow as the sweep (``profiler.study``), one op at a time: a fresh
process per run, the two modes back to back in each repeat, one atomic record per run,
``--resume``. A case that fails (out of memory, no deterministic implementation) is
recorded with its reason and the bench goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from detprof.errors import UsageError
from detprof.kernels_bench.cases import CONV_OPS, SUITES, OpCase
from detprof.profiler.launcher import Workload
from detprof.profiler.study import PlannedRun, RunSettings, interleaved

OP_WORKLOAD = "detprof.kernels_bench.ops:op_benchmark"


@dataclass(frozen=True, kw_only=True)
class KernelsConfig(RunSettings):
    ops: tuple[str, ...]
    kernel_sizes: tuple[int, ...] = (1, 3, 5, 7)
    max_shapes: int | None = None

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
            workload=Workload(OP_WORKLOAD, {"op": case.op, "params": case.params}),
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
