"""What a GPU study has done so far, in ``gpu-study.json`` beside its parts: the file ``--resume`` continues from.

Each window adds what it ran and what it left; each part keeps how it ended and how long it took
against its estimate, so that the next dry run (and the estimates kept in the repository) can be
corrected from what a GPU actually took.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from detprof.analysis.pairing_check import PairingAnswer
from detprof.errors import InputError
from detprof.gpu_study.plan import FollowUp, Known, Part
from detprof.store import atomic_write_json, read_json_object

STATE_FILE = "gpu-study.json"
PartStatus = Literal["done", "stopped", "failed"]
"""done: the command ended with its answer; stopped: the window ended it (its completed runs kept, ``--resume``
continues it); failed: it ended with an error (retried by ``--resume``)."""


@dataclass(frozen=True)
class PartOutcome:
    status: PartStatus
    seconds: float
    estimate_s: float
    exit_code: int | None
    window: int
    said: str = ""
    """The command's last lines where it failed."""
    time_parts: dict[str, float] = field(default_factory=dict)
    """Where its seconds went (``device_time.PARTS``, its runs' parts added, a pair's process once), and ``command``:
    the rest of the command's seconds (its own start, planning, writing), which no run accounted."""


@dataclass(frozen=True)
class Window:
    started: str
    budget_s: float
    seconds: float
    ran: list[str]
    left: dict[str, str]
    """Part name: why this window did not run it (or did not finish it)."""
    time_parts: dict[str, float] = field(default_factory=dict)
    """Its parts' ``time_parts`` added up."""


@dataclass
class StudyState:
    scale: str
    backends: list[str]
    gpu: str | None = None
    """The GPU the study measures, as NVML names it (None: none, or a study begun before its state named it); a
    window on another refuses to run, so that one study's overheads and costs are one GPU's."""
    parts: dict[str, PartOutcome] = field(default_factory=dict)
    knob_models: dict[str, str] = field(default_factory=dict)
    """Backend: the model its knob study studies, chosen once from its overhead results."""
    apart_models: dict[str, list[str]] = field(default_factory=dict)
    """Backend: the models whose pairs failed in one process, read once its overhead parts were done (none: an
    empty list); the plan reruns them with a process per mode (``plan.APART``)."""
    pairing: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Backend: the pairing check's answer (``analysis.pairing_check.PairingAnswer``), read once both its parts were
    done; the backend's later parts pair the modes as it says."""
    shared: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Backend: the repeats check's answer (a ``PairingAnswer`` of repeats in one process against a process per
    repeat), read once both its parts were done; the backend's later sweeps share a process across repeats only
    where it agrees."""
    follow_ups: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Backend: its checks' follow-up (``plan.FollowUp`` as JSON), asked for once where its first repeats could not
    tell; both checks answer once its parts have ended."""
    windows: list[Window] = field(default_factory=list)

    def is_done(self, part: str) -> bool:
        outcome = self.parts.get(part)
        return outcome is not None and outcome.status == "done"

    def known(self) -> Known:
        """What the plan takes from the study so far."""
        routes = {backend: PairingAnswer.from_json(answer).route for backend, answer in self.pairing.items()}
        shared = {
            backend: PairingAnswer.from_json(answer).answer == "agrees" for backend, answer in self.shared.items()
        }
        follow_ups = {
            backend: FollowUp(tuple(asked["models"]), int(asked["repeats"]), tuple(asked["ways"]))
            for backend, asked in self.follow_ups.items()
        }
        return Known(self.knob_models, self.apart_models, routes, shared, follow_ups)

    def has_ended(self, part: str) -> bool:
        """Whether ``part`` ran to its end, with its answer or an error (not stopped by a window, nor yet run)."""
        outcome = self.parts.get(part)
        return outcome is not None and outcome.status in ("done", "failed")

    def expected_s(self, part: Part) -> float:
        """What a part is still expected to take: a stopped one resumes with its completed runs kept, so the seconds
        it ran come off (never below a tenth of its estimate, for the runs it was in the middle of)."""
        outcome = self.parts.get(part.name)
        spent = outcome.seconds if outcome is not None and outcome.status == "stopped" else 0.0
        return max(part.estimate_s - spent, part.estimate_s / 10)

    def save(self, out: Path) -> None:
        atomic_write_json(out / STATE_FILE, asdict(self))

    @classmethod
    def load(cls, out: Path) -> StudyState | None:
        path = out / STATE_FILE
        if not path.exists():
            return None
        data: dict[str, Any] = read_json_object(path, "GPU study state")
        try:
            return cls(
                scale=data["scale"],
                backends=list(data["backends"]),
                gpu=data.get("gpu"),
                parts={name: PartOutcome(**outcome) for name, outcome in data.get("parts", {}).items()},
                knob_models=dict(data.get("knob_models", {})),
                apart_models={backend: list(models) for backend, models in data.get("apart_models", {}).items()},
                pairing=dict(data.get("pairing", {})),
                shared=dict(data.get("shared", {})),
                follow_ups=dict(data.get("follow_ups", {})),
                windows=[Window(**window) for window in data.get("windows", [])],
            )
        except (KeyError, TypeError) as exc:
            raise InputError(f"{path}: not a detprof GPU study's state ({exc})") from exc
