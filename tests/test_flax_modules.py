"""Flax NNX modules as models (``models.flax_modules``): looked at, trained, scoped, paired, and refused.

What a worker reports of a module and the step it trains are checked in this process; the sweep runs end to end
through the CLI, its workers real subprocesses tracing with ``jax.profiler``.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from attribution_share import typical_unattributed_share

from detprof.backends.base import LOSS_PART, OPTIMIZER_PART, TOP_LEVEL_PART
from detprof.cli import main
from detprof.errors import ExitCode, UsageError
from detprof.fingerprints import RunFingerprints
from detprof.models import kinds, own
from detprof.reports.command import render_report
from detprof.store import ResultsStore

MODULES = """
import jax.numpy as jnp
import optax
from flax import linen as nn
from flax import nnx

import detprof


class Block(nnx.Module):
    def __init__(self, channels, rngs):
        self.conv = nnx.Conv(channels, channels, (3, 3), rngs=rngs)
        self.norm = nnx.BatchNorm(channels, rngs=rngs)

    def __call__(self, x):
        return nnx.relu(self.norm(self.conv(x)))


class Net(nnx.Module):
    def __init__(self, channels, classes, rngs):
        self.stem = nnx.Conv(channels, 8, (3, 3), rngs=rngs)
        self.blocks = nnx.List([Block(8, rngs), Block(8, rngs)])
        self.head = nnx.Linear(8, classes, rngs=rngs)

    def __call__(self, x):
        x = nnx.max_pool(self.stem(x), (2, 2), (2, 2))
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(axis=(1, 2)))


def net(input_shape, classes):
    return Net(input_shape[-1], classes, nnx.Rngs(0))


def smooth(logits, labels):
    return optax.softmax_cross_entropy(logits, optax.smooth_labels(nnx.one_hot(labels, logits.shape[-1]), 0.1)).mean()


def trained(input_shape, classes):
    return detprof.Training(Net(input_shape[-1], classes, nnx.Rngs(0)), loss=smooth, optimizer=optax.sgd(0.5))


class Dropped(nnx.Module):
    def __init__(self, channels, classes, rngs):
        self.conv = nnx.Conv(channels, 8, (3, 3), rngs=rngs)
        self.drop = nnx.Dropout(0.2, rngs=rngs)
        self.head = nnx.Linear(8, classes, rngs=rngs)

    def __call__(self, x):
        x = nnx.max_pool(nnx.relu(self.conv(x)), (2, 2), (2, 2))
        return self.head(self.drop(x.mean(axis=(1, 2))))


def dropped(input_shape, classes):
    return Dropped(input_shape[-1], classes, nnx.Rngs(0))


class Noisy(nnx.Module):  # a constant drawn from the OS when the step is traced: each process compiles its own
    def __init__(self, rngs):
        self.conv = nnx.Conv(3, 4, (3, 3), rngs=rngs)
        self.head = nnx.Linear(4, 4, rngs=rngs)

    def __call__(self, x):
        import numpy

        return self.head(self.conv(x).mean(axis=(1, 2)) + numpy.random.default_rng().normal())


def noisy():
    return Noisy(nnx.Rngs(0))


def torch_optimizer():
    return detprof.Training(Net(3, 4, nnx.Rngs(0)), optimizer="adam")


def nnx_with_example():
    return detprof.Training(Net(3, 4, nnx.Rngs(0)), example=jnp.zeros((1, 8, 8, 3)))


class LinenBlock(nn.Module):
    width: int

    @nn.compact
    def __call__(self, x, train: bool = False):
        return nn.relu(nn.BatchNorm(use_running_average=not train)(nn.Conv(self.width, (3, 3))(x)))


class LinenNet(nn.Module):
    classes: int

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = LinenBlock(8)(x, train)
        x = nn.max_pool(LinenBlock(8)(x, train), (2, 2), (2, 2))
        x = nn.Dropout(0.2, deterministic=not train)(x.mean(axis=(1, 2)))
        return nn.Dense(self.classes)(x)


