"""``detprof verify``: whether determinism holds, on real frameworks on this CPU, and where runs part ways.

The comparison is shown first on fingerprints written in the real format with chosen tensors
(a difference planted at a known step and layer); then real runs: the registry's models (the
smallest of each family) in deterministic mode, twice in two processes, bitwise identical on
each backend; a layer that is nondeterministic on purpose, named by the command at exactly that
layer and step; and a PyTorch op that refuses deterministic mode on this CPU, a finding rather
than a crash.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from script_runner import run_script

from detprof import backends
from detprof.analysis.verification import compare
from detprof.cli import main
from detprof.errors import ExitCode
from detprof.findings import finding_of
from detprof.fingerprints import SAMPLE_SIZE, RunFingerprints, digest, fingerprint, sample_positions
from detprof.models import registry
from detprof.profiler.measured_runs import results_dir_of
from detprof.reports.command import render_report
from detprof.store import ResultsStore, find_studies

PLANTED = '''
import numpy as np
import keras


class Jitter(keras.layers.Layer):
    """Adds noise from a source detprof does not seed: the operating system's entropy."""

    def call(self, x):
        noise = np.random.default_rng().standard_normal(x.shape[1:]).astype("float32") * 1e-3
        return x + keras.ops.convert_to_tensor(noise)


def planted(input_shape, classes):
    inputs = keras.Input(input_shape)
    x = keras.layers.Conv2D(4, 3, padding="same", name="conv_a")(inputs)
    x = keras.layers.ReLU(name="relu_a")(x)
    x = Jitter(name="jitter")(x)
    x = keras.layers.Conv2D(4, 3, padding="same", name="conv_b")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    return keras.Model(inputs, keras.layers.Dense(classes, name="logits")(x))
'''
NATIVE_PLANTED = '''
import numpy as np
import torch
from torch import nn


class Jitter(nn.Module):
    """The Keras planted layer as a PyTorch module of a user's own: noise from the operating system's entropy."""

    def forward(self, x):
        return x + torch.from_numpy(np.random.default_rng().standard_normal(x.shape[1:]).astype("float32") * 1e-3)


class Planted(nn.Module):
    def __init__(self, channels, classes):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, 4, 3, padding=1), nn.ReLU(), Jitter(), nn.Conv2d(4, 4, 3, padding=1)
        )
        self.logits = nn.Linear(4, classes)

    def forward(self, x):
        return self.logits(self.features(x).mean(dim=(2, 3)))


def planted(input_shape, classes):
    return Planted(input_shape[0], classes)
