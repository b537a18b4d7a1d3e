"""Before anything is scheduled: every node of a requested type checked, the unready ones left out.

On each node, pinned there, a Ray task runs ``detprof doctor`` for the GPU label and
backend, as a user would (``--format json``; with ``--force``, its GPU checks are reported,
not enforced). A node with GPUs also gets the doctor's smoke run (it proves the framework
sees the GPU and the trace holds its kernels); a node without, a test cluster's stand-in,
does not, since there it would prove nothing about a GPU. Then the task resolves the study's
settings as that node sees them (its device, its tracer, the preset that fits).
The nodes of a type must agree on those settings, since they file results into one study:
the largest group that agrees is used and the rest are left out, each with its reason. A
type with no ready node is one line, before anything runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from detprof.errors import DetprofError, ExitCode, UsageError, first_line, last_line
from detprof.fleet.cluster import FleetNode, pinned
from detprof.fleet.node_types import ray_accelerator_type
from detprof.store import config_hash

DOCTOR_EXITS = (ExitCode.OK, ExitCode.CHECK_FAILED)
"""``detprof doctor``: 0 ready, 1 not; anything else is an error of its own (its last line says which)."""

Resolve = Callable[[], Any]
"""What a study resolves on a node (the sweep: its settings and measurement target); it must pickle."""


@dataclass(frozen=True)
class NodeCheck:
    """What a node said of itself: ready or why not, its checklist, and the study's settings as it resolves them."""

    ready: bool
    reason: str
    checklist: dict[str, Any]
    resolved: Any = None


def doctor_command(label: str, backend: str, force: bool, smoke: bool) -> list[str]:
    """``detprof doctor`` as the fleet runs it on a node, with the node's own Python."""
    return [
        sys.executable,
        "-m",
        "detprof.cli",
        "doctor",
        "--gpu",
        label,
        "--backend",
        backend,
        *(["--force"] if force else []),
        "--smoke" if smoke else "--no-smoke",
        "--format",
        "json",
    ]


def check_node(label: str, backend: str, force: bool, smoke: bool, resolve: Resolve) -> NodeCheck:
    """On the node: ``detprof doctor``'s checklist for ``label``, then the study's settings there."""
    command = doctor_command(label, backend, force, smoke)
    doctor = subprocess.run(command, capture_output=True, text=True, check=False)
    try:
        checklist = json.loads(doctor.stdout) if doctor.returncode in DOCTOR_EXITS else None
    except ValueError:
        checklist = None
    if not isinstance(checklist, dict):
        said = last_line(doctor.stderr) or f"exit code {doctor.returncode}"
        return NodeCheck(False, f"detprof doctor failed there: {said}", {})
    if not checklist.get("ready"):
        return NodeCheck(False, str(checklist.get("reason") or "detprof doctor says it is not ready"), checklist)
    try:
        return NodeCheck(True, "", checklist, resolve())
    except DetprofError as exc:
        return NodeCheck(False, str(exc), checklist)


@dataclass
class ReadyFleet:
    """The nodes that measure each GPU type, the settings they agreed on, and the nodes left out with why."""

    nodes: dict[str, list[FleetNode]]
    resolved: dict[str, Any]
    left_out: list[tuple[FleetNode, str]] = field(default_factory=list)
    checklists: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each checked node's doctor checklist, by node id."""


def check_nodes(
    ray: ModuleType,
    nodes: Mapping[str, Sequence[FleetNode]],
    *,
    backend: str,
    force: bool,
    resolvers: Mapping[str, Resolve],
    identity: Callable[[Any], Mapping[str, Any]],
) -> ReadyFleet:
    """Check every node at once; ``identity`` says what of a resolution the nodes of one type must share."""
    task = ray.remote(check_node)
    pending = [
        (node, task.options(**pinned(node, cpus=0)).remote(label, backend, force, node.gpus > 0, resolvers[label]))
        for label, of_type in nodes.items()
        for node in of_type
    ]
    fleet = ReadyFleet({}, {})
    agreeing: dict[str, dict[str, list[tuple[FleetNode, NodeCheck]]]] = defaultdict(lambda: defaultdict(list))
    for node, ref in pending:
        try:
            checked: NodeCheck = ray.get(ref)
        except ray.exceptions.RayError as exc:
            fleet.left_out.append((node, f"its check did not finish: {first_line(exc)}"))
            continue
        fleet.checklists[node.node_id] = checked.checklist
        if not checked.ready:
            fleet.left_out.append((node, checked.reason))
            continue
        agreeing[node.label][config_hash(dict(identity(checked.resolved)))].append((node, checked))
    for label in nodes:
        groups = sorted(agreeing[label].values(), key=len, reverse=True)
        if not groups:
            reasons = "; ".join(f"{node.name}: {reason}" for node, reason in fleet.left_out if node.label == label)
            raise UsageError(f"--gpu {label}: no {ray_accelerator_type(label)} node is ready ({reasons})")
        chosen = groups[0][0][1].resolved
        fleet.nodes[label] = [node for node, _ in groups[0]]
        fleet.resolved[label] = chosen
        for group in groups[1:]:
            for node, checked in group:
                differs = settings_difference(identity(checked.resolved), identity(chosen))
                fleet.left_out.append((node, f"it resolves other settings than the other {label} nodes ({differs})"))
    return fleet


def settings_difference(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> str:
    """What differs between two nodes' settings, one ``key: theirs (the others: ours)`` each."""
    keys = sorted(k for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k))
    return ", ".join(f"{key}: {theirs.get(key)!r} (the others: {ours.get(key)!r})" for key in keys)
