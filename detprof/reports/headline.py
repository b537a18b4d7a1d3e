"""The report's answer, first: per model and device, what determinism costs, what it buys, and the verdict.

One ``HeadlineRow`` per (device label, model, Keras backend) of every sweep: the kernel-time
and wall-time overheads with their 95% CIs, the verdict read from the headline metric
(``verdict.verdict``), what the stability study of the same model, label and backend
measured (when its models learned), the machine's noise floor where a calibration of that
backend ran, whether determinism held where ``detprof verify`` checked the same model, label
and backend, and the caveats that change how the row reads. The HTML's first screen, the
Markdown and ``--format json`` all render these rows, so the three say the same thing.

On a CPU (device label ``cpu``, or a device record with no GPU in it) the numbers are CPU
op times: they do not predict what determinism costs on a GPU, where it swaps cuDNN's
fastest, atomics-based algorithms for deterministic ones. ``cpu_notes`` says so and holds
the published GPU figures up as the reference instead.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detprof import backends
from detprof.analysis.layers import ModelAttribution
from detprof.analysis.overhead import PrecisionReached
from detprof.analysis.verification import ModelVerification
from detprof.intervals import CHEAP_OVERHEAD, Metric, Overhead
from detprof.reports.provenance import framework_name
from detprof.reports.published import PUBLISHED, SOURCE
from detprof.reports.tradeoff import NOISY_CHURN, QUADRANT_ADVICE, Noise, Quadrant
from detprof.reports.verdict import Verdict
from detprof.stability.learning import LONGER, Learning
from detprof.stability.variants import DEFAULT_VARIANTS

PROGRAM_STAND_IN = "FILE.py:FUNCTION"
"""What a suggested command that trains models takes for a program (``sweep --command``): a model of your own."""
STAND_IN_NOTE = f"a program is no model detprof can train: give yours as {PROGRAM_STAND_IN}"
FEEDING = {"data": "--data", "input_shape": "--input-shape"}
"""The sweep's settings that decide how its models are built and fed, where given (the manifest keeps them only
then): a command on the same models needs them to build and feed them alike."""
CPU_CAVEAT = "CPU op time: does not predict the GPU cost (see the published GPU figures)."
CPU_CHURN = "'s CPU kernels (the same result run to run with a fixed number of threads), not of the model."
"""How the caveat on a CPU's churn ends, whichever framework's kernels it names (``caveats``)."""
NOT_HELD_ADVICE = "determinism does not hold here: fix what the notes name first, then weigh its cost"
LEFT_OUT = "Stability study left out"
"""What the caveats that a report-level note repeats say (``shown_caveats`` drops them under it)."""


@dataclass(frozen=True)
class StabilityReading:
    """What one stability study of this model on this device label says determinism buys."""

    dataset: str
    learning: Learning
    noise: Noise

    @property
    def used(self) -> bool:
        """Whether it feeds the verdict: only a study whose models learned (or that cannot be told)."""
        return self.learning.learned is not False


@dataclass
class HeadlineRow:
    device: str
    device_name: str
    on_cpu: bool
    model: str
    backend: str
    """The Keras backend the sweep ran (``records.backend_of``)."""
    framework_version: str | None
    """The version of its framework (``versions[backend]``: torch 2.5.1), "/"-joined where runs differed."""
    kernel: Overhead | None
    wall: Overhead | None
    metric: Metric
    verdict: Verdict
    noise_floor: float | None
    calibrated: bool
    """Whether a calibration study of this device label ran (its floor may still be None for this model)."""
    stability: StabilityReading | None
    quadrant: Quadrant | None
    advice: str
    attribution: str | None
    caveats: list[str] = field(default_factory=list)
    verification: ModelVerification | None = None
    """Whether determinism held for this model, device label and backend (``detprof verify``), where it was verified."""
    parts: ModelAttribution | None = None
    """Its layers and ops by added time per step, read against its noise floor (``analysis.layers``)."""
    precision: PrecisionReached | None = None
    """How precise its interval came out against ``--precision``, where the sweep asked one."""
    under_load: bool = False
    """Whether every run of it shared the machine with other work (``analysis.conditions.every_run_shared``)."""

    @property
    def used_stability(self) -> StabilityReading | None:
        return self.stability if self.stability is not None and self.stability.used else None


def model_argument(given: str | None) -> str:
    """How a suggested command names a model: as ``--models`` was given it (a registry name, FILE.py:FUNCTION, ...);
    for a program (``given`` None), the form of a model of your own, which the user fills in."""
    return PROGRAM_STAND_IN if given is None else shlex.quote(given)


def suggested(command: str, givens: Sequence[str | None], backend: str, options: Sequence[str] = ()) -> str:
    """A command line on these models as a user types it, in backticks: the backend named unless it is the
    default, so that what it measures pairs with the study it is suggested for."""
    models = list(dict.fromkeys(model_argument(g) for g in givens))
    flag = "" if backend == backends.DEFAULT else f" --backend {backend}"
    return f"`detprof {command} --model{'s' if len(models) > 1 else ''} {','.join(models)}{flag}{''.join(options)}`"


def fleet_options(command: str) -> list[str]:
    """The ``--ray`` a study ran with, as its command line gave it: a study suggested beside a fleet's results runs
    on the same fleet, not on the machine that reads the report."""
    try:
        words = shlex.split(command)
    except ValueError:
        return []
    for i, word in enumerate(words):
        if word.startswith("--ray="):
            return [f" --ray {shlex.quote(word.removeprefix('--ray='))}"]
        if word == "--ray" and i + 1 < len(words):
            return [f" --ray {shlex.quote(words[i + 1])}"]
    return []


def longer_training_advice(config: Mapping[str, Any], backend: str, command: str) -> str | None:
    """The stability study of ``config`` again, trained for longer (``learning.LONGER`` times its epochs), on the same
    data, runs and variants and on the same fleet; None where it does not say its epochs."""
    epochs = config.get("epochs")
    if not isinstance(epochs, int) or isinstance(epochs, bool) or not config.get("model"):
        return None
    options = [f" --dataset {shlex.quote(str(config['dataset']))}"] if config.get("dataset") else []
    options.append(f" --epochs {epochs * LONGER}")
    if config.get("runs"):
        options.append(f" --runs {int(config['runs'])}")
    variants = list(config.get("variants") or DEFAULT_VARIANTS)
    if variants != list(DEFAULT_VARIANTS):
        options.append(f" --variants {shlex.quote(','.join(variants))}")
    line = suggested("stability", [str(config["model"])], backend, options + fleet_options(command))
    return f"train it longer before reading its spread: {line} ({LONGER}x the {epochs} epochs it ran)"


def with_stand_in(text: str, givens: Sequence[str | None]) -> str:
    """``text`` with what the stand-in for a program means, where a program is among ``givens``."""
    return text if None not in givens else f"{text} ({STAND_IN_NOTE})"


def calibration_advice(
    givens: Sequence[str | None],
    backend: str,
    config: Mapping[str, Any],
    out: Path | None = None,
    fleet: Sequence[str] = (),
) -> str:
    """The calibration that gives these swept models their noise floor: on the same models and backend, built
    and fed as the sweep built and fed them (``FEEDING``; with ``--data``, at its batch size, which the file's
    examples must fill), on the same fleet (``fleet_options``), into ``out`` where given."""
    options = [f" {flag} {shlex.quote(str(config[key]))}" for key, flag in FEEDING.items() if config.get(key)]
    if config.get("data") and config.get("batch_size"):
        options.append(f" --batch-size {config['batch_size']}")
    if out is not None:
        options.append(f" --out {shlex.quote(str(out))}")
    options += fleet
    return f"{suggested('sweep --calibrate', givens, backend, options)} measures it (deterministic against itself)"


def advice(
    v: Verdict,
    q: Quadrant | None,
    stability: StabilityReading | None,
    given: str | None,
    backend: str = backends.DEFAULT,
    *,
    held: bool | None = None,
    dataset: str | None = None,
    fleet: Sequence[str] = (),
    unstudied: str | None = None,
) -> str:
    """What to do, in a few words, consistent with the verdict (never more sure of the cost than it is).

    The command it suggests names the row's model as the commands take it (``given``: None for a program, which
    the stability study cannot train) and its backend (``suggested``), so that the study it runs is the one this
    row pairs with, on ``dataset`` where the default's would not fit the model, on the fleet it ran on (``fleet``).
    Where ``detprof verify`` found that determinism does not hold (``held`` False), what it costs is beside the
    point until that is fixed, and the caveats say what to fix. ``unstudied``: why no stability study can train the
    model, said instead of a command that would be refused.
    """
    if held is False:
        return NOT_HELD_ADVICE
    if v.reading is None:
        return "no overhead measured: see the notes"
    if q is not None and q != "not settled":
        return QUADRANT_ADVICE[q]
    if stability is None and unstudied is not None:
        what = f"no stability study: {unstudied}"
    elif stability is None:
        stability_options = ([] if dataset is None else [f" --dataset {dataset}"]) + list(fleet)
        what = with_stand_in(
            f"no stability study: {suggested('stability', [given], backend, stability_options)} measures what it buys",
            [given],
        )
    elif not stability.used:
        what = "its stability study did not learn: what it buys is unknown"
    elif q is None or stability.noise.churn_impl is None:
        what = "its stability study has no impl variant: what it buys is unknown"
    else:
        churn = stability.noise.churn_impl
        amount = "real" if churn >= NOISY_CHURN else "little"
        what = f"it removes {amount} noise ({churn:.2%} of predictions flip under impl)"
    if v.reading == "not settled":
        return f"run more repeats before deciding; {what}"
    return f"{v.reading}; {what}"


def caveats(
    row_verdict: Verdict,
    overhead: Overhead | None,
    *,
    on_cpu: bool,
    noise_floor: float | None,
    stability: StabilityReading | None,
    notes: Iterable[str] = (),
    backend: str = backends.DEFAULT,
) -> list[str]:
    """The caveats of one row, most important first; each a sentence a reader can act on."""
    out = [n for n in notes if n]
    if row_verdict.why:
        out.append(f"Not settled: {row_verdict.why}.")
    if on_cpu:
        out.append(CPU_CAVEAT)
    if noise_floor is not None and overhead is not None:
        if abs(overhead.ratio - 1) <= noise_floor:
            out.append(
                f"The measured overhead ({overhead.ratio - 1:+.1%}) is within this machine's noise floor "
                f"(+/-{noise_floor:.1%})."
            )
        if noise_floor >= CHEAP_OVERHEAD - 1:
            out.append(
                f"This machine's noise floor (+/-{noise_floor:.1%}) is as wide as the {CHEAP_OVERHEAD:.2f}x line: "
                "its cheap/expensive readings need many repeats."
            )
    if stability is not None and stability.learning.learned is False:
        out.append(f"{LEFT_OUT}: its models did not learn on {stability.dataset}: {stability.learning.line()}.")
    elif stability is not None and stability.learning.learned is None:
        out.append("Stability study: whether its models learned cannot be told (no class count or no accuracy).")
    if (
        on_cpu
        and stability is not None
        and stability.used
        and stability.noise.churn_impl is not None
        and stability.noise.churn_impl < NOISY_CHURN
    ):
        churn = stability.noise.churn_impl
        out.append(f"{churn:.2%} churn under impl is a property of {framework_name(backend)}{CPU_CHURN}")
    return out


def shown_caveats(row: HeadlineRow, *, cpu_note: bool, left_out_note: bool) -> list[str]:
    """A row's caveats under the headline, less those a report-level note already says for every row."""
    said_for_cpu = (CPU_CAVEAT,) if cpu_note else ()
    return [
        c
        for c in row.caveats
        if c not in said_for_cpu
        and not (cpu_note and c.endswith(CPU_CHURN))
        and not (left_out_note and c.startswith(LEFT_OUT))
    ]


