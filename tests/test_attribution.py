"""Kernel -> op -> layer: the name paths each trace format carries, read on real traces and against plain reads.

The shared GPU traces were written by other people's jobs (``../shared/traces``): expected
values come from a plain json read (Kineto) or the XSpace's own annotations, never from the
parser's output.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fixtures_kineto import Launch, annotation, cpu_op, gpu_events, trace_document, write_trace
from fixtures_traces import SHARED_TRACES, real_traces

from detprof.analysis.layers import ModelAttribution, PartCost, run_parts
from detprof.analysis.study_results import counted_steps
from detprof.backends.base import COMPILED_PART, TOP_LEVEL_PART
from detprof.backends.inductor_places import Places, common_ancestor, kernel_places, module_path, node_module
from detprof.cli import main
from detprof.errors import ExitCode
from detprof.traces.attribution import (
    COMPILED_BACKWARD,
    UNATTRIBUTED,
    by_part,
    layer_of,
    layer_path,
    op_kind,
    placed_kernels,
)
from detprof.traces.kernel_table import KernelTable
from detprof.traces.parsers import load_trace

ALEXNET = SHARED_TRACES / "kineto-alexnet-a100.json.gz"
A100 = SHARED_TRACES / "kineto-a100-control.json.gz"
BERT = SHARED_TRACES / "tf-bert-3gpu.xplane.pb"
NVPROF = SHARED_TRACES / "nvprof-cfd-titanxp.gpu-trace.csv"


LAYERS = ["conv1", "conv2", "bn1", "planted", "dense", "block0", "block1", "attention", "value"]


@pytest.mark.parametrize(
    ("scope", "layer"),
    [
        ("mediumcnn_1/conv2_1/convolution", "conv2"),
        ("gradient_tape/mediumcnn_1/conv1_1/convolution/Conv2DBackpropFilter", "conv1"),
        ("jit(train_step)/transpose(jvp(planted))/dot_general", "planted"),
        ("jit(train_step)/jvp(bn1)/jit(_var)/reduce_sum", "bn1"),
        ("mediumcnn/dense", "dense"),
        ("functional_1/block1/attention/value/einsum", "block1/attention/value"),
        ("gradient_tape/functional_1/block0_1/attention_1/value_1/einsum/Einsum", "block0/attention/value"),
        (
            "jit(train_step)/transpose(jvp(block1))/transpose(jvp(attention))/transpose(jvp(value))/dot_general",
            "block1/attention/value",
        ),
        ("sgd/Cast/ReadVariableOp", UNATTRIBUTED),
        (None, UNATTRIBUTED),
        (math.nan, UNATTRIBUTED),
    ],
)
def test_a_scope_names_the_path_of_the_model_s_layers_it_runs_in(scope: object, layer: str) -> None:
    assert layer_of(scope, LAYERS) == layer


STEP_SCOPES = {"compile_loss": "(loss)", "sgd": "(optimizer update)", "AddN": "(gradient sums)"}


@pytest.mark.parametrize(
    ("scope", "part"),
    [
        ("sgd_1/AssignSubVariableOp_22", "(optimizer update)"),
        ("compile_loss/sparse_categorical_crossentropy/SparseSoftmaxCrossEntropyWithLogits", "(loss)"),
        ("gradient_tape/compile_loss/sparse_categorical_crossentropy/mul", "(loss)"),
        ("jit(train_step)/transpose(jvp(compile_loss))/sparse_categorical_crossentropy/mul", "(loss)"),
        ("AddN_14/inputs_1", "(gradient sums)"),
        ("functional_1/block0/AddN", "block0"),
    ],
)
def test_the_step_s_parts_that_are_no_layer_go_to_rows_of_their_own(scope: str, part: str) -> None:
    """A run's record names the scopes of its loss and optimizer (``profiler.workloads.step_scopes``), and TensorFlow
    its tape's sums of gradients: each a row of the leaderboard, unless a layer's scope holds it."""
    assert layer_of(scope, LAYERS, STEP_SCOPES) == part


def test_a_layer_path_read_off_a_trace_alone_drops_what_names_no_layer() -> None:
    assert layer_path("gradient_tape/mediumcnn_1/conv4_1/convolution/Conv2DBackpropFilter", False) == "mediumcnn/conv4"
    assert layer_path("mediumcnn_1/conv4_1/convolution", False) == "mediumcnn/conv4"
    assert layer_path("jit(train_step)/transpose(jvp(conv6))/conv_general_dilated", False) == "conv6"
    assert layer_path("mediumcnn/conv6", True) == "mediumcnn/conv6"
    assert op_kind("autograd::engine::evaluate_function: ConvolutionBackward0") == "ConvolutionBackward0"


def _plain_kineto(path: Path) -> list[tuple[str | None, str | None]]:
    """Each kernel's (innermost, outermost) cpu op around its launching runtime call, from the JSON alone."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    complete = [e for e in events if e.get("ph") == "X"]
    launches = {
        e["args"]["correlation"]: e for e in complete if str(e.get("cat", "")).endswith(("_runtime", "_driver"))
    }
    ops = defaultdict(list)
    for e in complete:
        if e.get("cat") == "cpu_op":
            ops[(e["pid"], e["tid"])].append(e)
    found = []
    for kernel in sorted((e for e in complete if e.get("cat") == "kernel"), key=lambda e: e["ts"]):
        call = launches.get(kernel["args"].get("correlation"))
        if call is None:
            found.append((None, None))
            continue
        around = [o for o in ops[(call["pid"], call["tid"])] if o["ts"] <= call["ts"] < o["ts"] + o["dur"]]
        around.sort(key=lambda o: (o["ts"], -o["dur"]))
        found.append((around[-1]["name"], around[0]["name"]) if around else (None, None))
    return found


