"""How each kernel tracer wraps a worker process and where its trace lands.

nsys and nvprof are external programs that launch the worker; they record only between
``cudaProfilerStart`` and ``cudaProfilerStop``, which the worker calls around the
measured steps, and they trace every backend alike. ``tf``, ``jax`` and ``torch`` are the
frameworks' own profilers (TensorFlow's and ``jax.profiler``, both writing XSpace, and
``torch.profiler``, writing Kineto JSON), started and stopped inside the worker; each traces
only its own framework, and on a CPU it is the only tracer there is. They and nsys/nvprof
all use CUPTI on a GPU, so a worker only ever runs under one of them.

A tracer taxes every API call and launch, and a deterministic implementation often
launches more kernels, so time measured under a tracer is biased against determinism:
kernel time comes from traced steps, wall time never does (``profiler.study.measured_parts``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from detprof.errors import UsageError

TracerName = Literal["nsys", "nvprof", "tf", "jax", "torch", "none"]
TRACER_CHOICES = ("auto", "nsys", "nvprof", "tf", "jax", "torch", "none")
InProcess = Literal["cuda-profiler-api", "tf-profiler", "jax-profiler", "torch-profiler", "none"]
FRAMEWORK_TRACERS: dict[str, TracerName] = {"tensorflow": "tf", "jax": "jax", "torch": "torch"}
"""Each backend's own profiler: what ``auto`` picks without a GPU (or without nsys)."""


_VERSION = re.compile(r"[Vv]ersion\s+(\d[\w.]*)")
"""The version in ``nsys --version`` ("NVIDIA Nsight Systems version 2025.3.1.90-253135822870v0", whose
build suffix is left out) and ``nvprof --version`` ("Release version 12.4.131 (21)")."""

NSYS_API_TRACES = ("cudnn", "cublas")
"""API traces nsys can add to ``cuda,nvtx`` on request (``--trace-api``); each taxes every call it records."""


@dataclass(frozen=True)
class Tracer:
    name: TracerName
    in_process: InProcess
    nvtx_steps: bool = False
    api_traces: tuple[str, ...] = ()
    """nsys only: the library API traces asked for (``NSYS_API_TRACES``), none by default."""

    @property
    def wraps_process(self) -> bool:
        """nsys and nvprof run the worker as their child and trace the whole process."""
        return self.name in ("nsys", "nvprof")

    @property
    def installed(self) -> bool:
        """Whether the program this tracer runs is on PATH (an in-process tracer needs none)."""
        return not self.wraps_process or shutil.which(self.name) is not None

    def version(self) -> str | None:
        """The version the installed program reports (``nsys --version``, ``nvprof --version``).

        None for an in-process tracer, a program not on PATH, or one that does not answer: a
        broken install (nsys without its libraries) is as unusable as a missing one.
        """
        path = shutil.which(self.name) if self.wraps_process else None
        if path is None:
            return None
        try:
            answer = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        found = _VERSION.search(answer.stdout + answer.stderr) if answer.returncode == 0 else None
        return found[1] if found else None

    def command(self, worker: list[str], trace_base: Path, *, require_installed: bool = True) -> list[str]:
        """The full command line that runs ``worker`` under this tracer.

        nsys gets ``--cuda-graph-trace=node`` always: XLA (and TensorFlow's own command
        buffers) launch kernels through CUDA graphs, which nsys otherwise records as one
        block per graph, so the kernel table would lose the kernels inside. Library API
        traces (cuDNN, cuBLAS) only when asked. ``require_installed=False`` (a dry run)
        writes the bare program name when it is not on PATH instead of refusing.
        """
        if self.name == "nsys":
            return [
                _executable("nsys", require_installed),
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
        if self.name == "nvprof":
            return [
                _executable("nvprof", require_installed),
                "--profile-from-start",
                "off",
                "--print-gpu-trace",
                "--csv",
                "--log-file",
                str(self.trace_path(trace_base)),
                *worker,
            ]
        return worker

    def trace_path(self, trace_base: Path) -> Path | None:
        """Where the trace is once the worker has exited (``None``: nothing is traced)."""
        return {
            "nsys": trace_base.with_name(trace_base.name + ".sqlite"),
            "nvprof": trace_base.with_name(trace_base.name + ".csv"),
            "tf": trace_base.with_name(trace_base.name + ".tfprof"),
            "jax": trace_base.with_name(trace_base.name + ".jaxprof"),
            "torch": trace_base.with_name(trace_base.name + ".pt.trace.json"),
            "none": None,
        }[self.name]


TRACERS: dict[TracerName, Tracer] = {
    "nsys": Tracer("nsys", "cuda-profiler-api", nvtx_steps=True),
    "nvprof": Tracer("nvprof", "cuda-profiler-api"),
    "tf": Tracer("tf", "tf-profiler"),
    "jax": Tracer("jax", "jax-profiler"),
    "torch": Tracer("torch", "torch-profiler"),
    "none": Tracer("none", "none"),
}


def _executable(name: str, required: bool = True) -> str:
    path = shutil.which(name)
    if path is None and not required:
        return name
    if path is None:
        hint = "install Nsight Systems (nsys)" if name == "nsys" else "install the CUDA toolkit's nvprof"
        raise UsageError(f"tracer {name!r} is not installed (not on PATH): {hint}, or choose --tracer auto")
    return path


def resolve_tracer(
    choice: str,
    gpu_present: bool,
    api_traces: tuple[str, ...] = (),
    *,
    backend: str = "tensorflow",
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
    own = FRAMEWORK_TRACERS[backend]
    if choice == "auto":
        choice = "nsys" if gpu_present and shutil.which("nsys") else own
    if choice in FRAMEWORK_TRACERS.values() and choice != own:
        raise UsageError(f"--tracer {choice} profiles another framework than --backend {backend}: use --tracer {own}")
    tracer = TRACERS[choice]  # type: ignore[index]
    if tracer.wraps_process:
        _executable(tracer.name, require_installed)
        if not gpu_present:
            raise UsageError(f"tracer {tracer.name!r} traces CUDA kernels, but no GPU is in use; choose --tracer {own}")
    if api_traces:
        if tracer.name != "nsys":
            raise UsageError(f"--trace-api is for --tracer nsys, not {tracer.name}")
        tracer = replace(tracer, api_traces=tuple(dict.fromkeys(api_traces)))
    return tracer
