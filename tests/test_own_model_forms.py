"""Every way a user writes a Keras model, as a model of your own, on every backend (``own_build.defined``).

Sequential with and without ``keras.Input``, functional with one or several inputs and
outputs, a subclassed ``keras.Model``; with Dropout and BatchNorm; ending in a softmax (a
Dense's activation, an ``Activation``, a ``Softmax`` layer, ``keras.ops.softmax`` in a
``call``) or in logits; each as a factory and as a saved ``.keras``. The models live in files
the tests write. Each backend inspects and trains them all in one fresh interpreter
(``scripts/own_model_forms.py``); a saved model whose classes cannot be found is checked in
process; the CLI sweeps and studies a Sequential and a subclassed model end to end, on JAX and
PyTorch as ``detprof stability --backend`` must study any model (``control`` bitwise identical,
``algo`` not, no TensorFlow loaded), in a fresh interpreter that says which frameworks it imported.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from script_runner import run_script

from detprof.cli import main
from detprof.errors import UsageError
from detprof.models import own
from detprof.store import ResultsStore

BACKENDS = ("tensorflow", "jax", "torch")
FORMS = '''
import keras


@keras.saving.register_keras_serializable(package="detprof_tests")
class Small(keras.Model):
    """Subclassed: BatchNorm and Dropout, and a softmax that no layer names."""

    def __init__(self, classes=10, probabilities=True, **kwargs):
        super().__init__(**kwargs)
        self.classes, self.probabilities = classes, probabilities
        self.flatten = keras.layers.Flatten()
        self.norm = keras.layers.BatchNormalization()
        self.hidden = keras.layers.Dense(16, activation="relu")
        self.drop = keras.layers.Dropout(0.25)
        self.scores = keras.layers.Dense(classes)

    def call(self, x, training=False):
        x = self.drop(self.hidden(self.norm(self.flatten(x), training=training)), training=training)
        scores = self.scores(x)
        return keras.ops.softmax(scores) if self.probabilities else scores

    def get_config(self):
        return {**super().get_config(), "classes": self.classes, "probabilities": self.probabilities}


def seq_input():
    layers = [keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"), keras.layers.Dropout(0.25)]
    return keras.Sequential([keras.Input((8, 8, 1)), *layers, keras.layers.Dense(10)])


def seq_bare():
    conv = keras.layers.Conv2D(4, 3, activation="relu")
    norm = keras.layers.BatchNormalization()
    return keras.Sequential([conv, norm, keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")])


def seq_softmax_layer():
    layers = [keras.layers.Flatten(), keras.layers.Dense(10), keras.layers.Softmax()]
    return keras.Sequential([keras.Input((8, 8, 1)), *layers])


def seq_activation():
    layers = [keras.layers.Flatten(), keras.layers.Dense(10), keras.layers.Activation("softmax")]
    model = keras.Sequential([keras.Input((8, 8, 1)), *layers])
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    return model


def functional(input_shape, classes):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.Dropout(0.25)(keras.layers.GlobalAveragePooling2D()(x))
    return keras.Model(inputs, keras.layers.Dense(classes)(x))


def two_heads():
    a = keras.Input(shape=(6,), name="a")
    b = keras.Input(shape=(4,), name="b")
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([a, b]))
    model = keras.Model([a, b], [keras.layers.Dense(3, name="cls")(hidden), keras.layers.Dense(1, name="reg")(hidden)])
    loss = [keras.losses.SparseCategoricalCrossentropy(from_logits=True), "mse"]
    model.compile(optimizer="sgd", loss=loss, loss_weights=[1.0, 0.5])
    return model


def subclassed():
    return Small(10)


def subclassed_logits():
    model = Small(10, probabilities=False)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
'''
FACTORIES = (
    "seq_input",
    "seq_bare",
    "seq_softmax_layer",
    "seq_activation",
    "functional",
    "two_heads",
    "subclassed",
    "subclassed_logits",
)
SAVED = ("seq_input", "seq_bare", "functional", "two_heads", "subclassed")
PROBABILITIES = {"seq_bare", "seq_softmax_layer", "seq_activation", "subclassed"}
TRAINED = ("forms.py:seq_bare", "forms.py:two_heads", "saved_subclassed.keras")
SWEEP = ["--steps", "2", "--warmup", "0", "--batch-size", "8", "--gpu", "cpu", "--tracer", "none", "--no-report"]
Capture = pytest.CaptureFixture[str]


def save_forms(folder: Path) -> None:
    """Each form saved as a user saves it: built (called on a batch), the subclassed one from its module."""
    import keras

    forms = importlib.import_module("forms")
    batch = np.zeros((1, 8, 8, 1), np.float32)
    for name in SAVED:
        function = getattr(forms, name)
        model = function((8, 8, 1), 10) if name == "functional" else function()
        if name in ("seq_bare", "subclassed"):
            model(batch)
        model.save(folder / f"saved_{name}.keras")
    assert isinstance(keras.saving.load_model(folder / "saved_subclassed.keras"), forms.Small)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The factories' module, a saved model of each form, and the arrays they train on."""
    folder = tmp_path_factory.mktemp("forms")
    (folder / "forms.py").write_text(FORMS)
    rng = np.random.default_rng(0)
    labels = np.arange(96) % 10
    images = rng.random((96, 8, 8, 1), dtype=np.float32) + labels[:, None, None, None] / 10
    np.savez(folder / "images.npz", x_train=images[:64], y_train=labels[:64], x_test=images[64:], y_test=labels[64:])
    np.savez(
        folder / "batch.npz",
        a=rng.standard_normal((16, 6)).astype(np.float32),
        b=rng.standard_normal((16, 4)).astype(np.float32),
        cls=rng.integers(0, 3, size=16),
        reg=rng.standard_normal((16, 1)).astype(np.float32),
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(folder))
        save_forms(folder)
        sys.modules.pop("forms")
    return folder


