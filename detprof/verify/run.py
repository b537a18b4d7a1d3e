"""``detprof verify`` as the core runs it: each model trained twice per mode, every tensor fingerprinted, compared.

Four runs per model (deterministic a and b, default a and b), each replica of a mode one process that
trains every model in turn, each from the seeds and session a fresh process starts from (``workload.fingerprint_runs``),
in the measuring environment of the device (its GPU pinned), with the same seed, the same batches
(drawn from the seed, or ``--data``'s leading rows at every step: what a model that takes tokens
or several inputs needs) and the same number of steps (``verify.workload``). The two runs of a mode run side by side
where nothing they choose depends on what else runs (``replicas_side_by_side``; nothing here is timed): on a CPU, and
on a GPU in PyTorch's deterministic mode; the rest one at a time on a GPU, each with the device to itself. The models
are named and built as the sweep names and builds them (``profiler.sweep_request``): registry names or your own. Each
run's record and fingerprints go to the results store, so ``--resume`` skips what is done and
the report reads it; ``analysis.verification`` compares. A training program of the user's
(``--command``) is verified by ``verify.program``, into the same records.
"""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from detprof import backends, locks
from detprof.analysis.verification import ModelVerification, verifications
from detprof.errors import DetprofError, UsageError
from detprof.invocation import command_line
from detprof.options import RunOptions
from detprof.profiler.measured_runs import MeasurementTarget, study_root
from detprof.profiler.process import WorkerEnvironment, timeout_reason
from detprof.profiler.progress import progress_bar
from detprof.profiler.sweep_request import SweepConfig, SweepRequest
from detprof.profiler.worker_call import CallTimedOut, call_in_worker
from detprof.profiler.worker_process import utc_now
from detprof.records import VerifyRun, verify_run
from detprof.store import ResultsStore
from detprof.verify.workload import VerifyAsk

DEFAULT_STEPS = 20
REPLICAS = ("a", "b")
WORKLOAD = "detprof.verify.workload:fingerprint_runs"
VERIFY_ORDER = ("deterministic", "default")
"""Deterministic mode first: its answer is the one ``verify`` exists to give."""


@dataclass(frozen=True)
class VerifyRequest:
    models: tuple[str, ...] | None
    options: RunOptions
    steps: int = DEFAULT_STEPS
    gradients: bool = False

    def checked(self) -> None:
        if self.steps < 1:
            raise UsageError(f"--steps must be at least 1, not {self.steps}")


@dataclass(frozen=True)
class VerifyOutcome:
    out: Path
    models: tuple[ModelVerification, ...]

    @property
    def held(self) -> bool:
        return all(model.held for model in self.models)


def run_verify(request: VerifyRequest, *, console: Console) -> VerifyOutcome:
    """Every model's four runs not already recorded, then every model compared."""
    request.checked()
    config, target = SweepRequest(request.models, replace(request.options, tracer="none")).resolve()
    config.say_before(console)
    asked = manifest(config, target, request.steps, request.gradients)
    out = study_root(request.options.out, target.device, target.backend, "verify", asked, config.labels())
    store = ResultsStore(out, "verify")
    opened = partial(store.open, asked, command_line(), resume=request.options.resume)
    with locks.holding(
        store.dir, (target.device.lock_key, target.device.label), wait=request.options.wait, first=opened
    ):
        console.print(
            f"detprof verify: {len(config.models)} model{'' if len(config.models) == 1 else 's'} x 2 modes x 2 runs "
            f"of {request.steps} steps{', compiled' if config.compile else ''} on {escape(target.device.label)} "
            f"({target.backend}), results in "
            f"{escape(str(out))}"
        )
        run_arms(store, config, target, list(MODE_ARMS), request.steps, request.gradients, console=console)
    return VerifyOutcome(store.dir, tuple(verifications(store)))


