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
