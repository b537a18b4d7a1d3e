"""How each kernel tracer wraps a worker process and where its trace lands.

nsys and nvprof are external programs that launch the worker; they record only between
``cudaProfilerStart`` and ``cudaProfilerStop``, which the worker calls around the
measured steps. The ``tf`` tracer is TensorFlow's own profiler, started and stopped inside
the worker. TensorFlow's profiler and nsys/nvprof both use CUPTI, so a worker only ever
runs under one of them.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from detprof.errors import UsageError

TracerName = Literal["nsys", "nvprof", "tf", "none"]
TRACER_CHOICES = ("auto", "nsys", "nvprof", "tf", "none")
InProcess = Literal["cuda-profiler-api", "tf-profiler", "none"]


@dataclass(frozen=True)
class Tracer:
    name: TracerName
    in_process: InProcess
    nvtx_steps: bool = False

    @property
    def wraps_process(self) -> bool:
        """nsys and nvprof run the worker as their child and trace the whole process."""
        return self.name in ("nsys", "nvprof")

    def command(self, worker: list[str], trace_base: Path) -> list[str]:
        """The full command line that runs ``worker`` under this tracer."""
        if self.name == "nsys":
            return [
                _executable("nsys"),
                "profile",
                "--trace=cuda,nvtx,cudnn,cublas",
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
                _executable("nvprof"),
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
            "none": None,
        }[self.name]


TRACERS: dict[TracerName, Tracer] = {
    "nsys": Tracer("nsys", "cuda-profiler-api", nvtx_steps=True),
    "nvprof": Tracer("nvprof", "cuda-profiler-api"),
    "tf": Tracer("tf", "tf-profiler"),
    "none": Tracer("none", "none"),
}


def _executable(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        hint = "install Nsight Systems (nsys)" if name == "nsys" else "install the CUDA toolkit's nvprof"
        raise UsageError(f"tracer {name!r} is not installed (not on PATH): {hint}, or choose --tracer tf")
    return path


def resolve_tracer(choice: str, gpu_present: bool) -> Tracer:
    """``auto`` is nsys when it is installed and a GPU is present, else TensorFlow's profiler."""
    if choice not in TRACER_CHOICES:
        raise UsageError(f"unknown tracer {choice!r}; choose one of {', '.join(TRACER_CHOICES)}")
    if choice == "auto":
        return TRACERS["nsys"] if gpu_present and shutil.which("nsys") else TRACERS["tf"]
    tracer = TRACERS[choice]  # type: ignore[index]
    if tracer.name in ("nsys", "nvprof"):
        _executable(tracer.name)
        if not gpu_present:
            raise UsageError(f"tracer {tracer.name!r} traces CUDA kernels, but no GPU is in use; choose --tracer tf")
    return tracer
