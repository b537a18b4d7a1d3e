"""A GPU study from request to bundle: the plan for this machine, one window of it, and what the window leaves.

Every window ends the same way, whether its parts finished or the budget stopped them: the
machine it ran on, the report of everything measured so far, ``summary.md`` (each part's expected
and actual time, what is left and why) and the bundle, so that each window's results stand on
their own and the next one resumes from ``gpu-study.json``.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from detprof import backends, bundle
from detprof.device_time import HEADINGS, PARTS, steps_fraction
from detprof.errors import UsageError
from detprof.gpu_labels import generation, label_matches
from detprof.gpu_study.costs import Costs, shipped_measured
from detprof.gpu_study.plan import (
    CHECKS,
    COMMAND_START_S,
    FINISH_S,
    OVERHEAD_SHARE,
    SCALES,
    WAYS,
    FollowUp,
    Part,
    StudyPlan,
    build_plan,
    check_part,
    installed_backends,
)
from detprof.gpu_study.state import STATE_FILE, StudyState
from detprof.gpu_study.window import StudyWindow
from detprof.store import ResultsStore, atomic_write_json

SWEPT = ("pairing", "overhead")
"""The kinds of part whose folder holds a sweep of the models' overheads."""
PACKAGES = ("detprof", "keras", *backends.NAMES, "jaxlib", "nvidia-cudnn-cu12", "nvidia-cudnn-cu13")
ENVIRONMENT = ("XLA_FLAGS", "CUDA_VISIBLE_DEVICES", "CUBLAS_WORKSPACE_CONFIG", "TF_DETERMINISTIC_OPS", "KERAS_BACKEND")


@dataclass(frozen=True)
class StudyRequest:
    out: Path
    scale: str | None
    backends: tuple[str, ...] | None
    budget_s: float
    resume: bool
    gpu: str | None
    """The GPU whose measured costs the plan uses: a name or label (default: this machine's)."""
    bundle_to: Path | None


@dataclass(frozen=True)
class Prepared:
    plan: StudyPlan
    state: StudyState
    gpu_name: str | None
    gpu_uuid: str | None
    shipped: Costs = field(default_factory=Costs)
    """What the last GPU run shipped with detprof measured on this GPU: what the plan's costs start from."""
    on_gpu: bool = False

    def follow_up_s(self, out: Path, backend: str, follow_up: FollowUp) -> float:
        """What ``backend``'s checks' ``follow_up`` is expected to take, by what the study has measured so far."""
        plan, state = self.plan, self.state
        costs = learned_costs(self.shipped, plan.scale.family_repeat_s, out, state)
        known = replace(state.known(), follow_ups={backend: follow_up})
        asked = build_plan(plan.scale, plan.backends, plan.budget_s, costs, on_gpu=self.on_gpu, known=known)
        return sum(part.estimate_s for part in asked.parts if part.name in follow_up.part_names(backend))

    def replanned(self, out: Path) -> Prepared:
        """The plan again, from what the study now knows (``StudyState.known``: the pairing check's answer, the
        models whose pairs failed in one process) and what its finished parts measured."""
        plan, state = self.plan, self.state
        costs = learned_costs(self.shipped, plan.scale.family_repeat_s, out, state)
        rebuilt = build_plan(plan.scale, plan.backends, plan.budget_s, costs, on_gpu=self.on_gpu, known=state.known())
        return replace(self, plan=rebuilt)


def prepare(request: StudyRequest, *, dry_run: bool) -> Prepared:
    """The plan for this request on this machine, and the state it continues (a new one where none)."""
    gpu_name, gpu_uuid = _gpu_here()
    state = StudyState.load(request.out)
    if state is not None and not request.resume and not dry_run:
        raise UsageError(f"{request.out} holds a GPU study already: --resume continues it, or name another --out")
    if state is None and request.resume:
        raise UsageError(f"--resume: {request.out} holds no GPU study to continue ({STATE_FILE} is missing)")
    scale = _scale(request, state, gpu_name, dry_run=dry_run)
    names = _backends(request, state, dry_run=dry_run)
    if state is None:
        state = StudyState(scale, list(names), gpu_name)
    elif not dry_run:
        state.gpu = same_gpu(request.out, state, gpu_name)
    shipped = measured_costs(request.gpu or gpu_name) if scale == "gpu" else Costs()
    on_gpu = gpu_name is not None or (dry_run and scale == "gpu")
    nothing = build_plan(SCALES[scale], names, request.budget_s, Costs(), on_gpu=on_gpu)
    return Prepared(nothing, state, gpu_name, gpu_uuid, shipped, on_gpu).replanned(request.out)


