"""The kernels_bench op table: each single operation's overhead of determinism, at model shapes.

kernels_bench summarizes its own records (``kernels_bench.case_results.summarize``: the paired
overhead per case, keyed by case through ``overhead.model_overheads``, and the kernels
only one mode launched); this module turns that into report rows, and takes the conv
suite's per-model totals as a second series for the kernel-size figure, since they are
the medium CNN's convolution time measured op by op.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from detprof.intervals import Overhead, inconclusive_reason
from detprof.records import REQUIRED_FIELDS
from detprof.reports.provenance import MeasuredStudy, StudyRead, study_loader
from detprof.store import ResultsStore
from detprof.study_kinds import StudyKind

if TYPE_CHECKING:
    from detprof.kernels_bench.case_results import CaseSummary

HOW_TO_RUN = "`detprof kernels` measures each operation's overhead at the models' own shapes."
MEDIUM_CNN = re.compile(r"^mediumcnn_k(\d+)$")
"""The registry's medium CNN of one kernel size (the paper's Figure 8b series), in the sweep and the bench."""
NAMES_SHOWN = 3


@dataclass(frozen=True)
class OpRow:
    case: str
    op: str
    shape: str
    where: str
    default_ns: float | None
    deterministic_ns: float | None
    overhead: Overhead | None
    """Of the bench's metric (``KernelsStudy.metric``)."""
    wall: Overhead | None
    changed: str
    """Kernels only one mode launched: ``+added -removed``."""
    note: str | None


@dataclass(frozen=True)
class ConvTotal:
    """The summed conv cases of one medium CNN: its convolution time, op by op."""

    model: str
    kernel_size: int | None
    overhead: Overhead | None


@dataclass(kw_only=True)
class KernelsStudy(MeasuredStudy):
    kind: ClassVar[str] = "kernels"
    metric: str
    rows: list[OpRow]
    totals: list[ConvTotal]
    warnings: list[str]


def _names(sign: str, names: list[str]) -> list[str]:
    shown = [f"{sign}{n}" for n in names[:NAMES_SHOWN]]
    return shown + ([f"({len(names) - NAMES_SHOWN} more)"] if len(names) > NAMES_SHOWN else [])


def _note(summary: CaseSummary, overhead: Overhead | None) -> str | None:
    return summary.overhead.failure_note() or inconclusive_reason(overhead)


@study_loader
def load_kernels(store: ResultsStore, study: StudyRead) -> KernelsStudy:
    from detprof.kernels_bench.case_results import summarize

    manifest, _, where = study
    label = where.label
    result = summarize(store)
    rows = []
    for s in result.cases:
        overhead = getattr(s.overhead, result.metric)
        extra = f" (+{len(s.layers) - 1} more)" if len(s.layers) > 1 else ""
        rows.append(
            OpRow(
                case=s.case,
                op=s.op,
                shape=s.shape,
                where=f"{s.model}.{s.layers[0]}{extra}" if s.layers else s.model,
                default_ns=s.default_ns,
                deterministic_ns=s.deterministic_ns,
                overhead=overhead,
                wall=s.overhead.wall,
                changed=" ".join(_names("+", s.added) + _names("-", s.removed)),
                note=_note(s, overhead),
            )
        )
    totals = []
    for t in result.totals:
        match = MEDIUM_CNN.match(t.model)
        totals.append(ConvTotal(t.model, int(match.group(1)) if match else None, getattr(t.overhead, result.metric)))
    warnings = [*where.warnings, *(f"{label}: op {r.case}: {r.note}" for r in rows if r.note)]
    return KernelsStudy(
        **where.study_fields(store.root, manifest), metric=result.metric, rows=rows, totals=totals, warnings=warnings
    )


KERNELS = StudyKind("kernels", REQUIRED_FIELDS["kernels"], load_kernels)
