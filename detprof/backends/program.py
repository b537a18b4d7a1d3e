"""A training program detprof did not write, switched through its environment, and read back from inside it.

``program_environment`` is the environment a program runs with in one mode: every framework
switched at once, since the program may train with any of them (or several), and its own
processes read these variables when each framework starts. A framework without such a
variable (``Backend.switched_after_import``) is switched on by the ``sitecustomize`` hook
(``profiler/program/hook``) as soon as the program imports it, and the hook writes what every
framework it loaded reports in effect (``in_effect_here``). The hook loads this package by
its path into the program's interpreter, which may not have detprof installed.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from typing import Any

from . import REGISTRY

PROGRAM_MODE_ENV = "DETPROF_PROGRAM_MODE"
"""A program's mode, for the hook that switches on the frameworks that have no environment switch."""
IN_EFFECT_DIR_ENV = "DETPROF_IN_EFFECT_DIR"
"""Where each Python process of a program writes what its frameworks report in effect (``in_effect_here``)."""
PROGRAM_SEED_ENV = "DETPROF_PROGRAM_SEED"
"""``--seed N`` with ``--command``: the hook seeds Python's, NumPy's, Keras' and each framework's generators with it
as each loads, in both modes, as ``keras.utils.set_random_seed(N)`` at the program's start would."""
DETERMINISTIC = "deterministic"


def program_environment(
    mode: str, environ: Mapping[str, str], in_effect_dir: str, seed: int | None = None
) -> dict[str, str]:
    """The environment a program runs with in ``mode``: default mode is every framework's default.

    The switches are taken out of the user's environment in default mode, which is otherwise kept.
    """
    env = dict(environ)
    env.pop(PROGRAM_SEED_ENV, None)
    for backend in REGISTRY.values():
        backend.program_environment(env, mode == DETERMINISTIC)
    seeded = {PROGRAM_SEED_ENV: str(seed)} if seed is not None else {}
    return env | {PROGRAM_MODE_ENV: mode, IN_EFFECT_DIR_ENV: in_effect_dir} | seeded


def program_seed() -> int | None:
    """The seed the hook gives this process's generators (``PROGRAM_SEED_ENV``); None: the program seeds its own."""
    value = os.environ.get(PROGRAM_SEED_ENV)
    return int(value) if value else None


def in_effect_here() -> dict[str, Any]:
    """What every framework this process has loaded reports in effect, with its version and Python's.

    Nothing is imported that the program did not load itself. Keras' version is kept when it is
    loaded, whatever its backend.
    """
    loaded = [backend for backend in REGISTRY.values() if backend.loaded()]
    versions = {"python": platform.python_version()}
    for module in ("keras", *(backend.module for backend in loaded)):
        if module in sys.modules:
            versions[module] = str(getattr(sys.modules[module], "__version__", "unknown"))
    seed = program_seed()
    return {"frameworks": {backend.name: backend.in_effect() for backend in loaded}, "versions": versions} | (
        {"seed": seed} if seed is not None else {}
    )