def _gpu_here() -> tuple[str | None, str | None]:
    """The first GPU this process sees: its name and UUID."""
    from detprof.profiler import devices

    gpus = devices.visible_gpus(devices.probe_gpus().gpus)
    return (gpus[0].name, gpus[0].uuid) if gpus else (None, None)


def same_gpu(out: Path, state: StudyState, gpu_name: str | None) -> str | None:
    """The GPU a study continued here measures: this machine's, where it is the one the study measured so far (as
    its state names it, else as its runs' records do); another GPU, or none, is refused, so that a study's
    overheads, its pairing check's answer and its costs stay one GPU's."""
    studied = state.gpu or recorded_gpu(out, state)
    if studied is None or studied == gpu_name:
        return gpu_name
    here = f"this machine's GPU is the {gpu_name}" if gpu_name else "this machine has no NVIDIA GPU"
    raise UsageError(
        f"--resume: {out} is a study of the {studied} and {here}: a study measures one GPU "
        "(name another --out to start one here)"
    )


def recorded_gpu(out: Path, state: StudyState) -> str | None:
    """The GPU the runs of a study's parts ran on, as their records name it (the first that ran on one)."""
    for name in state.parts:
        for kind in ("sweep", "verify", "stability"):
            for record in ResultsStore(out / name, kind).records():
                device = record.get("device") or {}
                if device.get("uuid"):
                    return str(device["name"])
    return None


def _scale(request: StudyRequest, state: StudyState | None, gpu_name: str | None, *, dry_run: bool) -> str:
    if request.scale is not None and request.scale not in SCALES:
        raise UsageError(f"--scale must be one of {', '.join(SCALES)}, not {request.scale!r}")
    if state is not None and request.scale not in (None, state.scale):
        raise UsageError(f"--scale: {request.out} is a study at scale {state.scale}, not {request.scale}")
    scale = request.scale or (state.scale if state else None)
    if scale is None and gpu_name is None and not dry_run:
        raise UsageError(
            "no NVIDIA GPU here: gpu-study measures one (--dry-run --gpu h100 shows its plan for one; "
            "--scale tiny runs its whole pipeline here at tiny sizes)"
        )
    return scale or "gpu"


def _backends(request: StudyRequest, state: StudyState | None, *, dry_run: bool) -> tuple[str, ...]:
    names = request.backends or (tuple(state.backends) if state else installed_backends())
    unknown = [name for name in names if name not in backends.NAMES]
    if unknown:
        raise UsageError(f"--backends: {', '.join(unknown)} is not a backend; backends: {', '.join(backends.NAMES)}")
    if not names:
        if dry_run:
            return (backends.TORCH, backends.JAX)
        raise UsageError(backends.NO_FRAMEWORK)
    missing = [name for name in names if not backends.get(name).installed()]
    if missing and not dry_run:
        raise UsageError(f"--backends: {', '.join(missing)} is not installed here")
    return tuple(names)


def measured_costs(gpu: str | None) -> Costs:
    """What one repeat of each model took on ``gpu`` (its name or label) in the newest run detprof shipped; where
    detprof shipped none on it, on the GPU of its architecture measured last (an H100's for an H200), saying so:
    most of a repeat is the process's start, building and compiling, and the steps run the same kernels."""
    from detprof.reports.gpu_reference import shipped

    if gpu is None:
        return Costs()
    rows = shipped()
    own = [row for row in rows if row.gpu == gpu or label_matches(gpu, row.gpu)]
    if own or (architecture := generation(gpu)) is None:
        return Costs(shipped_measured(own))
    alike = sorted((row for row in rows if generation(row.gpu) == architecture), key=lambda row: row.date)
    if not alike:
        return Costs()
    nearest = [row for row in alike if row.gpu == alike[-1].gpu]
    return Costs(shipped_measured(nearest, taken_for=f"{gpu} (both {architecture})"))


