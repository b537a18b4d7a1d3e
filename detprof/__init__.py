"""detprof: what deterministic training costs, where the cost comes from, and what it buys."""


def __getattr__(name: str) -> str:
    """``__version__``, looked up when first asked for: ``importlib.metadata`` costs every command
    line tens of milliseconds of start-up, and only ``--version`` and run records need it."""
    if name != "__version__":
        raise AttributeError(f"module 'detprof' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        # pyproject.toml is the one place the version is written; the installed metadata carries it,
        # so `detprof --version`, pip and every run record's "detprof" version always agree.
        found = version("detprof")
    except PackageNotFoundError:  # a source tree put on sys.path by hand, never installed
        found = "0+unknown"
    globals()["__version__"] = found
    return found
