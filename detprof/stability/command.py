"""``detprof stability``: train many copies under chosen noise sources and show what the noise does.

Imports nothing heavy at module level: ``detprof --help`` must not start TensorFlow, and a
JAX or PyTorch study must never start it at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from detprof.console import print_table, status_console, table_console
from detprof.errors import UsageError
from detprof.formatting import number, plus_minus
from detprof.invocation import Invocation
from detprof.options import RunOptions, with_run_options
from detprof.stability.variants import DEFAULT_VARIANTS, NAMED_VARIANTS

if TYPE_CHECKING:
    from detprof.profiler.devices import DeviceChoice

KEEP_SAVED_WEIGHTS_HELP = (
    "--model FILE.keras: start every run from the saved weights instead of fresh ones drawn from the run's init seed "
    "(init then no longer varies)."
)


def variant_table(v: dict[str, Any]) -> Table:
    table = Table(show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    accuracy, entropy = v["accuracy"], v["cross_entropy"]
    table.add_row("runs ok / failed", f"{v['runs_ok']} / {v['runs_failed']}")
    table.add_row("accuracy mean", number(accuracy.get("mean")))
    table.add_row("accuracy std +/- s.e.", plus_minus(accuracy))
    table.add_row("cross-entropy mean", number(entropy.get("mean")))
    table.add_row("cross-entropy std +/- s.e.", plus_minus(entropy))
    table.add_row("churn", number(v["churn"]))
    table.add_row("l2 (unit-normalized weights)", number(v["l2"]))
    table.add_row("per-class: max std / accuracy std", number(v["per_class"]["ratio"], 2))
    table.add_row("Spearman (probabilities)", number(v["spearman"]))
    table.add_row("ensemble gain", number(v["ensemble_gain"]))
    table.add_row("CKA (penultimate layer)", number(v["cka"]))
    table.add_row("distinct final weights", f"{v['distinct_weights']} of {v['runs_ok']}")
    for group in (v.get("subgroups") or {}).get("groups", []):
        ratio = number(group.get("accuracy_std_ratio"), 2)
        table.add_row(f"group {escape(str(group['group']))} (n={group['n']}): acc std / overall", ratio)
    return table


def print_summary(console: Console, summary: dict[str, Any]) -> None:
    """One table per variant, then the determinism check where it applies (and, on a generated language, whether
    the variant learned its rules); a study that did not learn says so, and how much longer to train it: its spread
    says nothing of what determinism buys, and the report leaves it out."""
    from detprof.stability.learning import learning_of, references_of, train_longer

    for v in summary["variants"]:
        console.print(f"[bold]{escape(v['variant'])}[/]: {escape(v['description'])}")
        print_table(console, variant_table(v))
        check = v["determinism_check"]
        if check["applicable"]:
            style = "green" if check["verified"] else "red"
            console.print(f"[{style}]{escape(check['line'])}[/]")
        if v.get("learned") is not None:
            console.print(learned_line(v, summary))
        for failure in v["failures"]:
            console.print(f"[yellow]{escape(failure['run_id'])} failed: {escape(failure['reason'])}[/]")
        console.print()
    learning = learning_of(summary["variants"], summary.get("classes"), references_of(summary))
    epochs = (summary.get("config") or {}).get("epochs")
    if learning.learned is False:
        longer = f" ({train_longer(epochs)})" if isinstance(epochs, int) else " (--epochs)"
        console.print(
            f"[yellow]did not learn: {escape(learning.line())}: train longer{longer} before reading its spread[/]"
        )


def learned_line(v: dict[str, Any], summary: dict[str, Any]) -> str:
    """On a generated language: whether the held-out loss came nearer its rules or its token frequencies."""
    loss = v["cross_entropy"]["mean"]
    references = f"entropy rate {summary['entropy_rate']:.2f}, token frequencies {summary['frequency_entropy']:.2f}"
    if v["learned"]:
        return f"[green]learned the language: held-out loss {loss:.2f} nats ({references})[/]"
    return f"[yellow]did not learn the language's rules: held-out loss {loss:.2f} nats ({references})[/]"


@with_run_options("backend", "gpu", "gpu_index", "force", "out", "resume", "wait", "ray")
def stability(
    options: RunOptions,
    model: Annotated[
        str,
        typer.Option(
            "--model",
            "--models",
            help="A registry model (see `detprof models`), or your own: FILE.py:FUNCTION, package.module:FUNCTION "
            "(a function returning a keras.Model, a torch.nn.Module or a Flax module) or FILE.keras (a saved model, "
            "re-initialised from each run's seed).",
        ),
    ] = "smallcnn",
    dataset: Annotated[
        str | None,
        typer.Option(
            help="digits | cifar10 | cifar100 | synthetic | markov | npz:PATH (arrays x_train, y_train, x_test, "
            "y_test, optional groups_test; (N, H, W, C) or (N, C, H, W) x_* are images, whatever the model; integer "
            "(N, L) x_* are token ids, y_* the next token at each position). "
            "Default: digits, or markov (a generated language) for a model of tokens.",
        ),
    ] = None,
    variants: Annotated[str, typer.Option(help=f"Comma-separated variants: {', '.join(NAMED_VARIANTS)}.")] = ",".join(
        DEFAULT_VARIANTS
    ),
    runs: Annotated[
        int | None,
        typer.Option(help="Runs per variant (default 10; 5 for the embedded smallcnn-on-digits default)."),
    ] = None,
    epochs: Annotated[
        int | None, typer.Option(help="Training epochs per run (default 60, sized for digits; 20 on markov).")
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Batch size (paper: 128).")] = 128,
    lr: Annotated[float, typer.Option(help="Adam learning rate (paper: 4e-4).")] = 4e-4,
    seed: Annotated[int, typer.Option(help="Base seed: fixed sources use it, varying ones derive from it.")] = 0,
    jobs: Annotated[
        int | None,
        typer.Option(
            help="Worker processes in parallel (default: usable cores, at most 4; on a GPU 1, "
            "and at most one per 2 GiB of its free memory)."
        ),
    ] = None,
    keep_weights: Annotated[bool, typer.Option(help="Also store every run's final weights (npz).")] = False,
    keep_saved_weights: Annotated[bool, typer.Option(help=KEEP_SAVED_WEIGHTS_HELP)] = False,
) -> None:
    """Train many copies of a model under chosen noise sources and measure what the noise does."""
    from detprof import backends
    from detprof.stability import study

    if "," in model:
        raise UsageError(f"--model: a stability study trains one model, not {model!r}; run one study per model")
    backend = None if options.backend is None else backends.require(options.backend).name
    dataset = dataset if dataset is not None else study.default_dataset(model)
    config = study.StudyConfig(
        model=model,
        dataset=dataset,
        variants=tuple(variants.split(",")),
        runs=runs if runs is not None else study.default_runs(model, dataset),
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        epochs=epochs if epochs is not None else study.default_epochs(dataset),
        keep_weights=keep_weights,
        backend=backend,
        keep_saved_weights=keep_saved_weights,
    )
    err = status_console()
    with _device_and_executor(options, jobs, err) as (device, execute):
        workers = study.Workers(device, jobs if jobs is not None else study.default_jobs(device), execute=execute)
        given = Invocation.of(options.resume, options.wait)
        outcome = study.run_study(config, options.out, given, workers, err)
    print_summary(table_console(), outcome.summary)
    failed = outcome.summary["runs_failed"]
    note = f" ({failed} failed: rerun with --resume to retry them)" if failed else ""
    err.print(
        f"{outcome.ran} runs trained, {outcome.skipped} already done{note}; "
        f"results in {escape(str(outcome.store.dir))} (summary.json, tables/*.parquet)"
    )


@contextmanager
def _device_and_executor(
    options: RunOptions, jobs: int | None, err: Console
) -> Iterator[tuple[DeviceChoice, Callable[..., None] | None]]:
    """This machine's device and pools; with ``--ray``, the device a GPU type's nodes train as, and the fleet."""
    if options.ray is None:
        from detprof.profiler import devices

        yield devices.choose_device(options.gpu, options.force, gpu_index=options.gpu_index), None
        return
    from detprof.stability.on_fleet import stability_fleet

    if jobs is not None:
        raise UsageError("--jobs is this machine's pool; on a fleet each node trains one run per GPU at a time")
    with stability_fleet(options, err) as found:
        yield found
