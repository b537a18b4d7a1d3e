"""The words and numbers of every cell that both the HTML and the Markdown report show.

``report_data`` promises that the two formats always say the same thing; they can only keep
that promise if neither words a cell itself. So each cell they share is worded here, once:
the headline rows, the overheads per model and device, the backends side by side, the
published figures, the noise-floor table, the stability variants, the trade-off and the
lines that stand in for what is missing. A renderer adds only its markup: the HTML its cell
kinds and tones (and Jinja2's escaping), the Markdown its escaping and emphasis. Numbers are
formatted by ``detprof.formatting``, as everywhere else.

A cell is a ``Words``: its text, and a note that qualifies it (the dataset a churn comes
from, the time a verdict was read from). The HTML shows the note as a second, smaller line;
the Markdown on the same line, in parentheses (``Words.line``). Tables whose columns differ
between the formats (the Markdown keeps only what a reviewer acts on) take their cells by
header from one mapping, so a column of the same name says the same in both.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from detprof import formatting as f
from detprof.intervals import CHEAP_OVERHEAD, Overhead
from detprof.reports.headline import HeadlineRow, shown_caveats
from detprof.reports.provenance import backend_order
from detprof.reports.published import ReferenceRow
from detprof.reports.report_data import ModelCost, Report, StabilityStudy, SweepStudy, Where
from detprof.reports.tradeoff import NOISY_CHURN, Noise, TradeoffPoint

CHEAP = f"{CHEAP_OVERHEAD:.2f}x"
"""The cheap line, as every sentence about it names it."""
NOISY = f"{NOISY_CHURN:.0%}"
"""The churn under impl from which implementation noise is worth removing."""
NO_WARNINGS = "No warnings: no throttling, no failed runs, every interval narrow enough to conclude."
OVERHEAD_HEADERS = ("Model", "Kernel time", "Wall time", "Repeats", "Note")
NOISE_FLOOR_HEADERS = ("Device", "Model", "Kernel time", "Wall time", "Smallest resolvable overhead")
REFERENCE_HEADERS = ("GPU", "What", "Published")
"""The published figures' own columns; a table of them adds what was measured here."""

T = TypeVar("T")


@dataclass(frozen=True)
class Words:
    """What one cell says: its text, and a note that qualifies it."""

    text: str
    note: str = ""

    @property
    def line(self) -> str:
        """The cell on one line: the note in parentheses after the text, or alone where it explains a dash."""
        if not self.note:
            return self.text
        if self.text == f.DASH:
            return self.note
        return f"{self.text} ({self.note})"


def columns(cells: Iterable[Mapping[str, T]], headers: Sequence[str]) -> list[list[T]]:
    """Rows of the cells under ``headers``: each format picks its columns, never its words."""
    return [[row[h] for h in headers] for row in cells]


@dataclass(frozen=True)
class HeadlineCells:
    """One headline row, cell by cell: the first screen of the HTML, the answer table of the Markdown."""

    model: str
    device: str
    """The device label, with its name where known: ``t4 (Tesla T4)``."""
    backend: Words
    """The Keras backend, with its framework's version as the note."""
    kernel: str
    wall: str
    verdict: Words
    churn: Words
    drop: str
    floor: Words
    advice: str


def std_drop(noise: Noise) -> str:
    """How much tighter accuracy gets when determinism is added to a study that varies seeds anyway."""
    return f.points(noise.std_drop, noise.std_drop_se)


def _buys(r: HeadlineRow) -> tuple[Words, str]:
    """Churn under impl and the accuracy std drop, or why the row has neither."""
    if r.stability is None:
        return Words("no stability study"), f.DASH
    if not r.stability.used:
        return Words("did not learn", "left out"), f.DASH
    noise = r.stability.noise
    return Words(f.percent(noise.churn_impl, 2), r.stability.dataset), std_drop(noise)


def _floor(r: HeadlineRow) -> Words:
    """The machine's noise floor, or why there is none: no calibration ran, or it did not measure this model."""
    if r.noise_floor is not None:
        return Words(f.floor(r.noise_floor))
    if r.calibrated:
        return Words(f.DASH, "not in the calibration")
    return Words("not run")


def headline(r: HeadlineRow) -> HeadlineCells:
    """The words of one headline row; each format only marks them up (and the HTML joins model and device)."""
    v = r.verdict
    churn, drop = _buys(r)
    return HeadlineCells(
        model=r.model,
        device=r.device + (f" ({r.device_name})" if r.device_name else ""),
        backend=Words(r.backend, r.framework_version or ""),
        kernel=f.ratio(r.kernel),
        wall=f.ratio(r.wall),
        verdict=Words(v.text, f"from {r.metric} time, n={v.repeats}" if v.reading is not None else ""),
        churn=churn,
        drop=drop,
        floor=_floor(r),
        advice=r.advice,
    )


class RowNote(NamedTuple):
    """A headline row's caveats, under the table: ``model`` on ``device``: ``text``."""

    model: str
    device: str
    text: str


def row_notes(report: Report) -> list[RowNote]:
    """Each row's caveats, less those the report-level notes already say for every row."""
    return [
        RowNote(r.model, report.where(r.device, r.backend), " ".join(lines))
        for r in report.headline
        if (lines := shown_caveats(r, cpu_note=bool(report.cpu_notes), left_out_note=True))
    ]


