"""``make gpu-check``: the GPU acceptance run, proving the GPU path end to end with what the machine has.

On a machine with an NVIDIA GPU and whichever frameworks are installed, it runs what a user
runs, as command lines (``detprof doctor``, a small sweep per installed backend with the
framework's own tracer and with nsys where it is installed, ``detprof verify`` and a stability
control study per backend, the report), checks what each one wrote, and ends non-zero on any failure. Everything it saw
goes to one folder (results, report, ``doctor`` output, versions, ``nvidia-smi -q``, each
command's output and a ``summary.md``), so the run can be read afterwards on another
machine. Without a GPU it says so in one line and ends 0, running nothing.

It needs no internet, no nsys and no TensorFlow, and writes nowhere but its folder: the
frameworks' temporary files and Keras' home go there too.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detprof import backends
from detprof.determinism import MODES
from detprof.errors import ExitCode

SWEEP_MODELS = "mediumcnn_k3"
SWEEP = ("--input-size", "32", "--repeats", "3", "--steps", "20", "--warmup", "5", "--batch-size", "32")
"""The paper's medium CNN (3x3 convolutions, batch norm, six poolings: the layers whose deterministic kernels
differ) at 32x32, both modes, 3 repeats. Every run is a fresh process, 14 to 19 s on an H200 whatever the
model, so one model keeps the whole check near 7 minutes with PyTorch and JAX (a GPU lent for 15)."""
STABILITY = ("--model", "smallcnn", "--variants", "control", "--runs", "2", "--epochs", "1")
VERIFY = ("--models", "smallcnn", "--steps", "10", "--gradients", "--input-size", "32")
COMMAND_TIMEOUT_S = 900
DEFAULT_OUT = Path("gpu-check")


@dataclass
class Step:
    """One thing the acceptance run checked, and what it found."""

    name: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        said = "; ".join(self.problems or self.notes)
        return f"{'ok  ' if self.ok else 'FAIL'} {self.name}" + (f": {said}" if said else "")


@dataclass(frozen=True)
class Ran:
    """A command line the run ran, where its output went, and how it ended."""

    argv: list[str]
    exit_code: int | str
    log: Path
    seconds: float


class Runner:
    """Runs ``detprof`` command lines in ``out``'s environment, each one's output to a log file of its own."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.ran: list[Ran] = []
        home = out / "home"
        for folder in (home / "tmp", home / "keras", out / "logs"):
            folder.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ) | {
            "TMPDIR": str(home / "tmp"),
            "KERAS_HOME": str(home / "keras"),
            "PYTHONUNBUFFERED": "1",
        }

    def detprof(self, name: str, *args: str, stdout: Path | None = None) -> Ran:
        return self.run(name, [sys.executable, "-m", "detprof.cli", *args], stdout=stdout)

    def run(self, name: str, argv: list[str], *, stdout: Path | None = None) -> Ran:
        """``argv`` run to its end (or its timeout), its output in ``logs/NAME.log`` (stdout in ``stdout`` if given)."""
        log = self.out / "logs" / f"{name}.log"
        started = time.monotonic()
        with open(log, "wb") as sink, open(stdout or os.devnull, "wb") as out:
            try:
                done = subprocess.run(
                    argv,
                    stdout=sink if stdout is None else out,
                    stderr=subprocess.STDOUT if stdout is None else sink,
                    env=self.env,
                    timeout=COMMAND_TIMEOUT_S,
                    check=False,
                )
                code: int | str = done.returncode
            except subprocess.TimeoutExpired:
                code = f"timed out after {COMMAND_TIMEOUT_S} s"
            except OSError as exc:
                code = f"cannot start: {exc.strerror or exc}"
        ran = Ran(argv, code, log, round(time.monotonic() - started, 1))
        self.ran.append(ran)
        return ran


