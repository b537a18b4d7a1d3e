"""Your own models (``models.own``): factories in a file or a module, saved ``.keras`` models, ``--data``.

The models live in files the tests write into a temporary folder (none of them is
detprof's). Spec parsing, the npz reader and the fingerprint are pure and checked in
process; loading a model is checked once through a real worker (``own.inspect_with``);
the sweeps and the stability study run end to end through the CLI on this CPU, their
workers real subprocesses, so determinism never switches on in pytest's own process.
"""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Iterator
from contextlib import chdir
from pathlib import Path

import numpy as np
import pytest
from advised import advised, resolve
from rich.console import Console

from detprof.check.baseline_file import fingerprint, fingerprint_differences, read_sweep
from detprof.cli import main
from detprof.errors import InputError, UsageError
from detprof.models import own
from detprof.models.npz_data import headers, leading_rows
from detprof.models.plans import split_models
from detprof.profiler.devices import choose_device
from detprof.reports.command import render_report
from detprof.store import ResultsStore
from detprof.sweep.run import SweepOutcome, study_stability

FACTORIES = """
import keras


def build_net(input_shape, classes):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(classes)(x))


def fixed_net():
    inputs = keras.Input(shape=(8, 8, 1), name="image")
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(inputs)
    x = keras.layers.Flatten()(x)
    model = keras.Model(inputs, keras.layers.Dense(5, activation="softmax")(x))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    return model


def two_heads():
    a = keras.Input(shape=(6,), name="a")
    b = keras.Input(shape=(4,), name="b")
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([a, b]))
    scores = keras.layers.Dense(3, name="cls")(hidden)
    value = keras.layers.Dense(1, name="reg")(hidden)
    model = keras.Model([a, b], [scores, value])
    loss = [keras.losses.SparseCategoricalCrossentropy(from_logits=True), "mse"]
    model.compile(optimizer="sgd", loss=loss, loss_weights=[1.0, 0.5])
    return model


def not_a_model():
    return 3
"""
SWEEP = ["--steps", "2", "--warmup", "0", "--batch-size", "8", "--gpu", "cpu", "--tracer", "none", "--no-report"]
Capture = pytest.CaptureFixture[str]


