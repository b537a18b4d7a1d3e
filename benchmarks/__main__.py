"""``python -m benchmarks`` (``make bench``): every ``benchmarks/bench_*.py`` module's ``main()`` in turn.

Exits non-zero when any benchmark misses its target, so the command can gate a release.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path


def run_all() -> int:
    failed = []
    for module_path in sorted(Path(__file__).parent.glob("bench_*.py")):
        name = f"benchmarks.{module_path.stem}"
        if importlib.import_module(name).main() not in (0, None):
            failed.append(name)
        print()
    if failed:
        print(f"missed targets: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_all())
