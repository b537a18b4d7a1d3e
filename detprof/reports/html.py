"""The report as one self-contained HTML file.

Self-contained means it opens offline and makes no request of its own: the CSS is
inline, fonts are the system's, and plotly.js is written once, with the first figure
(``--plotlyjs cdn`` swaps it for plotly's CDN script tag to keep the file small). Every
figure after the first is a bare div and script.

The page opens with the answer (``answer``: per model and device, cost, verdict, what it
buys, noise floor, caveats), then the evidence, and ends with what ran (``provenance``).
Where the results hold several Keras backends, the answer has a backend column with each
model's backends in adjacent rows, the overhead section opens with the backends side by
side per device, and every other section names the device with its backend
(``Report.where``).
The markup lives in ``templates/report.html.j2`` (and its macros); this module only turns
the ``Report`` into what the page shows: table rows and figures, with the words of every
cell the Markdown shows too taken from ``cells``. Jinja2 renders with autoescape on, so
everything that comes from results (kernel names above all: ``Kernel<float>&``) is escaped
by the template engine and never by us; the only markup handed to the templates is
plotly's own output, as ``Markup``, and the code spans of prose (``_code_spans``), made after escaping.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

import pandas as pd
from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup, escape

from detprof import backends
from detprof import formatting as f
from detprof.analysis import layers
from detprof.analysis.knobs import helper_lines
from detprof.analysis.layers import ModelAttribution
from detprof.analysis.verification import ModelVerification
from detprof.backends.base import SettingColumn
from detprof.determinism import MODES
from detprof.gpu_labels import CPU_LABEL
from detprof.reports import cells, figures
from detprof.reports.cells import Words
from detprof.reports.gpu_clocks import by_mode
from detprof.reports.headline import HeadlineRow, published_reference
from detprof.reports.provenance import StudyOrigin, backend_order
from detprof.reports.published import SOURCE
from detprof.reports.report_data import (
    NOISE_FLOOR_LEAD,
    NOISE_FLOOR_TITLE,
    SECTIONS,
    ModelCost,
    Report,
    StabilityStudy,
    kernel_size_points,
)
from detprof.study_kinds import Section

PlotlyJs = Literal["embed", "cdn"]
OPTIONAL_SECTIONS = ("verification", "knobs")
"""The sections that are not in the page at all (nor in its navigation) without their study: "verification"
only where the inputs hold a ``detprof verify`` study, "knobs" only where they hold a ``sweep --knobs`` one."""
PLOT_CONFIG = {"displaylogo": False, "responsive": True}
FIRST_SCREEN_HEIGHT = 300
"""A figure on the first screen leaves room for the answer's first rows below it at 1440x900."""
CellKind = Literal["text", "code", "dotted", "kernel", "agree", "verdict"]
HOLDS_TONES = {True: "agree-yes", False: "agree-no", None: "warn"}
"""Whether determinism held, as the page colours it: the yes/no colours of the published figures' check."""
NEEDED_TONES = {True: "agree-no", False: "agree-yes", None: ""}
"""Whether a model needs a knob, as the page colours the bitwise check without it: not needed is the good news."""
NOISE_TONE = "noise"
"""The CSS class of a cost within noise (``cells.WITHIN_NOISE``): greyed, as a figure not to be read."""


