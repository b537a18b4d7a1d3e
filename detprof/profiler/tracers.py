"""The kernel tracers, each with both of its halves: the command it wraps a worker in, and what runs in the worker.

nsys and nvprof are external programs that launch the worker; they record only between
``cudaProfilerStart`` and ``cudaProfilerStop``, which the worker calls around the measured
steps (``capture``), and they trace every backend alike. The frameworks' own profilers
(TensorFlow's and ``jax.profiler``, both writing XSpace, and ``torch.profiler``, writing
Kineto JSON) are started and stopped inside the worker by their backend
(``Backend.start_profiler``); each traces only its own framework, and on a CPU it is the only
tracer there is. They and nsys/nvprof all use CUPTI on a GPU, so a worker only ever runs
under one of them.

Every tracer marks measured step ``i`` with a range named ``step i`` (``step_range_name``; ``step i ARM`` where
one process measures two arms in turn):
nsys an NVTX range, the framework profilers their own annotation, so that the parsers split
kernel time into steps the same way whatever traced it.

A tracer taxes every API call and launch, and a deterministic implementation often
launches more kernels, so time measured under a tracer is biased against determinism:
kernel time comes from traced steps, wall time never does (``profiler.study.measured_parts``).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar, Protocol

import detprof.backends as backends
from detprof.backends.base import NVTX_DOMAIN, StopProfiler, step_range_name
from detprof.errors import UsageError
from detprof.profiler.devices import GpuInfo

_VERSION = re.compile(r"[Vv]ersion\s+(\d[\w.]*)")
"""The version in ``nsys --version`` ("NVIDIA Nsight Systems version 2025.3.1.90-253135822870v0", whose
build suffix is left out) and ``nvprof --version`` ("Release version 12.4.131 (21)")."""

NVPROF_FIRST_UNSUPPORTED_CC = (8, 0)
"""nvprof cannot trace Ampere and newer."""
NSYS_API_TRACES = ("cudnn", "cublas")
"""API traces nsys can add to ``cuda,nvtx`` on request (``--trace-api``); each taxes every call it records."""


class Capture(Protocol):
    """A tracer's half inside the worker: on around the traced steps, and each of them marked."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def step(self, index: int, arm: str | None = None) -> contextlib.AbstractContextManager[None]: ...


class _NoCapture:
    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def step(self, index: int, arm: str | None = None) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class _CudaProfilerRange(_NoCapture):
    """``cudaProfilerStart``/``Stop`` for nsys and nvprof. Under nsys, NVTX ranges for the steps and, where the
    backend pushes them (``Backend.mark_ops_for_nvtx``), for its ops and layers; nvprof reads none."""

    def __init__(self, nvtx: bool, backend: str | None) -> None:
        from detprof.profiler.cuda_profiler_api import CudaProfilerRange

        self.range = CudaProfilerRange()
        self.nvtx = nvtx
        self.backend = backend
        self._unmark: StopProfiler | None = None

    def start(self) -> None:
        if self.nvtx and self.backend is not None:
            self._unmark = backends.get(self.backend).mark_ops_for_nvtx()
        self.range.start()

    def stop(self) -> None:
        self.range.stop()
        if self._unmark is not None:
            self._unmark()

    def step(self, index: int, arm: str | None = None) -> contextlib.AbstractContextManager[None]:
        if not self.nvtx:
            return contextlib.nullcontext()
        import nvtx

        return nvtx.annotate(step_range_name(index, arm), domain=NVTX_DOMAIN)


class _FrameworkProfile(_NoCapture):
    def __init__(self, backend: backends.Backend, trace_path: str) -> None:
        self.backend = backend
        self.trace_path = trace_path
        self._stop: StopProfiler | None = None

    def start(self) -> None:
        self._stop = self.backend.start_profiler(self.trace_path)

    def stop(self) -> None:
        if self._stop is not None:
            self._stop()

    def step(self, index: int, arm: str | None = None) -> contextlib.AbstractContextManager[None]:
        return self.backend.step_mark(step_range_name(index, arm))


