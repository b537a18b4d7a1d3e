"""``detprof baseline`` and ``detprof check``: fail CI when determinism gets more expensive.

The statistics live in ``detprof.check.regression``, the file format and fingerprint in
``detprof.check.baseline_file`` and the outputs in ``detprof.check.ci_outputs``; this
module only reads options, wires them together and maps the outcome to an exit code.
Imports happen inside the commands so that ``detprof --help`` stays fast.

``check --run`` measures afresh with the baseline's own sweep configuration unless an
option overrides it: re-measuring what the baseline measured is the only comparison that
needs no ``--allow-env-change``. It always runs the baseline's Keras backend: a check
compares a backend with itself, so results of another backend are refused in one line
(exit 3), and so is ``--backend`` naming another.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from detprof.errors import ExitCode, InputError, UsageError
from detprof.options import CHECK_RUN, ModelsOption, RunOptions, with_run_options
from detprof.store import atomic_write_bytes

if TYPE_CHECKING:
    from detprof.check.baseline_file import Baseline, EnvironmentCheck
    from detprof.check.regression import Comparison

FLAGS = ("force", "compile")
"""The on/off options ``check --run`` passes on: given when on (off is also what not giving them means)."""

CHECK_HELP = (
    "Compare each model's determinism overhead with a baseline; fail on a regression.\n\n"
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
    "--allow-env-change overrides with a warning), unusable input, an output that cannot be written, or a "
    "measurement that failed; 70 an internal error (a bug in detprof, never a regression)."
)


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
        float, typer.Option(help="Tolerated rise of the overhead, as a fraction (0.10 = 10%).")
    ] = 0.10,
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
    """Compare each model's determinism overhead with the baseline's (help: CHECK_HELP)."""
    from detprof.check.baseline_file import (
        check_environment,
        fingerprint,
        read_baseline,
        read_sweep,
        refuse_other_backend,
    )
    from detprof.check.regression import compare

    if baseline_file is None:
        raise UsageError("detprof check needs --baseline FILE (written by detprof baseline)")
    if (current is None) == (not run):
        raise UsageError("give exactly one of --current RESULTS_DIR or --run")
    if len(options.gpus) > 1:
        raise UsageError("a check compares one GPU type with its baseline: give --gpu once (with --ray too)")
    given = {"out": out, "models": models} | {n: getattr(options, n) for n in CHECK_RUN if n not in FLAGS}
    flags = [n for n in FLAGS if getattr(options, n)]
    if not run and (flags or any(v is not None for v in given.values())):
        used = sorted([*(k.replace("_", "-") for k, v in given.items() if v is not None), *flags])
        raise UsageError(f"--{', --'.join(used)} only apply with --run")
    if not threshold > 0:
        raise UsageError(f"--threshold must be a positive fraction (0.10 = 10%), not {threshold}")
    if not 0.5 < confidence < 1:
        raise UsageError(f"--confidence must lie between 0.5 and 1 (exclusive), not {confidence}")

    reference = read_baseline(baseline_file)
    if run and options.backend not in (None, reference.backend):
        raise InputError(
            f"--backend {options.backend}: the baseline {baseline_file} ran on {reference.backend}, and overheads "
            "of different Keras backends are never comparable; check --run runs the baseline's backend by itself"
        )
    results_dir = current if current is not None else _run_sweep(reference, options, models, out)
    sweep = read_sweep(results_dir)
    measured = fingerprint(sweep.config, sweep.records)
    refuse_other_backend(reference, results_dir, measured["backend"])
    env = check_environment(reference.fingerprint, measured, allow=allow_env_change)
    title = f"detprof check: {baseline_file} vs {results_dir}"
    if not env.comparable:
        _report(None, env, strict=strict, title=title, junit=junit, github=github)
        fields = ", ".join(d.field for d in env.differences)
        raise InputError(
            f"environment differs from the baseline ({fields}): overheads are not comparable; "
            "rebuild the baseline here, or pass --allow-env-change",
        )
    current_samples = sweep.samples()
    known = set(reference.samples()) | set(reference.unsupported)
    if not known & current_samples.models:
        raise InputError(
            f"no model in common: the baseline has {', '.join(sorted(known))}; "
            f"{results_dir} has {', '.join(sorted(current_samples.models))}"
        )
    comparison = compare(
        reference.samples(),
        current_samples,
        threshold=threshold,
        confidence=confidence,
        baseline_unsupported=reference.unsupported,
    )
    _report(comparison, env, strict=strict, title=title, junit=junit, github=github)
    _print_noise_floor(results_dir)
    _write_json(bmf, benchmark_json, comparison)
    code = exit_code(comparison, env, strict=strict)
    if code:
        raise typer.Exit(code)


def _print_noise_floor(results_dir: Path) -> None:
    """This machine's noise floor, where the results hold a calibration (``detprof sweep --calibrate``).

    A change of overhead smaller than the floor is within what an A/A measurement here
    produces by itself: a reader of the verdicts should know the floor.
    """
    from detprof.formatting import floor
    from detprof.profiler.overhead import noise_floors
    from detprof.store import find_studies

    calibrations = [s for s in find_studies(results_dir) if s.kind == "calibration"]
    if not calibrations:
        typer.echo("noise floor: not measured here (run `detprof sweep --calibrate --out` into the same folder)")
        return
    floors = noise_floors(calibrations[0].records())
    shown = ", ".join(f"{model} {floor(value)}" for model, value in sorted(floors.items()))
    typer.echo(f"noise floor (A/A, {calibrations[0].dir}): {shown}")


def exit_code(comparison: Comparison, env: EnvironmentCheck, *, strict: bool) -> ExitCode:
    """3 if not comparable; 1 on a regression; 3 if a measurement failed; 1 on what --strict fails."""
    from detprof.check.regression import Verdict, severity

    if not env.comparable:
        return ExitCode.INPUT
    if comparison.having(Verdict.REGRESSED):
        return ExitCode.CHECK_FAILED
    levels = {severity(r, strict=strict) for r in comparison.results}
    if "error" in levels:
        return ExitCode.INPUT
    if "failure" in levels:
        return ExitCode.CHECK_FAILED
    return ExitCode.OK


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
                reason = exc.strerror or exc
                raise InputError(f"{summary}: cannot append the step summary ({reason})") from exc
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
    """Written to a temporary name and renamed, so CI never uploads half a file; like every output, exit 3."""
    try:
        atomic_write_bytes(path, data)
    except OSError as exc:
        raise InputError(f"{path}: cannot write ({exc.strerror or exc})") from exc


def _run_sweep(reference: Baseline, given: RunOptions, models: str | None, out: Path | None) -> Path:
    """The sweep with the baseline's configuration and backend, the options given overriding the configuration;
    returns its results folder."""
    from detprof.sweep.command import run_sweep
    from detprof.sweep.plan import SweepRequest, split_models

    config = reference.config
    if config.get("program") is not None:
        return _run_program_sweep(reference, given, models, out)
    fixed = ("gpu", "backend", *FLAGS)
    options = _replayed(
        reference,
        given,
        [n for n in CHECK_RUN if n not in fixed],
        out,
        compile=bool(config.get("compile")) or given.compile,
        preset=config.get("preset"),
    )
    return run_sweep(SweepRequest(split_models(models) or tuple(config.get("models") or ()) or None, options))


def _run_program_sweep(reference: Baseline, given: RunOptions, models: str | None, out: Path | None) -> Path:
    """The baseline's training program (``sweep --command``) measured again as it was: its command, name,
    backend, tracer and repeats, the options given that a program takes overriding them."""
    from detprof.profiler.program.plan import ProgramRequest
    from detprof.sweep.command import PROGRAM_OPTIONS, refuse_for_programs, run_program_sweep

    program = reference.config["program"]
    if models:
        raise UsageError(f"--models: the baseline measured the program {program['name']!r}, not models")
    refuse_for_programs(given, [])
    options = _replayed(reference, given, [n for n in PROGRAM_OPTIONS if n != "backend"], out)
    return run_program_sweep(ProgramRequest(program["command"], program["name"], options), report=False)


def _replayed(reference: Baseline, given: RunOptions, names: list[str], out: Path | None, **fixed: Any) -> RunOptions:
    """The options the baseline was measured with: its GPU label and its configuration's values of ``names``, each
    overridden by an option given; its backend, ``fixed``, and a results folder of its own unless ``out``."""
    import dataclasses
    import datetime as dt

    config = reference.config
    baseline = {"gpu": config.get("gpu_label")} | {n: config[n] for n in names if n in config}
    overrides = {n: getattr(given, n) for n in baseline if getattr(given, n) is not None}
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return dataclasses.replace(
        given,
        **(baseline | overrides),
        backend=reference.backend,
        out=out or Path("results") / f"check-{stamp}",
        resume=False,
        **fixed,
    )