@real_traces(ALEXNET, A100)
def test_kineto_kernels_are_attributed_to_the_aten_ops_around_their_launch() -> None:
    path = ALEXNET
    kernels = load_trace(path).kernels
    expected = _plain_kineto(path)
    assert len(kernels) == len(expected)
    got = sorted(zip(kernels["op"].astype(object), kernels["op_type"].astype(object), strict=True), key=str)
    want = sorted(((inner, op_kind(outer) if outer else None) for inner, outer in expected), key=str)
    assert [tuple(None if pd.isna(v) else v for v in pair) for pair in got] == want
    assert kernels["op"].notna().all()
    a100 = load_trace(A100).kernels
    assert a100["op"].notna().mean() > 0.99 and "AddmmBackward0" in set(a100["op_type"].astype(str))


@real_traces(BERT)
def test_the_tensorflow_bert_trace_attributes_every_kernel_to_the_tf_op_that_launched_it() -> None:
    kernels = load_trace(BERT).kernels
    annotated = kernels["op"].astype(object)
    assert kernels["op_type"].notna().all() and kernels["scope"].notna().all()
    rebuilt = kernels["scope"].astype(str) + ":" + kernels["op_type"].astype(str)
    assert (rebuilt == annotated.astype(str)).all()
    ops = by_part(load_trace(BERT), "op").kernels
    assert {"Cast", "RandomUniform", "Mul"} <= set(ops["name"].astype(str))


@real_traces(BERT)
def test_diff_by_op_names_its_rows_ops(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["diff", str(BERT), str(BERT), "--by", "op", "--top", "3"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "ops in common: " in out and "kernels in common" not in out
    assert re.search(r"Status .* Op\b", out) and " Name " not in out
    assert main(["diff", str(BERT), str(BERT), "--by", "layer", "--format", "json"]) == ExitCode.OK
    assert json.loads(capsys.readouterr().out)["by"] == "layer"


@real_traces(NVPROF)
def test_diff_by_op_of_a_trace_that_names_no_op_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(NVPROF), str(NVPROF), "--by", "op"]) == ExitCode.INPUT
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "names no op or layer" in err


