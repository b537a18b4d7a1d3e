"""The report's headline tables as GitHub-flavoured Markdown, for pull-request comments.

Only the numbers a reviewer acts on, the answer first: the same headline rows as the HTML's
first screen (cost, verdict, what it buys, noise floor, what to do) with the same caveats
and notes, then overheads per model and device, the published figures they can be held
against, one sentence per model on where the cost comes from, the stability headline, the
trade-off readings and the warnings. Where the results hold several Keras backends (or one
that is not TensorFlow), the headline table has a backend column, with each model's
backends in adjacent rows, and each device with backends side by side gets a table of its
own; the last section always says which backend(s) ran. GitHub renders inline
HTML, so text from results (kernel names with ``<``, ``>``, ``&``) is backslash-escaped
and a ``|`` cannot end a table cell early.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from detprof import formatting as f
from detprof.intervals import CHEAP_OVERHEAD
from detprof.reports.headline import HeadlineRow, published_reference, shown_caveats
from detprof.reports.provenance import backend_order
from detprof.reports.published import PUBLISHED_GPUS, SOURCE
from detprof.reports.report_data import NOISE_FLOOR_LEAD, NOISE_FLOOR_TITLE, SECTIONS, ModelCost, Report
from detprof.reports.tradeoff import NOISY_CHURN

_SPECIAL = re.compile(r"([\\`*_\[\]<>|&~])")


class Markup(str):
    """Text that is Markdown already (built from escaped pieces): ``table`` keeps it as it is."""


def md(value: Any) -> str:
    """Text that GitHub shows literally: Markdown and HTML punctuation escaped, one line."""
    if isinstance(value, Markup):
        return value
    return _SPECIAL.sub(r"\\\1", " ".join(str(value).split()))


def strong(value: Any) -> Markup:
    return Markup(f"**{md(value)}**")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(md(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(md(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _absent(line: str) -> str:
    return f"_{md(line)}_"


def _buys(r: HeadlineRow) -> tuple[str, str]:
    if r.stability is None:
        return "no stability study", f.DASH
    if not r.stability.used:
        return "did not learn (left out)", f.DASH
    noise = r.stability.noise
    drop = f.DASH
    if noise.std_drop is not None:
        drop = f"{noise.std_drop * 100:+.2f} pp" + (
            f" +/- {noise.std_drop_se * 100:.2f}" if noise.std_drop_se is not None else ""
        )
    return f.percent(noise.churn_impl, 2), drop


def _floor(r: HeadlineRow) -> str:
    if r.noise_floor is not None:
        return f.floor(r.noise_floor)
    return "not in the calibration" if r.calibrated else "not run"


def answer(report: Report) -> list[str]:
    """The same rows, verdicts, caveats and notes as the HTML's first screen."""
    out = [f"## {SECTIONS['answer']}", ""]
    if "answer" in report.absent:
        return [*out, _absent(report.absent["answer"]), "", *noise_floor(report)]
    out += [
        f"Cheap: the whole 95% CI of the overhead is at or below {CHEAP_OVERHEAD:.2f}x; expensive: above it; "
        "otherwise not settled.",
        "",
    ]
    named = report.names_backend
    rows = []
    for r in report.headline:
        churn, drop = _buys(r)
        v = r.verdict
        rows.append(
            [
                r.device,
                r.model,
                *([r.backend] if named else []),
                f.ratio(r.kernel),
                f.ratio(r.wall),
                strong(v.text) if v.reading is not None else v.text,
                churn,
                drop,
                _floor(r),
                r.advice,
            ]
        )
    headers = [
        "Device",
        "Model",
        *(["Backend"] if named else []),
        "Kernel time",
        "Wall time",
        "Verdict",
        "Churn under impl",
        "Accuracy std drop",
        "Noise floor",
        "What to do",
    ]
    out += [table(headers, rows), ""]
    cpu = bool(report.cpu_notes)
    notes = [*report.cpu_notes, *report.notes]
    for r in report.headline:
        lines = shown_caveats(r, cpu_note=cpu, left_out_note=True)
        if lines:
            notes.append(Markup(f"**{md(r.model)}** on {md(report.where(r.device, r.backend))}: {md(' '.join(lines))}"))
    out += [f"- {md(n)}" for n in notes]
    if notes:
        out.append("")
    if cpu:
        out += [
            f"Published GPU reference ({SOURCE}), deterministic / default GPU time:",
            "",
            table(["GPU", "What", "Published"], published_reference()),
            "",
        ]
    return out


def noise_floor(report: Report) -> list[str]:
    """The calibrations' A/A table, as the HTML shows it."""
    if not report.calibrations:
        return []
    rows = [[r.device, r.model, f.ratio(r.kernel), f.ratio(r.wall), f.floor(r.floor)] for r in report.noise_floors]
    headers = ["Device", "Model", "Kernel time", "Wall time", "Smallest resolvable overhead"]
    return [f"### {NOISE_FLOOR_TITLE}", "", NOISE_FLOOR_LEAD, "", table(headers, rows), ""]


