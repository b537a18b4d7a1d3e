"""detprof: what deterministic training costs, where the cost comes from, and what it buys.

A training program marks what detprof measures with ``detprof.measure()`` and ``detprof.step()``,
and what ``detprof verify`` compares with ``detprof.fingerprint()`` (``detprof.api``); a model
function may return a PyTorch module with its own loss and optimizer as ``detprof.Training``
(``detprof.training``). Each is looked up when first used, so ``import detprof`` stays as cheap as
it was for a program that never runs under detprof.
"""

import importlib
from typing import Any

_API = {"measure": "api", "step": "api", "fingerprint": "api", "Training": "training"}
"""Each public name and the module of ``detprof`` that defines it."""


def __getattr__(name: str) -> Any:
    """``__version__`` (``detprof.version``) and the public API (``_API``), loaded when asked for."""
    if name == "__version__":
        from detprof.version import detprof_version

        found: Any = detprof_version()
    elif name in _API:
        found = getattr(importlib.import_module(f"detprof.{_API[name]}"), name)
    else:
        raise AttributeError(f"module 'detprof' has no attribute {name!r}")
    globals()[name] = found
    return found
