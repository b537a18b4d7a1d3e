"""A training program detprof did not write, as a sweep plans it: its command checked, its runs, its settings.

``detprof sweep --command "python train.py --epochs 1" --name NAME`` measures the program the
way it measures a model named NAME: each repeat runs it once per mode, the modes interleaved
and their order alternating by repeat (``plan.interleaved``), each run a process of its own
(``program.run.ProgramLauncher``), and the records go to the same store, so the report,
``baseline`` and ``check`` read it as that model. Everything that can be wrong with the command
is said in one line before any run starts.
"""

from __future__ import annotations

import re
import shlex
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from detprof.errors import InputError, UsageError
from detprof.options import RunOptions
from detprof.profiler.measured_runs import (
    MeasurementTarget,
    PlannedRun,
    RunSettings,
    Workload,
    choose_target,
    interleaved,
)

PROGRAM_WORKLOAD = "program"
"""A program's ``Workload.entry``: no worker entry point runs it, ``ProgramLauncher`` runs its ``argv``."""
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""A name that is a file name and a run id part everywhere (``NAME--MODE--rN``)."""
WHAT_THE_PROGRAM_DECIDES = ("steps", "warmup", "batch_size", "input_size", "xla", "compile", "seed", "preset")
"""``RunSettings`` fields that the program decides for itself: its manifest leaves them out."""


PROGRAM_OPTIONS = frozenset(
    (
        "backend",
        "gpu",
        "gpus",
        "gpu_index",
        "force",
        "tracer",
        "trace_api",
        "repeats",
        "out",
        "resume",
        "run_timeout",
        "wait",
        "seed",
    )
)
"""The shared options that apply to a program (``--command``); it decides its own steps, data and model, and
seeds itself unless ``--seed`` is given."""


def refuse_for_programs(options: RunOptions, flags: list[str]) -> None:
    """One line naming every option given that a program (``--command``) cannot take."""
    given = [
        f"--{field.name.replace('_', '-')}"
        for field in fields(options)
        if field.name not in PROGRAM_OPTIONS and getattr(options, field.name) not in (None, False, ())
    ]
    if flags or given:
        raise UsageError(
            f"{', '.join([*flags, *given])}: not with --command, which runs a program as it is (it decides its "
            "own model, data and steps; see docs/own-models.md, 'Any training program')"
        )


def program_argv(command: str) -> list[str]:
    """``--command`` split as a shell would split it (it is never run through one), with its program found.

    A program that is not found is a usage error; a Python script that is not there (``python
    train.py``) is an input error: both are one line, before any run starts.
    """
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise UsageError(f"--command {command!r} cannot be split into arguments: {exc}") from exc
    if not argv:
        raise UsageError("--command is empty: give the program's command line, e.g. --command 'python train.py'")
    if shutil.which(argv[0]) is None:
        raise UsageError(f"--command: program {argv[0]!r} not found (not on PATH, nor an executable file)")
    script = argv[1] if len(argv) > 1 and Path(argv[0]).name.startswith("python") else None
    if script is not None and script.endswith(".py") and not Path(script).is_file():
        raise InputError(f"--command: the script {script} does not exist")
    return argv


def program_name(name: str | None) -> str:
    if name is None:
        raise UsageError("--command needs --name: the name the program's results go under, as a model's would")
    if not NAME_PATTERN.fullmatch(name) or "--" in name:
        raise UsageError(f"--name {name!r}: use letters, digits, '.', '_' and single '-' (it names files)")
    return name


@dataclass(frozen=True, kw_only=True)
class ProgramSettings(RunSettings):
    """How a program's runs are measured: the target's settings, its name and command; the program decides the rest."""

    name: str
    command: tuple[str, ...]
    program_seed: int | None = None
    """``--seed``: what the hook seeds the program's generators with; None where the program seeds its own."""

    def manifest(self) -> dict[str, Any]:
        config = {k: v for k, v in super().manifest().items() if k not in WHAT_THE_PROGRAM_DECIDES}
        seeded = {"seed": self.program_seed} if self.program_seed is not None else {}
        return config | {"program": {"name": self.name, "command": shlex.join(self.command)} | seeded}


@dataclass(frozen=True)
class ProgramRequest:
    """``sweep --command --name`` and the shared options as given."""

    command: str
    name: str | None
    options: RunOptions

    def resolve(self, presets: Sequence[str]) -> tuple[ProgramSettings, MeasurementTarget]:
        """The command and name checked, the device and tracer chosen (``plan.choose_target``), the settings."""
        argv = program_argv(self.command)
        name = program_name(self.name)
        target = replace(choose_target(self.options, presets), program=True)
        given = {"repeats": self.options.repeats} if self.options.repeats is not None else {}
        settings = ProgramSettings.for_target(
            target, self.options, name=name, command=tuple(argv), program_seed=self.options.seed, **given
        )
        return settings, target


def plan_program_runs(settings: ProgramSettings) -> list[PlannedRun]:
    """Repeat by repeat, the two modes back to back, their order alternating by repeat, as for a model."""
    return [
        PlannedRun(
            run_id=f"{settings.name}--{mode}--r{repeat}",
            label=f"{settings.name} {mode} r{repeat}",
            mode=mode,
            repeat=repeat,
            workload=Workload(PROGRAM_WORKLOAD, {"argv": list(settings.command)}),
            fields={"model": settings.name, "repeat": repeat},
        )
        for repeat, _name, mode in interleaved([settings.name], settings.repeats)
    ]