@cache
def _environment() -> Environment:
    """One environment per process, so each template is parsed once however many reports are written.

    ``StrictUndefined`` makes a name the template expects but the context lacks an error
    instead of a silently empty cell.
    """
    return Environment(
        loader=PackageLoader("detprof.reports", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        finalize=_code_spans,
    )


CODE_SPAN = re.compile(r"`([^`]+)`")
"""A command the words name in backticks, as the Markdown report shows it (``headline.suggested``)."""


def _code_spans(value: Any) -> Any:
    """Each value the template prints, with the commands its words name in backticks shown as code, not as
    backticks: the text is escaped first, so only the ``code`` tags are markup. Markup (plotly's) passes as it is."""
    if isinstance(value, Markup) or not isinstance(value, str) or "`" not in value:
        return value
    return Markup(CODE_SPAN.sub(r"<code>\1</code>", str(escape(value))))


@dataclass(frozen=True)
class Cell:
    """One table cell: a value shown as text, and which markup the ``cell`` macro wraps it in.

    ``kind`` is how a cell asks for markup (a command line as code, code that may break after
    a dot, a kernel name clamped to three lines, a coloured yes/no) without carrying any: the
    template writes the tags and escapes the value.
    """

    value: Any
    kind: CellKind = "text"
    tone: str = ""
    """A CSS class for the value (a verdict's reading), never markup."""
    note: str = ""
    """A second, smaller line under the value."""


@dataclass(frozen=True)
class Table:
    """Headers and rows for the ``table`` macro; the columns in ``numeric`` are right-aligned.

    ``classes`` gives a column's cells a CSS class, so that a column keeps its look (kept on
    one line, given room) wherever other columns come and go.
    """

    headers: Sequence[str]
    rows: list[list[Cell]]
    numeric: frozenset[int] = frozenset()
    classes: dict[int, str] = field(default_factory=dict)

    def cell_class(self, column: int) -> str:
        return " ".join(c for c in ("num" if column in self.numeric else "", self.classes.get(column, "")) if c)


def _cell(value: Any) -> Cell:
    if isinstance(value, Cell):
        return value
    if isinstance(value, Words):
        return Cell(value.text, note=value.note)
    return Cell(value)


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    numeric: Iterable[int] = (),
    classes: dict[int, str] | None = None,
) -> Table:
    """Plain values and ``Words`` become text cells, so row-building code only names the cells that need markup."""
    return Table(list(headers), [[_cell(c) for c in row] for row in rows], frozenset(numeric), dict(classes or {}))


def kernel_name(name: Any) -> Cell:
    """The full name, clamped to three lines until hovered (once in the page, not twice as a title)."""
    return Cell(name, "kernel")


class _Figures:
    """Renders figures in the order the template places them; only the first carries plotly.js.

    The template calls this as ``plot(fig)``, so whichever figure comes first in the page,
    whatever sections are left out, is the one that loads plotly.js for all the others.
    """

    def __init__(self, plotlyjs: PlotlyJs) -> None:
        self.plotlyjs = plotlyjs
        self.count = 0

    def __call__(self, fig: Any) -> Markup:
        import plotly.io as pio

        include: bool | str = False
        if self.count == 0:
            include = True if self.plotlyjs == "embed" else "cdn"
        self.count += 1
        return Markup(
            pio.to_html(fig, full_html=False, include_plotlyjs=include, config=PLOT_CONFIG, default_height=None)
        )


def _study_row(study: StudyOrigin) -> list[Any]:
    """A study's provenance row: where it ran, its results, when, which runs were traced, and its command line."""
    ran = f"{study.started or '?'} .. {study.finished or '?'}" if study.started or study.finished else ""
    where = [study.kind, study.label, study.backend, str(study.path), ran]
    return [*where, study.traced or f.DASH, Cell(study.command, "code")]


def _studies(report: Report) -> Table:
    rows = [_study_row(study) for study in report.studies]
    return table(["Study", "Device", "Backend", "Results", "Ran", "Which runs were traced", "Command line"], rows)


def _devices(report: Report) -> Table:
    return table(
        ["Label", "Name", "Driver", "CUDA driver", "Compute capability", "Memory", "SMs / CPUs"],
        [
            [
                label,
                d.get("name") or f.DASH,
                d.get("driver") or f.DASH,
                d.get("cuda_driver") or f.DASH,
                d.get("compute_capability") or f.DASH,
                f"{d['memory_bytes'] / 2**30:.1f} GiB" if d.get("memory_bytes") else f.DASH,
                d.get("sm_count") or d.get("cpu_count") or f.DASH,
            ]
            for label, d in report.devices.items()
        ],
    )


OTHER_SETTINGS = (
    SettingColumn("op determinism", "op_determinism"),
    SettingColumn("jit_compile (pinned)", "jit_compile"),
)
"""The settings shown for a backend detprof does not know (results of a newer detprof)."""