@dataclass(frozen=True)
class Tracer:
    """No tracer: untraced runs, which measure wall time only."""

    name: str = "none"
    wraps_process: ClassVar[bool] = False
    """nsys and nvprof run the worker as their child and trace the whole process."""

    @property
    def installed(self) -> bool:
        """Whether the program this tracer runs is on PATH (an in-process tracer needs none)."""
        return True

    @property
    def framework(self) -> backends.Backend | None:
        """The framework whose own profiler this is; a program must have loaded it for it to trace anything."""
        return None

    @property
    def trace_api(self) -> str | None:
        """The library API traces it adds, as ``--trace-api`` names them (nsys only); None: none."""
        return None

    def version(self) -> str | None:
        """The version the installed program reports; None for an in-process tracer."""
        return None

    def command(self, worker: list[str], trace_base: Path, *, require_installed: bool = True) -> list[str]:
        """The full command line that runs ``worker`` under this tracer."""
        return worker

    def trace_path(self, trace_base: Path) -> Path | None:
        """Where the trace is once the worker has exited (``None``: nothing is traced)."""
        return None

    def capture(self, trace_path: str | None, backend: str | None = None) -> Capture:
        """What the worker switches on around its traced steps; ``backend``: the framework it runs, where known
        (a user's program runs what it likes)."""
        return _NoCapture()


@dataclass(frozen=True)
class FrameworkProfiler(Tracer):
    """A backend's own profiler (``--tracer tf | jax | torch``), started inside the worker."""

    backend: str = backends.DEFAULT

    @property
    def framework(self) -> backends.Backend:
        return backends.get(self.backend)

    def trace_path(self, trace_base: Path) -> Path:
        return trace_base.with_name(trace_base.name + self.framework.trace_suffix)

    def capture(self, trace_path: str | None, backend: str | None = None) -> Capture:
        return _FrameworkProfile(self.framework, str(trace_path))


@dataclass(frozen=True)
class ProcessTracer(Tracer):
    """An external program that runs the worker as its child: nsys or nvprof."""

    wraps_process: ClassVar[bool] = True
    install_hint: ClassVar[str]
    trace_extension: ClassVar[str]

    @property
    def installed(self) -> bool:
        return shutil.which(self.name) is not None

    def version(self) -> str | None:
        """``nsys --version`` / ``nvprof --version``; None for one not on PATH, or one that does not answer
        (a broken install, such as nsys without its libraries, is as unusable as a missing one)."""
        path = shutil.which(self.name)
        if path is None:
            return None
        try:
            answer = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        found = _VERSION.search(answer.stdout + answer.stderr) if answer.returncode == 0 else None
        return found[1] if found else None

    def trace_path(self, trace_base: Path) -> Path:
        return trace_base.with_name(trace_base.name + self.trace_extension)

    def executable(self, required: bool = True) -> str:
        """The program's path; ``required=False`` (a dry run) gives the bare name when it is not on PATH."""
        path = shutil.which(self.name)
        if path is None and not required:
            return self.name
        if path is None:
            raise UsageError(
                f"tracer {self.name!r} is not installed (not on PATH): {self.install_hint}, or choose --tracer auto"
            )
        return path


@dataclass(frozen=True)
class Nsys(ProcessTracer):
    name: str = "nsys"
    api_traces: tuple[str, ...] = ()
    """The library API traces asked for (``NSYS_API_TRACES``), none by default."""
    install_hint: ClassVar[str] = "install Nsight Systems (nsys)"
    trace_extension: ClassVar[str] = ".sqlite"

    @property
    def trace_api(self) -> str | None:
        return ",".join(self.api_traces) or None

    def command(self, worker: list[str], trace_base: Path, *, require_installed: bool = True) -> list[str]:
        """``--cuda-graph-trace=node`` always: XLA (and TensorFlow's own command buffers) launch kernels through
        CUDA graphs, which nsys otherwise records as one block per graph, so the kernel table would lose the
        kernels inside. Library API traces (cuDNN, cuBLAS) only when asked."""
        return [
            self.executable(require_installed),
            "profile",
            f"--trace={','.join(('cuda', 'nvtx', *self.api_traces))}",
            "--cuda-graph-trace=node",
            "--capture-range=cudaProfilerApi",
            "--capture-range-end=stop",
            "--sample=none",
            "--cpuctxsw=none",
            "--export=sqlite",
            "--force-overwrite=true",
            f"--output={trace_base}",
            *worker,
        ]

    def capture(self, trace_path: str | None, backend: str | None = None) -> Capture:
        return _CudaProfilerRange(nvtx=True, backend=backend)


