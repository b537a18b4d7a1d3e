"""What an option's text means: a comma-separated list, a duration, a precision.

Apart from ``options`` (the options' Typer declarations) so that what runs without the command line reads an
option's text as the commands do without importing Typer: a stability worker its ``--variants``.
"""

from __future__ import annotations

import math
import re

from detprof.errors import UsageError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?\s*$", re.IGNORECASE)
_SECONDS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}
OFF = ("off", "none")


def comma_separated(text: str | None, *, lower: bool = False) -> tuple[str, ...]:
    """A comma-separated option's items in the order given, each once, blanks dropped (None: none)."""
    items = (item.strip() for item in (text or "").split(","))
    return tuple(dict.fromkeys(item.lower() if lower else item for item in items if item))


def parse_duration(value: str | float | None, flag: str) -> float | None:
    """``90s``, ``10m``, ``1.5h`` or plain seconds, in seconds; None where not given."""
    if value is None or isinstance(value, int | float):
        return None if value is None else float(value)
    found = _DURATION.match(value)
    seconds = float(found.group(1)) * _SECONDS[(found.group(2) or "s").lower()] if found else 0.0
    if seconds <= 0:
        raise UsageError(f"{flag} takes a positive duration such as 90s, 10m or 1h, not {value!r}")
    return seconds


def parse_precision(value: str | float | None) -> float | None:
    """``--precision`` as a fraction: ``2%`` and ``0.02`` are 0.02; ``off`` is 0 (exactly ``--repeats``); None where
    not given."""
    if value is None or isinstance(value, int | float):
        return None if value is None else float(value)
    text = value.strip().lower()
    if text in OFF:
        return 0.0
    fraction = _fraction(text)
    if not 0 < fraction < 1:
        raise UsageError(f"--precision takes a fraction of the overhead such as 2% or 0.02 (or off), not {value!r}")
    return fraction


def parse_threshold(value: str | float) -> float:
    """``check --threshold`` as a fraction: ``10%`` and ``0.10`` are 0.10. A bare number of 1 or more is refused:
    ``10`` meant as 10% would pass a rise of up to 1,000%; ``150%`` says so where that much is meant."""
    text = str(value).strip()
    fraction = _fraction(text.lower())
    bare = fraction >= 1 and not text.endswith("%")
    if not (0 < fraction < math.inf) or bare:
        meant = (
            f" (a fraction: {fraction:,.0%}; write {text}% if that is meant)" if bare and fraction < math.inf else ""
        )
        raise UsageError(
            f"--threshold takes the rise of the overhead to tolerate, such as 10% or 0.10, not {text!r}{meant}"
        )
    return fraction


def _fraction(text: str) -> float:
    """``2%`` or ``0.02`` as 0.02; -1 for anything else."""
    try:
        return float(text.removesuffix("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        return -1.0
