"""The layout's promises (DEVELOPERS.md), read off the source: the read side never reaches the runner, and a
framework's name is known to its backend module."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

import detprof.backends as backends

PACKAGE = Path(backends.__file__).resolve().parents[1]
RUNNER = ("detprof.profiler.launcher", "detprof.profiler.study", "detprof.profiler.worker", "detprof.profiler.process")
READ_SIDE = ("detprof.reports", "detprof.check", "detprof.analysis", "detprof.api")


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


@functools.cache
def _imported(module: str) -> frozenset[str]:
    """The detprof modules ``module`` imports anywhere in its text, inside functions too (each file parsed once: every
    closure walked here passes through most of the package)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return frozenset(name for name in names if name in MODULES and name != module)


def _reached_through(start: str) -> dict[str, str]:
    """Every module ``start`` reaches through imports, each with the module that imports it on the way."""
    importer, stack = {start: ""}, [start]
    while stack:
        module = stack.pop()
        for name in _imported(module) - importer.keys():
            importer[name] = module
            stack.append(name)
    return importer


def _chain(importer: dict[str, str], end: str) -> str:
    path = [end]
    while importer[path[-1]]:
        path.append(importer[path[-1]])
    return " <- ".join(path)


@pytest.mark.parametrize("start", sorted(m for m in MODULES if m.startswith(READ_SIDE)))
def test_the_read_side_reaches_nothing_of_the_runner(start: str) -> None:
    importer = _reached_through(start)
    assert [_chain(importer, m) for m in RUNNER if m in importer] == []


def test_a_backends_name_is_a_string_literal_only_in_its_backend_module() -> None:
    names = set(backends.NAMES)
    outside = {
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        for module, path in MODULES.items()
        if not module.startswith("detprof.backends")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in names
    }
    assert sorted(outside) == []
