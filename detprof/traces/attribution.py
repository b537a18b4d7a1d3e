"""Which op and which layer of the model each kernel (or CPU op) belongs to, from the trace's name paths.

Every parser fills two columns of the kernel table where its trace says (``kernel_table``):
``op_type``, the kind of framework op that ran the kernel, and ``scope``, the name path it ran
under. TensorFlow's op names and JAX's ``op_name`` metadata carry the Keras layers' name scopes
(``mediumcnn_k3_1/conv4_1/convolution``, ``jit(train_step)/transpose(jvp(conv4))/conv_general_dilated``);
a PyTorch worker marks each layer call with a range (``layer_range_name``) that the Kineto parser
turns into the same kind of path (a native module's range names it by its path as PyTorch does,
``blocks.1.conv``, which stands for the ranges of its parents around it). Here a path becomes the
model's layer: the parts that name one of its layers, outermost first (``multi_head_attention_1/value``:
the sublayers of two attention layers share their names, the path tells them apart; TensorFlow appends
``_1`` to a scope it enters again; JAX wraps scopes in the transformations applied,
``transpose(jvp(...))``). A kernel no path places is "unattributed", never dropped, so per-layer times
always add up to the step's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

import pandas as pd

from detprof.backends.base import COMPILED_PART, LAYER_RANGE, STEP_PARTS, TOP_LEVEL_PART, layer_range_name
from detprof.errors import InputError
from detprof.traces.kernel_table import KernelTable

__all__ = [
    "BACKWARD_PREFIX",
    "LAYER_RANGE",
    "UNATTRIBUTED",
    "by_part",
    "in_model_order",
    "layer_of",
    "layer_path",
    "layer_range_name",
    "op_kind",
    "parts",
    "placed_kernels",
]

UNATTRIBUTED = "(unattributed)"
"""The layer, or op, of a kernel that no op or layer claims."""
COMPILED_BACKWARD = "CompiledFunctionBackward"
"""The autograd node that runs a compiled graph's backward: the op a backward kernel of it runs under."""
BACKWARD_PREFIX = "autograd::engine::evaluate_function: "

ENCLOSING_PARTS = (COMPILED_PART, TOP_LEVEL_PART)
"""Parts of a path that hold a module's submodules: a row of their own only for what no submodule holds."""
_WRAPPED = re.compile(r"^[\w.-]+\((.*)\)$")
_REPEATED_SCOPE = re.compile(r"_\d+$")


def parts(scope: str) -> list[str]:
    """A name path's parts, each unwrapped from the transformations around it (``transpose(jvp(conv4))``)."""
    found = []
    for part in scope.split("/"):
        while (inner := _WRAPPED.match(part)) is not None:
            part = inner.group(1)
        found.append(part)
    return found


def layer_of(scope: object, layers: Iterable[str], step_scopes: Mapping[str, str] | None = None) -> str:
    """The path of the parts of ``scope`` that name one of ``layers`` (as given, or as TensorFlow renamed
    a scope entered again), outermost first, or the part of the step that is no layer (``STEP_PARTS``: the
    loss, the optimizer's update; a scope of ``step_scopes``: the row it goes to) where no layer's scope holds it;
    the innermost of ``ENCLOSING_PARTS`` (a compiled region, a native module's own call) where only those do;
    ``UNATTRIBUTED`` where none does."""
    if not isinstance(scope, str) or not scope:
        return UNATTRIBUTED
    names, others = set(layers), step_scopes or {}
    found: list[str] = []
    enclosing = UNATTRIBUTED
    for part in parts(scope):
        if part in ENCLOSING_PARTS:
            enclosing = part
            continue
        if part in STEP_PARTS:
            return part
        base = _REPEATED_SCOPE.sub("", part)
        step_part = others.get(part, others.get(base))
        if step_part is not None and not found:
            return step_part
        named = part if part in names else base
        if named in names and (not found or found[-1] != named):
            _descend(found, named)
    return "/".join(found) or enclosing


def _descend(found: list[str], part: str) -> None:
    """``part`` appended to the path ``found``, or in place of its last part where it extends it: a native PyTorch
    module's path names its parents already (``blocks.1.conv`` inside ``blocks.1`` inside ``blocks``)."""
    if found and part.startswith(f"{found[-1]}."):
        found[-1] = part
    else:
        found.append(part)


