"""The Ray cluster a fleet study runs on: connecting to it, and its live nodes of each GPU type.

Ray is an optional dependency (``detprof[ray]``): it is imported only when ``--ray`` is given,
and its absence is one line, not an ``ImportError``. Connecting sets Ray's own logging to
errors only and keeps the workers' output off the driver's console: the fleet's one progress
display is what a user reads, and every run's log comes home with its record.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from detprof import interrupts
from detprof.errors import UsageError, first_line
from detprof.fleet.node_types import carries, ray_accelerator_type, types_carried


def ray_module() -> ModuleType:
    """The ``ray`` package, or one line saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise UsageError(f"--ray needs Ray: pip install 'detprof[ray]' ({first_line(exc)})") from exc
    return ray


@contextlib.contextmanager
def connected(address: str) -> Iterator[ModuleType]:
    """Connected to the Ray cluster at ``address`` for the block: ``auto``, ``HOST:PORT`` or ``ray://HOST:10001``.

    Disconnects at the end, whatever happened: Ray then ends this driver's tasks still running.
    """
    ray = ray_module()
    _refuse_unreachable(address)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Ray's client warns of a timeout it then raises
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        if address == "auto":
            raise UsageError(
                "--ray auto: no Ray cluster runs on this machine: start one (ray start --head) or give its "
                "HOST:PORT or ray://HOST:10001"
            ) from exc
        raise UsageError(f"--ray {address}: no Ray cluster to connect to there ({first_line(exc)})") from exc
    interrupts.reclaim()
    try:
        yield ray
    finally:
        ray.shutdown()


REACH_S = 5.0
"""How long the address of ``--ray`` may take to answer a connection: Ray itself retries an address where nothing
listens for minutes, printing its connection errors all the while."""


def _refuse_unreachable(address: str) -> None:
    """One line where nothing answers at ``address``'s host and port (``auto`` finds its cluster itself)."""
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_S).close()
    except OSError as exc:
        why = f"no answer within {REACH_S:g} s" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise UsageError(f"--ray {address}: no Ray cluster to connect to there ({why})") from exc


@dataclass(frozen=True)
class FleetNode:
    """One live Ray node that serves a GPU type of the study."""

    node_id: str
    address: str
    label: str
    """The detprof GPU label it measures (``t4``): the type it carries in Ray's name (``T4``)."""
    gpus: int
    """The GPUs Ray schedules on it (0 on a CPU-only test node, whose label is then forced)."""

    @property
    def name(self) -> str:
        """How a message names the node: a node id is long, its first characters tell nodes apart."""
        return f"node {self.node_id[:12]} ({self.address})"

    @property
    def slots(self) -> int:
        """Units measured on it at once: one per GPU, each with that GPU to itself; one on a node without GPUs."""
        return max(1, self.gpus)

    def record_fields(self) -> dict[str, str]:
        """What every record measured on the node says about it."""
        return {"ray_node_id": self.node_id, "ray_node_address": self.address}


def live_nodes(ray: ModuleType) -> list[dict[str, Any]]:
    return [node for node in ray.nodes() if node.get("Alive")]


def nodes_of_types(ray: ModuleType, address: str, labels: Sequence[str]) -> dict[str, list[FleetNode]]:
    """The live nodes of each GPU type; a type without any is one line, before anything runs."""
    alive = live_nodes(ray)
    found: dict[str, list[FleetNode]] = {}
    for label in labels:
        found[label] = [
            FleetNode(
                node_id=str(node["NodeID"]),
                address=str(node.get("NodeManagerAddress") or "?"),
                label=label,
                gpus=int((node.get("Resources") or {}).get("GPU", 0)),
            )
            for node in alive
            if carries(node, label)
        ]
        if not found[label]:
            carried = sorted(set().union(*(types_carried(node) for node in alive)))
            raise UsageError(
                f"--gpu {label}: the Ray cluster at {address} has no live node of accelerator type "
                f"{ray_accelerator_type(label)} (its nodes carry: {', '.join(carried) or 'no accelerator type'})"
            )
    return found


def pinned(node: FleetNode, *, cpus: float) -> dict[str, Any]:
    """Ray task options that run a task on ``node`` and nowhere else, with one of its GPUs where it has any.

    Pinned (not placed by resources) because the fleet chooses the nodes: those whose check
    failed are left out, and a unit whose node died is sent to another of the same type by the
    fleet, which knows it is the same unit. Ray retries nothing by itself (``max_retries=0``),
    so a unit is never measured twice behind the fleet's back. A node without GPUs (a forced
    label on a CPU-only test node) is asked for none.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node.node_id, soft=False),
        "num_gpus": 1 if node.gpus else 0,
        "num_cpus": cpus,
        "max_retries": 0,
    }
