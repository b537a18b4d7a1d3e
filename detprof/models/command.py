"""``detprof models``: the registry as a table.

Parameter counts need a built model, which is slow for the large Keras applications, so
they are cached per Keras version under the user's cache folder.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from detprof.console import print_table, status_console, table_console
from detprof.store import atomic_write_json


def _cache_path() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "detprof" / "model-parameters.json"


def parameter_counts(names: list[str], keras_version: str) -> dict[str, int]:
    from detprof.models import registry

    path = _cache_path()
    try:
        cache = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        cache = {}
    counts = cache.setdefault(keras_version, {})
    missing = [n for n in names if n not in counts]
    for name in missing:
        counts[name] = _parameters(registry.build(name))
    if missing:
        with contextlib.suppress(OSError):
            atomic_write_json(path, cache)
    return {n: counts[n] for n in names}


def _parameters(model: Any) -> int:
    """A Keras model's parameters, or a native module's."""
    count_params = getattr(model, "count_params", None)
    return int(count_params() if count_params is not None else sum(p.numel() for p in model.parameters()))


def models(
    all_models: Annotated[bool, typer.Option("--all", help="Also list every other keras.applications model.")] = False,
) -> None:
    """List the models detprof can profile: name, family, parameters, default input shape (a GPT's is its sequence
    length, its classes its vocabulary)."""
    from detprof.backends import import_keras
    from detprof.models import registry

    keras = import_keras()

    specs = registry.all_models() if all_models else registry.BUILT_IN
    needs = registry.NATIVE_NEEDS
    absent = [name for name in specs if registry.is_native(name) and importlib.util.find_spec(needs) is None]
    console = status_console()
    with console.status("counting parameters (cached after the first time)"):
        counts = parameter_counts([name for name in specs if name not in absent], counts_key(keras.__version__, needs))
    table = Table(title="detprof models")
    for col in ("Name", "Kind", "Family", "Parameters", "Default input", "Classes"):
        table.add_column(col)
    for name, spec in specs.items():
        tokens = spec.takes == "tokens"
        shape = f"{spec.input_shape[0]} tokens" if tokens else "x".join(map(str, spec.input_shape))
        classes = f"{spec.classes} (vocabulary)" if tokens else str(spec.classes)
        kind = "torch.nn.Module" if spec.native else "Keras"
        parameters = f"needs {needs}" if name in absent else f"{counts[name]:,}"
        table.add_row(name, kind, spec.family, parameters, shape, classes)
    print_table(table_console(), table)


def counts_key(keras_version: str, needs: str) -> str:
    """What the cached counts depend on: Keras' version, and that of what builds the native models where installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{keras_version}+{needs}-{version(needs)}"
    except PackageNotFoundError:
        return keras_version
