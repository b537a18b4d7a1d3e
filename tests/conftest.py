"""What every test runs under: the environment a user's pipe or CI log gives detprof.

The readline module that pytest loads writes ``COLUMNS=80`` and ``LINES=24`` into the process's
C environment, where ``os.environ`` does not show them but every command a test starts without
``env`` inherits them, and pytest-xdist's workers start with them in ``os.environ``. detprof
honours them as a user's choice of width (``console.table_console``): its tables would fold
their names at 80 columns, which a pipe never does, so they are taken out of both for the whole
session, its shared studies included. A test that wants a width sets ``COLUMNS`` itself.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

pytest.register_assert_rewrite("shared_studies")
from fixtures_traces import require_real_traces  # noqa: E402
from shared_studies import READERS, SHARED_STUDIES  # noqa: E402 (its asserts rewritten, as a plugin's are)

from detprof import locks  # noqa: E402

pytest_plugins = ["fault_sweeps", "shared_studies"]
"""The fault tests' fixtures (``fault_env``); the real studies several files read, made once per run."""

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
"""A suite started in the background (a shell runs ``make test &`` with SIGINT ignored, and every process inherits
that) still starts its commands as a terminal would: a handled signal reverts to the default in a child, so the
commands that tests interrupt see Ctrl-C (``detprof.interrupts`` keeps a signal ignored that it started ignored)."""


@pytest.fixture(scope="session", autouse=True)
def _no_terminal_size() -> None:
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
        os.unsetenv(name)


@pytest.fixture(scope="session", autouse=True)
def session_device_locks(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each pytest process (an xdist worker) keeps its device locks apart from the other's and from any detprof
    measuring on this machine, module fixtures included; each test then gets a folder of its own (below). Under
    pytest's own temporary folder, which it clears, not one more folder of the system's per run."""
    os.environ[locks.LOCK_DIR_ENV] = str(tmp_path_factory.mktemp("session-device-locks"))


SUITE_XLA_FLAGS = "--xla_backend_optimization_level=0"
"""XLA's CPU code built without LLVM's optimisations, in every process the suite starts: compiling is most of what
a JAX process spends here (a small CNN's process 14 s of CPU time with LLVM's -O2, 7-8 s without), and the tests
run a few steps of each model. Nothing the tests read changes with it: the HLO passes (fusion, hence kernel names
and their op metadata), what XLA parses of the GPU flags and every bitwise comparison are the same; only the CPU
code runs slower (a step of the small CNN 20 -> 35 ms). detprof keeps it as a user's own flag, beside its knobs."""
if SUITE_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {SUITE_XLA_FLAGS}".strip()


SUITE_THREADS = "1"
"""One OpenMP thread in every process the suite starts (``OMP_NUM_THREADS``: PyTorch's compute threads). The two
xdist workers' processes share the two cores, and PyTorch's threads wait for each other at every op, spinning while
the thread they wait for is off its core running the other worker's process. Beside two busy processes, the tiny
MoE's stability study took 41 s (31 s of CPU) with two threads and 23 s (13 s) with one; the whole suite 23 min 5 s
from a fresh clone against 26 min 10 s. TensorFlow's and XLA's thread pools (``TF_NUM_INTRAOP_THREADS``,
``--xla_cpu_multi_thread_eigen``) changed nothing measurable and keep their defaults. What the tests read does not
depend on it: the kernels and ops run and every bitwise comparison (a race a test plants draws noise of its own);
detprof's own thread limits (lockstep pairs) apply over it. A user's own value wins."""
os.environ.setdefault("OMP_NUM_THREADS", SUITE_THREADS)


JAX_CACHE_SETTINGS = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}
"""Every compilation cached, the weights' initialisers (milliseconds each, dozens per model) as much as the step."""


@pytest.fixture(scope="session", autouse=True)
def one_jax_compilation_cache(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> None:
    """The JAX processes the suite starts compile through one persistent compilation cache (JAX's own, keyed by
    the program, the compiler options and the versions), shared by both xdist workers: the same model's step and
    its weights' initialisers compiled once per run instead of once per process, where that only saves time. A
    process whose runs are judged (a verification's replica, a stability study's worker) or traced turns it off
    and compiles its steps itself, as it does under a user's ``JAX_COMPILATION_CACHE_DIR``
    (``Backend.compile_in_this_process``): two replicas that loaded one executable could not differ in what
    compiling chose."""
    base = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(base / "jax-compilation-cache"))
    for name, value in JAX_CACHE_SETTINGS.items():
        os.environ.setdefault(name, value)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "real_traces(*paths): reads real traces of ../shared/traces: skipped without them, failed under CI"
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``real_traces`` (``fixtures_traces.real_traces``) needs those traces: skipped without them, or
    failed under CI."""
    for mark in item.iter_markers("real_traces"):
        require_real_traces(*mark.args)


@pytest.fixture(autouse=True)
def own_device_locks(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test takes its device locks in a folder of its own: tests that measure side by side (``-n 2``) must
    not wait for each other. The lock tests share one folder between their commands on purpose."""
    monkeypatch.setenv(locks.LOCK_DIR_ENV, str(tmp_path_factory.mktemp("device-locks")))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files that read a study made once per run first (``shared_studies.READERS``: one unit, below), then the
    slow files: a long one started last keeps one worker running it alone while the other idles. Each worker
    collects and sorts alike, and the scheduler deals the files out in this order."""
    for item in items:
        if SHARED_STUDIES & set(getattr(item, "fixturenames", ())) and item.path.name not in READERS:
            raise pytest.UsageError(f"{item.path.name} reads a shared study: add it to shared_studies.READERS")
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: 0 if item.path.name in READERS else 1 if item.path in slow_files else 2)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, but the files that read a study made once per run are one unit: one worker makes the
    study and reads it while the other goes on with other files, instead of waiting on its lock; and the files in
    the order the workers sort them (above), not by their number of tests.

    A scheduler of our own rather than ``--dist loadgroup`` with an ``xdist_group`` mark per file: on pytest 9.2
    with pytest-xdist 3.8 the group never reaches the scheduler (pytest-dev/pytest-xdist#1386) and every test is
    dealt out alone, so a file's module fixtures were made once on each worker."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FilesAndSharedStudies(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return "shared studies" if Path(path).name in READERS else path

    config.option.loadscopereorder = False
    return FilesAndSharedStudies(config, log)
