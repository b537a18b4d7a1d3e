"""kernels_bench on PyTorch: the suite, its conv cases equal to TensorFlow's, every op in both modes, the CLI."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from detprof.cli import main
from detprof.errors import UsageError
from detprof.kernels_bench import cases as tensorflow_cases
from detprof.kernels_bench import torch_cases
from detprof.kernels_bench.bench import KernelsConfig, plan_runs, select_ops, suites
from detprof.kernels_bench.cases import CONV_OPS, OpCase
from detprof.kernels_bench.torch_cases import SUITES, TorchOpCase, conv_case, describe
from detprof.kernels_bench.torch_ops import BUILDERS
from detprof.store import ResultsStore

CPU = ["--gpu", "cpu", "--tracer", "torch"]
REFUSAL = "does not have a deterministic implementation"

# Each op built from its case in a process whose PyTorch ``apply`` switched into MODE, stepped
# once, and its failure (if any) classified as the worker classifies it.
STEP_EVERY_CASE = """
import json, sys
from detprof.determinism import DeterminismSettings, apply
from detprof.kernels_bench.torch_ops import op_benchmark
from detprof.profiler.worker import classify_failure
from detprof.profiler.worker_spec import WorkerSpec

settings = DeterminismSettings(sys.argv[1], backend="torch")
effective = apply(settings)
outcome = {}
for case in json.loads(sys.stdin.read()):
    try:
        params = {"op": case["op"], "params": case["params"]}
        step, facts = op_benchmark(WorkerSpec("t", "", settings, 0, 1, 0, 0, "none", None, "", "", params))
        step()
        outcome[case["case"]] = ["ok", facts["on_gpu"]]
    except Exception as exc:
        outcome[case["case"]] = list(classify_failure(exc, settings.deterministic))