def backends_side_by_side(report: Report) -> list[str]:
    """Per device label swept on several backends: one table, a column per backend, of the overhead verdicts read."""
    by_label: dict[str, dict[str, dict[str, ModelCost]]] = {}
    for s in report.sweeps:
        by_label.setdefault(s.label, {}).setdefault(s.backend, {m.model: m for m in s.models})
    out = []
    for label, by_backend in by_label.items():
        if len(by_backend) < 2:
            continue
        backends = backend_order(by_backend)
        models = list(dict.fromkeys(m for b in backends for m in by_backend[b]))
        rows = [[model, *(_headline(by_backend[b].get(model)) for b in backends)] for model in models]
        out += [f"### Keras backends side by side on {md(label)}", ""]
        out += [table(["Model", *(f"{b} ({report.framework(b)})" for b in backends)], rows), ""]
    return out


def _headline(m: ModelCost | None) -> str:
    """The overhead a verdict reads (kernel time where traced, else wall time), saying which."""
    if m is None:
        return "not swept"
    if m.headline is None:
        return "not supported" if m.unsupported_reason else "no result"
    return f"{f.ratio(m.headline)} ({m.headline_metric})"


def render(report: Report) -> str:
    out = [
        "# detprof: what deterministic training costs, and what it buys",
        "",
        *answer(report),
        f"## {SECTIONS['overhead']}",
        "",
    ]
    if "overhead" in report.absent:
        out += [_absent(report.absent["overhead"]), ""]
    out += backends_side_by_side(report)
    for s in report.sweeps:
        out += [f"### {md(report.where(s.label, s.backend))}: {md(s.device.get('name') or '')}", ""]
        out += [table(["Model", "Kernel time", "Wall time", "Repeats", "Note"], s.overhead_rows()), ""]
        out += [md(s.timing), ""]
    matched = [r for r in report.references if r.device is not None]
    if matched:
        out += [
            f"Published figures ({SOURCE}), relative GPU time:",
            "",
            table(
                ["GPU", "What", "Published", "Measured here", "Device"],
                [[r.figure.gpu.upper(), r.figure.subject, r.figure.published, r.measured, r.device] for r in matched],
            ),
            "",
        ]
    elif report.sweeps and not report.cpu_notes:
        gpus = ", ".join(gpu.upper() for gpu in PUBLISHED_GPUS)
        out += [_absent(f"No measured device is a GPU with published figures ({gpus})."), ""]
    out += [f"## {SECTIONS['cost']}", ""]
    if "cost" in report.absent:
        out += [_absent(report.absent["cost"]), ""]
    else:
        out += [
            f"- **{md(m.model)}** on {md(report.where(s.label, s.backend))}: {md(m.attribution or m.no_kernels or '')}"
            for s in report.sweeps
            for m in s.models
        ]
        out.append("")
    out += [f"## {SECTIONS['stability']}", ""]
    if "stability" in report.absent:
        out += [_absent(report.absent["stability"]), ""]
    for st in report.stability:
        out += [f"### {md(st.model)} on {md(st.dataset)}, {md(report.where(st.device, st.backend))}", ""]
        if not st.learned:
            out += [f"**Did not learn**, left out of the verdicts: {md(st.learning.line())}.", ""]
        rows = [
            [
                v.get("variant"),
                "on" if v.get("mode") == "deterministic" else "off",
                f.plus_minus(v.get("accuracy")),
                f.number(v.get("churn")),
                f.number(v.get("l2")),
                f.BADGE_LABELS[f.check_line(v.get("determinism_check"))[0]],
            ]
            for v in st.variants
        ]
        out += [
            table(["Variant", "Determinism", "Accuracy std +/- s.e.", "Churn", "L2", "Determinism check"], rows),
            "",
        ]
    out += [f"## {SECTIONS['tradeoff']}", ""]
    if "tradeoff" in report.absent:
        out += [_absent(report.absent["tradeoff"]), ""]
    else:
        out += [
            f"Cheap: up to {CHEAP_OVERHEAD:.2f}x; worth removing: churn under impl from {NOISY_CHURN:.0%}.",
            "",
            table(
                ["Model", "Device", "Overhead", "Churn under impl", "Reading"],
                [
                    [
                        p.model,
                        report.where(p.device, p.backend),
                        f.ratio(p.cost.overhead),
                        f.percent(p.noise.churn_impl, 2),
                        p.reading,
                    ]
                    for p in report.tradeoff
                ],
            ),
            "",
        ]
    if "answer" not in report.absent:
        out += noise_floor(report)
    out += ["## Warnings", ""]
    out += [f"- {md(w)}" for w in report.warnings] or ["None."]
    out += ["", f"## {SECTIONS['provenance']}", ""]
    out += [f"Generated {md(report.generated_at)} from {md(', '.join(str(p) for p in report.sources))}.", ""]
    if report.backend_line():
        out += [md(report.backend_line()), ""]
    out += ["```sh", *report.commands, "```", ""]
    return "\n".join(out)