VERIFIED_INPUTS = ("data", "classes", "input_shape", "amp", "own_models")
"""What the sweep's configuration says of how the models are built, fed and trained, where given."""


def manifest(config: SweepConfig, target: MeasurementTarget, steps: int, gradients: bool) -> dict[str, Any]:
    """What identifies a verification: a resumed one must match it (the models' classes, input, precision and
    files among it, where given)."""
    built = {k: v for k, v in config.manifest().items() if k in VERIFIED_INPUTS and v is not None}
    compiled = {"compile": True} if config.compile else {}
    return (
        built
        | compiled
        | {
            "models": list(config.models),
            "backend": target.backend,
            "gpu_label": target.device.label,
            "steps": steps,
            "gradients": gradients,
            "seed": config.seed,
            "batch_size": config.batch_size,
            "input_size": config.input_size,
        }
    )


@dataclass(frozen=True)
class VerifyArm:
    """Two runs to compare: ``name`` in their run ids, their mode, and the knobs they set (None: the mode's)."""

    name: str
    mode: str
    knobs: tuple[str, ...] | None = None
    without: str | None = None
    """A knob study's check: the knob full determinism runs without."""
    helper: str | None = None
    """A knob study's check of a helper's switches (``Helper.key``)."""
    every: bool = False
    """A knob study's check of every switch on that its ``drop`` arms leave one out of (``sweep.knobs.EVERY``)."""


MODE_ARMS = tuple(VerifyArm(mode, mode) for mode in VERIFY_ORDER)
"""``verify``'s arms: each mode as it is, deterministic first."""


def run_arms(
    store: ResultsStore,
    config: SweepConfig,
    target: MeasurementTarget,
    arms: list[VerifyArm],
    steps: int,
    gradients: bool,
    *,
    console: Console,
) -> None:
    """Each model's two runs of each arm not already recorded in ``store`` (opened by the caller): each replica of
    an arm (of a group of arms: ``arm_groups``) one process for every model (``workload.fingerprint_runs``), its two
    replicas side by side where ``replicas_side_by_side`` lets them."""
    plans = config.model_plans()
    total, done = 2 * len(plans) * len(arms), 0
    with progress_bar(console, store.kind, total, store.dir) as progress:
        for group in arm_groups(arms, config, target):
            units = [(arm, plan.label) for arm in group for plan in plans]
            left = [
                (unit, replica) for replica in REPLICAS for unit in units if not store.is_done(_run_id(unit, replica))
            ]
            done += 2 * len(units)
            models = f"{len(plans)} model{'s' * (len(plans) != 1)}"
            progress.on_start(f"{' + '.join(arm.name for arm in group)} ({models})", done - len(left))
            asks = {
                (arm.name, plan.label): VerifyAsk(
                    plan.workload_spec(config.batch_size, config.amp),
                    arm.mode,
                    target.backend,
                    config.seed,
                    steps,
                    gradients,
                    None if arm.knobs is None else list(arm.knobs),
                    config.compile,
                )
                for arm in group
                for plan in plans
            }
            beside = replicas_side_by_side(group, target.backend, target.on_gpu)
            todo = [[unit for unit, r in left if r == name] for name in REPLICAS]
            for record in _replicas(store, target, asks, todo, config.run_timeout_s, beside):
                progress.on_done(record)


