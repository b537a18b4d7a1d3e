"""Real studies that several test files read, each made once per test run.

A study that only feeds assertions about what it wrote (its records, tables, reports and what
its commands printed) says the same to every test that reads it; made per file, the same real
TensorFlow sweep ran twice. The files that read one run in one pytest-xdist worker, one after
the other (``conftest.py`` schedules them as one unit), so the study is made there once while
the other worker goes on with other files; a file lock in the run's shared temporary folder keeps
it made once however the files are spread (another ``--dist``, more workers). Its commands run as a user
runs them, one process each, and what each printed is kept beside the results. A test that
changes what it reads works on its own copy (``Study.copy``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock
from script_runner import ROOT

TINY_RUNS = ["--repeats", "2", "--steps", "3", "--warmup", "1", "--batch-size", "8"]
"""Two repeats of three steps, batch 8: every record, table and report section, in seconds per run."""
TINY_SWEEP = [*TINY_RUNS, "--input-size", "16"]
"""The models at 16x16."""
TENSORFLOW_COMMANDS = {
    "sweep": ["sweep", "--models", "smallcnn,mediumcnn_k3", *TINY_SWEEP, "--gpu", "cpu", "--tracer", "tf"],
    # Enough epochs for smallcnn to learn digits: a study that does not learn is left out of the verdicts.
    "stability": ["stability", "--model", "smallcnn", "--runs", "2", "--epochs", "15", "--jobs", "2", "--gpu", "cpu"],
    # An op that determinism replaces by others beside one it keeps; the cross-entropy's logits are read off
    # efficientnetb0, which Keras builds at 32x32 at least.
    "kernels": [
        *("kernels", "--ops", "sparse_softmax_xent_backward,conv2d_backward_filter", "--kernel-sizes", "3"),
        *("--max-shapes", "1", *TINY_RUNS, "--input-size", "32", "--gpu", "cpu", "--tracer", "tf"),
    ],
}
"""The embedded default's three studies on TensorFlow, on one device label, into one results folder."""


@dataclass(frozen=True)
class Study:
    """A results folder that every reader shares (never to be changed in place), and what its commands printed."""

    results: Path
    folder: Path

    def stdout(self, command: str) -> str:
        return (self.folder / f"{command}.stdout").read_text()

    def stderr(self, command: str) -> str:
        return (self.folder / f"{command}.stderr").read_text()

    def copy(self, target: Path, *kinds: str) -> Path:
        """A results folder of one's own at ``target``, with the studies of ``kinds`` (all of them, by default)."""
        target.mkdir(parents=True)
        for kind in kinds or [p.name for p in self.results.iterdir() if p.is_dir()]:
            shutil.copytree(self.results / kind, target / kind)
        return target


def run_commands(folder: Path, commands: dict[str, list[str]]) -> None:
    """Each command line of detprof in turn into ``folder/res``, as its own process; what each printed beside."""
    for name, args in commands.items():
        done = subprocess.run(
            [sys.executable, "-m", "detprof.cli", *args, "--out", str(folder / "res")],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        (folder / f"{name}.stdout").write_text(done.stdout)
        (folder / f"{name}.stderr").write_text(done.stderr)
        assert done.returncode == 0, f"{name}: exit {done.returncode}\n{done.stderr[-3000:]}"


def shared(factory: pytest.TempPathFactory, worker_id: str, name: str, make: Callable[[Path], None]) -> Study:
    """The study ``name``, made by ``make(folder)`` once per test run, whichever worker asks first."""
    base = factory.getbasetemp() if worker_id == "master" else factory.getbasetemp().parent
    folder, done = base / f"shared-{name}", base / f"shared-{name}.done"
    with FileLock(base / f"shared-{name}.lock"):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a worker that failed to make it left
            folder.mkdir()
            make(folder)
            done.touch()
    return Study(folder / "res", folder)


SHARED_STUDIES = {"tensorflow_study"}
"""The fixtures below: a test file that asks for one reads a study made once per run."""
READERS = frozenset({"test_report_browser.py", "test_stability_e2e.py", "test_sweep_e2e.py"})
"""The test files that read one: one unit for the workers (``conftest.py``), which checks that no other file does."""


@pytest.fixture(scope="session")
def tensorflow_study(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Study:
    """A real TensorFlow sweep (smallcnn, mediumcnn_k3), stability study (smallcnn) and kernels bench on this CPU."""
    return shared(tmp_path_factory, worker_id, "tensorflow", lambda folder: run_commands(folder, TENSORFLOW_COMMANDS))
