"""Stability workers that train on the CPU at once share its cores out (``stability.study.cpu_threads``): a PyTorch
study with one worker per core, each giving PyTorch its share of the cores, against the same study whose workers
each leave PyTorch its default of every core.

Both sides go through the same ``run_study`` with the same jobs, seeds and runs; the baseline only sets no thread
share. With every core taken by each worker, PyTorch's threads spin waiting for each other while their cores run
the other workers' (a small CNN's epoch on digits 0.15 s alone, 5 s beside a second worker on two cores). The
user's ``OMP_NUM_THREADS``, which would cap both sides, is left out of the workers' environment for the run.

Run: ``make bench`` or ``python -m benchmarks`` (all benchmarks), or
``python -m benchmarks.bench_stability_threads``.
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from rich.console import Console

from benchmarks.results import record
from detprof import backends
from detprof.invocation import Invocation
from detprof.profiler.devices import choose_device, usable_cpus
from detprof.stability import study
from detprof.store import ResultsStore

TARGET_RATIO = 2.0
TARGET = "a PyTorch stability study on the CPU, its workers sharing the cores against each taking all: >= 2x"
CONFIG = study.StudyConfig(variants=("control", "impl"), runs=3, epochs=3, backend=backends.TORCH)


def _timed_study(out: Path, jobs: int) -> tuple[float, set[int | None]]:
    """Seconds the study took, and the threads its records say each worker gave PyTorch."""
    start = time.perf_counter()
    study.run_study(
        CONFIG,
        out,
        Invocation("python -m benchmarks.bench_stability_threads"),
        study.Workers(choose_device("cpu"), jobs),
        Console(file=io.StringIO()),
    )
    elapsed = time.perf_counter() - start
    threads = {r.get("cpu_threads") for r in ResultsStore(out, "stability").records() if r["status"] == "ok"}
    return elapsed, threads


def main() -> int:
    jobs = min(usable_cpus(), 4)
    runs = CONFIG.runs * len(CONFIG.variants)
    print(f"== stability threads: {CONFIG.model} on {CONFIG.dataset}, torch, {runs} runs, {jobs} jobs on the CPU ==")
    if jobs < 2:
        return record("bench_stability_threads", TARGET, {"needs 2 usable cores or more (1 here): not run": True})
    with mock.patch.dict(os.environ), tempfile.TemporaryDirectory(prefix="detprof-bench-threads-") as tmp:
        os.environ.pop(study.OMP_THREADS_ENV, None)
        with mock.patch.object(study, "cpu_threads", lambda device, jobs: None):
            every_s, every_threads = _timed_study(Path(tmp) / "every", jobs)
        print(f"each worker every core:  {every_s:.1f} s")
        shared_s, shared_threads = _timed_study(Path(tmp) / "shared", jobs)
        print(f"cores shared (detprof): {shared_s:.1f} s")
    ratio = every_s / shared_s
    share = max(1, usable_cpus() // jobs)
    checks = {
        f"time ratio every core / shared {ratio:.2f}x >= {TARGET_RATIO}x": ratio >= TARGET_RATIO,
        f"each worker gave PyTorch {share} thread(s), and none without the share": (
            shared_threads == {share} and every_threads == {None}
        ),
    }
    return record("bench_stability_threads", TARGET, checks)


if __name__ == "__main__":
    sys.exit(main())