def _settings(report: Report) -> list[dict[str, Any]]:
    """One table per backend, each with the switches its framework has."""
    tables = []
    for backend in backend_order(b for _, b, _, _ in report.settings):
        known = backends.REGISTRY.get(backend)
        columns = known.in_effect_columns if known else OTHER_SETTINGS
        rows = [
            [name, mode, *(column.shown(s) for column in columns), s.get("seed")]
            for name, b, mode, s in report.settings
            if b == backend
        ]
        tables.append(
            {
                "title": f": {backend} ({report.framework(backend)})" if report.names_backend else "",
                "table": table(["Study", "Mode", *(column.heading for column in columns), "Seed"], rows),
                "note": known.settings_note if known else "",
            }
        )
    return tables


def _versions(report: Report) -> Table | None:
    """Package -> version, one column per backend where the report names backends."""
    per_backend = report.versions
    packages = list(dict.fromkeys(k for versions in per_backend.values() for k in versions))
    if not packages:
        return None

    def shown(values: list[str] | None) -> str:
        if not values:
            return f.DASH
        return ", ".join(values) + (" (differs between runs)" if len(values) > 1 else "")

    headers = ["Package", *per_backend] if report.names_backend else ["Package", "Version"]
    rows = [[k, *(shown(versions.get(k)) for versions in per_backend.values())] for k in packages]
    return table(headers, rows)


def provenance(report: Report) -> dict[str, Any]:
    """What ran, on what, with which backend, software and settings, and the commands that rerun it: the page's end."""
    return {
        "generated": cells.generated(report),
        "backends": report.backend_line(),
        "precision": report.precision_line(),
        "studies": _studies(report),
        "devices": _devices(report),
        "versions": _versions(report),
        "settings": _settings(report),
        "commands": "\n".join(report.commands),
    }


ANSWER_COLUMNS: tuple[tuple[str, str], ...] = (
    ("Model on device", ""),
    ("Costs: kernel time (det / default, 95% CI)", ""),
    ("Costs: wall time", ""),
    ("Verdict", "wide"),
    ("Buys: churn under impl", "nowrap"),
    ("Buys: accuracy std drop", "nowrap"),
    ("Noise floor", "nowrap"),
    ("What to do", "wide"),
)
"""The first screen's columns and the CSS class of their cells; ``BACKEND_COLUMN`` goes second where named, and
``HOLDS_COLUMN`` after it where a row's model was verified."""
BACKEND_COLUMN = ("Backend", "nowrap")
HOLDS_COLUMN = (cells.HOLDS, "holds")


def holds(v: ModelVerification | None) -> Cell:
    """Whether determinism held, coloured (``HOLDS_TONES``), with why in a few words as its note."""
    words = cells.holds(v)
    return Cell(words.text, tone="" if v is None else HOLDS_TONES[v.held], note=words.note)


def answer_row(r: HeadlineRow, named: bool = False, verified: bool = False) -> list[Any]:
    """One row of the first screen; ``named``: with the backend (and its framework's version) second;
    ``verified``: with whether determinism held after them."""
    c = cells.headline(r)
    backend = [Cell(c.backend.text, "code", note=c.backend.note)] if named else []
    held = [holds(r.verification)] if verified else []
    churn = c.churn
    if r.stability is not None and not r.stability.used:
        churn = Cell(churn.text, tone="warn", note=churn.note)
    return [
        Cell(c.model, "code", note=c.device),
        *backend,
        *held,
        c.kernel,
        c.wall,
        Cell(c.verdict.text, "verdict", tone=(r.verdict.reading or "none").replace(" ", "-"), note=c.verdict.note),
        churn,
        c.drop,
        c.floor,
        c.advice,
    ]


def answer(report: Report) -> dict[str, Any] | None:
    """The first screen; ``None`` when there is no sweep (``report.absent`` says why)."""
    if "answer" in report.absent:
        return None
    named, verified = report.names_backend, report.verified_headline
    leading = [*([BACKEND_COLUMN] if named else []), *([HOLDS_COLUMN] if verified else [])]
    columns = [ANSWER_COLUMNS[0], *leading, *ANSWER_COLUMNS[1:]]
    first_cost = 1 + len(leading)
    return {
        "cheap": cells.CHEAP,
        "backends": named,
        "verified": verified,
        "holds_lead": cells.HOLDS_LEAD,
        "table": table(
            [h for h, _ in columns],
            [answer_row(r, named, verified) for r in report.headline],
            numeric=(first_cost, first_cost + 1),
            classes={i: cls for i, (_, cls) in enumerate(columns) if cls},
        ),
        "row_notes": [
            *((f"{n.model} on {n.device}", n.text) for n in cells.row_notes(report)),
            *(
                (f"{n.model} on {n.device}", f"{cells.KNOB_ADVICE}: {n.text}")
                for n in cells.knob_notes(report.knobs_beside_headline, report.where)
            ),
            *((f"{n.model} on {n.device}", n.text) for n in cells.layer_notes(report)),
        ],
        "cpu_notes": report.cpu_notes,
        "notes": report.notes,
        "cpu": bool(report.cpu_notes),
        "published": table(["GPU", "What", "Det / default GPU time"], published_reference()),
        "source": SOURCE,
        "on_gpus": cells.gpu_reference_line(report.measured_on_gpus),
    }