def test_run_parts_add_up_to_the_table_with_what_no_layer_claims() -> None:
    frame = pd.DataFrame(
        {
            "name": pd.Categorical(["conv", "conv_grad", "assign", "copy"]),
            "short_name": pd.Categorical(["conv", "conv_grad", "assign", "copy"]),
            "dur_ns": [4_000_000, 2_000_000, 1_000_000, 500_000],
            "scope": pd.Categorical(["m/conv1/Conv2D", "gradient_tape/m/conv1/Conv2D/Grad", "sgd/update", None]),
            "op_type": pd.Categorical(["Conv2D", "Conv2DBackpropFilter", "AssignSub", None]),
        }
    )
    parts = run_parts(frame, steps=2, layer_names=["conv1"])
    assert parts.layers == {"conv1": 3_000_000.0, UNATTRIBUTED: 750_000.0}
    assert sum(parts.ops.values()) == pytest.approx(frame["dur_ns"].sum() / 2)
    assert parts.layer_kernels[("conv1", "conv_grad")] == 1_000_000.0


def part(name: str, added: float, lo: float, hi: float) -> PartCost:
    return PartCost(name, 1.0, 1.0 + added, added, lo, hi, None, None, None, 0.9, lo <= 0 <= hi, 3)


def test_a_floor_reads_small_changes_as_within_noise_and_the_leader_needs_most_of_the_cost() -> None:
    boards = [part("planted", 5.0, 4.0, 6.0), part("conv1", 0.05, 0.01, 0.09)]
    parts = ModelAttribution("m", boards, [], [], 0.0, 10.0, {})
    floored = parts.against(0.02)
    assert [p.within_noise for p in floored.layers] == [False, True]
    assert floored.leader() is not None and floored.leader().name == "planted"
    assert "Layer planted pays 90% of the time determinism adds" in (floored.sentence() or "")
    assert np.isclose(floored.default_step_ms, 10.0)


def test_by_part_renames_kernels_by_op_or_layer_for_the_kernel_statistics() -> None:
    frame = pd.DataFrame(
        {
            "name": pd.Categorical(["k1", "k2"]),
            "short_name": pd.Categorical(["k1", "k2"]),
            "dur_ns": [10, 20],
            "op_type": pd.Categorical(["Conv2D", "MatMul"]),
            "scope": pd.Categorical(["m_1/conv_1/Conv2D", "m_1/dense_1/MatMul"]),
        }
    )
    table = KernelTable("t", "tf-xplane", kernels=frame)
    assert list(by_part(table, "layer").kernels["name"].astype(str)) == ["m/conv", "m/dense"]
    assert list(by_part(table, "op").kernels["name"].astype(str)) == ["Conv2D", "MatMul"]


def test_an_interrupted_step_is_left_out_of_every_layer_as_it_is_of_the_run() -> None:
    frame = pd.DataFrame(
        {
            "name": pd.Categorical(["conv"] * 3),
            "short_name": pd.Categorical(["conv"] * 3),
            "dur_ns": [1_000_000, 1_100_000, 9_000_000],
            "scope": pd.Categorical(["m/conv1/Conv2D"] * 3),
            "op_type": pd.Categorical(["Conv2D"] * 3),
            "step": pd.array([0, 1, 2], dtype="Int64"),
        }
    )
    record = {"steps": 3, "step_kernel_ns": [1_000_000, 1_100_000, 9_000_000]}
    assert run_parts(*counted_steps(frame, record), layer_names=["conv1"]).layers == {"conv1": 1_050_000.0}
    whole = counted_steps(frame.drop(columns="step"), record)
    assert run_parts(*whole, layer_names=["conv1"]).layers == {"conv1": 3_700_000.0}


