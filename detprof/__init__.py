"""detprof: what deterministic training costs, where the cost comes from, and what it buys.

A training program marks what detprof measures with ``detprof.measure()`` and ``detprof.step()``,
and what ``detprof verify`` compares with ``detprof.fingerprint()`` (``detprof.api``); each is
looked up when first used, so ``import detprof`` stays as cheap as it was for a program that
never runs under detprof.
"""

from typing import Any

_API = ("measure", "step", "fingerprint")


def __getattr__(name: str) -> Any:
    """``__version__`` (``detprof.version``) and the measured-window API (``detprof.api``), loaded when asked for."""
    if name == "__version__":
        from detprof.version import detprof_version

        found: Any = detprof_version()
    elif name in _API:
        from detprof import api

        found = getattr(api, name)
    else:
        raise AttributeError(f"module 'detprof' has no attribute {name!r}")
    globals()[name] = found
    return found