@pytest.fixture(scope="module", params=BACKENDS)
def on_backend(request: pytest.FixtureRequest, zoo: Path) -> tuple[str, dict[str, Any]]:
    """What one backend's interpreter found of every form (``scripts/own_model_forms.py``)."""
    specs = [f"forms.py:{name}" for name in FACTORIES] + [f"saved_{name}.keras" for name in SAVED]
    ask = {"describe": specs, "train": list(TRAINED), "data": "batch.npz"}
    result = run_script("own_model_forms.py", request.param, json.dumps(ask), cwd=zoo, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return request.param, json.loads(result.stdout.strip().splitlines()[-1])


def form(spec: str) -> str:
    """The form a spec names, a factory's or a saved model's."""
    return spec.removeprefix("forms.py:").removeprefix("saved_").removesuffix(".keras")


@pytest.mark.slow
def test_every_form_is_inspected_with_its_inputs_outputs_and_loss(on_backend: tuple[str, dict[str, Any]]) -> None:
    _, found = on_backend
    for spec, answer in found.items():
        name = form(spec)
        inputs, outputs = answer["inputs"], answer["outputs"]
        if name == "two_heads":
            assert [t["name"] for t in inputs] == ["a", "b"] and [t["name"] for t in outputs] == ["cls", "reg"]
            assert answer["loss"] == "2 losses, one per output"
            continue
        assert [t["shape"] for t in inputs] == [[8, 8, 1]], spec
        assert [t["shape"] for t in outputs] == [[10]], spec
        expected_loss = "sparse_categorical_crossentropy" if name in ("seq_activation", "subclassed_logits") else None
        assert answer["loss"] == expected_loss, spec
    # Built at the input shape given: a factory of (input_shape, classes), or a model that fixes none of its own.
    built_at = {form(spec) for spec, answer in found.items() if answer["built_at_input_shape"] and ":" in spec}
    assert built_at == {"seq_bare", "functional", "subclassed", "subclassed_logits"}
    assert not any(answer["built_at_input_shape"] for spec, answer in found.items() if ":" not in spec)


def test_probabilities_or_logits_are_read_off_every_form(on_backend: tuple[str, dict[str, Any]]) -> None:
    _, found = on_backend
    probabilities = {form(spec) for spec, answer in found.items() if answer["probabilities"]}
    assert probabilities == PROBABILITIES


def test_the_sweep_and_stability_steps_train_every_form(on_backend: tuple[str, dict[str, Any]]) -> None:
    backend, found = on_backend
    for spec in TRAINED:
        facts = found[spec]["sweep"]
        assert facts["parameters"] == found[spec]["parameters"], spec
        if spec != "forms.py:two_heads":
            assert (facts["input_shape"], facts["input_dtype"], facts["classes"]) == ([8, 8, 1], "float32", 10), spec
            studied = found[spec]["stability"]
            assert np.isfinite(studied["loss"]), spec
            assert studied["outputs"] == ("probabilities" if form(spec) in PROBABILITIES else "logits"), spec
    assert found["forms.py:seq_bare"]["stability"]["features"] == 6 * 6 * 4  # what feeds the classifier
    # A subclassed model hides its layers: its outputs, probabilities here, stand in for its features.
    assert found["saved_subclassed.keras"]["stability"]["features"] == 10
    assert found["saved_subclassed.keras"]["stability"]["rows"] == [1.0, 1.0]
    step = "tf.function" if backend == "tensorflow" else "keras train_on_batch"
    assert found["forms.py:two_heads"]["sweep"]["train_step"].startswith(step)


def test_a_model_that_does_not_build_at_the_input_shape_is_one_line(
    zoo: Path, fresh_imports: pytest.MonkeyPatch
) -> None:
    from detprof.models import own_build

    message = r"seq_bare: Sequential cannot be built for 20 inputs \(ValueError: .*\): start it with keras\.Input"
    with pytest.raises(UsageError, match=message) as info:
        own_build.build(own.parse(f"{zoo / 'forms.py'}:seq_bare"), (20,), 10)
    assert "\n" not in str(info.value)


# A saved model whose custom class cannot be found: one line saying what to do, in process;
# the module it names is imported from the saved file's folder, then the current one.


CLASS_SOURCE = """
import keras


{decorator}class {name}(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.scores = keras.layers.Dense(10)

    def call(self, x):
        return self.scores(keras.ops.reshape(x, (-1, 64)))
"""
REGISTER = "@keras.saving.register_keras_serializable(package='detprof_tests')\n"


def saved_from(path: Path, module: str, name: str, *, registered: bool = False) -> str:
    """A model of class ``name`` saved as if ``module`` defined it; returns that module's source.

    The class is defined here, not imported, so that neither the module nor (once the test
    takes it out of Keras' registry) the class is known to this process: the loader must
    find them from the saved file alone, as a fresh worker does.
    """
    source = CLASS_SOURCE.format(decorator=REGISTER if registered else "", name=name)
    namespace: dict[str, Any] = {"__name__": module}
    exec(compile(source, f"{module}.py", "exec"), namespace)
    model = namespace[name]()
    model(np.zeros((1, 8, 8, 1), np.float32))
    model.save(path)
    return source


@pytest.fixture
def fresh_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """``sys.path`` and the modules imported as the test found them, afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield monkeypatch
    for name in set(sys.modules) - before:
        if name.endswith("_models"):
            del sys.modules[name]


@pytest.mark.parametrize(
    ("module", "written", "message"),
    [
        ("__main__", False, r"class ScriptNet was defined in the script that saved the model \(module __main__\), "),
        ("lost_models", False, r"class ScriptNet comes from module lost_models, which cannot be imported \(Module"),
        ("plain_models", True, r"class ScriptNet of module plain_models is not registered with Keras: decorate it "),
    ],
)
def test_a_saved_model_whose_class_cannot_be_found_is_one_line(
    tmp_path: Path, fresh_imports: pytest.MonkeyPatch, module: str, written: bool, message: str
) -> None:
    from detprof.models import own_build

    fresh_imports.chdir(tmp_path)
    (tmp_path / "saved").mkdir()
    source = saved_from(tmp_path / "saved" / "net.keras", module, "ScriptNet")
    if written:
        (tmp_path / "saved" / f"{module}.py").write_text(source)
    with pytest.raises(UsageError, match=message) as info:
        own_build.build(own.parse("saved/net.keras"), (8, 8, 1), 10)
    assert "\n" not in str(info.value) and str(info.value).startswith(f"{tmp_path / 'saved' / 'net.keras'}: ")


def test_a_saved_models_module_is_imported_from_its_folder_first_then_the_current_one(
    tmp_path: Path, fresh_imports: pytest.MonkeyPatch
) -> None:
    import keras

    from detprof.models import own_build

    beside, here = tmp_path / "beside", tmp_path / "here"
    beside.mkdir()
    here.mkdir()
    beside_source = saved_from(beside / "a.keras", "shared_models", "BesideNet", registered=True)
    (beside / "shared_models.py").write_text(beside_source)
    (here / "shared_models.py").write_text(
        '"""The same name in the current folder: the saved file\'s folder wins."""\n'
    )
    (here / "here_models.py").write_text(saved_from(beside / "b.keras", "here_models", "HereNet", registered=True))
    for name in ("BesideNet", "HereNet"):
        fresh_imports.delitem(keras.saving.get_custom_objects(), f"detprof_tests>{name}")
    fresh_imports.chdir(here)
    for saved, name in (("a.keras", "BesideNet"), ("b.keras", "HereNet")):
        built = own_build.build(own.parse(str(beside / saved)), (8, 8, 1), 10)
        assert type(built.layers[-1]).__name__ == name and built.outputs[0].shape[1:] == (10,)
    assert sys.modules["shared_models"].__file__ == str(beside / "shared_models.py")


