"""Start-up targets of "fast to start and fast to test": detprof's own command lines and its workers.

Side by side in one run, the code of this tree against the code before the change
(``BASELINE``, taken out of git into a temporary folder with ``git archive``), each version
put first on ``sys.path`` of its own processes, the two taking turns round by round so that a
change in the machine's load hits both alike; figures are medians over rounds.

- ``detprof --version`` and ``detprof --help``, the whole process: within 0.3 s (the baseline
  imported every command's module, pandas and the sweep's driver among them, to list them).
- A worker's start-up on each installed backend: the CPU a fresh process spends importing
  what a worker imports and switching itself into deterministic mode (``determinism.apply``:
  the framework and Keras loaded), which every measured run, verification run and stability
  pool worker pays. Target: at least 25% less than the baseline's. The CPU of a whole worker
  (``python -m detprof.profiler.worker``: smallcnn at 32x32, batch 32, a warm-up step and two
  measured ones, untraced) is shown beside it: on JAX most of a worker's CPU is XLA compiling
  the weights' initializers and the training step, which no import saves.
- The worker that derives a PyTorch kernels bench's shapes (Keras building the medium CNN on
  PyTorch), where TensorFlow or JAX is installed beside it: its CPU and peak memory against the
  code before it kept them out for its whole life (``DERIVE_BASELINE``). Target: at least 25% less
  CPU.
- The worker that inspects your own PyTorch module named without ``--backend``, a worker of the
  installed default (TensorFlow), against the code before it held Keras and TensorFlow back until
  a model's code imports them (``INSPECT_BASELINE``): its CPU and peak memory. Target: at least
  25% less CPU.

Run: ``make bench`` or ``python -m benchmarks`` (all benchmarks), or ``python -m benchmarks.bench_startup``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.results import record
from detprof import backends
from detprof.determinism import DeterminismSettings
from detprof.profiler.worker_spec import WorkerSpec

BASELINE = "8b88b35"
"""The last commit before workers kept out what their imports load for nothing and ``detprof --help`` stopped
importing every command."""
DERIVE_BASELINE = "7c75800"
"""The last commit before the shape-deriving worker kept the other frameworks out after Keras' import too (Keras asks
whether TensorFlow is available whenever a layer's configuration is serialised)."""
INSPECT_BASELINE = "7efb345"
"""The last commit before the inspecting worker held Keras and TensorFlow back until a model's code imports them."""
ROOT = Path(__file__).resolve().parents[1]
CLI_ROUNDS = 7
WORKER_ROUNDS = 3
TARGET_CLI_S = 0.3
TARGET_STARTUP_SAVING = 0.25
STARTUP = """
import json, resource, sys
import detprof.profiler.worker
from detprof import determinism
determinism.apply(determinism.DeterminismSettings("deterministic", backend=sys.argv[1]))
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps(usage.ru_utime + usage.ru_stime))
"""
"""A worker's start-up: its imports, then the switch, which loads the framework and Keras."""
CPU_AND_PEAK = """
import json, resource
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"cpu": usage.ru_utime + usage.ru_stime, "peak_mib": usage.ru_maxrss / 1024}))
"""
"""What an entry's script prints last: the process's CPU seconds and peak memory (``entry_figures`` reads it)."""
DERIVE = """
from detprof.kernels_bench.cases import case_dicts
case_dicts("torch", ops=["conv2d_backward_filter"], kernel_sizes=[3], batch_size=2, input_size=32, max_shapes=1)
"""
"""The kernels bench's shape-deriving entry, as its worker calls it for a PyTorch bench."""
INSPECT = """
import sys
from detprof.models import own
from detprof.models.own_build import inspect
inspect([own.parse(sys.argv[1]).as_record()], sys.argv[2], [32, 32, 3], 10)
"""
"""The own-model inspecting entry, as its worker calls it for ``--models FILE.py:FUNCTION`` without ``--backend``."""
TORCH_MODULE = """
from torch import nn


def net():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
"""
"""A user's own PyTorch module, as a file."""


