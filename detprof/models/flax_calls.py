"""The submodule calls of a Flax model's step, taken while the step is traced: what ``verify`` fingerprints and a
stability study reads its features from. An NNX submodule (``flax_modules.scoped``) and a Linen one
(``flax_linen``) each record its call here as it returns, so that both kinds of Flax model are read alike."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Call:
    """One call of a scoped submodule, as traced: its path, its first argument, its output."""

    path: str
    input: Any
    output: Any


_TAKEN: list[list[Call]] = []
"""While a step that takes them is traced (``taken``): each submodule's call as it returns, in the order the calls
ran."""


def record(path: str, args: tuple[Any, ...], output: Any) -> None:
    """A submodule's call, where a step that takes them is being traced."""
    if _TAKEN:
        _TAKEN[-1].append(Call(path, args[0] if args else None, output))


@contextlib.contextmanager
def taken(taking: bool) -> Iterator[list[Call]]:
    """While inside, where ``taking``: each scoped submodule's call as it returns."""
    calls: list[Call] = []
    if taking:
        _TAKEN.append(calls)
    try:
        yield calls
    finally:
        if taking:
            _TAKEN.pop()
