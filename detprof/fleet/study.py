"""A measured study (the sweep, its calibration) across GPU types, on the nodes of a Ray cluster.

Each GPU type is one study of its own, in ``OUT/<label>/<kind>``, planned and measured as on
one machine: the plan is the study's own (``plan_of``), and a node measures a paired repeat
(both modes, or both arms) with ``profiler.study.run_planned``, the one measured-study flow,
into a scratch store of its own; the driver files what comes back (``transfer``). Every
node of a type resolves the study's settings itself (its device, its tracer, the preset that
fits) and those must agree (``readiness``), so the study's manifest, and ``--resume``, work
as on one machine. The one report of ``OUT`` covers every type.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from rich.console import Console
from rich.markup import escape

from detprof import backends
from detprof.errors import UsageError
from detprof.fleet.cluster import FleetNode, connected, nodes_of_types
from detprof.fleet.executor import FleetExecutor, Unit
from detprof.fleet.node_types import ray_accelerator_type
from detprof.fleet.readiness import ReadyFleet, Resolve, check_nodes
from detprof.fleet.transfer import MB, Bundle, collect, deliver, scratch_store
from detprof.invocation import Invocation
from detprof.options import RunOptions
from detprof.profiler.measured_runs import (
    MeasurementTarget,
    PlannedRun,
    RunSettings,
    mode_pairs,
    results_dir_of,
    runs_to_measure,
)
from detprof.profiler.progress import RunProgress, progress_bars
from detprof.profiler.study import MeasuredStudy, run_planned
from detprof.records import MeasuredRun, measured_run
from detprof.store import ResultsStore, StudyKind

DEFAULT_MAX_TRACE_MB = 64.0
MEASURED_FILES = ("log", "kernel_table")
"""The files a measured run's record names, which come home with it (its trace comes up to the cap)."""


@dataclass(frozen=True)
class FleetOptions:
    """What ``--ray`` and the options beside it ask of a fleet, checked before anything connects."""

    address: str
    labels: tuple[str, ...]
    backend: str
    force: bool
    resume: bool
    max_trace_bytes: int

    @classmethod
    def of(cls, options: RunOptions) -> FleetOptions:
        assert options.ray is not None
        given = options.gpus or ((options.gpu,) if options.gpu else ())
        labels = tuple(dict.fromkeys(label.strip().lower() for label in given))
        if not labels:
            raise UsageError("--ray needs the GPU types to measure: --gpu LABEL for each (--gpu t4 --gpu a100)")
        for label in labels:
            ray_accelerator_type(label)
        if options.gpu_index is not None:
            raise UsageError("--gpu-index picks a GPU of this machine; on a fleet Ray gives each unit a GPU")
        max_trace_mb = DEFAULT_MAX_TRACE_MB if options.max_trace_mb is None else options.max_trace_mb
        if max_trace_mb < 0:
            raise UsageError(f"--max-trace-mb must be 0 or more, not {max_trace_mb:g}")
        return cls(
            options.ray,
            labels,
            backends.require(options.backend).name,
            options.force,
            options.resume,
            int(max_trace_mb * MB),
        )

    def label_options(self, options: RunOptions, label: str) -> RunOptions:
        """The options one GPU type's nodes resolve the study with: that label, as on one machine."""
        return replace(options, gpu=label, gpus=(label,), ray=None, max_trace_mb=None)

    def results_dir(self) -> Path:
        """``results/<date>-<label>-<label>...[-<backend>]``, as one machine's folder is named by its device."""
        return results_dir_of("-".join(self.labels), self.backend)


@contextlib.contextmanager
def ready_fleet(
    fleet_options: FleetOptions, resolvers: Mapping[str, Resolve], identity: Callable[[Any], Mapping[str, Any]]
) -> Iterator[tuple[ModuleType, ReadyFleet]]:
    """Connected to the cluster, with every node of the types asked for checked (``readiness.check_nodes``)."""
    with connected(fleet_options.address) as ray:
        nodes = nodes_of_types(ray, fleet_options.address, fleet_options.labels)
        yield (
            ray,
            check_nodes(
                ray,
                nodes,
                backend=fleet_options.backend,
                force=fleet_options.force,
                resolvers=resolvers,
                identity=identity,
            ),
        )


