"""``detprof baseline``: a sweep's per-repeat overheads frozen as the reference ``detprof check`` compares with.

``check`` itself lives with the sweep (``sweep.check_command``): with ``--run`` it measures,
and this package is the read side (the baseline file, the statistics, the CI outputs),
which never imports the runner. Imports happen inside the command so that ``detprof
--help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def baseline(
    results: Annotated[Path, typer.Argument(help="Results directory of a completed sweep (sweep --out).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Baseline file to write (plain JSON).")] = Path(
        "detprof-baseline.json"
    ),
) -> None:
    """Save a sweep's per-repeat overheads and environment as the reference for detprof check.

    One backend's sweep: results holding sweeps of several Keras backends are refused; build one baseline per backend.
    """
    from detprof.check.baseline_file import build_baseline, describe_backend, read_sweep, write_baseline

    document = build_baseline(read_sweep(results))
    write_baseline(output, document)
    fp = document["fingerprint"]
    repeats = sorted({entry["repeats"] for entry in document["models"].values()})
    typer.echo(
        f"baseline: {len(document['models'])} model(s), {'/'.join(map(str, repeats))} repeats, "
        f"GPU {fp['gpu_name'] or fp['gpu_label']}, backend {describe_backend(fp)}, "
        f"config {fp['config_hash']} -> {output}"
    )
    for model, reason in document["unsupported"].items():
        typer.echo(f"  {model}: not supported under determinism, recorded as such ({reason})")
