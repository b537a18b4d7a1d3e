"""A worker's end: the seconds from writing its result to its exit, which its parent waits out before it reads the
result and starts the next run (issue "A GPU lease yields the answer, not start-up").

Side by side in one run, as ``bench_startup`` runs them: a whole worker (``python -m detprof.profiler.worker``:
smallcnn at 32x32, batch 32, a warm-up step and two measured ones, untraced) of this tree against ``BASELINE``,
taking turns round by round, medians over rounds. The end is read as the parent sees it: from the result file's
last write to the moment the parent's wait returns.

Target: on every installed backend, at most 0.25 s from the result to the exit, and on PyTorch and TensorFlow,
whose interpreters took longest to tear down, less CPU for the whole worker than the baseline's. Last measured
(2 cores, quiet): 0.63 s -> 0.04 s on TensorFlow, 0.37 s -> 0.06 s on JAX, 0.74 s -> 0.04 s on PyTorch; whole
workers 0.5 to 0.6 s less CPU.

Run: ``python -m benchmarks.bench_worker_exit``.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_startup import ROOT, environment, extract_tree, worker_spec
from benchmarks.results import record
from detprof import backends

BASELINE = "c91f395"
"""The last commit whose workers ended through the interpreter's teardown."""
ROUNDS = 3
TARGET_EXIT_S = 0.25
SLOW_TEARDOWN = ("torch", "tensorflow")
TARGET = (
    "Seconds from a worker's result to its exit, each installed backend, against the tree before: <= 0.25 s; "
    "less CPU per whole worker on PyTorch and TensorFlow"
)


def ended_worker(tree: Path, spec: Path, result: Path) -> tuple[float, float]:
    """One worker's seconds from its result's write to its exit, and its CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory(prefix="detprof-bench-cwd-") as cwd:
        command = [sys.executable, "-m", "detprof.profiler.worker", str(spec), str(result)]
        code = subprocess.run(command, env=environment(tree), capture_output=True, cwd=cwd).returncode
    exited = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    answer = json.loads(result.read_text())
    if code or answer["status"] != "ok":
        raise SystemExit(f"worker of {tree}: exit {code}, {answer.get('reason')}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return exited - result.stat().st_mtime, cpu


def figures(trees: dict[str, Path], backend: str, folder: Path) -> dict[tuple[str, str], float]:
    """Median seconds to exit and CPU seconds per tree on ``backend``."""
    spec = worker_spec(folder, backend)
    found: dict[tuple[str, str], list[float]] = {}
    for _ in range(ROUNDS):
        for name, tree in trees.items():
            result = folder / f"{backend}-{name}-result.json"
            result.unlink(missing_ok=True)
            to_exit, cpu = ended_worker(tree, spec, result)
            found.setdefault(("exit", name), []).append(to_exit)
            found.setdefault(("cpu", name), []).append(cpu)
    return {key: statistics.median(values) for key, values in found.items()}


def main() -> int:
    print(f"== a worker's end: this tree against {BASELINE} (medians over {ROUNDS} rounds) ==")
    checks: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="detprof-bench-worker-exit-") as tmp:
        trees = {"before": extract_tree(Path(tmp), BASELINE), "now": ROOT}
        for backend in backends.all_backends():
            if not backend.installed():
                print(f"{backend.name}: not installed, skipped")
                continue
            got = figures(trees, backend.name, Path(tmp))
            print(
                f"{backend.name:<10} result to exit before {got[('exit', 'before')]:.2f} s  now "
                f"{got[('exit', 'now')]:.2f} s; whole worker CPU before {got[('cpu', 'before')]:.2f} s  now "
                f"{got[('cpu', 'now')]:.2f} s"
            )
            checks[f"{backend.name} result to exit {got[('exit', 'now')]:.2f} s <= {TARGET_EXIT_S} s"] = (
                got[("exit", "now")] <= TARGET_EXIT_S
            )
            if backend.name in SLOW_TEARDOWN:
                saved = got[("cpu", "before")] - got[("cpu", "now")]
                checks[f"{backend.name} whole worker {saved:.2f} s less CPU > 0"] = saved > 0
    return record("bench_worker_exit", TARGET, checks)


if __name__ == "__main__":
    sys.exit(main())