def save_keras_model(path: Path) -> None:
    """A small classifier of 8x8 grey images into 10 classes, one initializer seeded in its config."""
    import keras

    inputs = keras.Input(shape=(8, 8, 1))
    seeded = keras.initializers.GlorotUniform(seed=7)
    x = keras.layers.Conv2D(4, 3, padding="same", activation="relu", kernel_initializer=seeded)(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    keras.Model(inputs, keras.layers.Dense(10)(x)).save(path)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a module of factories, a saved model, and the npz files they train on."""
    folder = tmp_path_factory.mktemp("zoo")
    (folder / "my_models.py").write_text(FACTORIES)
    save_keras_model(folder / "net.keras")
    rng = np.random.default_rng(0)
    np.savez(
        folder / "batch.npz",
        x_train=rng.integers(0, 256, size=(16, 8, 8), dtype=np.uint8),
        y_train=rng.integers(0, 5, size=16),
        a=rng.standard_normal((16, 6)).astype(np.float32),
        b=rng.standard_normal((16, 4)).astype(np.float32),
        cls=rng.integers(0, 3, size=16),
        reg=rng.standard_normal((16, 1)).astype(np.float32),
    )
    labels = np.arange(96) % 10
    images = rng.random((96, 8, 8, 1), dtype=np.float32) + labels[:, None, None, None] / 10
    np.savez(folder / "images.npz", x_train=images[:64], y_train=labels[:64], x_test=images[64:], y_test=labels[64:])
    return folder


@pytest.fixture
def in_zoo(zoo: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(zoo)
    return zoo


def run_cli(capsys: Capture, *args: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# Specs, parsed in detprof's own process.


def test_specs_are_parsed_into_labels_kinds_and_file_hashes(in_zoo: Path) -> None:
    factory = own.parse("my_models.py:build_net")
    assert (factory.kind, factory.label, factory.function) == ("factory", "build_net", "build_net")
    assert factory.path == str(in_zoo / "my_models.py") and factory.given == "my_models.py:build_net"
    assert factory.sha256 == own.file_sha256(in_zoo / "my_models.py")
    saved = own.parse("net.keras")
    assert (saved.kind, saved.label, saved.path) == ("saved", "net", str(in_zoo / "net.keras"))
    module = own.parse("my_models:fixed_net")
    assert (module.module, module.search_path, module.path, module.sha256) == ("my_models", str(in_zoo), None, None)
    assert own.OwnModel.from_record(json.loads(json.dumps(saved.as_record()))) == saved
    given = "SmallCNN, my_models.py:Build_Net,Net.keras"
    assert split_models(given) == ("smallcnn", "my_models.py:Build_Net", "Net.keras")
    assert not own.is_own("resnet50") and own.is_own("pkg.mod:f") and own.is_own("a/b.KERAS")


@pytest.mark.parametrize(
    ("spec", "error", "message"),
    [
        ("missing.py:build", InputError, r"missing\.py: no such file \(a model factory"),
        ("missing.keras", InputError, r"missing\.keras: no such file \(a saved Keras model"),
        ("my_models.py:", UsageError, "not a model name"),
        ("my models:build", UsageError, "neither a .py file nor a module name"),
        ("my_models.py", UsageError, "not a model name"),
    ],
)
def test_bad_specs_are_one_line(in_zoo: Path, spec: str, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message) as info:
        own.parse(spec)
    assert "\n" not in str(info.value)


def test_a_keras_file_that_is_no_keras_archive_is_refused(in_zoo: Path) -> None:
    (in_zoo / "junk.keras").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="not a saved Keras model"):
        own.parse("junk.keras")
    shutil.copy(in_zoo / "batch.npz", in_zoo / "arrays.keras")
    with pytest.raises(InputError, match=r"has no config\.json"):
        own.parse("arrays.keras")


def test_labels_must_be_unique_and_input_shapes_well_formed() -> None:
    with pytest.raises(UsageError, match=r"a\.py:build and b\.py:build both go by the name 'build'"):
        own.refuse_duplicate_labels(["build", "smallcnn", "build"], ["a.py:build", "smallcnn", "b.py:build"])
    assert own.parse_input_shape(" 64x48X3 ") == (64, 48, 3) and own.parse_input_shape("20") == (20,)
    for bad in ("32x32x", "0x4", "axb"):
        with pytest.raises(UsageError, match="--input-shape must be"):
            own.parse_input_shape(bad)
    assert own.safe_label("my net (v2)") == "my_net_v2"


def test_npz_headers_and_leading_rows_read_only_what_a_batch_needs(tmp_path: Path) -> None:
    x = np.arange(5 * 3 * 2, dtype=np.float32).reshape(5, 3, 2)
    np.savez(tmp_path / "plain.npz", x=x, f=np.asfortranarray(x))
    np.savez_compressed(tmp_path / "packed.npz", x=x)
    found = headers(tmp_path / "plain.npz")
    assert found["x"].shape == (5, 3, 2) and found["x"].dtype == "<f4" and set(found) == {"x", "f"}
    for name, archive in (("x", "plain.npz"), ("f", "plain.npz"), ("x", "packed.npz")):
        np.testing.assert_array_equal(leading_rows(tmp_path / archive, name, 2), x[:2])
    np.testing.assert_array_equal(leading_rows(tmp_path / "plain.npz", "x", 50), x)
    assert own.example_shape((10, 8, 8), (8, 8, 1)) == (8, 8, 1)
    assert own.example_shape((10, 8, 8, 3), (None, None, 3)) == (8, 8, 3)
    assert own.example_shape((10, 8, 8, 3), (8, 8, 1)) is None


def test_the_fingerprint_compares_model_sources_of_the_models_both_sides_have() -> None:
    base = {"model_source": {"build_net": "sha256:aa", "smallcnn": "registry", "gone": "sha256:cc"}}
    same = {"model_source": {"build_net": "sha256:aa", "smallcnn": "registry", "new": "sha256:dd"}}
    changed = {"model_source": {"build_net": "sha256:bb", "smallcnn": "registry"}}
    assert fingerprint_differences(base, same) == []
    (difference,) = fingerprint_differences(base, changed)
    assert difference.describe() == "model_source.build_net: sha256:aa -> sha256:bb"
    assert fingerprint_differences({}, changed) == []  # a baseline written before there were models of your own


# Building, in process (no determinism is switched on here).


def test_factories_are_called_as_they_take_arguments_and_must_return_models(in_zoo: Path) -> None:
    from detprof.models import own_build

    model = own_build.build(own.parse("my_models.py:build_net"), (6, 6, 2), 3)
    assert model.inputs[0].shape[1:] == (6, 6, 2) and model.outputs[0].shape[-1] == 3
    assert own_build.loss_name(model) is None
    fixed = own_build.build(own.parse("my_models.py:fixed_net"), (6, 6, 2), 3)
    assert fixed.inputs[0].shape[1:] == (8, 8, 1)
    assert own_build.loss_name(fixed) == own.SPARSE_CLASSIFICATION_LOSS and own_build.outputs_probabilities(fixed)
    with pytest.raises(UsageError, match=r"not_a_model returned int, not a keras\.Model"):
        own_build.build(own.parse("my_models.py:not_a_model"), (6, 6, 2), 3)
    with pytest.raises(UsageError, match=r"no function 'nothing_here'$"):
        own_build.factory(own.parse("my_models.py:nothing_here"))
    with pytest.raises(UsageError, match=r"no function 'build_nett' \(did you mean 'build_net'\?\)"):
        own_build.factory(own.parse("my_models.py:build_nett"))

    def three(a: int, b: int, c: int) -> None:
        """Takes neither nothing nor (input_shape, classes)."""

    with pytest.raises(UsageError, match=r"must take no arguments or \(input_shape, classes\)"):
        own_build.takes_arguments(three, "x.py:three")

    def defaults(vocabulary: int = 64, width: int = 32) -> None:
        """A class's constructor, say: its arguments are its own, not the study's."""

    def sized(input_shape: tuple[int, ...] = (32, 32, 3), classes: int = 10) -> None:
        """Either way too, but it asks for the study's."""

    def needs(input_shape: tuple[int, ...], classes: int = 10) -> None:
        """Callable only with them."""

    taking = {f: own_build.takes_arguments(f, "x.py:f") for f in (defaults, sized, needs)}
    assert taking == {defaults: False, sized: True, needs: True}


# What a worker reports of each model (``own_build.describe``), here in process.


@pytest.fixture(scope="module")
def described(zoo: Path) -> Iterator[dict[str, own.Inspected]]:
    from detprof.models import own_build

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(zoo)
        specs = ("my_models.py:build_net", "my_models:fixed_net", "my_models.py:two_heads", "net.keras")
        models = [own.parse(spec) for spec in specs]
        found = [own.Inspected.from_answer(m, own_build.describe(m, (16, 16, 3), 4)) for m in models]
    yield {item.label: item for item in found}


def test_each_models_inputs_outputs_and_loss_are_described(zoo: Path, described: dict[str, own.Inspected]) -> None:
    factory, fixed, heads, saved = (described[n] for n in ("build_net", "fixed_net", "two_heads", "net"))
    assert factory.built_at_input_shape and factory.inputs[0].shape == (16, 16, 3) and factory.classes == 4
    assert not factory.compiled and factory.sparse_classifier
    # A module's file and hash come from the process that imported it.
    assert fixed.model.path == str(zoo / "my_models.py") and fixed.model.sha256 == own.file_sha256(zoo / "my_models.py")
    assert not fixed.built_at_input_shape and fixed.inputs[0].name == "image" and fixed.classes == 5
    assert [t.name for t in heads.inputs] == ["a", "b"] and [t.name for t in heads.outputs] == ["cls", "reg"]
    assert heads.loss == "2 losses, one per output" and not heads.sparse_classifier
    assert saved.model.kind == "saved" and saved.inputs[0].shape == (8, 8, 1) and saved.classes == 10
    assert saved.parameters == 4 * 3 * 3 * 1 + 4 + 4 * 10 + 10


def test_synthetic_data_or_data_that_does_not_fit_is_refused_in_one_line(
    zoo: Path, described: dict[str, own.Inspected]
) -> None:
    own.refuse_synthetic(described["build_net"])
    with pytest.raises(UsageError, match=r"two_heads has 2 input\(s\) \(a, b\) and 2 output\(s\).*--data npz:PATH"):
        own.refuse_synthetic(described["two_heads"])
    arrays = headers(zoo / "batch.npz")
    feed = own.data_feed(described["two_heads"], zoo / "batch.npz", arrays, 8)
    assert feed["inputs"] == [["a", "a"], ["b", "b"]] and feed["targets"] == [["cls", "cls"], ["reg", "reg"]]
    assert own.data_feed(described["fixed_net"], zoo / "batch.npz", arrays, 8)["inputs"] == [["image", "x_train"]]
    with pytest.raises(InputError, match="holds 16 examples, fewer than the batch size 32"):
        own.data_feed(described["two_heads"], zoo / "batch.npz", arrays, 32)
    with pytest.raises(InputError, match=r"array x_train holds 8x8 examples; build_net's input .* takes 16x16x3"):
        own.data_feed(described["build_net"], zoo / "batch.npz", arrays, 8)


@pytest.mark.parametrize(
    ("x", "y", "says"),
    [
        (
            np.zeros((16, 8, 8, 1), np.float32),
            np.arange(15) % 5,
            r"different numbers of examples \(x_train 16, y_train 15",
        ),
        (np.full((16, 8, 8, 1), np.nan, np.float32), np.arange(16) % 5, "the first 8 rows of array x_train hold NaN"),
        (
            np.zeros((16, 8, 8, 1), np.float32),
            np.arange(16) % 5 - 1,
            r"array y_train holds negative labels \(such as -1",
        ),
    ],
)
def test_data_an_example_cannot_train_on_is_refused_in_one_line(
    tmp_path: Path, described: dict[str, own.Inspected], x: np.ndarray, y: np.ndarray, says: str
) -> None:
    """An image without its label, a NaN in the batch, a negative class: each would train on nothing or fail in
    every run; each is one line before any, for your own model and a registry one alike."""
    path = tmp_path / "bad.npz"
    np.savez(path, x_train=x, y_train=y)
    with pytest.raises(InputError, match=says):
        own.data_feed(described["fixed_net"], path, headers(path), 8)
    with pytest.raises(InputError, match=says):
        data = own.NpzData.read(path)
        own.classifier_feed(data, 8, 5)


def test_the_workload_trains_your_model_on_a_synthetic_batch(zoo: Path) -> None:
    """The worker's workload, one step in this process (its determinism switch is left alone here)."""
    from worker_specs import spec_for

    from detprof.profiler.workloads import model_training

    factory = own.parse(f"{zoo / 'my_models.py'}:build_net").as_record()
    params = {"model": "build_net", "own_model": factory, "input_shape": [6, 6, 2], "classes": 3, "batch_size": 4}
    step, facts = model_training(spec_for(params))
    step()
    assert facts["input_shape"] == [6, 6, 2] and facts["classes"] == 3 and facts["parameters"] == 4 * 18 + 4 + 15
    saved = own.parse(str(zoo / "net.keras")).as_record()
    params = {"model": "net", "own_model": saved, "input_shape": None, "classes": None, "batch_size": 4}
    step, facts = model_training(spec_for(params))
    step()
    assert facts["input_shape"] == [8, 8, 1] and facts["classes"] == 10


def test_bad_models_stop_the_sweep_in_one_line_before_any_run(in_zoo: Path, capsys: Capture) -> None:
    (in_zoo / "junk.keras").write_bytes(b"not a zip")
    for spec, code in (("absent.py:build", 3), ("junk.keras", 3), ("smallcnn,my models:build", 2)):
        result, _, err = run_cli(capsys, "sweep", "--models", spec, *SWEEP, "--out", in_zoo / "none")
        assert result == code and err.startswith("detprof: error: ") and err.strip().count("\n") == 0, err
    result, _, err = run_cli(capsys, "sweep", "--models", "smallcnn", "--data", "batch.npz", *SWEEP, "--out", "none")
    assert result == 2 and "--data takes npz:PATH" in err
    assert not (in_zoo / "none").exists()


def test_sweep_stability_names_the_study_of_each_model_of_yours_it_leaves_out(in_zoo: Path, capsys: Capture) -> None:
    """``sweep --stability`` trains registry models only: for yours it prints the commands that study them."""
    yours, slow = ("my_models.py:build_net", "net.keras"), ("mediumcnn_k1",)  # the latter learns no digits in budget
    outcome = SweepOutcome(in_zoo, "sweep", {}, (*yours, *slow), slow, "cpu-small", choose_device(None), "tensorflow")
    printed = Console(file=io.StringIO(), width=1000)
    assert study_stability(outcome, console=printed) == []
    said = printed.file.getvalue()  # type: ignore[attr-defined]
    assert said.startswith(
        "stability: studying no model; my_models.py:build_net, net.keras are models of your own, which the sweep does "
        "not study; mediumcnn_k1 cannot learn its embedded study in the budget of preset cpu-small: "
    )
    assert said.rstrip().endswith("study them")
    commands = advised(said)
    assert commands == [f"detprof stability --model {model}" for model in (*yours, *slow)]
    for line in commands:
        resolve(line, in_zoo, capsys)


# A sweep of four models of your own on a real batch, and check on it.


@pytest.fixture(scope="module")
def sweep(zoo: Path) -> Iterator[Path]:
    """A factory from a file, a saved model, a module's compiled factory and a two-input model, on --data."""
    out = zoo / "sweep"
    models = "my_models.py:build_net,net.keras,my_models:fixed_net,my_models.py:two_heads"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(zoo)
        code = main(
            [
                *("sweep", "--models", models, "--data", "npz:batch.npz", "--repeats", "2", *SWEEP),
                *("--shared-repeats", "--out", str(out)),  # each model built once for both repeats
            ]
        )
    assert code == 0
    yield out


@pytest.mark.slow
def test_models_of_your_own_are_swept_with_determinism_verified(zoo: Path, sweep: Path) -> None:
    records = {r["run_id"]: r for r in ResultsStore(sweep, "sweep").records()}
    assert {r["model"] for r in records.values()} == {"build_net", "net", "fixed_net", "two_heads"}
    assert len(records) == 16
    for record in records.values():
        assert record["status"] == "ok", record["reason"]
        assert record["settings"]["op_determinism"] is (record["mode"] == "deterministic")
        assert record["train_step"] == "keras train_step (jit_compile=False), the arms in turn in one process"
        spec = record["model_spec"]
        assert spec["label"] == record["model"] and spec["sha256"] == own.file_sha256(spec["path"])
    # Built at the size of --data's grey images, for the preset's 10 classes (or their own).
    for model, classes in (("build_net", 10), ("net", 10), ("fixed_net", 5)):
        record = records[f"{model}--deterministic--r1"]
        assert (record["input_shape"], record["classes"]) == ([8, 8, 1], classes)
    assert records["fixed_net--default--r0"]["model_spec"]["module"] == "my_models"
    assert records["net--default--r0"]["model_spec"]["kind"] == "saved"
    assert "input_shape" not in records["two_heads--default--r0"]
    config = ResultsStore(sweep, "sweep").manifest()["config"]
    assert config["data"] == "npz:batch.npz" and config["input_size"] is None
    assert set(config["own_models"]) == {"build_net", "net", "fixed_net", "two_heads"}


@pytest.mark.slow
def test_every_command_the_report_advises_for_your_models_resolves(zoo: Path, sweep: Path, capsys: Capture) -> None:
    commands = advised(render_report([sweep], "md"))
    # Each model as --models named it; the calibration feeds them from the sweep's file at its batch size.
    assert "detprof stability --model my_models:fixed_net" in commands
    assert "detprof stability --model net.keras" in commands
    (calibrate,) = [c.split() for c in commands if c.startswith("detprof sweep --calibrate")]
    models = {"my_models.py:build_net", "net.keras", "my_models:fixed_net", "my_models.py:two_heads"}
    assert set(calibrate[calibrate.index("--models") + 1].split(",")) == models
    assert calibrate[-4:] == ["--data", "npz:batch.npz", "--batch-size", "8"]
    for line in commands:
        resolve(line, zoo, capsys)


@pytest.mark.slow
def test_check_tells_when_the_model_itself_changed(zoo: Path, sweep: Path, capsys: Capture) -> None:
    path = zoo / "baseline.json"
    code, _, err = run_cli(capsys, "baseline", sweep, "-o", path)
    assert code == 0, err
    document = json.loads(path.read_text())
    factories, saved = (f"sha256:{own.file_sha256(zoo / name)}" for name in ("my_models.py", "net.keras"))
    sources = {"build_net": factories, "fixed_net": factories, "net": saved, "two_heads": factories}
    assert document["fingerprint"]["model_source"] == sources
    code, _, err = run_cli(capsys, "check", "--baseline", path, "--current", sweep)
    assert code == 0, err
    # The same sweep, read as if the baseline had been built from an older build_net.
    document["fingerprint"]["model_source"]["build_net"] = "sha256:" + "0" * 64
    path.write_text(json.dumps(document))
    code, out, err = run_cli(capsys, "check", "--baseline", path, "--current", sweep)
    assert code == 3 and "model_source.build_net" in err and err.strip().count("\n") == 0
    assert "model_source.build_net" in out
    # check --run tells it before measuring anything: the file the baseline names is there to hash
    with chdir(zoo):
        code, _, err = run_cli(capsys, "check", "--baseline", path, "--run", "--out", zoo / "rerun")
    assert code == 3 and err.strip().count("\n") == 0, err
    assert "(model_source.build_net): the file of my_models.py:build_net changed since the baseline was built" in err
    assert not (zoo / "rerun").exists()
    current = read_sweep(sweep)
    assert fingerprint(current.config, current.records)["model_source"] == sources


# A stability study of a saved model.


@pytest.mark.slow
def test_a_saved_models_stability_verifies_control_and_varies_init(zoo: Path, capsys: Capture) -> None:
    out = zoo / "stability"
    code, stdout, err = run_cli(
        capsys,
        "stability", "--model", zoo / "net.keras", "--dataset", f"npz:{zoo / 'images.npz'}",
        "--variants", "control,init", "--runs", "2", "--epochs", "1", "--batch-size", "16", "--jobs", "1",
        "--out", out,
    )  # fmt: skip
    assert code == 0, err
    assert "determinism verified: 2 runs ended with bitwise-identical weights" in stdout
    summary = json.loads((out / "stability" / "summary.json").read_text())
    assert summary["model"] == "net" and summary["model_spec"]["sha256"] == own.file_sha256(zoo / "net.keras")
    by_variant = {v["variant"]: v for v in summary["variants"]}
    assert by_variant["control"]["determinism_check"]["verified"] is True
    # A fresh clone per run, its seeded initializer unseeded: init really varies.
    assert by_variant["init"]["distinct_weights"] == 2
    manifest = ResultsStore(out, "stability").manifest()["config"]
    assert manifest["own_model"]["label"] == "net" and "keep_saved_weights" not in manifest
