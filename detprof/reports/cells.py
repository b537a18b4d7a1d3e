"""The words and numbers of every cell that both the HTML and the Markdown report show.

``report_data`` promises that the two formats always say the same thing; they can only keep
that promise if neither words a cell itself. So each cell they share is worded here, once:
the headline rows, the overheads per model and device, the backends side by side, the
published figures, the noise-floor table, the stability variants, the trade-off, whether
determinism held (``detprof verify``), which switch costs what (``sweep --knobs``) and the
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

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from detprof import formatting as f
from detprof.analysis.conditions import UNDER_LOAD
from detprof.analysis.knobs import KnobCost, within_noise
from detprof.analysis.layers import KernelChange, ModelAttribution, PartCost
from detprof.analysis.run_costs import TimeRow
from detprof.analysis.verification import Difference, ModelVerification
from detprof.device_time import HEADINGS, PARTS, WORDS
from detprof.gpu_labels import slug
from detprof.intervals import CHEAP_OVERHEAD, Overhead
from detprof.models.registry import BUILT_IN
from detprof.reports.gpu_reference import GpuMeasurement
from detprof.reports.headline import HeadlineRow, shown_caveats
from detprof.reports.knobs_data import KnobReading
from detprof.reports.provenance import backend_order, compiled_step_cache, framework_name
from detprof.reports.published import ReferenceRow
from detprof.reports.report_data import ModelCost, Report, StabilityStudy, SweepStudy
from detprof.reports.tradeoff import NOISY_CHURN, Noise, TradeoffPoint
from detprof.reports.verification_data import VerifyStudy, finding_lines
from detprof.study_kinds import Where

CHEAP = f"{CHEAP_OVERHEAD:.2f}x"
"""The cheap line, as every sentence about it names it."""
NOISY = f"{NOISY_CHURN:.0%}"
"""The churn under impl from which implementation noise is worth removing."""
NO_WARNINGS = (
    "No warnings: no throttling, no other load on the device, no failed runs, every interval narrow enough to conclude."
)
OVERHEAD_HEADERS = ("Model", "Kernel time", "Wall time", "Repeats", "Note")
MEMORY_HEADER = "Peak device memory, det / default"
"""The column the overhead table adds where any model's runs recorded their allocator's peak."""
TIME_TITLE = "where the runs' time went"
TIME_HEADERS = ("Model", "Accounted", *(HEADINGS[part] for part in PARTS))
TIME_LEAD = "; ".join(f"{HEADINGS[part]}: {WORDS[part]}" for part in PARTS) + "."
"""What each column of the time table holds."""
NOISE_FLOOR_HEADERS = ("Device", "Model", "Kernel time", "Wall time", "Smallest resolvable overhead")
REFERENCE_HEADERS = ("GPU", "What", "Published")
"""The published figures' own columns; a table of them adds what was measured here."""
HOLDS = "Does determinism hold?"
"""The headline's column, and the title of the first screen's table of verified models no sweep measured."""
HOLDS_LEAD = (
    f"{HOLDS} From `detprof verify` of the same model, device and backend: held means its two deterministic runs "
    "were bitwise identical at every step."
)
VERIFIED_HEADERS = (HOLDS, "Default mode", "What to do")
"""That table's columns after the model, device (and backend): ``verified``."""
VERIFIED_LEAD = (
    "`detprof verify` trained each model twice per mode from the same seed on the same batches and compared every "
    "layer's (or module's) output and weights at every step: held means the two deterministic runs were bitwise "
    "identical."
)
VERIFICATION_LEAD = (
    "Each model trained twice per mode, every layer's (or module's) output and weights compared at every step "
    "(`detprof verify`). Where the two runs of a mode first part is the layer or module that brings the difference in."
)
DIVERGENCE_LEAD = (
    "Each plot follows the default-mode runs' difference through the model's layers (or modules), step by "
    "step: the largest absolute difference of each one's output between the two runs."
)
KIND_WORDS = {"output": "output", "weights": "weights", "gradients": "gradient"}
"""What of a layer two runs part in (``fingerprints.Kind``), as a cell says it."""
VERIFY_MODES = ("deterministic", "default")
"""The modes of a verification in the order the report says them: whether determinism held comes first."""
KNOBS_LEAD = (
    "Each switch of determinism (`detprof sweep --knobs`), priced two ways as paired ratios with 95% CIs over "
    "repeats: added to the default alone, and within full determinism (full determinism against full determinism "
    "without it: what leaving it off saves). Without it (bitwise): whether the model's training stays bitwise "
    "identical with every other switch on and this one off."
)
KNOB_HEADERS = (
    "Knob",
    "How it is set",
    "Added to the default alone",
    "Within full determinism",
    "Share of the overhead",
    "Without it (bitwise)",
)
"""A knob study's table, per model: ``knob_row``."""
WITHIN_NOISE = "within noise"
"""The note of a cost whose interval holds 1.00 or lies inside the noise floor (``analysis.knobs.within_noise``)."""
KNOB_ADVICE = "Knob study"
"""What a swept model's knob advice starts with under the headline table."""

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


