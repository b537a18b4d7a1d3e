"""``detprof baseline`` and ``detprof check`` across Keras backends: a baseline is of one backend.

The fingerprint holds the backend and its framework's versions; a check against results of
another backend is refused in one line (exit 3, as for any fingerprint that differs, but
``--allow-env-change`` does not lift it); results holding sweeps of several backends cannot
be a baseline; ``check --run`` runs the baseline's backend. Baselines and records written
before there was a choice read as TensorFlow's and stay comparable with new TensorFlow sweeps.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import synthetic_sweep as synth
from test_check_cli import Capture, make_sweep, run_cli

from detprof.check.baseline_file import ADDED_LATER, fingerprint, measurement_config_hash
from detprof.profiler.sweep_request import SweepRequest
from detprof.store import ResultsStore
from detprof.sweep.run import SweepOutcome

MEDIANS = {"resnet50": 1.5, "vgg16": 1.2}


def sweep_on(root: Path, backend: str | None, seed: int = 1) -> Path:
    """A sweep on ``backend``; None: TensorFlow's, as detprof wrote it before records had a backend."""
    cfg = synth.config(list(MEDIANS), 5, backend)
    return make_sweep(root, MEDIANS, seed=seed, config=cfg, backend=backend)


def baseline_of(tmp_path: Path, capsys: Capture, results: Path) -> Path:
    path = tmp_path / f"{results.name}-baseline.json"
    code, _, err = run_cli(capsys, "baseline", results, "-o", path)
    assert code == 0, err
    return path


def test_the_fingerprint_holds_the_backend_and_its_framework_versions(tmp_path: Path, capsys: Capture) -> None:
    results = sweep_on(tmp_path / "torch", "torch")
    code, out, _ = run_cli(capsys, "baseline", results, "-o", tmp_path / "b.json")
    assert code == 0 and "backend torch (PyTorch 2.6.0)" in out
    fp = json.loads((tmp_path / "b.json").read_text())["fingerprint"]
    assert (fp["backend"], fp["torch"], fp["cuda"], fp["cudnn"], fp["keras"]) == (
        "torch",
        "2.6.0",
        "12.4",
        90100,
        "3.15.0",
    )
    assert fp["tensorflow"] is None and fp["jax"] is None
    assert fp["determinism"]["deterministic"]["cublas_workspace_config"] == ":4096:8"
    assert "backend" not in fp["determinism"]["default"]
    jax = fingerprint(synth.config(["a"], 3, "jax"), synth.records({"a": [1.1, 1.2, 1.1]}, backend="jax"))
    assert (jax["backend"], jax["jax"], jax["jaxlib"], jax["tensorflow"]) == ("jax", "0.4.38", "0.4.38", None)


@pytest.mark.parametrize("allow", [False, True])
def test_a_baseline_of_another_backend_is_refused_in_one_line(tmp_path: Path, capsys: Capture, allow: bool) -> None:
    base = baseline_of(tmp_path, capsys, sweep_on(tmp_path / "torch", "torch"))
    current = sweep_on(tmp_path / "tf", "tensorflow")
    extra = ["--allow-env-change"] if allow else []
    code, out, err = run_cli(capsys, "check", "--baseline", base, "--current", current, *extra)
    assert code == 3 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{current} ran on the tensorflow backend, the baseline {base} on torch" in err
    assert "never comparable" in err


def test_older_records_and_baselines_read_as_tensorflow(tmp_path: Path, capsys: Capture) -> None:
    """A baseline from before there was a choice (no backend fields) checks new TensorFlow results, not torch's."""
    base = baseline_of(tmp_path, capsys, sweep_on(tmp_path / "old", None))
    doc = json.loads(base.read_text())
    assert doc["fingerprint"]["backend"] == "tensorflow"
    for key in ADDED_LATER:
        del doc["fingerprint"][key]
    base.write_text(json.dumps(doc))
    code, out, err = run_cli(capsys, "check", "--baseline", base, "--current", sweep_on(tmp_path / "new", "tensorflow"))
    assert code == 0, err
    assert "same fingerprint as the baseline" in out
    code, _, err = run_cli(capsys, "check", "--baseline", base, "--current", sweep_on(tmp_path / "torch", "torch"))
    assert code == 3 and "the baseline" in err and "on tensorflow" in err


def test_the_options_added_with_backends_hash_only_when_they_differ_from_before() -> None:
    old = synth.config(["a"], 3)
    assert measurement_config_hash(old) == measurement_config_hash(synth.config(["a"], 3, "tensorflow"))
    assert measurement_config_hash(old) != measurement_config_hash({**old, "compile": True})


def test_results_of_several_backends_cannot_be_a_baseline(tmp_path: Path, capsys: Capture) -> None:
    sweep_on(tmp_path / "both" / "tf", "tensorflow")
    sweep_on(tmp_path / "both" / "torch", "torch")
    code, out, err = run_cli(capsys, "baseline", tmp_path / "both", "-o", tmp_path / "b.json")
    assert code == 3 and out == "" and err.count("\n") == 1
    assert "holds sweeps of several Keras backends (tensorflow, torch)" in err and "(torch)" in err
    assert not (tmp_path / "b.json").exists()


def test_check_run_runs_the_baselines_backend(tmp_path: Path, capsys: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    base = baseline_of(tmp_path, capsys, sweep_on(tmp_path / "torch", "torch"))
    asked: list[SweepRequest] = []

    def measure_sweep(request: SweepRequest, **_: Any) -> SweepOutcome:
        asked.append(request)
        out = sweep_on(tmp_path / "rerun", "torch", seed=1)
        return SweepOutcome(out, "sweep", {"t4": ResultsStore(out, "sweep")})

    monkeypatch.setattr("detprof.sweep.run.measure_sweep", measure_sweep)
    code, _, err = run_cli(capsys, "check", "--baseline", base, "--run", "--out", tmp_path / "rerun")
    assert code == 0, err
    options: Any = asked[0].options
    assert (options.backend, options.compile, options.batch_size, options.gpu) == ("torch", False, 64, "t4")

    asked.clear()
    code, _, err = run_cli(capsys, "check", "--baseline", base, "--run", "--backend", "jax")
    assert code == 3 and asked == [] and err.count("\n") == 1
    assert "--backend jax: the baseline" in err and "ran on torch" in err
    # What measuring would only refuse afterwards is refused first: nothing measured, one line, exit 2.
    refused = [
        (["--backend", "nosuch"], "unknown backend 'nosuch'; choose one of"),
        (["--repeats", "1"], "--repeats 1: a check compares intervals, which take at least 2 repeats"),
        (["--models", "mobilenet,SmallCNN_BN"], "--models: none of mobilenet, SmallCNN_BN is in the baseline"),
        (["--out", tmp_path / "rerun"], f"{tmp_path / 'rerun' / 'sweep'} already holds results: check --run measures"),
    ]
    for args, says in refused:
        code, _, err = run_cli(capsys, "check", "--baseline", base, "--run", *args)
        assert code == 2 and asked == [] and err.count("\n") == 1 and says in err, err


def test_compile_applies_only_with_run(tmp_path: Path, capsys: Capture) -> None:
    base = baseline_of(tmp_path, capsys, sweep_on(tmp_path / "tf", None))
    code, _, err = run_cli(capsys, "check", "--baseline", base, "--current", tmp_path / "tf", "--compile")
    assert code == 2 and "--compile only apply with --run" in err
