"""``detprof verify --command``: real PyTorch training programs verified as black boxes, and ``detprof.fingerprint``.

The programs are real scripts written into a temporary folder and run by the venv's
interpreter, four times each (deterministic a/b, default a/b); ``detprof.fingerprint`` is
also exercised in this process, under a spec as ``verify`` writes it, on real Keras and
PyTorch models and tensors.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_program_sweep import TORCH_SWITCHED_OFF, TORCH_TRAIN, script

import detprof
import detprof.api as api
from detprof.analysis.verification import compare
from detprof.cli import main
from detprof.errors import ExitCode
from detprof.findings import program_finding
from detprof.fingerprints import RunFingerprints, tensors_of
from detprof.profiler.program.files import SPEC_ENV, ProgramSpec, read_window
from detprof.store import ResultsStore

STEPS = 3
FINGERPRINTED_LOOP = """
import sys

import torch

import detprof

torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))

with detprof.measure():
    for _ in range(int(sys.argv[1])):
        detprof.step()
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        detprof.fingerprint("model", model)
        detprof.fingerprint("loss", loss)
"""
NOISY_BATCHES = """
import sys

import numpy as np
import torch

import detprof

torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Linear(16, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
augment = np.random.default_rng()  # no seed: fresh noise in every run, which no determinism can fix

with detprof.measure():
    for _ in range(int(sys.argv[1])):
        detprof.step()
        batch = x + torch.from_numpy(augment.normal(0, 0.1, x.shape).astype("float32"))
        detprof.fingerprint("batch", {"x": batch, "y": y})
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(batch), y).backward()
        optimizer.step()
        detprof.fingerprint("model", model)
"""
OUTSIDE_DETPROF = """
import sys

import detprof

with detprof.measure():
    detprof.step()
    detprof.fingerprint("weights", [1.0, 2.0])
detprof.fingerprint("after", object())
print([m for m in ("numpy", "detprof.fingerprints", "detprof.store") if m in sys.modules])
"""


def verify(out: Path, program: Path, name: str, *arguments: object, fmt: str = "table") -> int:
    """``detprof verify --command`` as a user types it, in this process, with the venv's interpreter."""
    line = shlex.join(str(part) for part in (sys.executable, program, *arguments))
    return main(["verify", "--command", line, "--name", name, "--gpu", "cpu", "--out", str(out), "--format", fmt])


def records(out: Path) -> dict[str, dict[str, Any]]:
    return {r["run_id"]: r for r in ResultsStore(out, "verify").records()}