def test_a_gradient_accumulated_into_its_variable_goes_to_the_layer_that_owns_the_variable(tmp_path: Path) -> None:
    """PyTorch's ``AccumulateGrad`` nodes have no forward op to follow into a layer range; each of a linear layer's
    two variables (weight, bias) is accumulated once per step, in that layer's row, never unattributed."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function

    from detprof.traces.attribution import layer_range_name

    torch.manual_seed(0)
    layers = {"dense1": torch.nn.Linear(8, 16), "dense2": torch.nn.Linear(16, 4)}
    x, y = torch.randn(32, 8), torch.randint(0, 4, (32,))
    steps = 3
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            with record_function(f"step {i}"):
                for layer in layers.values():
                    layer.zero_grad()
                hidden = x
                for name, layer in layers.items():
                    with record_function(layer_range_name(name)):
                        hidden = layer(hidden)
                torch.nn.functional.cross_entropy(hidden, y).backward()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))

    kernels = load_trace(path).kernels
    node = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
    nodes = kernels[kernels["name"].astype(str) == node]
    assert nodes["scope"].astype(object).value_counts().to_dict() == {"dense1": 2 * steps, "dense2": 2 * steps}
    accumulating = kernels["op_type"].astype(str) == "torch::autograd::AccumulateGrad"
    assert accumulating.sum() > len(nodes) and kernels.loc[accumulating, "scope"].notna().all()


@pytest.mark.parametrize(
    ("source", "path"),
    [
        ("L['s'].blocks.0.norm", "blocks.0.norm"),
        ("L['self'].transformer.h[0].attn", "transformer.h.0.attn"),
        ("L['self']._modules['blocks']._modules['0'].norm", "blocks.0.norm"),
        ("L['self']", ""),
    ],
)
def test_dynamos_source_of_a_module_is_its_path_as_named_modules_names_it(source: str, path: str) -> None:
    assert module_path(source) == path


def test_a_fused_kernel_goes_to_the_deepest_module_of_the_nodes_it_fused() -> None:
    """Nodes' modules from their stacks (a backward node's from its forward op's); a kernel of nodes of one module
    goes to it, of several to the module around them, of the whole model's to the top level; one no module holds
    is left to the compiled region; a C++ kernel named as the trace names it, an extern kernel by its place among
    the graph's calls of its op in the order of their handles."""
    stack = {"L['s']": ("L['s']", object), "L['s'].blocks.0": ("L['s'].blocks.0", object)}
    assert node_module({"nn_module_stack": stack}) == "blocks.0"
    assert node_module({"fwd_nn_module_stack": {"x": ("L['s'].head", object)}}) == "head"
    assert node_module({"seq_nr": 3}) is None
    assert common_ancestor(["blocks.0.norm", "blocks.0.conv", "blocks.0"]) == "blocks.0"
    assert common_ancestor(["blocks.0.norm", "blocks.1.norm"]) == "blocks"
    assert common_ancestor(["blocks.0", "head"]) == "" == common_ancestor([])
    modules = {
        "mul": "blocks.0.norm",
        "add": "blocks.0.conv",
        "relu": "stem",
        "mm": "head",
        "copy_": None,
        "bmm": "blocks.0.attn",
        "conv": "stem",
        "randint": None,
    }
    fused = {
        "cpp_fused_add_mul_0:1": ["mul", "add", "copy_"],
        "extern_kernels.mm:10": ["mm"],
        "cpp_fused_relu_1:2": ["relu", "mul"],
        "triton_poi_fused_copy_2:3": ["copy_"],
        "extern_kernels.bmm:4": ["bmm"],
        "triton_per_fused_mul_3:5": ["mul"],
        "torch.ops.aten.convolution_backward.default:6": ["conv"],
        "aten.randint.low_out:7": ["randint"],
        "extern_kernels.mm:8": ["relu"],
    }
    assert kernel_places(fused, modules, "graph_0_") == {
        "graph_0_cpp_fused_add_mul_0": "blocks.0",
        "graph_0_cpp_fused_relu_1": TOP_LEVEL_PART,
        "triton_per_fused_mul_3": "blocks.0.norm",
        "aten::bmm 1/1": "blocks.0.attn",
        "aten::convolution_backward 1/1": "stem",
        "aten::mm 1/2": "stem",
        "aten::mm 2/2": "head",
    }
    # One kernel called for two blocks that run the same code: the trace names both calls alike.
    blocks = {"tanh": "blocks.0.act", "tanh_1": "blocks.1.act", "tanh_2": "blocks.1.act"}
    called = {"cpp_fused_tanh_0:2": ["tanh"], "cpp_fused_tanh_0:4": ["tanh_1"], "cpp_fused_tanh_1:5": ["tanh_2"]}
    assert kernel_places(called, blocks) == {"cpp_fused_tanh_0": "blocks", "cpp_fused_tanh_1": "blocks.1.act"}