'''
PLANTED_CASES = {"keras": (PLANTED, "8x8x1", "jitter"), "native": (NATIVE_PLANTED, "1x8x8", "features.2")}
"""The planted layer in a Keras model on PyTorch, and in a native PyTorch module, where it goes by its path."""


def run(steps: list[dict[str, np.ndarray]]) -> RunFingerprints:
    """A run's fingerprints from chosen tensors: per step, each layer's output."""
    fingerprints = RunFingerprints()
    for step in steps:
        fingerprints.begin_step()
        for name, value in step.items():
            fingerprints.add(name, "output", [value])
    return fingerprints


def test_a_fingerprint_is_a_digest_its_sizes_and_a_sample_at_fixed_positions() -> None:
    value = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    found, sample = fingerprint("dense", "weights", [value])
    assert found.digest == digest([value]) and found.shape == (2, 3)
    assert found.max_abs == 3.0 and found.l2 == pytest.approx(np.sqrt(np.sum(value.astype(np.float64) ** 2)))
    assert np.array_equal(sample, value.ravel())
    big = sample_positions(10 * SAMPLE_SIZE)
    assert len(big) == SAMPLE_SIZE and np.array_equal(big, sample_positions(10 * SAMPLE_SIZE))


def test_runs_part_at_the_first_tensor_that_differs_and_the_growth_is_read_per_layer(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    steps = [{"conv": rng.normal(size=(4, 4)), "relu": rng.normal(size=(4, 4))} for _ in range(3)]
    parted = [dict(step) for step in steps]
    parted[1] = {"conv": steps[1]["conv"], "relu": steps[1]["relu"] + 0.5}
    parted[2] = {"conv": steps[2]["conv"] + 0.25, "relu": steps[2]["relu"] + 1.0}
    run(steps).save(tmp_path / "a")
    run(parted).save(tmp_path / "b")
    a, b = RunFingerprints.load(tmp_path / "a"), RunFingerprints.load(tmp_path / "b")
    assert compare("default", a, a).identical is True
    result = compare("default", a, b)
    assert result.identical is False and result.steps == 3 and result.layers == 2
    first = result.first_difference
    assert first is not None and (first.step, first.layer, first.kind) == (1, "relu", "output")
    assert first.max_abs == pytest.approx(0.5) and first.exact
    assert result.growth == {"conv": [0.0, 0.0, pytest.approx(0.25)], "relu": [0.0, pytest.approx(0.5), 1.0]}


@pytest.mark.slow
def test_a_refusal_is_a_finding_naming_the_op_the_layer_and_the_advice() -> None:
    """PyTorch's own refusal, raised in a fresh process where deterministic algorithms are on."""
    script = (
        "import torch\n"
        "torch.use_deterministic_algorithms(True)\n"
        "out, idx = torch.nn.functional.max_pool2d(torch.randn(1, 1, 4, 4), 2, return_indices=True)\n"
        "try:\n"
        "    torch.nn.functional.max_unpool2d(out, idx, 2)\n"
        "except RuntimeError as exc:\n"
        "    print(exc)\n"
    )
    message = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    found = finding_of(RuntimeError(message.strip()), backends.TORCH)
    assert found.op is not None and found.op.startswith("max_unpool")
    assert found.layer is None and "warn_only=True" in found.advice
    assert found.message.startswith("RuntimeError: max_unpool") and "deterministic implementation" in found.message


SMALLEST_INPUT = {"inceptionv3": 75, "inceptionresnetv2": 75, "xception": 71}
"""Registry models whose stem needs a larger input than 32x32."""
TRANSFORMERS = ("moe_tiny", "vit_tiny")
"""Attention (causal and not), layer norm, GELU, the embedding (whose gradient is a scatter-add), a mixture of
experts' scatter-add dispatch and segment-sum combine, and a vision transformer's patches and class token: the
GPT's layers are the mixture of experts' (its experts are GELU MLPs)."""
LAYER_KINDS = ("smallcnn_bn", "resnet18", "resnet50", "mobilenet", "xception", *TRANSFORMERS)
"""One registry model per kind of layer it adds: detprof's small CNN with batch norm (plain convolutions,
pooling, dense layers, batch norm), its ResNet18 (residual blocks; the medium CNN's and the plain small CNN's
layers are among these), then Keras applications: bottleneck residual blocks, depthwise convolutions and separable
convolutions; and the transformers (``TRANSFORMERS``), whose layer norm and GELU are ConvNeXt's (its other layers
are depthwise convolutions, dense layers and a scale: ConvNeXt-Tiny, 38% of the set's time, adds no kind of its
own). Every model is more than ``make test`` can carry (here TensorFlow took 8 min for all 47, JAX 7 min for 22 of
them: it compiles each step for up to 40 s):
``DETPROF_VERIFY_EVERY_MODEL=1 pytest -o timeout=0 -m slow -k layer_kind tests/test_verify.py`` runs them all."""
BESIDE_TENSORFLOW = ("smallcnn_bn", "resnet18", "mobilenet", "moe_tiny")
"""On JAX and PyTorch, ``make test`` verifies the models whose layers the others repeat: detprof's small CNN with
batch norm (plain convolutions, pooling, dense), its ResNet18 (residual blocks; the medium CNN's layers),
MobileNet (depthwise convolutions) and the mixture of experts (attention, layer norm, GELU, the embedding, the
experts' scatter-add and segment sum). JAX compiles each step of the larger applications for tens of seconds
(137 s for the set): the whole set runs on TensorFlow, and on every backend with ``DETPROF_VERIFY_EVERY_MODEL=1``."""
UNAVAILABLE = {
    (backends.TORCH, "nasnetmobile"): "failed: ValueError: NASNetMobile is not available with the torch backend",
    (backends.TORCH, "nasnetlarge"): "failed: ValueError: NASNetLarge is not available with the torch backend",
}
"""Models Keras itself refuses to build on a backend: each must fail with Keras' own line, not be compared."""


def registry_models_to_verify(backend: str) -> list[str]:
    if os.environ.get("DETPROF_VERIFY_EVERY_MODEL") == "1":
        return list(registry.all_models())
    return list(LAYER_KINDS) if backend == backends.TENSORFLOW else list(BESIDE_TENSORFLOW)


@pytest.mark.slow
@pytest.mark.parametrize("backend", [backends.TENSORFLOW, backends.JAX, backends.TORCH])
def test_a_model_of_each_layer_kind_is_bitwise_identical_in_deterministic_mode(backend: str, tmp_path: Path) -> None:
    """Two processes (two replicas) side by side, each training the models two steps at a small size: one registry
    model per kind of layer (``LAYER_KINDS``, ``BESIDE_TENSORFLOW``), every model with
    ``DETPROF_VERIFY_EVERY_MODEL=1``. Each replica compiles its steps itself: given a persistent compilation cache
    of their own, set to save every compilation, the replicas leave it empty, so neither loaded a step the other
    compiled, and the two could differ in what compiling chose (on JAX a replica's compilations are most of its
    100 s of CPU time here: side by side, the test ends within its timeout beside the suite's other worker).

    A replica's runs of several models share one process (``workload.fingerprint_runs``), each starting from the
    seeds and session a fresh process starts from: the second replica takes the models in the reverse order, so
    each model is compared with itself after other models than before (the first replica's first model and the
    second's with themselves in a process of their own), and anything a run left behind would part them."""
    names = registry_models_to_verify(backend)
    models = [f"{name}:{SMALLEST_INPUT.get(name, 32)}" for name in names]
    cache = tmp_path / "jax-compilation-cache"
    cache.mkdir()
    env = {"JAX_COMPILATION_CACHE_DIR": str(cache)}  # the suite's settings (conftest) kept: it saves every compilation
    replica = partial(run_script, "verify_models.py", backend, env=env)
    orders = {"a": models, "b": models[::-1]}
    with ThreadPoolExecutor(2) as pool:
        done = dict(zip(orders, pool.map(lambda name: replica(tmp_path / name, *orders[name]), orders), strict=True))
    assert list(cache.iterdir()) == []
    for side, ran in done.items():
        assert ran.returncode == 0, ran.stderr[-2000:]
        statuses = json.loads(ran.stdout.splitlines()[-1])
        assert list(statuses) == (names if side == "a" else names[::-1])
        for name, status in statuses.items():
            assert status.startswith(UNAVAILABLE.get((backend, name), "ok")), f"{name} on {backend}: {status}"
    for name in (name for name in names if (backend, name) not in UNAVAILABLE):
        a, b = (RunFingerprints.load(tmp_path / replica / name) for replica in "ab")
        result = compare("deterministic", a, b)
        assert result.identical, f"{name} on {backend}: parted at {result.first_difference}"
        assert result.steps == 2 and result.layers > 0


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(PLANTED_CASES))
def test_the_planted_layer_is_named_at_the_step_it_parts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    source, shape, jitter = PLANTED_CASES[kind]
    (tmp_path / "nets.py").write_text(source)
    spec = f"{tmp_path / 'nets.py'}:planted"
    args = ["verify", "--models", spec, "--backend", backends.TORCH, "--steps", "3", "--input-shape", shape]
    code = main([*args, "--format", "json", "--out", str(tmp_path / "out")])
    doc = json.loads(capsys.readouterr().out)
    assert code == ExitCode.CHECK_FAILED
    (model,) = doc["models"]
    assert model["model"] == "planted" and model["backend"] == backends.TORCH and model["device"] == "cpu"
    for mode in ("deterministic", "default"):
        first = model[mode]["first_difference"]
        assert model[mode]["identical"] is False
        assert (first["step"], first["layer"], first["kind"]) == (0, jitter, "output") and first["max_abs"] > 0
    assert model["findings"] == []
    page, text = render_report([tmp_path / "out"], "html", "cdn"), render_report([tmp_path / "out"], "md")
    assert "NOT held" in page and f"parts at step 0 in {jitter}&#39;s output" in page
    assert "Default mode, planted on cpu (torch)" in page
    assert f"NOT held (parts at step 0 in {jitter}'s output)" in text
    part = "layer" if kind == "keras" else "module"  # each kind's parts as its users call them
    assert f"Deterministic mode: the runs part at step 0, {part} {jitter} (output)" in text
    (read,) = json.loads(render_report([tmp_path / "out"], "json"))["verification"]
    assert (read["held"], read["device_label"], read["backend"]) == (False, "cpu", backends.TORCH)
    assert read["deterministic"]["first_difference"] == model["deterministic"]["first_difference"]


def test_a_model_run_past_the_run_timeout_is_ended_and_recorded_as_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Half a second is shorter than any worker takes to import its framework: every run is ended and recorded as
    failed with the timeout for its reason, and the command says the check failed."""
    out = tmp_path / "res"
    args = ["verify", "--models", "smallcnn", "--gpu", "cpu", "--run-timeout", "0.5", "--out", str(out)]
    assert main(args) == ExitCode.CHECK_FAILED
    found = list(ResultsStore(out, "verify").records())
    assert len(found) == 4
    assert {(r["status"], r["reason"]) for r in found} == {("failed", "timed out after 0.5 s (--run-timeout)")}
    # Each mode's line says why its own runs failed, once where they failed alike.
    said = [line for line in capsys.readouterr().out.splitlines() if "failed" in line]
    assert said == [
        "smallcnn on cpu (tensorflow): deterministic mode could not be verified: both runs failed: timed out after "
        "0.5 s (--run-timeout)",
        "  default mode: not compared: both runs failed: timed out after 0.5 s (--run-timeout)",
    ], said


def test_a_run_crowded_out_of_the_gpus_memory_by_the_other_replica_runs_again_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU, PyTorch's deterministic replicas run side by side, told to grow their memory; one that runs out of
    device memory beside the other runs again with the device to its replica alone, its record replaced, as a model
    that fits the GPU once must still be verified. Default mode's replicas run one at a time. (The fakes, at the GPU
    boundary: an H100 chosen as the device, and ``crowded_workload``, which fails the later of two workers sharing
    it as out of memory.)"""
    from dataclasses import replace

    import crowded_workload
    from rich.console import Console

    from detprof.options import RunOptions
    from detprof.profiler.devices import DeviceChoice, GpuInfo
    from detprof.profiler.sweep_request import SweepRequest
    from detprof.verify import run

    crowd = tmp_path / "crowd"
    crowd.mkdir()
    monkeypatch.setenv(crowded_workload.CROWDED_DIR, str(crowd))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setattr(run, "WORKLOAD", "crowded_workload:runs")
    config, target = SweepRequest(("smallcnn",), RunOptions(backend="torch", gpu="cpu", tracer="none")).resolve()
    h100 = DeviceChoice("h100", GpuInfo(0, "NVIDIA H100 80GB HBM3", "GPU-00000000-1111-2222-3333-444444444444"))
    store = ResultsStore(tmp_path / "out", "verify")
    store.open({"models": ["smallcnn"]}, "detprof verify", resume=False)
    run.run_arms(
        store, config, replace(target, device=h100), list(run.MODE_ARMS), 1, False, console=Console(quiet=True)
    )
    records = {r["run_id"].removeprefix("smallcnn--"): r for r in store.records()}
    assert {r["status"] for r in records.values()} == {"ok"}
    assert len(list(crowd.iterdir())) == 2  # only the two deterministic workers shared the GPU
    # The replica whose worker started second was crowded out and ran again alone, whichever it was.
    assert sorted([records["deterministic--a"]["side_by_side"], records["deterministic--b"]["side_by_side"]]) == [
        False,
        True,
    ]
    assert not records["default--a"]["side_by_side"] and not records["default--b"]["side_by_side"]


def test_a_second_verify_of_other_models_the_same_day_keeps_a_folder_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without ``--out``, one model after another: each configuration is kept, ``--resume`` finds its folder again,
    and the report of the day's folder reads both. Every run is ended at once (``--run-timeout``): where the runs
    go is what is checked, not what they compare."""
    monkeypatch.chdir(tmp_path)
    quick = ["--gpu", "cpu", "--run-timeout", "0.5"]
    assert main(["verify", "--models", "smallcnn", *quick]) == ExitCode.CHECK_FAILED
    assert main(["verify", "--models", "gpt_tiny", *quick]) == ExitCode.CHECK_FAILED
    assert main(["verify", "--models", "gpt_tiny", "--resume", *quick]) == ExitCode.CHECK_FAILED
    day = results_dir_of("cpu", backends.DEFAULT)
    studies = {s.root.relative_to(day): {r["model"] for r in s.records()} for s in find_studies(day)}
    assert studies == {Path("."): {"smallcnn"}, Path("gpt_tiny"): {"gpt_tiny"}}
    read = json.loads(render_report([day], "json"))["verification"]
    assert sorted(v["model"] for v in read) == ["gpt_tiny", "smallcnn"]
    capsys.readouterr()
    assert main(["verify", "--models", "gpt_tiny", *quick, "--out", str(day)]) == ExitCode.USAGE
    assert "already holds a verify of a different configuration: choose another --out" in capsys.readouterr().err


TOKENS = """
import keras


def tokens():
    inputs = keras.Input(shape=(12,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(50, 8)(inputs)
    x = keras.layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, keras.layers.Dense(5)(x))
"""


@pytest.mark.slow
def test_a_model_that_takes_tokens_is_verified_on_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Synthetic images cannot feed integer tokens: without ``--data`` one line says what it needs; with it the
    runs train on its rows and the verification holds, its manifest naming the data (a resume must match it)."""
    (tmp_path / "nets.py").write_text(TOKENS)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "tokens.npz", x_train=rng.integers(0, 50, (16, 12)), y_train=rng.integers(0, 5, 16))
    args = ["verify", "--models", f"{tmp_path / 'nets.py'}:tokens", "--steps", "2", "--batch-size", "8"]
    out = ["--out", str(tmp_path / "out")]
    assert main([*args, *out]) == ExitCode.USAGE
    assert "tokens's input tokens takes int32 values, not images: pass --data npz:PATH" in capsys.readouterr().err
    assert main([*args, "--data", f"npz:{tmp_path / 'tokens.npz'}", "--format", "json", *out]) == ExitCode.OK
    (model,) = json.loads(capsys.readouterr().out)["models"]
    assert model["model"] == "tokens" and model["held"] is True and model["deterministic"]["identical"] is True
    runs = list(ResultsStore(tmp_path / "out", "verify").records())
    assert len(runs) == 4 and all(r["status"] == "ok" and r["steps"] == 2 for r in runs)
    assert ResultsStore(tmp_path / "out", "verify").manifest()["config"]["data"] == f"npz:{tmp_path / 'tokens.npz'}"
    # Training in another precision is another verification: not resumed into this one.
    assert main([*args, "--data", f"npz:{tmp_path / 'tokens.npz'}", "--amp", "bf16", "--resume", *out]) == 2
    assert "it holds a verify of a different configuration" in capsys.readouterr().err


def test_the_models_help_names_the_cpu_presets_models() -> None:
    """``--models`` left out: the preset's models, as the option's help says (kept in step with the preset)."""
    from typing import get_args

    from detprof.options import ModelsOption
    from detprof.profiler.presets import PRESETS

    (declared,) = [a for a in get_args(ModelsOption) if hasattr(a, "help")]
    assert f"(cpu-small: {', '.join(PRESETS['cpu-small']['models'])})" in declared.help
