"""kernels_bench: shapes read off the registry's models, failing cases, bad input (its real CPU runs in both modes
and their resume: ``test_sweep_e2e``, on the run's shared study)."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from worker_specs import spec_for

from detprof.cli import main
from detprof.invocation import Invocation
from detprof.kernels_bench.bench import KernelsConfig, plan_runs
from detprof.kernels_bench.case_results import summarize
from detprof.kernels_bench.cases import CONV_OPS, SUITES, OpCase, derive_cases
from detprof.kernels_bench.command import print_summary
from detprof.kernels_bench.ops import BUILDERS, _Inputs, op_benchmark
from detprof.models import paper_cnns, registry
from detprof.models.routing import TOP_K, expert_capacity
from detprof.profiler.devices import DeviceChoice
from detprof.profiler.measured_runs import MeasurementTarget
from detprof.profiler.study import MeasuredStudy, run_planned
from detprof.profiler.tracers import TRACERS
from detprof.store import ResultsStore

CPU = ["--gpu", "cpu", "--tracer", "tf"]


def activations(model: keras.Model, layers: list[keras.layers.Layer], batch: int) -> list[tuple]:
    """Each layer's real input and output on a real batch, read by running the model."""
    probe = keras.Model(model.inputs, [t for layer in layers for t in (layer.input, layer.output)])
    x = np.random.default_rng(0).standard_normal((batch, *model.input_shape[1:])).astype("float32")
    values = probe([x])
    return [(values[2 * i], values[2 * i + 1]) for i in range(len(layers))]


