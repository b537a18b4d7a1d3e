"""Which layer and which op of a model pay for determinism, each with a paired 95% interval.

A user changes layers and ops, not kernels. Each traced run's kernel table places every kernel
in a layer and an op (``traces.attribution``); here each run's time per step is summed per
layer and per op, and the two modes are paired repeat by repeat, as the model's own overhead
is: the added time per step of a layer is the mean of its per-repeat differences, with a
t-interval over repeats. A difference whose interval holds zero, or that is smaller than this
machine's noise floor (an A/A calibration's, as a share of the model's step), reads "within
noise". Kernels that nothing places count as the "(unattributed)" layer or op, so that the
layers always add up to the step's traced time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from detprof.analysis.overhead import model_overheads
from detprof.analysis.study_results import counted_steps
from detprof.intervals import Overhead, paired_t, t_interval
from detprof.models import kinds
from detprof.store import ResultsStore
from detprof.traces.attribution import UNATTRIBUTED, in_model_order, layer_of, op_kind, placed_kernels

MS = 1e6
NEGLIGIBLE_SHARE = 0.01
"""Without a calibration, a change under 1% of the model's traced step is run-to-run jitter (as for the
kernel-level attribution, ``reports.attribution.NEGLIGIBLE_CHANGE``): with a leaderboard of many layers, some
interval would exclude zero by chance alone."""
TOP_N = 20
"""The leaderboards the report shows; JSON holds every layer and op."""


@dataclass(frozen=True)
class PartCost:
    """One layer's (or op's) time per step in each mode, and what determinism adds to it."""

    name: str
    default_ms: float
    deterministic_ms: float
    added_ms: float
    lo: float
    """The 95% interval of the added time per step, in ms (NaN with a single repeat)."""
    hi: float
    ratio: float | None
    ratio_lo: float | None
    ratio_hi: float | None
    share: float | None
    """Of the model's added kernel time per step, where that is told from noise; None where not."""
    within_noise: bool
    repeats: int

    def as_json(self) -> dict[str, Any]:
        def number(value: float | None) -> float | None:
            return None if value is None or math.isnan(value) else round(value, 6)

        return {
            "name": self.name,
            "default_ms": number(self.default_ms),
            "deterministic_ms": number(self.deterministic_ms),
            "added_ms": number(self.added_ms),
            "lo": number(self.lo),
            "hi": number(self.hi),
            "ratio": number(self.ratio),
            "ratio_lo": number(self.ratio_lo),
            "ratio_hi": number(self.ratio_hi),
            "share": number(self.share),
            "within_noise": self.within_noise,
            "repeats": self.repeats,
        }


KERNELS_PER_LAYER = 5


@dataclass(frozen=True)
class KernelChange:
    """A kernel under a layer: its mean time per step in each mode, over the paired repeats."""

    name: str
    default_ms: float
    deterministic_ms: float

    @property
    def added_ms(self) -> float:
        return self.deterministic_ms - self.default_ms


@dataclass(frozen=True)
class ModelAttribution:
    """A model's layers and ops by added time per step, largest first."""

    model: str
    layers: list[PartCost]
    ops: list[PartCost]
    layer_order: list[str]
    """The leaderboard's layer paths in model order (of their innermost layers, ``layer_names``), for the report's
    "in model order" view."""
    unattributed_share: float
    """Of the default mode's traced time per step, what no layer claims."""
    default_step_ms: float
    """The default mode's traced time per step: what a noise floor (a share of the step) is a share of."""
    layer_kernels: dict[str, list[KernelChange]]
    """Per layer, the kernels whose time changed most (``KERNELS_PER_LAYER``): what the report opens on demand."""
    part: str = "layer"
    """What the model's parts are called (``kinds.part_word``): a native module's are modules."""

    def against(self, floor: float | None) -> ModelAttribution:
        """The same leaderboards with differences under ``floor`` (an A/A calibration's, ``intervals.noise_floor``,
        a share of the step; ``NEGLIGIBLE_SHARE`` where none was measured) read as within noise."""
        noise_ms = _noise_ms(floor, self.default_step_ms)
        return replace(
            self,
            layers=[replace(p, within_noise=_within(p.added_ms, p.lo, p.hi, noise_ms)) for p in self.layers],
            ops=[replace(p, within_noise=_within(p.added_ms, p.lo, p.hi, noise_ms)) for p in self.ops],
        )

    def leader(self) -> PartCost | None:
        """The layer that carries most of the added time, when one does (over half of it, told from noise)."""
        return _leader(self.layers)

    def leading_op(self) -> PartCost | None:
        return _leader(self.ops)

    def sentence(self) -> str | None:
        """The first screen's words when one layer carries most of the added time: which, how much, and the op."""
        layer = self.leader()
        if layer is None:
            return None
        op = self.leading_op()
        assert layer.share is not None
        how_much = (
            f"more than all ({layer.share:.0%}) of the time determinism adds, as other {self.part}s got faster"
            if layer.share > 1
            else f"{layer.share:.0%} of the time determinism adds"
        )
        said = (
            f"{self.part.capitalize()} {layer.name} pays {how_much} "
            f"({layer.added_ms:+.3g} ms per step, 95% CI [{layer.lo:+.3g}, {layer.hi:+.3g}])"
        )
        return said + (f", most of it in {op.name} ({op.added_ms:+.3g} ms)." if op is not None else ".")


