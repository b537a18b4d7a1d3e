"""detprof: what deterministic training costs, where the cost comes from, and what it buys."""

__version__ = "0.1.0"
