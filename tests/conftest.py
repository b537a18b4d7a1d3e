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

pytest.register_assert_rewrite("shared_studies")
from shared_studies import SHARED_STUDIES  # noqa: E402 (its asserts rewritten, as a plugin's are)

from detprof import locks  # noqa: E402

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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each file a unit of its own for the workers (``--dist loadgroup``: a file's tests share its module
    fixtures), but the files that read a study made once per run (``shared_studies``), which are one unit: one
    worker makes the study and reads it, while the other works on other files instead of waiting for it. The slow
    units first: a long one started last keeps one worker running it alone while the other idles."""
    readers = {item.path for item in items if SHARED_STUDIES & set(getattr(item, "fixturenames", ()))}
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    for item in items:
        item.add_marker(pytest.mark.xdist_group("shared studies" if item.path in readers else item.path.name))
    items.sort(key=lambda item: 0 if item.path in readers else 1 if item.path in slow_files else 2)