def test_a_compiled_graphs_matrix_products_on_a_gpu_go_to_the_modules_their_extern_kernels_ran(
    tmp_path: Path,
) -> None:
    """A GPU trace of a compiled step: each cuBLAS kernel is launched from the aten op that Inductor's code called
    as an extern kernel, alike for every layer (``aten::addmm``). The parser names each by its place among its
    graph's call's ops of that name, and the record's places of the graph's extern kernels (``kernel_places``, from
    the handles provenance tracking gives them) put the forward's two in their layers and the backward's (in the
    region through its forward op's sequence number) in its own, also where the call runs another op between them
    that provenance tracking does not list (the deterministic ``index_put_``); a call that runs one more of an op
    than its graph compiled places none of them."""
    region = f"layer:{COMPILED_PART}"

    def graph_call(at: float, *ops: str) -> list[dict[str, object]]:
        events = [cpu_op("## Call CompiledFxGraph fx7a ##", at, 10 * len(ops))]
        events += [cpu_op(op, at + 10 * i + 1, 8) for i, op in enumerate(ops)]
        return events

    forward = ["aten::addmm", "triton_poi_fused_relu_0", "aten::addmm"]
    backward = ["aten::mm", "aten::index_put_", "triton_red_fused_sum_0", "aten::mm"]
    events = [
        annotation("step 0", 0.0, 400.0),
        annotation(region, 1.0, 100.0),
        cpu_op("Torch-Compiled Region: 0/0", 1.0, 99.0),
        cpu_op("CompiledFunction", 2.0, 40.0) | {"args": {"Sequence number": 9}},
        *graph_call(5.0, *forward),
        cpu_op("autograd::engine::evaluate_function: CompiledFunctionBackward", 200.0, 50.0)
        | {"args": {"Sequence number": 9}},
        cpu_op("CompiledFunctionBackward", 201.0, 48.0),
        *graph_call(205.0, *backward),
        annotation(region, 300.0, 60.0),
        cpu_op("Torch-Compiled Region: 0/0", 300.0, 59.0),
        *graph_call(305.0, "aten::addmm", "aten::addmm", "aten::addmm"),
        *gpu_events(
            [
                Launch("sm90_gemm_a", 500.0, 5.0, 7.0),
                Launch("triton_poi_fused_relu_0", 506.0, 1.0, 17.0),
                Launch("sm90_gemm_b", 508.0, 5.0, 27.0),
                Launch("sm90_gemm_c", 520.0, 5.0, 207.0),
                Launch("indexing_backward_kernel", 526.0, 2.0, 217.0),
                Launch("sm90_gemm_d", 530.0, 5.0, 237.0),
                Launch("sm90_gemm_a", 540.0, 5.0, 307.0),
            ]
        ),
    ]
    trace = write_trace(tmp_path / "compiled.json", trace_document(events, devices=1))
    kernels = load_trace(trace).launches("name", "op", "op_type", "scope", "graph_site")
    assert kernels["graph_site"].astype(object).where(kernels["graph_site"].notna(), None).tolist() == [
        "aten::addmm 1/2",
        None,
        "aten::addmm 2/2",
        "aten::mm 1/2",
        "aten::index_put_ 1/1",
        "aten::mm 2/2",
        "aten::addmm 1/3",
    ]
    places = Places()
    nodes = {"addmm": "fc1", "relu": "act", "addmm_1": "fc2", "mm": "fc2", "mm_1": "fc1", "sum_1": "fc2"}
    places.add(
        False,
        kernel_places(
            {
                "extern_kernels.addmm:1": ["addmm"],
                "triton_poi_fused_relu_0:2": ["relu"],
                "extern_kernels.addmm:3": ["addmm_1"],
            },
            nodes,
        ),
    )
    places.add(
        True,
        kernel_places(
            {"extern_kernels.mm:1": ["mm"], "triton_red_fused_sum_0:2": ["sum_1"], "extern_kernels.mm:3": ["mm_1"]},
            nodes,
        ),
    )
    columns = [kernels[c].astype(object).where(kernels[c].notna(), None).tolist() for c in ("scope", "op_type")]
    placed = placed_kernels(*columns, kernels["name"].tolist(), kernels["graph_site"].tolist(), places.as_json())
    assert placed == [
        *(f"{COMPILED_PART}/{module}" for module in ("fc1", "act", "fc2", "fc2")),
        COMPILED_PART,
        f"{COMPILED_PART}/fc1",
        COMPILED_PART,
    ]