def verified_alone(report: Report) -> dict[str, Any] | None:
    """The first screen's table of verified models no sweep measured; None where there are none."""
    if not report.verified_alone:
        return None
    named = report.names_backend
    rows = []
    for study, v in report.verified_alone:
        c = cells.verified(study, v)
        rows.append(
            [
                Cell(c.model, "code", note=c.device),
                *([Cell(c.backend.text, "code", note=c.backend.note)] if named else []),
                holds(v),
                *(c.answer[h] for h in cells.VERIFIED_HEADERS[1:]),
            ]
        )
    headers = ["Model on device", *(["Backend"] if named else []), *cells.VERIFIED_HEADERS]
    return {
        "title": cells.HOLDS,
        "lead": cells.verified_lead(report),
        "table": table(headers, rows, classes={len(headers) - 3: "nowrap", len(headers) - 1: "wide"}),
        "notes": [(f"{n.model} on {n.device}", n.text) for n in cells.verified_notes(report)],
    }


def knobs_alone(report: Report) -> dict[str, Any] | None:
    """The first screen's lines of knob studies of models no headline row shows; None where there are none."""
    if not report.knobs_alone:
        return None
    notes = cells.knob_notes(report.knobs_alone, report.where)
    return {"title": SECTIONS["knobs"], "lines": [(f"{n.model} on {n.device}", n.text) for n in notes]}


def _knob_cost(words: Words) -> Cell:
    """A knob's cost, greyed where it is within noise."""
    return Cell(words.text, tone=NOISE_TONE if words.note == cells.WITHIN_NOISE else "", note=words.note)


def knobs(report: Report) -> dict[str, Any] | None:
    """Per model of a knob study, its total, each knob's costs, share and bitwise check, and a chart of the costs;
    None without a knob study (the section is then not in the page at all)."""
    if not report.knobs:
        return None
    models = []
    for k in report.knobs:
        shown = report.where(k.study.label, k.study.backend)
        rows = []
        for knob in k.knobs.knobs:
            name, setting, *costs, check = (cells.knob_row(k, knob)[h] for h in cells.KNOB_HEADERS)
            rows.append(
                [
                    Cell(name.text, "code", note=name.note),
                    Cell(setting.text, "dotted"),
                    *(_knob_cost(cost) for cost in costs),
                    Cell(check.text, tone=NEEDED_TONES[knob.needed]),
                ]
            )
        total = cells.knobs_total(k)
        models.append(
            {
                "title": cells.knobs_title(k, shown),
                "total": total.text,
                "total_noise": total.note,
                "unexplained": k.knobs.unexplained_line(),
                "helpers": helper_lines(k.knobs),
                "advice": cells.knobs_advice(k),
                "table": table(
                    cells.KNOB_HEADERS, rows, classes={0: "knob", 1: "setting", 2: "cost", 3: "cost", 5: "check"}
                ),
                "figure": figures.knobs_figure(k, shown),
            }
        )
    return {"lead": cells.KNOBS_LEAD, "models": models}


def verification(report: Report) -> dict[str, Any] | None:
    """Per verified model, where its runs part in each mode and how its default runs' difference grows; None
    without a verification study (the section is then not in the page at all)."""
    if not report.verifications:
        return None
    models = []
    for study in report.verifications:
        shown = report.where(study.label, study.backend)
        for v in study.models:
            no_plot = cells.no_divergence(v)
            models.append(
                {
                    "title": cells.verification_title(v, shown),
                    "lines": cells.verification_lines(v),
                    "no_plot": no_plot,
                    "figure": figures.divergence_figure(v, shown) if no_plot is None else None,
                }
            )
    return {"lead": f"{cells.VERIFICATION_LEAD} {cells.DIVERGENCE_LEAD}", "models": models}


