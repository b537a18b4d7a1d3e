"""Speed target of issue 5: pooled stability workers at least 1.6x the run throughput of one
fresh process per run, on the embedded default study (smallcnn on digits, variants
algo+impl, algo, impl, control, 5 runs each).

Both sides go through the same ``run_study`` with the same jobs, seeds and runs: the
baseline only sets ``tasks_per_worker=1``, so every run pays for a new Python process,
TensorFlow's import and start-up, the dataset load and the model's tracing, which the
pooled workers pay once. The deterministic-mode runs must also end with identical weights
on both sides: reusing a worker may save time but must not change a single bit of a result.

Run: ``make bench`` or ``python -m benchmarks`` (all benchmarks), or
``python -m benchmarks.bench_stability``.
"""

from __future__ import annotations

import io
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from benchmarks.results import record
from detprof.invocation import Invocation
from detprof.profiler.devices import choose_device
from detprof.stability import study
from detprof.store import ResultsStore

TARGET_RATIO = 1.6


def _timed_study(out: Path, jobs: int, tasks_per_worker: int | None) -> tuple[float, dict[str, str]]:
    start = time.perf_counter()
    study.run_study(
        study.StudyConfig(),
        out,
        Invocation("python -m benchmarks.bench_stability"),
        study.Workers(choose_device(None), jobs, tasks_per_worker),
        Console(file=io.StringIO()),
    )
    elapsed = time.perf_counter() - start
    records = ResultsStore(out, "stability").records()
    hashes = {r["run_id"]: r.get("weights_sha256", "") for r in records if r["mode"] == "deterministic"}
    return elapsed, hashes


TARGET = "the default stability study, pooled workers against one fresh process per run: >= 1.6x throughput"


def main() -> int:
    config = study.StudyConfig()
    jobs = study.default_jobs(choose_device(None))
    runs = config.runs * len(config.variants)
    print(
        f"== stability: {config.model} on {config.dataset}, {', '.join(config.variants)}, "
        f"{config.runs} runs each ({runs} runs, {config.epochs} epochs), {jobs} jobs =="
    )
    with tempfile.TemporaryDirectory(prefix="detprof-bench-stability-") as tmp:
        fresh_s, fresh_hashes = _timed_study(Path(tmp) / "fresh", jobs, tasks_per_worker=1)
        print(f"one fresh process per run: {fresh_s:.1f} s ({runs / fresh_s * 60:.1f} runs/min)")
        pooled_s, pooled_hashes = _timed_study(Path(tmp) / "pooled", jobs, tasks_per_worker=None)
        print(f"pooled workers (detprof):  {pooled_s:.1f} s ({runs / pooled_s * 60:.1f} runs/min)")
    ratio = fresh_s / pooled_s
    deterministic = len(pooled_hashes)
    identical = deterministic > 0 and pooled_hashes == fresh_hashes
    checks = {
        f"throughput ratio pooled / fresh {ratio:.2f}x >= {TARGET_RATIO}x": ratio >= TARGET_RATIO,
        f"{deterministic} deterministic-mode runs bitwise identical in pooled and fresh processes": identical,
    }
    return record("bench_stability", TARGET, checks)


if __name__ == "__main__":
    sys.exit(main())
