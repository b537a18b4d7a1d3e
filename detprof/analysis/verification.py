"""Whether determinism holds, from ``detprof verify``'s runs: two runs of each mode, compared tensor by tensor.

Two runs of one mode that start from the same seed and see the same batches are the same run
only if every tensor of every step is the same to the bit. The first tensor whose digest
differs (steps in order; within a step the layers' outputs in model order, then the
gradients, then the weights after the update) is where they part: the layer that injects
the noise, even one without weights, since a forward pass is compared before any update. How
the difference then grows is read off each layer's output step by step: the largest absolute
difference over the tensors' samples (``fingerprints``), exact for tensors no larger than a
sample.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from detprof.determinism import MODES
from detprof.fingerprints import SAMPLE_SIZE, Kind, RunFingerprints, sampled_difference
from detprof.store import ResultsStore


@dataclass(frozen=True)
class Difference:
    """Where two runs first part: the step, the layer (or variable), what of it, and by how much."""

    step: int
    layer: str
    kind: Kind
    max_abs: float
    """The largest absolute difference over the tensor's sample."""
    exact: bool
    """Whether the sample holds every element, so that ``max_abs`` is the tensor's own."""

    def line(self) -> str:
        what = {"output": "output", "weights": "weights after the update", "gradients": "gradient"}[self.kind]
        size = f"max |diff| {self.max_abs:.3g}" + ("" if self.exact else f" (over {SAMPLE_SIZE} sampled values)")
        return f"step {self.step}, layer {self.layer} ({what}), {size}"

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "layer": self.layer, "kind": self.kind, "max_abs": self.max_abs, "exact": self.exact}


@dataclass(frozen=True)
class Comparison:
    """The two runs of one mode, compared: identical, parted (where first), or not comparable (why)."""

    mode: str
    identical: bool | None
    """None: not comparable (a run ended before its first step)."""
    steps: int
    """Steps both runs took, compared."""
    layers: int
    first_difference: Difference | None = None
    growth: dict[str, list[float]] = field(default_factory=dict)
    """Layer -> the largest difference of its output at each step (over its sample), in model order."""
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        first = None if self.first_difference is None else self.first_difference.to_json()
        return {
            "identical": self.identical,
            "first_difference": first,
            "steps": self.steps,
            "layers": self.layers,
            "problem": self.problem,
        }


def compare(mode: str, a: RunFingerprints, b: RunFingerprints) -> Comparison:
    """Two runs of ``mode`` compared over the steps both took."""
    steps = min(len(a.steps), len(b.steps))
    layers = len({f.name for f in a.steps[0] if f.kind == "output"}) if a.steps else 0
    if steps == 0:
        return Comparison(mode, None, 0, layers, problem="a run took no step")
    first = None
    growth: dict[str, list[float]] = {}
    for step in range(steps):
        for x, y in zip(a.steps[step], b.steps[step], strict=True):
            if x.digest == y.digest:
                difference = 0.0
            else:
                difference = sampled_difference(a.sample(step, x), b.sample(step, y))
                if first is None:
                    first = Difference(step, x.name, x.kind, difference, int(np.prod(x.shape)) <= SAMPLE_SIZE)
            if x.kind == "output":
                growth.setdefault(x.name, []).append(difference)
    return Comparison(mode, first is None, steps, layers, first, growth)


@dataclass(frozen=True)
class ModelVerification:
    """A model's verification on one device and backend: both modes compared, and what refused determinism."""

    model: str
    backend: str
    device: str
    device_name: str | None
    steps_asked: int
    comparisons: dict[str, Comparison]
    findings: list[dict[str, Any]]
    failures: list[str]
    """Runs that failed for another reason than an op refusing determinism: their reasons."""

    @property
    def held(self) -> bool | None:
        """Whether deterministic mode was bitwise reproducible; None where it could not be told."""
        if self.findings:
            return False
        return self.comparisons["deterministic"].identical

    def lines(self) -> list[str]:
        """What ``detprof verify`` says of the model, one line per mode and per finding."""
        where = f"{self.model} on {self.device} ({self.backend})"
        deterministic = self.comparisons["deterministic"]
        out = []
        if self.findings:
            out += [f"{where}: not deterministic: {f['op'] or 'an op'} refused ({f['message']})" for f in self.findings]
            out += [
                f"  {f['op'] or 'the op'}" + (f" in layer {f['layer']}" if f["layer"] else "") + f": {f['advice']}"
                for f in self.findings
            ]
        elif deterministic.identical:
            out.append(
                f"{where}: deterministic mode: bitwise identical over {deterministic.steps} steps "
                f"in all {deterministic.layers} layers"
            )
        elif deterministic.identical is False and deterministic.first_difference is not None:
            out.append(
                f"{where}: NOT deterministic on this device and stack: the two deterministic runs part at "
                f"{deterministic.first_difference.line()}"
            )
        else:
            out.append(f"{where}: deterministic mode could not be verified: {self._why(deterministic)}")
        default = self.comparisons["default"]
        if default.identical:
            out.append(
                f"  default mode: identical too, over {default.steps} steps: on this device the default is "
                "already deterministic for this model"
            )
        elif default.identical is False and default.first_difference is not None:
            out.append(f"  default mode: the runs part at {default.first_difference.line()}")
        else:
            out.append(f"  default mode: not compared: {self._why(default)}")
        return out

    def _why(self, comparison: Comparison) -> str:
        return "; ".join(self.failures) or comparison.problem or "no runs"

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "backend": self.backend,
            "device": self.device,
            "device_name": self.device_name,
            "deterministic": self.comparisons["deterministic"].to_json(),
            "default": self.comparisons["default"].to_json(),
            "held": self.held,
            "findings": self.findings,
            "failures": self.failures,
        }


def verifications(store: ResultsStore) -> list[ModelVerification]:
    """Every model of a verification study, in the order its runs started (the order they were asked for).

    The store lists records by file name; a run's ``started_at`` (ISO 8601, so it sorts as text)
    keeps the models in the order ``detprof verify`` ran them, whatever their names.
    """
    by_model: dict[str, list[dict[str, Any]]] = {}
    for record in sorted(store.records(), key=lambda r: str(r.get("started_at") or "")):
        by_model.setdefault(record["model"], []).append(record)
    return [_verification(store, model, records) for model, records in by_model.items()]


def _verification(store: ResultsStore, model: str, records: Iterable[Mapping[str, Any]]) -> ModelVerification:
    records = list(records)
    first = records[0]
    comparisons = {}
    for mode in MODES:
        runs = sorted((r for r in records if r["mode"] == mode), key=lambda r: r["replica"])
        fingerprints = [RunFingerprints.load(store.dir / r["fingerprints"]) for r in runs if r.get("fingerprints")]
        if len(fingerprints) == 2:
            comparisons[mode] = compare(mode, *fingerprints)
        else:
            comparisons[mode] = Comparison(mode, None, 0, 0, problem=f"{len(fingerprints)} of 2 runs recorded")
    return ModelVerification(
        model=model,
        backend=str(first.get("backend")),
        device=str((first.get("device") or {}).get("label")),
        device_name=first.get("device_name"),
        steps_asked=int(first.get("steps_asked") or 0),
        comparisons=comparisons,
        findings=[r["finding"] for r in records if r.get("finding")][:1],
        failures=[f"{r['run_id']}: {r.get('reason')}" for r in records if r["status"] == "failed"],
    )