def placed_kernels(
    scopes: Sequence[object],
    kinds: Sequence[object],
    kernels: Sequence[object],
    sites: Sequence[object],
    kernel_modules: Mapping[str, Mapping[str, str | None]],
) -> list[object]:
    """Each kernel's scope, a kernel of the compiled region placed in its module inside it
    (``(torch.compile region)/blocks.0.norm``): ``kernel_modules`` holds, by phase (a record's,
    ``backends.inductor_places``), the module of each of Inductor's fused kernels by its name and of each extern
    kernel call by its place in the graph's call (``sites``, the kernel table's ``graph_site``); a backward kernel
    is told by the node it runs under (``COMPILED_BACKWARD``). Any other kernel keeps its scope."""
    placed = []
    for scope, kind, kernel, site in zip(scopes, kinds, kernels, sites, strict=True):
        inside = isinstance(scope, str) and scope.rsplit("/", 1)[-1] == COMPILED_PART
        modules = kernel_modules.get("backward" if kind == COMPILED_BACKWARD else "forward", {}) if inside else {}
        module = modules.get(str(kernel)) or (modules.get(site) if isinstance(site, str) else None)
        placed.append(f"{scope}/{module}" if module else scope)
    return placed


def in_model_order(paths: Iterable[str], layers: Sequence[str]) -> list[str]:
    """Layer paths in the order the model lists their innermost layers; paths it does not list left out."""
    position = {name: index for index, name in enumerate(layers)}
    listed = [path for path in paths if path.rsplit("/", 1)[-1] in position]
    return sorted(listed, key=lambda path: (position[path.rsplit("/", 1)[-1]], path))


def op_kind(op_type: object) -> str:
    """The op as a reader names it: PyTorch's backward nodes without the autograd engine's prefix."""
    if not isinstance(op_type, str) or not op_type:
        return UNATTRIBUTED
    return op_type.removeprefix(BACKWARD_PREFIX)


_GRADIENT_SCOPE = "gradient_tape"
_JITTED = re.compile(r"^(?:jit|pjit)\(")
_RANGES_ONLY = frozenset({"kineto-json", "kineto-cpu-json"})
"""Formats whose scope holds layer ranges only; the others end in the op's own name."""


def layer_path(scope: object, ranges_only: bool) -> str:
    """A layer's path read off a trace alone, without the model's layer names.

    Layer ranges (PyTorch) are the path as they are. A name path (TensorFlow, JAX) loses what names
    no layer: the jitted function JAX names first (``jit(train_step)``), TensorFlow's ``gradient_tape``
    and, at the end, the op's own name (a gradient op's path also ends in its forward op's name);
    each part unwrapped and without TensorFlow's ``_1`` of a scope entered again.
    """
    if not isinstance(scope, str) or not scope:
        return UNATTRIBUTED
    names = scope.split("/")
    found = [_REPEATED_SCOPE.sub("", part) for part in parts(scope)]
    if not ranges_only:
        drop_end = 2 if names[0] == _GRADIENT_SCOPE else 1
        keep = [not _JITTED.match(name) and name != _GRADIENT_SCOPE for name in names]
        found = [part for part, kept in zip(found, keep, strict=True) if kept]
        found = found[:-drop_end]
    path: list[str] = []
    for part in found:
        _descend(path, part)
    return "/".join(path) or UNATTRIBUTED


def by_part(table: KernelTable, part: str) -> KernelTable:
    """``table`` with each kernel named by its op (``op_kind``) or its layer path instead: what the kernel-level
    statistics and diff then group by. A trace that names no op (nvprof, a summary) is refused in one line."""
    if table.is_summary or table.launches("scope", "op_type").isna().all().all():
        raise InputError(
            f"{table.source}: this trace names no op or layer for its kernels (--by {part} reads TensorFlow and "
            "JAX profiler traces, PyTorch Kineto traces and nsys exports with op or layer NVTX ranges; nvprof traces "
            "and nsys summaries name none)"
        )
    kernels = table.kernels
    if part == "op":
        names = [op_kind(kind) for kind in kernels["op_type"].astype(object)]
    else:
        ranges_only = table.format in _RANGES_ONLY
        names = [layer_path(scope, ranges_only) for scope in kernels["scope"].astype(object)]
    named = pd.Categorical(names)
    return replace(table, kernels=kernels.assign(name=named, short_name=named))
