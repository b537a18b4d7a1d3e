"""The report's headline tables as GitHub-flavoured Markdown, for pull-request comments.

Only the numbers a reviewer acts on, the answer first: the same headline rows as the HTML's
first screen (cost, verdict, what it buys, noise floor, what to do) with the same caveats and
notes, then overheads per model and device, the published figures they can be held against, one
sentence per model on where the cost comes from and its layer and op leaderboards, the
stability headline, the trade-off readings and the warnings. Where the results hold several
Keras backends (or one that is not TensorFlow), the headline table has a backend column, with
each model's backends in adjacent rows, and each device with backends side by side gets a table
of its own; the last section always says which backend(s) ran. Where a ``detprof verify`` study
is among the results, whether determinism held is a column of the headline (or a table of its
own for models no sweep measured) and a section says where each mode's runs part. Where a
``detprof sweep --knobs`` study is, each model's advice on which switch to turn off joins the
answer and a section prices every switch, table by table. Every cell the HTML shows too is
worded by ``cells``: this module adds only Markdown's emphasis and escaping. GitHub renders
inline HTML, so text from results (kernel names with ``<``, ``>``, ``&``) is backslash-escaped
and a ``|`` cannot end a table cell early.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from detprof.analysis import layers
from detprof.analysis.knobs import helper_lines
from detprof.reports import cells
from detprof.reports.cells import Words
from detprof.reports.headline import published_reference
from detprof.reports.published import SOURCE
from detprof.reports.report_data import NOISE_FLOOR_LEAD, NOISE_FLOOR_TITLE, SECTIONS, Report

_SPECIAL = re.compile(r"([\\`*_\[\]<>|&~])")
_CODE = re.compile(r"(`[^`]+`)")
"""A command line the text names in backticks: an inline code span, whose text Markdown shows as it is."""


class Markup(str):
    """Text that is Markdown already (built from escaped pieces): ``table`` keeps it as it is."""


def md(value: Any) -> str:
    """Text that GitHub shows literally: Markdown and HTML punctuation escaped, one line (``Words.line``); a
    command in backticks as code, which needs no escape but a table's pipe (and shows one put there)."""
    if isinstance(value, Markup):
        return value
    if isinstance(value, Words):
        return Words(md(value.text), md(value.note)).line
    parts = _CODE.split(" ".join(str(value).split()))
    return "".join(p.replace("|", "\\|") if i % 2 else _SPECIAL.sub(r"\\\1", p) for i, p in enumerate(parts))


