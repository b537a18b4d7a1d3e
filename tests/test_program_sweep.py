"""``detprof sweep --command``: real training programs (PyTorch, Keras on TensorFlow) swept as black boxes.

Each program is a real script written into a temporary folder and run by a real interpreter:
the venv's (detprof importable) or the one the venv was made from (no detprof, no framework),
so that the ``sitecustomize`` hook is shown to work where detprof is not installed.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from advised import STAND_IN, advised, filled_in, resolve

from detprof.analysis.overhead import ModelOverhead, model_overheads
from detprof.backends.program import program_environment
from detprof.cli import main
from detprof.errors import ExitCode
from detprof.formatting import ratio
from detprof.options import RunOptions
from detprof.profiler.presets import PRESETS
from detprof.profiler.process import STEADY_HEAP_ENV
from detprof.profiler.program.files import in_effect
from detprof.profiler.program.request import ProgramRequest, plan_program_runs
from detprof.profiler.program.run import HOOK_DIR, NO_WINDOW, program_status
from detprof.records import outlying_steps
from detprof.reports.command import render_report
from detprof.store import ResultsStore
from detprof.sweep.render import print_summary

TIME_SLICE_NS = 5_000_000
"""What a step may take beyond its run's median step on a machine other work shares: a scheduler's time slice or so."""
TORCH_TRAIN = """
import sys
from pathlib import Path

import torch

import detprof

torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
# With a second argument N, the first deterministic run that finds no "interrupted" file beside the script has its
# first N steps interrupted by work that is not the training's, as by another process on the machine.
marker = Path(__file__).with_name("interrupted")
first = len(sys.argv) > 2 and torch.are_deterministic_algorithms_enabled() and not marker.exists()
interrupted = int(sys.argv[2]) if first else 0
if first:
    marker.touch()
other_work = torch.randn(256, 256)


def train_step():
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()


train_step()
with detprof.measure():
    for step in range(int(sys.argv[1])):
        detprof.step()
        train_step()
        for _ in range(400 if step < interrupted else 0):
            other_work.cos()
"""
STEPS, INTERRUPTED_STEPS = 8, 2
"""The swept PyTorch program's steps, and how many of them its first deterministic run has interrupted: that run
is a sweep's first (a repeat's modes alternate, deterministic first), and traced (a pair is traced, then timed)."""
INTERRUPTED_RUN = "mlp--deterministic--r0"
KERAS_FIT = """
import keras
import numpy as np

# Unseeded: TensorFlow refuses its random ops under determinism unless --seed has the hook seed them.
x, y = np.random.rand(64, 8).astype("float32"), np.random.randint(0, 2, 64)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=32, epochs=1, verbose=0)
"""
TENSORFLOW_UNSEEDED = """
import tensorflow as tf

print(float(tf.random.uniform(())))
"""
TORCH_SWITCHED_OFF = """
import torch

torch.use_deterministic_algorithms(False)
"""
NEEDS_USER_SITECUSTOMIZE = """
import os
import sys

sys.exit(0 if os.environ.get("USER_SITECUSTOMIZE_RAN") == "1" else 4)
"""
USER_SITECUSTOMIZE = """
import os

os.environ["USER_SITECUSTOMIZE_RAN"] = "1"
"""
TWO_WINDOWS = """
import sys

import detprof

print("opening the first window", file=sys.stderr)
with detprof.measure():
    detprof.step()
with detprof.measure():
    detprof.step()
"""
OUTSIDE_DETPROF = """
import sys

import detprof

with detprof.measure():
    for _ in range(2):
        detprof.step()
print([m for m in ("numpy", "detprof.store", "detprof.profiler.worker") if m in sys.modules])
"""
YOUR_MODEL = """
import keras


def build(input_shape, classes):
    inputs = keras.Input(shape=input_shape)
    return keras.Model(inputs, keras.layers.Dense(classes)(keras.layers.Flatten()(inputs)))
