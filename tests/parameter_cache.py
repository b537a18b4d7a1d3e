"""A ``detprof models`` parameter cache written by a test, so that listing the models builds none of them."""

from __future__ import annotations

from detprof.models.command import counts_key


def cached_everywhere(names: list[str], keras: str) -> dict[str, dict[str, int]]:
    """A parameter cache holding each of ``names`` (a count of 1) under the key ``detprof models`` reads it from."""
    cache: dict[str, dict[str, int]] = {}
    for name in names:
        cache.setdefault(counts_key(name, keras), {})[name] = 1
    return cache
