"""Which runs shared their device with other work, from what each run recorded of the machine.

A run measured while another process used the cores, while the hypervisor took a share of
them (steal), or while another process held the GPU, mixes that load into its ratio. Each
run records what it saw (``profiler.machine_load`` and the GPU telemetry's other processes);
here they are judged with one rule, so that the report and ``detprof check`` warn alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean, median
from typing import Any

from detprof.analysis.overhead import model_overheads
from detprof.formatting import duration_ns, ratio
from detprof.intervals import headline
from detprof.records import INTERRUPTED_STEP, OUTLYING_MADS, PER_STEP_FIELDS, measures, outlying_steps

BUSY_CORES = 0.25
"""Other processes using a quarter of a core on average during a run share the device with it;
an idle machine's daemons use a few hundredths."""
STEAL_FRACTION = 0.05
"""A hypervisor taking this share of the cores' time during a run slows it as another process would."""


def other_cores(record: Mapping[str, Any]) -> float | None:
    load = record.get("load") or {}
    value = load.get("other_cores")
    return float(value) if isinstance(value, int | float) else None


def steal(record: Mapping[str, Any]) -> float | None:
    load = record.get("load") or {}
    value = load.get("steal_fraction")
    return float(value) if isinstance(value, int | float) else None


def other_gpu_processes(record: Mapping[str, Any]) -> list[int]:
    summary = (record.get("telemetry") or {}).get("summary") or {}
    return list(summary.get("other_processes") or [])


@dataclass(frozen=True)
class LoadRow:
    """What the machine did beside one mode's runs."""

    mode: str
    runs: int
    cores: int | None
    other_cores_mean: float | None
    other_cores_max: float | None
    steal_max: float | None
    load_average_max: float | None
    shared_runs: int


def shares_device(record: Mapping[str, Any]) -> bool:
    cores, stolen = other_cores(record), steal(record)
    return bool(
        (cores is not None and cores >= BUSY_CORES)
        or (stolen is not None and stolen >= STEAL_FRACTION)
        or other_gpu_processes(record)
    )


