"""Whether this machine is ready to measure a device: one check per thing a sweep there relies on.

Users run it before a sweep and the fleet runs it on every node before scheduling there, so
a node that would only have failed later (no GPU, no nsys, a framework that sees no GPU,
a determinism switch that does not take) is left out with the reason. Every check that
needs a framework to run comes from a smoke run: a few steps of the smallest model through
the sweep's own plan and measured-study flow, in both modes, with the tracer a sweep there
would use, so the doctor tests exactly what a sweep would do rather than a copy of it.

A check that blocks readiness is ``missing`` or ``failed`` and ``required``. With
``force`` the GPU checks are still made and shown but do not block, the way ``--force``
lets a sweep file a CPU node's results under a GPU label (a fleet's CPU-only test node).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from detprof.backends import NO_FRAMEWORK, REGISTRY, refuse_unknown, require
from detprof.determinism import MODES
from detprof.errors import DetprofError, UsageError
from detprof.gpu_labels import CPU_LABEL, slug
from detprof.profiler import devices
from detprof.profiler.tracers import NVPROF_FIRST_UNSUPPORTED_CC, TRACERS, Tracer

CheckStatus = Literal["ok", "missing", "failed", "skipped"]
BLOCKING: frozenset[CheckStatus] = frozenset({"missing", "failed"})

SMOKE_MODEL = "smallcnn"
SMOKE_STEPS = 5
SMOKE_RUN = {"steps": SMOKE_STEPS, "warmup": 1, "repeats": 1, "batch_size": 8}
"""A smoke run is the smallest model for a few steps: it must start, train and be traced, not measure."""

NSYS_FIX = "install the Nsight Systems CLI (nsight-systems-cli, NVIDIA devtools apt repository) or use detprof's image"


@dataclass(frozen=True)
class Check:
    """One line of the checklist: what was checked, what was found, and how to fix it."""

    name: str
    status: CheckStatus
    detail: str
    fix: str = ""
    required: bool = True
    """False: shown, but not what readiness depends on (an optional tool, or a GPU check under ``force``)."""

    @property
    def blocks(self) -> bool:
        return self.required and self.status in BLOCKING


@dataclass(frozen=True)
class Readiness:
    """The checklist for one target (a GPU label or ``cpu``) and its verdict."""

    target: str
    checks: list[Check] = field(default_factory=list)
    forced: bool = False

    @property
    def ready(self) -> bool:
        return not any(check.blocks for check in self.checks)

    def reason(self) -> str:
        """Why the machine is not ready for the target, in one line; empty when it is."""
        blocking = [check for check in self.checks if check.blocks]
        return "; ".join(f"{check.name} {check.status}: {check.detail}" for check in blocking)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "ready": self.ready,
            "forced": self.forced,
            "reason": self.reason(),
            "checks": [asdict(check) for check in self.checks],
        }


def readiness(
    gpu: str | None = None,
    backends: Sequence[str] | None = None,
    *,
    force: bool = False,
    smoke: bool = True,
) -> Readiness:
    """Check this machine against ``gpu`` (a label; default: its own device, ``cpu`` without a GPU).

    ``backends``: the Keras backends to check (default every one installed). ``smoke=False``
    leaves out the smoke runs and with them every check that needs a framework running.
    A label that is no label, or an unknown backend, is the caller's mistake: ``UsageError``.
    """
    wanted = _backends(backends)
    probe = devices.probe_gpus()
    choice = devices.check_label(gpu, devices.visible_gpus(probe.gpus), force=True)
    gpu_check = _gpu_check(choice, probe, gpu_required=not force)
    checks = [gpu_check, *_tool_checks(choice, gpu_required=not force)]
    unrun = "not asked for" if not smoke else "no usable GPU" if gpu_check.blocks else None
    for backend in wanted:
        checks += _backend_checks(backend, gpu, force, choice, unrun)
    if not wanted:  # `pip install detprof` alone reads traces and results, but nothing here could measure
        checks.append(Check("framework", "missing", NO_FRAMEWORK))
    return Readiness(choice.label, checks, forced=force and choice.forced)


def _backends(backends: Sequence[str] | None) -> list[str]:
    if backends is None:
        return [backend.name for backend in REGISTRY.values() if backend.installed()]
    for name in backends:
        refuse_unknown(name)
    return list(dict.fromkeys(backends))


def _on_gpu(choice: devices.DeviceChoice) -> bool:
    """Whether the target is a GPU (the label says so, whether or not the GPU is there)."""
    return choice.label != CPU_LABEL


def _gpu_check(choice: devices.DeviceChoice, probe: devices.GpuProbe, *, gpu_required: bool) -> Check:
    """NVML sees the target GPU (or, for ``cpu``, what there is), with its driver and CUDA versions."""
    nvml_says = "; ".join(probe.problems) or "no devices"
    if not _on_gpu(choice):
        hidden = " (hidden from the workers)" if probe.gpus else ""
        found = ", ".join(gpu.name for gpu in probe.gpus) + hidden if probe.gpus else f"none (NVML: {nvml_says})"
        return Check("gpu", "skipped", f"the target is the CPU; NVIDIA GPUs: {found}")
    label = choice.label
    if choice.gpu is None:
        return Check(
            "gpu",
            "missing",
            f"NVML sees no NVIDIA GPU ({nvml_says})",
            f"run on a node with {label.upper()} GPUs and the NVIDIA driver loaded (nvidia-smi lists the GPU)",
            gpu_required,
        )
    gpu = choice.gpu
    found = (
        f"{gpu.name}, compute capability {gpu.compute_capability or '?'}, "
        f"driver {gpu.driver_version or '?'}, CUDA {gpu.cuda_driver_version or '?'} (NVML)"
    )
    if choice.forced:
        return Check(
            "gpu",
            "failed",
            f"the GPU is not {label.upper()}: {found}",
            f"run on a node with {label.upper()} GPUs, or check for --gpu {slug(gpu.name)}",
            gpu_required,
        )
    return Check("gpu", "ok", found)


def _tool_checks(choice: devices.DeviceChoice, *, gpu_required: bool) -> list[Check]:
    """nsys on a GPU target; nvprof where the GPU is older than compute capability 8.0, which it alone can trace.

    An nsys that is missing does not block: a sweep then traces the GPU with each framework's own profiler, as on
    the PyTorch and JAX images cloud GPUs come with. One on PATH that does not run blocks, since a sweep would pick it.
    """
    nsys = _tool_check(TRACERS["nsys"], NSYS_FIX)
    if not _on_gpu(choice):
        if nsys.status == "ok":
            return [Check(nsys.name, "ok", f"{nsys.detail} (not needed on the CPU)", required=False)]
        return [Check("nsys", "skipped", "not needed on the CPU: the backend's own profiler traces there")]
    if nsys.status == "missing":
        detail = f"{nsys.detail}: sweeps trace with each framework's own profiler, without the CUDA API timeline"
        checks = [Check(nsys.name, "missing", detail, nsys.fix, required=False)]
    else:
        checks = [Check(nsys.name, nsys.status, nsys.detail, nsys.fix, gpu_required)]
    cc = choice.gpu.cc_tuple if choice.gpu is not None and not choice.forced else None
    if cc is None:
        checks.append(Check("nvprof", "skipped", "needs the GPU's compute capability, and the GPU was not found"))
    elif cc >= NVPROF_FIRST_UNSUPPORTED_CC:
        checks.append(Check("nvprof", "skipped", f"cannot trace compute capability {choice.gpu.compute_capability}"))
    else:
        nvprof = _tool_check(TRACERS["nvprof"], "install the CUDA toolkit's nvprof (only --tracer nvprof needs it)")
        checks.append(Check(nvprof.name, nvprof.status, nvprof.detail, nvprof.fix, required=False))
    return checks


def _tool_check(tracer: Tracer, fix: str) -> Check:
    if not tracer.installed:
        return Check(tracer.name, "missing", f"{tracer.name} is not on PATH", fix)
    found = tracer.version()
    if found is None:
        return Check(tracer.name, "failed", f"{tracer.name} is on PATH but `{tracer.name} --version` fails", fix)
    return Check(tracer.name, "ok", f"{tracer.name} {found}")


def _backend_checks(
    backend: str, gpu: str | None, force: bool, choice: devices.DeviceChoice, unrun: str | None
) -> list[Check]:
    """The backend installed; then, from its smoke run (unless ``unrun`` says why not), the
    framework, its determinism switch and the trace."""
    try:
        require(backend)
    except UsageError as exc:
        return [Check(backend, "missing", str(exc))]
    names = (backend, f"determinism ({backend})", f"smoke run ({backend})")
    if unrun is not None:
        installed = Check(backend, "skipped", f"{_installed_version(backend)} installed; not run ({unrun})")
        return [installed, *(Check(name, "skipped", f"needs the smoke run ({unrun})") for name in names[1:])]
    try:
        smoke = smoke_run(backend, gpu, force)
    except DetprofError as exc:
        return [
            Check(names[0], "failed", f"the smoke run could not start: {exc}"),
            *(Check(name, "skipped", "the smoke run did not start") for name in names[1:]),
        ]
    uses_gpu = choice.gpu is not None and not choice.hide_gpus
    logs = f"the workers' logs are in {smoke.kept}" if smoke.kept else ""
    return [
        _framework_check(backend, smoke.records, uses_gpu, logs),
        _determinism_check(backend, smoke.records),
        _trace_check(backend, smoke, uses_gpu, logs),
    ]


@dataclass(frozen=True)
class SmokeRun:
    """What a smoke run left: its records, its tracer, and, where a run failed, the folder kept for its logs."""

    records: list[dict[str, Any]]
    tracer: str
    kept: Path | None


def smoke_run(backend: str, gpu: str | None, force: bool) -> SmokeRun:
    """A few steps of ``SMOKE_MODEL`` in both modes, planned and measured as ``detprof sweep`` would.

    The results go to a temporary folder, removed when every run is ok (a smoke run measures
    nothing worth keeping) and kept otherwise, for the workers' logs that say what went wrong.
    """
    from detprof.invocation import Invocation
    from detprof.options import RunOptions
    from detprof.profiler.study import MeasuredStudy, run_planned
    from detprof.profiler.sweep_request import SweepRequest
    from detprof.store import ResultsStore
    from detprof.sweep.sweep_runs import plan_runs

    options = RunOptions(backend=backend, gpu=gpu, force=force, **SMOKE_RUN)
    config, target = SweepRequest((SMOKE_MODEL,), options).resolve()
    folder = Path(tempfile.mkdtemp(prefix="detprof-doctor-"))
    store = ResultsStore(folder, "sweep")
    records = run_planned(
        MeasuredStudy("sweep", plan_runs(config), config, config.manifest(), target, folder, Invocation("doctor"))
    )
    if all(record["status"] == "ok" for record in records):
        shutil.rmtree(folder, ignore_errors=True)
        return SmokeRun([dict(r) for r in records], target.tracer.name, None)
    return SmokeRun([dict(r) for r in records], target.tracer.name, store.dir / "logs")


def _installed_version(backend: str) -> str:
    """``tensorflow 2.21.0``, read from the installed package without importing it."""
    module = REGISTRY[backend].module
    try:
        return f"{module} {metadata.version(module)}"
    except metadata.PackageNotFoundError:
        return module


def _framework_check(backend: str, records: list[dict[str, Any]], uses_gpu: bool, logs: str) -> Check:
    """The framework's version and build, and, on a GPU target, that it sees the GPU."""
    versions = next((r["versions"] for r in records if r.get("versions")), None)
    if versions is None:
        return Check(backend, "failed", f"no worker started: {_reasons(records)}", logs)
    built_for = (("cuda_build", "CUDA"), ("cudnn_build", "cuDNN"))
    build = ", ".join(f"{what} {versions[key]}" for key, what in built_for if versions.get(key))
    build = build or ("CUDA build" if versions.get("is_cuda_build") else "")
    seen = int(versions.get("gpus_visible") or 0)
    detail = f"{backend} {versions.get(backend, '?')} ({build or 'CPU build'}), sees {seen} GPU{'s' * (seen != 1)}"
    if uses_gpu and seen == 0:
        return Check(backend, "failed", detail, REGISTRY[backend].cuda_build)
    return Check(backend, "ok", detail)