# End to end through the CLI: a Sequential factory and a saved Sequential swept, a study of each form, per backend.


def run_cli(capsys: Capture, *args: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "models", "shape_args", "built_at"),
    [
        ("tensorflow", "forms.py:seq_input,saved_seq_input.keras", [], [8, 8, 1]),
        ("jax", "forms.py:seq_bare,saved_seq_bare.keras", ["--input-shape", "8x8x1"], [8, 8, 1]),
        ("torch", "forms.py:seq_bare,saved_seq_input.keras", [], list(own.DEFAULT_INPUT_SHAPE)),
    ],
)
def test_a_sequential_and_a_saved_one_are_swept_on_each_backend(
    zoo: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Capture,
    backend: str,
    models: str,
    shape_args: list[str],
    built_at: list[int],
) -> None:
    """A Sequential without keras.Input is built at --input-shape, else at the default shape."""
    monkeypatch.chdir(zoo)
    out = zoo / f"sweep-{backend}"
    code, _, err = run_cli(
        capsys, "sweep", "--models", models, "--backend", backend, "--repeats", "1", *shape_args, *SWEEP, "--out", out
    )
    assert code == 0, err
    records = list(ResultsStore(out, "sweep").records())
    assert len(records) == 4 and {r["status"] for r in records} == {"ok"}, [r.get("reason") for r in records]
    factory, saved = (m.removeprefix("forms.py:").removesuffix(".keras") for m in models.split(","))
    shapes = {r["model"]: r["input_shape"] for r in records}
    assert shapes == {factory: built_at, saved: [8, 8, 1]}
    assert {r["backend"] for r in records} == {backend}