def learned_costs(shipped: Costs, family_repeat_s: dict[str, float], out: Path, state: StudyState | None) -> Costs:
    """The shipped costs, with what this study's own finished parts measured in their place: a repeat of each model
    it swept (per backend, as its pairs were made), a verify run and a stability run of each model; and, per
    backend, a repeat with a process per mode over one in one process, where it measured models both ways."""
    from detprof.analysis.run_costs import repeat_costs
    from detprof.gpu_study.costs import Measured

    measured = dict(shipped.measured)
    verify_s: dict[tuple[str, str], float] = {}
    stability_s: dict[tuple[str, str], float] = {}
    started: dict[str, list[float]] = {}
    reused_s: dict[tuple[str, str], float] = {}
    both_ways: dict[tuple[str, str], dict[str, list[float]]] = {}
    for name, outcome in (state.parts if state else {}).items():
        backend = name.split("-", 1)[0]
        folder = out / name
        if outcome.status != "done" or not folder.is_dir():
            continue
        swept = list(ResultsStore(folder, "sweep").records())
        for model, cost in repeat_costs(swept).items():
            measured[backend, model] = Measured(cost.seconds, cost.steps_s, cost.pairing, "in this study")
            both_ways.setdefault((backend, model), {}).setdefault(cost.pairing, []).append(cost.seconds)
        for model, cost in repeat_costs(swept, reused=True).items():
            reused_s[backend, model] = cost.seconds
        verify = list(ResultsStore(folder, "verify").records())
        for model in {r["model"] for r in verify}:
            runs = [r for r in verify if r["model"] == model and r.get("duration_s")]
            if runs:
                verify_s[backend, model] = sum(float(r["duration_s"]) for r in runs) / len(runs)
        runs = list(ResultsStore(folder, "stability").records())
        if runs and "-stability-" in name:
            model = name.split("-stability-", 1)[1].removesuffix("-first")
            stability_s[backend, model] = (outcome.seconds - COMMAND_START_S) / len(runs)
        starts = [
            parts["start"] + parts.get("device", 0.0)
            for kind in ("sweep", "verify")
            for record in ResultsStore(folder, kind).records()
            if "start" in (parts := record.get("time_parts") or {})
        ]
        if starts:
            started.setdefault(backend, []).extend(starts)
    worker_s = {backend: statistics.median(values) for backend, values in started.items()}
    apart: dict[str, list[float]] = {}
    for (backend, _), ways in both_ways.items():
        if ways.get("in_process") and ways.get("processes"):
            ratio = statistics.median(ways["processes"]) / statistics.median(ways["in_process"])
            apart.setdefault(backend, []).append(ratio)
    factors = {backend: statistics.median(ratios) for backend, ratios in apart.items()}
    return Costs(measured, family_repeat_s, verify_s, stability_s, worker_s, reused_s, factors)


def windows_of(plan: StudyPlan, state: StudyState) -> dict[str, int]:
    """The window each part not yet done is expected to run in (1: the next), by the window's own rule: in order,
    each part that fits what is left of the window (its first whatever its size) and waits for no part not yet placed
    (``StudyPlan.waiting``), the rest to the windows after."""
    left = [part for part in plan.parts if not state.is_done(part.name)]
    window: dict[str, int] = {}
    number = 0
    while left:
        number += 1
        room, later = plan.window_s, []
        for part in left:
            expected_s = state.expected_s(part)
            waits = [name for name in plan.waiting(part) if name not in window and not state.has_ended(name)]
            if not waits and (room == plan.window_s or expected_s <= room):
                window[part.name] = number
                room -= max(expected_s, 1.0)
            else:
                later.append(part)
        left = later
    return window