def _agrees(value: bool | None) -> Cell:
    if value is None:
        return Cell(f.DASH)
    return Cell("yes" if value else "no", "agree")


def _backends_side_by_side(report: Report) -> list[dict[str, Any]]:
    """Per device label measured on several backends: one figure and one table, a column per backend."""
    return [
        {
            "title": b.title,
            "figure": figures.backends_figure(b.label, b.sweeps),
            "table": table(
                b.headers,
                [[Cell(model, "code"), *costs] for model, *costs in b.rows],
                numeric=range(1, len(b.sweeps) + 1),
            ),
        }
        for b in cells.side_by_side(report)
    ]


def overhead(report: Report) -> dict[str, Any] | None:
    """``None`` when the section is left out (``report.absent`` says why), so no figure is built for it."""
    if "overhead" in report.absent:
        return None
    return {
        "backends": _backends_side_by_side(report),
        "sweeps": [
            {
                "title": cells.device_title(report.where(s.label, s.backend), s.device),
                "figure": figures.overhead_figure(s, report.where(s.label, s.backend)),
                "table": table(*cells.overhead_table(s), numeric=(1, 2, 3)),
                "timing": s.timing,
                "memory": cells.memory_note(s),
            }
            for s in report.sweeps
        ],
        "source": SOURCE,
        "references": None
        if "references" in report.absent
        else table(
            [*cells.REFERENCE_HEADERS, "Measured here (kernel time, 95% CI)", "Device", "CI reaches it"],
            [[*cells.reference(r), _agrees(r.agrees)] for r in cells.matched_references(report)],
        ),
    }


def gpu_kernel_size(report: Report) -> Any:
    """The paper's figure redrawn for a GPU report's first screen: the medium CNN's overhead against kernel size
    measured on GPUs, per framework, beside the paper's 1x1 and 7x7 ends on the T4, V100 and P100; None where no
    GPU sweep measured two kernel sizes."""
    points = [
        p
        for p in kernel_size_points([s for s in report.sweeps if s.label != CPU_LABEL], named=report.names_backend)
        if p.source == "sweep"
    ]
    if len({p.kernel_size for p in points}) < 2:
        return None
    figure = figures.kernel_size_figure(points, report.references, every_paper_gpu=True)
    figure.update_layout(
        title="The paper's figure on this GPU: the medium CNN's overhead against convolution kernel size",
        height=FIRST_SCREEN_HEIGHT,
        margin={"t": 40, "b": 10},
        legend={"y": -0.3},
    )
    return figure


def kernel_size(report: Report) -> dict[str, Any]:
    """The figure and its table are ``None`` when left out; the kernels_bench tables are shown either way."""
    shown = "kernel-size" not in report.absent
    return {
        "figure": figures.kernel_size_figure(report.kernel_size, report.references) if shown else None,
        "table": table(
            ["Device", "Source", "Kernel size", "Overhead", "Metric"],
            [
                [p.device, p.source, f"{p.kernel_size}x{p.kernel_size}", f.ratio(p.overhead), p.metric]
                for p in report.kernel_size
            ],
        )
        if shown
        else None,
        "benches": [
            {
                "title": cells.device_title(report.where(k.label, k.backend), k.device),
                "metric": k.metric,
                "table": table(
                    [
                        "Op",
                        "Shape",
                        "Layer",
                        "Default",
                        "Deterministic",
                        "Overhead",
                        "Wall time",
                        "Kernels that differ",
                        "Note",
                    ],
                    [
                        [
                            r.op,
                            r.shape,
                            r.where,
                            f.duration_ns(r.default_ns),
                            f.duration_ns(r.deterministic_ns),
                            f.ratio(r.overhead),
                            f.ratio(r.wall),
                            kernel_name(r.changed) if r.changed else f.DASH,
                            r.note or "",
                        ]
                        for r in k.rows
                    ],
                    numeric=(3, 4),
                ),
            }
            for k in report.kernels
        ],
    }


