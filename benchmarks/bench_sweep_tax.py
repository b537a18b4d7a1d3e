"""The sweep's own tax: ``detprof sweep`` against a bare Keras script doing the same work.

Target (issue "Model zoo, determinism modes and sweep"): on the CPU preset, the sweep takes at
most 1.15x the wall time of a bare script that does the same warm-up and measured steps in the
same number of processes. The bare script switches determinism the same way, times untraced
steps (wall time) and then, after starting TensorFlow's profiler and one settling step, as
many traced steps (kernel time), as the sweep's workers do; a third run with as many steps
and no profiler shows what the tracer itself costs. On a CPU the sweep measures each
repeat as lockstep pairs in one process per mode, so the bare script does the same work the
same way: both modes of a repeat start together with one TensorFlow thread each, and for each
model in turn warm up, move to one core, and take their measured steps in turn when a minimal
coordinator says so (a line on a pipe). What the
sweep adds on top is its own: records, trace parsing, telemetry, the report.

``python -m benchmarks.bench_sweep_tax [--preset cpu-small]``
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
from detprof.profiler.measured_runs import mode_order
from detprof.profiler.presets import PRESETS
from detprof.profiler.process import STEADY_HEAP_ENV

TARGET = 1.15
TARGET_TEXT = (
    "detprof sweep's wall time against a bare Keras script doing the same work in as many processes (TF profiler on "
    "its traced steps), on the CPU preset: at most 1.15x"
)

BARE_SCRIPT = """
import os, sys, tempfile, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras, numpy as np, tensorflow as tf
from detprof.models import registry
models, mode, size, batch, classes, warmup, steps, profile, core = sys.argv[1:10]
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
if mode == "deterministic":
    tf.config.experimental.enable_op_determinism()
size, batch, classes, warmup, steps = int(size), int(batch), int(classes), int(warmup), int(steps)
cpus = os.sched_getaffinity(0)

def pin(cores):
    for thread in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(thread), cores)

for model_name in models.split(","):
    pin(cpus)
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    spec = registry.get(model_name)
    shape = (size, size, spec.input_shape[-1])
    model = spec.build(shape, classes)
    optimizer = keras.optimizers.SGD(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((batch, *shape), dtype=np.float32))
    y = tf.constant(rng.integers(0, classes, size=batch), dtype=tf.int32)

    @tf.function(jit_compile=False)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for _ in range(warmup):
        train_step(x, y).numpy()
    pin({int(core)})
    print("ready", flush=True)
    for phase in ("untraced", "traced"):
        if phase == "traced":
            sys.stdin.readline()
            if profile == "1":
                tf.profiler.experimental.start(tempfile.mkdtemp())
            train_step(x, y).numpy()
            print("traced", flush=True)
        for _ in range(steps):
            sys.stdin.readline()
            t0 = time.perf_counter_ns(); train_step(x, y).numpy(); print(time.perf_counter_ns() - t0, flush=True)
    if profile == "1":
        tf.profiler.experimental.stop()
"""


def _bare(preset: dict, profile: bool) -> float:
    """Per repeat, one process per mode that takes the repeat's models in turn, in lockstep, as the sweep does."""
    env = {**STEADY_HEAP_ENV, **os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    start = time.perf_counter()
    for repeat in range(preset["repeats"]):
        pair = []
        for mode in mode_order(repeat):
            args = [
                ",".join(preset["models"]),
                mode,
                preset["input_size"],
                preset["batch_size"],
                preset["classes"],
                preset["warmup"],
                preset["steps"],
                int(profile),
                repeat % len(os.sched_getaffinity(0)),
            ]
            command = [sys.executable, "-c", BARE_SCRIPT, *map(str, args)]
            pair.append(
                subprocess.Popen(
                    command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                    text=True,
                )
            )  # fmt: skip
        for _model in preset["models"]:
            for proc in pair:
                assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            for command in ["step"] * preset["steps"] + ["trace"] + ["step"] * preset["steps"]:
                for proc in pair:
                    assert proc.stdin is not None and proc.stdout is not None
                    proc.stdin.write(f"{command}\n")
                    proc.stdin.flush()
                    proc.stdout.readline()
        for proc in pair:
            assert proc.stdin is not None
            proc.stdin.close()
            if proc.wait() != 0:
                raise subprocess.CalledProcessError(proc.returncode, proc.args)
    return time.perf_counter() - start


def _sweep(preset_name: str) -> float:
    """The preset's sweep with exactly the bare script's work: its steps (not sized to the machine) and repeats (none
    added for precision)."""
    steps = str(PRESETS[preset_name]["steps"])
    with tempfile.TemporaryDirectory() as tmp:
        return timed_command(
            [
                *(sys.executable, "-m", "detprof.cli", "sweep", "--preset", preset_name, "--gpu", "cpu"),
                *("--tracer", "tf", "--steps", steps, "--precision", "off", "--out", str(Path(tmp) / "out")),
            ]
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="cpu-small", choices=sorted(PRESETS))
    args = parser.parse_args(argv or [])
    preset = PRESETS[args.preset]
    runs = len(preset["models"]) * 2 * preset["repeats"]
    print(f"sweep tool tax: preset {args.preset}, {runs} runs in {2 * preset['repeats']} worker processes each way")
    bare_traced = _bare(preset, profile=True)
    sweep = _sweep(args.preset)
    bare_untraced = _bare(preset, profile=False)
    ratio = sweep / bare_traced
    print(f"  bare Keras script, TF profiler on traced steps:   {bare_traced:7.1f} s")
    print(f"  detprof sweep:                                    {sweep:7.1f} s")
    print(f"  bare Keras script, no profiler:                   {bare_untraced:7.1f} s")
    print(f"  ratio sweep / bare (untraced): {sweep / bare_untraced:.3f}x (for information)")
    checks = {f"ratio sweep / bare (traced), preset {args.preset}: {ratio:.3f}x (target <= {TARGET}x)": ratio <= TARGET}
    return record("bench_sweep_tax", TARGET_TEXT, checks)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
