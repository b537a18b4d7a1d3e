"""``detprof baseline`` and ``detprof check``: a sweep's per-repeat overheads frozen as the reference, and CI
failed when determinism gets more expensive than it.

This package is the read side (the baseline file, the statistics, the CI outputs) and never
imports the runner: ``check --run`` has the baseline's study kind measure again through the
registry (``check.outcome``). This module reads the options and prints and writes what the
outcome holds. Imports happen inside the commands so that ``detprof --help`` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from detprof.errors import InputError, output_failure
from detprof.option_values import parse_threshold
from detprof.options import CHECK_RUN, ModelsOption, RunOptions, with_run_options
from detprof.store import write_output

if TYPE_CHECKING:
    from detprof.check.baseline_file import EnvironmentCheck
    from detprof.check.regression import Comparison
    from detprof.store import ResultsStore


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
    from detprof.gpu_labels import CPU_LABEL

    document = build_baseline(read_sweep(results))
    write_baseline(output, document)
    fp = document["fingerprint"]
    repeats = sorted({entry["repeats"] for entry in document["models"].values()})
    device = "CPU" if str(fp["gpu_label"] or "").lower() == CPU_LABEL else "GPU"
    typer.echo(
        f"baseline: {len(document['models'])} model(s), {'/'.join(map(str, repeats))} repeats, "
        f"{device} {fp['gpu_name'] or fp['gpu_label']}, backend {describe_backend(fp)}, "
        f"config {fp['config_hash']} -> {output}"
    )
    for model, reason in document["unsupported"].items():
        typer.echo(f"  {model}: not supported under determinism, recorded as such ({reason})")


CHECK_DETAILS = (
    "The change is current overhead / baseline overhead (overhead = deterministic / default time per "
    "step: kernel time when both sides traced kernels, else wall time). Its interval is a one-sided "
    "Welch t-interval on the per-repeat log ratios, sound for 3-10 repeats per side (2 work, widely); "
    "with several models, Holm's step-down controls the family-wise error. REGRESSED: lower bound "
    "above 1 + threshold. IMPROVED: upper bound below 1/(1 + threshold). INCONCLUSIVE: point estimate "
    "beyond the threshold, interval across it.\n\n"
    "A baseline is of one Keras backend: results of another backend are refused (exit 3; --allow-env-change "
    "does not apply), and --run runs the baseline's backend.\n\n"
    "Exit codes: 0 no regression (inconclusive and missing models warn); 1 a regression (or, with "
    "--strict, an inconclusive or missing model); 2 usage error; 3 not comparable (fingerprint differs; "
    "--allow-env-change overrides with a warning), unusable input, an output path that cannot hold a file, or a "
    "measurement that failed; 70 an internal error (a bug in detprof, never a regression); 74 the machine refused "
    "(a permission, a full disk, results another detprof holds)."
)


@with_run_options(*CHECK_RUN)
def check(
    options: RunOptions,
    baseline_file: Annotated[
        Path | None, typer.Option("--baseline", help="Baseline file written by detprof baseline.")
    ] = None,
    current: Annotated[
        Path | None, typer.Option(help="Results directory of the sweep to check (detprof sweep --out).")
    ] = None,
    run: Annotated[bool, typer.Option("--run", help="Run the sweep now, as the baseline's unless overridden.")] = False,
    threshold: Annotated[
        str, typer.Option(help="Tolerated rise of the overhead: 10% or 0.10 (a bare number of 1 or more is refused).")
    ] = "10%",
    confidence: Annotated[
        float, typer.Option(help="1 - family-wise error rate per direction (Holm across models).")
    ] = 0.95,
    strict: Annotated[bool, typer.Option(help="Fail (exit 1) on INCONCLUSIVE and missing models.")] = False,
    allow_env_change: Annotated[
        bool, typer.Option(help="Compare even if the environment fingerprint differs (warns).")
    ] = False,
    junit: Annotated[Path | None, typer.Option(help="Write JUnit XML, one test case per model.")] = None,
    github: Annotated[
        bool, typer.Option(help="Append a table to $GITHUB_STEP_SUMMARY; print ::error/::warning lines.")
    ] = False,
    bmf: Annotated[Path | None, typer.Option(help="Write Bencher Metric Format JSON.")] = None,
    benchmark_json: Annotated[
        Path | None, typer.Option(help="Write github-action-benchmark customSmallerIsBetter JSON.")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="--run: results directory (default results/check-<UTC time>).")
    ] = None,
    models: ModelsOption = None,
) -> None:
    """Compare each model's determinism overhead with the baseline's (help: CHECK_DETAILS)."""
    from detprof.check.outcome import CheckRequest, run_check
    from detprof.console import status_console

    request = CheckRequest(
        baseline_file,
        current,
        run,
        parse_threshold(threshold),
        confidence,
        strict,
        allow_env_change,
        options,
        models,
        out,
    )
    console = status_console()
    outcome = run_check(request, console=console)
    _report(outcome.comparison, outcome.env, strict=strict, title=outcome.title, junit=junit, github=github)
    if outcome.refusal is not None:
        raise InputError(outcome.refusal)
    for shared in outcome.shared_device:
        typer.echo(f"detprof: warning: {outcome.results_dir}: {shared}", err=True)
        if github:
            from detprof.check import ci_outputs

            typer.echo(ci_outputs.workflow_command("warning", "detprof check: device shared with other load", shared))
    assert outcome.comparison is not None
    _print_noise_floor(outcome.results_dir)
    _write_json(bmf, benchmark_json, outcome.comparison)
    code = outcome.exit_code(strict=strict)
    if code:
        raise typer.Exit(code)


def _print_noise_floor(results_dir: Path) -> None:
    """This machine's noise floor, where the results hold a calibration (``detprof sweep --calibrate``).

    A change of overhead smaller than the floor is within what an A/A measurement here
    produces by itself: a reader of the verdicts should know the floor.
    """
    from detprof.analysis.overhead import noise_floors
    from detprof.formatting import floor
    from detprof.store import find_studies

    studies = find_studies(results_dir)
    calibrations = [s for s in studies if s.kind == "calibration"]
    if not calibrations:
        sweeps = [s for s in studies if s.kind == "sweep"]
        how = f": {_calibration(sweeps[0], results_dir)}, into the same folder" if sweeps else ""
        typer.echo(f"noise floor: not measured here{how}")
        return
    floors = noise_floors(calibrations[0].records())
    shown = ", ".join(f"{model} {floor(value)}" for model, value in sorted(floors.items()))
    typer.echo(f"noise floor (A/A, {calibrations[0].dir}): {shown}")


def _calibration(sweep: ResultsStore, results_dir: Path) -> str:
    """The calibration of the checked sweep's models, as the report suggests it (``headline.calibration_advice``)."""
    from detprof.records import backend_of
    from detprof.reports.headline import calibration_advice, fleet_options
    from detprof.reports.report_data import model_given

    first: dict[str, dict[str, Any]] = {}
    for record in sweep.records():
        first.setdefault(record["model"], record)
    givens = [model_given(record) for record in first.values()]
    backend = backend_of(next(iter(first.values())))
    manifest = sweep.manifest()
    fleet = fleet_options(str(manifest.get("command") or ""))
    return calibration_advice(givens, backend, manifest.get("config") or {}, results_dir, fleet)