def device_title(shown: str, device: Mapping[str, Any]) -> str:
    """A device as a heading names it: ``t4 (torch): Tesla T4``."""
    return shown + (f": {device['name']}" if device.get("name") else "")


def overhead(o: Overhead | None, metric: str) -> Words:
    """An overhead with the time it was read from."""
    return Words(f.ratio(o), f"{metric} time")


def model_overhead(m: ModelCost | None) -> Words:
    """The overhead a model's verdict reads (kernel time where traced, else wall time), or why there is none."""
    if m is None:
        return Words(f.DASH, "not swept")
    if m.headline is None:
        return Words(f.DASH, "not supported" if m.unsupported_reason else "no result")
    return overhead(m.headline, m.headline_metric)


def overhead_rows(s: SweepStudy) -> list[list[Any]]:
    """Per model (``OVERHEAD_HEADERS``): kernel and wall overhead, repeats, and why a number is missing or doubtful."""
    rows = []
    for m in s.models:
        note = "; ".join(text for text in (m.failure_note, m.warning) if text)
        n = m.headline.n if m.headline else 0
        rows.append([m.model, f.ratio(m.kernel), f.ratio(m.wall), n, note])
    return rows


@dataclass(frozen=True)
class SideBySide:
    """One device label swept on several backends: its sweeps in backend order, and a column per backend."""

    label: str
    title: str
    sweeps: list[SweepStudy]
    headers: list[str]
    rows: list[list[str | Words]]


def side_by_side(report: Report) -> list[SideBySide]:
    """Per device label measured on several backends, the overhead each backend's verdict reads, model by model."""
    by_label: dict[str, dict[str, SweepStudy]] = {}
    for s in report.sweeps:
        by_label.setdefault(s.label, {}).setdefault(s.backend, s)
    blocks = []
    for label, by_backend in by_label.items():
        if len(by_backend) < 2:
            continue
        sweeps = [by_backend[b] for b in backend_order(by_backend)]
        costs = [{m.model: m for m in s.models} for s in sweeps]
        models = list(dict.fromkeys(model for c in costs for model in c))
        rows: list[list[str | Words]] = [[model, *(model_overhead(c.get(model)) for c in costs)] for model in models]
        headers = ["Model", *(f"{s.backend} ({report.framework(s.backend)})" for s in sweeps)]
        blocks.append(SideBySide(label, device_title(label, sweeps[0].device), sweeps, headers, rows))
    return blocks


def matched_references(report: Report) -> list[ReferenceRow]:
    """The published figures held against a device measured here."""
    return [r for r in report.references if r.device is not None]


def reference(r: ReferenceRow) -> list[Any]:
    """A published figure (``REFERENCE_HEADERS``), what was measured here against it, and on which device."""
    return [r.figure.gpu.upper(), r.figure.subject, r.figure.published, r.measured, r.device]


def cost_summary(m: ModelCost) -> str:
    """Where a model's cost comes from, in a sentence, or why there are no kernel tables to say it."""
    return m.attribution or m.no_kernels or ""


def noise_floor_rows(report: Report) -> list[list[str]]:
    """The calibrations' A/A results (``NOISE_FLOOR_HEADERS``)."""
    return [[r.device, r.model, f.ratio(r.kernel), f.ratio(r.wall), f.floor(r.floor)] for r in report.noise_floors]


def stability_name(study: StabilityStudy, shown: str) -> str:
    """A stability study: its model, dataset and device (``shown``, as the report names it)."""
    return f"{study.model} on {study.dataset}, {shown}"


def stability_title(study: StabilityStudy, shown: str) -> str:
    return f"{stability_name(study, shown)}: {study.runs_ok} runs ok, {study.runs_failed} failed"


def variant(v: Mapping[str, Any]) -> dict[str, str]:
    """One variant of a stability study, by column header: what it varies, its spread and churn, its check."""
    accuracy = v.get("accuracy") or {}
    return {
        "Variant": str(v.get("variant")),
        "Varies": ", ".join(v.get("varies") or []) or "nothing",
        "Determinism": "on" if v.get("mode") == "deterministic" else "off",
        "Runs ok / failed": f"{v.get('runs_ok', 0)} / {v.get('runs_failed', 0)}",
        "Accuracy mean": f.number(accuracy.get("mean")),
        "Accuracy std +/- s.e.": f.plus_minus(v.get("accuracy")),
        "Churn": f.number(v.get("churn")),
        "L2": f.number(v.get("l2")),
        "Worst class std / overall": f.number((v.get("per_class") or {}).get("ratio"), 2),
        "Spearman": f.number(v.get("spearman")),
        "Ensemble gain": f.number(v.get("ensemble_gain")),
        "CKA": f.number(v.get("cka")),
        "Determinism check": f.BADGE_LABELS[f.check_line(v.get("determinism_check"))[0]],
    }


def tradeoff(p: TradeoffPoint, where: Where) -> dict[str, str | Words]:
    """One model's cost against what determinism buys it, by column header, with its reading."""
    return {
        "Model": p.model,
        "Device": where(p.device, p.backend),
        "Overhead": overhead(p.cost.overhead, p.cost.metric),
        "Churn under impl": f.percent(p.noise.churn_impl, 2),
        "Accuracy std drop": std_drop(p.noise),
        "Reading": p.reading,
    }


def generated(report: Report) -> str:
    """When the report was written, and from which results."""
    return f"Generated {report.generated_at} from {', '.join(str(p) for p in report.sources)}."