def gpus_here() -> tuple[list[Any], str]:
    """The GPUs NVML shows this process (``CUDA_VISIBLE_DEVICES`` applied), and what NVML said when there are none."""
    from detprof.profiler import devices

    probe = devices.probe_gpus()
    return devices.visible_gpus(probe.gpus), "; ".join(probe.problems) or "no devices"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    gpus, said = gpus_here()
    if not gpus:
        print(f"gpu-check: no NVIDIA GPU here (NVML: {said}); nothing to check")
        return ExitCode.OK
    installed = [backend.name for backend in backends.all_backends() if backend.installed()]
    if not installed:
        print(f"gpu-check: no deep-learning framework is installed here ({', '.join(backends.NAMES)}); nothing to run")
        return ExitCode.CHECK_FAILED
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = (Path(args[0]) if args else DEFAULT_OUT) / stamp
    out.mkdir(parents=True)
    steps = run_all(Runner(out), gpus[0], installed)
    summary = summarize(out, gpus[0], installed, steps)
    (out / "summary.md").write_text(summary)
    print(summary)
    return ExitCode.OK if all(step.ok for step in steps) else ExitCode.CHECK_FAILED


def run_all(runner: Runner, gpu: Any, installed: Sequence[str]) -> list[Step]:
    """Every step, in the order a user would take them; a failing step does not stop the ones after it."""
    out = runner.out
    machine(runner)
    steps = [doctor_step(runner, gpu)]
    tracers = [None, *(["nsys"] if shutil.which("nsys") else [])]
    for backend in installed:
        for tracer in tracers:
            steps.append(sweep_step(runner, gpu, backend, tracer))
        steps.append(verify_step(runner, backend))
        steps.append(stability_step(runner, backend))
    ran = runner.detprof("report", "report", str(out), "-o", str(out / "report.html"))
    steps.append(report_step(ran, out / "report.html", gpu.name))
    return steps


def machine(runner: Runner) -> None:
    """What the machine is: every installed package's version, and what NVIDIA's tool says of the GPU."""
    runner.run("versions", [sys.executable, "-m", "pip", "list", "--format", "freeze"])
    if shutil.which("nvidia-smi"):
        runner.run("nvidia-smi", ["nvidia-smi", "-q"])


def _failed(ran: Ran) -> str | None:
    if ran.exit_code == 0:
        return None
    tail = [line for line in ran.log.read_text(errors="replace").splitlines() if line.strip()][-3:]
    return f"{' '.join(ran.argv[3:])} ended with {ran.exit_code}: {' | '.join(tail) or 'no output'}"


def doctor_step(runner: Runner, gpu: Any) -> Step:
    """``detprof doctor``: the GPU, the driver, each backend's switch on the device, a traced smoke run."""
    step = Step("doctor")
    answer = runner.out / "doctor.json"
    ran = runner.detprof("doctor", "doctor", "--format", "json", stdout=answer)
    try:
        checklist = json.loads(answer.read_text())
    except ValueError:
        checklist = None
    if checklist is None:
        step.problems.append(_failed(ran) or "doctor printed no checklist")
        return step
    for check in checklist.get("checks", []):
        if check.get("status") in ("missing", "failed") and check.get("required", True):
            step.problems.append(f"{check['name']} {check['status']}: {check.get('detail', '')}")
    if checklist.get("ready"):
        step.notes.append(f"ready for {checklist.get('target')} ({gpu.name})")
    return step


def sweep_step(runner: Runner, gpu: Any, backend: str, tracer: str | None) -> Step:
    """A small sweep on ``backend`` traced by its own profiler (``tracer`` None) or by nsys; its records checked."""
    own = backends.get(backend).tracer
    name = f"sweep {backend}" + (f" under {tracer}" if tracer else f" ({own})")
    folder = runner.out / (f"sweep-{backend}" + (f"-{tracer}" if tracer else ""))
    ran = runner.detprof(
        name.replace(" ", "-").replace("(", "").replace(")", ""),
        "sweep",
        "--backend",
        backend,
        "--models",
        SWEEP_MODELS,
        "--tracer",
        tracer or own,
        *SWEEP,
        "--out",
        str(folder),
        "--no-report",
    )
    step = Step(name)
    records = _records(folder / "sweep")
    failure = _failed(ran)
    if failure:
        step.problems.append(failure)
    step.problems += check_sweep_records(records, gpu.uuid, wraps_process=tracer is not None)
    if not step.problems:
        step.notes.append(f"{len(records)} runs ok in {ran.seconds:g} s")
    return step


