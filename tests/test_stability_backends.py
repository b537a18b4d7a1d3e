"""``detprof stability --backend``: what picks and records the backend, without training a model.

Studies that train on JAX and on PyTorch live where they train anyway: ``test_own_model_forms``
(a user's saved model on JAX, a factory's on PyTorch: ``control`` bitwise identical, ``algo``
not, every record naming its backend and what the framework reported, neither process loading
TensorFlow) and, for the registry's smallcnn, ``test_gpu_study``'s tiny study (``control``
verified on both) and ``test_install`` (PyTorch alone installed). A study of its own here
would repeat them at some ten CPU seconds a backend.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

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
