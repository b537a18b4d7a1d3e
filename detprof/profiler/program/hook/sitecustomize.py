"""Run by every Python process of a program that ``detprof sweep --command`` runs: determinism in effect, checked.

Python imports ``sitecustomize`` at start-up from the first folder on its path that has one,
and detprof puts this folder first on the program's ``PYTHONPATH``. It does these things, then
runs the ``sitecustomize`` that the program would have run without detprof, if any:

- It ends the process with the detprof that started it (``profiler.lifeline``), so that a
  killed ``detprof sweep`` leaves no program measuring beside its ``--resume``.
- In deterministic mode it switches on, as soon as the program has imported it, each
  framework that has no environment variable for it (``Backend.switched_after_import``:
  PyTorch), unlike TensorFlow and JAX, which ``backends.program.program_environment`` switches.
- With ``--seed N`` (``PROGRAM_SEED_ENV``) it seeds Python's and NumPy's generators, and Keras' and
  each framework's as each is imported, as ``keras.utils.set_random_seed(N)`` at the program's start
  would: TensorFlow refuses a random op without a seed under determinism.
- After each framework's import and again at exit it writes what the frameworks this process
  loaded report in effect (``backends.program.in_effect_here``) to a file of its own in
  ``IN_EFFECT_DIR_ENV``, which detprof reads into the run's record: a deterministic run
  whose frameworks did not all report determinism is failed, not measured. The write after the
  import leaves a file when the process later ends without running ``atexit`` handlers.

The program's interpreter may not have detprof installed, so the ``backends`` package and
``lifeline.py`` are loaded by their paths, under names of their own, and nothing else of
detprof is imported (both import only the standard library). Nothing here may
break the program: a failure is written to the process's file, or to its stderr when there is
no file to write (the run then fails with it), and the program goes on.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

HOOK_DIR = Path(__file__).resolve().parent
BACKENDS_DIR = HOOK_DIR.parents[2] / "backends"
BACKENDS_PACKAGE = "_detprof_program_backends"
LIFELINE_FILE = HOOK_DIR.parents[1] / "lifeline.py"
LIFELINE_MODULE = "_detprof_program_lifeline"


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs callbacks once a top-level module has been imported, before the import returns to the program."""

    def __init__(self) -> None:
        self.callbacks: dict[str, list[Callable[[], None]]] = {}

    def add(self, module: str, callback: Callable[[], None]) -> None:
        self.callbacks.setdefault(module, []).append(callback)

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        callbacks = self.callbacks.pop(name, None)
        if callbacks is None:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = None if finder is self or find is None else find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Then(spec.loader, callbacks)
        return spec


class _Then(importlib.abc.Loader):
    """``loader``, then ``callbacks`` once the module has run; everything else asked of it goes to ``loader``."""

    def __init__(self, loader: Any, callbacks: list[Callable[[], None]]) -> None:
        self.loader = loader
        self.callbacks = callbacks

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        for callback in self.callbacks:
            callback()


def _load(name: str, file: Path, *, package: bool = False) -> ModuleType:
    """One of detprof's standard-library-only modules (or packages), by its path, under a name of its own."""
    locations = [str(file.parent)] if package else None
    spec = importlib.util.spec_from_file_location(name, file, submodule_search_locations=locations)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def _end_with_detprof() -> None:
    """The program ends with the detprof that runs it, however detprof ended (``profiler.lifeline``)."""
    try:
        lifeline = _load(LIFELINE_MODULE, LIFELINE_FILE)
    except Exception as exc:  # the program then only outlives a killed detprof, as it would without the hook
        print(f"detprof: cannot load {LIFELINE_FILE}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return
    fd = lifeline.inherited_lifeline(os.environ)
    if fd is not None:
        lifeline.end_with_driver(fd, "detprof program")


def _writer(out_dir: Path, read: Callable[[], dict[str, Any]]) -> Callable[[], None]:
    """Write ``read()`` (or why it failed) to this process's file, replacing what an earlier call wrote."""

    def write() -> None:
        try:
            found = read()
        except Exception as exc:  # any framework's failure: recorded, never raised into the program
            found = {"error": f"{type(exc).__name__}: {exc}"}
        path = out_dir / f"{os.getpid()}.json"
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            tmp.write_text(json.dumps(found | {"argv": sys.argv}, default=str))
            os.replace(tmp, path)
        except OSError:
            pass  # the folder went away: detprof then finds no report and fails the run for it

    return write


def _install() -> None:
    try:
        backends = _load(BACKENDS_PACKAGE, BACKENDS_DIR / "__init__.py", package=True)
        program = importlib.import_module(f"{BACKENDS_PACKAGE}.program")
    except Exception as exc:  # the run then has no report of what was in effect, and fails for it
        print(f"detprof: cannot load {BACKENDS_DIR}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return
    mode = os.environ.get(program.PROGRAM_MODE_ENV)
    out_dir = os.environ.get(program.IN_EFFECT_DIR_ENV)
    if not mode or not out_dir:
        return
    write = _writer(Path(out_dir), program.in_effect_here)
    after_import = _AfterImport()
    seed = program.program_seed()
    if seed is not None:
        random.seed(seed)
        after_import.add("numpy", _seeding("numpy", lambda n: sys.modules["numpy"].random.seed(n), seed))
        after_import.add("keras", _seeding("keras", lambda n: sys.modules["keras"].utils.set_random_seed(n), seed))
    for backend in backends.REGISTRY.values():
        if mode == program.DETERMINISTIC and backend.switched_after_import:
            after_import.add(backend.module, backend.switch_on)
        if seed is not None:
            after_import.add(backend.module, _seeding(backend.module, backend.seed, seed))
        after_import.add(backend.module, write)
    sys.meta_path.insert(0, after_import)
    atexit.register(write)


def _seeding(module: str, seed_it: Callable[[int], None], seed: int) -> Callable[[], None]:
    """``seed_it(seed)`` once ``module`` is imported; a failure is said on stderr, never raised into the program."""

    def seed_now() -> None:
        try:
            seed_it(seed)
        except Exception as exc:
            print(f"detprof: cannot seed {module} with --seed {seed}: {type(exc).__name__}: {exc}", file=sys.stderr)

    return seed_now


def _chain_to_the_programs_own() -> None:
    """Run the ``sitecustomize`` later on the path, which the program would have run without detprof."""
    path = [entry for entry in sys.path if Path(entry or ".").resolve() != HOOK_DIR]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_end_with_detprof()
_install()
_chain_to_the_programs_own()