def strong(value: Any) -> Markup:
    """In bold; a cell's note stays beside its text, not in bold."""
    if isinstance(value, Words):
        return Markup(Words(strong(value.text), md(value.note)).line)
    return Markup(f"**{md(value)}**")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(md(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(md(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


VARIANT_HEADERS = ("Variant", "Determinism", "Accuracy std +/- s.e.", "Churn", "L2", "Determinism check")
"""The stability variants' columns a reviewer acts on (``cells.variant``)."""
TRADEOFF_HEADERS = ("Model", "Device", "Overhead", "Churn under impl", "Reading")
"""The trade-off table's columns (``cells.tradeoff``)."""


def _absent(line: str) -> str:
    return f"_{md(line)}_"


def verified_alone(report: Report) -> list[str]:
    """The HTML first screen's table of verified models no sweep measured, and their findings."""
    if not report.verified_alone:
        return []
    named = report.names_backend
    headers = ["Device", "Model", *(["Backend"] if named else []), *cells.VERIFIED_HEADERS]
    rows = []
    for study, v in report.verified_alone:
        c = cells.verified(study, v)
        answer = [c.answer[h] for h in cells.VERIFIED_HEADERS]
        rows.append([c.device, c.model, *([c.backend] if named else []), *answer])
    notes = [Markup(f"**{md(n.model)}** on {md(n.device)}: {md(n.text)}") for n in cells.verified_notes(report)]
    out = [f"### {md(cells.HOLDS)}", "", md(cells.verified_lead(report)), "", table(headers, rows), ""]
    if notes:
        out += [*(f"- {md(n)}" for n in notes), ""]
    return out


def answer(report: Report) -> list[str]:
    """The same rows, verdicts, caveats and notes as the HTML's first screen."""
    out = [f"## {SECTIONS['answer']}", ""]
    if "answer" in report.absent:
        return [
            *out,
            *verified_alone(report),
            *knobs_alone(report),
            _absent(report.absent["answer"]),
            "",
            *noise_floor(report),
        ]
    out += [
        f"Cheap: the whole 95% CI of the overhead is at or below {cells.CHEAP}; expensive: above it; "
        "otherwise not settled.",
        "",
    ]
    named, verified = report.names_backend, report.verified_headline
    if verified:
        out += [md(cells.HOLDS_LEAD), ""]
    rows = []
    for r in report.headline:
        c = cells.headline(r)
        rows.append(
            [
                c.device,
                c.model,
                *([c.backend] if named else []),
                *([cells.holds(r.verification)] if verified else []),
                c.kernel,
                c.wall,
                strong(c.verdict) if r.verdict.reading is not None else c.verdict,
                c.churn,
                c.drop,
                c.floor,
                c.advice,
            ]
        )
    headers = [
        "Device",
        "Model",
        *(["Backend"] if named else []),
        *([cells.HOLDS] if verified else []),
        "Kernel time",
        "Wall time",
        "Verdict",
        "Churn under impl",
        "Accuracy std drop",
        "Noise floor",
        "What to do",
    ]
    out += [table(headers, rows), ""]
    notes = [*report.cpu_notes, *report.notes]
    notes += [Markup(f"**{md(n.model)}** on {md(n.device)}: {md(n.text)}") for n in cells.row_notes(report)]
    notes += [
        Markup(f"**{md(n.model)}** on {md(n.device)}: {md(cells.KNOB_ADVICE)}: {md(n.text)}")
        for n in cells.knob_notes(report.knobs_beside_headline, report.where)
    ]
    out += [f"- {md(n)}" for n in notes]
    if notes:
        out.append("")
    if report.cpu_notes:
        out += [
            f"Published GPU reference ({SOURCE}), deterministic / default GPU time:",
            "",
            table(cells.REFERENCE_HEADERS, published_reference()),
            "",
        ]
        line = cells.gpu_reference_line(report.measured_on_gpus)
        out += [md(line), ""] if line else []
    return [*out, *verified_alone(report), *knobs_alone(report)]


def knobs_alone(report: Report) -> list[str]:
    """The HTML first screen's block of knob advice for models no headline row shows."""
    if not report.knobs_alone:
        return []
    notes = cells.knob_notes(report.knobs_alone, report.where)
    return [
        f"### {md(SECTIONS['knobs'])}",
        "",
        *(f"- **{md(n.model)}** on {md(n.device)}: {md(n.text)}" for n in notes),
        "",
    ]


def knobs(report: Report) -> list[str]:
    """Per model of a knob study, its total, what to do, each knob's table and how far the knobs explain the total;
    nothing without a knob study (the HTML's chart has no Markdown counterpart: the table holds its numbers)."""
    if not report.knobs:
        return []
    out = [f"## {SECTIONS['knobs']}", "", md(cells.KNOBS_LEAD), ""]
    for k in report.knobs:
        out += [f"### {md(cells.knobs_title(k, report.where(k.study.label, k.study.backend)))}", ""]
        out += [md(cells.knobs_total(k)) + ". " + md(cells.knobs_advice(k)), ""]
        rows = cells.columns((cells.knob_row(k, knob) for knob in k.knobs.knobs), cells.KNOB_HEADERS)
        out += [table(cells.KNOB_HEADERS, rows), ""]
        unexplained = k.knobs.unexplained_line()
        if unexplained is not None:
            out += [md(unexplained), ""]
        out += [f"- {md(line)}" for line in helper_lines(k.knobs)] + ([""] if k.knobs.helpers else [])
    return out


def verification(report: Report) -> list[str]:
    """Where each verified model's runs part, mode by mode; nothing without a verification study (the HTML's
    plot of how the default runs' difference grows has no Markdown counterpart: its first difference says where)."""
    if not report.verifications:
        return []
    out = [f"## {SECTIONS['verification']}", "", md(cells.VERIFICATION_LEAD), ""]
    for study in report.verifications:
        shown = report.where(study.label, study.backend)
        for v in study.models:
            out += [f"### {md(cells.verification_title(v, shown))}", ""]
            out += [f"- {md(line)}" for line in cells.verification_lines(v)]
            out.append("")
    return out


def noise_floor(report: Report) -> list[str]:
    """The calibrations' A/A table, as the HTML shows it."""
    if not report.calibrations:
        return []
    floors = table(cells.NOISE_FLOOR_HEADERS, cells.noise_floor_rows(report))
    return [f"### {NOISE_FLOOR_TITLE}", "", NOISE_FLOOR_LEAD, "", floors, ""]


def backends_side_by_side(report: Report) -> list[str]:
    """Per device label swept on several backends: one table, a column per backend, of the overhead verdicts read."""
    out = []
    for b in cells.side_by_side(report):
        out += [f"### Keras backends side by side on {md(b.title)}", "", table(b.headers, b.rows), ""]
    return out


def leaderboards(report: Report) -> list[str]:
    """Per swept model whose traces name its layers, the top layers and ops by time determinism adds, as the HTML's
    tables (its bar chart and the kernels under each layer have no Markdown counterpart)."""
    out: list[str] = []
    for s in report.sweeps:
        for m in s.models:
            parts = report.parts_of(s, m)
            if parts is None:
                continue
            out += [f"### {md(m.model)} on {md(report.where(s.label, s.backend))}: {parts.part}s and ops", ""]
            for what, found in ((parts.part.capitalize(), parts.layers), ("Op", parts.ops)):
                out += [table([what, *cells.PART_HEADERS], [cells.part(p) for p in found[: layers.TOP_N]]), ""]
            out += [md(cells.unattributed_line(parts)), ""]
    return [md(cells.PARTS_LEAD), "", *out] if out else []


def on_gpus(report: Report) -> list[str]:
    """What detprof measured on GPUs, each run a table, then the paper's published figures."""
    out = [f"## {SECTIONS['on-gpus']}", "", md(cells.GPU_REFERENCE_LEAD), ""]
    for run in cells.gpu_reference_tables(report.measured_on_gpus):
        out += [f"### {md(run.title)}", "", table(run.headers, run.rows), "", md(run.versions), ""]
    if not report.measured_on_gpus:
        out += [_absent("This installation of detprof ships no GPU measurements."), ""]
    out += [
        f"Published ({SOURCE}), deterministic / default GPU time:",
        "",
        table(cells.REFERENCE_HEADERS, published_reference()),
        "",
    ]
    return out


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
        out += [f"### {md(cells.device_title(report.where(s.label, s.backend), s.device))}", ""]
        out += [table(*cells.overhead_table(s)), ""]
        out += [md(s.timing), ""]
        if (memory := cells.memory_note(s)) is not None:
            out += [md(memory), ""]
    matched = cells.matched_references(report)
    if matched:
        out += [
            f"Published figures ({SOURCE}), relative GPU time:",
            "",
            table([*cells.REFERENCE_HEADERS, "Measured here", "Device"], [cells.reference(r) for r in matched]),
            "",
        ]
    elif "references" in report.absent and not report.cpu_notes:
        out += [_absent(report.absent["references"]), ""]
    out += on_gpus(report)
    out += [f"## {SECTIONS['cost']}", ""]
    if "cost" in report.absent:
        out += [_absent(report.absent["cost"]), ""]
    else:
        out += [
            f"- **{md(m.model)}** on {md(report.where(s.label, s.backend))}: {md(cells.cost_summary(m))}"
            for s in report.sweeps
            for m in s.models
        ]
        out.append("")
        out += leaderboards(report)
    out += knobs(report)
    out += verification(report)
    out += [f"## {SECTIONS['stability']}", ""]
    if "stability" in report.absent:
        out += [_absent(report.absent["stability"]), ""]
    for st in report.stability:
        out += [f"### {md(cells.stability_title(st, report.where(st.label, st.backend)))}", ""]
        if not st.learned:
            longer = f"; {md(st.longer_training)}" if st.longer_training else ""
            out += [f"**Did not learn**, left out of the verdicts: {md(st.learning.line())}{longer}.", ""]
        rows = cells.columns((cells.variant(v) for v in st.variants), VARIANT_HEADERS)
        out += [table(VARIANT_HEADERS, rows), ""]
    out += [f"## {SECTIONS['tradeoff']}", ""]
    if "tradeoff" in report.absent:
        out += [_absent(report.absent["tradeoff"]), ""]
    else:
        points = cells.columns((cells.tradeoff(p, report.where) for p in report.tradeoff), TRADEOFF_HEADERS)
        out += [
            f"Cheap: up to {cells.CHEAP}; worth removing: churn under impl from {cells.NOISY}.",
            "",
            table(TRADEOFF_HEADERS, points),
            "",
        ]
    for section in report.sections:
        out += [f"## {md(section.title)}", "", md(section.lead), "", table(section.headers, section.rows), ""]
    if "answer" not in report.absent:
        out += noise_floor(report)
    timed = [s for s in report.sweeps if s.time]
    for n, s in enumerate(timed):
        out += [f"### {md(report.where(s.label, s.backend))}: {cells.TIME_TITLE}", ""]
        out += [md(cells.TIME_LEAD), ""] if n == 0 else []
        out += [table(cells.TIME_HEADERS, cells.time_rows(s)), ""]
    out += ["## Warnings", ""]
    out += [f"- {md(w)}" for w in report.warnings] or [md(cells.NO_WARNINGS)]
    out += ["", f"## {SECTIONS['provenance']}", ""]
    out += [md(cells.generated(report)), ""]
    for line in (report.backend_line(), report.precision_line()):
        out += [md(line), ""] if line else []
    out += ["```sh", *report.commands, "```", ""]
    return "\n".join(out)