def device_named(label: str, name: str | None) -> str:
    """A device in a first-screen row: its label, with its name where known: ``t4 (Tesla T4)``; the name alone
    where the label is only the name spelled as a label (``nvidia-h100-80gb-hbm3``)."""
    if name and slug(name) == label:
        return name
    return label + (f" ({name})" if name else "")


def _read_from(r: HeadlineRow) -> str:
    """What a verdict was read from: its metric and repeats, and a machine other work shared for every run."""
    return f"from {r.metric} time, n={r.verdict.repeats}" + (f", {UNDER_LOAD}" if r.under_load else "")


def headline(r: HeadlineRow) -> HeadlineCells:
    """The words of one headline row; each format only marks them up (and the HTML joins model and device)."""
    v = r.verdict
    churn, drop = _buys(r)
    return HeadlineCells(
        model=r.model,
        device=device_named(r.device, r.device_name),
        backend=Words(r.backend, r.framework_version or ""),
        kernel=f.ratio(r.kernel),
        wall=f.ratio(r.wall),
        verdict=Words(v.text, _read_from(r) if v.reading is not None else ""),
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


def _where_runs_part(d: Difference) -> str:
    """Where two runs first part, short enough for one line under a cell, and without parentheses (a note goes
    in them)."""
    return f"parts at step {d.step} in {d.layer}'s {KIND_WORDS[d.kind]}"


def holds(v: ModelVerification | None) -> Words:
    """``HOLDS``: held or NOT held, and in a few words why (a headline row's note stays on one line)."""
    if v is None:
        return Words("not verified")
    deterministic = v.comparisons["deterministic"]
    if v.findings:
        return Words("NOT held", f"{v.findings[0].get('op') or 'an op'} refused")
    if deterministic.identical:
        return Words("held", f"bitwise identical over {f.counted(deterministic.steps, 'step')}")
    if deterministic.first_difference is not None:
        return Words("NOT held", _where_runs_part(deterministic.first_difference))
    return Words("not verified", deterministic.problem or "a run failed")


def default_mode(v: ModelVerification) -> str:
    """What the default mode's two runs did: already deterministic here, or where they part."""
    default = v.comparisons["default"]
    if default.identical:
        return "already deterministic on this device"
    if default.first_difference is not None:
        return _where_runs_part(default.first_difference)
    return f"not compared: {default.problem or 'a run failed'}"


def verification_advice(v: ModelVerification) -> str:
    """What a verified model's answer means for turning determinism on."""
    deterministic, default = v.comparisons["deterministic"], v.comparisons["default"]
    if v.findings:
        return "see the finding below: the op it names stops determinism"
    if deterministic.identical and default.identical:
        return "runs already repeat without it on this device: determinism buys no reproducibility here"
    if deterministic.identical:
        return "turn it on to make runs repeat; `detprof sweep` measures what it costs"
    if deterministic.first_difference is not None:
        return (
            f"look in {deterministic.first_difference.layer}: it brings in a difference determinism does not "
            "control (a random source detprof does not seed, or an op the switch does not cover)"
        )
    return "verify again: see the warnings"


@dataclass(frozen=True)
class VerifiedCells:
    """A verified model no sweep measured: who and where, as a headline row names them, then its answer."""

    model: str
    device: str
    backend: Words
    """The Keras backend, with its framework's version as the note (as a headline row has it), and
    ``torch.compile`` where the runs trained through it."""
    answer: dict[str, str | Words]
    """``VERIFIED_HEADERS`` -> the cell."""


def verified(study: VerifyStudy, v: ModelVerification) -> VerifiedCells:
    """The words of one row of the first screen's table of verified models no sweep measured."""
    return VerifiedCells(
        model=v.model,
        device=device_named(study.label, study.device.get("name")),
        backend=Words(
            study.backend,
            ", ".join(filter(None, ["/".join(study.versions.get(study.backend, [])), v.compiled and "torch.compile"])),
        ),
        answer={HOLDS: holds(v), "Default mode": default_mode(v), "What to do": verification_advice(v)},
    )


def verified_lead(report: Report) -> str:
    """What the table of verified models no sweep measured shows; beside a headline, why they are not in it."""
    if report.headline:
        return f"Models verified but not swept here, so with no cost measured. {VERIFIED_LEAD}"
    return VERIFIED_LEAD


def verified_notes(report: Report) -> list[RowNote]:
    """The findings of verified models no sweep measured (a swept model's are among its row's caveats)."""
    return [
        RowNote(v.model, report.where(s.label, s.backend), line)
        for s, v in report.verified_alone
        for line in finding_lines(v)
    ]


def mode_line(v: ModelVerification, mode: str) -> str:
    """One mode of a verification, as ``detprof verify`` says it: identical, or where the runs part and by how much."""
    comparison = v.comparisons[mode]
    name = f"{mode.capitalize()} mode"
    if mode == "deterministic" and v.findings:
        return f"{name}: {'; '.join(finding_lines(v))}"
    if comparison.identical:
        steps, layers = f.counted(comparison.steps, "step"), f.in_all(comparison.layers, v.part)
        return f"{name}: bitwise identical over {steps} {layers}"
    if comparison.first_difference is not None:
        return f"{name}: the runs part at {comparison.first_difference.line(part=v.part)}"
    return f"{name}: not compared: {comparison.problem or 'a run failed'}"


def compilation_line(v: ModelVerification) -> str | None:
    """How a verified model's runs compiled, where their framework keeps compiled steps across processes (JAX's
    persistent compilation cache, PyTorch's compiler caches under ``--compile``); None where it keeps none or the
    runs did not record it."""
    if v.compilation_cache != "off":
        return None
    caches = compiled_step_cache(v.backend)
    return (
        f"Each run compiled its steps itself ({framework_name(v.backend)}'s {caches} off in its process): the runs of "
        "a mode could differ in what compiling chose, as processes on a GPU do."
    )


def side_by_side_line(v: ModelVerification) -> str | None:
    """On a GPU, the mode whose runs shared the device (``verify.run.replicas_side_by_side``); None on a CPU, where
    every run does, and where none did."""
    if v.device == "cpu" or "deterministic" not in v.side_by_side:
        return None
    return (
        f"Its deterministic runs ran side by side on the GPU: in that mode {framework_name(v.backend)} picks its "
        "kernels without timing them, so sharing the device cannot part them."
    )


def verification_lines(v: ModelVerification) -> list[str]:
    """What the report's section says of a verified model: each mode, then how its runs compiled and shared the
    device."""
    notes = [line for line in (compilation_line(v), side_by_side_line(v)) if line]
    return [mode_line(v, mode) for mode in VERIFY_MODES] + notes


def verification_title(v: ModelVerification, shown: str) -> str:
    """A verified model, and the device (``shown``, as the report names it) it was verified on."""
    return f"{v.model} on {shown}"


def no_divergence(v: ModelVerification) -> str | None:
    """Why a model has no plot of how its default runs part; None where it has one."""
    default = v.comparisons["default"]
    if default.identical:
        return (
            f"The default-mode runs stayed bitwise identical over {f.counted(default.steps, 'step')} "
            f"{f.in_all(default.layers, v.part)}: no difference enters, so there is nothing to plot."
        )
    if default.identical is None:
        return f"The default-mode runs were not compared ({default.problem or 'a run failed'}): nothing to plot."
    return None


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


def overhead_table(s: SweepStudy) -> tuple[list[str], list[list[Any]]]:
    """Per model: kernel and wall overhead, repeats, why a number is missing or doubtful (``OVERHEAD_HEADERS``), and
    beside them each mode's peak device memory where any run recorded one (``MEMORY_HEADER``)."""
    memory = any(m.peak_memory is not None and not m.peak_memory.startswith("not known") for m in s.models)
    rows = []
    for m in s.models:
        note = "; ".join(text for text in (m.failure_note, m.warning) if text)
        n = m.headline.n if m.headline else 0
        row = [m.model, f.ratio(m.kernel), f.ratio(m.wall), n, note]
        rows.append([*row[:3], m.peak_memory or f.DASH, *row[3:]] if memory else row)
    headers = list(OVERHEAD_HEADERS)
    return ([*headers[:3], MEMORY_HEADER, *headers[3:]] if memory else headers), rows


def memory_note(s: SweepStudy) -> str | None:
    """Why the overhead table shows no peak device memory, where its runs recorded why."""
    said = {m.peak_memory for m in s.models if m.peak_memory is not None}
    unknown = sorted(text for text in said if text.startswith("not known"))
    return f"Peak device memory {unknown[0]}." if unknown and len(unknown) == len(said) else None


def _part_cell(row: TimeRow, part: str) -> str:
    """A part's seconds; the measured steps' with their share of the whole."""
    cell = f"{row.parts.get(part, 0.0):.1f} s"
    return f"{cell} ({f.percent(row.steps_share)})" if part == "steps" else cell


def time_rows(s: SweepStudy) -> list[list[str]]:
    """Where the runs' time went (``TIME_HEADERS``): per model, then in all, each part in seconds."""
    return [
        [
            row.model,
            f"{row.seconds:.1f} s",
            *(_part_cell(row, part) for part in PARTS),
        ]
        for row in s.time
    ]


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


def knobs_title(k: KnobReading, shown: str) -> str:
    """A knob study's model, and the device (``shown``, as the report names it) it was measured on."""
    return f"{k.knobs.model} on {shown}"


def knob_notes(readings: Iterable[KnobReading], where: Where) -> list[RowNote]:
    """Each model's knob advice (``ModelKnobs.advice``), read against its noise floor: one first-screen line."""
    return [RowNote(k.knobs.model, where(k.study.label, k.study.backend), k.advice) for k in readings]


def _cost(overhead: Overhead | None, floor: float | None, missing: str) -> Words:
    """A knob's cost with its interval, noted where it cannot be told from none; else why there is none."""
    if overhead is None:
        return Words(f.DASH, missing)
    return Words(f.ratio(overhead), WITHIN_NOISE if within_noise(overhead, floor) else "")


def knobs_total(k: KnobReading) -> Words:
    """Full determinism against the default, measured beside the knobs' arms: what the shares are shares of."""
    total = k.knobs.total
    repeats = f", {total.n} paired repeats" if total is not None else ""
    noise = WITHIN_NOISE if within_noise(total, k.floor) else ""
    every = f"; every switch on, which each knob is left out of: {f.ratio(k.knobs.every)}" if k.knobs.has_every else ""
    return Words(f"Full determinism against the default: {f.ratio(total)}{repeats}{every}", noise)


def knobs_advice(k: KnobReading) -> str:
    """The model's advice as its section says it, after the total."""
    return f"What to do: {k.advice}."


def knob_row(k: KnobReading, knob: KnobCost) -> dict[str, Words]:
    """One knob of a model (``KNOB_HEADERS``): how it is set, its two costs, its share, and the bitwise check."""
    if not knob.applies:
        alone, within = Words(f.DASH, f"not applicable: {knob.reason}"), Words(f.DASH)
    else:
        alone = _cost(knob.add_one, k.floor, knob.reason or "no result")
        within = _cost(knob.leave_one_out, k.floor, "no result" if knob.in_mode else "not in deterministic mode")
    share = k.knobs.share(knob)
    return {
        "Knob": Words(knob.knob, knob.does),
        "How it is set": Words(knob.setting),
        "Added to the default alone": alone,
        "Within full determinism": within,
        "Share of the overhead": Words(f.DASH if share is None else f.share(*share)),
        "Without it (bitwise)": Words(knob.check or f.DASH),
    }


PART_HEADERS = (
    "Default (ms/step)",
    "Deterministic (ms/step)",
    "Added (ms/step)",
    "95% CI",
    "Share of added",
    "Reading",
)
"""A layer's or op's row after its name (``part``); the report and the sweep's console table share them."""
PARTS_LEAD = (
    "What determinism adds per training step to each layer (a PyTorch or Flax model's modules, by path) and each op "
    "of the model, paired repeat by repeat as the model's overhead is; an interval that holds zero, or a change under "
    "this machine's noise floor, reads within noise. The loss and the optimizer's update are rows of their own, and "
    "kernels none of them claims count as (unattributed), so the rows add up to the step."
)


CONSOLE_LAYERS = 3
"""The layers a sweep's closing summary names per model; the report has them all."""


def layers_line(parts: ModelAttribution) -> str:
    """A sweep's closing line for a model's layers: those that pay or save, largest first, else that none does."""
    told = [p for p in parts.layers if not p.within_noise][:CONSOLE_LAYERS]
    if not told:
        return f"every {parts.part} {WITHIN_NOISE}"
    said = [
        f"{p.name} {p.added_ms:+.3f} ms/step [{p.lo:+.3f}, {p.hi:+.3f}]"
        + (f" ({f.percent(p.share, 0)} of the added time)" if p.share is not None else "")
        for p in told
    ]
    return "; ".join(said)


def part(p: PartCost) -> list[str]:
    interval = f.DASH if math.isnan(p.lo) else f"[{p.lo:+.3f}, {p.hi:+.3f}]"
    reading = WITHIN_NOISE if p.within_noise else ("pays" if p.added_ms > 0 else "saves")
    return [
        p.name,
        f.number(p.default_ms, 3),
        f.number(p.deterministic_ms, 3),
        f"{p.added_ms:+.3f}",
        interval,
        f.percent(p.share, 0),
        reading,
    ]


KERNEL_CHANGE_HEADERS = ("Kernel", "Default (ms/step)", "Deterministic (ms/step)", "Added (ms/step)")
LAYERS_OPENED = 10
"""The leaderboard's layers whose kernels the report lists on demand."""


def kernel_change(k: KernelChange) -> list[str]:
    return [k.name, f.number(k.default_ms, 3), f.number(k.deterministic_ms, 3), f"{k.added_ms:+.3f}"]


NO_ATTRIBUTION = (
    "These traces name no op or layer for their kernels (nvprof records none; nsys names them from the NVTX ranges "
    "frameworks push, the frameworks' own profilers from their ops), so which layer pays is not known here."
)


def unattributed_line(parts: ModelAttribution | None) -> str:
    """What of the step no layer (or module) claims; where the traces name none at all, that they do not."""
    if parts is None:
        return NO_ATTRIBUTION
    return (
        f"{parts.unattributed_share:.0%} of the default mode's traced time per step "
        f"({parts.default_step_ms:.3g} ms) ran in no {parts.part} of the model, nor in its loss or its update (the "
        "batch copied in, the framework's own work between them)."
    )


def layer_notes(report: Report) -> list[RowNote]:
    """The first screen's line for each row whose added time one layer mostly carries: which, and the op."""
    return [
        RowNote(r.model, report.where(r.device, r.backend), f"Where the cost comes from: {said}")
        for r in report.headline
        if r.parts is not None and (said := r.parts.sentence())
    ]


GPU_REFERENCE_LEAD = (
    "Deterministic over default kernel time per training step, 95% CI over pairs of runs, as detprof measured it on "
    "GPUs it was lent (each run's results under reference/ in detprof's repository); the paper's published figures "
    "beside them."
)


@dataclass(frozen=True)
class GpuRunTable:
    """One GPU run of the shipped reference as a table: a model per row, a framework per column."""

    title: str
    headers: list[str]
    rows: list[list[str]]
    versions: str


def _gpu_runs(measured: Sequence[GpuMeasurement]) -> dict[tuple[str, str, str], list[GpuMeasurement]]:
    """The shipped measurements by GPU run: (GPU, date, folder) -> its rows."""
    runs: dict[tuple[str, str, str], list[GpuMeasurement]] = {}
    for m in measured:
        runs.setdefault((m.gpu, m.date, m.source), []).append(m)
    return runs


def gpu_reference_tables(measured: Sequence[GpuMeasurement]) -> list[GpuRunTable]:
    """Each GPU run (a GPU on a date) of ``gpu_reference.shipped``, its models in the registry's order."""
    tables = []
    for (gpu, date, source), rows in _gpu_runs(measured).items():
        frameworks = backend_order(m.backend for m in rows)
        by_cell = {(m.model, m.backend): m for m in rows}
        models = sorted({m.model for m in rows}, key=_registry_position)
        table = [
            [model, *(by_cell[model, b].measured if (model, b) in by_cell else "-" for b in frameworks)]
            for model in models
        ]
        versions = "; ".join(next(m.versions for m in rows if m.backend == b) for b in frameworks)
        headers = ["Model", *(framework_name(b) for b in frameworks)]
        line = f"{versions}; driver {rows[0].driver}; reference/{source}"
        tables.append(GpuRunTable(f"{gpu}, {date}", headers, table, line))
    return tables


def _registry_position(model: str) -> tuple[int, str]:
    order = list(BUILT_IN)
    return (order.index(model) if model in order else len(order), model)


def gpu_reference_line(measured: Sequence[GpuMeasurement]) -> str | None:
    """The first screen's pointer to what detprof measured on GPUs: per run, the range of each framework's ratios."""
    runs = _gpu_runs(measured)
    if not runs:
        return None
    parts = []
    for (gpu, date, _), rows in runs.items():
        ranges = []
        for b in backend_order(m.backend for m in rows):
            ratios = [m.ratio for m in rows if m.backend == b]
            ranges.append(f"{framework_name(b)} {min(ratios):.2f}x-{max(ratios):.2f}x")
        parts.append(f"{gpu} ({date}): {', '.join(ranges)} over {len({m.model for m in rows})} models")
    return f"Measured by detprof on GPUs: {'; '.join(parts)}."