def _replicas(
    store: ResultsStore,
    target: MeasurementTarget,
    asks: dict[tuple[str, str], VerifyAsk],
    todo: list[list[tuple[VerifyArm, str]]],
    timeout_s: float | None,
    beside: bool,
) -> list[VerifyRun]:
    """Each replica's runs of ``todo`` (a list per replica), side by side where ``beside``. On a GPU, a run that ran
    out of device memory beside the other replica's (``backends.OUT_OF_MEMORY``) runs again with the device to its
    replica alone, its record replaced: a model the GPU holds once but not twice is still verified."""
    shared = beside and target.on_gpu
    environment = WorkerEnvironment(target.device, shares_gpu=shared)
    replica = partial(_replica, store, environment, asks=asks, timeout_s=timeout_s, beside=beside)
    with ThreadPoolExecutor(len(REPLICAS) if beside else 1) as pool:
        ran = [record for records in pool.map(replica, REPLICAS, todo) for record in records]
    crowded = {
        r["run_id"]
        for r in ran
        if shared and r["status"] == "failed" and str(r["reason"]).startswith(backends.OUT_OF_MEMORY)
    }
    if not crowded:
        return ran
    alone = partial(_replica, store, WorkerEnvironment(target.device), asks=asks, timeout_s=timeout_s, beside=False)
    again = [
        (name, [unit for unit in units if _run_id(unit, name) in crowded])
        for name, units in zip(REPLICAS, todo, strict=True)
    ]
    return [r for r in ran if r["run_id"] not in crowded] + [
        r for name, units in again if units for r in alone(name, units)
    ]


def replicas_side_by_side(group: list[VerifyArm], backend: str, on_gpu: bool) -> bool:
    """Whether the two replicas of ``group`` run side by side: a bitwise comparison times nothing, so they do wherever
    what each run chooses cannot depend on what runs beside it. On a CPU it cannot. On a GPU it can where a framework
    picks kernels by timing them: in deterministic mode on a backend that then picks none so
    (``Backend.deterministic_mode_times_kernels``: PyTorch), the runs' kernels are bitwise alike however the device is
    shared, so a load that parted them would be a finding, not noise. Default mode's runs, a knob study's checks (full
    determinism less a switch, which may be the one that stops the timing), and every run on the other backends
    each have the device to themselves."""
    if not on_gpu:
        return True
    full = all(arm.mode == "deterministic" and arm.knobs is None for arm in group)
    return full and not backends.get(backend).deterministic_mode_times_kernels


def arm_groups(arms: list[VerifyArm], config: SweepConfig, target: MeasurementTarget) -> list[list[VerifyArm]]:
    """The arms whose runs one process per replica trains in turn, each model's run starting from the seeds of a
    fresh process: a knob study's checks (arms of one mode) that set alike the knobs a process takes only when it
    starts (``Backend.process_knobs``), where its backend puts a process under another arm's knobs between models
    (``Backend.knobs_switch_between_runs``) and nothing else keeps them apart (``Backend.shared_process_refusal``);
    on a GPU only where the study pairs its measured arms in one process too (``--pairing in-process``, as
    ``gpu-study`` asks for it where its pairing check agreed). Otherwise, and for ``verify``'s two modes (each
    answers for a process started in it), an arm a process of its own."""
    backend = backends.get(target.backend)
    trusted = not target.on_gpu or config.pairing == "in_process"
    if len({arm.mode for arm in arms}) > 1 or not backend.knobs_switch_between_runs or not trusted:
        return [[arm] for arm in arms]
    knobs = {arm.name: target.applying(config.determinism(arm.mode, arm.knobs).knob_set()) for arm in arms}
    alike: dict[frozenset[str], list[VerifyArm]] = {}
    for arm in arms:
        alike.setdefault(backend.process_knobs([knobs[arm.name]], target.on_gpu), []).append(arm)
    groups: list[list[VerifyArm]] = []
    for group in alike.values():
        sets = [knobs[arm.name] for arm in group]
        apart = backend.shared_process_refusal(sets, compile=config.compile, on_gpu=target.on_gpu) is not None
        groups += [[arm] for arm in group] if apart else [group]
    return groups


def run_id(model: str, mode: str, replica: str) -> str:
    """A run's id: its model's (or program's) name, its mode and its replica (``smallcnn--default--b``)."""
    return f"{model}--{mode}--{replica}"


def _run_id(unit: tuple[VerifyArm, str], replica: str) -> str:
    arm, model = unit
    return run_id(model, arm.name, replica)


