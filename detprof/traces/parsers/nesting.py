"""Self times of nested op events: the one stack walk that both CPU-op parsers (Kineto, XSpace) use.

A profiler records an op and the ops it calls as nested events on one thread; summing their
durations would count the inner ones twice, so each op is timed by its self time.
"""

from __future__ import annotations

import numpy as np


def self_times(thread: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each op's duration less that of the ops nested directly in it on its thread, and its outermost op.

    Times in any one integer unit (Kineto's nanoseconds, XSpace's picoseconds).

    Ops sorted by thread, start and longest first nest like a call stack: an op's parent is
    the innermost open op it starts in. A child that outlasts its parent (timestamps are
    rounded) only takes the part inside the parent, so self times never go negative and
    add up to the time the thread spent in ops.
    """
    order = np.lexsort((-end, start, thread)).tolist()
    ends = end.tolist()
    self_ns = (end - start).tolist()
    outermost = list(range(len(ends)))
    threads, starts = thread.tolist(), start.tolist()
    stack: list[int] = []
    current = None
    for i in order:
        if threads[i] != current:
            stack.clear()
            current = threads[i]
        begin = starts[i]
        while stack and ends[stack[-1]] <= begin:
            stack.pop()
        if stack:
            parent = stack[-1]
            self_ns[parent] -= min(ends[i], ends[parent]) - begin
            outermost[i] = outermost[parent]
        stack.append(i)
    return np.maximum(np.array(self_ns, dtype=np.int64), 0), np.array(outermost, dtype=np.int64)
