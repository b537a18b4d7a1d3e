"""The fleet's executor: units of work spread over the ready nodes of their GPU type, through Ray.

A unit is what must run on one node as a whole (a sweep's paired repeat: both modes on the
same node and GPU, interleaved as on one machine; a stability run). Each node takes as many
units at once as it has GPUs (one on a node without any), each unit with one GPU to itself;
a node that finishes one takes the next unit of its type, so repeats and models spread over
the nodes as fast as each measures. Results come back as each unit finishes.

A node lost mid-unit (killed, preempted) fails the unit with a Ray system error: the unit
goes back to the front of its type's queue and runs whole on another node of that type,
and the lost node gets no more. Nothing reached the store from the lost attempt (the
driver writes records only from a unit that finished), so nothing is recorded twice. A
unit lost ``MAX_ATTEMPTS`` times, or left without any node of its type, is failed with
the reason. Ctrl-C, or any error in the driver, cancels the units in flight (their
measuring processes are ended on the node); Ray itself ends a dead driver's tasks.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from detprof.errors import first_line
from detprof.fleet.cluster import FleetNode, live_nodes, pinned

MAX_ATTEMPTS = 3
UNIT_CPUS = 1
"""CPUs a unit takes on its node: its worker processes run there (a GPU unit still steps from the CPU)."""


@dataclass(frozen=True)
class Unit:
    """One piece of work for a node of type ``label``: ``call(*args)`` there, which must pickle."""

    key: str
    label: str
    what: str
    """How the progress display names it (``smallcnn r0``)."""
    call: Callable[..., Any]
    args: tuple[Any, ...]


Done = Callable[[Unit, FleetNode, Any], None]
Failed = Callable[[Unit, FleetNode | None, str], None]
Running = Callable[[str, list[tuple[Unit, FleetNode]]], None]


class FleetExecutor:
    """Runs units on the ready nodes of their type; ``run`` returns when every unit finished or failed."""

    def __init__(self, ray: ModuleType, nodes: Mapping[str, Sequence[FleetNode]]) -> None:
        self.ray = ray
        self.nodes = {label: list(of_type) for label, of_type in nodes.items()}
        self.free = {node.node_id: node.slots for of_type in self.nodes.values() for node in of_type}
        self.lost: list[tuple[FleetNode, str]] = []
        """Every unit lost with its node or its Ray worker: the node, and the unit with the error that told of it."""
        self.lost_units: dict[str, set[str]] = {}
        """The nodes each unit was lost on (its node died or its Ray worker crashed)."""

    def run(self, units: Sequence[Unit], on_done: Done, on_failed: Failed, on_running: Running) -> None:
        """Every unit to a node of its type; ``on_done`` with each result as it arrives, ``on_failed`` with why not."""
        queues = {label: deque(u for u in units if u.label == label) for label in self.nodes}
        remotes = {call: self.ray.remote(call) for call in {u.call for u in units}}
        in_flight: dict[Any, tuple[Unit, FleetNode]] = {}
        attempts: Counter[str] = Counter()
        try:
            while True:
                self._dispatch(queues, remotes, in_flight, attempts, on_running)
                if not in_flight:
                    break
                ready, _ = self.ray.wait(list(in_flight), num_returns=1)
                for ref in ready:
                    unit, node = in_flight.pop(ref)
                    self.free[node.node_id] += 1
                    self._settle(ref, unit, node, queues, attempts, on_done, on_failed)
                    on_running(unit.label, [(u, n) for u, n in in_flight.values() if u.label == unit.label])
        except BaseException:
            for ref in in_flight:
                self.ray.cancel(ref)
            raise
        for label, queue in queues.items():
            for unit in queue:
                lost = "; ".join(f"{node.name}, {why}" for node, why in self.lost if node.label == label)
                on_failed(unit, None, f"no {label} node left to measure it (lost: {lost or 'none'})")

    def _dispatch(
        self,
        queues: Mapping[str, deque[Unit]],
        remotes: Mapping[Callable[..., Any], Any],
        in_flight: dict[Any, tuple[Unit, FleetNode]],
        attempts: Counter[str],
        on_running: Running,
    ) -> None:
        """Every free slot of a live node takes the next unit of its type."""
        for label, queue in queues.items():
            started = False
            for node in self.nodes[label]:
                while self.free[node.node_id] > 0:
                    unit = self._next_for(node, queue)
                    if unit is None:
                        break
                    ref = remotes[unit.call].options(**pinned(node, cpus=UNIT_CPUS)).remote(*unit.args)
                    in_flight[ref] = (unit, node)
                    self.free[node.node_id] -= 1
                    started = True
            if started:
                on_running(label, [(u, n) for u, n in in_flight.values() if u.label == label])

    def _next_for(self, node: FleetNode, queue: deque[Unit]) -> Unit | None:
        """The first unit ``node`` may take: one not lost on it before, unless every node of the type lost it.

        Ray may tell of a lost worker before it lists its node as dead; the unit then goes to
        another node rather than back to one that may be gone.
        """
        for unit in queue:
            lost_on = self.lost_units.get(unit.key, set())
            if node.node_id not in lost_on or all(n.node_id in lost_on for n in self.nodes[unit.label]):
                queue.remove(unit)
                return unit
        return None

    def _settle(
        self,
        ref: Any,
        unit: Unit,
        node: FleetNode,
        queues: Mapping[str, deque[Unit]],
        attempts: Counter[str],
        on_done: Done,
        on_failed: Failed,
    ) -> None:
        """A finished unit: its result, its failure, or (its node or worker lost) another try elsewhere."""
        exceptions = self.ray.exceptions
        try:
            result = self.ray.get(ref)
        except exceptions.RayTaskError as exc:
            on_failed(unit, node, f"on {node.name}: {first_line(exc.cause if exc.cause else exc, with_type=True)}")
            return
        except exceptions.RayError as exc:
            attempts[unit.key] += 1
            self.lost_units.setdefault(unit.key, set()).add(node.node_id)
            self.lost.append((node, f"{unit.what}: {first_line(exc)}"))
            self._forget_if_dead(node)
            if attempts[unit.key] >= MAX_ATTEMPTS:
                on_failed(unit, node, f"lost {attempts[unit.key]} times, last on {node.name}: {first_line(exc)}")
            else:
                queues[unit.label].appendleft(unit)
            return
        on_done(unit, node, result)

    def _forget_if_dead(self, node: FleetNode) -> None:
        """Take a node that Ray no longer lists as alive out of its type's pool."""
        alive = {str(n["NodeID"]) for n in live_nodes(self.ray)}
        if node.node_id not in alive and node in self.nodes[node.label]:
            self.nodes[node.label].remove(node)