def conv_layers(model: keras.Model, kind: type) -> list[keras.layers.Layer]:
    return [layer for layer in model.layers if isinstance(layer, kind)]


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 3, 5, 7, 9])
def test_conv_cases_are_the_medium_cnn_layers(k: int) -> None:
    batch, size = 2, 32
    cases = derive_cases(CONV_OPS, (k,), batch, size)
    if k in paper_cnns.MEDIUM_CNN_KERNEL_SIZES:
        model = registry.build(f"mediumcnn_k{k}", (size, size, 3))
    else:
        model = paper_cnns.medium_cnn((size, size, 3), 1000, kernel_size=k)
    layers = conv_layers(model, keras.layers.Conv2D)
    assert [layer.filters for layer in layers] == list(paper_cnns.MEDIUM_CNN_CHANNELS)
    by_op = {op: [c for c in cases if c.op == op] for op in CONV_OPS}
    names = [layer.name for layer in layers]
    assert [c.layer for c in by_op["conv2d_forward"]] == names
    assert [c.layer for c in by_op["conv2d_backward_filter"]] == names
    # The first layer reads the data, whose gradient no training step computes.
    assert [c.layer for c in by_op["conv2d_backward_data"]] == names[1:]
    for case, layer, (x, y) in zip(by_op["conv2d_forward"], layers, activations(model, layers, batch), strict=True):
        p = case.params
        assert case.model == f"mediumcnn_k{k}"
        assert p["input_shape"] == list(x.shape) and p["output_shape"] == list(y.shape)
        assert p["filter_shape"] == list(layer.kernel.shape) == [k, k, x.shape[-1], layer.filters]
        out = tf.raw_ops.Conv2D(
            input=x, filter=layer.kernel, strides=p["strides"], padding=p["padding"], dilations=p["dilations"]
        )
        np.testing.assert_allclose(out + layer.bias, y, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_ops_suite_shapes_are_the_models_layers() -> None:
    batch, size = 2, 32
    cases = derive_cases(
        ["depthwise_conv_forward", "max_pool_backward", "dense_matmul", "scatter_nd"], (3,), batch, size
    )
    mobilenet = registry.build("mobilenet", (size, size, 3))
    dw_layers = conv_layers(mobilenet, keras.layers.DepthwiseConv2D)
    dw_cases = [c for c in cases if c.op == "depthwise_conv_forward"]
    covered = [name for c in dw_cases if c.model == "mobilenet" for name in c.layers if "." not in name]
    assert sorted(covered) == sorted(layer.name for layer in dw_layers)
    by_layer = {name: c for c in dw_cases if c.model == "mobilenet" for name in c.layers}
    for layer, (x, y) in zip(dw_layers, activations(mobilenet, dw_layers, batch), strict=True):
        p = by_layer[layer.name].params
        assert p["input_shape"] == list(x.shape) and p["output_shape"] == list(y.shape)
        out = tf.raw_ops.DepthwiseConv2dNative(
            input=x, filter=layer.kernel, strides=p["strides"], padding=p["padding"], dilations=p["dilations"]
        )
        np.testing.assert_allclose(out, y, rtol=1e-4, atol=1e-4)

    resnet = registry.build("resnet50", (size, size, 3))
    pool = resnet.get_layer("pool1_pool")
    ((x, y),) = activations(resnet, [pool], batch)
    case = next(c for c in cases if c.op == "max_pool_backward" and c.model == "resnet50")
    p = case.params
    assert p["ksize"] == [1, 3, 3, 1] and p["strides"] == [1, 2, 2, 1]
    np.testing.assert_allclose(
        tf.raw_ops.MaxPool(input=x, ksize=p["ksize"], strides=p["strides"], padding=p["padding"]), y
    )
    assert [c.model for c in cases if c.op == "max_pool_backward"].count("mediumcnn_k3") == 6

    effnet = registry.build("efficientnetb0", (size, size, 3))
    dense = effnet.get_layer("predictions")
    matmul = next(c for c in cases if c.op == "dense_matmul" and c.model == "efficientnetb0")
    assert matmul.params["kernel_shape"] == list(dense.kernel.shape) == [1280, 1000]
    assert matmul.params["input_shape"] == [batch, 1280]
    scatter = next(c for c in cases if c.op == "scatter_nd" and c.model == "efficientnetb0")
    assert scatter.params == {"rows": batch, "table_shape": [1000, 1280]}


@pytest.mark.slow  # builds gpt_small and moe_small in Keras to read their shapes
def test_the_transformer_ops_are_read_off_gpt_small_and_moe_small() -> None:
    batch, length = 2, 32
    ops = ["embedding_backward", "attention_backward", "layer_norm_backward_weight", "moe_dispatch"]
    cases = {c.op: c for c in derive_cases(ops, (3,), batch, length)}
    gpt, moe = registry.get("gpt_small"), registry.get("moe_small")
    width, heads, depth = (registry.TRANSFORMER_SIZES["small"][k] for k in ("width", "heads", "depth"))
    assert cases["embedding_backward"].params == {"tokens": [batch, length], "table_shape": [gpt.classes, width]}
    attention = cases["attention_backward"]  # every block's attention has one shape: one case for them all
    assert attention.layers == tuple(f"block{i}_attn" for i in range(depth))
    assert attention.params == {"shape": [batch, heads, length, width // heads], "causal": True}
    assert cases["layer_norm_backward_weight"].params == {"input_shape": [batch, length, width]}
    assert len(cases["layer_norm_backward_weight"].layers) == 2 * depth + 1  # two per block and the final one
    experts, routed = registry.EXPERTS["small"], batch * length
    dispatch = cases["moe_dispatch"]
    assert (dispatch.model, dispatch.layers[0]) == (moe.name, "block0_moe")
    slots = experts * expert_capacity(routed, experts)
    assert dispatch.params == {"updates": routed * TOP_K, "table_shape": [slots, width]}


@pytest.mark.slow  # TensorFlow's ops in this process
def test_the_attention_case_computes_what_keras_attention_computes_on_tensorflow() -> None:
    params = {"shape": [2, 3, 8, 4], "causal": True}
    inputs = _Inputs(seed=7)
    gradients = BUILDERS["attention_backward"](params, inputs)()
    again = _Inputs(seed=7)
    q, k, v, upstream = (tf.transpose(again.normal(params["shape"]), [0, 2, 1, 3]) for _ in range(4))
    with tf.GradientTape() as tape:
        tape.watch([q, k, v])
        out = keras.ops.dot_product_attention(q, k, v, is_causal=True)
    expected = tape.gradient(out, [q, k, v], output_gradients=upstream)
    for got, want in zip(gradients, expected, strict=True):
        np.testing.assert_allclose(tf.transpose(got, [0, 2, 1, 3]), want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_every_op_runs_at_its_derived_shapes() -> None:
    """In this process determinism stays off; the workers' runs in both modes are the slow tests."""
    cases = derive_cases(SUITES["all"], (3,), 2, 32, max_shapes=1)
    assert {c.op for c in cases} == set(SUITES["all"]) == set(BUILDERS)
    for case in cases:
        step, facts = op_benchmark(spec_for({"op": case.op, "params": case.params}))
        step()
        assert facts["op"] == case.op and facts["on_gpu"] is False


@pytest.mark.slow  # derive_cases builds the medium CNNs in Keras to read their shapes
def test_max_shapes_keeps_the_largest_per_op_and_kernel_size() -> None:
    everything = derive_cases(CONV_OPS, (1, 3), 2, 32)
    kept = derive_cases(CONV_OPS, (1, 3), 2, 32, max_shapes=1)
    assert len(kept) == 6
    for case in kept:
        rivals = [c for c in everything if c.op == case.op and c.model == case.model]
        out = case.params["output_shape"]
        kh, kw, cin, _ = case.params["filter_shape"]
        assert math.prod(out) * kh * kw * cin == max(
            math.prod(c.params["output_shape"]) * math.prod(c.params["filter_shape"][:3]) for c in rivals
        )


def test_runs_interleave_the_modes_repeat_by_repeat_in_alternating_order() -> None:
    cases = [OpCase("dense_matmul", "m", (f"l{i}",), {"input_shape": [1, 1], "kernel_shape": [1, 1]}) for i in (0, 1)]
    plan = plan_runs(cases, repeats=2, batch_size=1)
    assert [(r.fields["layers"][0], r.mode, r.repeat) for r in plan] == [
        (layer, mode, repeat)
        for repeat, modes in ((0, ("deterministic", "default")), (1, ("default", "deterministic")))
        for layer in ("l0", "l1")
        for mode in modes
    ]
    assert len({r.run_id for r in plan}) == len(plan)


def test_summary_sums_a_models_conv_cases_per_mode_and_repeat(tmp_path) -> None:
    cases = [
        {
            "case": f"conv2d_forward@mediumcnn_k3.conv{i}",
            "op": "conv2d_forward",
            "model": "mediumcnn_k3",
            "layers": [f"conv{i}"],
            "shape": f"shape {i}",
        }
        for i in (1, 2)
    ]
    store = ResultsStore(tmp_path, "kernels")
    store.open({"cases": cases}, "test", resume=False)
    # kernel ns per step by (case, mode, repeat); repeat 2 lost conv2's deterministic run.
    times = {
        ("conv1", "default", 0): 100.0,
        ("conv2", "default", 0): 300.0,
        ("conv1", "deterministic", 0): 200.0,
        ("conv2", "deterministic", 0): 400.0,
        ("conv1", "default", 1): 100.0,
        ("conv2", "default", 1): 100.0,
        ("conv1", "deterministic", 1): 150.0,
        ("conv2", "deterministic", 1): 250.0,
        ("conv1", "default", 2): 100.0,
        ("conv2", "default", 2): 100.0,
        ("conv1", "deterministic", 2): 900.0,
    }
    for (layer, mode, repeat), ns in times.items():
        store.write_record(
            {
                "run_id": f"{layer}-{mode}-{repeat}",
                "case": f"conv2d_forward@mediumcnn_k3.{layer}",
                "mode": mode,
                "repeat": repeat,
                "status": "ok",
                "kernel_ns_per_step": ns,
                "wall_ns_per_step": 2 * ns,
            }
        )
    store.write_record(
        {
            "run_id": "conv2-deterministic-2",
            "case": "conv2d_forward@mediumcnn_k3.conv2",
            "mode": "deterministic",
            "repeat": 2,
            "status": "failed",
            "reason": "out of memory: ResourceExhaustedError: OOM",
        }
    )
    result = summarize(store)
    assert result.metric == "kernel"
    conv1 = result.cases[0]
    assert conv1.default_ns == pytest.approx(100.0)
    assert conv1.deterministic_ns == pytest.approx((200 + 150 + 900) / 3)
    assert conv1.overhead.kernel.ratio == pytest.approx((2.0 * 1.5 * 9.0) ** (1 / 3))
    assert result.cases[1].overhead.failures[0]["reason"].startswith("out of memory")
    (total,) = result.totals
    # Repeats 0 and 1 only: (200 + 400) / (100 + 300) = 1.5 and (150 + 250) / (100 + 100) = 2.
    assert total.overhead.kernel.ratio == pytest.approx(math.sqrt(1.5 * 2.0))
    assert total.overhead.wall.ratio == pytest.approx(math.sqrt(1.5 * 2.0))
    # Each mode's mean is over the repeats in which all its cases ran: default has all three.
    assert total.default_ns == pytest.approx((400 + 200 + 200) / 3)
    assert total.deterministic_ns == pytest.approx((600 + 400) / 2)
    assert total.overhead.kernel.ci_low < total.overhead.kernel.ratio < total.overhead.kernel.ci_high


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--suite", "fft"], "unknown suite 'fft'; choose one of conv, ops, all"),
        (["--ops", "conv3d"], "unknown op 'conv3d'; valid ops: conv2d_forward"),
        (["--suite", "conv", "--ops", "scatter_nd"], "op 'scatter_nd' is not in suite 'conv'"),
        (["--ops", ","], "--ops is empty"),
        (["--kernel-sizes", "1,4"], "--kernel-sizes: '4' is not a positive odd integer"),
        (["--kernel-sizes=-3"], "--kernel-sizes: '-3' is not a positive odd integer"),
        (["--kernel-sizes", "0"], "--kernel-sizes: '0' is not a positive odd integer"),
        (["--kernel-sizes", "3.0"], "--kernel-sizes: '3.0' is not a positive odd integer"),
        (["--steps", "0"], "--steps must be at least 1"),
        (["--repeats", "0"], "--repeats must be at least 1"),
        (["--max-shapes", "-1"], "--max-shapes must be at least 0"),
        (["--preset", "huge"], "unknown preset 'huge'"),
        (["--tracer", "nsys"], "tracer 'nsys' is not installed"),
        # Gets as far as building MobileNet in Keras (in a child process) before refusing.
        pytest.param(
            ["--input-size", "16", "--ops", "depthwise_conv_forward"],
            "mobilenet cannot be built",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, args: list[str], message: str) -> None:
    code = main(["kernels", *args, *CPU[:2], "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_failing_and_out_of_memory_cases_are_recorded_and_the_bench_goes_on(tmp_path, capsys, monkeypatch) -> None:
    # oneDNN's CPU allocator waits 10 s for memory to free before it gives up on the impossible allocation below;
    # TensorFlow's own CPU allocator refuses it at once, with the same ResourceExhaustedError.
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    config = KernelsConfig(ops=("max_pool_backward", "dense_matmul"), steps=2, warmup=1, repeats=1, batch_size=2)
    cases = [
        # A depth-wise pooling window: TensorFlow has no MaxPoolGrad for it in either mode
        # (UnimplementedError), so it is a failure, not something determinism refuses.
        OpCase(
            "max_pool_backward",
            "handmade",
            ("depth_pool",),
            {"input_shape": [2, 4, 4, 4], "ksize": [1, 1, 1, 2], "strides": [1, 1, 1, 2], "padding": "VALID"},
        ),
        # 8 PB of input: no allocator, whatever the overcommit policy, can hand this out.
        OpCase("dense_matmul", "handmade", ("huge",), {"input_shape": [2**31, 2**20], "kernel_shape": [2**20, 1]}),
        OpCase("dense_matmul", "handmade", ("small",), {"input_shape": [2, 8], "kernel_shape": [8, 4]}),
    ]
    store = ResultsStore(tmp_path / "res", "kernels")
    target = MeasurementTarget(DeviceChoice("cpu", None), TRACERS["tf"], "cpu-small")
    plan = plan_runs(cases, config.repeats, config.batch_size)
    records = run_planned(
        MeasuredStudy("kernels", plan, config, config.manifest(cases), target, store.root, Invocation("test"))
    )
    status = {r["run_id"]: (r["status"], r["reason"]) for r in records}
    assert len(status) == 6
    for mode in ("default", "deterministic"):
        state, reason = status[f"max_pool_backward@handmade.depth_pool--{mode}--r0"]
        assert state == "failed" and "MaxPoolingGrad is not yet supported on the depth dimension" in reason
        assert reason.startswith("UnimplementedError: ")
        state, reason = status[f"dense_matmul@handmade.huge--{mode}--r0"]
        assert state == "failed" and reason.startswith("out of memory: ResourceExhaustedError")
        assert status[f"dense_matmul@handmade.small--{mode}--r0"] == ("ok", None)
    monkeypatch.delenv("COLUMNS", raising=False)
    print_summary(store)
    # The Failed column is the table's last; captured, as in a pipe, no cell of it wraps, and a row is one line: its
    # op, shape and layer together.
    lines = capsys.readouterr().out.splitlines()
    failed_cells = [line.split("│")[-2].strip() for line in lines if line.count("│") > 1]
    assert any("dense_matmul 2x8" in line and "handmade" in line for line in lines), lines
    assert not any("not supported under determinism" in cell for cell in failed_cells)
    assert any(
        "UnimplementedError" in cell and "MaxPoolingGrad is not yet supported on the depth dimension" in cell
        for cell in failed_cells
    )
    assert any("out of memory: ResourceExhaustedError" in cell for cell in failed_cells)
    rows = {row.case: row for row in summarize(store).cases}
    assert rows["dense_matmul@handmade.small"].overhead.kernel is not None
    assert rows["dense_matmul@handmade.huge"].default_ns is None