def top_table(frame: pd.DataFrame) -> Table:
    return table(
        ["Time (%)", "Total / step", "Instances / step", "Avg", "Med", "Category", "Name"],
        (
            [
                f"{r.pct:.1f}",
                f.duration_ns(r.total_ns),
                f.count(r.instances),
                f.duration_ns(r.avg_ns),
                f.duration_ns(r.med_ns),
                r.category,
                kernel_name(r.name),
            ]
            for r in frame.itertuples(index=False)
        ),
        numeric=(0, 1, 2, 3, 4),
    )


def diff_table(diff: pd.DataFrame) -> Table:
    rows = [
        [
            r.status,
            r.category,
            f.duration_ns(r.total_ns_base),
            f.duration_ns(r.total_ns_other),
            f.signed_ns(r.delta_ns),
            f.percent(r.share_of_change, 0),
            f"{r.instances_base} -> {r.instances_other}",
            kernel_name(r.name),
        ]
        for r in diff.itertuples(index=False)
    ]
    headers = [
        "Change",
        "Category",
        "Default / step",
        "Deterministic / step",
        "Delta",
        "Share of overhead",
        "Instances / step",
        "Name",
    ]
    return table(headers, rows, numeric=(2, 3, 4, 5))


def leaderboards(parts: ModelAttribution | None, model: str) -> list[dict[str, Any]]:
    """A model's layer (or module) leaderboard, then its op leaderboard: each a chart and a table of the top
    ``TOP_N``; the kernels under each of the first board's leading rows."""
    if parts is None:
        return []
    boards = []
    for what, found, order in ((parts.part, parts.layers, parts.layer_order), ("op", parts.ops, [])):
        boards.append(
            {
                "title": f"{what.capitalize()}s by time determinism adds",
                "figure": figures.parts_figure(
                    found, order, what, f"{figures.text(model)}: {what}s by added time per step"
                ),
                "table": table(
                    [what.capitalize(), *cells.PART_HEADERS],
                    [cells.part(p) for p in found[: layers.TOP_N]],
                    numeric=(1, 2, 3, 5),
                ),
                "kernels": [
                    {
                        "layer": p.name,
                        "table": table(
                            list(cells.KERNEL_CHANGE_HEADERS),
                            [cells.kernel_change(k) for k in parts.layer_kernels.get(p.name, [])],
                            numeric=(1, 2, 3),
                        ),
                    }
                    for p in found[: cells.LAYERS_OPENED]
                    if found is parts.layers and parts.layer_kernels.get(p.name)
                ],
            }
        )
    return boards


def model_details(m: ModelCost, parts: ModelAttribution | None = None) -> dict[str, Any]:
    """One model's collapsible block: ``no_kernels`` is set exactly when it has no kernel tables to open."""
    more, delta = m.diff_rest
    return {
        "model": m.model,
        "boards": leaderboards(parts, m.model),
        "unattributed": cells.unattributed_line(parts) if parts is not None or set(MODES) <= set(m.top) else None,
        "summary": cells.cost_summary(m),
        "no_kernels": None if m.top else (m.no_kernels or "no kernel tables"),
        "sides": [
            {
                "mode": mode,
                "count": len(m.top[mode]),
                "table": top_table(m.top[mode]),
                "other_ns": f.duration_ns(m.other_ns.get(mode, 0.0)) if m.other_ns.get(mode) else None,
            }
            for mode in MODES
            if mode in m.top
        ],
        "diff": None if m.diff is None else diff_table(m.diff),
        "more": more,
        "more_delta": f.signed_ns(delta),
    }


def cost(report: Report) -> dict[str, Any] | None:
    if "cost" in report.absent:
        return None
    return {
        "sweeps": [
            {
                "label": report.where(s.label, s.backend),
                "figure": figures.category_figure(s, report.where(s.label, s.backend))
                if any(m.categories for m in s.models)
                else None,
                "models": [model_details(m, report.parts_of(s, m)) for m in s.models],
            }
            for s in report.sweeps
        ]
    }


def _check(variant: dict[str, Any]) -> dict[str, Any]:
    state, line = f.check_line(variant.get("determinism_check"))
    return {"variant": variant.get("variant"), "state": state, "label": f.BADGE_LABELS[state], "line": line}


