"""What ``detprof check`` tells CI systems: a console table, JUnit XML, GitHub, Bencher, benchmark JSON.

Every output is built from the same ``Comparison`` and the same severity policy
(``regression.severity``), so the console, the JUnit file, the annotations and the exit
code always agree. GitHub workflow commands are parsed from stdout line by line: a
message containing a newline or ``%`` would end or corrupt the command, and ``:`` or
``,`` in a property would end the property, so every piece of data is escaped the way
the Actions runner unescapes it.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from typing import Any

from rich.markup import escape
from rich.table import Table

from detprof.check.baseline_file import EnvironmentCheck
from detprof.check.regression import Comparison, ModelComparison, Verdict, severity
from detprof.console import print_table, table_console
from detprof.intervals import SETTLE_LIMIT, paired_t

MEASURE = "determinism-overhead"
CLASSNAME = "detprof.determinism-overhead"
TABLE_COLUMNS = ("Model", "Verdict", "Gate", "n base/cur", "Baseline", "Current", "Change", "Interval", "Note")
# The console prints the notes below its table, where a long one stays readable.
CONSOLE_COLUMNS = TABLE_COLUMNS[:-1]
MAX_ANNOTATIONS = 10
METRIC_NAMES = {"kernel": "kernel time", "wall": "wall time"}
VERDICT_STYLES = {
    Verdict.REGRESSED: "bold red",
    Verdict.FAILED: "bold red",
    Verdict.INCONCLUSIVE: "yellow",
    Verdict.MISSING_BASELINE: "yellow",
    Verdict.MISSING_CURRENT: "yellow",
    Verdict.IMPROVED: "green",
    Verdict.OK: "green",
    Verdict.UNSUPPORTED: "dim",
}


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def _interval(result: ModelComparison) -> str:
    if result.lower is None or result.upper is None:
        return "-"
    return f"[{result.lower:.3f}, {result.upper:.3f}]"


def _settle(result: ModelComparison) -> str:
    if result.repeats_to_settle is None:
        return f"more than {SETTLE_LIMIT} repeats per side would be needed to settle it"
    return f"about {result.repeats_to_settle} repeats per side would settle it"


def describe(result: ModelComparison, threshold: float) -> str:
    """One sentence per model, the same in every output."""
    up, down = 1.0 + threshold, 1.0 / (1.0 + threshold)
    if result.ratio is None:
        return f"{result.model}: {result.verdict.value}: {result.reason}"
    assert result.metric is not None and result.lower is not None and result.upper is not None
    head = (
        f"{result.model}: {result.verdict.value}: determinism overhead ({METRIC_NAMES[result.metric]}) "
        f"{_x(result.baseline_overhead)} -> {_x(result.current_overhead)}, change {result.ratio:.3f}x "
        f"{_interval(result)}"
    )
    if result.verdict == Verdict.REGRESSED:
        tail = f"lower bound {result.lower:.3f} > {up:.3f} (threshold +{threshold:.0%})"
    elif result.verdict == Verdict.IMPROVED:
        tail = f"upper bound {result.upper:.3f} < {down:.3f} (threshold -{threshold:.0%} on the log scale)"
    elif result.verdict == Verdict.INCONCLUSIVE:
        limit = up if result.direction == "regression" else down
        tail = (
            f"point estimate beyond {limit:.3f} but the interval crosses it (width {result.width:.3f}; "
            f"n = {result.n_baseline}/{result.n_current}); {_settle(result)}"
        )
    else:
        tail = f"within the threshold band ({down:.3f}, {up:.3f})"
    note = f"; {result.metric_note}" if result.metric_note else ""
    return f"{head}: {tail}{note}"


def method_line(comparison: Comparison) -> str:
    k = comparison.family_size
    return (
        f"Change = current overhead / baseline overhead (geometric means of det/default per repeat). "
        f"Bounds: one-sided Welch t (Welch-Satterthwaite df), Holm across {k} model{'s' if k != 1 else ''}, "
        f"family-wise error {comparison.alpha:.0%} per direction. Gate: kernel time where both sides "
        f"traced kernels, else wall time. REGRESSED above {1 + comparison.threshold:.3f}, "
        f"IMPROVED below {1 / (1 + comparison.threshold):.3f}."
    )


def environment_lines(env: EnvironmentCheck) -> list[str]:
    if not env.differences:
        return ["environment: same fingerprint as the baseline"]
    state = "accepted (--allow-env-change)" if env.allowed else "not comparable"
    header = f"environment differs from the baseline, {state}:"
    return [header, *(f"  {d.describe()}" for d in env.differences)]


def print_console(comparison: Comparison | None, env: EnvironmentCheck, *, strict: bool, title: str) -> None:
    console = table_console()
    console.print(escape(title))
    for line in environment_lines(env):
        console.print(escape(line), style=None if env.comparable else "bold red")
    if comparison is None:
        return
    table = Table(title="Determinism overhead vs baseline (deterministic / default)")
    for column in CONSOLE_COLUMNS:
        table.add_column(column, overflow="fold")
    notes = []
    for result in comparison.results:
        table.add_row(
            escape(result.model),
            f"[{VERDICT_STYLES[result.verdict]}]{result.verdict.value}[/]",
            result.metric or "-",
            f"{result.n_baseline}/{result.n_current}" if result.ratio is not None else "-",
            _x(result.baseline_overhead),
            _x(result.current_overhead),
            _x(result.ratio),
            _interval(result),
        )
        if _note(result):
            notes.append(f"{result.model}: {_note(result)}")
    print_table(console, table)
    for note in notes:
        console.print(escape(note))
    console.print(escape(method_line(comparison)))
    console.print(escape(summary_line(comparison, strict=strict)))


def _note(result: ModelComparison) -> str:
    parts = []
    if result.verdict == Verdict.INCONCLUSIVE:
        parts.append(f"width {result.width:.3f}; {_settle(result)}")
    if result.reason:
        parts.append(result.reason)
    if result.metric_note:
        parts.append(result.metric_note)
    if result.ratio is not None and min(result.n_baseline, result.n_current) < 3:
        parts.append("only 2 repeats: valid but wide")
    precision = result.precision
    if precision is not None and not precision.settled and precision.half_width is not None:
        parts.append(f"current results +/-{precision.half_width:.1%}, not within the +/-{precision.target:.1%} asked")
    return "; ".join(parts)


def summary_line(comparison: Comparison, *, strict: bool) -> str:
    counts: dict[str, int] = {}
    for result in comparison.results:
        counts[result.verdict.value] = counts.get(result.verdict.value, 0) + 1
    tally = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
    mode = " (strict)" if strict else ""
    return f"detprof check{mode}: {tally}"


def junit_xml(comparison: Comparison | None, env: EnvironmentCheck, *, strict: bool) -> bytes:
    """One test case per model; the environment check is one more when the fingerprints differ."""
    suite = ET.Element("testsuite", name=CLASSNAME)
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if env.differences:
        case = ET.SubElement(suite, "testcase", classname="detprof.check", name="environment", time="0")
        text = "\n".join(d.describe() for d in env.differences)
        counts["tests"] += 1
        if env.allowed:
            ET.SubElement(case, "system-out").text = "accepted with --allow-env-change:\n" + text
        else:
            message = "environment differs from the baseline"
            ET.SubElement(case, "error", message=message, type="INCOMPARABLE").text = text
            counts["errors"] += 1
    if comparison is not None:
        props = ET.SubElement(suite, "properties")
        for name, value in (
            ("threshold", comparison.threshold),
            ("confidence", comparison.confidence),
            ("holm_family_size", comparison.family_size),
            ("strict", strict),
        ):
            ET.SubElement(props, "property", name=name, value=str(value))
        for result in comparison.results:
            counts["tests"] += 1
            _junit_case(suite, result, comparison.threshold, strict, counts)
    for key, value in counts.items():
        suite.set(key, str(value))
    root = ET.Element("testsuites", name="detprof check", **{k: str(v) for k, v in counts.items()})
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def _junit_case(
    suite: ET.Element, result: ModelComparison, threshold: float, strict: bool, counts: dict[str, int]
) -> None:
    case = ET.SubElement(suite, "testcase", classname=CLASSNAME, name=result.model, time="0")
    if result.precision is not None:
        properties = ET.SubElement(case, "properties")
        for name, value in _precision(result).items():
            ET.SubElement(properties, "property", name=f"precision_{name}", value=_plain(value))
    message = describe(result, threshold)
    level = severity(result, strict=strict)
    if level == "failure":
        ET.SubElement(case, "failure", message=message, type=result.verdict.value).text = _details(result)
        counts["failures"] += 1
    elif level == "error":
        ET.SubElement(case, "error", message=message, type=result.verdict.value).text = _details(result)
        counts["errors"] += 1
    elif level == "skipped":
        ET.SubElement(case, "skipped", message=message)
        counts["skipped"] += 1
    else:
        ET.SubElement(case, "system-out").text = message


def _details(result: ModelComparison) -> str:
    fields = (
        "verdict",
        "metric",
        "ratio",
        "lower",
        "upper",
        "lower_level",
        "upper_level",
        "p_regression",
        "p_regression_holm",
        "p_improvement",
        "p_improvement_holm",
        "df",
        "log_se",
        "n_baseline",
        "n_current",
        "repeats_to_settle",
        "reason",
    )
    return "\n".join(f"{name}: {_plain(getattr(result, name))}" for name in fields)


def _precision(result: ModelComparison) -> dict[str, Any]:
    """The current results' precision fields (``PrecisionReached``), where their sweep asked a precision."""
    return {} if result.precision is None else result.precision.as_json()


