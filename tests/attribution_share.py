"""What no layer claims of a typical step: the attribution's coverage, as the tests that promise it read it.

The report's share (``analysis.layers``: the ``(unattributed)`` row over the step, means over a run's steps) is
what the user reads, and ``test_layers_e2e`` holds it to that row. On this CPU a run's "kernels" are ops timed on
a core that the suite's other processes share: an op preempted for a time slice (4 ms, in steps of 7 ms) puts a
fifth of a run's time in whatever op it hit, a timing accident, not a module left unclaimed. Whether attribution
claims the step is read here per step, by the report's own ``run_parts``, and the median over the steps taken: one
preempted step cannot carry it, while a module that no row claims shows in every step.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from detprof.analysis.layers import run_parts
from detprof.analysis.study_results import counted_steps
from detprof.store import ResultsStore
from detprof.traces.attribution import UNATTRIBUTED


def typical_unattributed_share(results: Path, model: str) -> float:
    """The median over the default mode's steps of the share of a step that no layer claims."""
    store = ResultsStore(results, "sweep")
    shares = []
    for record in store.records():
        if (record["model"], record["mode"], record["status"]) != (model, "default", "ok"):
            continue
        frame, _ = counted_steps(store.read_table(str(record["kernel_table"])), record)
        for _, step in frame.groupby("step"):
            parts = run_parts(
                step,
                1,
                list(record.get("layer_names") or []),
                dict(record.get("step_scopes") or {}),
                record.get("kernel_modules"),
            )
            shares.append(parts.layers.get(UNATTRIBUTED, 0.0) / sum(parts.layers.values()))
    assert shares, f"{model}: no traced step of the default mode in {results}"
    return statistics.median(shares)