print(json.dumps({"op_determinism": effective["op_determinism"], "outcome": outcome}))
"""


def tensorflow_conv(**params: object) -> OpCase:
    base = {"strides": [1, 1, 1, 1], "dilations": [1, 1, 1, 1], "padding": "SAME"}
    return OpCase("conv2d_forward", "m", ("conv1",), base | params, work=7)


def test_the_torch_suite_is_the_conv_suite_and_pytorchs_listed_ops() -> None:
    assert SUITES["conv"] == CONV_OPS
    assert len(SUITES["ops"]) >= 8
    assert set(SUITES["all"]) == set(BUILDERS) == set(CONV_OPS) | set(torch_cases.SIZED_OPS)
    assert suites("torch") is SUITES and suites("tensorflow") is tensorflow_cases.SUITES
    with pytest.raises(UsageError, match="op suites for tensorflow and torch, not for jax"):
        suites("jax")
    assert select_ops(SUITES, "ops", ("cumsum", "histc"), strict=True) == ("histc", "cumsum")
    with pytest.raises(UsageError, match="unknown op 'scatter_nd'; valid ops: conv2d_forward"):
        select_ops(SUITES, "all", ("scatter_nd",), strict=True)


def test_a_tensorflow_conv_case_becomes_the_same_convolution_in_nchw() -> None:
    case = conv_case(
        tensorflow_conv(input_shape=[8, 32, 32, 16], filter_shape=[5, 5, 16, 64], output_shape=[8, 32, 32, 64])
    )
    assert isinstance(case, TorchOpCase) and case.work == 7
    assert case.key == "conv2d_forward@m.conv1"
    assert case.params == {
        "input_shape": [8, 16, 32, 32],
        "weight_shape": [64, 16, 5, 5],
        "output_shape": [8, 64, 32, 32],
        "stride": [1, 1],
        "padding": [2, 2],
        "dilation": [1, 1],
    }
    assert case.shape == "8x16x32x32 -> 64, 5x5/1 pad 2"
    valid = conv_case(
        tensorflow_conv(input_shape=[1, 9, 9, 3], filter_shape=[3, 3, 3, 4], output_shape=[1, 7, 7, 4], padding="VALID")
    )
    assert valid.params["padding"] == [0, 0]
    # A 32-pixel input, a 3x3 window and stride 2: TensorFlow pads 0 above and 1 below.
    with pytest.raises(ValueError, match="unevenly"):
        conv_case(
            tensorflow_conv(
                input_shape=[1, 32, 32, 3],
                filter_shape=[3, 3, 3, 4],
                output_shape=[1, 16, 16, 4],
                strides=[1, 2, 2, 1],
            )
        )


def test_the_sized_ops_take_the_batch_size_where_they_have_one() -> None:
    cases = torch_cases.derive_cases(list(SUITES["ops"]), [3], 64, None)
    assert [c.op for c in cases] == list(SUITES["ops"])
    by_op = {c.op: c for c in cases}
    assert by_op["interpolate_bilinear_backward"].shape == "64x128x56x56, x2 bilinear"
    assert by_op["index_add"].shape == "1000000 rows into 100000x16"
    assert by_op["embedding_bag_backward"].shape == "4096 bags of 32 from 100000x128, max"
    assert by_op["ctc_loss_backward"].params["batch"] == 64
    assert by_op["max_unpool2d"].shape == "64x64x112x112 -> 224x224"
    assert all(describe(c.op, c.params) == c.shape for c in cases)
    # The transformers' ops at gpt_small's and moe_small's sizes: 64 sequences of 256 tokens, 8 experts of
    # capacity ceil(16384 tokens x 2 / 8 x 1.25) = 5120 slots each.
    assert by_op["embedding_backward"].shape == "64x256 tokens from 8192x384"
    assert by_op["sdpa_backward"].shape == "64x6x256x64, causal"
    assert by_op["layer_norm_backward_weight"].shape == "64x256x384"
    assert by_op["moe_dispatch"].shape == "32768 rows into 40960x384"
    assert (by_op["moe_dispatch"].model, by_op["sdpa_backward"].model) == ("moe_small", "gpt_small")


def test_torch_runs_use_the_torch_workload_and_refuse_tensorflow_ops() -> None:
    case = torch_cases.derive_cases(["histc"], [3], 2, None)[0]
    config = KernelsConfig(ops=("histc",), backend="torch", steps=1, warmup=0, repeats=1, batch_size=2)
    (run, _) = plan_runs([case], config.repeats, config.batch_size)
    assert run.workload.entry == "detprof.kernels_bench.torch_ops:op_benchmark"
    assert run.workload.params == {"op": "histc", "params": {"values": 10_000_000, "bins": 100}}
    assert run.fields["shape"] == "10000000 values into 100 bins" and run.fields["case"] == "histc@statistics.values"
    assert config.manifest([case])["cases"][0]["shape"] == run.fields["shape"]
    with pytest.raises(UsageError, match="unknown op 'scatter_nd'"):
        KernelsConfig(ops=("scatter_nd",), backend="torch")
    with pytest.raises(UsageError, match="--compile: detprof kernels times PyTorch's ops eagerly"):
        KernelsConfig(ops=("histc",), backend="torch", compile=True)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "jax"], "detprof kernels has op suites for tensorflow and torch, not for jax"),
        (["--backend", "torch", "--ops", "scatter_nd"], "unknown op 'scatter_nd'; valid ops: conv2d_forward"),
        (["--backend", "torch", "--suite", "conv", "--ops", "histc"], "op 'histc' is not in suite 'conv'"),
        (["--backend", "torch", "--compile", "--ops", "histc"], "--compile: detprof kernels times"),
        (["--backend", "torch", "--xla"], "--xla is TensorFlow's jit_compile"),
    ],
)
def test_bad_torch_input_is_one_line(tmp_path, capsys, args: list[str], message: str) -> None:
    code = main(["kernels", *args, "--gpu", "cpu", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_torch_not_installed_names_the_extra(tmp_path, capsys, monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    assert main(["kernels", "--backend", "torch", "--gpu", "cpu", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'detprof[torch]'" in err


@pytest.mark.slow  # derives the conv shapes by building the medium CNN in Keras (on PyTorch, in a child process)
def test_conv_cases_are_the_tensorflow_suites_convolutions() -> None:
    """The same layers, and the same numbers out of the same inputs and weights in either layout."""
    import numpy as np
    import tensorflow as tf
    import torch
    from torch.nn import functional as F

    batch, size = 2, 32
    theirs = tensorflow_cases.derive_cases(CONV_OPS, (3, 5), batch, size)
    ours = torch_cases.derive_cases(list(CONV_OPS), [3, 5], batch, size)
    assert [(c.key, c.layers, c.work) for c in ours] == [(c.key, c.layers, c.work) for c in theirs]
    rng = np.random.default_rng(0)
    for tf_case, case in zip(theirs, ours, strict=True):
        p, q = tf_case.params, case.params
        x = rng.standard_normal(p["input_shape"]).astype("float32")
        w = rng.standard_normal(p["filter_shape"]).astype("float32")
        expected = tf.raw_ops.Conv2D(
            input=x, filter=w, strides=p["strides"], padding=p["padding"], dilations=p["dilations"]
        ).numpy()
        out = F.conv2d(
            torch.from_numpy(x).permute(0, 3, 1, 2),
            torch.from_numpy(w).permute(3, 2, 0, 1),
            stride=q["stride"],
            padding=q["padding"],
            dilation=q["dilation"],
        )
        assert list(out.shape) == q["output_shape"]
        np.testing.assert_allclose(out.permute(0, 2, 3, 1).numpy(), expected, rtol=1e-3, atol=1e-3)


DERIVE_AND_LIST_FRAMEWORKS = """
import json, sys
from detprof.kernels_bench.cases import case_dicts
case_dicts("torch", ops=["conv2d_backward_filter"], kernel_sizes=[3], batch_size=2, input_size=32, max_shapes=1)
print(json.dumps(sorted(name for name in ("tensorflow", "jax", "torch", "keras") if name in sys.modules)))
"""


@pytest.mark.slow  # builds the medium CNN in Keras on PyTorch, in a child process as the bench's worker does
def test_a_pytorch_benchs_worker_derives_its_shapes_without_loading_tensorflow_or_jax() -> None:
    """Keras asks whether TensorFlow is available whenever a layer's configuration is serialised, long after its
    own import: the worker that derives a PyTorch bench's shapes keeps the other frameworks out for its whole
    life (here they are installed), not only while Keras imports (it took 8 s and 917 MiB with both loaded,
    4 s and 353 MiB without)."""
    done = subprocess.run(
        [sys.executable, "-c", DERIVE_AND_LIST_FRAMEWORKS], capture_output=True, text=True, check=True, timeout=300
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["keras", "torch"]


def step_every_case(mode: str, cases: list[OpCase]) -> dict:
    payload = json.dumps([case.as_dict() for case in cases])
    done = subprocess.run(
        [sys.executable, "-c", STEP_EVERY_CASE, mode], input=payload, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # derives the conv shapes in a child process; every op at its full size
def test_every_op_steps_in_both_modes_and_a_refusal_is_unsupported() -> None:
    """On a CPU PyTorch refuses only ``max_unpool2d`` (its lists' other refusals are CUDA-only)."""
    cases = torch_cases.derive_cases(list(SUITES["all"]), [3], 2, 32, max_shapes=1)
    assert {c.op for c in cases} == set(SUITES["all"])
    default, deterministic = step_every_case("default", cases), step_every_case("deterministic", cases)
    assert default["op_determinism"] is False and deterministic["op_determinism"] is True
    assert default["outcome"] == {case.key: ["ok", False] for case in cases}
    refused = "max_unpool2d@segnet.decoder1"
    status, reason = deterministic["outcome"].pop(refused)
    assert status == "unsupported"
    assert reason.startswith("RuntimeError: max_unpooling2d_forward_out " + REFUSAL)
    assert deterministic["outcome"] == {case.key: ["ok", False] for case in cases if case.key != refused}


@pytest.mark.slow
def test_detprof_kernels_backend_torch_records_every_case(tmp_path, capsys) -> None:
    out = tmp_path / "res"
    ops = "conv2d_backward_filter,index_put_accumulate,max_unpool2d"
    args = ["kernels", "--backend", "torch", "--ops", ops, "--max-shapes", "1", "--kernel-sizes", "3"]
    args += ["--steps", "2", "--warmup", "1", "--repeats", "1", "--batch-size", "2", "--input-size", "32"]
    assert main([*args, *CPU, "--out", str(out)]) == 0
    store = ResultsStore(out, "kernels")
    assert store.manifest()["config"]["backend"] == "torch"
    records = {(r["op"], r["mode"]): r for r in store.records()}
    assert set(records) == {(op, mode) for op in ops.split(",") for mode in ("default", "deterministic")}
    for (op, mode), rec in records.items():
        refused = op == "max_unpool2d" and mode == "deterministic"
        assert rec["status"] == ("unsupported" if refused else "ok"), rec["reason"]
        assert rec["backend"] == "torch"
        assert rec["settings"]["op_determinism"] is (mode == "deterministic")
    assert REFUSAL in records[("max_unpool2d", "deterministic")]["reason"]
    conv = records[("conv2d_backward_filter", "default")]
    assert conv["shape"] == "2x16x16x16 -> 32, 3x3/1 pad 1" and conv["layers"] == ["conv2"]
    assert conv["params"]["weight_shape"] == [32, 16, 3, 3] and conv["dtype"] == "float32"
    printed = capsys.readouterr().out
    assert "index_put_accumulate" in printed and "max_unpool2d" in printed
