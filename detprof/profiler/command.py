"""``detprof gpus``: what NVML sees, before a sweep is labelled with it.

Finding no GPU is a normal answer on a CPU machine, so it is said plainly with NVML's
reason and exits 0; ``--gpu`` checks, not this listing, are where a missing GPU is an error.
"""

from __future__ import annotations

import os


def _gib(memory_bytes: int | None) -> str:
    return "?" if memory_bytes is None else f"{memory_bytes / 2**30:.1f} GiB"


def _text(value: object) -> str:
    return "?" if value is None else str(value)


def gpus() -> None:
    from rich.markup import escape
    from rich.table import Table

    from detprof.console import print_table, table_console
    from detprof.profiler.devices import probe_gpus, visible_gpus

    console = table_console()
    probe = probe_gpus()
    if not probe.gpus:
        reason = "; ".join(probe.problems) or "no devices"
        console.print(f"No NVIDIA GPU found (NVML: {escape(reason)})", soft_wrap=True)
        return
    table = Table(title="NVIDIA GPUs (NVML)")
    for column in ("#", "Name", "UUID", "CC", "SMs", "Memory", "Driver", "CUDA"):
        table.add_column(column, no_wrap=column == "UUID")
    for gpu in probe.gpus:
        table.add_row(
            str(gpu.index),
            escape(gpu.name),
            _text(gpu.uuid),
            _text(gpu.compute_capability),
            _text(gpu.sm_count),
            _gib(gpu.memory_bytes),
            _text(gpu.driver_version),
            _text(gpu.cuda_driver_version),
        )
    print_table(console, table)
    for problem in probe.problems:
        console.print(f"Not listed: {escape(problem)}", soft_wrap=True)
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is not None:
        seen = ", ".join(f"{gpu.index} ({gpu.name})" for gpu in visible_gpus(probe.gpus)) or "no GPU"
        console.print(
            f"CUDA_VISIBLE_DEVICES={spec!r}: CUDA sees {escape(seen)}; "
            "sweeps use the first (or the one --gpu-index names)",
            soft_wrap=True,
        )