@pytest.mark.slow
def test_a_stability_study_verifies_control_for_a_subclassed_model_on_tensorflow(
    zoo: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    monkeypatch.chdir(zoo)
    out = zoo / "stability-tensorflow"
    code, stdout, err = run_cli(
        capsys,
        "stability", "--model", "forms.py:subclassed", "--backend", "tensorflow", "--dataset", "npz:images.npz",
        "--variants", "control", "--runs", "2", "--epochs", "1", "--batch-size", "16", "--jobs", "1", "--out", out,
    )  # fmt: skip
    assert code == 0, err
    assert "determinism verified: 2 runs ended with bitwise-identical weights" in stdout
    records = list(ResultsStore(out, "stability").records())
    assert {(r["status"], r["outputs"], r["backend"]) for r in records} == {("ok", "probabilities", "tensorflow")}


REPORTING_CLI = """
import sys
from detprof import cli
code = cli.main(sys.argv[1:])
print("frameworks:", *(m for m in ("tensorflow", "jax", "torch") if sys.modules.get(m) is not None), file=sys.stderr)
sys.exit(code)
"""
"""``detprof ARGS`` whose last stderr line names the frameworks its own process imported."""


def detprof_reporting_frameworks(*args: str | Path, cwd: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """``detprof ARGS`` in a fresh interpreter, since pytest's has imported every framework; and those it imported."""
    command = [sys.executable, "-c", REPORTING_CLI, *map(str, args)]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    label, *frameworks = result.stderr.splitlines()[-1].split(" ")
    assert label == "frameworks:", result.stderr
    return result, set(frameworks)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "model", "outputs"),
    [("jax", "saved_seq_input.keras", "logits"), ("torch", "forms.py:seq_bare", "probabilities")],
)
def test_a_stability_study_on_jax_or_torch_verifies_control_and_never_loads_tensorflow(
    zoo: Path, backend: str, model: str, outputs: str
) -> None:
    """A saved model on JAX and a factory's on PyTorch, studied as ``detprof stability --backend`` studies any model:
    ``control`` ends bitwise identical (a fresh worker's first run against the same worker's later one), ``algo``
    does not, every record names its backend and what the framework reported in effect, and neither detprof's
    process nor its worker loads TensorFlow, which Keras falls back on and a JAX or PyTorch machine may not have."""
    out = zoo / f"stability-{backend}"
    result, parent_frameworks = detprof_reporting_frameworks(
        "stability", "--model", model, "--backend", backend, "--dataset", "npz:images.npz",
        "--variants", "control,algo", "--runs", "2", "--epochs", "1", "--batch-size", "16", "--jobs", "1", "--out", out,
        cwd=zoo,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert parent_frameworks == set()  # detprof's own process trains nothing, so it loads no framework
    assert "determinism verified: 2 runs ended with bitwise-identical weights" in result.stdout
    records = {r["run_id"]: r for r in ResultsStore(out, "stability").records()}
    assert set(records) == {"control-r000", "control-r001", "algo-r000", "algo-r001"}
    assert {(r["status"], r["outputs"]) for r in records.values()} == {("ok", outputs)}
    assert records["control-r000"]["weights_sha256"] == records["control-r001"]["weights_sha256"]
    assert records["algo-r000"]["weights_sha256"] != records["algo-r001"]["weights_sha256"]
    for record in records.values():
        assert record["backend"] == backend
        assert record["determinism"]["backend"] == backend
        assert record["determinism"]["op_determinism"] is (record["mode"] == "deterministic")
        assert record["train_step"] == f"keras train_on_batch (jit_compile={backend == 'jax'})"
        assert record["software"][backend]  # the backend's version, as the worker reported it
        assert "tensorflow" not in record["software"]  # read from the worker's sys.modules after its run
    study_dir = out / "stability"
    summary = json.loads((study_dir / "summary.json").read_text())
    assert (summary["backend"], summary["backend_device"]) == (backend, "cpu")
    assert set(pd.read_parquet(study_dir / summary["tables"]["runs"])["backend"]) == {backend}
    assert json.loads((study_dir / "manifest.json").read_text())["config"]["backend"] == backend
    # One worker trained control-r000 first, then algo-r000, then control-r001 on the same compiled model:
    # the equal digests above say its reset gives what a fresh worker's first run gets, bit for bit.
    assert len({r["pid"] for r in records.values()}) == 1