def cpu_notes(rows: Sequence[HeadlineRow]) -> list[str]:
    """The report-level lines for CPU rows: why their cost is not a GPU's, and why their churn is 0."""
    cpu = sorted({r.device for r in rows if r.on_cpu})
    if not cpu:
        return []
    notes = [
        f"Measured on a CPU ({', '.join(cpu)}): CPU op time does not predict what determinism costs on a GPU, "
        "where it replaces cuDNN's fastest (often atomics-based) algorithms with deterministic ones. "
        f"The published GPU figures ({SOURCE}) are the reference; run detprof sweep --gpu LABEL on the GPU "
        "you train on for your number."
    ]
    quiet = [
        r.backend
        for r in rows
        if r.on_cpu
        and r.used_stability is not None
        and r.used_stability.noise.churn_impl is not None
        and r.used_stability.noise.churn_impl < NOISY_CHURN
    ]
    if quiet:
        frameworks = " and ".join(dict.fromkeys(framework_name(b) for b in quiet))
        notes.append(
            f"Churn under impl near 0% on a CPU is {frameworks}'s CPU kernels giving the same result run to run "
            "with a fixed number of threads (each stability worker's share of the cores), not a property of the "
            "model: on a GPU the same model can churn."
        )
    return notes


def published_reference() -> list[list[str]]:
    """The published GPU overheads, one row each: GPU, what, deterministic / default GPU time."""
    return [[f.gpu.upper(), f.subject, f.published] for f in PUBLISHED]


