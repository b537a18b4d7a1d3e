"""``detprof stability --backend``: the same study on Keras 3 over JAX and PyTorch.

The studies run through the CLI in subprocesses, as in ``test_stability_e2e``: each backend
is picked when Keras is first imported and determinism cannot be switched off in a process,
so neither may touch pytest's. What is checked is what the issue asks of every backend:
``control`` ends bitwise identical (a fresh worker's first run against a pooled worker's
later one), ``algo`` does not, every record names its backend and what the framework
reported in effect, and a JAX or PyTorch worker never loads TensorFlow.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from detprof import cli
from detprof.backends import NAMES as BACKENDS
from detprof.errors import UsageError
from detprof.invocation import Invocation
from detprof.profiler.devices import choose_device
from detprof.stability import study, training, worker
from detprof.stability.variants import parse_variants, plan_runs
from detprof.store import ResultsStore

Capture = pytest.CaptureFixture[str]


REPORTING_CLI = """
import sys
from detprof import cli
code = cli.main(sys.argv[1:])
print("frameworks:", *(m for m in ("tensorflow", "jax", "torch") if sys.modules.get(m) is not None), file=sys.stderr)
sys.exit(code)
"""
"""``detprof ARGS`` whose last stderr line names the frameworks its own process imported."""


def detprof_reporting_frameworks(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    command = [sys.executable, "-c", REPORTING_CLI, *args]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    label, *frameworks = result.stderr.splitlines()[-1].split(" ")
    assert label == "frameworks:", result.stderr
    return result, set(frameworks)


def _records(study_dir: Path) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((study_dir / "runs").glob("*.json"))}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_control_is_bitwise_identical_on_the_backend_and_tensorflow_never_loads(tmp_path: Path, backend: str) -> None:
    out = tmp_path / "results"
    args = ["stability", "--backend", backend, "--variants", "control,algo", "--runs", "2", "--epochs", "1"]
    args += ["--jobs", "1", "--out", str(out)]
    result, parent_frameworks = detprof_reporting_frameworks(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert parent_frameworks == set()  # detprof's own process trains nothing, so it loads no framework
    assert "determinism verified: 2 runs ended with bitwise-identical weights" in result.stdout
    study_dir = out / "stability"
    records = _records(study_dir)
    assert set(records) == {"control-r000", "control-r001", "algo-r000", "algo-r001"}
    assert {r["status"] for r in records.values()} == {"ok"}
    assert records["control-r000"]["weights_sha256"] == records["control-r001"]["weights_sha256"]
    assert records["algo-r000"]["weights_sha256"] != records["algo-r001"]["weights_sha256"]
    for record in records.values():
        assert record["backend"] == backend
        assert record["determinism"]["backend"] == backend
        assert record["determinism"]["op_determinism"] is (record["mode"] == "deterministic")
        assert record["train_step"] == f"keras train_on_batch (jit_compile={backend == 'jax'})"
        assert record["software"][backend]  # the backend's version, as the worker reported it
        assert "tensorflow" not in record["software"]  # read from the worker's sys.modules after its run
    summary = json.loads((study_dir / "summary.json").read_text())
    assert (summary["backend"], summary["backend_device"]) == (backend, "cpu")
    assert set(pd.read_parquet(study_dir / summary["tables"]["runs"])["backend"]) == {backend}
    assert json.loads((study_dir / "manifest.json").read_text())["config"]["backend"] == backend
    # One worker trained control-r000 first, then algo-r000, then control-r001 on the same compiled model:
    # the equal digests above say its reset gives what a fresh worker's first run gets, bit for bit.
    assert len({r["pid"] for r in records.values()}) == 1


def test_an_unknown_backend_is_one_line_and_exit_2(tmp_path: Path, capsys: Capture) -> None:
    code = cli.main(["stability", "--backend", "nonsense", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err == "detprof: error: unknown backend 'nonsense'; choose one of tensorflow, jax, torch\n"
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_a_backend_that_is_not_installed_names_its_extra(
    tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name == backend else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    code = cli.main(["stability", "--backend", backend, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert f"--backend {backend} needs {backend}, not installed here: pip install 'detprof[{backend}]'" in err
    assert not any(tmp_path.iterdir())


def test_resuming_with_another_backend_is_refused_before_any_worker_starts(tmp_path: Path) -> None:
    device = choose_device(None)
    ResultsStore(tmp_path, "stability").open(
        {**study.StudyConfig().manifest(), "device": device.label}, "detprof stability", resume=False
    )
    with pytest.raises(UsageError, match="different configuration"):
        given = Invocation("detprof stability", resume=True)
        study.run_study(study.StudyConfig(backend="jax"), tmp_path, given, study.Workers(device, jobs=1))
    assert not (tmp_path / "stability" / "runs").exists()


def test_the_manifest_names_every_backend_but_tensorflow_whose_studies_still_resume() -> None:
    assert "backend" not in study.StudyConfig().manifest()
    assert {study.StudyConfig(backend=b).manifest().get("backend") for b in BACKENDS} == {None, "jax", "torch"}


@pytest.mark.parametrize(("backend", "jit_compile"), [("tensorflow", False), ("jax", True), ("torch", False)])
def test_the_step_is_compiled_the_same_way_in_both_modes(tmp_path: Path, backend: str, jit_compile: bool) -> None:
    config = training.TrainConfig("smallcnn", "digits", 1, 128, 4e-4, False, str(tmp_path), backend)
    assert config.jit_compile is jit_compile
    for mode in ("default", "deterministic"):
        assert config.settings(mode).backend == backend
        assert config.settings(mode).jit_compile is jit_compile


def _execute_raising(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: Exception) -> dict[str, Any]:
    def train(*_: object) -> dict[str, Any]:
        raise error

    monkeypatch.setattr(training, "train", train)
    run = plan_runs(parse_variants("algo"), 2)[0]
    return dict(worker.execute(run, training.TrainConfig("smallcnn", "digits", 1, 128, 4e-4, False, str(tmp_path))))


def test_jax_out_of_memory_is_recorded_as_such(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import jax

    error = jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00GiB")
    record = _execute_raising(monkeypatch, tmp_path, error)
    assert record["reason"] == f"out of memory: JaxRuntimeError: {error}"
    other = _execute_raising(monkeypatch, tmp_path, jax.errors.JaxRuntimeError("INTERNAL: something else"))
    assert other["reason"] == "JaxRuntimeError: INTERNAL: something else"


def test_torch_out_of_memory_is_recorded_as_such(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import torch

    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    record = _execute_raising(monkeypatch, tmp_path, error)
    assert record["reason"] == "out of memory: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