def _plain(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, Verdict):
        return value.value
    return str(value)


def escape_data(text: str) -> str:
    """Escape a workflow command's message as the Actions runner unescapes it."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """Escape a workflow command property value (title=...), where ':' and ',' are separators."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def workflow_command(kind: str, title: str, message: str) -> str:
    return f"::{kind} title={escape_property(title)}::{escape_data(message)}"


def github_annotations(comparison: Comparison | None, env: EnvironmentCheck, *, strict: bool) -> list[str]:
    """``::error``/``::warning`` lines, at most MAX_ANNOTATIONS of each (the rest are in the summary)."""
    errors: list[tuple[str, str]] = []
    warnings: list[tuple[str, str]] = []
    if env.differences:
        text = "; ".join(d.describe() for d in env.differences)
        if env.allowed:
            warnings.append(("detprof check: environment changed (allowed)", text))
        else:
            errors.append(("detprof check: environment differs from the baseline", text))
    if comparison is not None:
        for result in comparison.results:
            level = severity(result, strict=strict)
            title = f"detprof check: {result.model} {result.verdict.value}"
            entry = (title, describe(result, comparison.threshold))
            if level in ("failure", "error"):
                errors.append(entry)
            elif level == "warning":
                warnings.append(entry)
    return [*_capped("error", errors), *_capped("warning", warnings)]