def _subgroups(study: StabilityStudy) -> Table | None:
    groups = [(v.get("variant"), g) for v in study.variants for g in ((v.get("subgroups") or {}).get("groups") or [])]
    if not groups:
        return None
    rates = [r for r in ("accuracy", "fpr", "fnr") if any(f"{r}_std" in g for _, g in groups)]
    headers = ["Variant", "Group", "n"] + [h for r in rates for h in (f"{r} mean", f"{r} std", f"{r} std / overall")]
    return table(
        headers,
        [
            [name, g.get("group"), g.get("n")]
            + [
                c
                for r in rates
                for c in (
                    f.number(g.get(f"{r}_mean")),
                    f.number(g.get(f"{r}_std")),
                    f.number(g.get(f"{r}_std_ratio"), 2),
                )
            ]
            for name, g in groups
        ],
        numeric=tuple(range(2, 3 + 3 * len(rates))),
    )


VARIANT_HEADERS = (
    "Variant",
    "Varies",
    "Determinism",
    "Runs ok / failed",
    "Accuracy mean",
    "Accuracy std +/- s.e.",
    "Churn",
    "L2",
    "Worst class std / overall",
    "Spearman",
    "Ensemble gain",
    "CKA",
)
"""The stability variants' columns (``cells.variant``); the determinism check has lines of its own."""


def stability_study(study: StabilityStudy, shown: str) -> dict[str, Any]:
    """``per_class`` is ``None`` when no variant has the 2+ successful runs a spread needs; ``shown``: its device."""
    learning = study.learning
    return {
        "name": cells.stability_name(study, shown),
        "title": cells.stability_title(study, shown),
        "did_not_learn": None if learning.learned is not False else learning.line(),
        "longer_training": study.longer_training and study.longer_training[0].upper() + study.longer_training[1:],
        "variants": table(
            VARIANT_HEADERS,
            cells.columns((cells.variant(v) for v in study.variants), VARIANT_HEADERS),
            numeric=tuple(range(4, 12)),
        ),
        "checks": [_check(v) for v in study.variants if (v.get("determinism_check") or {}).get("applicable")],
        "per_class": figures.per_class_figure(study, shown),
        "subgroups": _subgroups(study),
    }


def stability(report: Report) -> dict[str, Any] | None:
    if "stability" in report.absent:
        return None

    def shown(study: StabilityStudy) -> dict[str, Any]:
        return stability_study(study, report.where(study.label, study.backend))

    return {
        "studies": [shown(study) for study in report.stability if study.learned],
        "not_learned": [shown(study) for study in report.stability if not study.learned],
    }


TRADEOFF_HEADERS = ("Model", "Device", "Overhead", "Churn under impl", "Accuracy std drop", "Reading")
"""The trade-off table's columns (``cells.tradeoff``)."""


def tradeoff(report: Report) -> dict[str, Any] | None:
    """``figure`` is ``None`` when no stability study measures implementation noise."""
    if "tradeoff" in report.absent:
        return None
    points = cells.columns((cells.tradeoff(p, report.where) for p in report.tradeoff), TRADEOFF_HEADERS)
    return {
        "cheap": cells.CHEAP,
        "noisy": cells.NOISY,
        "figure": figures.tradeoff_figure(report.tradeoff, report.where),
        "table": table(TRADEOFF_HEADERS, [[Cell(model, "code"), *rest] for model, *rest in points]),
    }


def noise_floor(report: Report) -> dict[str, Any] | None:
    """The calibrations' A/A table: on the first screen when it is all the inputs hold, else under conditions."""
    if not report.calibrations:
        return None
    return {
        "title": NOISE_FLOOR_TITLE,
        "lead": NOISE_FLOOR_LEAD,
        "table": table(
            cells.NOISE_FLOOR_HEADERS,
            cells.noise_floor_rows(report),
            numeric=(2, 3, 4),
        ),
    }


TIME_NUMBERS = tuple(range(1, len(cells.TIME_HEADERS)))


