"""A verify workload that runs out of device memory where another replica's worker shares its GPU: the one fake of
``tests/test_verify.py``'s crowding test, at the GPU boundary (what a GPU that two models do not fit does).

A worker told it shares the GPU (``gpu_env``'s ``XLA_PYTHON_CLIENT_PREALLOCATE=false``) leaves a marker named by its
start and pid in ``CROWDED_DIR`` and waits for the other's; the later of the two fails its runs as
``verify.workload`` names an out-of-memory failure, the earlier takes them. A worker with the device to itself takes
its runs."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from detprof import backends
from detprof.profiler.worker_process import utc_now
from detprof.store import atomic_write_json

CROWDED_DIR = "DETPROF_TEST_CROWDED_DIR"
WAIT_S = 60.0
"""How long a worker sharing the GPU waits for the other's marker: far beyond a loaded machine's start."""


def runs(asks: list[dict[str, Any]], outs: list[str], answers: str) -> int:
    crowded = _started_second(Path(os.environ[CROWDED_DIR])) if _shares_gpu() else False
    for index, ask in enumerate(asks):
        answer: dict[str, Any] = {"status": "ok", "reason": None, "steps": 0, "started_at": utc_now()}
        if crowded:
            answer |= {"status": "failed", "reason": f"{backends.OUT_OF_MEMORY}CUDA out of memory ({ask['mode']})"}
        atomic_write_json(Path(answers) / f"{index}.json", answer | {"finished_at": utc_now(), "duration_s": 0.1})
    return len(asks)


def _shares_gpu() -> bool:
    return os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE") == "false"


def _started_second(folder: Path) -> bool:
    mine = f"{time.time_ns():020d}-{os.getpid()}"
    (folder / mine).touch()
    deadline = time.monotonic() + WAIT_S
    while len(markers := sorted(p.name for p in folder.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    return markers.index(mine) > 0