def _leader(parts: Sequence[PartCost]) -> PartCost | None:
    top = next((p for p in parts if p.name != UNATTRIBUTED), None)
    if top is None or top.within_noise or top.share is None or top.share <= 0.5:
        return None
    return top


@dataclass(frozen=True)
class RunParts:
    """One run's time per step (ns) by layer, by op, and by kernel within each layer."""

    layers: dict[str, float]
    ops: dict[str, float]
    layer_kernels: dict[tuple[str, str], float]


def run_parts(
    frame: pd.DataFrame,
    steps: int,
    layer_names: Sequence[str],
    step_scopes: Mapping[str, str] | None = None,
    kernel_modules: Mapping[str, Mapping[str, str | None]] | None = None,
) -> RunParts:
    """A run's kernel table summed per layer (and per part of the step that is no layer: ``step_scopes``), per op
    and per (layer, kernel), per step of the ``steps`` it holds; under ``torch.compile``, Inductor's fused kernels
    and its extern kernels in the modules ``kernel_modules`` places them in (``placed_kernels``)."""
    scopes, kinds = (_names(frame, column) for column in ("scope", "op_type"))
    if kernel_modules:
        scopes = _placed(scopes, kinds, _names(frame, "name"), _names(frame, "graph_site"), kernel_modules)
    layer = scopes.map({scope: layer_of(scope, layer_names, step_scopes) for scope in scopes.cat.categories})
    layer = layer.astype(object).fillna(UNATTRIBUTED).to_numpy()
    op = kinds.map({kind: op_kind(kind) for kind in kinds.cat.categories}).astype(object).fillna(UNATTRIBUTED)
    kernel = frame["short_name"].astype(object).fillna(frame["name"].astype(object)).to_numpy()
    durations = pd.Series(frame["dur_ns"].to_numpy(dtype=np.float64) / max(steps, 1))
    by_layer = durations.groupby(layer).sum()
    by_op = durations.groupby(op.to_numpy()).sum()
    by_kernel = durations.groupby([layer, kernel]).sum()
    return RunParts(
        {str(k): float(v) for k, v in by_layer.items()},
        {str(k): float(v) for k, v in by_op.items()},
        {(str(a), str(b)): float(v) for (a, b), v in by_kernel.items()},
    )


def _paired(
    runs: Sequence[tuple[dict[str, float], dict[str, float]]], total_added: float | None, noise_ms: float
) -> list[PartCost]:
    """Each part's cost over the paired repeats ``(default, deterministic)``, largest added time first; its share
    of ``total_added``, the model's added time per step where its overhead is told from none (else None)."""
    names = sorted({name for pair in runs for side in pair for name in side})
    n = len(runs)
    out = []
    for name in names:
        default = np.array([pair[0].get(name, 0.0) for pair in runs]) / MS
        deterministic = np.array([pair[1].get(name, 0.0) for pair in runs]) / MS
        added, lo, hi = t_interval(deterministic - default)
        both = (default > 0) & (deterministic > 0)
        ratio = paired_t(np.log(deterministic[both] / default[both])) if both.all() and n else None
        out.append(
            PartCost(
                name=name,
                default_ms=float(default.mean()),
                deterministic_ms=float(deterministic.mean()),
                added_ms=added,
                lo=lo,
                hi=hi,
                ratio=ratio.ratio if ratio is not None else None,
                ratio_lo=ratio.ci_low if ratio is not None and ratio.has_interval else None,
                ratio_hi=ratio.ci_high if ratio is not None and ratio.has_interval else None,
                share=added / total_added if total_added else None,
                within_noise=_within(added, lo, hi, noise_ms),
                repeats=n,
            )
        )
    return sorted(out, key=lambda p: p.added_ms, reverse=True)


def _placed(
    scopes: pd.Series,
    kinds: pd.Series,
    kernels: pd.Series,
    sites: pd.Series,
    kernel_modules: Mapping[str, Mapping[str, str | None]],
) -> pd.Series:
    """The scopes with Inductor's kernels placed in their modules (``placed_kernels``), worked out once per
    distinct scope, op, kernel name and place in a compiled graph's call, as the layers are once per scope: a GPU
    trace holds hundreds of thousands of kernels and a few hundred such tuples."""
    columns = [scopes.cat, kinds.cat, kernels.cat, sites.cat]
    key = np.zeros(len(scopes), dtype=np.int64)
    for column in columns:  # each row's category codes as one number (code 0: no value)
        key = key * (len(column.categories) + 1) + column.codes.to_numpy(np.int64) + 1
    distinct, rows = np.unique(key, return_inverse=True)
    values: list[list[object]] = []
    for column in reversed(columns):
        size = len(column.categories) + 1
        codes, distinct = distinct % size, distinct // size
        values.insert(0, [None if code == 0 else column.categories[code - 1] for code in codes])
    placed = np.asarray(placed_kernels(*values, kernel_modules), dtype=object)
    return pd.Series(pd.Categorical(placed[rows]), index=scopes.index)


