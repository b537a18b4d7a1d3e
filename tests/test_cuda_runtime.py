"""Which CUDA runtime the profiler switch loads: the order of the candidates, on real files.

No GPU is needed, nor mostly a libcudart: process maps are text written like the kernel
writes them, wheels are empty files laid out like NVIDIA's, and ctypes' loader is replaced
where a test decides what loads. Real maps are read in a fresh interpreter, and where the
machine has a CUDA runtime, one is loaded there to show that its own path comes first.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from detprof.profiler import cuda_profiler_api
from detprof.profiler.cuda_profiler_api import (
    LOADER_NAMES,
    CudaProfilerRange,
    cudart_candidates,
    mapped_cudart,
    wheel_cudart,
)

WHEEL_RUNTIME = "site-packages/nvidia/cuda_runtime/lib/libcudart.so.12"
CU13_RUNTIME = "site-packages/nvidia/cu13/lib/libcudart.so.13"


def maps_line(path: str, perms: str = "r-xp", offset: str = "00000000") -> str:
    """One line of /proc/<pid>/maps for a file-backed mapping, columns padded as the kernel does."""
    return f"7f3a1c000000-7f3a1c0a2000 {perms} {offset} 103:02 1837465{' ' * 26}{path}"


def process_maps(*libraries: str) -> str:
    """A process's maps: an anonymous mapping, the heap, libc, and each library in two segments."""
    lines = [
        "55d4c3e00000-55d4c3e21000 rw-p 00000000 00:00 0                          [heap]",
        "7f3a1b000000-7f3a1b200000 rw-p 00000000 00:00 0 ",
        maps_line("/usr/lib/x86_64-linux-gnu/libc.so.6"),
    ]
    for library in libraries:
        lines += [maps_line(library), maps_line(library, "r--p", "000a2000")]
    return "\n".join(lines) + "\n"


def install(root: Path, *relative: str) -> list[str]:
    """Empty files at ``relative`` paths below ``root``, standing in for the wheels' libraries."""
    paths = []
    for rel in relative:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
        paths.append(str(path))
    return paths


def no_library(name: str) -> None:
    return None


def in_fresh_python(code: str) -> str:
    """What ``code`` prints in a new interpreter: a process whose mappings no other test touched."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_the_runtime_a_process_has_mapped_is_read_from_its_maps() -> None:
    wheel = "/opt/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12"
    maps = process_maps(wheel, "/opt/venv/lib/python3.11/site-packages/nvidia/cublas/lib/libcublas.so.12")
    assert mapped_cudart(maps) == [wheel]


def test_a_mapped_path_with_spaces_is_kept_whole() -> None:
    path = "/home/a user/my env/nvidia/cuda_runtime/lib/libcudart.so.12"
    assert mapped_cudart(process_maps(path)) == [path]


def test_a_real_process_map_without_a_runtime_reads_as_none() -> None:
    code = (
        "from pathlib import Path; from detprof.profiler.cuda_profiler_api import mapped_cudart; "
        "maps = Path('/proc/self/maps').read_text(); print('libc' in maps, mapped_cudart(maps))"
    )
    assert in_fresh_python(code) == "True []"


def test_a_runtime_the_process_loaded_is_the_first_candidate() -> None:
    """On a machine with a CUDA runtime (no GPU needed to load one), the loaded copy wins by its path."""
    found = ctypes.util.find_library("cudart")
    if found is None:
        pytest.skip("no CUDA runtime on this machine for the dynamic loader to find")
    code = (
        "import ctypes, sys; from detprof.profiler import cuda_profiler_api as api; "
        f"ctypes.CDLL({found!r}); print(api.cudart_candidates(api._process_maps(), sys.path)[0])"
    )
    first = in_fresh_python(code)
    assert os.path.isabs(first) and os.path.basename(first).startswith("libcudart.so"), first


def test_both_wheel_layouts_are_found(tmp_path: Path) -> None:
    cu12, cu13 = install(tmp_path, WHEEL_RUNTIME, CU13_RUNTIME)
    install(tmp_path, "site-packages/nvidia/cu13/lib/libcublas.so.13")
    assert wheel_cudart([str(tmp_path / "site-packages"), str(tmp_path / "missing")]) == [cu12, cu13]


def test_the_cuda_13_wheel_alone_is_found(tmp_path: Path) -> None:
    [cu13] = install(tmp_path, CU13_RUNTIME)
    candidates = cudart_candidates("", [str(tmp_path / "site-packages")], no_library)
    assert candidates[0] == cu13


def test_mapped_then_wheels_then_the_loader(tmp_path: Path) -> None:
    first_site, second_site = tmp_path / "user-site", tmp_path / "site-packages"
    [user_wheel] = install(first_site, "nvidia/cuda_runtime/lib/libcudart.so.12")
    cu12, cu13 = install(tmp_path, WHEEL_RUNTIME, CU13_RUNTIME)
    mapped = "/usr/local/lib/python3.11/dist-packages/nvidia/cuda_runtime/lib/libcudart.so.12"
    candidates = cudart_candidates(process_maps(mapped), [str(first_site), str(second_site)], no_library)
    assert candidates == [mapped, user_wheel, cu12, cu13, *LOADER_NAMES]


def test_a_mapped_runtime_comes_before_the_system_one(tmp_path: Path) -> None:
    [wheel] = install(tmp_path, WHEEL_RUNTIME)
    system = "/usr/local/cuda/lib64/libcudart.so.12"
    candidates = cudart_candidates(process_maps(wheel), [], lambda name: system)
    assert candidates[0] == wheel
    assert candidates.index(wheel) < candidates.index(system) == len(candidates) - 1


def test_a_runtime_found_twice_is_tried_once(tmp_path: Path) -> None:
    [wheel] = install(tmp_path, WHEEL_RUNTIME)
    site = str(tmp_path / "site-packages")
    candidates = cudart_candidates(process_maps(wheel), [site], lambda name: "libcudart.so.12")
    assert candidates == [wheel, *LOADER_NAMES]


def test_the_first_runtime_that_loads_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    [wheel] = install(tmp_path, WHEEL_RUNTIME)
    tried: list[str] = []

    def fake_cdll(name: str) -> str:
        tried.append(name)
        if name != "libcudart.so.12":
            raise OSError(f"{name}: invalid ELF header")
        return name

    monkeypatch.setattr(cuda_profiler_api, "_process_maps", lambda: process_maps(wheel))
    monkeypatch.setattr(ctypes, "CDLL", fake_cdll)
    assert CudaProfilerRange()._cudart == "libcudart.so.12"
    assert tried == [wheel, "libcudart.so.12"]


def test_nothing_loadable_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_profiler_api, "_process_maps", lambda: "")
    monkeypatch.setattr(cuda_profiler_api.sys, "path", [])

    def fake_cdll(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file:\nNo such file or directory")

    monkeypatch.setattr(ctypes, "CDLL", fake_cdll)
    with pytest.raises(RuntimeError) as raised:
        CudaProfilerRange()
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("cannot load the CUDA runtime (libcudart) to start the profiler: tried libcudart.so.12")
    assert message.endswith("cannot open shared object file: No such file or directory")
