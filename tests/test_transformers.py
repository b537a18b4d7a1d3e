"""The transformers in the zoo (``detprof.models.transformers``): built with their blocks in their layers' names,
trained with their own added losses, swept on every backend at the tiny size, and trained on the built-in
Markov language by a stability study that must learn it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from attribution_share import typical_unattributed_share

from detprof.backends.base import STEP_PARTS
from detprof.models import registry
from detprof.reports.command import render_report
from detprof.stability import datasets
from detprof.store import ResultsStore

ROOT = Path(__file__).resolve().parents[1]
TINY = ("gpt_tiny", "moe_tiny", "vit_tiny")


@pytest.mark.slow  # builds Keras models
def test_each_transformer_names_its_layers_by_block_and_takes_its_inputs() -> None:
    import keras

    for name in TINY:
        model = registry.build(name)
        blocks = [layer.name for layer in model.layers]
        assert len(blocks) == len(set(blocks)), name
        assert {"block0_attn", "block1_attn", "block0_norm1", "block1_norm2"} <= set(blocks), blocks
        assert [sub.name for sub in model.get_layer("block1_attn")._flatten_layers(include_self=False)] == [
            "qkv",
            "out",
        ]
        assert ("block1_moe" in blocks) == (name == "moe_tiny")
        assert ("block1_mlp_in" in blocks) == (name != "moe_tiny"), blocks
    gpt = registry.build("gpt_tiny")
    assert (gpt.inputs[0].dtype, tuple(gpt.inputs[0].shape), tuple(gpt.outputs[0].shape)) == (
        "int32",
        (None, 16),
        (None, 16, 64),
    )
    assert tuple(registry.build("vit_tiny").outputs[0].shape) == (None, 10)
    assert registry.get("gpt_small").shape_at(128) == (128,) and registry.get("vit_small").shape_at(64) == (64, 64, 3)
    assert registry.get("moe_small").takes == "tokens" and registry.get("vit_small").takes == "images"
    assert isinstance(registry.build("vit_tiny", (48, 48, 3), 7), keras.Model)


@pytest.mark.slow  # builds and runs a Keras model
def test_the_mixture_of_experts_trains_with_its_load_balancing_loss() -> None:
    """Each block's Switch balancing loss is an added loss, which the compiled loss includes: dropping it would
    train (and time) a different model without a word."""
    import keras
    import numpy as np

    model = registry.build("moe_tiny")
    tokens = np.random.default_rng(0).integers(0, 64, (8, 16)).astype("int32")
    cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer="sgd", loss=cross_entropy)
    predicted = model(tokens, training=True)
    balancing = [float(loss) for loss in model.losses]
    assert len(balancing) == 2 and all(0.005 < loss < 0.1 for loss in balancing), balancing
    total = float(model.compute_loss(x=tokens, y=tokens, y_pred=predicted))
    assert total == pytest.approx(float(cross_entropy(tokens, predicted)) + sum(balancing), rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_the_tiny_transformers_sweep_with_their_blocks_on_the_leaderboard(tmp_path: Path, backend: str) -> None:
    out = tmp_path / "out"
    sweep = [sys.executable, "-m", "detprof.cli", "sweep", "--backend", backend, "--models", ",".join(TINY)]
    sweep += ["--steps", "3", "--warmup", "1", "--repeats", "1", "--precision", "off", "--no-report", "--out", str(out)]
    done = subprocess.run(sweep, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    records = list(ResultsStore(out, "sweep").records())
    assert {r["model"] for r in records} == set(TINY)
    for record in records:
        assert record["status"] == "ok", record.get("reason")
        assert record["settings"]["op_determinism"] == (record["mode"] == "deterministic"), record["run_id"]
    models = json.loads(render_report([out], "json"))["models"]
    for model in models:
        layers = {layer["name"] for layer in model["layers"]}
        assert {"block0_attn/qkv", "block1_attn/out", "block0_norm1", "block1_norm2"} <= layers, sorted(layers)
        assert ("block1_moe/router" in layers) == (model["model"] == "moe_tiny"), sorted(layers)
        # Most of the step is the model's layers and the step's other parts: what none claims is under 5% of a
        # typical step on every backend (on a quiet machine under 0.3% on TensorFlow and JAX; on PyTorch 1.1-2.7%, the
        # functional model's own ops between its layers and the backward pass's seed, each gradient's accumulation
        # into its variable going to the variable's layer).
        share = typical_unattributed_share(out, model["model"])
        assert share < 0.05, (model["model"], share, model["unattributed_share"])
        parts = {layer["name"]: layer for layer in model["layers"] if layer["name"] in STEP_PARTS}
        assert set(parts) == set(STEP_PARTS), sorted(layers)
        assert all(part["default_ms"] > 0 and part["deterministic_ms"] > 0 for part in parts.values()), parts


@pytest.mark.slow  # builds Keras models
def test_a_transformer_trains_in_bfloat16_mixed_precision_on_a_gpu_and_a_cnn_stays_in_float32(monkeypatch) -> None:
    """The device is faked at its one boundary, the backend's ``device_name``: where Keras trains on a GPU, the
    transformers are built in ``mixed_bfloat16`` (their users' dtype there, where the fused attention kernels run)
    and the CNNs in float32; on a CPU every model is float32, unless ``--amp bf16`` builds each in
    ``mixed_bfloat16`` on any device; the global policy is left as it was."""
    import keras

    from detprof import backends
    from detprof.profiler.workloads import training_of

    backend = backends.get(keras.config.backend())

    def policy(model: str, **amp: str) -> str:
        return training_of({"model": model, "input_shape": None, "classes": None, **amp}).model.dtype_policy.name

    assert (policy("gpt_tiny"), policy("smallcnn")) == ("float32", "float32")
    assert (policy("gpt_tiny", amp="bf16"), policy("smallcnn", amp="bf16")) == ("mixed_bfloat16",) * 2
    assert policy("smallcnn", amp="fp16") == "mixed_float16"
    scaled = training_of({"model": "smallcnn", "input_shape": None, "classes": None, "amp": "fp16"}).optimizer
    assert isinstance(scaled, keras.optimizers.LossScaleOptimizer)
    assert keras.config.dtype_policy().name == "float32"
    monkeypatch.setattr(type(backend), "device_name", lambda self: "NVIDIA H100 80GB HBM3")
    assert (policy("gpt_tiny"), policy("moe_tiny"), policy("vit_tiny")) == ("mixed_bfloat16",) * 3
    assert policy("smallcnn") == "float32" and keras.config.dtype_policy().name == "float32"
    model = training_of({"model": "moe_tiny", "input_shape": None, "classes": None}).model
    for layer in (model.get_layer("block0_attn").qkv, model.get_layer("block1_moe").router):
        assert (layer.compute_dtype, layer.variable_dtype) == ("bfloat16", "float32"), layer.name


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "model", "options"),
    [
        ("jax", "gpt_tiny", {"--jobs": 2, "--epochs": 3, "--lr": 0.01}),
        ("torch", "moe_tiny", {"--jobs": 1, "--epochs": 2, "--lr": 0.01}),
    ],
)
def test_a_model_of_tokens_learns_the_markov_language_and_control_is_bitwise_identical(
    tmp_path: Path, backend: str, model: str, options: dict[str, float]
) -> None:
    """Each study learns the language in a few epochs at a larger learning rate: on JAX the GPT in three (2.79 nats
    against 2.35 and 4.08, as much as the default study's twenty epochs learn, in a fifth of its time), its two runs
    in two workers that each compiled the step themselves (JAX's persistent compilation cache off in both, the
    suite's beside them), so that their bitwise identity covers what compiling chose; on PyTorch the mixture of
    experts in two (2.85 nats), its runs in one worker. (The default's epochs per dataset:
    ``test_stability_variants``.)"""
    out = tmp_path / "out"
    study = [sys.executable, "-m", "detprof.cli", "stability", "--model", model, "--backend", backend]
    study += ["--variants", "control", "--runs", "2", "--out", str(out)]
    study += [str(part) for option, value in options.items() for part in (option, value)]
    done = subprocess.run(study, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    workers = options["--jobs"]
    compiled = ", trained in 2 processes, each compiling its step itself" if workers == 2 else ", trained in one"
    said = " ".join(done.stdout.split())
    assert f"determinism verified: 2 runs ended with bitwise-identical weights{compiled}" in said, said
    summary = json.loads((out / "stability" / "summary.json").read_text())
    assert (summary["dataset"], summary["takes"], summary["classes"]) == ("markov", "tokens", 64)
    assert summary["config"]["epochs"] == options["--epochs"]
    (control,) = summary["variants"]
    middle = (summary["entropy_rate"] + summary["frequency_entropy"]) / 2
    assert control["cross_entropy"]["mean"] < middle and control["learned"] is True
    assert "learned the language: held-out loss" in said
    records = [json.loads(p.read_text()) for p in sorted((out / "stability" / "runs").glob("*.json"))]
    assert len({r["pid"] for r in records}) == workers
    assert [r.get("compilation_cache") for r in records] == (["off", "off"] if backend == "jax" else [None, None])
    with np.load(out / "stability" / records[0]["arrays"]) as arrays:
        assert arrays["predictions"].shape == (datasets.MARKOV_TEST * datasets.MARKOV_LENGTH,)
        assert arrays["probabilities"].shape == (datasets.MARKOV_TEST * datasets.MARKOV_LENGTH, 64)
    shown = json.loads(render_report([out], "json"))
    assert shown["stability_not_learned"] == []
