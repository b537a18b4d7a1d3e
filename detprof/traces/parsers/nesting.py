"""Self times of nested op events: the one stack walk that both CPU-op parsers (Kineto, XSpace) use.

A profiler records an op and the ops it calls as nested events on one thread; summing their
durations would count the inner ones twice, so each op is timed by its self time.
"""

from __future__ import annotations

import numpy as np


def self_times(
    thread: np.ndarray, start: np.ndarray, end: np.ndarray, parent: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Each op's duration less that of the ops nested directly in it on its thread, and its outermost op.

    Times in any one integer unit (Kineto's nanoseconds, XSpace's picoseconds); ``parent``: each op's, where the
    caller has found them already (``containers``).

    Ops sorted by thread, start and longest first nest like a call stack: an op's parent is
    the innermost open op it starts in. A child that outlasts its parent (timestamps are
    rounded) only takes the part inside the parent, so self times never go negative and
    add up to the time the thread spent in ops.
    """
    if parent is None:
        parent, _ = containers(thread, start, end, thread[:0], start[:0])
    nested = np.flatnonzero(parent >= 0)
    inside_parent = np.minimum(end[nested], end[parent[nested]]) - start[nested]
    self_ns = (end - start).astype(np.int64)
    np.subtract.at(self_ns, parent[nested], inside_parent)
    outermost = np.arange(len(start))
    for i in np.lexsort((-end, start, thread)).tolist():
        if parent[i] >= 0:
            outermost[i] = outermost[parent[i]]
    return np.maximum(self_ns, 0), outermost.astype(np.int64)


def containers(
    thread: np.ndarray, start: np.ndarray, end: np.ndarray, point_thread: np.ndarray, point_time: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The innermost interval that holds each interval (its parent) and each point, on the same thread; -1 for none.

    Intervals are ranges or ops on a thread (nested like a call stack, as in ``self_times``);
    points are moments on a thread (a kernel's launching call). An interval holds a point
    from its start up to, not including, its end.
    """
    n = len(start)
    keys = np.concatenate((thread, point_thread)).tolist()
    at = np.concatenate((start, point_time)).tolist()
    ends = end.tolist()
    longest_first = np.concatenate((-end, np.zeros(len(point_time), dtype=end.dtype)))
    is_point = np.concatenate((np.zeros(n, dtype=np.int8), np.ones(len(point_time), dtype=np.int8)))
    order = np.lexsort((is_point, longest_first, np.array(at), np.array(keys))).tolist()
    parent = [-1] * n
    holder = [-1] * len(point_time)
    stack: list[int] = []
    current = None
    for item in order:
        if keys[item] != current:
            stack.clear()
            current = keys[item]
        moment = at[item]
        while stack and ends[stack[-1]] <= moment:
            stack.pop()
        top = stack[-1] if stack else -1
        if item < n:
            parent[item] = top
            stack.append(item)
        else:
            holder[item - n] = top
    return np.array(parent, dtype=np.int64), np.array(holder, dtype=np.int64)
