"""``detprof kernels``: options, presets, the progress bar and the op x shape table.

With no options on a machine without a GPU the bench is the ``cpu-small`` preset with
TensorFlow's profiler as tracer. Options given explicitly always win over the preset's
values. Imports nothing heavy at module level: ``detprof --help`` must not start
TensorFlow; the shapes are derived (which builds Keras models) only once every option
has been checked, and in a child process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from detprof.errors import UsageError
from detprof.formatting import duration_ns, ratio
from detprof.invocation import command_line
from detprof.kernels_bench.bench import PRESETS, KernelsConfig, run_bench, select_ops
from detprof.kernels_bench.cases import SUITES, derive_in_subprocess
from detprof.profiler.measured_study import (
    BatchSizeOption,
    ForceOption,
    GpuOption,
    InputSizeOption,
    OutOption,
    PresetOption,
    RepeatsOption,
    ResumeOption,
    RunTimeoutOption,
    SeedOption,
    StepsOption,
    TracerOption,
    WarmupOption,
    XlaOption,
    choose_target,
    default_results_dir,
    progress_bar,
)
from detprof.store import ResultsStore

if TYPE_CHECKING:
    from detprof.kernels_bench.summary import CaseSummary

HELP = "Measure what determinism costs op by op (convolutions, pooling, scatters, ...)."
DIFF_NAMES_SHOWN = 3
# Written to a file or a pipe, the table is read whole: rich's 80-column default would fold every cell.
TABLE_WIDTH_UNBOUNDED = 200


def _split(option: str, text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    items = tuple(dict.fromkeys(item.strip().lower() for item in text.split(",") if item.strip()))
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


def kernels(
    suite: Annotated[str | None, typer.Option(help="conv | ops | all (default: all).")] = None,
    ops: Annotated[
        str | None, typer.Option(help=f"Comma-separated ops of the suite: {', '.join(SUITES['all'])}.")
    ] = None,
    kernel_sizes: Annotated[
        str | None, typer.Option(help="Conv suite: mediumcnn kernel sizes, positive odd integers (paper: 1,3,5,7).")
    ] = None,
    preset: PresetOption = None,
    gpu: GpuOption = None,
    force: ForceOption = False,
    tracer: TracerOption = "auto",
    steps: StepsOption = None,
    warmup: WarmupOption = None,
    repeats: RepeatsOption = None,
    batch_size: BatchSizeOption = None,
    input_size: InputSizeOption = None,
    max_shapes: Annotated[
        int | None,
        typer.Option(help="Per op (and kernel size), keep the N shapes with the most work; 0 keeps all."),
    ] = None,
    xla: XlaOption = False,
    seed: SeedOption = 0,
    out: OutOption = None,
    resume: ResumeOption = False,
    run_timeout: RunTimeoutOption = None,
) -> None:
    """Run each op at each model layer's shape in default and deterministic mode; report what changes."""
    target = choose_target(gpu, force, tracer, preset, list(PRESETS))
    device, chosen_tracer, preset_name = target.device, target.tracer, target.preset
    preset_values = PRESETS[preset_name]
    named = _split("--ops", ops)
    selected = select_ops(suite or preset_values["suite"], named or preset_values["ops"], strict=named is not None)
    values = {k: v for k, v in preset_values.items() if k not in ("suite", "ops")}
    explicit: dict[str, Any] = {
        "kernel_sizes": parse_kernel_sizes(kernel_sizes),
        "steps": steps,
        "warmup": warmup,
        "repeats": repeats,
        "batch_size": batch_size,
        "input_size": input_size,
    }
    values.update({k: v for k, v in explicit.items() if v is not None})
    if max_shapes is not None:
        if max_shapes < 0:
            raise UsageError(f"--max-shapes must be at least 0, not {max_shapes}")
        values["max_shapes"] = max_shapes or None
    config = KernelsConfig(
        ops=selected,
        **values,
        tracer=chosen_tracer.name,
        xla=xla,
        gpu_label=device.label,
        seed=seed,
        preset=preset_name,
        run_timeout_s=run_timeout,
    )
    cases = derive_in_subprocess(
        config.ops, config.kernel_sizes, config.batch_size, config.input_size, config.max_shapes
    )
    out = out or default_results_dir(device)
    store = ResultsStore(out, "kernels")
    console = Console(stderr=True)
    total = len(cases) * 2 * config.repeats
    console.print(
        f"detprof kernels: {len(cases)} case{'' if len(cases) == 1 else 's'} x 2 modes x {config.repeats} repeats on "
        f"{escape(device.label)} with tracer {chosen_tracer.name}, results in {escape(str(out))}"
    )
    with progress_bar(console, total, store.dir) as progress:
        run_bench(config, cases, store, chosen_tracer, device, resume=resume, command=command_line(), progress=progress)
    print_summary(store)
    console.print(f"results: {escape(str(store.dir))}")


def _failures(summary: CaseSummary) -> str:
    note = summary.overhead.failure_note()
    return "-" if note is None else escape(note)


def print_summary(store: ResultsStore) -> None:
    from detprof.kernels_bench.summary import summarize

    result = summarize(store)
    traced = result.metric == "kernel"
    table = Table(
        title=f"Cost of determinism per op ({result.metric} time per step; "
        "ratio = deterministic / default, 95% CI over repeats)"
    )
    for col in ("Op and shape", "Default", "Deterministic", "Ratio", "Wall ratio", "Kernels that differ", "Failed"):
        table.add_column(col, overflow="fold")
    for row in result.cases:
        where = f"{row.model}.{row.layers[0]}" + (f" (+{len(row.layers) - 1} more)" if len(row.layers) > 1 else "")
        changed = _names("+", row.added) + _names("-", row.removed) if traced else ["n/a (no kernels traced)"]
        table.add_row(
            f"{row.op}\n{escape(row.shape)}\n[dim]{escape(where)}[/]",
            duration_ns(row.default_ns),
            duration_ns(row.deterministic_ns),
            ratio(getattr(row.overhead, result.metric)),
            ratio(row.overhead.wall),
            "\n".join(changed) or "-",
            _failures(row),
        )
    if result.totals:
        table.add_section()
    for row in result.totals:
        table.add_row(
            f"{row.op}\n{escape(row.shape)}",
            duration_ns(row.default_ns),
            duration_ns(row.deterministic_ns),
            ratio(getattr(row.overhead, result.metric)),
            ratio(row.overhead.wall),
            "-",
            "-",
        )
    console = Console()
    if not console.is_terminal:
        console = Console(width=TABLE_WIDTH_UNBOUNDED)
    console.print(table)
