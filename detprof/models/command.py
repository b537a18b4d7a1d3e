"""``detprof models``: the registry as a table.

Parameter counts need a built model, which is slow for the large Keras applications, so
they are cached per Keras version under the user's cache folder.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from detprof.console import print_table, status_console, table_console
from detprof.store import atomic_write_json, user_cache_dir


def _cache_path() -> Path:
    return user_cache_dir() / "model-parameters.json"


def parameter_counts(names: list[str], keras_version: str) -> dict[str, int]:
    """Each model's parameters, from the cache where it holds them under what they depend on (``counts_key``)."""
    path = _cache_path()
    try:
        cache = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        cache = {}
    keys = {name: counts_key(name, keras_version) for name in names}
    missing = [name for name in names if name not in cache.get(keys[name], {})]
    for name in missing:
        cache.setdefault(keys[name], {})[name] = _parameters(name)
    if missing:
        with contextlib.suppress(OSError):
            atomic_write_json(path, cache)
    return {name: cache[keys[name]][name] for name in names}


def counts_key(name: str, keras_version: str) -> str:
    """What a model's cached count depends on: Keras' version, or for a native model the version of what builds it
    (``ModelSpec.needs``), so that installing it leaves the Keras models' counts cached."""
    from importlib.metadata import version

    from detprof.models import registry

    needs = registry.get(name).needs if registry.is_native(name) else None
    return keras_version if needs is None else f"{needs}-{version(needs)}"


def _parameters(name: str) -> int:
    """A Keras model's parameters, or a native module's: a PyTorch module built on PyTorch's meta device (shapes
    without memory or initialisation, so that ResNet-50's 25.6 million take milliseconds), a Flax module's shapes
    traced without being computed (``nnx.eval_shape``)."""
    from detprof.models import registry

    spec = registry.get(name)
    if not registry.is_native(name):
        return int(registry.build(name).count_params())
    if spec.api == "flax":
        from flax import nnx

        from detprof.models.flax_modules import parameters

        return parameters(nnx.eval_shape(lambda: registry.build(name)))
    import torch

    with torch.device("meta"):
        return sum(p.numel() for p in registry.build(name).parameters())


def models(
    all_models: Annotated[bool, typer.Option("--all", help="Also list every other keras.applications model.")] = False,
) -> None:
    """List the models detprof can profile: name, family, parameters, default input shape (a GPT's is its sequence
    length, its classes its vocabulary)."""
    from detprof.backends import import_keras
    from detprof.models import kinds, registry

    keras = import_keras()

    specs = registry.all_models() if all_models else registry.BUILT_IN
    absent = {name: s.needs for name, s in specs.items() if s.needs and importlib.util.find_spec(s.needs) is None}
    console = status_console()
    with console.status("counting parameters (cached after the first time)"):
        counts = parameter_counts([name for name in specs if name not in absent], keras.__version__)
    table = Table(title="detprof models")
    for col in ("Name", "Kind", "Family", "Parameters", "Default input", "Classes"):
        table.add_column(col)
    for name, spec in specs.items():
        tokens = spec.takes == "tokens"
        shape = f"{spec.input_shape[0]} tokens" if tokens else "x".join(map(str, spec.input_shape))
        classes = f"{spec.classes} (vocabulary)" if tokens else str(spec.classes)
        native = kinds.native(spec.api)
        kind = "Keras" if native is None else native.what.removeprefix("a ")
        parameters = f"needs {absent[name]}" if name in absent else f"{counts[name]:,}"
        table.add_row(name, kind, spec.family, parameters, shape, classes)
    print_table(table_console(), table)
