"""Read traces with ``load_trace`` in a fresh interpreter, with TensorFlow out of reach or its XSpace classes loaded.

usage: xspace_tables.py blocked PATH...
       xspace_tables.py tensorflow-classes PATH...

``blocked`` makes ``tensorflow`` unimportable before detprof is imported, as on a machine
with ``detprof[jax]`` or ``detprof[torch]`` only. ``tensorflow-classes`` first loads
TensorFlow's generated ``xplane_pb2`` into protobuf's default descriptor pool (where TensorFlow
itself puts them), when TensorFlow is installed, so that detprof's classes of the same
schema must live beside them. The last line of stdout is one JSON object:
``{"tensorflow": what happened to it, "tables": [each table, every row as text]}``.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any


class _NoTensorFlow(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        if fullname == "tensorflow" or fullname.startswith("tensorflow."):
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked)", name=fullname)
        return None


def block_tensorflow() -> str:
    sys.meta_path.insert(0, _NoTensorFlow())
    try:
        import tensorflow  # noqa: F401
    except ModuleNotFoundError as exc:
        return f"ModuleNotFoundError: {exc}"
    return "imported"


def load_tensorflow_classes() -> str:
    """TensorFlow's generated module, loaded from its file as it registers itself: into the default pool."""
    spec = importlib.util.find_spec("tensorflow")
    locations = spec.submodule_search_locations if spec is not None else None
    for location in locations or ():
        source = Path(location, "tsl", "profiler", "protobuf", "xplane_pb2.py")
        if source.is_file():
            file_spec = importlib.util.spec_from_file_location("tensorflow_xplane_pb2", source)
            module = importlib.util.module_from_spec(file_spec)
            file_spec.loader.exec_module(module)
            return f"classes loaded: {module.XSpace.DESCRIPTOR.full_name}"
    return "not installed"


def rows(table: Any) -> dict[str, object]:
    """Everything a table holds, as text, so that two tables compare equal only if they are."""
    frames = {"kernels": table.kernels, "memory": table.memory, "nvtx": table.nvtx}
    return {
        "format": table.format,
        "devices": [asdict(d) for d in table.devices],
        **{
            name: None if frame is None else [list(frame.columns), frame.astype(str).to_numpy().tolist()]
            for name, frame in frames.items()
        },
    }


if __name__ == "__main__":
    mode, *paths = sys.argv[1:]
    tensorflow = {"blocked": block_tensorflow, "tensorflow-classes": load_tensorflow_classes}[mode]()
    from detprof.traces.parsers import load_trace

    print(json.dumps({"tensorflow": tensorflow, "tables": [rows(load_trace(path)) for path in paths]}))