"""
BASE_PYTHON = Path(sys.base_prefix) / "bin" / "python3"


def script(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    return path


def sweep(out: Path, command: list[str | Path], name: str, *options: str) -> int:
    """``detprof sweep --command`` as a user types it, in this process."""
    line = shlex.join(str(part) for part in command)
    return main(["sweep", "--command", line, "--name", name, "--gpu", "cpu", "--out", str(out), *options])


def records(out: Path) -> dict[str, dict[str, Any]]:
    return {r["run_id"]: r for r in ResultsStore(out, "sweep").records()}


def base_python() -> Path:
    """The interpreter the venv was made from, where neither detprof nor any framework is installed."""
    if not BASE_PYTHON.is_file():
        pytest.skip(f"no base interpreter at {BASE_PYTHON}")
    found = subprocess.run([BASE_PYTHON, "-c", "import detprof"], capture_output=True, cwd="/", check=False)
    if found.returncode == 0:
        pytest.skip(f"{BASE_PYTHON} has detprof installed")
    return BASE_PYTHON


@pytest.fixture(scope="module")
def torch_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PyTorch program with a measured window, traced by torch.profiler: each mode traced, then untraced, twice;
    the first deterministic run's first steps interrupted."""
    folder = tmp_path_factory.mktemp("torch-program")
    train = script(folder, "train.py", TORCH_TRAIN)
    out = folder / "res"
    options = ("--backend", "torch", "--tracer", "torch", "--repeats", "2", "--no-report")
    assert sweep(out, [sys.executable, train, STEPS, INTERRUPTED_STEPS], "mlp", *options) == 0
    return out


@pytest.mark.slow
def test_every_run_is_a_process_of_its_own_with_determinism_verified(torch_sweep: Path) -> None:
    recs = records(torch_sweep)
    assert len(recs) == 8
    for rec in recs.values():
        assert rec["status"] == "ok", rec["reason"]
        assert (rec["model"], rec["backend"], rec["tracer"] != "none") == ("mlp", "torch", rec["measures"] == "kernel")
        deterministic = rec["mode"] == "deterministic"
        torch_state = rec["settings"]["frameworks"]["torch"]
        assert rec["settings"]["op_determinism"] is deterministic is torch_state["op_determinism"]
        assert (torch_state["cudnn_deterministic"], torch_state["cudnn_benchmark"]) == (deterministic, False)
        assert rec["versions"]["torch"].startswith("2.") and "keras" not in rec["versions"]
        program = rec["program"]
        assert program["exit_status"] == 0 and program["processes"] == 1
        assert (program["measured_window"], program["marked_steps"]) == ("api", STEPS)
        argv = [sys.executable, str(torch_sweep.parent / "train.py"), str(STEPS), str(INTERRUPTED_STEPS)]
        assert program["command"] == shlex.join(argv)
        assert rec["worker_env"] == STEADY_HEAP_ENV and "pairing" not in rec
    manifest = json.loads((torch_sweep / "sweep" / "manifest.json").read_text())["config"]
    assert manifest["program"]["name"] == "mlp" and manifest["pairing"] == "sequential"
    assert "steps" not in manifest and "batch_size" not in manifest


@pytest.mark.slow
def test_the_window_steps_are_timed_untraced_and_traced_apart(torch_sweep: Path) -> None:
    """Wall time from the untraced runs' marked steps; kernel time from the traced runs' steps, split per step."""
    recs = records(torch_sweep)
    for run_id, rec in recs.items():
        if rec["measures"] == "wall":
            assert run_id.endswith("--untraced")
            assert rec["steps"] == STEPS and len(rec["step_wall_ns"]) == STEPS and rec["kernel_table"] is None
        else:
            assert rec["step_wall_ns"] is None and len(rec["traced_step_wall_ns"]) == STEPS
            assert rec["kernel_table_steps"] == STEPS and len(rec["step_kernel_ns"]) == STEPS
            table = ResultsStore(torch_sweep, "sweep").read_table(rec["kernel_table"])
            assert table["dur_ns"].sum() == pytest.approx(rec["kernel_ns_per_step"] * STEPS)
            assert any(name.startswith("aten::") for name in table["name"].astype(str))


