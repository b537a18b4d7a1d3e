"""Time outside measured steps: a process per repeat (the code before) against one process for every repeat of a
model (``--shared-repeats``), side by side in one run.

Target (issue "A GPU lease yields the answer, not start-up"): at the tiny scale on this CPU, on JAX and PyTorch,
the seconds per pair of modes spent outside measured steps (the sweep's wall time, less the measured steps its
records account, over its pairs) at most half the code before's, for the same sweep; and the answers unchanged:
each model's overhead the same both ways (the interval of one over the other, Welch's, the repeats check's, holds
1.00), its reading (cheap, expensive) the same wherever both settle it, and an A/A calibration with shared repeats
whose interval holds 1.00. JAX's kernel time on this CPU is noisy at this size (steps of about 1 ms and 2 ms in
turn, both ways), so a reading may stay unsettled one way or the other.

The code before is ``BASELINE`` out of git (its worker already accounts its time parts), run first on
``sys.path`` of its own processes; the two take turns per backend so that the machine's load falls on both.

``python -m benchmarks.bench_device_time [--backends jax,torch] [--repeats 4]``
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench_startup import ROOT, environment, extract_tree
from benchmarks.results import record
from detprof.analysis.overhead import model_overheads
from detprof.analysis.pairing_check import REPEATS, compare
from detprof.device_time import process_seconds
from detprof.intervals import headline, reading
from detprof.store import ResultsStore

BASELINE = "92be5e9"
"""The last commit before a model's repeats could share one process and its compiled steps."""
MODELS = "smallcnn,mediumcnn_k3"
TINY = ["--gpu", "cpu", "--input-size", "16", "--batch-size", "8", "--steps", "10", "--warmup", "3"]
COMMON = [*TINY, "--precision", "off", "--pairing", "in-process", "--no-report"]
TARGET_SHARE = 0.5
TARGET = (
    "Seconds outside measured steps per pair of modes, tiny sweeps on JAX and PyTorch, one process for every repeat "
    "of a model against a process per repeat (the code before): at most half; the same readings, an A/A that holds"
)


def _sweep(tree: Path, backend: str, repeats: int, out: Path, *more: str) -> tuple[float, list[dict[str, Any]]]:
    """The sweep's wall seconds and its records."""
    command = [sys.executable, "-m", "detprof.cli", "sweep", "--backend", backend, "--models", MODELS]
    started = time.monotonic()
    subprocess.run([*command, *COMMON, "--repeats", str(repeats), *more, "--out", str(out)],
                   env=environment(tree), check=True, capture_output=True)  # fmt: skip
    kind = "calibration" if "--calibrate" in more else "sweep"
    return time.monotonic() - started, list(ResultsStore(out, kind).records())


def outside_per_pair(wall_s: float, records: Sequence[Mapping[str, Any]]) -> float:
    """The sweep's seconds that ran no measured step, per pair of modes."""
    return (wall_s - process_seconds(records).get("steps", 0.0)) / (len(records) / 2)


def readings(records: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Each model's reading of its headline overhead."""
    found = {}
    for model, overhead in model_overheads(records).items():
        _, chosen = headline(overhead.kernel, overhead.wall)
        found[model] = "no overhead" if chosen is None else reading(chosen)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="jax,torch")
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args(argv)
    print(f"== time outside measured steps: --shared-repeats against {BASELINE}, {MODELS} x {args.repeats} repeats ==")
    checks: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="detprof-bench-device-time-") as tmp:
        folder = Path(tmp)
        before_tree = extract_tree(folder, BASELINE)
        for backend in args.backends.split(","):
            before_s, before = _sweep(before_tree, backend, args.repeats, folder / f"{backend}-before")
            now_s, now = _sweep(ROOT, backend, args.repeats, folder / f"{backend}-now", "--shared-repeats")
            outside_before, outside_now = outside_per_pair(before_s, before), outside_per_pair(now_s, now)
            print(
                f"{backend:<6} per pair outside measured steps: before {outside_before:.2f} s, now {outside_now:.2f} s "
                f"({outside_now / outside_before:.0%}); sweep {before_s:.0f} s -> {now_s:.0f} s"
            )
            share = outside_now / outside_before
            checks[f"{backend}: {share:.0%} of the time outside measured steps <= {TARGET_SHARE:.0%}"] = (
                share <= TARGET_SHARE
            )
            said_before, said_now = readings(before), readings(now)
            print(f"{backend:<6} readings: before {said_before}, now {said_now}")
            settled = [m for m in said_now if "not settled" not in (said_now[m], said_before.get(m))]
            checks[f"{backend}: the same readings where both settle ({said_now})"] = all(
                said_now[m] == said_before.get(m) for m in settled
            )
            compared = compare(now, before, REPEATS).models
            for model in compared:
                print(f"{backend:<6} {model.model}: {model.why}")
            checks[f"{backend}: each overhead the same both ways (now over before holds 1.00)"] = bool(
                compared
            ) and all(m.low is not None and m.high is not None and m.low <= 1.0 <= m.high for m in compared)
            _, aa = _sweep(ROOT, backend, args.repeats, folder / f"{backend}-aa", "--shared-repeats", "--calibrate")
            holds = {
                model: overhead.kernel is not None and overhead.kernel.ci_low <= 1.0 <= overhead.kernel.ci_high
                for model, overhead in model_overheads(aa).items()
            }
            intervals = {
                model: f"{o.kernel.ratio:.3f} [{o.kernel.ci_low:.3f}, {o.kernel.ci_high:.3f}]"
                for model, o in model_overheads(aa).items()
                if o.kernel is not None
            }
            print(f"{backend:<6} A/A with shared repeats: {intervals}")
            checks[f"{backend}: an A/A with shared repeats holds 1.00 ({intervals})"] = bool(holds) and all(
                holds.values()
            )
    return record("bench_device_time", TARGET, checks)


if __name__ == "__main__":
    sys.exit(main())
