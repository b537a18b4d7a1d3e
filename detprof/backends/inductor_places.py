"""Which module of a ``torch.compile``d model each of Inductor's fused kernels came from.

A module's range cannot reach inside a compiled graph, so a compiled module's kernels would all be one row
(``COMPILED_PART``). Inductor's provenance tracking (``torch._inductor.config.trace.provenance_tracking_level``)
names the post-grad graph nodes each kernel fused (``"cpp_fused_relu_1:3" -> ["relu", "add_5"]``), and each node
carries the stack of modules whose ``forward`` ran it (``nn_module_stack``; a backward node the stack of the forward
op it differentiates, ``fwd_nn_module_stack``). A kernel goes to the deepest module that holds every node it fused
that a module holds: its own, or the module of several around them (``TOP_LEVEL_PART`` where that is only the
whole model). A kernel without a node any module holds stays in the compiled region's row.

The extern kernels (``extern_kernels.mm``, aten ops the graph's code calls as they are: a transformer's matrix
products, a fifth of its step) are named in the trace only by their aten op, alike for every layer. The graph's
code calls them in the order of their provenance handles, and the trace records them in that order among a call's
ops: each is placed by its place among the call's ops of its name (``base.graph_site``, ``aten::mm 3/14``), which
the Kineto parser reads off each call of the graph.

Kernel names are unique within a graph, not across a forward graph and its backward graph (both ``graph_0_``, each
numbering its kernels from 0): each graph's kernels go to their phase's map (``Places``), and a name that two
graphs of one phase place apart is placed in neither (None).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field

from .base import TOP_LEVEL_PART, graph_site

FORWARD = "forward"
BACKWARD = "backward"
FUSED_KERNEL = re.compile(r"^(?P<name>(?:cpp|triton)_\w+):\d+$")
"""A fused kernel's provenance key, ``NAME:HANDLE``: Inductor's C++ (CPU) and Triton (GPU) kernels, not the extern
kernels (``extern_kernels.mm:1``, ``torch.ops.aten.convolution_backward.default:3``)."""
EXTERN_KERNEL = re.compile(r"^(?:extern_kernels\.(?P<extern>\w+)|(?:torch\.ops\.)?aten\.(?P<aten>\w+)(?:\.\w+)?):\d+$")
"""An extern kernel's provenance key and the aten op the trace names it by: ``extern_kernels.addmm:4`` is
``aten::addmm``, ``aten.randint.low_out:2`` and ``torch.ops.aten.convolution_backward.default:3`` their ops."""
_SOURCE_HEAD = re.compile(r"^L\[['\"]\w+['\"]\]\.?")
_INDEX = re.compile(r"\[['\"]?([\w]+)['\"]?\]")


def module_path(source: str) -> str:
    """A module's path as ``named_modules`` names it from Dynamo's source of it: ``L['self'].blocks[0].norm`` (or
    ``L['s'].blocks.0.norm``, or ``L['self']._modules['blocks']._modules['0'].norm``: the submodules' own dict) is
    ``blocks.0.norm``; the compiled module itself is ``""``."""
    dotted = _INDEX.sub(r".\1", _SOURCE_HEAD.sub("", source)).strip(".")
    return ".".join(part for part in dotted.split(".") if part and part != "_modules")


def node_module(meta: Mapping[str, object]) -> str | None:
    """The path of the innermost module whose ``forward`` ran a graph node (for a backward node, the forward op's
    module); None where the node's stack names none (graph inputs, buffer updates, what the model's own call runs)."""
    stack = meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack")
    if not isinstance(stack, Mapping) or not stack:
        return None
    source = list(stack.values())[-1]
    return module_path(source[0] if isinstance(source, tuple) else str(source))


def common_ancestor(paths: Iterable[str]) -> str:
    """The deepest module path that holds each of ``paths`` (``""``, the whole model, where only that does)."""
    split = [path.split(".") if path else [] for path in paths]
    if not split:
        return ""
    common: list[str] = []
    for parts in zip(*split, strict=False):
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    return ".".join(common)


def kernel_places(
    kernels: Mapping[str, Sequence[str]], modules: Mapping[str, str | None], prefix: str = ""
) -> dict[str, str]:
    """Each fused kernel of one graph, by the name the trace gives it (``prefix``: the ``graph_N_`` of a C++ kernel
    profiled on a CPU), and each extern kernel call, by its place in the graph's call (``base.graph_site``), placed
    in the module path of the nodes it ran (``modules``: each node's, by name): ``TOP_LEVEL_PART`` where only the
    whole model holds them; left out where no module holds any.

    Inductor generates a kernel once for blocks that run the same code and calls it once per block (each call a
    key of its own, ``NAME:HANDLE``), and the trace names every call alike: such a kernel goes to the module around
    all the blocks that call it (``blocks``, not ``blocks.0``)."""
    held: dict[str, list[str]] = {}
    for traced, nodes in [*_fused(kernels, prefix), *_extern_sites(kernels)]:
        held.setdefault(traced, []).extend(path for path in (modules.get(node) for node in nodes) if path is not None)
    return {traced: common_ancestor(paths) or TOP_LEVEL_PART for traced, paths in held.items() if paths}


def _fused(kernels: Mapping[str, Sequence[str]], prefix: str) -> list[tuple[str, Sequence[str]]]:
    """Each fused kernel call's nodes, by the name the trace gives the kernel."""
    found = []
    for key, nodes in kernels.items():
        fused = FUSED_KERNEL.match(key)
        if fused is not None:
            name = fused.group("name")
            found.append((f"{prefix}{name}" if name.startswith("cpp_") else name, nodes))
    return found


def _extern_sites(kernels: Mapping[str, Sequence[str]]) -> list[tuple[str, Sequence[str]]]:
    """Each extern kernel call's nodes, by its place among the graph's calls of its op (``base.graph_site``)."""
    calls: dict[str, list[tuple[int, Sequence[str]]]] = {}
    for key, nodes in kernels.items():
        extern = EXTERN_KERNEL.match(key)
        if extern is not None:
            op = f"aten::{extern.group('extern') or extern.group('aten')}"
            calls.setdefault(op, []).append((int(key.rsplit(":", 1)[1]), nodes))
    return [
        (graph_site(op, index, len(found)), nodes)
        for op, found in calls.items()
        for index, (_, nodes) in enumerate(sorted(found, key=lambda call: call[0]), 1)
    ]


@dataclass
class Places:
    """The kernels of every graph Inductor compiled for the model this process trains now, by phase: what a record
    keeps (``kernel_modules``) for ``traces.attribution.placed_kernels``. Empty (false) until a graph is placed."""

    forward: dict[str, str | None] = field(default_factory=dict)
    backward: dict[str, str | None] = field(default_factory=dict)

    def add(self, backward: bool, places: Mapping[str, str]) -> None:
        """One graph's kernels (``kernel_places``) in its phase's map; a name placed apart before, in neither."""
        _merge(self.backward if backward else self.forward, places)

    def __bool__(self) -> bool:
        return bool(self.forward or self.backward)

    def clear(self) -> None:
        """Emptied for the next model a process compiles."""
        self.forward.clear()
        self.backward.clear()

    def as_json(self) -> dict[str, dict[str, str | None]]:
        return {FORWARD: dict(self.forward), BACKWARD: dict(self.backward)}


def _merge(into: MutableMapping[str, str | None], places: Mapping[str, str]) -> None:
    for name, path in places.items():
        into[name] = path if into.get(name, path) == path else None