def run_window(prepared: Prepared, request: StudyRequest, say: Callable[[str], None]) -> Path:
    """One window: the parts that fit, then the machine, the report, the summary and the bundle; returns the
    bundle's path."""
    out = request.out
    out.mkdir(parents=True, exist_ok=True)
    prepared.state.save(out)
    window = StudyWindow(prepared.plan, prepared.state, out, say, kept_s=FINISH_S)

    def replan() -> StudyPlan:
        nonlocal prepared
        note_apart_models(prepared, out)
        note_pairing(prepared, out)
        note_knob_models(prepared, out)
        prepared = prepared.replanned(out)
        return prepared.plan

    try:
        window.run(lambda backend: knob_model(prepared.plan, out, backend), replan)
    finally:
        replan()
        describe_machine(out / "machine", window.number)
        _report(out, say)
        problems = gpu_checks(prepared, out) if prepared.gpu_uuid is not None else None
        (out / "summary.md").write_text(summary(prepared, out, problems))
    target = (request.bundle_to or out) / f"{out.name}.zip"
    target.parent.mkdir(parents=True, exist_ok=True)
    packed = bundle.write(out, target)
    bulk = f"; {len(packed.left_out)} traces and arrays left out to stay within 16 MiB" if packed.left_out else ""
    say(f"gpu-study: bundle {packed.path} ({packed.size / 2**20:.1f} MiB, {packed.files} files{bulk})")
    return packed.path


def knob_model(plan: StudyPlan, out: Path, backend: str) -> str | None:
    """The model whose determinism cost the most kernel time (else wall time) on ``backend`` in this study, of the
    models the registry sizes (a library's model function takes its images from the sweep's options)."""
    from detprof.reports.report_data import build_report

    folders = [out / p.name for p in plan.parts if p.kind in SWEPT and p.backend == backend and sized(p)]
    folders = [folder for folder in folders if (folder / "sweep" / "manifest.json").exists()]
    if not folders:
        return None
    costs = [
        (overhead.ratio, model.model)
        for sweep in build_report(folders, with_shipped=False).sweeps
        for model in sweep.models
        if (overhead := model.kernel or model.wall) is not None
    ]
    return max(costs)[1] if costs else None


def sized(part: Part) -> bool:
    """Whether every model of ``part`` is one the registry sizes (not a library's model function)."""
    from detprof.models.registry import BUILT_IN

    return all(model in BUILT_IN for model in part.models)


def note_apart_models(prepared: Prepared, out: Path) -> None:
    """For each backend whose overhead parts are all done, once: the models whose pairs failed in one process,
    which the next window reruns with a process per mode (of the models the registry sizes: a library's model
    function takes its images from its part's options, and a failed pair of one stays in the report as failed)."""
    state = prepared.state
    for backend in state.backends:
        overhead = [p for p in prepared.plan.parts if p.kind == "overhead" and p.backend == backend and sized(p)]
        if backend in state.apart_models or not all(state.is_done(part.name) for part in overhead):
            continue
        state.apart_models[backend] = failed_in_one_process([out / part.name for part in overhead])
    state.save(out)


def note_knob_models(prepared: Prepared, out: Path) -> None:
    """For each backend whose overhead parts are all done, once: the model its knob study takes, so that the knob
    study's parts (split by knobs where it is longer than a window) are planned for it from then on."""
    state = prepared.state
    for backend in state.backends:
        swept = [p for p in prepared.plan.parts if p.kind in SWEPT and p.backend == backend]
        if backend in state.knob_models or not swept or not all(state.is_done(p.name) for p in swept):
            continue
        model = knob_model(prepared.plan, out, backend)
        if model is not None:
            state.knob_models[backend] = model
    state.save(out)