def _watched(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The completed runs that recorded what else the machine did."""
    return [r for r in records if r.get("status") == "ok" and (r.get("load") or other_gpu_processes(r))]


def load_rows(records: Iterable[Mapping[str, Any]]) -> list[LoadRow]:
    """One row per mode; empty when no run recorded the machine's load (older records)."""
    by_mode: dict[str, list[Mapping[str, Any]]] = {}
    for record in _watched(records):
        by_mode.setdefault(str(record["mode"]), []).append(record)
    rows = []
    for mode, runs in by_mode.items():
        others = [v for v in map(other_cores, runs) if v is not None]
        stolen = [v for v in map(steal, runs) if v is not None]
        loads = [max(r["load"]["load_average"]) for r in runs if (r.get("load") or {}).get("load_average")]
        cores = [r["load"]["cores"] for r in runs if (r.get("load") or {}).get("cores")]
        rows.append(
            LoadRow(
                mode,
                len(runs),
                max(cores) if cores else None,
                fmean(others) if others else None,
                max(others, default=None),
                max(stolen, default=None),
                max(loads, default=None),
                sum(map(shares_device, runs)),
            )
        )
    return rows


def shared_device_warnings(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """One sentence per kind of competing load, naming how many runs it touched and how much it took."""
    watched = _watched(records)
    total = len(watched)
    warnings = []
    busy = [v for v in map(other_cores, watched) if v is not None and v >= BUSY_CORES]
    if busy:
        cores = max((r["load"].get("cores") for r in watched if r.get("load")), default=None)
        of = f" of {cores}" if cores else ""
        warnings.append(
            f"{len(busy)} of {total} runs measured while other processes used up to {max(busy):.1f}{of} cores"
        )
    stolen = [v for v in map(steal, watched) if v is not None and v >= STEAL_FRACTION]
    if stolen:
        warnings.append(
            f"{len(stolen)} of {total} runs measured while the hypervisor took up to {max(stolen):.0%} "
            "of the cores (steal time)"
        )
    gpu = [other_gpu_processes(r) for r in watched if other_gpu_processes(r)]
    if gpu:
        pids = sorted({pid for found in gpu for pid in found})
        named = ", ".join(map(str, pids[:5])) + (", ..." if len(pids) > 5 else "")
        warnings.append(f"{len(gpu)} of {total} runs measured while another process used the GPU (pid {named})")
    return [f"{w}; their ratios mix determinism with that load" for w in warnings]


NAMED_RUNS = 3
"""The runs a line beside the answer names, the most disturbed first; it counts the rest."""


def _named(runs: Sequence[str]) -> str:
    """The first ``NAMED_RUNS`` of ``runs``, and how many more there are."""
    more = len(runs) - NAMED_RUNS
    return "; ".join(runs[:NAMED_RUNS]) + (f"; and {more} more run{'s' * (more > 1)}" if more > 0 else "")


def _load_words(record: Mapping[str, Any]) -> str:
    """How busy the machine was during one run that shared it (``shares_device``)."""
    said = []
    cores, stolen, gpu = other_cores(record), steal(record), other_gpu_processes(record)
    if cores is not None and cores >= BUSY_CORES:
        of = (record.get("load") or {}).get("cores")
        said.append(f"other processes used {cores:.2f}" + (f" of {of} cores" if of else " cores"))
    if stolen is not None and stolen >= STEAL_FRACTION:
        said.append(f"the hypervisor took {stolen:.0%} of the cores")
    if gpu:
        said.append(f"another process used the GPU (pid {', '.join(map(str, gpu[:5]))})")
    return " and ".join(said)


def _outlying(record: Mapping[str, Any]) -> tuple[float, str] | None:
    """How many times its median step the run's slowest outlying step took, and the words for its outlying steps
    (``records.outlying_steps``): of its kernel time per step, else of its wall time per step."""
    for metric, (steps_field, _) in PER_STEP_FIELDS.items():
        steps = record.get(steps_field) if measures(record, metric) else None
        found = outlying_steps(steps or [])
        if steps and found:
            slow, middle = sorted(steps[i] for i in found), median(steps)
            took = duration_ns(slow[0]) + (f" to {duration_ns(slow[-1])}" if len(slow) > 1 else "")
            words = (
                f"{len(found)} of {len(steps)} in {record['run_id']} ({took} of {metric} time against "
                f"{duration_ns(middle)})"
            )
            return slow[-1] / middle, words
    return None


def _outlying_line(records: Sequence[Mapping[str, Any]]) -> str | None:
    """The runs whose steps something interrupted, the most interrupted first."""
    found = sorted((f for f in map(_outlying, records) if f is not None), key=lambda f: -f[0])
    if not found:
        return None
    rule = (
        f"over {OUTLYING_MADS:g} median absolute deviations above their run's median step and {INTERRUPTED_STEP:g}x it"
    )
    return f"Steps set aside as interrupted ({rule}): {_named([words for _, words in found])}."


def _loaded_line(records: Sequence[Mapping[str, Any]]) -> str | None:
    """The runs measured while other work used the machine, and the answer without their pairs."""
    done = [r for r in records if r.get("status") == "ok"]
    loaded = sorted((r for r in done if shares_device(r)), key=lambda r: -(other_cores(r) or 0.0))
    if not loaded:
        return None
    left_out = {r["run_id"] for r in loaded}
    rest = [
        headline(o.kernel, o.wall) for o in model_overheads(r for r in records if r["run_id"] not in left_out).values()
    ]
    them = "it" if len(loaded) == 1 else "them"
    if rest and rest[0][1] is not None:
        without = f"without {them}, {rest[0][0]} time {ratio(rest[0][1])}"
    else:
        without = f"without {them}, no pair of runs is left"
    which = _named([f"{r['run_id']} ({_load_words(r)})" for r in loaded])
    return f"{len(loaded)} of {len(done)} runs measured while other work used the machine: {which}; {without}."


UNDER_LOAD = "every run under other load"
"""What a verdict is read with where no run had the machine to itself: no quiet pair is left to check it against."""


def every_run_shared(records: Sequence[Mapping[str, Any]]) -> bool:
    """Whether each completed run shared the machine (``shares_device``): then the answer without them is none."""
    done = [r for r in records if r.get("status") == "ok"]
    return bool(done) and all(shares_device(r) for r in done)


def disturbed_runs(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """What one model's answer is read with, beside it: its runs whose steps something interrupted (the answer sets
    those steps aside), and its runs measured while other work used the machine (``shares_device``) with the answer
    without them (their pairs left out, ``analysis.overhead``)."""
    ok = [r for r in records if r.get("status") == "ok"]
    return [line for line in (_outlying_line(ok), _loaded_line(records)) if line]