class LinenLm(nn.Module):
    @nn.compact
    def __call__(self, ids, deterministic: bool = True):
        x = nn.Dense(16)(nn.Embed(40, 16)(ids))
        return nn.Dense(40)(nn.Dropout(0.1)(x, deterministic=deterministic))


def linen(input_shape, classes):
    return detprof.Training(LinenNet(classes), example=jnp.zeros((1, 12, 12, 3)))


def linen_lm():
    return detprof.Training(LinenLm(), example=jnp.zeros((1, 10), jnp.int32))


def linen_bare():
    return LinenNet(4)


class Said(nnx.Module):  # what it returns, instead of logits
    def __init__(self, returns, rngs):
        self.head = nnx.Linear(3, 4, rngs=rngs)
        self.returns = returns

    def __call__(self, x):
        scores = self.head(x.mean(axis=(1, 2)))
        return {"text": "logits", "scores": {"scores": scores}, "row": scores.sum(axis=-1)}[self.returns]


def text():
    return Said("text", nnx.Rngs(0))


def nested():
    return Said("scores", nnx.Rngs(0))


def row():
    return Said("row", nnx.Rngs(0))


def linen_no_example():
    return detprof.Training(LinenNet(4))


class Queries(nnx.Module):  # DETR's table of learned queries, an embedding the images never enter
    def __init__(self, classes, rngs):
        self.queries = nnx.Embed(8, 8, rngs=rngs)
        self.stem = nnx.Conv(3, 8, (3, 3), rngs=rngs)
        self.head = nnx.Linear(8, classes, rngs=rngs)

    def __call__(self, x):
        return self.head(self.stem(x).mean(axis=(1, 2)) + self.queries(jnp.arange(8)).mean(axis=0))


def queries(input_shape, classes):
    return Queries(classes, nnx.Rngs(0))