def _capped(kind: str, entries: Sequence[tuple[str, str]]) -> Iterable[str]:
    if len(entries) <= MAX_ANNOTATIONS:
        shown, rest = list(entries), 0
    else:
        shown, rest = list(entries[: MAX_ANNOTATIONS - 1]), len(entries) - (MAX_ANNOTATIONS - 1)
    lines = [workflow_command(kind, title, message) for title, message in shown]
    if rest:
        lines.append(workflow_command(kind, f"detprof check: {rest} more", f"{rest} more {kind}s: see the job summary"))
    return lines


def github_summary(comparison: Comparison | None, env: EnvironmentCheck, *, strict: bool) -> str:
    """A Markdown section for ``$GITHUB_STEP_SUMMARY``, escaped like the report's (GitHub renders HTML in it)."""
    from detprof.reports.markdown import md, strong, table

    lines = ["## detprof check: cost of determinism vs baseline", ""]
    lines += [f"- {md(line)}" for line in environment_lines(env)]
    if comparison is not None:
        rows = [
            [
                r.model,
                strong(r.verdict.value) if severity(r, strict=strict) in ("failure", "error") else r.verdict.value,
                METRIC_NAMES[r.metric] if r.metric else "-",
                f"{r.n_baseline}/{r.n_current}" if r.ratio is not None else "-",
                _x(r.baseline_overhead),
                _x(r.current_overhead),
                _x(r.ratio),
                _interval(r),
                _note(r),
            ]
            for r in comparison.results
        ]
        lines += ["", table(TABLE_COLUMNS, rows)]
        lines += ["", md(method_line(comparison)), "", md(summary_line(comparison, strict=strict))]
    return "\n".join(lines) + "\n"


def _current_interval(result: ModelComparison, confidence: float) -> tuple[float, float, float] | None:
    overhead = paired_t(result.current_log_ratios, confidence)
    if overhead is None or math.isnan(overhead.ci_low):
        return None
    return overhead.ratio, overhead.ci_low, overhead.ci_high


def bmf_document(comparison: Comparison) -> dict[str, dict[str, dict[str, float]]]:
    """Bencher Metric Format: the current overhead per model with its two-sided t-interval.

    Bencher keeps the history and runs its own thresholds, so the measure is the overhead
    itself (deterministic / default), not the change against this baseline.
    """
    document = {}
    for result in comparison.results:
        interval = _current_interval(result, comparison.confidence)
        if interval is not None:
            value, low, high = interval
            document[result.model] = {MEASURE: {"value": value, "lower_value": low, "upper_value": high}}
    return document


def benchmark_json(comparison: Comparison) -> list[dict[str, Any]]:
    """github-action-benchmark ``customSmallerIsBetter`` entries, one per measured model."""
    entries = []
    for result in comparison.results:
        interval = _current_interval(result, comparison.confidence)
        if interval is None or result.metric is None:
            continue
        value, low, high = interval
        entries.append(
            {
                "name": f"{result.model} determinism overhead",
                "unit": "x (deterministic/default)",
                "value": value,
                "range": f"{low:.4f} to {high:.4f} ({comparison.confidence:.0%} CI)",
                "extra": f"{METRIC_NAMES[result.metric]}, {result.n_current} repeats; "
                + describe(result, comparison.threshold),
            }
            | ({"precision": _precision(result)} if result.precision is not None else {})
        )
    return entries