def _names(frame: pd.DataFrame, column: str) -> pd.Series:
    """A name column as categories; all null in a table written before its parser filled it."""
    if column in frame:
        return frame[column].astype("category")
    return pd.Series(pd.Categorical([None] * len(frame)), index=frame.index)


def _within(added: float, lo: float, hi: float, noise_ms: float) -> bool:
    """A difference this data cannot tell from none: no interval, one that holds zero, or one under the floor."""
    return math.isnan(lo) or lo <= 0 <= hi or abs(added) < noise_ms


def _noise_ms(floor: float | None, default_step_ms: float) -> float:
    """The smallest change per step told from jitter: the calibration's floor, never under ``NEGLIGIBLE_SHARE``."""
    return (NEGLIGIBLE_SHARE if floor is None else max(floor, NEGLIGIBLE_SHARE)) * default_step_ms


def _told_total(runs: Sequence[tuple[dict[str, float], dict[str, float]]], overhead: Overhead | None) -> float | None:
    """The model's added traced time per step (ms), where its kernel-time overhead (``analysis.overhead``, the
    median step of each run) is told from none: an interval above 1. Shares of an overhead that may be none would
    say nothing."""
    if overhead is None or not overhead.has_interval or overhead.ci_low <= 1.0:
        return None
    added = float(np.mean([sum(t.values()) - sum(d.values()) for d, t in runs])) / MS
    return added if added > 0 else None


def attribute_model(store: ResultsStore, records: Sequence[Mapping[str, Any]]) -> ModelAttribution | None:
    """A model's layer and op leaderboards from its sweep runs; None where no pair of runs has a kernel table
    whose trace places kernels (a trace without names: nvprof, or runs recorded before attribution)."""
    by_repeat: dict[int, dict[str, Mapping[str, Any]]] = {}
    model = ""
    for record in records:
        if record.get("status") == "ok" and record.get("kernel_table") and record.get("kernel_table_kind") != "summary":
            by_repeat.setdefault(int(record["repeat"]), {})[str(record["mode"])] = record
            model = str(record["model"])
    pairs = [(p["default"], p["deterministic"]) for _, p in sorted(by_repeat.items()) if len(p) == 2]
    if not pairs:
        return None
    layer_names = list(pairs[0][0].get("layer_names") or [])
    step_scopes = dict(pairs[0][0].get("step_scopes") or {})
    parts = [tuple(_parts(store, record, layer_names, step_scopes) for record in pair) for pair in pairs]
    if all(set(run.layers) == {UNATTRIBUTED} and set(run.ops) == {UNATTRIBUTED} for pair in parts for run in pair):
        return None
    layer_runs = [(d.layers, t.layers) for d, t in parts]
    overhead = model_overheads(records).get(model)
    total = _told_total(layer_runs, overhead.kernel if overhead is not None else None)
    default_step = float(np.mean([sum(d.values()) for d, _ in layer_runs])) / MS
    unattributed = float(np.mean([d.get(UNATTRIBUTED, 0.0) for d, _ in layer_runs])) / MS
    noise_ms = _noise_ms(None, default_step)
    layers = _paired(layer_runs, total, noise_ms)
    return ModelAttribution(
        model=model,
        layers=layers,
        ops=_paired([(d.ops, t.ops) for d, t in parts], total, noise_ms),
        layer_order=in_model_order((p.name for p in layers), layer_names),
        unattributed_share=unattributed / default_step if default_step else 0.0,
        default_step_ms=default_step,
        layer_kernels=_layer_kernels(parts),
        part=kinds.part_word(pairs[0][0].get("model_api")),
    )


def _layer_kernels(parts: Sequence[tuple[RunParts, RunParts]]) -> dict[str, list[KernelChange]]:
    """Per layer, its kernels by how much their mean time per step changed, largest change first."""
    keys = {key for pair in parts for run in pair for key in run.layer_kernels}
    by_layer: dict[str, list[KernelChange]] = {}
    for layer, kernel in keys:
        default, deterministic = (
            float(np.mean([pair[side].layer_kernels.get((layer, kernel), 0.0) for pair in parts])) / MS
            for side in (0, 1)
        )
        by_layer.setdefault(layer, []).append(KernelChange(kernel, default, deterministic))
    return {
        layer: sorted(found, key=lambda k: (-abs(k.added_ms), k.name))[:KERNELS_PER_LAYER]
        for layer, found in by_layer.items()
    }


def _parts(
    store: ResultsStore, record: Mapping[str, Any], layer_names: Sequence[str], step_scopes: Mapping[str, str]
) -> RunParts:
    frame, steps = counted_steps(store.read_table(str(record["kernel_table"])), record)
    return run_parts(frame, steps, layer_names, step_scopes, record.get("kernel_modules"))