def _records(study: Path) -> list[dict[str, Any]]:
    runs = study / "runs"
    return [json.loads(path.read_text()) for path in sorted(runs.glob("*.json"))] if runs.is_dir() else []


def check_sweep_records(
    records: Iterable[Mapping[str, Any]], gpu_uuid: str | None, *, wraps_process: bool
) -> list[str]:
    """What a GPU sweep must show: every run ok, GPU kernels in both modes, determinism in effect exactly in
    deterministic mode, every worker on the checked GPU, and wall time from untraced steps."""
    records = list(records)
    if not records:
        return ["no run was recorded"]
    problems = [f"{r['run_id']}: {r.get('status')}: {r.get('reason')}" for r in records if r.get("status") != "ok"]
    ok = [r for r in records if r.get("status") == "ok"]
    traced = {mode: [r for r in ok if r.get("mode") == mode and r.get("measures") != "wall"] for mode in MODES}
    for mode, runs in traced.items():
        if not runs:
            problems.append(f"{mode} mode: no traced run finished")
        elif not all(r.get("kernel_devices") and r.get("kernel_count") for r in runs):
            problems.append(f"{mode} mode: not every traced run holds GPU kernels")
    for r in records:
        effect = (r.get("settings") or {}).get("op_determinism")
        if effect is not (r.get("mode") == "deterministic"):
            problems.append(f"{r['run_id']}: determinism in effect is {effect} in {r.get('mode')} mode")
        device = r.get("device") or {}
        if gpu_uuid and (device.get("uuid"), device.get("cuda_visible_devices")) != (gpu_uuid, gpu_uuid):
            visible = device.get("cuda_visible_devices")
            problems.append(f"{r['run_id']}: ran on {device.get('uuid')} (CUDA_VISIBLE_DEVICES {visible})")
    walls = [r for r in ok if r.get("measures") in ("both", "wall")]
    untimed = [r["run_id"] for r in walls if not r.get("step_wall_ns")]
    if ok and not walls:
        problems.append("wall time missing: no untraced steps were timed")
    elif untimed:
        problems.append(f"wall time missing: {', '.join(untimed)} timed no untraced steps")
    if wraps_process and not any(r.get("measures") == "wall" for r in records):
        problems.append("no untraced run beside the traced ones: wall time would come from traced steps")
    return problems


def verify_step(runner: Runner, backend: str) -> Step:
    """``detprof verify`` on the GPU: deterministic runs bitwise identical at every layer, gradient and step."""
    folder = runner.out / f"verify-{backend}"
    answer = runner.out / f"verify-{backend}.json"
    ran = runner.detprof(
        f"verify-{backend}",
        "verify",
        "--backend",
        backend,
        *VERIFY,
        "--out",
        str(folder),
        "--format",
        "json",
        stdout=answer,
    )
    step = Step(f"verify {backend}")
    try:
        models = json.loads(answer.read_text())["models"]
    except (ValueError, KeyError):
        step.problems.append(_failed(ran) or "verify printed no answer")
        return step
    step.problems += check_verification(models)
    if not step.problems:
        step.notes += [f"{m['model']}: deterministic runs identical; default {_default_said(m)}" for m in models]
    return step


