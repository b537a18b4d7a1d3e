"""detprof's own version, in a module of its own so that whatever records it imports nothing else of detprof.

``detprof.__version__`` and every run record ask here; keeping the lookup out of the package's
``__init__`` lets that ``__init__`` offer ``detprof.measure`` and ``detprof.step`` (``detprof.api``)
without the modules they reach depending on the package root in turn.
"""

from __future__ import annotations

from functools import cache


@cache
def detprof_version() -> str:
    """Looked up when first asked for: ``importlib.metadata`` costs every command line tens of milliseconds of
    start-up, and only ``--version`` and run records need it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        # pyproject.toml is the one place the version is written; the installed metadata carries it,
        # so `detprof --version`, pip and every run record's "detprof" version always agree.
        return version("detprof")
    except PackageNotFoundError:  # a source tree put on sys.path by hand, never installed
        return "0+unknown"
