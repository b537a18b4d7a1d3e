"""Wall-time budgets of the embedded defaults, each run as a user runs it, in a fresh folder.

Targets from the issues: on this 2-core machine without a GPU, `detprof sweep` with no options
finishes in under 3 minutes ("Measurements that conclude"), `detprof stability` and `detprof
kernels` in under 5 minutes each, and `make sweep`'s job (`detprof sweep --stability`: sweep,
the stability study and the report) in under 3 minutes whatever the machine's speed ("Time to a
conclusive answer").

``python -m benchmarks.bench_time_budgets``
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.results import record

BUDGETS_S: dict[str, tuple[list[str], float]] = {
    "detprof sweep": (["sweep"], 180.0),
    "detprof stability": (["stability"], 300.0),
    "detprof kernels": (["kernels"], 300.0),
    "make sweep (detprof sweep --stability --resume)": (["sweep", "--stability", "--resume"], 180.0),
}
TARGET_TEXT = (
    "Wall time of the embedded defaults, each run as a user runs it in a fresh folder: detprof sweep under 3 minutes, "
    "detprof stability and detprof kernels under 5 minutes each, make sweep's job under 3 minutes"
)


def _timed(args: list[str], out: Path) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "detprof.cli", *args, "--out", str(out)],
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    return time.perf_counter() - start, done.returncode


def main() -> int:
    print(f"== time budgets of the embedded defaults ({os.cpu_count()} CPUs) ==")
    checks: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="detprof-bench-budgets-") as tmp:
        for index, (label, (args, budget)) in enumerate(BUDGETS_S.items()):
            elapsed, code = _timed(args, Path(tmp) / f"run{index}")
            measured = f"{label}: {elapsed:6.1f} s (budget {budget:.0f} s, exit code {code})"
            checks[measured] = code == 0 and elapsed <= budget
    return record("bench_time_budgets", TARGET_TEXT, checks)


if __name__ == "__main__":
    sys.exit(main())