@pytest.mark.slow
def test_every_command_the_report_advises_for_a_program_resolves_with_your_model_in_it(
    torch_sweep: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A program is no model: what the report suggests for it takes your model instead, and says so."""
    markdown = render_report([torch_sweep], "md")
    commands = advised(markdown)
    assert f"detprof stability --model {STAND_IN} --backend torch" in commands
    assert f"detprof sweep --calibrate --model {STAND_IN} --backend torch" in commands
    assert f"a program is no model detprof can train: give yours as {STAND_IN}" in markdown
    folder = torch_sweep.parent
    script(folder, "your_model.py", YOUR_MODEL)
    for line in commands:
        resolve(filled_in(line, "your_model.py:build"), folder, capsys)


@pytest.mark.slow
def test_a_programs_last_step_is_as_long_as_its_others(torch_sweep: Path) -> None:
    """Nothing of detprof's own runs inside a measured step: the last one, which the window's close ends, took 15-25
    ms more than steps of half a millisecond in every run while the close imported ``detprof.store`` before ending
    it. A busy machine may pause any one step of a run, so the runs' median says."""
    steps = [rec["step_wall_ns"] or rec["traced_step_wall_ns"] for rec in records(torch_sweep).values()]
    longer = [last - statistics.median(others) for *others, last in steps]
    assert statistics.median(longer) <= TIME_SLICE_NS, steps


@pytest.mark.slow
def test_interrupted_steps_are_set_aside_by_where_the_time_went_as_by_the_answer_and_the_run_named(
    torch_sweep: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first deterministic run's first steps did other work (``other_work.cos()``): the median step sets them
    aside, and so does the sentence on where the added time went, which counted them and put the planted aten::cos
    first while the interval held 1.00; the report's first screen and the sweep's closing lines name the run."""
    outlying = outlying_steps(records(torch_sweep)[INTERRUPTED_RUN]["step_kernel_ns"])
    assert set(range(INTERRUPTED_STEPS)) <= set(outlying)  # and the step after them, where its caches were cold
    row = json.loads(render_report([torch_sweep], "json"))["models"][0]
    kernel = row["overhead"]["kernel"]
    assert "aten::cos" not in row["attribution"]
    if kernel["lo"] <= 1.0 <= kernel["hi"]:
        assert "Determinism added no kernel time told apart from noise" in row["attribution"]
    named = f"{len(outlying)} of {STEPS} in {INTERRUPTED_RUN} ("
    assert any(caveat.startswith("Steps set aside as interrupted") and named in caveat for caveat in row["caveats"])
    print_summary(ResultsStore(torch_sweep, "sweep"))
    closing = capsys.readouterr().out.split("Disturbed runs:\n")[1]
    assert named in closing.split("Where the added time went:")[0]


@pytest.mark.slow
def test_a_run_measured_while_another_process_used_the_cores_is_named_with_the_answer_without_it(
    torch_sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another process used 0.83 of the 2 cores during one run: its record's ``load`` says so (every other run's says
    idle: this machine is shared, and its runs saw what they saw). The warnings at the report's end counted it; the
    first screen and the sweep's closing lines name the run, how busy the machine was, and the answer without it."""
    results = tmp_path / "res"
    shutil.copytree(torch_sweep, results)
    store, busy = ResultsStore(results, "sweep"), "mlp--default--r1"
    for rec in store.records():
        other = 0.83 if rec["run_id"] == busy else 0.02
        store.write_record(rec | {"load": rec["load"] | {"cores": 2, "other_cores": other, "steal_fraction": 0.0}})
    without = model_overheads(r for r in store.records() if r["run_id"] != busy)["mlp"].kernel
    said = (
        f"1 of 8 runs measured while other work used the machine: {busy} (other processes used 0.83 of 2 cores); "
        f"without it, kernel time {ratio(without)}."
    )
    assert said in json.loads(render_report([results], "json"))["models"][0]["caveats"]
    print_summary(store)
    assert f"  mlp: {said}" in capsys.readouterr().out


@pytest.fixture(scope="module")
def keras_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Keras program on TensorFlow that opens no window and seeds nothing: timed as a whole process, two repeats
    seeded by ``--seed``, the report."""
    folder = tmp_path_factory.mktemp("keras-program")
    train = script(folder, "fit.py", KERAS_FIT)
    out = folder / "res"
    assert sweep(out, [sys.executable, train], "fit", "--tracer", "none", "--repeats", "2", "--seed", "3") == 0
    return out


@pytest.mark.slow
def test_tensorflow_is_switched_through_its_environment_and_seeded_by_seed(keras_sweep: Path) -> None:
    for rec in records(keras_sweep).values():
        assert rec["status"] == "ok", rec["reason"]
        tensorflow = rec["settings"]["frameworks"]["tensorflow"]
        assert tensorflow["op_determinism"] is (rec["mode"] == "deterministic") is rec["settings"]["op_determinism"]
        assert rec["backend"] == "tensorflow" and rec["versions"]["keras"] and rec["settings"]["seed"] == 3
    manifest = json.loads((keras_sweep / "sweep" / "manifest.json").read_text())["config"]
    assert manifest["program"]["seed"] == 3


@pytest.mark.slow
def test_an_unseeded_tensorflow_program_fails_determinism_with_the_fix_and_runs_with_seed(tmp_path: Path) -> None:
    """TensorFlow refuses a random op without a seed under determinism: a failed run (no op lacks a deterministic
    implementation) whose note says how to seed it; with ``--seed`` the hook seeds it and the run reads it back."""
    program = script(tmp_path, "draw.py", TENSORFLOW_UNSEEDED)
    for seed in (None, 5):
        reports = tmp_path / f"in-effect-{seed}"
        reports.mkdir()
        env = program_environment("deterministic", os.environ, str(reports), seed) | {"PYTHONPATH": str(HOOK_DIR)}
        ran = subprocess.run([sys.executable, program], env=env, capture_output=True, text=True, check=False)
        effect = in_effect(reports, "deterministic")
        status, reason = program_status(ran.returncode, effect, ran.stderr, "deterministic", None)
        if seed is None:
            assert status == "failed" and reason is not None and "Random ops require a seed" in reason, reason
            note = ModelOverhead("draw", failures=[{"run_id": "draw--deterministic--r0", "reason": reason}])
            assert "(fix: seed the program at its start (keras.utils.set_random_seed(N)), or give --seed N)" in str(
                note.failure_note()
            )
        else:
            assert (status, reason) == ("ok", None), ran.stderr[-2000:]
            assert effect.settings("deterministic")["seed"] == seed


@pytest.mark.slow
def test_without_a_window_the_whole_process_is_timed_and_the_report_says_so(keras_sweep: Path) -> None:
    for rec in records(keras_sweep).values():
        assert (rec["program"]["measured_window"], rec["program"]["marked_steps"]) == ("process", None)
        [process_ns] = rec["step_wall_ns"]
        assert 0 < process_ns / 1e9 <= rec["duration_s"] + 0.0005  # duration_s is rounded to the ms
    html = (keras_sweep / "report.html").read_text()
    assert "fit: measured as a whole process" in html


@pytest.mark.slow
def test_baseline_and_check_read_the_program_as_a_model(
    keras_sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    baseline = tmp_path / "baseline.json"
    assert main(["baseline", str(keras_sweep), "-o", str(baseline)]) == 0
    assert list(json.loads(baseline.read_text())["models"]) == ["fit"]
    assert main(["check", "--baseline", str(baseline), "--current", str(keras_sweep)]) == 0
    assert "fit" in capsys.readouterr().out
    rerun = tmp_path / "rerun"
    main(["check", "--baseline", str(baseline), "--run", "--repeats", "2", "--out", str(rerun)])
    again = records(rerun)
    assert set(again) == {f"fit--{mode}--r{repeat}" for mode in ("default", "deterministic") for repeat in (0, 1)}
    first = next(iter(records(keras_sweep).values()))
    assert {rec["program"]["command"] for rec in again.values()} == {first["program"]["command"]}
    assert all(rec["status"] == "ok" and rec["settings"]["seed"] == 3 for rec in again.values())  # --seed replayed
    assert main(["check", "--baseline", str(baseline), "--run", "--steps", "5"]) == 2
    assert "--steps: not with --command" in capsys.readouterr().err


@pytest.mark.slow
def test_determinism_the_program_switched_off_is_found_out(tmp_path: Path) -> None:
    """The hook reports what was in effect at the end, not what detprof asked for: such a run is failed."""
    switched_off = script(tmp_path, "off.py", TORCH_SWITCHED_OFF)
    reports = tmp_path / "in-effect"
    reports.mkdir()
    env = program_environment("deterministic", os.environ, str(reports)) | {"PYTHONPATH": str(HOOK_DIR)}
    ran = subprocess.run([sys.executable, switched_off], env=env, capture_output=True, text=True, check=False)
    assert ran.returncode == 0, ran.stderr
    found = in_effect(reports, "deterministic")
    assert found.problem == "determinism was not in effect in torch in deterministic mode"
    assert found.op_determinism is False and found.frameworks["torch"][0]["cudnn_deterministic"] is True


def test_the_hook_chains_to_the_users_sitecustomize_where_detprof_is_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A program in an interpreter without detprof: the hook runs, then the user's own sitecustomize.

    It loads no framework, so a deterministic run cannot be verified; it opens no window, so
    once a run has shown that, its traced runs are recorded as failed without running it.
    """
    python = base_python()
    site = script(tmp_path / "site", "sitecustomize.py", USER_SITECUSTOMIZE).parent
    monkeypatch.setenv("PYTHONPATH", str(site))
    program = script(tmp_path, "plain.py", NEEDS_USER_SITECUSTOMIZE)
    assert sweep(tmp_path / "res", [python, program], "plain", "--tracer", "tf", "--repeats", "1", "--no-report") == 0
    recs = records(tmp_path / "res")
    wall = recs["plain--default--r0--untraced"]
    assert wall["status"] == "ok" and wall["program"]["exit_status"] == 0
    assert wall["program"]["processes"] == 1 and wall["settings"]["op_determinism"] is None
    assert wall["versions"]["python"] and len(wall["step_wall_ns"]) == 1
    not_verified = "determinism not verified: the program loaded none of TensorFlow, JAX and PyTorch"
    assert recs["plain--deterministic--r0"]["reason"] == not_verified
    assert recs["plain--deterministic--r0--untraced"]["reason"] == not_verified
    skipped = recs["plain--default--r0"]
    assert (skipped["status"], skipped["reason"], skipped["program"]["exit_status"]) == ("failed", NO_WINDOW, None)


def test_a_program_that_fails_is_a_failed_run_with_its_stderr_and_the_sweep_goes_on(tmp_path: Path) -> None:
    program = script(tmp_path, "two_windows.py", TWO_WINDOWS)
    options = ("--tracer", "none", "--repeats", "1", "--no-report")
    assert sweep(tmp_path / "res", [sys.executable, program], "twice", *options) == 0
    recs = records(tmp_path / "res")
    assert set(recs) == {"twice--deterministic--r0", "twice--default--r0"}
    for rec in recs.values():
        assert rec["status"] == "failed" and rec["program"]["exit_status"] == 1
        assert rec["reason"].startswith("exit code 1: RuntimeError: detprof.measure() opens one measured window")
        assert rec["program"]["stderr_tail"].startswith("opening the first window\nTraceback")


def test_the_api_does_nothing_outside_detprof_and_loads_nothing_heavy(tmp_path: Path) -> None:
    program = script(tmp_path, "outside.py", OUTSIDE_DETPROF)
    ran = subprocess.run([sys.executable, program], capture_output=True, text=True, check=False)
    assert (ran.returncode, ran.stdout.strip()) == (0, "[]"), ran.stderr


def test_a_repeat_runs_both_modes_in_turn_their_order_alternating() -> None:
    options = RunOptions(gpu="cpu", tracer="none", repeats=3)
    settings, target = ProgramRequest(f"{sys.executable} -c pass", "p", options).resolve(list(PRESETS))
    assert target.program and target.pairing == "sequential"
    assert [run.run_id for run in plan_program_runs(settings)] == [
        "p--deterministic--r0",
        "p--default--r0",
        "p--default--r1",
        "p--deterministic--r1",
        "p--deterministic--r2",
        "p--default--r2",
    ]


def test_each_mode_gets_every_frameworks_switch_and_default_mode_none() -> None:
    user = {"XLA_FLAGS": "--xla_dump_to=/tmp/x --xla_gpu_deterministic_ops=true", "TF_DETERMINISTIC_OPS": "1"}
    deterministic = program_environment("deterministic", user, "/tmp/in-effect")
    assert deterministic["TF_DETERMINISTIC_OPS"] == "1" and deterministic["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert deterministic["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_gpu_deterministic_ops=true"
    assert (deterministic["DETPROF_PROGRAM_MODE"], deterministic["DETPROF_IN_EFFECT_DIR"]) == (
        "deterministic",
        "/tmp/in-effect",
    )
    default = program_environment("default", user, "/tmp/in-effect")
    assert "TF_DETERMINISTIC_OPS" not in default and default["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"
    assert default["DETPROF_PROGRAM_MODE"] == "default"


@pytest.mark.parametrize(
    ("command", "extra", "code", "message"),
    [
        ("no-such-trainer --epochs 1", (), ExitCode.USAGE, "program 'no-such-trainer' not found"),
        ("PYTHON does-not-exist.py", (), ExitCode.INPUT, "the script does-not-exist.py does not exist"),
        ("PYTHON 'unbalanced", (), ExitCode.USAGE, "cannot be split into arguments"),
        ("PYTHON -c pass", ("--models", "smallcnn", "--steps", "3"), ExitCode.USAGE, "--models, --steps: not with"),
        ("PYTHON -c pass", ("--name", "a/b"), ExitCode.USAGE, "--name 'a/b'"),
    ],
)
def test_bad_input_is_one_line_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, extra: tuple[str, ...], code: int, message: str
) -> None:
    name = () if "--name" in extra else ("--name", "p")
    command = command.replace("PYTHON", sys.executable)
    assert main(["sweep", "--command", command, *name, *extra, "--out", str(tmp_path / "res")]) == code
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "res").exists()


def test_command_and_name_go_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", "--command", f"{sys.executable} -c pass", "--out", str(tmp_path)]) == ExitCode.USAGE
    assert "--command needs --name" in capsys.readouterr().err
    assert main(["sweep", "--name", "p", "--out", str(tmp_path)]) == ExitCode.USAGE
    assert "--name names the program of --command" in capsys.readouterr().err