@dataclass(frozen=True)
class PairJob:
    """What a node measures for one unit of a measured study: a paired repeat, into its own scratch store."""

    kind: StudyKind
    resolve: Resolve
    pair: tuple[PlannedRun, ...]
    settings: RunSettings
    manifest: dict[str, Any]
    command: str
    token: str
    """The driver's: the node's scratch folder for this sweep (``transfer.scratch_store``)."""
    max_trace_bytes: int


def measure_pair(job: PairJob) -> Bundle:
    """On the node: the pair measured by the one measured-study flow, and what it recorded, to bring home.

    The node resolves its measurement target itself, under the GPU Ray gave this task
    (``CUDA_VISIBLE_DEVICES``), and must still resolve the settings its type agreed on.
    """
    settings, target = job.resolve()
    if settings.manifest() != job.settings.manifest():
        raise UsageError("this node now resolves other settings than when it was checked")
    store = scratch_store(job.token, job.pair[0].run_id, job.kind)
    records = run_planned(
        MeasuredStudy(job.kind, job.pair, job.settings, job.manifest, target, store.root, Invocation(job.command))
    )
    return collect(store, records, MEASURED_FILES, job.max_trace_bytes)


@dataclass
class TypeStudy:
    """One GPU type's study: its store, its settings and target, and its pairs."""

    label: str
    store: ResultsStore
    settings: RunSettings
    target: MeasurementTarget
    pairs: list[tuple[PlannedRun, ...]]
    total: int
    """Runs the study holds when complete (with the untraced runs a tracer that wraps the process adds)."""

    def runs_of(self, pair: Sequence[PlannedRun]) -> list[PlannedRun]:
        return runs_to_measure(pair, self.target.tracer)

    def pending(self) -> list[tuple[PlannedRun, ...]]:
        """The pairs not complete: a pair is measured whole again, both halves on one node."""
        return [p for p in self.pairs if not all(self.store.is_done(r.run_id) for r in self.runs_of(p))]

    def failed_records(self, pair: Sequence[PlannedRun], reason: str) -> list[MeasuredRun]:
        """The pair's runs as failed, for a unit no node could measure: ``--resume`` measures them again."""
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        tracer = self.target.tracer.name
        return [
            measured_run(
                run_id=run.run_id,
                mode=run.mode,
                backend=self.settings.backend,
                steps=self.settings.steps,
                warmup=self.settings.warmup,
                measures=run.measures,
                tracer=tracer if run.measures != "wall" else "none",
                device=self.target.device.as_record(),
                started_at=now,
                finished_at=now,
                duration_s=0.0,
                status="failed",
                reason=reason,
                **run.fields,
            )
            for run in self.runs_of(pair)
        ]


@dataclass
class FleetOutcome:
    studies: dict[str, TypeStudy]
    fleet: ReadyFleet
    lost: list[tuple[FleetNode, str]]


@dataclass(frozen=True)
class FleetStudy:
    """A measured study to run across GPU types: its kind, each type's resolver, its plan, and where it goes."""

    kind: StudyKind
    resolvers: Mapping[str, Resolve]
    plan_of: Callable[[Any], list[PlannedRun]]
    options: FleetOptions
    out: Path
    what: str
    """What is measured, in the line that opens the study ("2 models on t4, a100")."""
    command: str

    def open(self, label: str, resolved: tuple[RunSettings, MeasurementTarget]) -> TypeStudy:
        """One type's study in ``OUT/<label>``, opened (or resumed) as on one machine."""
        settings, target = resolved
        store = ResultsStore(self.out / label, self.kind)
        store.open(settings.manifest(), self.command, resume=self.options.resume)
        plan = self.plan_of(settings)
        return TypeStudy(label, store, settings, target, mode_pairs(plan), len(runs_to_measure(plan, target.tracer)))