@dataclass(frozen=True)
class EntryComparison:
    """One worker entry run as a script on this tree and on ``baseline``'s, for its CPU and peak memory."""

    name: str
    script: str
    baseline: str
    args: tuple[str, ...] = ()


def environment(tree: Path) -> dict[str, str]:
    """This process's environment with ``tree`` first on ``sys.path``, quiet TensorFlow, no GPU."""
    return os.environ | {"PYTHONPATH": str(tree), "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}


def timed(command: Sequence[str], env: dict[str, str]) -> tuple[float, float, str]:
    """``command``'s wall seconds, CPU seconds and stdout, from ``getrusage`` of the children it leaves; run in an
    empty folder, so that ``python -m`` finds detprof on ``PYTHONPATH``, not in the working directory."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="detprof-bench-cwd-") as cwd:
        done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=cwd)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def extract_tree(folder: Path, commit: str) -> Path:
    """``commit``'s ``detprof`` package in ``folder``, out of this clone's history."""
    archive = subprocess.run(["git", "archive", commit, "detprof"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(folder / "detprof")], check=True)
    return folder


def worker_spec(folder: Path, backend: str) -> Path:
    """A registry model's measured run, untraced, as the launcher writes it."""
    spec = WorkerSpec(
        run_id="bench",
        workload="detprof.profiler.workloads:model_training",
        determinism=DeterminismSettings("deterministic", backend=backend),
        warmup=1,
        wall_steps=2,
        traced_steps=0,
        settling_steps=0,
        tracer="none",
        trace_path=None,
        result_path=str(folder / "result.json"),
        log_path=str(folder / "worker.log"),
        params={"model": "smallcnn", "batch_size": 32, "input_shape": [32, 32, 3], "classes": 10},
    )
    path = folder / f"{backend}.json"
    path.write_text(json.dumps(spec.to_json()))
    return path


def cli_figures(trees: dict[str, Path]) -> dict[tuple[str, str], float]:
    """Median wall seconds of ``detprof --version`` and ``--help`` per tree."""
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(CLI_ROUNDS):
        for args in (["--version"], ["--help"]):
            for name, tree in trees.items():
                wall, _, _ = timed([sys.executable, "-m", "detprof.cli", *args], environment(tree))
                times.setdefault((args[0], name), []).append(wall)
    return {key: statistics.median(values) for key, values in times.items()}


def worker_figures(trees: dict[str, Path], backend: str, folder: Path) -> dict[tuple[str, str], float]:
    """Median CPU seconds of a worker's start-up and of a whole worker per tree, on ``backend``."""
    spec = worker_spec(folder, backend)
    cpu: dict[tuple[str, str], list[float]] = {}
    for _ in range(WORKER_ROUNDS):
        for name, tree in trees.items():
            _, _, out = timed([sys.executable, "-c", STARTUP, backend], environment(tree))
            cpu.setdefault(("start-up", name), []).append(json.loads(out))
            worker = [sys.executable, "-m", "detprof.profiler.worker", str(spec), str(folder / "result.json")]
            _, used, _ = timed(worker, environment(tree))
            result = json.loads((folder / "result.json").read_text())
            if result["status"] != "ok":
                raise SystemExit(f"{backend} worker of {name}: {result['reason']}")
            cpu.setdefault(("worker", name), []).append(used)
    return {key: statistics.median(values) for key, values in cpu.items()}


def entry_figures(trees: dict[str, Path], comparison: EntryComparison) -> dict[tuple[str, str], float]:
    """Median CPU seconds and peak MiB of ``comparison``'s entry per tree."""
    figures: dict[tuple[str, str], list[float]] = {}
    for _ in range(WORKER_ROUNDS):
        for name, tree in trees.items():
            script = comparison.script + CPU_AND_PEAK
            _, _, out = timed([sys.executable, "-c", script, *comparison.args], environment(tree))
            for key, value in json.loads(out.strip().splitlines()[-1]).items():
                figures.setdefault((key, name), []).append(value)
    return {key: statistics.median(values) for key, values in figures.items()}


def entry_checks(comparison: EntryComparison, folder: Path) -> dict[str, bool]:
    """``comparison``'s saving in CPU, this tree against its baseline's."""
    folder.mkdir()
    figures = entry_figures({"before": extract_tree(folder, comparison.baseline), "now": ROOT}, comparison)
    saving = 1 - figures[("cpu", "now")] / figures[("cpu", "before")]
    print(
        f"{comparison.name}: CPU before {figures[('cpu', 'before')]:.2f} s  now {figures[('cpu', 'now')]:.2f} s  "
        f"({saving:.0%} less); peak memory before {figures[('peak_mib', 'before')]:.0f} MiB  now "
        f"{figures[('peak_mib', 'now')]:.0f} MiB"
    )
    return {f"{comparison.name} {saving:.0%} less CPU >= {TARGET_STARTUP_SAVING:.0%}": saving >= TARGET_STARTUP_SAVING}


def worker_entry_checks(folder: Path) -> dict[str, bool]:
    """The workers that keep out, or hold back, frameworks a PyTorch model does not need: where PyTorch and another
    framework Keras would load are installed."""
    torch = backends.get(backends.TORCH)
    if not torch.installed() or not any(backends.get(name).installed() for name in torch.keeps_out):
        print("PyTorch workers beside another framework: need PyTorch and TensorFlow or JAX installed, skipped")
        return {}
    folder.mkdir()
    module = folder / "own_module.py"
    module.write_text(TORCH_MODULE)
    comparisons = [EntryComparison("PyTorch kernels bench's shape-deriving worker", DERIVE, DERIVE_BASELINE)]
    if backends.get(backends.TENSORFLOW).installed():
        inspecting = (f"{module}:net", backends.TENSORFLOW)
        comparisons.append(
            EntryComparison("own PyTorch module's inspecting worker", INSPECT, INSPECT_BASELINE, inspecting)
        )
    checks: dict[str, bool] = {}
    for number, comparison in enumerate(comparisons):
        checks |= entry_checks(comparison, folder / str(number))
    return checks


TARGET = (
    "detprof --version and --help as processes, each backend's worker start-up, a PyTorch kernels bench's "
    "shape-deriving worker and an own PyTorch module's inspecting worker in CPU seconds, against the tree before "
    "the work: <= 0.3 s, >= 25% less CPU"
)


def main() -> int:
    print(f"== start-up: this tree against {BASELINE} (medians; CLI over {CLI_ROUNDS} rounds, workers over "
          f"{WORKER_ROUNDS}) ==")  # fmt: skip
    checks: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="detprof-bench-startup-") as tmp:
        trees = {"before": extract_tree(Path(tmp), BASELINE), "now": ROOT}
        cli = cli_figures(trees)
        for flag in ("--version", "--help"):
            before, now = cli[(flag, "before")], cli[(flag, "now")]
            print(f"detprof {flag:<9}  before {before:.2f} s  now {now:.2f} s  ({before / now:.1f}x)")
            checks[f"detprof {flag} {now:.2f} s <= {TARGET_CLI_S} s"] = now <= TARGET_CLI_S
        for backend in backends.all_backends():
            if not backend.installed():
                print(f"{backend.name}: not installed, skipped")
                continue
            cpu = worker_figures(trees, backend.name, Path(tmp))
            saving = 1 - cpu[("start-up", "now")] / cpu[("start-up", "before")]
            print(
                f"{backend.name:<10} start-up CPU before {cpu[('start-up', 'before')]:.2f} s  now "
                f"{cpu[('start-up', 'now')]:.2f} s  ({saving:.0%} less); whole smallcnn worker before "
                f"{cpu[('worker', 'before')]:.2f} s  now {cpu[('worker', 'now')]:.2f} s "
                f"({1 - cpu[('worker', 'now')] / cpu[('worker', 'before')]:.0%} less)"
            )
            checks[f"{backend.name} start-up {saving:.0%} less >= {TARGET_STARTUP_SAVING:.0%}"] = (
                saving >= TARGET_STARTUP_SAVING
            )
        checks |= worker_entry_checks(Path(tmp) / "entries")
    return record("bench_startup", TARGET, checks)


if __name__ == "__main__":
    sys.exit(main())
