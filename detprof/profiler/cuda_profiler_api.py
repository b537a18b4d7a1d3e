"""``cudaProfilerStart``/``cudaProfilerStop`` through ctypes: the switch nsys and nvprof
wait for, so that only the measured steps are traced.

TensorFlow loads the CUDA runtime itself; this module finds that same library rather than
bringing a CUDA binding of its own.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys

_CANDIDATES = ("libcudart.so", "libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0")


def _load_cudart() -> ctypes.CDLL:
    names = list(_CANDIDATES)
    found = ctypes.util.find_library("cudart")
    if found:
        names.insert(0, found)
    for site in sys.path:
        names.extend(sorted(glob.glob(os.path.join(site, "nvidia", "cuda_runtime", "lib", "libcudart.so*"))))
    errors = []
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
    raise RuntimeError(
        f"cannot load the CUDA runtime (libcudart) to start the profiler: {errors[-1] if errors else ''}"
    )


class CudaProfilerRange:
    """Start/stop of the CUDA profiler capture range; any CUDA error is raised, never ignored."""

    def __init__(self) -> None:
        self._cudart = _load_cudart()

    def _call(self, fn: str) -> None:
        status = getattr(self._cudart, fn)()
        if status != 0:
            raise RuntimeError(f"{fn} failed with CUDA error {status}")

    def start(self) -> None:
        self._call("cudaProfilerStart")

    def stop(self) -> None:
        self._call("cudaProfilerStop")
