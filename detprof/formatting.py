"""How numbers read in detprof's output: the report's HTML and Markdown and the console tables.

One formatter per kind of number, so a duration or an overhead reads the same wherever it
is shown. Imports only the standard library at run time, so that the command modules
that use it keep ``detprof --help`` fast.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from detprof.intervals import Overhead

DASH = "-"


class OutputFormat(StrEnum):
    """The ``--format`` choice of commands that print tables."""

    table = "table"
    json = "json"
    csv = "csv"


def finite(value: Any) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def ratio(o: Overhead | None) -> str:
    """``1.234x [1.100, 1.380]``: the estimate and its 95% interval, or why there is none."""
    if o is None:
        return DASH
    if o.n < 2 or math.isnan(o.ci_low):
        return f"{o.ratio:.3f}x (n={o.n}, no CI)"
    return f"{o.ratio:.3f}x [{o.ci_low:.3f}, {o.ci_high:.3f}]"


def floor(value: float | None) -> str:
    """A noise floor, the smallest overhead a machine resolves: ``+/-3.4%``."""
    return DASH if value is None else f"+/-{value:.1%}"


def duration_ns(value: Any) -> str:
    """Nanoseconds in the unit that keeps 3-4 significant digits."""
    v = finite(value)
    if v is None:
        return DASH
    sign = "-" if v < 0 else ""
    v = abs(v)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if v >= scale:
            return f"{sign}{v / scale:,.3g} {unit}" if v / scale < 1000 else f"{sign}{v / scale:,.0f} {unit}"
    return f"{sign}{v:.0f} ns"


def signed_ns(value: Any) -> str:
    v = finite(value)
    if v is None:
        return DASH
    return ("+" if v > 0 else "") + duration_ns(v)


def count(value: Any) -> str:
    """Instances per step: whole numbers stay whole; averages over repeats keep one decimal."""
    v = finite(value)
    if v is None:
        return DASH
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"


def percent(value: Any, digits: int = 1) -> str:
    """A fraction (0.123) as ``12.3%``."""
    v = finite(value)
    return DASH if v is None else f"{v:.{digits}%}"


def share(value: Any, low: Any, high: Any) -> str:
    """A share of a whole with its 95% interval, whole percents: ``52% [10%, 94%]`` (a share that rounds to none
    reads ``0%``, never ``-0%``)."""
    if finite(value) is None:
        return DASH
    whole = [percent(round(v, 2) or 0.0, 0) if (v := finite(x)) is not None else DASH for x in (value, low, high)]
    return f"{whole[0]} [{whole[1]}, {whole[2]}]"


def points(value: Any, se: Any = None) -> str:
    """A difference of two fractions in percentage points, with its standard error where known, named so (a reader
    of ``+/-`` would take it for an interval): ``+0.12 pp (s.e. 0.44)``."""
    v = finite(value)
    if v is None:
        return DASH
    e = finite(se)
    return f"{v * 100:+.2f} pp" + ("" if e is None else f" (s.e. {e * 100:.2f})")


def number(value: Any, digits: int = 4) -> str:
    v = finite(value)
    return DASH if v is None else f"{v:.{digits}f}"


def plus_minus(stat: Mapping[str, Any] | None, digits: int = 4) -> str:
    """A stability spread entry ``{"std", "std_se"}`` as ``0.0123 +/- 0.0040``; no "+/-" without an s.e."""
    std = finite(stat.get("std")) if stat else None
    if not stat or std is None:
        return DASH
    se = finite(stat.get("std_se"))
    return f"{std:.{digits}f}" + ("" if se is None else f" +/- {se:.{digits}f}")


def in_all(count: int, noun: str) -> str:
    """Where a comparison held, in words: "in all 8 layers", "in both layers", or "in its one layer" (a compiled
    module's)."""
    if count == 1:
        return f"in its one {noun}"
    return f"in both {noun}s" if count == 2 else f"in all {count} {noun}s"


def counted(count: int, noun: str) -> str:
    """``count`` of ``noun``: "1 step", "20 steps"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def trained_in(processes: int | None, eager: bool = False) -> str:
    """Where a stability study's identical runs trained, after the words that say they were: the runs of one
    worker share its compiled step, so only runs of several processes, each compiling its own, could have parted in
    what compiling chose (an ``eager`` step, a native PyTorch module's, compiles nothing); nothing where the
    records do not say (``None``)."""
    if processes is None:
        return ""
    if eager:
        return ", trained in one process" if processes == 1 else f", trained in {processes} processes"
    if processes == 1:
        return ", trained in one process on one compiled step"
    return f", trained in {processes} processes, each compiling its step itself"


def check_line(check: Mapping[str, Any] | None) -> tuple[str, str]:
    """The determinism-check badge: (state, text); state is verified | failed | unchecked | na."""
    if not check or not check.get("applicable"):
        return "na", "not applicable (this variant varies something)"
    if check.get("verified") is None:
        return "unchecked", "not checked: fewer than 2 runs"
    if check["verified"]:
        where = trained_in(check.get("processes"), bool(check.get("eager")))
        return "verified", f"verified: bitwise-identical weights{where}"
    return "failed", f"NOT verified: first differing layer {check.get('first_differing_layer')}"


BADGE_LABELS = {"verified": "verified", "failed": "not verified", "unchecked": "not checked", "na": "n/a"}
