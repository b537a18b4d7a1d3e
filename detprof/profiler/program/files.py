"""The files a program run exchanges with detprof, and what detprof reads off them.

A program that ``detprof sweep --command`` (or ``verify --command``) runs gets the path of its
run's spec (``ProgramSpec``) in ``SPEC_ENV``: ``detprof.measure()`` reads there whether and how
to trace and where ``detprof.fingerprint()`` writes, and writes the measured window back
(``Window``). Its ``sitecustomize`` hook writes, per Python process, what the frameworks it
loaded report in effect (``backends.program.in_effect_here``), which ``in_effect`` reads back
and checks against the run's mode. Imported inside the program
by ``detprof.api``, so this module stays light: the standard library and ``determinism`` only.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from detprof.determinism import Mode

SPEC_ENV = "DETPROF_PROGRAM_SPEC"


@dataclass(frozen=True)
class ProgramSpec:
    """One run of a program, as ``ProgramLauncher`` (or ``verify.program``) writes it and ``detprof.measure()``
    reads it."""

    run_id: str
    mode: Mode
    tracer: str
    """``profiler.tracers.TRACERS`` name of the run's tracer, whose in-process half the window runs."""
    trace_path: str | None
    window_path: str
    """Where the window is written (``Window``)."""
    fingerprints_path: str | None = None
    """``detprof verify --command``: the folder the window's fingerprints go to (``detprof.fingerprint``,
    ``fingerprints.RunFingerprints``); None under ``sweep``, where ``fingerprint()`` does nothing."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def read_spec() -> ProgramSpec | None:
    """This run's spec, or None when the process does not run under ``detprof sweep`` or ``verify --command``."""
    path = os.environ.get(SPEC_ENV)
    return ProgramSpec(**json.loads(Path(path).read_text())) if path else None


@dataclass(frozen=True)
class Window:
    """What ``detprof.measure()`` wrote: the steps it timed, and why it could not trace, if it could not."""

    step_wall_ns: list[int]
    """Wall time of each step: from one ``detprof.step()`` to the next (or to the window's end);
    the whole window as one step when the program marks none."""
    marked_steps: int
    """How many steps the program marked with ``detprof.step()`` (0: the window is one step)."""
    monotonic: tuple[float, float]
    """The window's start and end on the machine's monotonic clock, for the telemetry of its span."""
    failure: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "step_wall_ns": self.step_wall_ns,
            "marked_steps": self.marked_steps,
            "monotonic": list(self.monotonic),
            "failure": self.failure,
        }


def read_window(path: Path) -> Window | None:
    """The window a run's program wrote, or None when it opened none."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    start, end = data["monotonic"]
    return Window([int(ns) for ns in data["step_wall_ns"]], int(data["marked_steps"]), (start, end), data["failure"])


@dataclass
class InEffect:
    """What the program's processes reported in effect, merged, and what is wrong with it for the run's mode."""

    frameworks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Backend name -> what each process that loaded its framework reported."""
    versions: dict[str, str] = field(default_factory=dict)
    processes: int = 0
    seed: int | None = None
    """The seed the hook gave the program's generators (``--seed``); None where the program seeded its own."""
    problem: str | None = None
    """Why the run cannot count as measured in its mode; None when determinism was as asked."""

    @property
    def op_determinism(self) -> bool | None:
        """Whether every framework in every process had determinism on; None when none was loaded."""
        states = [state for found in self.frameworks.values() for state in found]
        return all(bool(state.get("op_determinism")) for state in states) if states else None

    def settings(self, mode: Mode) -> dict[str, Any]:
        """The record's ``settings``: the mode, ``op_determinism`` over all frameworks, and each framework's own."""
        per_framework = {name: found[0] if len(found) == 1 else found for name, found in self.frameworks.items()}
        seeded = {"seed": self.seed} if self.seed is not None else {}
        return {"mode": mode, "op_determinism": self.op_determinism, "frameworks": per_framework} | seeded


def in_effect(folder: Path, mode: Mode) -> InEffect:
    """The hook's reports in ``folder``, checked against ``mode``.

    A deterministic run counts only when some process loaded a framework and every framework
    in every process reported determinism on; a default run only when none did. A program
    that loaded no framework detprof knows (TensorFlow, JAX, PyTorch) cannot be verified, and
    neither can one whose processes never ran the hook (``python -I``, a program not in Python).
    """
    reports = [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    found = InEffect(processes=len(reports))
    for report in reports:
        for name, state in (report.get("frameworks") or {}).items():
            found.frameworks.setdefault(name, []).append(state)
        found.versions.update(report.get("versions") or {})
        found.seed = report.get("seed", found.seed)
    deterministic = mode == "deterministic"
    errors = [str(report["error"]) for report in reports if report.get("error")]
    wrong = [name for name, states in found.frameworks.items() if any(_on(s) != deterministic for s in states)]
    if errors:
        found.problem = f"cannot tell what was in effect: {errors[0]}"
    elif wrong:
        state = "not in effect" if deterministic else "on"
        found.problem = f"determinism was {state} in {', '.join(wrong)} in {mode} mode"
    elif deterministic and not reports:
        found.problem = (
            "determinism not verified: no Python process of the program reported what was in effect "
            "(was it run with python -I or -S, or without Python?)"
        )
    elif deterministic and not found.frameworks:
        found.problem = "determinism not verified: the program loaded none of TensorFlow, JAX and PyTorch"
    return found


def _on(state: dict[str, Any]) -> bool:
    return bool(state.get("op_determinism"))