@dataclass(frozen=True)
class Nvprof(ProcessTracer):
    name: str = "nvprof"
    install_hint: ClassVar[str] = "install the CUDA toolkit's nvprof"
    trace_extension: ClassVar[str] = ".csv"

    def command(self, worker: list[str], trace_base: Path, *, require_installed: bool = True) -> list[str]:
        return [
            self.executable(require_installed),
            "--profile-from-start",
            "off",
            "--print-gpu-trace",
            "--csv",
            "--log-file",
            str(self.trace_path(trace_base)),
            *worker,
        ]

    def capture(self, trace_path: str | None, backend: str | None = None) -> Capture:
        return _CudaProfilerRange(nvtx=False, backend=None)


NO_TRACER = Tracer()
TRACERS: dict[str, Tracer] = {
    "nsys": Nsys(),
    "nvprof": Nvprof(),
    **{b.tracer: FrameworkProfiler(b.tracer, b.name) for b in backends.all_backends()},
    NO_TRACER.name: NO_TRACER,
}
"""Every tracer by its ``--tracer`` name: the worker finds its half by the name in its spec."""
TRACER_CHOICES = ("auto", *TRACERS)


def resolve_tracer(
    choice: str,
    gpu_present: bool,
    api_traces: tuple[str, ...] = (),
    *,
    backend: str = backends.DEFAULT,
    require_installed: bool = True,
) -> Tracer:
    """``auto`` is nsys when it is installed and a GPU is present, else the backend's own profiler.

    A framework's profiler traces that framework only, so ``--tracer tf`` with ``--backend
    torch`` is refused rather than run to an empty trace. ``require_installed=False`` (a dry
    run) accepts an nsys or nvprof that is not on PATH: the plan then says so instead of refusing.
    """
    if choice not in TRACER_CHOICES:
        raise UsageError(f"unknown tracer {choice!r}; choose one of {', '.join(TRACER_CHOICES)}")
    unknown = [api for api in api_traces if api not in NSYS_API_TRACES]
    if unknown:
        raise UsageError(f"unknown --trace-api {unknown[0]!r}; choose from {', '.join(NSYS_API_TRACES)}")
    own = backends.get(backend).tracer
    if choice == "auto":
        choice = "nsys" if gpu_present and TRACERS["nsys"].installed else own
    tracer = TRACERS[choice]
    if tracer.framework is not None and tracer.name != own:
        raise UsageError(f"--tracer {choice} profiles another framework than --backend {backend}: use --tracer {own}")
    if isinstance(tracer, ProcessTracer):
        tracer.executable(require_installed)
        if not gpu_present:
            raise UsageError(f"tracer {tracer.name!r} traces CUDA kernels, but no GPU is in use; choose --tracer {own}")
    if api_traces:
        if not isinstance(tracer, Nsys):
            raise UsageError(f"--trace-api is for --tracer nsys, not {tracer.name}")
        tracer = replace(tracer, api_traces=tuple(dict.fromkeys(api_traces)))
    return tracer


def refuse_nvprof(gpu: GpuInfo | None) -> None:
    """nvprof cannot trace Ampere and newer (it reports nothing useful there), so refuse up front."""
    if gpu is None:
        raise UsageError("--tracer nvprof needs an NVIDIA GPU and none was detected; use --tracer tf")
    cc = gpu.cc_tuple
    if cc is not None and cc >= NVPROF_FIRST_UNSUPPORTED_CC:
        raise UsageError(
            "nvprof does not support compute capability 8.0 and newer "
            f"({gpu.name} is {gpu.compute_capability}); use --tracer nsys"
        )
