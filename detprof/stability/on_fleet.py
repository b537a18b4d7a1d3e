"""``detprof stability --ray``: a stability study of one GPU type, its runs spread over that type's nodes.

The study is the one ``study.run_study`` runs (plan, store, progress, summary) with its
runs executed by the fleet's executor instead of this machine's pools: each run is a unit
that a node trains with ``study.execute_runs`` into a scratch store, and its record and
arrays come home (``fleet.transfer``). A node lost mid-run has the run trained again on
another node of the type; a run that fails is recorded failed, as on one machine.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console

from detprof.errors import UsageError
from detprof.fleet.cluster import FleetNode
from detprof.fleet.executor import FleetExecutor, Unit
from detprof.fleet.study import FleetOptions, print_lost, ready_fleet
from detprof.fleet.transfer import Bundle, collect, scratch_store, write_files
from detprof.options import RunOptions
from detprof.profiler.devices import DeviceChoice, choose_device
from detprof.stability.study import _failed, execute_runs
from detprof.stability.training import TrainConfig
from detprof.stability.variants import PlannedRun
from detprof.store import ResultsStore

RUN_FILES = ("log", "arrays", "weights_file")
"""The files a stability run's record names, which come home with it."""


@dataclass(frozen=True)
class TrainingJob:
    """What a node trains for one unit: one run of the study, as its type's device."""

    run: PlannedRun
    config: TrainConfig
    label: str
    force: bool
    token: str


def train_on_node(job: TrainingJob) -> Bundle:
    """On the node: the run trained by the study's own pooled worker, into a scratch store, to bring home."""
    device = choose_device(job.label, job.force)
    store = scratch_store(job.token, job.run.run_id, "stability")
    records: list[dict[str, Any]] = []
    execute_runs([job.run], replace(job.config, study_dir=str(store.dir)), 1, records.append, device=device)
    return collect(store, records, RUN_FILES, 0)


def device_identity(device: DeviceChoice) -> dict[str, Any]:
    """What the nodes of a type must agree on to file runs into one study: the label, forced or not, the board."""
    return {"label": device.label, "forced": device.forced, "gpu": device.gpu.name if device.gpu else None}


@contextmanager
def stability_fleet(options: RunOptions, console: Console) -> Iterator[tuple[DeviceChoice, Callable[..., None]]]:
    """Connected to the cluster with the type's nodes checked: the device they train as, and the executor.

    The executor has ``study.execute_runs``'s signature, for ``study.run_study(execute=...)``.
    """
    fleet_options = FleetOptions.of(options)
    if len(fleet_options.labels) != 1:
        raise UsageError("a stability study is of one GPU type: give --gpu once with --ray, and run one study per type")
    (label,) = fleet_options.labels
    resolvers = {label: partial(choose_device, label, fleet_options.force)}
    with ready_fleet(fleet_options, resolvers, device_identity) as (ray, fleet):
        for node, reason in fleet.left_out:
            console.print(f"left out: {node.name}: {reason}")
        executor = FleetExecutor(ray, fleet.nodes)
        token = secrets.token_hex(6)

        def execute(
            runs: list[PlannedRun],
            config: TrainConfig,
            jobs: int,
            on_record: Callable[[dict[str, Any]], None],
            on_start: Callable[[list[PlannedRun]], None],
            tasks_per_worker: int | None,
            *,
            device: DeviceChoice,
        ) -> None:
            store = ResultsStore(Path(config.study_dir).parent, "stability")
            units = [
                Unit(
                    run.run_id,
                    label,
                    f"{run.variant} r{run.run_index}",
                    train_on_node,
                    (TrainingJob(run, config, label, fleet_options.force, token),),
                )
                for run in runs
            ]
            planned = {run.run_id: run for run in runs}

            def on_done(unit: Unit, node: FleetNode, bundle: Bundle) -> None:
                write_files(bundle, store)
                for record in bundle.records:
                    on_record(record | node.record_fields())

            def on_failed(unit: Unit, node: FleetNode | None, reason: str) -> None:
                fields = node.record_fields() if node is not None else {}
                on_record(dict(_failed(planned[unit.key], reason, config.backend)) | fields)

            def on_running(_label: str, running: list[tuple[Unit, FleetNode]]) -> None:
                on_start([planned[unit.key] for unit, _node in running])

            executor.run(units, on_done, on_failed, on_running)

        yield fleet.resolved[label], execute
        print_lost(console, executor.lost)
