"""``cudaProfilerStart``/``cudaProfilerStop`` through ctypes: the switch nsys and nvprof
wait for, so that only the measured steps are traced.

TensorFlow loads the CUDA runtime itself; this module calls that same library rather than
bringing a CUDA binding of its own. Loading another libcudart beside it (say the system
toolkit's next to the wheel's) would put two CUDA runtimes, possibly of different versions,
into one process. So the runtime already mapped comes first, then NVIDIA's pip wheels
(where TensorFlow's ``and-cuda`` extra puts it), and only then whatever the dynamic loader
finds by name, which in a CUDA base image is the system toolkit's copy.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

PROCESS_MAPS = Path("/proc/self/maps")
CUDART_PREFIX = "libcudart.so"
# Where NVIDIA's wheels put libcudart below a site directory: nvidia-cuda-runtime-cu11/-cu12
# in a folder of its own, the CUDA 13 wheels in the one folder all their libraries share.
WHEEL_LIB_DIRS = (("nvidia", "cuda_runtime", "lib"), ("nvidia", "cu13", "lib"))
# Names for the dynamic loader to resolve, CUDA 12 (what TensorFlow's wheels are built on) first.
LOADER_NAMES = ("libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0", "libcudart.so")


def mapped_cudart(maps: str) -> list[str]:
    """The libcudart files mapped into a process, from its ``/proc/<pid>/maps`` text.

    Each line is address, permissions, offset, device, inode and, for a file, its path
    (which may contain spaces); a library shows up once per mapped segment.
    """
    paths = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and os.path.basename(fields[5]).startswith(CUDART_PREFIX):
            paths.append(fields[5])
    return list(dict.fromkeys(paths))


def wheel_cudart(site_dirs: Sequence[str]) -> list[str]:
    """The libcudart files NVIDIA's CUDA runtime wheels installed below any of ``site_dirs``."""
    return [
        path
        for site in site_dirs
        for lib_dir in WHEEL_LIB_DIRS
        for path in sorted(glob.glob(os.path.join(site, *lib_dir, CUDART_PREFIX + "*")))
    ]


def cudart_candidates(
    maps: str,
    site_dirs: Sequence[str],
    find_library: Callable[[str], str | None] = ctypes.util.find_library,
) -> list[str]:
    """Every runtime to try, in order: mapped in the process, from a pip wheel, then by name."""
    found = find_library("cudart")
    by_name = [*LOADER_NAMES, *([found] if found else [])]
    return list(dict.fromkeys([*mapped_cudart(maps), *wheel_cudart(site_dirs), *by_name]))


def _process_maps() -> str:
    """This process's memory map; empty where there is no ``/proc``, so only the other places count."""
    try:
        return PROCESS_MAPS.read_text()
    except OSError:
        return ""


def _load_cudart() -> ctypes.CDLL:
    """The first candidate that loads; when none does, one line naming every one tried."""
    candidates = cudart_candidates(_process_maps(), sys.path)
    last_error = ""
    for candidate in candidates:
        try:
            return ctypes.CDLL(candidate)
        except OSError as exc:
            last_error = " ".join(str(exc).split())
    raise RuntimeError(
        f"cannot load the CUDA runtime (libcudart) to start the profiler: tried {', '.join(candidates)}; "
        f"the last failed with: {last_error}"
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
