"""The tool tax on a native PyTorch module: ``detprof sweep`` against a bare PyTorch loop doing the same work.

Target (issue "Your PyTorch model as you train it"): a native eager sweep takes at most 1.15x the wall time of a
bare loop that does the same warm-up, measured and traced steps in as many processes. On a CPU the sweep runs each
repeat's two modes in one process (in-process pairing), a step of each in turn on one core with one thread once
warm, so the bare loop does the same: per repeat, one process builds the module once per mode from one seed (each
under its mode's switch), warms both up, moves to one core, takes its untimed steps in turn flipping
``torch.use_deterministic_algorithms`` before each, then under ``torch.profiler`` one settling step of each and as
many traced steps again, and writes the trace. What the sweep adds on top is its own: loading the module once
before any run, marking each module's calls while tracing, parsing the traces, records, the report. The two take
turns, ``--rounds`` times each, and the ratio is of their fastest rounds: this machine's speed drifts by 15-25%
over minutes, which a single pair would read as tax. The sweep names ``--backend torch``, as a user who knows the
module's framework does; without it, the module is first loaded in a worker of the default framework (TensorFlow
where it is installed), which found it a module: 4-5 s more here, once per sweep.

The study is the CPU preset's size (``cpu-small``: its repeats, steps per phase, warm-up, batch and input size),
as the Keras sweep's tax is measured (``bench_sweep_tax``).

``python -m benchmarks.bench_native_tax [--repeats 4] [--steps 80] [--rounds 2]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.results import record, timed_command
from detprof.profiler.presets import PRESETS
from detprof.profiler.process import STEADY_HEAP_ENV

TARGET = 1.15
TARGET_TEXT = (
    "detprof sweep of a native PyTorch module (eager, both modes in one process per repeat, torch.profiler on its "
    "traced steps) against a bare PyTorch loop doing the same work in as many processes: at most 1.15x"
)
PRESET = PRESETS["cpu-small"]
WARMUP = int(PRESET["warmup"])
BATCH = int(PRESET["batch_size"])
MODULE = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
        )
        self.head = nn.Linear(64, classes)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


def net(input_shape, classes):
    return Net(classes)
"""
BARE_LOOP = """
import os, sys, tempfile
import torch
sys.path.insert(0, sys.argv[1])
from bench_module import net
warmup, steps, batch = (int(a) for a in sys.argv[2:5])

def arm(deterministic):
    torch.use_deterministic_algorithms(deterministic)
    torch.manual_seed(0)
    module = net((3, 32, 32), 10).train()
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
    loss = torch.nn.CrossEntropyLoss()
    x = torch.randn((batch, 3, 32, 32), generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 10, (batch,), generator=torch.Generator().manual_seed(1))

    def step():
        torch.use_deterministic_algorithms(deterministic)
        optimizer.zero_grad(set_to_none=True)
        loss(module(x), y).backward()
        optimizer.step()

    return step

steps_of = [arm(False), arm(True)]
for _ in range(warmup):
    for step in steps_of:
        step()
torch.set_num_threads(1)
for thread in os.listdir("/proc/self/task"):
    os.sched_setaffinity(int(thread), {0})
for _ in range(steps):
    for step in steps_of:
        step()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
    for step in steps_of:
        step()
    for i in range(steps):
        for step in steps_of:
            with torch.profiler.record_function(f"step {i}"):
                step()
profile.export_chrome_trace(os.path.join(tempfile.mkdtemp(), "bare.pt.trace.json"))
"""


def _bare(folder: Path, repeats: int, steps: int) -> float:
    """Per repeat, one process that runs both modes in turn, as the sweep's in-process pairs do."""
    env = {**STEADY_HEAP_ENV, **os.environ}
    start = time.perf_counter()
    for _ in range(repeats):
        command = [sys.executable, "-c", BARE_LOOP, str(folder), str(WARMUP), str(steps), str(BATCH)]
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _sweep(out: Path, folder: Path, repeats: int, steps: int) -> float:
    """The sweep with exactly the bare loop's work: its steps and repeats, none added for precision."""
    return timed_command(
        [
            *(sys.executable, "-m", "detprof.cli", "sweep", "--models", f"{folder / 'bench_module.py'}:net"),
            *("--backend", "torch", "--input-shape", "3x32x32", "--classes", "10", "--batch-size", str(BATCH)),
            *("--gpu", "cpu", "--steps", str(steps), "--warmup", str(WARMUP), "--repeats", str(repeats)),
            *("--precision", "off", "--pairing", "in-process", "--out", str(out)),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=int(PRESET["repeats"]))
    parser.add_argument("--steps", type=int, default=int(PRESET["steps"]))
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv or [])
    print(f"native sweep tool tax: {args.repeats} repeats of {args.steps} steps per phase, both modes per process")
    bare_s: list[float] = []
    sweep_s: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "bench_module.py").write_text(MODULE)
        for round_ in range(args.rounds):
            bare_s.append(_bare(folder, args.repeats, args.steps))
            sweep_s.append(_sweep(folder / f"round-{round_}", folder, args.repeats, args.steps))
    bare, sweep = min(bare_s), min(sweep_s)
    ratio = sweep / bare
    print(f"  bare PyTorch loop, torch.profiler on traced steps: {', '.join(f'{s:.1f}' for s in bare_s)} s")
    print(f"  detprof sweep:                                     {', '.join(f'{s:.1f}' for s in sweep_s)} s")
    checks = {f"ratio sweep / bare loop: {ratio:.3f}x (target <= {TARGET}x)": ratio <= TARGET}
    return record("bench_native_tax", TARGET_TEXT, checks)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
