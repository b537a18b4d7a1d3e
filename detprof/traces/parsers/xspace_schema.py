"""The XSpace message classes, built at runtime from the schema with the protobuf package alone.

TensorFlow's profiler, ``jax.profiler`` and every other user of TSL's profiler write
``*.xplane.pb`` files in one schema, ``tsl/profiler/protobuf/xplane.proto``. Only TensorFlow
ships generated classes for it, and the machines that trace with ``jax.profiler`` or
``torch.profiler`` have no TensorFlow. So the schema is declared here, field for field as
xplane.proto declares it (proto3: numbers, types, repeated fields, the map fields
``event_metadata`` and ``stat_metadata``, the oneofs ``XEvent.data`` and ``XStat.value``),
and turned into classes in a descriptor pool of detprof's own: the default pool, where
TensorFlow registers the same file under the same names, is never touched, so the two sets
of classes coexist when both are loaded. Parsing is protobuf's own C implementation either
way, so it is as fast as with TensorFlow's generated module.
"""

from __future__ import annotations

import functools
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

SCHEMA_FILE = "tsl/profiler/protobuf/xplane.proto"
PACKAGE = "tensorflow.profiler"

_F = descriptor_pb2.FieldDescriptorProto
_INT64, _UINT64, _DOUBLE = _F.TYPE_INT64, _F.TYPE_UINT64, _F.TYPE_DOUBLE
_STRING, _BYTES = _F.TYPE_STRING, _F.TYPE_BYTES

# (name, number, type or message name, repeated, oneof) in xplane.proto's declaration order.
_Field = tuple[str, int, int | str, bool, str | None]
_MESSAGES: dict[str, tuple[_Field, ...]] = {
    "XSpace": (
        ("planes", 1, "XPlane", True, None),
        ("errors", 2, _STRING, True, None),
        ("warnings", 3, _STRING, True, None),
        ("hostnames", 4, _STRING, True, None),
    ),
    "XPlane": (
        ("id", 1, _INT64, False, None),
        ("name", 2, _STRING, False, None),
        ("lines", 3, "XLine", True, None),
        ("event_metadata", 4, "XPlane.EventMetadataEntry", True, None),
        ("stat_metadata", 5, "XPlane.StatMetadataEntry", True, None),
        ("stats", 6, "XStat", True, None),
    ),
    "XLine": (
        ("id", 1, _INT64, False, None),
        ("display_id", 10, _INT64, False, None),
        ("name", 2, _STRING, False, None),
        ("display_name", 11, _STRING, False, None),
        ("timestamp_ns", 3, _INT64, False, None),
        ("duration_ps", 9, _INT64, False, None),
        ("events", 4, "XEvent", True, None),
    ),
    "XEvent": (
        ("metadata_id", 1, _INT64, False, None),
        ("offset_ps", 2, _INT64, False, "data"),
        ("num_occurrences", 5, _INT64, False, "data"),
        ("duration_ps", 3, _INT64, False, None),
        ("stats", 4, "XStat", True, None),
    ),
    "XStat": (
        ("metadata_id", 1, _INT64, False, None),
        ("double_value", 2, _DOUBLE, False, "value"),
        ("uint64_value", 3, _UINT64, False, "value"),
        ("int64_value", 4, _INT64, False, "value"),
        ("str_value", 5, _STRING, False, "value"),
        ("bytes_value", 6, _BYTES, False, "value"),
        ("ref_value", 7, _UINT64, False, "value"),
    ),
    "XEventMetadata": (
        ("id", 1, _INT64, False, None),
        ("name", 2, _STRING, False, None),
        ("display_name", 4, _STRING, False, None),
        ("metadata", 3, _BYTES, False, None),
        ("stats", 5, "XStat", True, None),
        ("child_id", 6, _INT64, True, None),
    ),
    "XStatMetadata": (
        ("id", 1, _INT64, False, None),
        ("name", 2, _STRING, False, None),
        ("description", 3, _STRING, False, None),
    ),
}
_MAPS = {"XPlane": (("EventMetadataEntry", "XEventMetadata"), ("StatMetadataEntry", "XStatMetadata"))}
"""XPlane's two ``map<int64, ...>`` fields, which protobuf declares as nested entry messages."""