def interval_json(o: Overhead | None) -> dict[str, Any] | None:
    if o is None:
        return None
    lo = o.ci_low if o.has_interval else None
    hi = o.ci_high if o.has_interval else None
    return {"ratio": o.ratio, "lo": lo, "hi": hi, "n": o.n, "half_width": o.precision, "first_stage": o.first_stage}


def _stability_json(s: StabilityReading | None) -> dict[str, Any] | None:
    if s is None:
        return None
    return {
        "dataset": s.dataset,
        "learned": s.learning.learned,
        "accuracy_mean": s.learning.accuracy,
        "chance": s.learning.chance,
        "learned_threshold": s.learning.needed,
        "used_in_verdict": s.used,
        "churn_impl": s.noise.churn_impl,
        "std_drop": s.noise.std_drop,
        "std_drop_se": s.noise.std_drop_se,
    }


def row_json(r: HeadlineRow) -> dict[str, Any]:
    """One row for ``--format json``: the documented keys first, then the rest."""
    v = r.verdict
    return {
        "device": r.device,
        "model": r.model,
        "backend": r.backend,
        "overhead": {"kernel": interval_json(r.kernel), "wall": interval_json(r.wall)},
        "verdict": v.reading,
        "noise_floor": r.noise_floor,
        "stability": _stability_json(r.stability),
        "device_name": r.device_name,
        "framework_version": r.framework_version,
        "on_cpu": r.on_cpu,
        "metric": r.metric,
        "verdict_text": v.text,
        "repeats": v.repeats,
        "repeats_needed": v.repeats_needed,
        "more_repeats": v.more_repeats,
        "precision": None if r.precision is None else r.precision.as_json(),
        "calibrated": r.calibrated,
        "learned": None if r.stability is None else r.stability.learning.learned,
        "churn_impl": None if r.used_stability is None else r.used_stability.noise.churn_impl,
        "std_drop": None if r.used_stability is None else r.used_stability.noise.std_drop,
        "reading": r.quadrant,
        "advice": r.advice,
        "attribution": r.attribution,
        "caveats": r.caveats,
    } | parts_json(r.parts)


def parts_json(parts: ModelAttribution | None) -> dict[str, Any]:
    """``layers`` and ``ops``, each sorted by added time per step (``PartCost.as_json``), and the share of the
    traced time no layer claims; absent where the traces place no kernel in a layer or an op."""
    if parts is None:
        return {}
    return {
        "layers": [part.as_json() for part in parts.layers],
        "ops": [part.as_json() for part in parts.ops],
        "unattributed_share": parts.unattributed_share,
    }