def note_pairing(prepared: Prepared, out: Path) -> None:
    """For each backend, once its check parts are done: the pairing check's answer, which the backend's later parts
    follow (in one process where it agrees, else a process per mode), and the repeats check's (their repeats in one
    process where it agrees, else a process per repeat). Where either cannot tell and more repeats would answer within
    a window, once: its follow-up (``plan.FollowUp``), whose parts end before both answer, read with the first
    repeats."""
    from detprof.analysis.pairing_check import compare

    state = prepared.state
    kept = {"pairing": state.pairing, "shared": state.shared}
    follow_ups = state.known().follow_ups
    for backend in state.backends:
        asked = follow_ups.get(backend)
        base = [check_part(backend, way) for way, _, _ in WAYS]
        if all(backend in answers for answers in kept.values()) or not all(state.is_done(name) for name in base):
            continue
        if asked is not None and not all(state.has_ended(name) for name in asked.part_names(backend)):
            continue
        answers = {
            check: compare(way_records(out, backend, cheap), way_records(out, backend, reference), ways)
            for check, cheap, reference, ways in CHECKS
            if backend not in kept[check]
        }
        follow_up = FollowUp.asked(answers, prepared.plan.scale) if asked is None else None
        if follow_up is not None and prepared.follow_up_s(out, backend, follow_up) <= prepared.plan.window_s:
            state.follow_ups[backend] = asdict(follow_up)
            continue
        for check, answer in answers.items():
            kept[check][backend] = answer.to_json()
    state.save(out)


def way_records(out: Path, backend: str, way: str) -> list[dict[str, Any]]:
    """The records of one way of a backend's checks: its sweep's, then its follow-up's with their repeats numbered on
    from the first's (a sweep pairs its two modes by repeat)."""
    first = list(ResultsStore(out / check_part(backend, way), "sweep").records())
    after = 1 + max((int(record.get("repeat", 0)) for record in first), default=-1)
    more = ResultsStore(out / check_part(backend, way, more=True), "sweep").records()
    return first + [record | {"repeat": int(record.get("repeat", 0)) + after} for record in more]


def failed_in_one_process(folders: Sequence[Path]) -> list[str]:
    """The models in these sweeps with no pair of modes measured, whose runs failed with both modes in one
    process (``ModelOverhead.failed_in_one_process``, what the report's note reads too)."""
    from detprof.analysis.overhead import model_overheads

    records = [r for folder in folders for r in ResultsStore(folder, "sweep").records()]
    overheads = model_overheads(records).values()
    return sorted(o.model for o in overheads if o.failed_in_one_process and o.kernel is None and o.wall is None)


def gpu_checks(prepared: Prepared, out: Path) -> list[str]:
    """``make gpu-check``'s checks, folded in on this study's own results: each sweep's runs ok with GPU kernels in
    both modes, determinism in effect exactly in deterministic mode, on the GPU the study saw; each stability
    study's control runs bitwise identical on the GPU; each verified model's deterministic runs identical on the GPU."""
    from detprof.analysis.verification import verifications
    from detprof.doctor.gpu_check import check_control, check_sweep_records, check_verification

    problems = []
    for part in prepared.plan.parts:
        folder = out / part.name
        if not prepared.state.is_done(part.name):
            continue
        if part.kind in SWEPT:
            records = ResultsStore(folder, "sweep").records()
            found = check_sweep_records(records, prepared.gpu_uuid, wraps_process=False)
        elif part.kind == "stability":
            found = check_control(json.loads((folder / "stability" / "summary.json").read_text()))
        elif part.kind == "verify":
            found = check_verification([model.to_json() for model in verifications(ResultsStore(folder, "verify"))])
        else:
            continue
        problems += [f"{part.name}: {problem}" for problem in found]
    return problems


def describe_machine(folder: Path, window: int) -> None:
    """The machine a window ran on: its GPU (NVML), packages, the environment that switches determinism, and
    ``nvidia-smi -q`` where it exists."""
    from detprof.profiler import devices

    folder.mkdir(parents=True, exist_ok=True)
    probe = devices.probe_gpus()
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    machine: dict[str, Any] = {
        "window": window,
        "at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "gpus": [asdict(gpu) for gpu in devices.visible_gpus(probe.gpus)],
        "nvml": probe.problems,
        "packages": versions,
        "environment": {name: os.environ[name] for name in ENVIRONMENT if name in os.environ},
    }
    atomic_write_json(folder / f"window-{window}.json", machine)
    if shutil.which("nvidia-smi"):
        done = subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True, timeout=60, check=False)
        (folder / f"nvidia-smi-window-{window}.txt").write_text(done.stdout)


def _report(out: Path, say: Callable[[str], None]) -> None:
    from detprof.errors import InputError
    from detprof.reports.command import write_report

    try:
        write_report(out, out / "report.html")
    except InputError as exc:
        say(f"gpu-study: no report yet ({exc})")


