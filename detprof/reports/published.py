"""The published overheads of determinism, and which of them a measurement can be held against.

Zhuang et al. ("Randomness in neural network training: characterizing the impact of
tooling", MLSys 2022) report deterministic GPU time relative to default GPU time
(Figures 8a and 8b). A reader's first question about a new measurement is whether it
agrees with theirs, but the answer only means something on the same GPU model, so a
figure is compared only with a device whose label or name spells the same GPU (with the
sweep's own label matcher: ``v100`` matches ``Tesla V100-SXM2-16GB``, never ``a100``).
Their "relative GPU time" is total kernel time, so it is compared with the kernel-time
ratio, never with wall time. They measured TensorFlow; a device measured on several Keras
backends is held against them once per backend, each row naming its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from detprof.gpu_labels import label_matches
from detprof.intervals import Overhead

SOURCE = "Zhuang et al., MLSys 2022"


@dataclass(frozen=True)
class PublishedFigure:
    """One published number (``high`` None) or range (``low``..``high``), as det/default ratios.

    ``models`` names the registry models it speaks about: one model, the two ends of the
    medium CNN's kernel sizes (``kind == "kernel-size"``), or none for a range across models.
    """

    gpu: str
    subject: str
    kind: str
    low: float
    high: float | None = None
    models: tuple[str, ...] = ()

    @property
    def published(self) -> str:
        if self.high is None:
            return f"{self.low:.0%}"
        arrow = " -> " if self.kind == "kernel-size" else " - "
        return f"{self.low:.0%}{arrow}{self.high:.0%}"


PUBLISHED: tuple[PublishedFigure, ...] = (
    PublishedFigure("v100", "VGG19", "model", 1.85, models=("vgg19",)),
    PublishedFigure("v100", "MobileNet", "model", 1.01, models=("mobilenet",)),
    PublishedFigure("p100", "across models", "range", 1.01, 2.11),
    PublishedFigure("t4", "across models", "range", 1.01, 1.96),
    PublishedFigure(
        "p100", "medium CNN, kernel 1x1 -> 7x7", "kernel-size", 2.84, 7.46, ("mediumcnn_k1", "mediumcnn_k7")
    ),
    PublishedFigure(
        "v100", "medium CNN, kernel 1x1 -> 7x7", "kernel-size", 1.29, 2.41, ("mediumcnn_k1", "mediumcnn_k7")
    ),
    PublishedFigure("t4", "medium CNN, kernel 1x1 -> 7x7", "kernel-size", 1.17, 1.96, ("mediumcnn_k1", "mediumcnn_k7")),
)
PUBLISHED_GPUS: tuple[str, ...] = tuple(dict.fromkeys(f.gpu for f in PUBLISHED))


def published_gpu(label: str, name: str | None) -> str | None:
    """The GPU of the paper this device is, if any (by its label first, then its full name)."""
    for gpu in PUBLISHED_GPUS:
        if label_matches(gpu, label) or (name is not None and label_matches(gpu, name)):
            return gpu
    return None


@dataclass(frozen=True)
class ReferenceRow:
    figure: PublishedFigure
    device: str | None
    """The measured device label compared with it; None when no measured device is that GPU."""
    measured: str
    agrees: bool | None
    """Whether every measured 95% CI reaches the published value (or range); None: no CI to compare."""


def _fmt(ratio: float) -> str:
    return f"{ratio:.0%}"


def _reaches(overhead: Overhead, low: float, high: float) -> bool | None:
    """The CI overlaps [low, high]; without a CI (one repeat) nothing can be said."""
    if overhead.n < 2:
        return None
    return overhead.ci_low <= high and overhead.ci_high >= low


def _with_ci(overhead: Overhead) -> str:
    if overhead.n < 2:
        return f"{_fmt(overhead.ratio)} (n=1, no CI)"
    return f"{_fmt(overhead.ratio)} [{_fmt(overhead.ci_low)}, {_fmt(overhead.ci_high)}]"


def compare(figure: PublishedFigure, device: str, kernel: Mapping[str, Overhead]) -> ReferenceRow:
    """Hold one figure against one device's kernel-time overheads (model -> Overhead)."""
    if figure.kind == "model":
        measured = kernel.get(figure.models[0])
        if measured is None:
            return ReferenceRow(figure, device, f"{figure.models[0]} not measured on {device}", None)
        return ReferenceRow(figure, device, _with_ci(measured), _reaches(measured, figure.low, figure.low))
    if figure.kind == "kernel-size":
        ends = [kernel.get(m) for m in figure.models]
        if any(e is None for e in ends):
            missing = ", ".join(m for m, e in zip(figure.models, ends, strict=True) if e is None)
            return ReferenceRow(figure, device, f"{missing} not measured on {device}", None)
        small, large = (e for e in ends if e is not None)
        agrees = [_reaches(small, figure.low, figure.low), _reaches(large, figure.high or 0, figure.high or 0)]
        verdict = None if None in agrees else all(agrees)
        return ReferenceRow(figure, device, f"{_with_ci(small)} -> {_with_ci(large)}", verdict)
    if not kernel:
        return ReferenceRow(figure, device, f"no kernel-time overhead measured on {device}", None)
    ratios = sorted(o.ratio for o in kernel.values())
    measured = f"{_fmt(ratios[0])} - {_fmt(ratios[-1])} over {len(ratios)} model(s)"
    reached = [_reaches(o, figure.low, figure.high or figure.low) for o in kernel.values()]
    return ReferenceRow(figure, device, measured, None if None in reached else all(reached))


class MeasuredDevice(NamedTuple):
    """One sweep's device: what matches it to a published GPU, and its kernel-time overhead per model."""

    label: str
    name: str | None
    kernel: Mapping[str, Overhead]
    shown: str | None = None
    """How the report names it, where that is more than its label (the label and its backend)."""


def reference_rows(devices: Iterable[MeasuredDevice]) -> list[ReferenceRow]:
    """Every published figure, next to each measured device of the same GPU (or alone when none is)."""
    measured = [MeasuredDevice(*d) for d in devices]
    rows: list[ReferenceRow] = []
    for figure in PUBLISHED:
        matched = [d for d in measured if published_gpu(d.label, d.name) == figure.gpu]
        if not matched:
            rows.append(ReferenceRow(figure, None, f"no {figure.gpu.upper()} measured", None))
        rows.extend(compare(figure, d.shown or d.label, d.kernel) for d in matched)
    return rows