class LinenQueries(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(4)(nn.Conv(8, (3, 3))(x).mean(axis=(1, 2)) + nn.Embed(8, 8)(jnp.arange(8)).mean(axis=0))


def linen_queries():
    return detprof.Training(LinenQueries(), example=jnp.zeros((1, 8, 8, 3)))


class Lm(nnx.Module):  # its norm named first, its position table smaller than its vocabulary
    def __init__(self, rngs):
        self.a_norm = nnx.LayerNorm(16, rngs=rngs)
        self.positions = nnx.Embed(32, 16, rngs=rngs)
        self.tokens = nnx.Embed(50, 16, rngs=rngs)
        self.head = nnx.Linear(16, 50, rngs=rngs)

    def __call__(self, ids):
        return self.head(self.a_norm(self.tokens(ids) + self.positions(jnp.arange(ids.shape[1]))))


def lm():
    return Lm(nnx.Rngs(0))


class Masked(nnx.Module):  # a second input beside its images
    def __init__(self, rngs):
        self.head = nnx.Linear(3, 4, rngs=rngs)

    def __call__(self, x, mask):
        return self.head((x * mask).mean(axis=(1, 2)))


def masked():
    return Masked(nnx.Rngs(0))
"""
FLAX_REGISTRY = {
    "flax_resnet_tiny": {"stem", "blocks.0.conv1", "blocks.7.conv2", "head", TOP_LEVEL_PART},
    "flax_gpt_tiny": {"embed", "blocks.0.attention", "blocks.1.mlp_in", "head"},
}
"""Each registry Flax model, with modules the leaderboard must hold."""
SWEPT = FLAX_REGISTRY | {"linen": {"LinenBlock_0.Conv_0", "LinenBlock_1.BatchNorm_0", "Dense_0", TOP_LEVEL_PART}}
"""What the sweep runs: the registry's and a Linen module of one's own (its max pooling in its own call)."""
Capture = pytest.CaptureFixture[str]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    made = tmp_path_factory.mktemp("flax")
    (made / "flax_net.py").write_text(MODULES)
    return made


def described(folder: Path, function: str) -> own.Inspected:
    from detprof.models import own_build

    model = own.parse(f"{folder / 'flax_net.py'}:{function}")
    return own.Inspected.from_answer(model, own_build.describe(model, (8, 8, 3), 6))


def test_a_module_is_described_channels_last_with_the_classes_its_logits_score(folder: Path) -> None:
    item = described(folder, "net")
    assert item.model.api == kinds.FLAX.api and item.built_at_input_shape
    assert item.inputs[0].shape == (8, 8, 3) and item.inputs[0].dtype == "float32" and item.classes == 6


def test_a_module_takes_token_ids_where_its_input_goes_into_an_embedding(folder: Path) -> None:
    """Read from where the module hands its input, not from what it holds or the order its parts are named in: an
    image model with a table of learned queries (NNX or Linen) takes images; a language model takes ids under the
    rows of the embedding its ids go into, not of its smaller position table."""
    for function in ("queries", "linen_queries"):
        item = described(folder, function)
        assert item.inputs[0].shape == (8, 8, 3) and item.inputs[0].dtype == "float32", function
    lm = described(folder, "lm")
    assert lm.inputs[0].shape == (32,) and lm.inputs[0].dtype == "int32" and lm.classes == 50
    import runpy

    from detprof.models import flax_modules

    ids = flax_modules.synthetic_inputs(runpy.run_path(str(folder / "flax_net.py"))["lm"](), (32,), 64, 0)
    assert 32 <= int(ids.max()) < 50


def test_a_module_that_returns_no_logits_is_one_line_naming_what_it_returned(folder: Path) -> None:
    """Its call traced, not run: what it returned is named as it was (no array, or an array of the wrong shape); a
    call that needs a second input is named before it is traced."""
    said = {
        "text": "text: the module returned str, not logits (an array of scores)",
        "nested": "nested: the module returned dict, not logits (an array of scores)",
        "row": "row: the module returned a float32 array of shape [2], not logits (an array of scores per example)",
        "masked": "masked: its __call__ takes 2 inputs (x, mask); detprof feeds a model one, a batch as it takes it",
    }
    for function, line in said.items():
        with pytest.raises(UsageError, match=re.escape(line)):
            described(folder, function)


def test_data_feeds_a_module_channels_last_its_pixels_scaled(folder: Path, tmp_path: Path) -> None:
    """``--data``'s leading rows as a Flax module takes them: images as they are stored (channels last), uint8
    pixels scaled to [0, 1], labels as int32."""
    from detprof.models import flax_modules, flax_zoo

    path = tmp_path / "batch.npz"
    pixels = np.arange(4 * 8 * 8 * 3, dtype=np.uint32).reshape(4, 8, 8, 3) % 256
    np.savez(path, x_train=pixels.astype(np.uint8), y_train=np.array([3, 1, 2, 0]))
    feed = {"path": str(path), "inputs": [["input", "x_train"]], "targets": [["logits", "y_train"]]}
    module = flax_zoo.resnet_tiny((8, 8, 3), 4)
    x, y = flax_modules.batch(module, {"input_shape": [8, 8, 3], "batch_size": 2, "data": feed}, 0, (4,))
    assert x.shape == (2, 8, 8, 3) and str(x.dtype) == "float32" and float(x.max()) <= 1.0
    assert np.allclose(np.asarray(x) * 255, pixels[:2]) and np.asarray(y).tolist() == [3, 1] and str(y.dtype) == "int32"


def test_a_registry_models_parameters_are_counted_from_its_shapes_alone() -> None:
    """``detprof models`` counts a Flax model's parameters without computing them (``nnx.eval_shape``)."""
    from detprof.models import flax_modules, registry
    from detprof.models.command import _parameters

    assert _parameters("flax_gpt_tiny") == flax_modules.parameters(registry.build("flax_gpt_tiny")) > 1000


def loss_now(training: Any) -> float:
    """The loss on the training's batch, run (``FlaxTraining.loss_value`` only traces it)."""
    from flax import nnx

    from detprof.models.flax_modules import logits_of

    module, _ = nnx.merge(training.graph, training.state)
    return float(training.loss(logits_of(module(training.x)), training.y))


def test_a_step_trains_the_module_under_its_paths_scopes_and_each_arm_compiles_apart(folder: Path) -> None:
    """The step learns; every submodule's ops carry its path in the compiled step's op names, the module's own
    call, the loss and the update theirs; an in-process pair's arms each compile with their knobs as XLA options."""
    import jax

    from detprof.models import own_build

    model = replace(own.parse(f"{folder / 'flax_net.py'}:net"), api=kinds.FLAX.api)
    spec = {"model": "net", "own_model": model.as_record(), "input_shape": [8, 8, 3], "classes": 4, "batch_size": 8}
    training = own_build.native_training(spec, 0)
    before = loss_now(training)
    step = training.step()
    for _ in range(5):
        step()
    assert loss_now(training) < before
    facts = training.facts()
    assert facts["model_api"] == "flax" and facts["classes"] == 4 and facts["input_shape"] == [8, 8, 3]
    assert facts["input_dtype"] == "float32"
    assert {"stem", "blocks.0", "blocks.0.conv", "blocks.1.norm", "head"} <= set(facts["layer_names"])
    assert "nnx.value_and_grad" in facts["train_step"] and "adamw" in facts["train_step"]
    text = jax.jit(training.train_step).lower(training.state, (training.x, training.y)).as_text(debug_info=True)
    names = set(re.findall(r'loc\("([^"]+)"', text))
    for scope in ("blocks.0.conv", "blocks.1.norm", "stem", "head", TOP_LEVEL_PART, LOSS_PART, OPTIMIZER_PART):
        assert any(f"/{scope}/" in name or f"({scope})/" in name for name in names), scope
    backward = [name for name in names if "/transpose(jvp(" in name and "/blocks.0.conv/" in name]
    assert any(name.endswith("/conv_general_dilated") for name in backward), "the gradient under its module's path"
    arms = training.arms([frozenset({"jax.xla_gpu_deterministic_ops"}), frozenset()])
    effects = [effect for _, effect in arms]
    assert [e["compiler_options"] for e in effects] == [{"xla_gpu_deterministic_ops": True}, {}]
    for run, _ in arms:
        run()


def test_a_module_returned_with_its_loss_and_optimizer_trains_with_them_and_a_wrong_one_is_one_line(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from detprof.models import own_build

    model = replace(own.parse(f"{folder / 'flax_net.py'}:trained"), api=kinds.FLAX.api)
    spec = {"model": "trained", "own_model": model.as_record(), "input_shape": [8, 8, 3], "classes": 4}
    training = own_build.native_training(spec | {"batch_size": 4}, 0)
    assert training.loss_name == "smooth" and training.optimizer_name == "the model function's optax transformation"
    with pytest.raises(UsageError, match=r"optimizer for a Flax module is an optax transformation .*not str"):
        described(folder, "torch_optimizer")
    # --amp: one line before any run, nothing written (a Flax module computes in the dtypes its layers are built with).
    out = folder / "amp"
    assert main(["sweep", "--models", f"{folder / 'flax_net.py'}:trained", "--amp", "bf16", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "trained: --amp applies to Keras models and PyTorch modules" in err
    assert not out.exists()


def test_a_linen_module_is_initialised_on_its_example_and_trains_as_an_nnx_one_by_its_linen_paths(
    folder: Path,
) -> None:
    """A Linen module with its example input: its input is the example's (token ids where it embeds), each Linen
    submodule a path of its own (``LinenBlock_1.Conv_0``) in the compiled step, forward and backward; it learns,
    its batch statistics updated in training (its ``train`` flag set, ``batch_stats`` mutable), its dropout drawn
    in training only, from keys a stability study reseeds; without its example, or an NNX module with one: one
    line."""
    import jax

    from detprof.models import own_build

    item = described(folder, "linen")
    assert item.model.api == kinds.FLAX.api and item.inputs[0].shape == (12, 12, 3) and item.classes == 6
    lm = described(folder, "linen_lm")
    assert lm.inputs[0].shape == (10,) and lm.inputs[0].dtype == "int32" and lm.classes == 40
    model = replace(own.parse(f"{folder / 'flax_net.py'}:linen"), api=kinds.FLAX.api)
    spec = {"model": "linen", "own_model": model.as_record(), "input_shape": [12, 12, 3], "classes": 4, "batch_size": 8}
    training = own_build.native_training(spec, 0)
    assert training.name == "LinenNet" and training.paths == [
        "LinenBlock_0",
        "LinenBlock_0.Conv_0",
        "LinenBlock_0.BatchNorm_0",
        "LinenBlock_1",
        "LinenBlock_1.Conv_0",
        "LinenBlock_1.BatchNorm_0",
        "Dropout_0",
        "Dense_0",
    ]
    statistics = [value.copy() for _, _, value in training.weights(nnx_kind("BatchStat"))]
    before, step = loss_now(training), training.step()
    for _ in range(30):
        step()
    assert loss_now(training) < before
    after = [value for _, _, value in training.weights(nnx_kind("BatchStat"))]
    assert len(after) == 4 and not any(np.array_equal(a, b) for a, b in zip(statistics, after, strict=True))
    text = jax.jit(training.train_step).lower(training.state, (training.x, training.y)).as_text(debug_info=True)
    names = set(re.findall(r'loc\("([^"]+)"', text))
    backward = [n for n in names if "/transpose(jvp(" in n and "/LinenBlock_1.Conv_0/" in n]
    assert any(n.endswith("/conv_general_dilated") for n in backward), "the gradient under its Linen path"
    assert any(f"({TOP_LEVEL_PART})/" in n or f"/{TOP_LEVEL_PART}/" in n for n in names)
    taken = training.taken_step((training.x, training.y))
    assert [path for path, _ in taken.outputs][:3] == [
        "LinenBlock_0.Conv_0",
        "LinenBlock_0.BatchNorm_0",
        "LinenBlock_0",
    ]
    first, _ = training.features_and_logits(training.x)
    again, _ = training.features_and_logits(training.x)
    assert first.shape == (8, 8) and np.array_equal(first, again), "inference draws no dropout"
    assert training.reseeded(7) == ["LinenNet"]
    drawn = training.train_on(training.x, training.y)[1]
    training.reseeded(7)
    assert not np.array_equal(drawn, training.train_on(training.x, training.y)[1]), "a step in training drops"
    for function, words in (
        ("linen_bare", "a Linen module is initialised on an example input: return detprof.Training(module, "),
        ("linen_no_example", "detprof.Training of a Linen module needs its example input (example=x)"),
        ("nnx_with_example", "detprof.Training's example is a Linen module's; an NNX module takes none"),
    ):
        with pytest.raises(UsageError, match=re.escape(words)):
            described(folder, function)


def nnx_kind(name: str) -> type:
    from flax import nnx

    return getattr(nnx, name)


@pytest.mark.slow
def test_flax_models_sweep_on_jax_by_module_in_one_process_and_verify_names_the_module_that_parts(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    """The registry's Flax ResNet and GPT, and a Linen module: without ``--backend`` they train on JAX, loading no
    Keras, both modes in one process (each arm compiled with its XLA options); each module is a leaderboard row by
    its path (a Linen submodule's too), the module's own ops (the stem's max pooling) a row, and what no module
    claims under 5%. Another backend: one line before any
    worker starts. ``verify`` compares every submodule call's output, and names the first module whose output parts
    where a module draws a constant of its own in each process."""
    monkeypatch.chdir(folder)
    out = tmp_path / "out"
    args = ["sweep", "--steps", "3", "--warmup", "1", "--repeats", "1", "--precision", "off", "--no-report"]
    models = ",".join([*FLAX_REGISTRY, "flax_net.py:linen"])
    assert main([*args, "--models", models, "--out", str(out)]) == ExitCode.OK
    capsys.readouterr()
    records = list(ResultsStore(out, "sweep").records())
    assert {(r["model"], r["mode"], r["status"], r["model_api"], r["backend"]) for r in records} == {
        (model, mode, "ok", "flax", "jax") for model in SWEPT for mode in ("default", "deterministic")
    }
    assert not any("keras" in r["versions"] for r in records)
    assert {r["pairing"] for r in records} == {"in_process"}
    assert {json.dumps(r["settings"]["compiler_options"], sort_keys=True) for r in records} == {
        "{}",
        '{"xla_gpu_deterministic_ops": true}',
    }
    assert {r["model"]: r["input_shape"] for r in records} == {
        "flax_resnet_tiny": [32, 32, 3],
        "flax_gpt_tiny": [32],
        "linen": [12, 12, 3],
    }
    reported = {m["model"]: m for m in json.loads(render_report([out], "json"))["models"]}
    for model, expected in SWEPT.items():
        layers = {layer["name"]: layer for layer in reported[model]["layers"]}
        assert expected | {LOSS_PART, OPTIMIZER_PART} <= set(layers), (model, sorted(layers))
        assert all(layers[name]["default_ms"] > 0 for name in expected), model
        share = typical_unattributed_share(out, model)
        assert share < 0.05, (model, share, reported[model]["unattributed_share"])
    verified = tmp_path / "verified"
    verify = ["verify", "--models", "flax_net.py:noisy", "--steps", "2", "--out", str(verified)]
    assert main(verify) == ExitCode.CHECK_FAILED
    lines = capsys.readouterr().out
    # Its convolution's output, taken before the head's, is the same in both runs: the head's is the first to part.
    parted = r"noisy on cpu \(jax\): NOT deterministic .* part at step 0, module head \(output\)"
    assert re.search(parted, lines), lines
    run = RunFingerprints.load(verified / "verify" / "fingerprints" / "noisy--default--a")
    fingerprinted = [f.name for f in run.steps[0]]
    assert fingerprinted[:2] == ["conv", "head"] and {"conv", "head"} <= set(fingerprinted[2:]), fingerprinted
    refused = [
        (["sweep", "--models", "flax_gpt_tiny", "--backend", "torch"], "which trains on JAX, not on torch"),
        (["stability", "--model", "flax_resnet_tiny", "--backend", "torch"], "which trains on JAX, not on torch"),
    ]
    none = tmp_path / "none"
    for command, words in refused:
        assert main([*command, "--out", str(none)]) == ExitCode.USAGE
        err = capsys.readouterr().err
        assert err.startswith("detprof: error: ") and words in err and err.count("\n") == 1, err
    assert not none.exists()
    assert np.isfinite([r["kernel_ns_per_step"] for r in records]).all()


@pytest.mark.slow
def test_a_stability_study_of_a_flax_module_holds_control_bitwise_and_varies_each_source_alone(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    """A module of one's own on the digits (channels last, JAX implied by what the function returned, its function
    seeding its own ``nnx.Rngs(0)``): control's runs end bitwise identical; ``init`` (folded into the function's
    seeds) and dropout's keys each part the runs alone; the workers load JAX without Keras."""
    monkeypatch.chdir(folder)
    out = tmp_path / "stability"
    args = ["stability", "--model", "flax_net.py:dropped", "--runs", "2", "--epochs", "1"]
    assert main([*args, "--variants", "control,init,dropout", "--out", str(out)]) == ExitCode.OK, capsys.readouterr()
    summary = json.loads((out / "stability" / "summary.json").read_text())
    variants = {variant["variant"]: variant for variant in summary["variants"]}
    assert variants["control"]["determinism_check"]["verified"] is True
    assert variants["init"]["distinct_weights"] == 2 and variants["dropout"]["distinct_weights"] == 2
    records = list(ResultsStore(out, "stability").records())
    assert {(r["status"], r["backend"]) for r in records} == {("ok", "jax")}
    assert all("keras" not in r["software"] and "nnx.value_and_grad" in r["train_step"] for r in records)
    seen = {(tuple(r["input_shape"]), tuple(r["seeded_stochastic_layers"])) for r in records}
    assert seen == {((8, 8, 1), ("drop",))}
    capsys.readouterr()
