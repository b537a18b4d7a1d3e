"""``detprof gpu-study``: the options, the dry run's plan, and one window of the study.

``make gpu-study`` runs it in the GPU environment ``make gpu-check`` uses, with ``GPU_BUDGET``;
the study itself is ``study``'s.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from detprof.option_values import comma_separated, parse_duration
from detprof.options import BackendsOption

BUDGET_ENV = "GPU_BUDGET"


def gpu_study(
    out: Annotated[
        Path, typer.Option(help="The study's folder: every part's results, its state, report and bundle.")
    ] = Path("gpu-study"),
    budget: Annotated[
        str | None,
        typer.Option(
            help="This window's time (10m, 600s): parts that do not fit are left for --resume, a running one is "
            "stopped at its end with its completed runs kept (default $GPU_BUDGET, else 10m).",
        ),
    ] = None,
    resume: Annotated[bool, typer.Option(help="Continue the study in --out: the parts not done yet.")] = False,
    dry_run: Annotated[
        bool, typer.Option(help="Print the plan (each part, its expected time, what this window fits) and exit.")
    ] = False,
    scale: Annotated[
        str | None,
        typer.Option(
            help="gpu: the paper's models and the small transformers at their sizes (default on a GPU); tiny: the "
            "same pipeline with the tiny models, which a CPU runs in minutes."
        ),
    ] = None,
    backends: BackendsOption = None,
    gpu: Annotated[
        str | None,
        typer.Option(help="The GPU the plan expects (its name or label, h100): whose measured costs it uses."),
    ] = None,
    bundle_to: Annotated[
        Path | None, typer.Option(help="The folder the bundle (OUT.zip, at most 16 MiB) is written to (default OUT).")
    ] = None,
) -> None:
    """Measure the whole answer on this GPU within a time budget: overhead, knobs, stability and verify."""
    from detprof.gpu_labels import CPU_LABEL, known_label, refuse_unknown
    from detprof.gpu_study.plan import DEFAULT_BUDGET_S
    from detprof.gpu_study.study import StudyRequest, plan_lines, prepare, run_window

    budget_s = parse_duration(budget or os.environ.get(BUDGET_ENV) or None, "--budget") or DEFAULT_BUDGET_S
    names = comma_separated(backends, lower=True) or None
    if gpu is not None and gpu.strip().lower() != CPU_LABEL and not known_label(gpu):
        refuse_unknown(gpu)
    request = StudyRequest(out, scale, names, budget_s, resume, gpu, bundle_to)
    prepared = prepare(request, dry_run=dry_run)
    for line in plan_lines(prepared, request):
        typer.echo(line)
    if dry_run:
        return
    run_window(prepared, request, typer.echo)
    left = [p.name for p in prepared.plan.parts if not prepared.state.is_done(p.name)]
    if left:
        typer.echo(f"gpu-study: {len(left)} parts left ({', '.join(left)}); --resume --out {out} continues them")
    else:
        typer.echo(f"gpu-study: every part done; report {out / 'report.html'}")
