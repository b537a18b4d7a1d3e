"""One window of a GPU study: the parts that fit its budget, run as ``detprof`` commands, none past its end.

A part starts only while its expected time fits what is left of the window (the window's first part
starts whatever its estimate, so that a plan larger than one window still moves on). A part still
running when the window ends gets SIGTERM, which every detprof command answers as it answers Ctrl-C (its
workers stopped, its completed runs kept), and a grace period to stop them; the next window's ``--resume``
continues it. SIGTERM rather than SIGINT: a study started in the background (``make gpu-study &``, nohup) hands
its commands SIGINT ignored.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from detprof import study_kinds
from detprof.device_time import process_seconds
from detprof.gpu_study.plan import GRACE_S, Part, StudyPlan
from detprof.gpu_study.state import PartOutcome, PartStatus, StudyState, Window
from detprof.store import ResultsStore

ANSWERED = {"verify": frozenset({0, 1})}
"""Exit codes that are a part's answer: ``verify`` ends 1 when determinism did not hold, which is a finding."""
STOPPED = frozenset({130, 143, -signal.SIGINT, -signal.SIGTERM, -signal.SIGKILL})
"""How a part the window stopped ends: detprof's codes for Ctrl-C and SIGTERM, or the signal itself where it came
before the command could answer it."""


@dataclass(frozen=True)
class Ran:
    exit_code: int | None
    seconds: float
    stopped: bool


class StudyWindow:
    """Runs ``plan``'s parts not yet done in ``state`` into ``out`` until its budget, less ``kept_s`` for what the
    window writes after them, has passed."""

    def __init__(
        self, plan: StudyPlan, state: StudyState, out: Path, say: Callable[[str], None], kept_s: float
    ) -> None:
        self.plan, self.state, self.out, self.say = plan, state, out, say
        self.number = len(state.windows) + 1
        self.started = time.monotonic()
        self.deadline = self.started + plan.budget_s - kept_s
        self.ran: list[str] = []
        self.left: dict[str, str] = {}
        self.time_parts: dict[str, float] = {}
        (out / "logs").mkdir(parents=True, exist_ok=True)

    def run(self, choose_knob_model: Callable[[str], str | None], replan: Callable[[], StudyPlan]) -> Window:
        """Each part not done, in the plan's order, the plan made again after each (``replan``: what a part found,
        the pairing check's answer above all, shapes the parts after it)."""
        started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        considered: set[str] = set()
        try:
            while part := next(
                (p for p in self.plan.parts if p.name not in considered and not self.state.is_done(p.name)), None
            ):
                considered.add(part.name)
                self._consider(part, choose_knob_model)
                self.plan = replan()
        finally:
            seconds = round(time.monotonic() - self.started, 1)
            window = Window(started, self.plan.budget_s, seconds, self.ran, self.left, self.time_parts)
            self.state.windows.append(window)
            self.state.save(self.out)
        return window

    def _consider(self, part: Part, choose_knob_model: Callable[[str], str | None]) -> None:
        if waiting := [name for name in self.plan.waiting(part) if not self.state.has_ended(name)]:
            self.left[part.name] = f"waits for its pairing check's follow-up ({', '.join(waiting)})"
            return
        left_s = self.deadline - time.monotonic() - GRACE_S
        if left_s <= 0:
            self.left[part.name] = "the window's budget was spent"
            return
        expected_s = self.state.expected_s(part)
        if self.ran and expected_s > left_s:
            self.left[part.name] = f"expects {expected_s:.0f} s, {left_s:.0f} s were left"
            return
        model = None
        if part.chooses_model:
            model = self.state.knob_models.get(part.backend) or choose_knob_model(part.backend)
            if model is None:
                self.left[part.name] = f"no overhead measured on {part.backend} yet to choose its model"
                return
            self.state.knob_models[part.backend] = model
        self._run_part(part, model, left_s)

    def _run_part(self, part: Part, model: str | None, left_s: float) -> None:
        folder = self.out / part.name
        argv = part.argv(str(folder), model)
        expected_s = self.state.expected_s(part)
        self.say(f"gpu-study [{part.name}] detprof {' '.join(argv)} (expects {expected_s:.0f} s)")
        if folder.exists():
            argv.append("--resume")
        ran = self._call(argv, self.out / "logs" / f"{part.name}.log", left_s)
        status: PartStatus
        if ran.stopped or ran.exit_code in STOPPED:
            status = "stopped"
            self.left[part.name] = "stopped at the window's end (its completed runs kept)"
        elif ran.exit_code in ANSWERED.get(part.kind, frozenset({0})):
            status = "done"
        else:
            status = "failed"
        said = _tail(self.out / "logs" / f"{part.name}.log") if status == "failed" else ""
        if part.kind == "verify" and ran.exit_code == 1:
            said = "determinism did not hold (its report says where the runs part)"
        previous = self.state.parts.get(part.name)
        carried = previous if previous and previous.status == "stopped" else None
        seconds = ran.seconds + (carried.seconds if carried else 0.0)
        parts = part_time(folder, seconds)
        for name, value in parts.items():
            before = carried.time_parts.get(name, 0.0) if carried else 0.0
            self.time_parts[name] = round(self.time_parts.get(name, 0.0) + max(value - before, 0.0), 3)
        outcome = PartOutcome(
            status, round(seconds, 1), round(part.estimate_s, 1), ran.exit_code, self.number, said, parts
        )
        self.state.parts[part.name] = outcome
        self.state.save(self.out)
        self.ran.append(part.name)
        self.say(f"gpu-study [{part.name}] {status} in {ran.seconds:.0f} s" + (f": {said}" if said else ""))

    def _call(self, argv: list[str], log: Path, timeout_s: float) -> Ran:
        """``detprof ARGV`` in a session of its own (Ctrl-C here reaches it only as forwarded), its output to
        ``log``; SIGTERM at ``timeout_s``, SIGKILL of its session after the grace period."""
        started = time.monotonic()
        with open(log, "ab") as sink:
            child = subprocess.Popen(
                [sys.executable, "-m", "detprof.cli", *argv],
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=os.environ | {"PYTHONUNBUFFERED": "1"},
                start_new_session=True,
            )
            try:
                code = child.wait(timeout=timeout_s)
                return Ran(code, time.monotonic() - started, stopped=False)
            except subprocess.TimeoutExpired:
                code = _stop(child)
                return Ran(code, time.monotonic() - started, stopped=True)
            except KeyboardInterrupt:
                _stop(child)
                raise


def _stop(child: subprocess.Popen[bytes]) -> int | None:
    child.send_signal(signal.SIGTERM)
    try:
        return child.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        return child.wait()


def _tail(log: Path) -> str:
    """The command's last two lines: its one-line error, where it ended with one."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return " | ".join(lines[-2:])


def part_time(folder: Path, seconds: float) -> dict[str, float]:
    """Where a part's ``seconds`` went: its runs' parts added (a pair's process once), whatever study kind its folder
    holds, and the rest of the command's own time (``command``)."""
    records = [r for kind in study_kinds.names() for r in ResultsStore(folder, kind).records()]
    parts = process_seconds(records)
    return parts | {"command": round(max(seconds - sum(parts.values()), 0.0), 3)}
