"""Whether determinism holds, from ``detprof verify``'s runs: two runs of each mode, compared tensor by tensor.

Two runs of one mode that start from the same seed and see the same batches are the same run
only if every tensor of every step is the same to the bit. The first tensor whose digest
differs (steps in order; within a step the layers' outputs in model order, then the
gradients, then the weights after the update) is where they part: the layer that injects
the noise, even one without weights, since a forward pass is compared before any update. How
the difference then grows is read off each layer's output step by step: the largest absolute
difference over the tensors' samples (``fingerprints``), exact for tensors no larger than a
sample.

A training program (``verify --command``) is compared on what it fingerprinted
(``detprof.fingerprint``), in the order it did, and on how its runs ended: both ok, after as
many marked steps (``detprof.step()``). Two runs that fingerprinted different tensors at a step
part there. A program that fingerprinted nothing is compared on those alone, and says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import zip_longest
from typing import Any

import numpy as np

from detprof.determinism import MODES
from detprof.fingerprints import SAMPLE_SIZE, Fingerprint, Kind, RunFingerprints, sampled_difference
from detprof.formatting import counted, in_all
from detprof.models import kinds
from detprof.store import ResultsStore

PART_KINDS: tuple[Kind, ...] = ("output", "weights")
"""The fingerprints that name a part of the model (a layer, a module); a gradient names a parameter."""


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

    def line(self, *, program: bool = False, part: str = "layer") -> str:
        """Where, and by how much; a program's tensor is named as it named it, its kind as it fingerprinted it
        (when, in its step, only the program knows); a model's ``part`` as its kind calls it (a layer, a module)."""
        size = f"max |diff| {self.max_abs:.3g}" + ("" if self.exact else f" (over {SAMPLE_SIZE} sampled values)")
        if program:
            return f"step {self.step}, {self.layer} ({self.kind}), {size}"
        what = {"output": "output", "weights": "weights after the update", "gradients": "gradient"}[self.kind]
        return f"step {self.step}, {part} {self.layer} ({what}), {size}"

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
    """The model's parts compared: each layer or module with an output or weights of its own fingerprinted (a
    compiled module's submodules by their weights alone)."""
    first_difference: Difference | None = None
    growth: dict[str, list[float]] = field(default_factory=dict)
    """Layer -> the largest difference of its output at each step (over its sample), in model order."""
    problem: str | None = None
    """Why the runs are not comparable; or, parted without a tensor that differs, how (a program's runs that
    fingerprinted different tensors, or marked different numbers of steps), worded to follow "the runs part"."""
    fingerprinted: int = 0
    """Tensors the runs fingerprinted (each name and kind once); 0: a program that fingerprinted nothing."""
    marked_steps: int | None = None
    """A program's: the steps each of its runs marked (``detprof.step()``); None for a model, or a program
    without a measured window."""

    def parting(self, *, program: bool = False, part: str = "layer") -> str:
        """Where runs that are not identical part (``the runs part ...``): at the first tensor that differs, else
        as ``problem`` says."""
        if self.first_difference is not None:
            return f"at {self.first_difference.line(program=program, part=part)}"
        return str(self.problem)

    def to_json(self) -> dict[str, Any]:
        first = None if self.first_difference is None else self.first_difference.to_json()
        return {
            "identical": self.identical,
            "first_difference": first,
            "steps": self.steps,
            "layers": self.layers,
            "fingerprinted": self.fingerprinted,
            "marked_steps": self.marked_steps,
            "problem": self.problem,
        }


def compare(mode: str, a: RunFingerprints, b: RunFingerprints) -> Comparison:
    """Two runs of ``mode`` compared over the steps both took, up to a step where they fingerprinted different
    tensors (a program's runs can: its code decides what it fingerprints)."""
    steps = min(len(a.steps), len(b.steps))
    layers = len({f.name for f in a.steps[0] if f.kind in PART_KINDS}) if a.steps else 0
    fingerprinted = len({(f.kind, f.name) for step in a.steps for f in step})
    if steps == 0:
        return Comparison(mode, None, 0, layers, problem="a run took no step", fingerprinted=fingerprinted)
    first = None
    growth: dict[str, list[float]] = {}
    for step in range(steps):
        unmatched = _unmatched(step, a.steps[step], b.steps[step])
        if unmatched is not None:
            return Comparison(mode, False, step, layers, first, growth, unmatched, fingerprinted)
        for x, y in zip(a.steps[step], b.steps[step], strict=True):
            if x.digest == y.digest:
                difference = 0.0
            else:
                difference = sampled_difference(a.sample(step, x), b.sample(step, y))
                if first is None:
                    first = Difference(step, x.name, x.kind, difference, int(np.prod(x.shape)) <= SAMPLE_SIZE)
            if x.kind == "output":
                growth.setdefault(x.name, []).append(difference)
    return Comparison(mode, first is None, steps, layers, first, growth, fingerprinted=fingerprinted)