def shown(part: Part, state: StudyState) -> str:
    """A part's command line as the plan and the summary show it: its folder left out, a knob study's chosen
    model in."""
    model = state.knob_models.get(part.backend) if part.chooses_model else None
    return " ".join(part.argv(part.name, model)[:-2])


def summary(prepared: Prepared, out: Path, problems: Sequence[str] | None = None) -> str:
    """``summary.md``: each part, its expected and actual time and what share of it measured steps, how it ended;
    how each backend pairs its modes and why; where each window's time went; what is left and why; on a GPU, what
    ``make gpu-check``'s checks found in the results (``problems``)."""
    plan, state = prepared.plan, prepared.state
    last = state.windows[-1] if state.windows else None
    budgets = ", ".join(f"{window.budget_s:.0f} s" for window in state.windows)
    lines = [
        f"# detprof gpu-study {out.name}: {prepared.gpu_name or 'no GPU'}, scale {plan.scale.name}",
        "",
        f"Windows so far: {len(state.windows)} (budgets {budgets or 'none yet'}), {OVERHEAD_SHARE:.0%} of each the "
        "overhead parts' share (their repeats added for precision).",
        "",
        "| part | command | expected | actual | measured steps | status | window |",
        "|---|---|---|---|---|---|---|",
    ]
    for part in plan.parts:
        outcome = state.parts.get(part.name)
        command = shown(part, state)
        if outcome is None:
            why = last.left.get(part.name, "not reached") if last else "not reached"
            lines.append(f"| {part.name} | `detprof {command}` | {part.estimate_s:.0f} s | | | left: {why} | |")
            continue
        said = f": {outcome.said}" if outcome.said else ""
        lines.append(
            f"| {part.name} | `detprof {command}` | {outcome.estimate_s:.0f} s | {outcome.seconds:.0f} s | "
            f"{_steps_share(outcome.time_parts)} | {outcome.status}{said} | {outcome.window} |"
        )
    lines += [f"| {name} | | | | | not run: {why} | |" for name, why in plan.not_run.items()]
    lines += pairing_lines(prepared)
    lines += window_time_lines(state)
    if problems is not None:
        lines += ["", "Checks on the GPU (make gpu-check's): " + ("all passed" if not problems else "")]
        lines += [f"- {problem}" for problem in problems]
    left = [p.name for p in plan.parts if not state.is_done(p.name)]
    lines += ["", f"Left: {len(left)} parts; `detprof gpu-study --resume --out {out}` continues." if left else "Done."]
    return "\n".join(lines) + "\n"


def _steps_share(parts: dict[str, float]) -> str:
    share = steps_fraction(parts)
    return "" if share is None else f"{parts.get('steps', 0.0):.0f} s ({share:.0%})"


def pairing_lines(prepared: Prepared) -> list[str]:
    """How each backend's later parts pair the modes and make their repeats, and why: each check's answer, or what
    is expected of it until it answers."""
    plan, state = prepared.plan, prepared.state
    checked = {part.backend for part in plan.parts if part.kind == "pairing"}
    modes = {b: "in one process" if plan.routes.get(b) == "in_process" else "a process per mode" for b in plan.backends}
    repeats = {
        b: "every repeat of a model in one process" if plan.shared.get(b) else "a process per repeat"
        for b in plan.backends
    }
    asked = state.known().follow_ups
    return [
        *_check_lines("How the modes are paired", "pairing check", "in one process and a process per mode", modes,
                      state.pairing, checked, asked),
        *_check_lines("How the repeats are made", "repeats check", "with a model's repeats in one process and with "
                      "a process each", repeats, state.shared, checked, asked),
    ]  # fmt: skip


