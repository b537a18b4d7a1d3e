"""``WorkerSpec``: one measured run, as the launcher writes it and the worker reads it.

The one shape a run's settings take between the two processes: the launcher builds it from
the study's ``RunSettings`` and the planned run, writes it as JSON (``to_json``) and the
worker reads it back (``from_json``), so neither side spells out the other's keys. The
workload the spec names (``module:function``, chosen by the package that owns it) gets the
whole spec: its own parameters (``params``: the model, the batch, the op case) and the
determinism settings it runs under.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from detprof.determinism import DeterminismSettings
from detprof.models.own import is_native


@dataclass(frozen=True)
class WorkerSpec:
    run_id: str
    workload: str
    """The workload's entry point, ``module:function``: ``(WorkerSpec) -> (step, facts)``."""
    determinism: DeterminismSettings
    warmup: int
    wall_steps: int
    """Untraced steps timed for wall time."""
    traced_steps: int
    """Steps under the tracer, whose kernels are the run's kernel time."""
    settling_steps: int
    """Untimed steps right after the tracer starts, so that what starting a capture costs lands on no measured step."""
    tracer: str
    """``profiler.tracers.TRACERS`` name: the tracer whose in-worker half runs around the traced steps."""
    trace_path: str | None
    result_path: str
    log_path: str
    params: dict[str, Any] = field(default_factory=dict)
    """What the workload itself needs: the model and its batch, or the op case and its parameters."""
    control_fd: int | None = None
    """A lockstep session's control pipe to the coordinator (``profiler.lockstep``); None: the steps run at once."""
    cpu_core: int | None = None
    """The core the measured steps are pinned to (a lockstep pair's shared core)."""
    cpu_threads: int | None = None
    """The framework's compute threads, where it can be told (``Backend.limit_threads``)."""
    run_seconds: float | None = None
    """Size the steps of each phase to about this many seconds from the warm-up's step time (``sized_steps``), at
    most ``wall_steps``/``traced_steps``; None: exactly those."""
    arm: str | None = None
    """Where one process runs both arms of a pair (``worker.pair_session``): this arm's name in its step ranges
    (``step i ARM``); None: the process runs this run alone."""
    arms_workload: str | None = None
    """With ``arm``: the entry point that builds both arms, ``(specs) -> (arms, facts)``; None: each arm's step is
    ``workload``'s, built and stepped under that arm's switches (``workloads.switched_arms``)."""

    @property
    def keras(self) -> bool:
        """Whether the workload trains through Keras: every one but a native PyTorch module's
        (``models.torch_modules``), whose process never loads Keras, as a user's training loop does not."""
        return not is_native(self.params)

    @property
    def most_steps(self) -> int:
        """The steps of a measured phase, before any sizing."""
        return max(self.wall_steps, self.traced_steps)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkerSpec:
        """The spec a launcher wrote; settings it leaves out take their defaults (``DeterminismSettings``'s)."""
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        return cls(**values | {"determinism": DeterminismSettings(**data["determinism"])})


MIN_SIZED_STEPS = 5
"""The fewest steps a phase is sized to: a per-step median of fewer says little."""


def sized_steps(most: int, run_seconds: float | None, step_ns: float | None) -> int:
    """The steps of a phase: ``most``, or as many as take about ``run_seconds`` at ``step_ns`` per step, between
    ``MIN_SIZED_STEPS`` and ``most``: a slow machine takes fewer steps per run, not more time."""
    if run_seconds is None or not step_ns:
        return most
    return max(min(MIN_SIZED_STEPS, most), min(most, round(run_seconds * 1e9 / step_ns)))


def typical_step_ns(warmup_ns: list[int]) -> int:
    """A step's time from the warm-up: the median of its later half (the first steps compile and autotune)."""
    later = sorted(warmup_ns[len(warmup_ns) // 2 :])
    return later[len(later) // 2] if later else 0