def check_verification(models: Iterable[Mapping[str, Any]]) -> list[str]:
    """Each model's deterministic runs identical on the GPU, no op refusing determinism, and no run failed; runs
    that parted beside each other say so (``verify.run.replicas_side_by_side``: the rule that let them is then in
    question)."""
    problems = []
    for model in models:
        if model.get("device") == "cpu":
            problems.append(f"{model['model']}: verified on the CPU, not the GPU")
        problems += [f"{model['model']}: {failure}" for failure in model.get("failures") or []]
        problems += [f"{model['model']}: {f.get('op')} refused determinism" for f in model.get("findings") or []]
        deterministic = model.get("deterministic") or {}
        if deterministic.get("identical") is not True:
            first = deterministic.get("first_difference") or {}
            where = f" (first at step {first.get('step')}, {first.get('layer')})" if first else ""
            beside = ", run side by side" if "deterministic" in (model.get("side_by_side") or ()) else ""
            said = deterministic.get("problem") or f"deterministic runs differ{where}{beside}"
            problems.append(f"{model['model']}: {said}")
    return problems


def _default_said(model: Mapping[str, Any]) -> str:
    default = model.get("default") or {}
    first = default.get("first_difference")
    if default.get("identical"):
        return "identical too"
    return f"parts at step {first['step']}, {first['layer']}" if first else str(default.get("problem"))


def stability_step(runner: Runner, backend: str) -> Step:
    """A stability control study on the GPU: two runs that must end bitwise identical."""
    folder = runner.out / f"stability-{backend}"
    ran = runner.detprof(f"stability-{backend}", "stability", "--backend", backend, *STABILITY, "--out", str(folder))
    step = Step(f"stability {backend} control")
    failure = _failed(ran)
    if failure:
        step.problems.append(failure)
    summary_path = next(folder.rglob("summary.json"), None)
    if summary_path is None:
        step.problems.append("no stability summary was written")
        return step
    step.problems += check_control(json.loads(summary_path.read_text()))
    return step


def check_control(summary: Mapping[str, Any]) -> list[str]:
    """The control variant verified bitwise identical, on the GPU its summary names."""
    control = next((v for v in summary.get("variants", []) if v.get("variant") == "control"), None)
    if control is None:
        return ["the summary holds no control variant"]
    check = control.get("determinism_check") or {}
    if not check.get("verified"):
        return [f"control runs not bitwise identical: {check.get('detail') or check}"]
    if str(summary.get("device", "cpu")) == "cpu":
        return ["the study trained on the CPU, not the GPU"]
    return []


def report_step(ran: Ran, report: Path, gpu_name: str) -> Step:
    """The report written, naming the GPU, with its telemetry and the published-figure comparison."""
    step = Step("report")
    failure = _failed(ran)
    if failure:
        step.problems.append(failure)
        return step
    page = report.read_text()
    for what, needle in (
        ("the GPU's name", gpu_name),
        ("the GPU's telemetry", "GPU during the runs"),
        ("the published figures", "Published figures"),
    ):
        if needle not in page:
            step.problems.append(f"the report does not show {what} ({needle!r})")
    return step


def summarize(out: Path, gpu: Any, installed: Sequence[str], steps: Sequence[Step]) -> str:
    """``summary.md``: the GPU and frameworks, each step's result, and where the rest is."""
    versions = {}
    for name in ("detprof", "keras", *installed):
        try:
            from importlib.metadata import version

            versions[name] = version(name)
        except Exception:  # a framework without distribution metadata still ran
            versions[name] = "unknown"
    failed = [s for s in steps if not s.ok]
    lines = [
        f"# detprof gpu-check {out.name}: {'all passed' if not failed else f'{len(failed)} of {len(steps)} failed'}",
        "",
        f"- GPU: {gpu.name} ({gpu.uuid}), driver {gpu.driver_version}, CUDA {gpu.cuda_driver_version}",
        f"- frameworks: {', '.join(f'{n} {v}' for n, v in versions.items())}",
        f"- nsys: {shutil.which('nsys') or 'not installed (the frameworks traced)'}",
        "",
        *(f"- {step.line()}" for step in steps),
        "",
        f"Everything is in {out}: doctor.json, sweep-*/, stability-*/, report.html, logs/ (versions, nvidia-smi -q, "
        "each command's output).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
