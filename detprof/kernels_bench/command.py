"""``detprof kernels``: options, presets, the progress bar and the op x shape table.

With no options on a machine without a GPU the bench is the ``cpu-small`` preset with
the backend's own profiler as tracer. ``--backend`` picks the op suite (TensorFlow's by
default, or PyTorch's) and its presets. Options given explicitly always win over the
preset's values. Imports nothing heavy at module level: ``detprof --help`` must not start
TensorFlow; the shapes are derived (which builds Keras models) only once every option
has been checked, and in a child process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from detprof.console import print_table, status_console, table_console, unbounded
from detprof.errors import UsageError
from detprof.formatting import duration_ns, ratio
from detprof.invocation import Invocation
from detprof.kernels_bench.bench import BACKEND_SUITES, KernelsConfig, derive, plan_runs, select_ops, suites
from detprof.kernels_bench.presets import BACKEND_PRESETS, PRESETS
from detprof.option_values import comma_separated
from detprof.options import MEASURED_STUDY, RunOptions, with_run_options
from detprof.profiler.measured_runs import choose_target, preset_values, study_root
from detprof.profiler.study import MeasuredStudy, measure
from detprof.store import ResultsStore

if TYPE_CHECKING:
    from detprof.intervals import Metric
    from detprof.kernels_bench.case_results import CaseSummary

DIFF_NAMES_SHOWN = 3


def _split(option: str, text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    items = comma_separated(text, lower=True)
    if not items:
        raise UsageError(f"{option} is empty: give a comma-separated list")
    return items


def parse_kernel_sizes(text: str | None) -> tuple[int, ...] | None:
    items = _split("--kernel-sizes", text)
    if items is None:
        return None
    sizes = []
    for item in items:
        if not item.isdigit():
            raise UsageError(f"--kernel-sizes: {item!r} is not a positive odd integer")
        sizes.append(int(item))
    return tuple(sizes)


def _names(sign: str, names: list[str]) -> list[str]:
    shown = [f"{sign}{escape(name)}" for name in names[:DIFF_NAMES_SHOWN]]
    if len(names) > DIFF_NAMES_SHOWN:
        shown.append(f"({len(names) - DIFF_NAMES_SHOWN} more {'added' if sign == '+' else 'removed'})")
    return shown


@with_run_options(*MEASURED_STUDY)
def kernels(
    options: RunOptions,
    suite: Annotated[str | None, typer.Option(help="conv | ops | all (default: all).")] = None,
    ops: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated ops of the suite. "
            + " ".join(f"{backend}: {', '.join(by_name['all'])}." for backend, by_name in BACKEND_SUITES.items())
        ),
    ] = None,
    kernel_sizes: Annotated[
        str | None, typer.Option(help="Conv suite: mediumcnn kernel sizes, positive odd integers (paper: 1,3,5,7).")
    ] = None,
    max_shapes: Annotated[
        int | None,
        typer.Option(help="Per op (and kernel size), keep the N shapes with the most work; 0 keeps all."),
    ] = None,
) -> None:
    """Run each op at each model layer's shape in default and deterministic mode; report what changes."""
    target = choose_target(options, list(PRESETS), dry_run=options.dry_run)
    available = suites(target.backend)
    preset = BACKEND_PRESETS[target.backend][target.preset]
    named = _split("--ops", ops)
    selected = select_ops(available, suite or preset["suite"], named or preset["ops"], strict=named is not None)
    given: dict[str, Any] = {
        "kernel_sizes": parse_kernel_sizes(kernel_sizes),
        "steps": options.steps,
        "warmup": options.warmup,
        "repeats": options.repeats,
        "batch_size": options.batch_size,
        "input_size": options.input_size,
    }
    values = {k: v for k, v in preset_values(preset, given).items() if k not in ("suite", "ops")}
    if max_shapes is not None:
        if max_shapes < 0:
            raise UsageError(f"--max-shapes must be at least 0, not {max_shapes}")
        values["max_shapes"] = max_shapes or None
    config = KernelsConfig.for_target(target, options, in_process=True, ops=selected, **values)
    cases = derive(config)
    manifest = config.manifest(cases)
    out = study_root(options.out, target.device, target.backend, "kernels", manifest, list(selected))
    plan = plan_runs(cases, config.repeats, config.batch_size)
    if options.dry_run:
        from detprof.profiler.dry_run import plan_lines

        typer.echo("\n".join(plan_lines("kernels", plan, config, target, out)))
        return
    given = Invocation.of(options.resume, options.wait)
    study = MeasuredStudy("kernels", plan, config, manifest, target, out, given)
    store = measure(study, what=f"{len(cases)} case{'' if len(cases) == 1 else 's'}", console=status_console())
    print_summary(store)
    status_console().print(f"results: {escape(str(store.dir))}")


def _cells(name: str, row: CaseSummary, metric: Metric) -> list[str]:
    """The op, its time in each mode, its ratio in ``metric`` and in wall time."""
    overhead = getattr(row.overhead, metric)
    return [
        name,
        duration_ns(row.default_ns),
        duration_ns(row.deterministic_ns),
        ratio(overhead),
        ratio(row.overhead.wall),
    ]


def _failures(summary: CaseSummary) -> str:
    note = summary.overhead.failure_note()
    return "-" if note is None else escape(note)


def print_summary(store: ResultsStore) -> None:
    from detprof.kernels_bench.case_results import summarize

    result = summarize(store)
    traced = result.metric == "kernel"
    console = table_console()
    # On a terminal a cell's parts stack; written to a pipe or a file, a row is one line (grep finds it whole).
    part, item = ("\n", "\n") if not unbounded(console) else (" ", ", ")
    table = Table(
        title=f"Cost of determinism per op ({result.metric} time per step; "
        "ratio = deterministic / default, 95% CI over repeats)"
    )
    for col in ("Op and shape", "Default", "Deterministic", "Ratio", "Wall ratio", "Kernels that differ", "Failed"):
        table.add_column(col, overflow="fold")
    for row in result.cases:
        where = f"{row.model}.{row.layers[0]}" + (f" (+{len(row.layers) - 1} more)" if len(row.layers) > 1 else "")
        changed = _names("+", row.added) + _names("-", row.removed) if traced else ["n/a (no kernels traced)"]
        name = f"{row.op}{part}{escape(row.shape)}{part}[dim]{escape(where)}[/]"
        table.add_row(*_cells(name, row, result.metric), item.join(changed) or "-", _failures(row))
    if result.totals:
        table.add_section()
    for row in result.totals:
        table.add_row(*_cells(f"{row.op}{part}{escape(row.shape)}", row, result.metric), "-", "-")
    print_table(console, table)
