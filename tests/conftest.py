"""What every test runs under: the environment a user's pipe or CI log gives detprof.

pytest-xdist's workers set ``COLUMNS=80`` and ``LINES=24``, which detprof honours as a user's
choice of width (``console.table_console``); a test run by ``make test`` must see what a
single-process run sees, so they are taken out. A test that wants a width sets ``COLUMNS``
itself.
"""

from __future__ import annotations

import os
import signal
import tempfile

import pytest
from shared_studies import SHARED_STUDIES

from detprof import locks

pytest_plugins = ["fault_sweeps", "shared_studies"]
"""The fault tests' fixtures (``fault_env``); the real studies several files read, made once per run."""

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
"""A suite started in the background (a shell runs ``make test &`` with SIGINT ignored, and every process inherits
that) still starts its commands as a terminal would: a handled signal reverts to the default in a child, so the
commands that tests interrupt see Ctrl-C (``detprof.interrupts`` keeps a signal ignored that it started ignored)."""


@pytest.fixture(autouse=True)
def _no_terminal_size_from_xdist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


os.environ[locks.LOCK_DIR_ENV] = tempfile.mkdtemp(prefix="detprof-locks-")
"""Each pytest process (an xdist worker) keeps its device locks apart from the other's and from any detprof
measuring on this machine, module fixtures included; each test then gets a folder of its own (below)."""


@pytest.fixture(autouse=True)
def own_device_locks(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test takes its device locks in a folder of its own: tests that measure side by side (``-n 2``) must
    not wait for each other. The lock tests share one folder between their commands on purpose."""
    monkeypatch.setenv("DETPROF_LOCK_DIR", str(tmp_path_factory.mktemp("device-locks")))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files with slow end-to-end tests first: two workers each take whole files (``--dist loadfile``), and a
    long file started last keeps one worker running it alone while the other idles. Of the files that read a
    study made once per run (``shared_studies``), one comes first, so that it is made while the other worker
    starts on other files, and the others after the rest of the slow files, when it is there to read."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    readers = sorted({item.path for item in items if SHARED_STUDIES & set(getattr(item, "fixturenames", ()))})
    first_reader = readers[:1]

    def rank(item: pytest.Item) -> int:
        if item.path in first_reader:
            return 0
        if item.path in readers:
            return 2
        return 1 if item.path in slow_files else 3

    items.sort(key=rank)