def measure_on_fleet(study: FleetStudy, *, console: Console) -> FleetOutcome:
    """Check the nodes, then measure every GPU type's pending pairs on its ready nodes, filing results in ``OUT``."""
    kind, resolvers, fleet_options, out, command = study.kind, study.resolvers, study.options, study.out, study.command
    with ready_fleet(fleet_options, resolvers, lambda resolved: resolved[0].manifest()) as (ray, fleet):
        studies = {label: study.open(label, fleet.resolved[label]) for label in fleet_options.labels}
        _print_plan(console, kind, study.what, fleet, studies, fleet_options.address, out)
        token = secrets.token_hex(6)
        units = [
            Unit(
                key=f"{label}/{pair[0].run_id}",
                label=label,
                what=pair[0].label.rsplit(" ", 2)[0] + f" r{pair[0].repeat}",
                call=measure_pair,
                args=(
                    PairJob(
                        kind,
                        resolvers[label],
                        pair,
                        study.settings,
                        study.settings.manifest(),
                        command,
                        token,
                        fleet_options.max_trace_bytes,
                    ),
                ),
            )
            for label, study in studies.items()
            for pair in study.pending()
        ]
        pairs = {unit.key: unit.args[0].pair for unit in units}
        executor = FleetExecutor(ray, fleet.nodes)
        totals = {f"{kind} {label}": study.total for label, study in studies.items()}
        with progress_bars(console, totals, out) as bars:
            by_label = {label: bars[f"{kind} {label}"] for label in studies}
            for label, study in studies.items():
                left = sum(len(study.runs_of(pair)) for pair in study.pending())
                by_label[label].on_start("waiting for a node", study.total - left)

            def on_done(unit: Unit, node: FleetNode, bundle: Bundle) -> None:
                for record in deliver(bundle, studies[unit.label].store, node.record_fields()):
                    by_label[unit.label].on_done(record)

            def on_failed(unit: Unit, node: FleetNode | None, reason: str) -> None:
                study = studies[unit.label]
                fields = node.record_fields() if node is not None else {}
                for record in study.failed_records(pairs[unit.key], reason):
                    study.store.write_record(record | fields)  # type: ignore[arg-type]
                    by_label[unit.label].on_done(record)

            def on_running(label: str, running: list[tuple[Unit, FleetNode]]) -> None:
                progress = by_label[label]
                progress.on_start(_running_line(progress, running), progress.done_count)

            executor.run(units, on_done, on_failed, on_running)
    return FleetOutcome(studies, fleet, executor.lost)


def _running_line(progress: RunProgress, running: list[tuple[Unit, FleetNode]]) -> str:
    """The progress line's description of a type: how many units run and have failed, and which run where."""
    where = ", ".join(f"{unit.what} on {node.node_id[:8]}" for unit, node in running)
    return f"running {len(running)}, failed {progress.failed_count}" + (f": {where}" if where else "")


def _print_plan(
    console: Console,
    kind: StudyKind,
    what: str,
    fleet: ReadyFleet,
    studies: Mapping[str, TypeStudy],
    address: str,
    out: Path,
) -> None:
    """What runs where: each type's nodes, settings and tracer, and every node left out with its reason."""
    console.print(f"detprof {kind} on the Ray cluster at {escape(address)}: {what}, results in {escape(str(out))}")
    for label, study in studies.items():
        count = len(fleet.nodes[label])
        settings = study.settings
        forced = " (label forced)" if study.target.device.forced else ""
        console.print(
            f"  {escape(label)}{forced}: {count} node{'' if count == 1 else 's'}, 2 modes x {settings.repeats} "
            f"repeats, tracer {study.target.tracer.name}, {study.settings.pairing} pairs"
        )
    for node, reason in fleet.left_out:
        console.print(f"  left out: {escape(node.name)}, {escape(node.label)}: {escape(reason)}")


def print_lost(console: Console, lost: Sequence[tuple[FleetNode, str]]) -> None:
    """The units lost with their node (or its Ray worker) while measuring: each ran again, whole, elsewhere."""
    for node, what in lost:
        console.print(f"lost on {escape(node.name)} ({escape(node.label)}): {escape(what)}; measured again whole")