def _report(
    comparison: Comparison | None,
    env: EnvironmentCheck,
    *,
    strict: bool,
    title: str,
    junit: Path | None,
    github: bool,
) -> None:
    import os

    from detprof.check import ci_outputs
    from detprof.check.regression import severity

    ci_outputs.print_console(comparison, env, strict=strict, title=title)
    if env.differences and env.allowed:
        fields = ", ".join(d.field for d in env.differences)
        typer.echo(f"detprof: warning: environment differs from the baseline ({fields}); compared", err=True)
    if comparison is not None:
        for result in comparison.results:
            if severity(result, strict=strict) == "warning":
                typer.echo(f"detprof: warning: {ci_outputs.describe(result, comparison.threshold)}", err=True)
    if junit is not None:
        _write(junit, ci_outputs.junit_xml(comparison, env, strict=strict))
    if github:
        for line in ci_outputs.github_annotations(comparison, env, strict=strict):
            typer.echo(line)
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary:
            try:
                with open(summary, "a", encoding="utf-8") as fh:
                    fh.write(ci_outputs.github_summary(comparison, env, strict=strict))
            except OSError as exc:
                raise output_failure(exc, f"cannot append the step summary to {summary}") from exc
        else:
            typer.echo("detprof: note: GITHUB_STEP_SUMMARY is not set; no step summary written", err=True)


def _write_json(bmf: Path | None, benchmark_json: Path | None, comparison: Comparison) -> None:
    from detprof.check import ci_outputs

    if bmf is not None:
        _write(bmf, _json_bytes(ci_outputs.bmf_document(comparison)))
    if benchmark_json is not None:
        _write(benchmark_json, _json_bytes(ci_outputs.benchmark_json(comparison)))


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, allow_nan=False) + "\n").encode()


def _write(path: Path, data: bytes) -> None:
    """Written to a temporary name and renamed, so CI never uploads half a file."""
    write_output(path, data, "the file")
