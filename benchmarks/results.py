"""A benchmark's verdict, printed and kept: ``benchmarks/results/NAME.json`` is what the documentation shows.

Each benchmark judges its targets as checks (a line that says what was measured against what target, and
whether it was met); ``record`` prints them as PASS/FAIL lines and writes them with the date, the commit and the
machine's cores and load, so that every figure the documentation shows says where and when it was measured.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parents[1]


def timed_command(command: list[str]) -> float:
    """Seconds ``command`` took, run to its end with its output discarded (a failure raises)."""
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()


def _commit() -> str:
    """The commit measured, marked where the tree had changes to tracked files."""
    changed = _git("status", "--porcelain", "--untracked-files=no")
    return (_git("rev-parse", "--short", "HEAD") or "unknown") + ("+changes" if changed else "")


def record(benchmark: str, target: str, checks: Mapping[str, bool]) -> int:
    """Prints one PASS/FAIL line per check and writes them to ``results/BENCHMARK.json``; the benchmark's exit
    code (non-zero when a target was missed). ``benchmark`` is the module's name (``bench_nsys_parse``)."""
    for label, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {label}")
    RESULTS.mkdir(exist_ok=True)
    result = {
        "benchmark": benchmark,
        "target": target,
        "checks": dict(checks),
        "passed": all(checks.values()),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "commit": _commit(),
        "machine": {"cores": os.cpu_count(), "load": round(os.getloadavg()[0], 2)},
    }
    path = RESULTS / f"{benchmark}.json"
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(result, indent=2) + "\n")
    partial.replace(path)
    print(f"recorded in {path.relative_to(ROOT)}")
    return 0 if result["passed"] else 1