def _replica(
    store: ResultsStore,
    environment: WorkerEnvironment,
    replica: str,
    units: list[tuple[VerifyArm, str]],
    *,
    asks: dict[tuple[str, str], VerifyAsk],
    timeout_s: float | None,
    beside: bool,
) -> list[VerifyRun]:
    """One replica's runs of ``units`` (an arm and a model each) in a fresh worker, ended after ``timeout_s``
    (``--run-timeout``) per run, ``beside`` the other replica's or not; a record for each, written whatever happened:
    where the worker ended early, the run it was on failed with why, and a fresh worker takes the runs after it."""
    records: list[VerifyRun] = []
    while units:
        these = [_run_id(unit, replica) for unit in units]
        log = store.dir / "logs" / f"{these[0]}{'+more' if len(these) > 1 else ''}.log"
        answers = store.dir / "work" / f"{these[0]}.answers"
        shutil.rmtree(answers, ignore_errors=True)
        answers.mkdir(parents=True)
        log.parent.mkdir(parents=True, exist_ok=True)
        started, t0 = utc_now(), time.monotonic()
        request = {
            "asks": [asdict(asks[(arm.name, model)]) for arm, model in units],
            "outs": [str(store.dir / "fingerprints" / this) for this in these],
            "answers": str(answers),
        }
        ended: str | None = None
        try:
            call_in_worker(
                WORKLOAD,
                request,
                f"verifying {', '.join(sorted({model for _, model in units}))}",
                environment=environment,
                log=log,
                timeout_s=None if timeout_s is None else timeout_s * len(units),
            )
        except CallTimedOut:
            ended = timeout_reason(timeout_s)
        except DetprofError as exc:
            ended = str(exc)
        finished: set[str] = set()
        for index, (arm, model) in enumerate(units):
            path = answers / f"{index}.json"
            if path.is_file():
                answer = dict(json.loads(path.read_text()))
            elif ended is not None:
                answer = {"status": "failed", "reason": ended, "steps": 0, "started_at": started}
                answer["duration_s"] = round(time.monotonic() - t0, 3)
            else:
                break
            answer["side_by_side"] = beside
            record = _record(store, arm, model, replica, asks[(arm.name, model)], answer, environment, log)
            records.append(record)
            finished.add(these[index])
            if not path.is_file():
                break
        units = [unit for unit, this in zip(units, these, strict=True) if this not in finished]
        shutil.rmtree(answers, ignore_errors=True)
    return records


def _record(
    store: ResultsStore,
    arm: VerifyArm,
    model: str,
    replica: str,
    ask: VerifyAsk,
    answer: dict[str, Any],
    environment: WorkerEnvironment,
    log: Path,
) -> VerifyRun:
    """A run's record from its worker's answer, written to ``store``."""
    this = run_id(model, arm.name, replica)
    folder = Path("fingerprints") / this
    took = int(answer.pop("steps", 0))
    parts = answer.get("time_parts") or {}
    record = verify_run(
        run_id=this,
        model=model,
        mode=ask.mode,
        replica=replica,
        status=answer.pop("status"),
        reason=answer.pop("reason", None),
        backend=ask.backend,
        steps=took,
        steps_asked=ask.steps,
        fingerprints=str(folder) if took else None,
        device=environment.device.as_record(),
        started_at=answer.pop("started_at", utc_now()),
        finished_at=answer.pop("finished_at", utc_now()),
        duration_s=answer.pop("duration_s", round(sum(parts.values()), 3)),
        log=str(log.relative_to(store.dir)),
        **answer,
        **({} if arm.without is None else {"without": arm.without, "knobs": list(arm.knobs or ())}),
        **({} if arm.helper is None else {"helper": arm.helper, "knobs": list(arm.knobs or ())}),
        **({"every": True, "knobs": list(arm.knobs or ())} if arm.every else {}),
    )
    store.write_record(dict(record))
    return record