def _unmatched(step: int, xs: Sequence[Fingerprint], ys: Sequence[Fingerprint]) -> str | None:
    """How two runs' fingerprints of a step do not match one for one (name and kind, in order); None when they do."""
    for x, y in zip_longest(xs, ys):
        if x is None or y is None or (x.kind, x.name) != (y.kind, y.name):
            return f"at step {step}, run a fingerprinted {_named(x)} where run b fingerprinted {_named(y)}"
    return None


def _named(found: Fingerprint | None) -> str:
    return "nothing more" if found is None else f"{found.name} ({found.kind})"


@dataclass(frozen=True)
class ModelVerification:
    """A model's (or a program's) verification on one device and backend: both modes compared, and what refused
    determinism."""

    model: str
    backend: str
    device: str
    device_name: str | None
    comparisons: dict[str, Comparison]
    findings: list[dict[str, Any]]
    failures: list[str]
    """Runs that failed for another reason than an op refusing determinism: their reasons."""
    program: str | None = None
    """A program's command (``verify --command``; ``model`` is its ``--name``); None for a model."""
    compilation_cache: str | None = None
    """The framework's cross-process cache of compiled steps as every run read it back ("off": each run compiled
    its steps itself, so that the runs could differ in what compiling chose); None where the runs did not record one
    alike (a framework that keeps none, a program, older records)."""
    compiled: bool = False
    """Every run trained its model through ``torch.compile`` (``verify --compile``)."""
    side_by_side: tuple[str, ...] = ()
    """The modes whose two runs ran beside each other on the device (``verify.run.replicas_side_by_side``)."""
    part: str = "layer"
    """What the model's parts are called: a Keras model's layers, a native module's modules (by their paths)."""

    @property
    def held(self) -> bool | None:
        """Whether deterministic mode was bitwise reproducible; None where it could not be told. A program that
        fingerprinted nothing held if its runs ended alike, which is all that could be compared."""
        if self.findings:
            return False
        return self.comparisons["deterministic"].identical

    def lines(self) -> list[str]:
        """What ``detprof verify`` says of the model, one line per mode and per finding."""
        where = f"{self.model} on {self.device} ({self.backend})"
        deterministic = self.comparisons["deterministic"]
        program = self.program is not None
        out = []
        if self.findings:
            out += [f"{where}: not deterministic: {f['op'] or 'an op'} refused ({f['message']})" for f in self.findings]
            out += [
                f"  {f['op'] or 'the op'}"
                + (f" in {self.part} {f['layer']}" if f["layer"] else "")
                + f": {f['advice']}"
                for f in self.findings
            ]
        elif deterministic.identical:
            out.append(f"{where}: deterministic mode: {self._same(deterministic)}")
        elif deterministic.identical is False:
            out.append(
                f"{where}: NOT deterministic on this device and stack: the two deterministic runs part "
                f"{deterministic.parting(program=program, part=self.part)}"
            )
        else:
            out.append(f"{where}: deterministic mode could not be verified: {self._why(deterministic)}")
        default = self.comparisons["default"]
        if default.identical and program and not default.fingerprinted:
            out.append(f"  default mode: {self._same(default)}")
        elif default.identical:
            out.append(
                f"  default mode: identical too, over {counted(default.steps, 'step')}: on this device the default is "
                f"already deterministic for this {'program' if program else 'model'}"
            )
        elif default.identical is False:
            out.append(f"  default mode: the runs part {default.parting(program=program, part=self.part)}")
        else:
            out.append(f"  default mode: not compared: {self._why(default)}")
        compared = [c for c in self.comparisons.values() if c.identical is not None]
        if program and compared and not any(c.fingerprinted for c in compared):
            out.append(
                "  nothing was fingerprinted (detprof.fingerprint() in the window): only exit status and marked "
                "steps compared"
            )
        return out

    def _same(self, comparison: Comparison) -> str:
        """What two runs that did not part had in common."""
        if self.program is None:
            return f"bitwise identical over {counted(comparison.steps, 'step')} {in_all(comparison.layers, self.part)}"
        if comparison.fingerprinted:
            where = in_all(comparison.fingerprinted, "fingerprinted tensor")
            return f"bitwise identical over {counted(comparison.steps, 'step')} {where}"
        marked = comparison.marked_steps
        return "both runs exited 0 " + (f"after {marked} marked steps" if marked is not None else "without a window")

    def _why(self, comparison: Comparison) -> str:
        """Why ``comparison``'s mode could not be compared: its own runs' failures (the other mode's are on that
        mode's line), one reason once where both runs failed alike."""
        own = [f for f in self.failures if f"--{comparison.mode}--" in f.split(": ", 1)[0]]
        reasons = {f.split(": ", 1)[-1] for f in own}
        if len(own) > 1 and len(reasons) == 1:
            return f"both runs failed: {reasons.pop()}"
        return "; ".join(own) or comparison.problem or "no runs"

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "command": self.program,
            "backend": self.backend,
            "device": self.device,
            "device_name": self.device_name,
            "deterministic": self.comparisons["deterministic"].to_json(),
            "default": self.comparisons["default"].to_json(),
            "held": self.held,
            "findings": self.findings,
            "failures": self.failures,
            "compilation_cache": self.compilation_cache,
            "compiled": self.compiled,
            "side_by_side": list(self.side_by_side),
        }