def _determinism_check(backend: str, records: list[dict[str, Any]]) -> Check:
    """The switch takes: on in the deterministic run, off in the default one, as the framework reports it."""
    name = f"determinism ({backend})"
    effective = {r["mode"]: (r.get("settings") or {}).get("op_determinism") for r in records}
    if set(effective.values()) == {None}:
        return Check(name, "skipped", "no worker got as far as switching determinism")
    if effective == {"deterministic": True, "default": False}:
        return Check(name, "ok", "the framework reports op determinism on in deterministic mode, off in default")
    return Check(
        name,
        "failed",
        f"the framework reports op determinism {effective} (want on in deterministic mode, off in default)",
        f"install a {backend} whose determinism switch detprof knows (docs/getting-started.md), and report the "
        "versions",
    )


def _trace_check(backend: str, smoke: SmokeRun, uses_gpu: bool, logs: str) -> Check:
    """Every run ok (a traced run is ok only with kernels in its measured steps: ``launcher``), one traced run
    per mode, and under nsys one NVTX range per traced step.

    nsys and nvprof wrap the process, so a sweep under them adds an untraced run per mode for
    the wall time (``profiler.study.measured_parts``); those must run, but trace nothing.
    """
    name, tracer = f"smoke run ({backend})", smoke.tracer
    failed = [r for r in smoke.records if r["status"] != "ok"]
    traced = [r for r in smoke.records if r.get("measures") != "wall"]
    if failed or len(traced) != len(MODES):
        return Check(name, "failed", f"{SMOKE_MODEL} under {tracer}: {_reasons(failed) or 'runs missing'}", logs)
    kernels = [int(r.get("kernel_count") or 0) for r in traced]
    steps = [len(r.get("step_kernel_ns") or []) for r in traced]
    what = "kernels" if uses_gpu else "CPU ops"
    detail = f"{SMOKE_STEPS} steps of {SMOKE_MODEL} under {tracer} in both modes: {'/'.join(map(str, kernels))} {what}"
    if tracer == "nsys" and steps != [SMOKE_STEPS] * len(traced):
        return Check(
            name,
            "failed",
            f"{detail}, but {'/'.join(map(str, steps))} NVTX step ranges for {SMOKE_STEPS} steps",
            "install the nvtx package in detprof's environment (pip install nvtx) and a current nsys",
        )
    return Check(name, "ok", f"{detail}, {'/'.join(map(str, steps))} step ranges")


def _reasons(records: list[dict[str, Any]]) -> str:
    return "; ".join(f"{r['mode']}: {r.get('reason') or r['status']}" for r in records)
