"""What else the machine was doing while a run was measured: other processes' CPU, steal, load average.

A ratio measured while another process competed for the cores says as much about that process
as about determinism, and nothing in a run's timings shows it. ``LoadWatch`` brackets a run
and records how many cores processes other than detprof's own used meanwhile (the busy time of
the cores this process may run on, less the CPU time of detprof's own process tree), the share
the hypervisor took (steal) and the load average, so that the report and ``check`` can name the
runs that shared their device (``analysis.conditions``). The cores are the ones in this
process's affinity: on a shared host they are the ones the run competes for.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import psutil

SHORTEST_WINDOW_S = 0.5
"""The shortest window whose load is read: the kernel counts CPU time in ticks of 10 ms (``USER_HZ``), so over a
window of a few milliseconds (a tiny model's few steps) one tick reads as several cores; over half a second it is
two hundredths of a core."""


def own_process_tree() -> set[int]:
    """This process and every process it started, still running: what detprof itself runs."""
    me = psutil.Process()
    with contextlib.suppress(psutil.Error):
        return {me.pid, *(child.pid for child in me.children(recursive=True))}
    return {me.pid}


def own_cpu_s() -> float:
    """CPU seconds of this process, of the children it reaped and of its running descendants.

    A descendant's time moves into its parent's ``children_*`` times when the parent reaps it,
    so every process of the tree is counted once whether it is running or has ended.
    """
    me = psutil.Process()
    total = sum(me.cpu_times()[:4])
    with contextlib.suppress(psutil.Error):
        for child in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += sum(child.cpu_times()[:4])
    return total


def _cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(psutil.cpu_count()))


def _core_times(cores: list[int]) -> tuple[float, float, float]:
    """Busy, steal and total seconds of ``cores`` since boot; guest time is already inside user time."""
    per_core = psutil.cpu_times(percpu=True)
    busy = steal = total = 0.0
    for core in cores:
        if core >= len(per_core):
            continue
        times = per_core[core]
        core_steal = getattr(times, "steal", 0.0)
        core_busy = times.user + times.nice + times.system + getattr(times, "irq", 0.0)
        core_busy += getattr(times, "softirq", 0.0)
        busy += core_busy
        steal += core_steal
        total += core_busy + core_steal + times.idle + getattr(times, "iowait", 0.0)
    return busy, steal, total


class LoadWatch:
    """``with LoadWatch() as load: run(); record["load"] = load.result()``."""

    def __init__(self) -> None:
        self._cores = _cores()
        self._start: tuple[float, tuple[float, float, float], float, float] | None = None
        self._result: dict[str, Any] | None = None

    def _snapshot(self) -> tuple[float, tuple[float, float, float], float, float]:
        return time.monotonic(), _core_times(self._cores), own_cpu_s(), os.getloadavg()[0]

    def __enter__(self) -> LoadWatch:
        with contextlib.suppress(OSError, psutil.Error):
            self._start = self._snapshot()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._start is None:
            return
        try:
            end = self._snapshot()
        except (OSError, psutil.Error):
            return
        (t0, (busy0, steal0, total0), own0, load0), (t1, (busy1, steal1, total1), own1, load1) = self._start, end
        window_s = t1 - t0
        if window_s < SHORTEST_WINDOW_S or total1 <= total0:
            return
        self._result = {
            "cores": len(self._cores),
            "other_cores": round(max(0.0, (busy1 - busy0) - (own1 - own0)) / window_s, 3),
            "own_cores": round((own1 - own0) / window_s, 3),
            "steal_fraction": round((steal1 - steal0) / (total1 - total0), 4),
            "load_average": [round(load0, 2), round(load1, 2)],
            "window_s": round(window_s, 3),
        }

    def result(self) -> dict[str, Any] | None:
        """The run's share of the machine; None where the kernel's counters could not be read, or the window was too
        short for them (``SHORTEST_WINDOW_S``)."""
        return self._result