@pytest.mark.slow
def test_a_program_that_fingerprints_its_model_each_step_is_bitwise_identical(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    program = script(tmp_path, "train.py", FINGERPRINTED_LOOP)
    assert verify(tmp_path / "res", program, "loop", STEPS, fmt="json") == ExitCode.OK
    [found] = json.loads(capsys.readouterr().out)["models"]
    assert (found["model"], found["backend"], found["device"], found["findings"]) == ("loop", "torch", "cpu", [])
    assert found["command"] == shlex.join([sys.executable, str(program), str(STEPS)])
    for mode in ("deterministic", "default"):  # PyTorch on a CPU: this loop is deterministic by default too
        comparison = found[mode]
        assert (comparison["identical"], comparison["first_difference"], comparison["problem"]) == (True, None, None)
        assert (comparison["steps"], comparison["marked_steps"], comparison["fingerprinted"]) == (STEPS, STEPS, 5)
    recs = records(tmp_path / "res")
    assert sorted(recs) == [f"loop--{mode}--{r}" for mode in ("default", "deterministic") for r in "ab"]
    for rec in recs.values():
        assert (rec["status"], rec["model"], rec["steps"], rec["steps_asked"]) == ("ok", "loop", STEPS, None)
        assert rec["settings"]["op_determinism"] is (rec["mode"] == "deterministic")
        assert (rec["program"]["exit_status"], rec["program"]["marked_steps"]) == (0, STEPS)
        taken = RunFingerprints.load(tmp_path / "res" / "verify" / rec["fingerprints"])
        names = [f"model/{layer}.{weights}" for layer in (0, 2) for weights in ("weight", "bias")]
        assert [[(f.name, f.kind) for f in step] for step in taken.steps] == [
            [*((name, "weights") for name in names), ("loss", "tensor")]
        ] * STEPS


@pytest.mark.slow
def test_a_program_that_fingerprints_nothing_is_compared_on_how_its_runs_ended(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    program = script(tmp_path, "train.py", TORCH_TRAIN)
    assert verify(tmp_path / "res", program, "plain", STEPS) == ExitCode.OK
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == [
        f"plain on cpu (torch): deterministic mode: both runs exited 0 after {STEPS} marked steps",
        f"  default mode: both runs exited 0 after {STEPS} marked steps",
        "  nothing was fingerprinted (detprof.fingerprint() in the window): only exit status and marked steps compared",
    ]
    assert all(rec["fingerprints"] is None and rec["status"] == "ok" for rec in records(tmp_path / "res").values())


@pytest.mark.slow
def test_unseeded_noise_in_a_fingerprinted_tensor_is_where_the_runs_part(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    program = script(tmp_path, "noisy.py", NOISY_BATCHES)
    assert verify(tmp_path / "res", program, "noisy", STEPS) == ExitCode.CHECK_FAILED
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(
        "noisy on cpu (torch): NOT deterministic on this device and stack: the two deterministic runs part at "
        "step 0, batch/x (tensor), max |diff| "
    )
    assert out[1].startswith("  default mode: the runs part at step 0, batch/x (tensor), max |diff| ")


@pytest.mark.slow
def test_a_deterministic_run_without_determinism_in_effect_is_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The program switches determinism off itself: its deterministic runs fail, so nothing is verified."""
    program = script(tmp_path, "off.py", TORCH_SWITCHED_OFF)
    assert verify(tmp_path / "res", program, "off", fmt="json") == ExitCode.CHECK_FAILED
    [found] = json.loads(capsys.readouterr().out)["models"]
    reason = "determinism was not in effect in torch in deterministic mode"
    assert found["failures"] == [f"off--deterministic--{r}: {reason}" for r in "ab"]
    assert (found["deterministic"]["identical"], found["deterministic"]["problem"]) == (None, "0 of 2 runs ended ok")
    assert (found["default"]["identical"], found["default"]["marked_steps"], found["held"]) == (True, None, None)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--command", "PYTHON -c pass", "--name", "p", "--models", "smallcnn"), "--models: not with --command"),
        (("--command", "PYTHON -c pass", "--name", "p", "--steps", "3", "--batch-size", "8"), "--batch-size: not"),
        (("--command", "PYTHON -c pass"), "--command needs --name"),
        (("--models", "smallcnn", "--name", "p"), "--name names the program of --command"),
    ],
)
def test_options_that_do_not_go_with_a_program_are_one_line_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: tuple[str, ...], message: str
) -> None:
    given = [option.replace("PYTHON", sys.executable) for option in options]
    assert main(["verify", *given, "--out", str(tmp_path / "res")]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "res").exists()


def test_fingerprint_does_nothing_outside_detprof_and_loads_nothing(tmp_path: Path) -> None:
    program = script(tmp_path, "outside.py", OUTSIDE_DETPROF)
    ran = subprocess.run([sys.executable, program], capture_output=True, text=True, check=False)
    assert (ran.returncode, ran.stdout.strip()) == (0, "[]"), ran.stderr


def run_window(monkeypatch: pytest.MonkeyPatch, folder: Path, *, verifies: bool) -> Path:
    """A spec as ``sweep`` (``verifies`` False) or ``verify --command`` writes it, in force for this process."""
    folder.mkdir(parents=True, exist_ok=True)
    fingerprints = folder / "fingerprints"
    spec = ProgramSpec("p--deterministic--a", "deterministic", "none", None, str(folder / "window.json"))
    if verifies:
        spec = ProgramSpec(**(spec.to_json() | {"fingerprints_path": str(fingerprints)}))
    (folder / "spec.json").write_text(json.dumps(spec.to_json()))
    monkeypatch.setenv(SPEC_ENV, str(folder / "spec.json"))
    monkeypatch.setattr(api, "_opened", [])
    return fingerprints


def test_under_sweep_fingerprint_writes_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fingerprints = run_window(monkeypatch, tmp_path, verifies=False)
    with detprof.measure():
        detprof.step()
        detprof.fingerprint("x", np.zeros(3))
    assert read_window(tmp_path / "window.json") is not None and not fingerprints.exists()


def test_fingerprints_go_to_the_step_open_and_every_step_of_the_window_is_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Before the first ``step()`` is step 0, as is the first step; a name fingerprinted again in a step is
    numbered; steps that fingerprinted nothing are kept, so that runs compare step for step."""
    torch = pytest.importorskip("torch")
    fingerprints = run_window(monkeypatch, tmp_path, verifies=True)
    with detprof.measure():
        detprof.fingerprint("init", np.arange(3.0))
        detprof.step()
        detprof.fingerprint("init", np.arange(4.0))
        detprof.step()
        detprof.fingerprint("grad", torch.ones(2, requires_grad=True) * 2)
        detprof.step()
    detprof.fingerprint("after", np.zeros(1))
    taken = RunFingerprints.load(fingerprints)
    assert [[(f.name, f.shape) for f in step] for step in taken.steps] == [
        [("init", (3,)), ("init#2", (4,))],
        [("grad", (2,))],
        [],
    ]
    assert taken.sample(1, taken.steps[1][0]).tolist() == [2.0, 2.0]


def test_what_each_kind_of_value_fingerprints() -> None:
    keras = pytest.importorskip("keras")
    torch = pytest.importorskip("torch")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d1"), keras.layers.Dropout(0.1)])
    [(name, kind, arrays)] = list(tensors_of("net", model))
    assert (name, kind) == ("net/d1", "weights")
    assert all(np.array_equal(a, b) for a, b in zip(arrays, model.get_layer("d1").get_weights(), strict=True))
    module = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    found = {name: (kind, arrays[0]) for name, kind, arrays in tensors_of("m", module)}
    assert list(found) == [
        *("m/0.weight", "m/0.bias", "m/1.weight", "m/1.bias"),
        *("m/1.running_mean", "m/1.running_var", "m/1.num_batches_tracked"),
    ]
    assert {kind for kind, _ in found.values()} == {"weights"}
    assert np.array_equal(found["m/0.weight"][1], module[0].weight.detach().numpy())
    half = torch.tensor([1.5, -2.25], dtype=torch.bfloat16)
    mapping = {"x": np.ones((2, 2)), "t": torch.zeros(2, requires_grad=True), "b": half, "k": keras.ops.ones(2)}
    found = {name: (kind, arrays[0]) for name, kind, arrays in tensors_of("batch", mapping)}
    assert {name: (kind, a.dtype.name, a.shape) for name, (kind, a) in found.items()} == {
        "batch/x": ("tensor", "float64", (2, 2)),
        "batch/t": ("tensor", "float32", (2,)),
        "batch/b": ("tensor", "float32", (2,)),
        "batch/k": ("tensor", "float32", (2,)),
    }
    assert found["batch/b"][1].tolist() == [1.5, -2.25]
    with pytest.raises(TypeError, match=r"fingerprint\('odd', ...\): cannot fingerprint a value of type object"):
        list(tensors_of("odd", object()))


def test_runs_that_fingerprint_different_tensors_part_where_they_do() -> None:
    """A program decides what it fingerprints: runs that fingerprint other tensors at a step part there."""
    a, b = RunFingerprints(), RunFingerprints()
    for run in (a, b):
        for _ in range(2):
            run.begin_step()
            run.add("x", "tensor", [np.zeros(2)])
    a.add("y", "tensor", [np.ones(2)])
    comparison = compare("deterministic", a, b)
    assert (comparison.identical, comparison.first_difference, comparison.steps) == (False, None, 1)
    assert comparison.parting(program=True) == (
        "at step 1, run a fingerprinted y (tensor) where run b fingerprinted nothing more"
    )


def test_an_op_a_program_could_not_run_deterministically_is_read_off_its_stderr() -> None:
    line = "RuntimeError: index_add_cuda_ does not have a deterministic implementation, but you set 'torch.use_d..."
    found = program_finding(line, "torch")
    assert (found.op, found.message, found.layer) == ("index_add_cuda_", line, None)
    assert found.advice.startswith("torch.use_deterministic_algorithms(True, warn_only=True)")


STUCK = """
import time

import detprof

with detprof.measure():
    detprof.step()
    time.sleep(120)
"""


@pytest.mark.slow
def test_a_run_past_the_run_timeout_is_ended_and_recorded_as_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A program stuck in its first step: each of its four runs is ended after ``--run-timeout`` and recorded as
    failed with that reason; nothing is verified, and no process of the program is left."""
    program = script(tmp_path, "stuck.py", STUCK)
    line = shlex.join([sys.executable, str(program)])
    args = ["verify", "--command", line, "--name", "stuck", "--gpu", "cpu", "--run-timeout", "2"]
    assert main([*args, "--out", str(tmp_path / "res"), "--format", "json"]) == ExitCode.CHECK_FAILED
    found = records(tmp_path / "res")
    assert len(found) == 4
    assert {(r["status"], r["reason"]) for r in found.values()} == {("failed", "timed out after 2 s (--run-timeout)")}
    assert all(r["duration_s"] < 30 for r in found.values())
    left = subprocess.run(["pgrep", "-f", str(program)], capture_output=True, text=True)
    assert left.stdout == "", left.stdout
