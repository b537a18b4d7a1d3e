"""detprof: what deterministic training costs, where the cost comes from, and what it buys."""

from importlib.metadata import PackageNotFoundError, version

try:
    # pyproject.toml is the one place the version is written; the installed metadata carries it,
    # so `detprof --version`, pip and every run record's "detprof" version always agree.
    __version__ = version("detprof")
except PackageNotFoundError:  # a source tree put on sys.path by hand, never installed
    __version__ = "0+unknown"