HLO_FILE = "xla/service/hlo.proto"
HLO_PACKAGE = "xla"
_HLO_MESSAGES: dict[str, tuple[_Field, ...]] = {
    "HloProto": (("hlo_module", 1, "HloModuleProto", False, None),),
    "HloModuleProto": (
        ("name", 1, _STRING, False, None),
        ("entry_computation_name", 2, _STRING, False, None),
        ("computations", 3, "HloComputationProto", True, None),
    ),
    "HloComputationProto": (
        ("name", 1, _STRING, False, None),
        ("instructions", 2, "HloInstructionProto", True, None),
        ("id", 5, _INT64, False, None),
        ("root_id", 6, _INT64, False, None),
    ),
    "HloInstructionProto": (
        ("name", 1, _STRING, False, None),
        ("opcode", 2, _STRING, False, None),
        ("metadata", 7, "OpMetadata", False, None),
        ("id", 35, _INT64, False, None),
        ("operand_ids", 36, _INT64, True, None),
        ("called_computation_ids", 38, _INT64, True, None),
    ),
    "OpMetadata": (("op_type", 1, _STRING, False, None), ("op_name", 2, _STRING, False, None)),
}
"""The part of XLA's ``hlo.proto`` that names what each HLO instruction came from: the module the
JAX profiler stores per compiled program (the ``Hlo Proto`` stat of its ``/host:metadata`` plane),
its computations and instructions, and each instruction's ``OpMetadata`` (``op_name`` carries the
name stack of the Keras layer). Fields this leaves out are skipped as unknown when parsed."""


def schema(
    file_name: str = SCHEMA_FILE,
    package: str = PACKAGE,
    messages: dict[str, tuple[_Field, ...]] = _MESSAGES,
    maps: dict[str, tuple[tuple[str, str], ...]] = _MAPS,
) -> descriptor_pb2.FileDescriptorProto:
    """A schema as a FileDescriptorProto: xplane.proto unless told otherwise."""
    file = descriptor_pb2.FileDescriptorProto(name=file_name, package=package, syntax="proto3")
    for name, fields in messages.items():
        message = file.message_type.add(name=name)
        for entry, value in maps.get(name, ()):
            nested = message.nested_type.add(name=entry)
            nested.options.map_entry = True
            _add_field(nested, ("key", 1, _INT64, False, None), [], package)
            _add_field(nested, ("value", 2, value, False, None), [], package)
        oneofs: list[str] = []
        for field in fields:
            _add_field(message, field, oneofs, package)
        for oneof in oneofs:
            message.oneof_decl.add(name=oneof)
    return file


def _add_field(message: descriptor_pb2.DescriptorProto, field: _Field, oneofs: list[str], package: str) -> None:
    name, number, kind, repeated, oneof = field
    label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    added = message.field.add(name=name, number=number, label=label)
    if isinstance(kind, str):
        added.type = _F.TYPE_MESSAGE
        added.type_name = f".{package}.{kind}"
    else:
        added.type = kind
    if oneof is not None:
        if oneof not in oneofs:
            oneofs.append(oneof)
        added.oneof_index = oneofs.index(oneof)


@functools.cache
def xspace_class() -> Any:
    """The ``XSpace`` message class (its nested messages come with it), built once per process
    (``message_factory.GetMessageClass``: protobuf 4.22 and later)."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(schema())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.XSpace"))


@functools.cache
def hlo_class() -> Any:
    """The ``HloProto`` message class (the subset ``_HLO_MESSAGES`` declares), built once per process."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(schema(HLO_FILE, HLO_PACKAGE, _HLO_MESSAGES, {}))
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{HLO_PACKAGE}.HloProto"))