def test_a_kernel_name_in_the_forward_and_the_backward_is_placed_by_the_phase_it_ran_in() -> None:
    """Each graph numbers its kernels from 0 under one ``graph_N_``: the backward's ``cpp_fused_sum_0`` is not the
    forward's. A name two graphs of one phase place apart is placed in neither: it stays in the compiled region.
    An extern kernel goes by its place in the graph's call (``graph_site``), within the compiled region alone: one
    at a place no graph of its phase has (a call running another aten op besides) stays in the region."""
    places = Places()
    places.add(False, {"graph_0_cpp_fused_sum_0": "blocks.0", "graph_0_cpp_fused_mul_1": "head", "aten::mm 1/2": "a"})
    places.add(True, {"graph_0_cpp_fused_sum_0": "head", "aten::mm 1/2": "b"})
    places.add(False, {"graph_0_cpp_fused_mul_1": "stem"})
    kernel_modules = places.as_json()
    region = COMPILED_PART
    forward = "Torch-Compiled Region: 0/0"
    rows = [
        (region, forward, "graph_0_cpp_fused_sum_0", None, f"{region}/blocks.0"),
        (region, COMPILED_BACKWARD, "graph_0_cpp_fused_sum_0", None, f"{region}/head"),
        (region, forward, "graph_0_cpp_fused_mul_1", None, region),
        (region, forward, "aten::mm", None, region),
        (region, forward, "gemm_kernel", "aten::mm 1/2", f"{region}/a"),
        (region, COMPILED_BACKWARD, "aten::mm", "aten::mm 1/2", f"{region}/b"),
        (region, forward, "aten::mm", "aten::mm 1/3", region),
        ("(optimizer update)", "Optimizer", "graph_0_cpp_fused_sum_0", None, "(optimizer update)"),
        ("(optimizer update)", "Optimizer", "aten::mm", "aten::mm 1/2", "(optimizer update)"),
    ]
    scopes, kinds, kernels, sites, placed = (list(column) for column in zip(*rows, strict=True))
    assert placed_kernels(scopes, kinds, kernels, sites, kernel_modules) == placed
    layers = ["blocks", "blocks.0", "head"]
    assert layer_of(f"{region}/blocks.0", layers) == "blocks.0"
    assert layer_of(f"{region}/{TOP_LEVEL_PART}", layers) == TOP_LEVEL_PART