def conditions(report: Report) -> dict[str, Any]:
    return {
        "clocks": [
            {
                "label": report.where(s.label, s.backend),
                "table": table(
                    [
                        "Model",
                        "Mode",
                        "Runs",
                        "SM clock min / mean / max (MHz)",
                        "Max temperature (C)",
                        "Mean power (W)",
                        "Throttled runs",
                    ],
                    [
                        [
                            c.model,
                            c.mode,
                            c.runs,
                            " / ".join(f.number(v, 0) for v in (c.sm_clock_min, c.sm_clock_mean, c.sm_clock_max)),
                            f.number(c.temperature_max, 0),
                            f.number(c.power_mean, 1),
                            f"{c.throttled_runs}" + (f" ({', '.join(c.reasons)})" if c.reasons else ""),
                        ]
                        for c in [*by_mode(s.clocks), *(c for c in s.clocks if c.throttled_runs)]
                    ],
                    numeric=(2, 4, 5),
                ),
            }
            for s in report.sweeps
            if s.clocks
        ],
        "loads": [
            {
                "label": report.where(s.label, s.backend),
                "table": table(
                    [
                        "Mode",
                        "Runs",
                        "Other processes' cores, mean / max",
                        "Steal, max",
                        "Load average, max",
                        "Runs that shared the device",
                    ],
                    [
                        [
                            row.mode,
                            row.runs,
                            " / ".join(f.number(v, 2) for v in (row.other_cores_mean, row.other_cores_max))
                            + (f" of {row.cores}" if row.cores else ""),
                            f.percent(row.steal_max),
                            f.number(row.load_average_max, 2),
                            row.shared_runs,
                        ]
                        for row in s.loads
                    ],
                    numeric=(1, 4, 5),
                ),
            }
            for s in report.sweeps
            if s.loads
        ],
        "time": [
            {
                "label": report.where(s.label, s.backend),
                "table": table(
                    cells.TIME_HEADERS, cells.time_rows(s), numeric=tuple(range(1, len(cells.TIME_HEADERS)))
                ),
            }
            for s in report.sweeps
            if s.time
        ],
        "warnings": report.warnings,
        "no_warnings": cells.NO_WARNINGS,
    }


def on_gpus(report: Report) -> dict[str, Any]:
    """What detprof measured on GPUs (each run a table), beside the paper's published figures."""
    return {
        "lead": cells.GPU_REFERENCE_LEAD,
        "runs": [
            {
                "title": run.title,
                "table": table(run.headers, run.rows, numeric=tuple(range(1, len(run.headers)))),
                "versions": run.versions,
            }
            for run in cells.gpu_reference_tables(report.measured_on_gpus)
        ],
        "published": table(["GPU", "What", "Det / default GPU time"], published_reference()),
        "source": SOURCE,
    }


def _nav(report: Report, shown: dict[str, bool]) -> dict[str, str]:
    """Each section's anchor and short name, in page order: the kinds' own sections come before "conditions"."""
    ours = [(id, title.nav) for id, title in SECTIONS.items() if id not in OPTIONAL_SECTIONS or shown[id]]
    at = [id for id, _ in ours].index("conditions")
    return dict([*ours[:at], *((s.id, s.nav) for s in report.sections), *ours[at:]])


def kind_section(section: Section) -> dict[str, Any]:
    """A kind's own section as the page shows it: its words, its rows as a table."""
    return {
        "id": section.id,
        "title": section.title,
        "lead": section.lead,
        "table": table(section.headers, section.rows),
    }


def render(report: Report, plotlyjs: PlotlyJs = "embed") -> str:
    """The whole page; sections the inputs lack say why in the one line ``report.absent`` holds."""
    verified, priced = verification(report), knobs(report)
    shown = {"verification": verified is not None, "knobs": priced is not None}
    return (
        _environment()
        .get_template("report.html.j2")
        .render(
            sections=SECTIONS,
            nav=_nav(report, shown),
            absent=report.absent,
            plot=_Figures(plotlyjs),
            answer=answer(report),
            verified_alone=verified_alone(report),
            verification=verified,
            knobs=priced,
            knobs_alone=knobs_alone(report),
            provenance=provenance(report),
            overhead=overhead(report),
            on_gpus=on_gpus(report),
            kernel_size=kernel_size(report),
            gpu_kernel_size=gpu_kernel_size(report),
            cost=cost(report),
            stability=stability(report),
            tradeoff=tradeoff(report),
            kind_sections=[kind_section(s) for s in report.sections],
            conditions=conditions(report),
            time_title=cells.TIME_TITLE,
            time_lead=cells.TIME_LEAD,
            noise_floor=noise_floor(report),
        )
    )
