"""Run one of detprof's trace readers in a fresh interpreter and report the TensorFlow modules it imported.

usage: without_tensorflow.py load_xplane PATH...
       without_tensorflow.py load_trace PATH...
       without_tensorflow.py parse PATH
       without_tensorflow.py cli ARGS...

Whatever the reader prints comes first; the last line of stdout is one JSON object:
``{"result": ..., "tensorflow_modules": [...], "modules": [...]}``, where ``result`` is each
path's kernel count (the loaders) or the exit code of ``detprof parse PATH --format json`` (of
``detprof ARGS...``),
and ``modules`` every module imported, so that a test can see what a command line pays for.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def run(action: str, paths: list[str]) -> object:
    if action == "load_xplane":
        from detprof.traces.parsers.tf_xplane import load_xplane

        return [load_xplane(Path(path)).kernel_count for path in paths]
    if action == "load_trace":
        from detprof.traces.parsers import load_trace

        return [load_trace(path).kernel_count for path in paths]
    if action == "parse":
        from detprof.cli import main

        return main(["parse", *paths, "--format", "json"])
    if action == "cli":
        from detprof.cli import main

        return main(paths)
    raise SystemExit(f"unknown action {action!r}")


if __name__ == "__main__":
    result = run(sys.argv[1], sys.argv[2:])
    # tensorflow itself, its submodules and its companions (tensorflow_estimator, tensorflow_io...)
    loaded = sorted(m for m in sys.modules if m.startswith("tensorflow"))
    print(json.dumps({"result": result, "tensorflow_modules": loaded, "modules": sorted(sys.modules)}))
