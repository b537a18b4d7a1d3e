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
import re
from typing import Any, NamedTuple

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

SCHEMA_FILE = "tsl/profiler/protobuf/xplane.proto"
PACKAGE = "tensorflow.profiler"

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "int64": _F.TYPE_INT64,
    "uint64": _F.TYPE_UINT64,
    "double": _F.TYPE_DOUBLE,
    "string": _F.TYPE_STRING,
    "bytes": _F.TYPE_BYTES,
}
_DECLARATION = re.compile(
    r"(?:oneof (?P<oneof>\w+): )?(?P<repeated>repeated )?(?P<kind>[\w.]+) (?P<name>\w+) = (?P<number>\d+)"
)


class _Field(NamedTuple):
    name: str
    number: int
    kind: int | str
    """A scalar type (``_SCALARS``) or the name of a message of the same package."""
    repeated: bool = False
    oneof: str | None = None


def _fields(declarations: str) -> list[_Field]:
    """A message's fields, declared as the .proto file declares them (``repeated XLine lines = 3``), separated by
    semicolons; a member of a ``oneof`` is written after its name (``oneof data: int64 offset_ps = 2``)."""
    fields = []
    for text in declarations.split(";"):
        found = _DECLARATION.fullmatch(text.strip())
        if found is None:
            raise ValueError(f"not a field declaration: {text.strip()!r}")
        kind = _SCALARS.get(found["kind"], found["kind"])
        fields.append(_Field(found["name"], int(found["number"]), kind, bool(found["repeated"]), found["oneof"]))
    return fields


_MESSAGES: dict[str, str] = {
    "XSpace": "repeated XPlane planes = 1; repeated string errors = 2; repeated string warnings = 3; "
    "repeated string hostnames = 4",
    "XPlane": "int64 id = 1; string name = 2; repeated XLine lines = 3; "
    "repeated XPlane.EventMetadataEntry event_metadata = 4; "
    "repeated XPlane.StatMetadataEntry stat_metadata = 5; repeated XStat stats = 6",
    "XLine": "int64 id = 1; int64 display_id = 10; string name = 2; string display_name = 11; "
    "int64 timestamp_ns = 3; int64 duration_ps = 9; repeated XEvent events = 4",
    "XEvent": "int64 metadata_id = 1; oneof data: int64 offset_ps = 2; oneof data: int64 num_occurrences = 5; "
    "int64 duration_ps = 3; repeated XStat stats = 4",
    "XStat": "int64 metadata_id = 1; oneof value: double double_value = 2; "
    "oneof value: uint64 uint64_value = 3; oneof value: int64 int64_value = 4; "
    "oneof value: string str_value = 5; oneof value: bytes bytes_value = 6; oneof value: uint64 ref_value = 7",
    "XEventMetadata": "int64 id = 1; string name = 2; string display_name = 4; bytes metadata = 3; "
    "repeated XStat stats = 5; repeated int64 child_id = 6",
    "XStatMetadata": "int64 id = 1; string name = 2; string description = 3",
}
_MAPS = {"XPlane": (("EventMetadataEntry", "XEventMetadata"), ("StatMetadataEntry", "XStatMetadata"))}
"""XPlane's two ``map<int64, ...>`` fields, which protobuf declares as nested entry messages."""

HLO_FILE = "xla/service/hlo.proto"
HLO_PACKAGE = "xla"
_HLO_MESSAGES: dict[str, str] = {
    "HloProto": "HloModuleProto hlo_module = 1",
    "HloModuleProto": "string name = 1; string entry_computation_name = 2; "
    "repeated HloComputationProto computations = 3",
    "HloComputationProto": "string name = 1; repeated HloInstructionProto instructions = 2; int64 id = 5; "
    "int64 root_id = 6",
    "HloInstructionProto": "string name = 1; string opcode = 2; OpMetadata metadata = 7; int64 id = 35; "
    "repeated int64 operand_ids = 36; repeated int64 called_computation_ids = 38",
    "OpMetadata": "string op_type = 1; string op_name = 2",
}
"""The part of XLA's ``hlo.proto`` that names what each HLO instruction came from: the module the
JAX profiler stores per compiled program (the ``Hlo Proto`` stat of its ``/host:metadata`` plane),
its computations and instructions, and each instruction's ``OpMetadata`` (``op_name`` carries the
name stack of the Keras layer). Fields this leaves out are skipped as unknown when parsed."""


def schema(
    file_name: str = SCHEMA_FILE,
    package: str = PACKAGE,
    messages: dict[str, str] = _MESSAGES,
    maps: dict[str, tuple[tuple[str, str], ...]] = _MAPS,
) -> descriptor_pb2.FileDescriptorProto:
    """A schema as a FileDescriptorProto: xplane.proto unless told otherwise."""
    file = descriptor_pb2.FileDescriptorProto(name=file_name, package=package, syntax="proto3")
    for name, fields in messages.items():
        message = file.message_type.add(name=name)
        for entry, value in maps.get(name, ()):
            nested = message.nested_type.add(name=entry)
            nested.options.map_entry = True
            _add_field(nested, _Field("key", 1, _SCALARS["int64"]), [], package)
            _add_field(nested, _Field("value", 2, value), [], package)
        oneofs: list[str] = []
        for field in _fields(fields):
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
