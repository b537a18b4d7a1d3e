"""Which runs shared their device with other work, from what each run recorded of the machine.

A run measured while another process used the cores, while the hypervisor took a share of
them (steal), or while another process held the GPU, mixes that load into its ratio. Each
run records what it saw (``profiler.machine_load`` and the GPU telemetry's other processes);
here they are judged with one rule, so that the report and ``detprof check`` warn alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from statistics import fmean
from typing import Any

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