KNOB_CHECK_ARMS = ("without", "helper", "every")
"""The fields that mark a knob study's check of an arm other than full determinism (``verify.run.VerifyArm``)."""


def verifications(store: ResultsStore) -> list[ModelVerification]:
    """Every model (or program) of a verification study, in the order its runs started (the order they were asked for).

    The store lists records by file name; a run's ``started_at`` (ISO 8601, so it sorts as text)
    keeps the models in the order ``detprof verify`` ran them, whatever their names.
    """
    by_model: dict[str, list[dict[str, Any]]] = {}
    for record in sorted(store.records(), key=lambda r: str(r.get("started_at") or "")):
        if not any(record.get(arm) for arm in KNOB_CHECK_ARMS):
            by_model.setdefault(record["model"], []).append(record)
    return [_verification(store, model, records) for model, records in by_model.items()]


def _verification(store: ResultsStore, model: str, records: Iterable[Mapping[str, Any]]) -> ModelVerification:
    records = list(records)
    first = records[0]
    program = first.get("program")
    comparisons = {}
    for mode in MODES:
        runs = sorted((r for r in records if r["mode"] == mode), key=lambda r: r["replica"])
        if program is not None:
            comparisons[mode] = _program_comparison(store, mode, runs)
            continue
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
        comparisons=comparisons,
        findings=[r["finding"] for r in records if r.get("finding")][:1],
        failures=[f"{r['run_id']}: {r.get('reason')}" for r in records if r["status"] == "failed"],
        program=None if program is None else str(program.get("command")),
        compilation_cache=_alike(r.get("compilation_cache") for r in records),
        compiled=bool(records) and all((r.get("settings") or {}).get("compile") for r in records),
        side_by_side=tuple(
            mode for mode in MODES if [r.get("side_by_side") for r in records if r["mode"] == mode] == [True, True]
        ),
        part=kinds.part_word(first.get("model_api")),
    )


def _alike(values: Iterable[str | None]) -> str | None:
    """The one value every run recorded; None where they differ or none recorded it."""
    found = set(values)
    return found.pop() if len(found) == 1 else None


def _program_comparison(store: ResultsStore, mode: str, runs: Sequence[Mapping[str, Any]]) -> Comparison:
    """A program's two runs of ``mode``: what they fingerprinted (``compare``), then how many steps they marked.

    Only runs that ended ok (exit status 0, determinism as the mode asks) are compared: a
    failed run has no end to compare but its reason, which the verification lists.
    """
    if len(runs) != 2 or any(r["status"] != "ok" for r in runs):
        ok = sum(r["status"] == "ok" for r in runs)
        return Comparison(mode, None, 0, 0, problem=f"{ok} of 2 runs ended ok")
    marked = [(r.get("program") or {}).get("marked_steps") for r in runs]
    taken = [RunFingerprints.load(store.dir / r["fingerprints"]) if r.get("fingerprints") else None for r in runs]
    if taken[0] is not None and taken[1] is not None:
        comparison = compare(mode, taken[0], taken[1])
    elif taken[0] is not None or taken[1] is not None:
        only = "a" if taken[0] is not None else "b"
        problem = f"on whether they fingerprinted: run {only} did, the other did not"
        return Comparison(mode, False, 0, 0, problem=problem)
    else:
        comparison = Comparison(mode, True, 0, 0)
    if comparison.identical and marked[0] != marked[1]:
        problem = f"on how many steps they marked: {marked[0]} in run a, {marked[1]} in run b"
        return replace(comparison, identical=False, problem=problem)
    return replace(comparison, marked_steps=marked[0])
