"""THE verdict on one overhead: cheap, expensive, or not settled and how many repeats would settle it.

Every output that calls an overhead cheap or expensive (the report's first screen, its
Markdown and JSON, the cost-versus-benefit reading, the sweep's closing console table)
reads it from here, and this reads it from ``intervals``: ``intervals.reading`` against
``intervals.CHEAP_OVERHEAD`` for the word, ``intervals.repeats_to_read`` for the repeats
that would settle an interval lying on both sides of the line. So a verdict is never
"cheap" while its own interval reaches past 1.10x.
"""

from __future__ import annotations

from dataclasses import dataclass

from detprof.intervals import CHEAP_OVERHEAD, MIN_REPEATS, Overhead, Reading, reading, repeats_to_read


@dataclass(frozen=True)
class Verdict:
    reading: Reading | None
    """None: nothing was measured (every run failed, or determinism is not supported)."""
    text: str
    """What a reader sees: "cheap", "expensive", "not settled: need about 7 more repeats", ..."""
    repeats: int
    """Paired repeats behind the interval."""
    repeats_needed: int | None
    """Paired repeats after which a not-settled interval would clear the line, if mean and spread stayed."""

    @property
    def more_repeats(self) -> int | None:
        if self.repeats_needed is None:
            return None
        return max(1, self.repeats_needed - self.repeats)

    @property
    def why(self) -> str | None:
        """Why a "not settled" verdict is not settled, in a sentence; None for a settled one."""
        if self.reading != "not settled":
            return None
        if self.repeats < MIN_REPEATS:
            return "one repeat gives no confidence interval: run --repeats 3 or more"
        line = f"{CHEAP_OVERHEAD:.2f}x"
        if self.repeats_needed is None:
            return f"the overhead sits on the {line} line: more repeats would not tell cheap from expensive"
        return (
            f"the 95% CI lies on both sides of {line}; about {self.repeats_needed} repeats in all "
            f"({self.more_repeats} more) would settle it if mean and spread stay"
        )


def verdict(overhead: Overhead | None) -> Verdict:
    """The verdict on the overhead a verdict is read from (``intervals.headline``)."""
    if overhead is None:
        return Verdict(None, "not measured", 0, None)
    side = reading(overhead)
    if side != "not settled":
        return Verdict(side, side, overhead.n, None)
    if overhead.n < MIN_REPEATS:
        return Verdict(side, "not settled: one repeat, no interval", overhead.n, None)
    needed = repeats_to_read(overhead)
    if needed is None:
        return Verdict(side, f"not settled: at the {CHEAP_OVERHEAD:.2f}x line", overhead.n, None)
    more = max(1, needed - overhead.n)
    plural = "repeat" if more == 1 else "repeats"
    return Verdict(side, f"not settled: need about {more} more {plural}", overhead.n, needed)