def _check_lines(
    title: str,
    check: str,
    compared: str,
    how: Mapping[str, str],
    answers: Mapping[str, Mapping[str, Any]],
    checked: set[str],
    asked: Mapping[str, FollowUp],
) -> list[str]:
    from detprof.analysis.pairing_check import PairingAnswer

    lines = ["", f"{title} (the {check}: the same sweep {compared}):"]
    for backend, made in how.items():
        answer = answers.get(backend)
        if answer is None:
            until = f"until its {check} answers" if backend in checked else f"no {check} at this scale"
            if (follow_up := asked.get(backend)) is not None:
                more = f"{follow_up.repeats} more repeats a way of {', '.join(follow_up.models)}"
                until += f" (its first repeats could not tell: {more}, {', '.join(follow_up.part_names(backend))})"
            lines.append(f"- {backend}: {made}, {until}")
        else:
            read = PairingAnswer.from_json(answer)
            lines.append(f"- {backend}: {made}: the {check} {read.answer} ({read.why})")
    return lines


def window_time_lines(state: StudyState) -> list[str]:
    """Where each window's time went, part by part of a process's life (``device_time``)."""
    if not any(window.time_parts for window in state.windows):
        return []
    columns = [*PARTS, "command"]
    headings = [*(HEADINGS[part] for part in PARTS), "Command"]
    lines = ["", "Where each window's time went (seconds):", "", "| window | " + " | ".join(headings) + " |"]
    lines.append("|---" * (len(headings) + 1) + "|")
    for number, window in enumerate(state.windows, start=1):
        cells = [f"{window.time_parts.get(part, 0.0):.0f}" for part in columns]
        lines.append(f"| {number} | " + " | ".join(cells) + " |")
    return lines


def _steps_expected(parts: Sequence[Part], state: StudyState) -> str:
    """The share of ``parts``' expected time in measured steps, over the parts whose steps a GPU measured (theirs,
    or a model's like theirs: ``costs.Costs.relative``): a part known only by estimate (or one that times no step:
    ``verify``, stability) says nothing of it."""
    known = [p for p in parts if p.estimate.steps_s > 0 and p.estimate_s > 0]
    if not known:
        return "its share in measured steps not known (no GPU measured the steps of its parts)"
    steps = sum(p.estimate.steps_s * state.expected_s(p) / p.estimate_s for p in known)
    known_s = sum(state.expected_s(p) for p in known)
    return (
        f"measured steps {steps / known_s:.1%} of the {known_s:.0f} s of the {len(known)} "
        f"part{'s' * (len(known) != 1)} whose steps a GPU measured (theirs, or a model's like theirs)"
    )


def plan_lines(prepared: Prepared, request: StudyRequest) -> Sequence[str]:
    """The dry run: each part, its expected time, where that came from and the window it is expected in; each
    window's expected time and the share of it in measured steps; how each backend pairs its modes."""
    plan, state = prepared.plan, prepared.state
    window = windows_of(plan, state)
    lines = [
        f"detprof gpu-study: scale {plan.scale.name} on {', '.join(plan.backends)}, "
        f"{request.gpu or prepared.gpu_name or 'no GPU named'}, windows of {plan.budget_s:.0f} s "
        f"({FINISH_S:.0f} s of each kept for the report and the bundle)",
        f"the overhead parts' share: {OVERHEAD_SHARE:.0%} of the window, their repeats added for precision within "
        "it; each part starts only while its expected time fits what is left",
    ]
    for part in plan.parts:
        when = "done" if state.is_done(part.name) else f"window {window[part.name]}"
        expected = f"{state.expected_s(part):6.0f} s  {when:<9} ({part.estimated_from})"
        lines.append(f"  {part.name:<28} {expected}  detprof {shown(part, state)}")
    lines += [f"  {name:<28} not run: {why}" for name, why in plan.not_run.items()]
    lines += [line.removeprefix("- ") for line in pairing_lines(prepared)[1:]]
    for number in sorted(set(window.values())):
        parts = [p for p in plan.parts if window.get(p.name) == number]
        expected = sum(state.expected_s(p) for p in parts)
        counted = f"{len(parts)} part{'s' * (len(parts) != 1)}, {expected:.0f} s expected"
        lines.append(f"window {number}: {counted}; {_steps_expected(parts, state)}")
    total = sum(state.expected_s(p) for p in plan.parts if not state.is_done(p.name))
    windows = len(set(window.values()))
    lines.append(f"expected: {total:.0f} s in all, {windows} window{'s' * (windows != 1)}")
    return lines
